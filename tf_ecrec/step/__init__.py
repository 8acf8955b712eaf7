"""The protected step and its log: protected tables (`embedding`, `embedding_table`), the variables the
protection adds (`protection`), update rules (`update_rule`), the step's ops (`step_program`,
`optimizer`, `optimizer_parts`), its commit in the run, carried (`carried_commit`) or batched over steps
(`batched_commit`, `fold_round`, `wire`), and settlement of cut steps (`steplog`, `stale_steps`);
`failpoints` cuts a step at a chosen point for tests. Layer 2; the protocol is docs/settlement.md.
"""
