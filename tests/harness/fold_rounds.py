"""A trainer's fold round (`tf_ecrec.step.batched_commit`) driven one op at a time, for the fault-schedule harness.

A round's ops run in a random order that respects the graph's data and control edges (a fold after
its variable's take, a mark after its folds, a PS's ready after its marks and every counter read, the
commits after every ready, the query last), so that a failure or another trainer's op can land
between any two of them.  What a round found durable is what the trainer acknowledges.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tf_ecrec.step.fold_round import FoldRound


@dataclasses.dataclass
class Round:
    """One fold round of a worker: its remaining ops and what the ones run so far returned."""

    actions: list[tuple[str, Any]]
    results: dict = dataclasses.field(default_factory=dict)
    pending: list[int] = dataclasses.field(default_factory=list)  # the worker's returned steps it asks about
    round_id: int = 0  # its id, the worker's generation in the top bits (a round of an older one is refused)


def new_round(rng: np.random.Generator, fr: FoldRound, pending: list[int], round_id: int) -> Round:
    """The ops of a round in a random order the graph allows, asking about the steps `pending`."""
    takes = list(fr.takes)
    rng.shuffle(takes)
    order: list[tuple[str, Any]] = [("take", tid) for tid in takes]
    for tid in takes:  # each fold after its take, each mark after its folds
        first = order.index(("take", tid))
        for i in range(len(fr.folds[tid])):
            order.insert(int(rng.integers(first + 1, len(order) + 1)), ("fold", (tid, i)))
        last = max((order.index(("fold", (tid, i))) for i in range(len(fr.folds[tid]))), default=first)
        order.insert(int(rng.integers(last + 1, len(order) + 1)), ("mark", tid))
    for tid in fr.counted:  # a counter read anywhere before the readies
        order.insert(int(rng.integers(0, len(order) + 1)), ("counted", tid))
    readies = [("ready", p) for p in fr.ready]
    rng.shuffle(readies)
    commits = [("commit", p) for p in fr.commits]
    rng.shuffle(commits)
    return Round(order + readies + commits + [("query", None)], pending=list(pending), round_id=round_id)


def run_action(sess: Any, fr: FoldRound, rnd: Round, kind: str, arg: Any, options: Any,
               check_ready: bool = True) -> list[int] | None:
    """Runs one op of `rnd`; for the query, returns the pending steps it found durable.  Without
    `check_ready` (a mutation test's broken protocol) every counted step is ready, folded or not."""
    res = rnd.results
    ids = {fr.round_id: rnd.round_id}
    if kind == "counted":
        res["counted", arg] = sess.run(fr.counted[arg], options=options)
    elif kind == "take":
        res["take", arg] = sess.run(list(fr.takes[arg]), options=options)
    elif kind == "fold":
        tid, i = arg
        feed = {**ids, **dict(zip(fr.takes[tid], res["take", tid]))}
        res["present", tid, i] = sess.run(fr.folds[tid][i], feed, options=options)
    elif kind == "mark":
        feed = {fr.takes[arg][4]: res["take", arg][4]}
        feed.update({t: res["present", arg, i] for i, t in enumerate(fr.presents[arg])})
        sess.run(fr.marks[arg], feed, options=options)
    elif kind == "ready" and not check_ready:
        lists = [set(res["counted", tid].tolist()) for tid in fr.counted]
        res["ready", arg] = np.array(sorted(set.intersection(*lists)), np.int64)
    elif kind == "ready":
        lists = [set(res["counted", tid].tolist()) for tid in fr.counted]
        feed = {fr.ready_gates[arg]: np.array(sorted(set.intersection(*lists)), np.int64)}
        res["ready", arg] = sess.run(fr.ready[arg], feed, options=options)
    elif kind == "commit":
        feed = {**ids, **{fr.ready[p]: res["ready", p] for p in fr.ready}}
        res["commit", arg] = sess.run(fr.commits[arg], feed, options=options)
    else:
        flags = sess.run(fr.committed, {fr.query_gate: np.array(rnd.pending, np.int64)}, options=options)
        return [sid for sid, flag in zip(rnd.pending, flags) if flag]
    return None
