"""What runs in a trainer's session loop when the cluster changes: where the PS tasks are now
(`cluster_source`), stopping between steps and following a move (`migration`), and the failover loop
that rebuilds the session (`failover`). Layer 4.
"""
