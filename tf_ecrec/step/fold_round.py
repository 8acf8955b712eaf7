"""A fold round's graph: the apply entries of many steps taken, folded into every target and committed.

Built once per protected step program (`tf_ecrec.step.batched_commit.batched_step`) and run by the trainer
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
from tf_ecrec.layout.device import ps_device, variable_name
from tf_ecrec.step import wire
from tf_ecrec.step.step_program import ParityFolds, ReplicaFolds, StepGeneration, TargetKind, new_step_id

if TYPE_CHECKING:
    from tf_ecrec.step.optimizer import ECOptimizer
    from tf_ecrec.step.step_program import AppliedUpdate


@dataclasses.dataclass(frozen=True)
class FoldRound:
    """A fold round's graph: feed the trainer's pending step ids to `pending`, fetch `committed` (a flag each).

    Each phase is also runnable alone (the fault-schedule harness cuts rounds between any two ops), by
    feeding what it reads: `takes` (data target id -> rows, delta, entry, sids, seqs) feed `folds`
    (data target id -> a `present` flag vector per fold target, on the target) and `marks` (data target
    id -> the op marking what every target holds), which read `presents` (the same flags, back on the
    data's PS); `ready` (data PS -> the steps ready there) reads `ready_gates`
    (data PS -> the steps counted on every copy, after that PS's marks); `commits` (PS -> the steps
    committed there) read every `ready`; `committed` reads `query_gate` (the pending ids, after every
    commit).  The folds and commits read `round_id`, a fresh id carrying the trainer's generation: a PS
    that admits only later generations refuses a round of a trainer that has not followed the cluster
    (Aborted).

    What crosses tasks is packed (`tf_ecrec.step.wire`): the inputs of every fold from one data PS into one
    target PS (every variable's, every route's) go as one transfer and their answers come back as one, so
    a round's fold transfers are two per pair of PS, not two per (variable, fold target); and the counted
    and ready lists are intersected on the global step's PS and sent once to each PS from there, instead
    of each list to each PS.
    """

    pending: tf.Tensor
    committed: tf.Tensor
    round_id: tf.Tensor
    counted: dict[int, tf.Tensor]
    takes: dict[int, tuple[tf.Tensor, ...]]
    folds: dict[int, list[tf.Tensor]]
    presents: dict[int, list[tf.Tensor]]
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
                counted[tid] = ec_ops.delta_log_counted(opt.log_of(target.ps), tid)
        gs_ps = opt.targets[min(counters)].ps
        with tf.device(ps_device(gs_ps)):
            counted_everywhere = _intersect(list(counted.values()), "counted_everywhere")
        takes: dict[int, tuple[tf.Tensor, ...]] = {}
        marks: dict[int, tf.Operation] = {}
        on_target: dict[int, dict[int, tf.Tensor]] = collections.defaultdict(dict)
        on_data: dict[int, dict[int, tf.Tensor]] = collections.defaultdict(dict)
        groups: dict[tuple[int, int], list[_Member]] = collections.defaultdict(list)
        for a in applied:
            with tf.device(a.device):
                takes[a.tid] = ec_ops.delta_log_take(opt.log_of(opt.targets[a.tid].ps), a.tid, int(a.delta.shape[1]))
            for member in _members(opt, a, *takes[a.tid]):
                groups[opt.targets[a.tid].ps, member.ps].append(member)
        for (data_ps, target_ps), members in sorted(groups.items()):
            for (tid, i), present, back in _send_group(opt, data_ps, target_ps, members, round_id):
                on_target[tid][i], on_data[tid][i] = present, back
        folds = {tid: [by[i] for i in sorted(by)] for tid, by in on_target.items()}
        presents = {tid: [by[i] for i in sorted(by)] for tid, by in on_data.items()}
        marks_of: dict[int, list[Any]] = collections.defaultdict(list)
        for a in applied:
            data_ps = opt.targets[a.tid].ps
            with tf.device(a.device):
                marks[a.tid] = ec_ops.delta_log_mark_folded(opt.log_of(data_ps), takes[a.tid][4], presents.get(a.tid, []))
            marks_of[data_ps].append(marks[a.tid])
        gates, ready = {}, {}
        for p in sorted(marks_of):
            with tf.device(ps_device(p)), tf.control_dependencies(marks_of[p]):
                gates[p] = tf.identity(counted_everywhere, name="counted_gate")
            with tf.device(ps_device(p)):
                ready[p] = ec_ops.delta_log_ready(opt.log_of(p), [gates[p]])
        with tf.device(ps_device(gs_ps)):
            ready_everywhere = _intersect(list(ready.values()), "ready_everywhere")
        commits = {}
        for p in sorted(opt.logs):
            with tf.device(ps_device(p)):
                commits[p] = ec_ops.delta_log_commit_each(opt.log_of(p), round_id, [ready_everywhere])
        pending = tf.compat.v1.placeholder(tf.int64, [None], name="pending_sids")
        with tf.device(ps_device(gs_ps)):
            with tf.control_dependencies(list(commits.values())):
                query_gate = tf.identity(pending, name="query_gate")
            flags = ec_ops.delta_log_is_committed(opt.log_of(gs_ps), query_gate)
    return FoldRound(pending, flags, round_id, counted, takes, folds, presents, marks, gates, ready, commits,
                     query_gate)


@dataclasses.dataclass(frozen=True)
class _Member:
    """One fold of a round: data target `tid`'s taken entries (their part for this target) into `target`."""

    tid: int
    index: int  # its place among `tid`'s fold targets
    ps: int  # the fold target's PS
    target: int  # the fold target's id
    variable: Any
    coef: int
    tensors: tuple[tf.Tensor, ...]  # rows, delta, entry, sids, seqs: made on the data's PS


def _members(opt: ECOptimizer, a: AppliedUpdate, rows: tf.Tensor, delta: tf.Tensor, entry: tf.Tensor,
             sids: tf.Tensor, seqs: tf.Tensor) -> list[_Member]:
    """The folds of data target `a.tid`'s taken entries, one per fold target (a replica, or a parity route)."""
    plan = opt.fold_plan[a.tid]
    if isinstance(plan, ReplicaFolds):
        return [_Member(a.tid, i, opt.targets[rep].ps, rep, opt.targets[rep].variables[0], 1,
                        (rows, delta, entry, sids, seqs)) for i, rep in enumerate(plan.targets)]
    assert isinstance(plan, ParityFolds)
    coll = plan.coll
    routes = coll.table_layout.fold_routes(plan.ps, coll.code)
    bases = np.stack([route.parity_base for route in routes])
    with tf.device(a.device):  # split by route on the data's PS, the entry index routed as a one-word delta
        split = ec_ops.route_deltas(rows, delta, bases, coll.chunk_rows)
        tags = ec_ops.route_deltas(rows, tf.expand_dims(entry, 1), bases, coll.chunk_rows)
        routed = [(prow, sel_delta, tf.squeeze(sel_entry, 1)) for (prow, sel_delta), (_, sel_entry) in zip(split, tags)]
    members = []
    for i, (route, (prow, sel_delta, sel_entry)) in enumerate(zip(routes, routed)):
        parity = opt.parity[coll.name][route.ps]
        ptid = opt.target_id(variable_name(parity), route.ps, [parity], TargetKind.PARITY)
        members.append(_Member(a.tid, i, route.ps, ptid, parity, route.coef, (prow, sel_delta, sel_entry, sids, seqs)))
    return members


def _send_group(opt: ECOptimizer, data_ps: int, target_ps: int, members: list[_Member], round_id: tf.Tensor,
                ) -> list[tuple[tuple[int, int], tf.Tensor, tf.Tensor]]:
    """The folds of one data PS into one target PS: their inputs sent as one transfer, their answers back as one.

    Returns, per member, ((tid, index), its `present` flags on the target, the same flags back on the data PS).
    """
    name = f"ps{data_ps}_to_ps{target_ps}"
    with tf.device(ps_device(data_ps)):
        blob, specs = wire.pack([t for m in members for t in m.tensors] + [round_id], name)
    with tf.device(ps_device(target_ps)):
        got = wire.unpack(blob, specs)
        r_id = got[-1]
        present = []
        for j, m in enumerate(members):
            r_rows, r_delta, r_entry, r_sids, r_seqs = got[5 * j: 5 * j + 5]
            present.append(ec_ops.parity_fold_batch(
                m.variable, r_rows, r_delta, r_entry, r_sids, r_seqs, m.coef, opt.log_of(target_ps), r_id, m.target,
                m.tid))
        answer, answer_specs = wire.pack(present, f"{name}_answer")
    with tf.device(ps_device(data_ps)):
        back = wire.unpack(answer, answer_specs)
    return [((m.tid, m.index), p, b) for m, p, b in zip(members, present, back)]


def _intersect(lists: list[tf.Tensor], name: str) -> tf.Tensor:
    """The ids in every one of `lists` (1-D int64), in the first list's order."""
    with tf.name_scope(name):
        out = lists[0]
        for other in lists[1:]:
            missing, _ = tf.raw_ops.ListDiff(x=out, y=other)
            out, _ = tf.raw_ops.ListDiff(x=out, y=missing)
        return tf.identity(out)
