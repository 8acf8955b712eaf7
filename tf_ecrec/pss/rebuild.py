"""A lost PS's tables rebuilt under TF2: in the background while ``model.fit`` trains on, or before it.

The Estimator path's background rebuild (docs/rebuild.md) run from the coordinator: `begin` is its T0
(the re-created table variables' rows marked pending on their PS, every PS keeping the T0 words of the
rows the rebuild decodes from), called by `tf_ecrec.pss.recovery.PSSRecovery` with every step settled
and none running; `start` then runs its loops on the coordinator's threads (the rows lookups wait for,
and the walk over every lost chunk) while ``fit`` runs again.  The lookups of a TF2 step wait for
pending rows as an Estimator step's do (`EmbeddingCollection` puts ``AwaitRebuiltRows`` before each
gather), so a step reads only installed rows.  `sync` is the rebuild before training resumes (the
default before 2026-12-01; ``PSSRecovery(background=False)``).

Until the walk has installed every row, the PS being rebuilt stays *unfinished*: a failure meanwhile
re-creates and rebuilds it again with the new loss, and nothing may save the variables (a pending row
reads as zeros): `tf_ecrec.pss.fit` waits for the rebuild before a callback may save and before it
returns, and the backups skip the epochs that end meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.layout.device import ps_device
from tf_ecrec.layout.stripe_encoding import row_words, split_row_words
from tf_ecrec.pss.function_session import FunctionSession
from tf_ecrec.rebuild.background import BackgroundRebuild
from tf_ecrec.rebuild.rebuilder import Rebuilder
from tf_ecrec.rebuild.stripes import CollectionRebuild, RebuildStats


def delta_logs(num_ps: int) -> dict[int, tf.Tensor]:
    """Each PS's delta log handle, made in the graph being built (a function session's)."""
    logs = {}
    for p in range(num_ps):
        with tf.device(ps_device(p)):
            logs[p] = ec_ops.delta_log(name=f"ec_delta_log_ps{p}")
    return logs


def copy_dense(protector: Any, replaced: dict[int, tuple[tf.Variable, tf.Variable]]) -> None:
    """Dense variables (with slots) and the iteration count from a surviving copy, replicas from their primary,
    where `replaced` (id(old) -> (old, new)) re-created one."""
    new_ids = {id(new) for _, new in replaced.values()}
    for name, primary in protector.protected.items():
        reps = protector.replicas[name]
        group = [primary, *protector.slots_of(primary)]
        is_step = primary.shape.rank == 0
        if any(id(v) in new_ids for v in group):
            source = next(r for r in reps if id(r) not in new_ids)
            with tf.device(primary.device):
                if is_step:
                    primary.assign(source.read_value())
                else:
                    for v, value in zip(group, split_row_words(source.read_value(), group)):
                        v.assign(value)
        for rep in reps:
            if id(rep) in new_ids:
                with tf.device(rep.device):
                    rep.assign(primary.read_value() if is_step else row_words([v.read_value() for v in group], int(primary.shape[0])))


def sync(protection: Any, protector: Any, lost: list[int], slice_bytes: int) -> RebuildStats:
    """Every chunk of the `lost` PS decoded and written, PS to PS in slices, before this returns."""
    stats = RebuildStats()
    colls = list(protection.collections)
    rebuild = FunctionSession(lambda: [CollectionRebuild(c, protector, slice_bytes) for c in colls])
    for table in rebuild.built:
        targets = [ch for st in table.layout.stripes for ch in st.chunks if ch.ps in lost]
        present = {st.index: {ch.index_in_stripe for ch in st.chunks if ch.ps not in lost} for st in table.layout.stripes}
        table.run(rebuild, targets, present, None, stats)
    return stats


class TableRebuild:
    """One recovery's background rebuild of the `lost` PS's tables (see the module doc)."""

    def __init__(self, protection: Any, protector: Any, lost: Iterable[int], slice_bytes: int) -> None:
        self.lost = sorted(int(p) for p in lost)

        def build() -> Rebuilder:
            return Rebuilder(protector, protection.collections, slice_bytes, logs=delta_logs(protection.num_ps))

        self.session = FunctionSession(build)
        self.job: BackgroundRebuild | None = None
        self._done = threading.Event()
        self._on_done: Callable[[TableRebuild], None] | None = None

    def begin(self) -> BackgroundRebuild:
        """T0: the lost rows pending, every PS keeping the T0 words of the rows decoded from (one call)."""
        self.job = self.session.built.begin_background(self.session, self.lost)
        return self.job

    def start(self, on_done: Callable[[TableRebuild], None] | None = None, walkers: int | None = None) -> None:
        """The loops on threads (the wanted rows' and `walkers` walking, `BackgroundRebuild.start`); `on_done(self)`
        (the one given before, if None) once every row is installed and preservation ended.  With no walker only
        the rows lookups ask for are installed, until a start with some."""
        assert self.job is not None, "begin first"
        self._on_done = on_done or self._on_done

        def done(_: BackgroundRebuild) -> None:
            self._done.set()
            if self._on_done is not None:
                self._on_done(self)

        self.job.start(self.session, on_done=done, walkers=walkers)

    @property
    def bytes(self) -> int:
        """Bytes written so far: the T0's dense copies, then every row installed."""
        return self.job.stats.bytes if self.job is not None else 0

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        """Waits until every row is installed, the loops stopped (a failure: the next recovery rebuilds the PS
        again), or `timeout`; whether every row is installed."""
        deadline = time.monotonic() + timeout
        while not self._done.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
            if self.job is None or self.job.stopped or time.monotonic() >= deadline:
                return False
        return True

    def stop(self, timeout: float = 30.0) -> None:
        """Ends the loops (a failure is being recovered); rows installed stay installed."""
        if self.job is not None:
            self.job.stop(timeout)
