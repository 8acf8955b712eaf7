"""A fold round's graph: the apply entries of many steps taken, folded into every target and committed.

Built once per protected step program (`tf_ecrec.batched_commit.batched_step`) and run by the trainer
(`BatchedCommit.fold`) every few steps, or one op at a time by the fault-schedule harness; the protocol
is in docs/settlement.md, "Folds batched over steps".
"""

from __future__ import annotations

import collections
import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec import wire
from tf_ecrec.device import ps_device, variable_name
from tf_ecrec.step_program import ParityFolds, ReplicaFolds, StepGeneration, TargetKind, new_step_id

if TYPE_CHECKING:
    from tf_ecrec.optimizer import ECOptimizer
    from tf_ecrec.step_program import AppliedUpdate


@dataclasses.dataclass(frozen=True)
class FoldRound:
    """A fold round's graph: feed the trainer's pending step ids to `pending`, fetch `committed` (a flag each).

    Each phase is also runnable alone (the fault-schedule harness cuts rounds between any two ops), by
    feeding what it reads: `takes` (data target id -> rows, delta, entry, sids, seqs) feed `folds`
    (data target id -> a `present` flag vector per fold target) and `marks` (data target id -> the op
    marking what every target holds); `ready` (data PS -> the steps ready there) reads `ready_gates`
    (data PS -> the steps counted on every copy, after that PS's marks); `commits` (PS -> the steps
    committed there) read every `ready`; `committed` reads `query_gate` (the pending ids, after every
    commit).  The folds and commits read `round_id`, a fresh id carrying the trainer's generation: a PS
    that admits only later generations refuses a round of a trainer that has not followed the cluster
    (Aborted).

    What crosses tasks is packed (`tf_ecrec.wire`): a fold's inputs go to each fold target as one
    transfer, and the counted and ready lists are intersected on the global step's PS and sent once to
    each PS from there, instead of each list to each PS.
    """

    pending: tf.Tensor
    committed: tf.Tensor
    round_id: tf.Tensor
    counted: dict[int, tf.Tensor]
    takes: dict[int, tuple[tf.Tensor, ...]]
    folds: dict[int, list[tf.Tensor]]
    marks: dict[int, tf.Operation]
    ready_gates: dict[int, tf.Tensor]
    ready: dict[int, tf.Tensor]
    commits: dict[int, tf.Tensor]
    query_gate: tf.Tensor


def build_fold_round(opt: ECOptimizer, applied: list[AppliedUpdate], counters: dict[int, Any],
                     generation: int | StepGeneration = 0) -> FoldRound:
    """The fold round of `opt`'s step: take, fold, mark, commit, and ask which pending steps are committed.

    `counters`: the counter targets of the step (the global step and its replicas) by target id;
    `generation`: the trainer's (its step ids').
    """
    with tf.name_scope("fold_round"):
        round_id = tf.compat.v1.placeholder_with_default(new_step_id(generation), [], name="round_id")
        counted = {}
        for tid in sorted(counters):
            target = opt.targets[tid]
            with tf.device(ps_device(target.ps)):
                counted[tid] = ec_ops.delta_log_counted(opt._log(target.ps), tid)
        gs_ps = opt.targets[min(counters)].ps
        with tf.device(ps_device(gs_ps)):
            counted_everywhere = _intersect(list(counted.values()), "counted_everywhere")
        takes, folds, marks = {}, {}, {}
        marks_of: dict[int, list[Any]] = collections.defaultdict(list)
        for a in applied:
            data_ps = opt.targets[a.tid].ps
            log = opt._log(data_ps)
            with tf.device(a.device):
                takes[a.tid] = ec_ops.delta_log_take(log, a.tid, int(a.delta.shape[1]))
            folds[a.tid] = _fold(opt, a, round_id, *takes[a.tid])
            with tf.device(a.device):
                marks[a.tid] = ec_ops.delta_log_mark_folded(log, takes[a.tid][4], folds[a.tid])
            marks_of[data_ps].append(marks[a.tid])
        gates, ready = {}, {}
        for p in sorted(marks_of):
            with tf.device(ps_device(p)), tf.control_dependencies(marks_of[p]):
                gates[p] = tf.identity(counted_everywhere, name="counted_gate")
            with tf.device(ps_device(p)):
                ready[p] = ec_ops.delta_log_ready(opt._log(p), [gates[p]])
        with tf.device(ps_device(gs_ps)):
            ready_everywhere = _intersect(list(ready.values()), "ready_everywhere")
        commits = {}
        for p in sorted(opt.logs):
            with tf.device(ps_device(p)):
                commits[p] = ec_ops.delta_log_commit_each(opt._log(p), round_id, [ready_everywhere])
        pending = tf.compat.v1.placeholder(tf.int64, [None], name="pending_sids")
        with tf.device(ps_device(gs_ps)):
            with tf.control_dependencies(list(commits.values())):
                query_gate = tf.identity(pending, name="query_gate")
            flags = ec_ops.delta_log_is_committed(opt._log(gs_ps), query_gate)
    return FoldRound(pending, flags, round_id, counted, takes, folds, marks, gates, ready, commits, query_gate)


def _fold(opt: ECOptimizer, a: AppliedUpdate, round_id: tf.Tensor, rows: tf.Tensor, delta: tf.Tensor, entry: tf.Tensor,
          sids: tf.Tensor, seqs: tf.Tensor) -> list[tf.Tensor]:
    """The batch of data target `a.tid` folded into each of its targets; a `present` vector per target."""
    plan = opt._fold_plan[a.tid]
    present = []
    if isinstance(plan, ReplicaFolds):
        with tf.device(a.device):
            blob, specs = wire.pack([rows, delta, entry, sids, seqs, round_id], "to_replicas")
        for rep_tid in plan.targets:
            target = opt.targets[rep_tid]
            with tf.device(ps_device(target.ps)):
                r_rows, r_delta, r_entry, r_sids, r_seqs, r_id = wire.unpack(blob, specs)
                present.append(ec_ops.parity_fold_batch(
                    target.variables[0], r_rows, r_delta, r_entry, r_sids, r_seqs, 1, opt._log(target.ps),
                    r_id, rep_tid, a.tid))
        return present
    assert isinstance(plan, ParityFolds)
    coll = plan.coll
    routes = coll.table_layout.fold_routes(plan.ps, coll.code)
    bases = np.stack([route.parity_base for route in routes])
    with tf.device(a.device):  # split by route on the data's PS, the entry index routed as a one-word delta
        split = ec_ops.route_deltas(rows, delta, bases, coll.chunk_rows)
        tags = ec_ops.route_deltas(rows, tf.expand_dims(entry, 1), bases, coll.chunk_rows)
        blobs = [wire.pack([prow, sel_delta, tf.squeeze(sel_entry, 1), sids, seqs, round_id], f"to_route{j}")
                 for j, ((prow, sel_delta), (_, sel_entry)) in enumerate(zip(split, tags))]
    for route, (blob, specs) in zip(routes, blobs):
        parity = opt.parity[coll.name][route.ps]
        ptid = opt._target(variable_name(parity), route.ps, [parity], TargetKind.PARITY)
        with tf.device(ps_device(route.ps)):
            prow, sel_delta, sel_entry, r_sids, r_seqs, r_id = wire.unpack(blob, specs)
            present.append(ec_ops.parity_fold_batch(
                parity, prow, sel_delta, sel_entry, r_sids, r_seqs, route.coef,
                opt._log(route.ps), r_id, ptid, a.tid))
    return present


def _intersect(lists: list[tf.Tensor], name: str) -> tf.Tensor:
    """The ids in every one of `lists` (1-D int64), in the first list's order."""
    with tf.name_scope(name):
        out = lists[0]
        for other in lists[1:]:
            missing, _ = tf.raw_ops.ListDiff(x=out, y=other)
            out, _ = tf.raw_ops.ListDiff(x=out, y=missing)
        return tf.identity(out)
