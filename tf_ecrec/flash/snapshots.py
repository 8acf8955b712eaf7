"""`FlashSnapshots`: the graph ops of a flash checkpoint and the session calls that use them.

Build it before the graph is finalized, with the variables of the PS tasks.  A round
(`tf_ecrec.flash.hooks.FlashCheckpointHook` drives it on the chief) goes:

1. **gate**: ``request(epoch)`` on PS 0's gate; every other trainer's `FlashGateHook` sees it with
   its next step's result, records itself parked and waits for ``release``;
2. **capture** (`capture`, the only part during which training is paused): read every PS's delta
   log and the global step, copy every variable into its shadow on its own PS (one copy of the
   PS's bytes, PS-local), read the logs and the global step again.  The copy is a snapshot of one
   global step only if no step was in flight at the first read and none wrote until the second:
   every step's writes stay in the logs until its commit and every step increments the global step
   before it commits, so a step that wrote in between shows as a pending entry or a moved step.
   A capture that sees one is dropped (a trainer that did not park, a dead task's unsettled step);
3. **release**; then, with training going on, `write` serializes each shadow into shared memory on
   its PS's host (own tier), ships the files to the next PS's host (peer tier) and, every
   `persist_every`-th time, to the model dir (disk tier): PS to PS, never through the chief.

Every tier's manifest is emptied before its files are written and written after them.  `find`
reads the manifests, `tf_ecrec.flash.config.choose` picks the newest epoch complete on every PS, and
`restore` assigns every variable from it on its own PS.  Parity and replicas are in the snapshot
like any variable: it was taken with no step in flight, so they are exact.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_ecrec.base.retry import Retry, duplicate_request
from tf_ecrec.errors import ConfigError
from tf_ecrec.flash.config import (
    BUNDLE,
    FILES,
    MANIFEST,
    SLOTS,
    Choice,
    Copy,
    FlashConfig,
    Manifest,
    Tier,
    choose,
    shm_root,
    slot_dir,
)
from tf_ecrec.layout.device import maybe_ps_index, ps_device, variable_name
from tf_ecrec.ops import delta_log_pending
from tf_ecrec.recovery.deadline_session import LONG_OP_TIMEOUT_MS
from tf_ecrec.step.steplog import feeds

_LOG = logging.getLogger(__name__)

# The gate, the slots and the capture are reads and assigns of fed values: run again when TF's transport
# delivered a call twice (the round would otherwise be lost to a transport retry).
_RERUN = Retry(max_tries=3, delay=0.05, deadline=60.0, retry_if=duplicate_request)


def _rerun(sess: Any, fetches: Any, feed_dict: Any = None) -> Any:
    return _RERUN(sess.run, fetches, feed_dict)


class FlashSnapshots:
    """The ops of flash checkpoints of a PS job's variables (see the module docstring).

    Args:
      config: the `FlashConfig`.
      model_dir: the job's model dir (names the shared-memory directory; holds the disk tier).
      logs: PS task -> its delta log handle (the protection's).
      num_ps: the PS count.
      num_trainers: the chief and the workers (the gate's parking slots).
      variables: what is snapshotted (default: every global variable on a PS), or a mapping from the
        names the snapshot gives them (unique) to them (a TF2 model's variables may share a name).
      step: the global step variable (default: the graph's; a TF2 job's is its optimizer's ``iterations``).
    """

    def __init__(self, config: FlashConfig, model_dir: str, logs: Mapping[int, tf.Tensor], num_ps: int,
                 num_trainers: int, variables: Sequence[tf.Variable] | Mapping[str, tf.Variable] | None = None,
                 step: Any = None) -> None:
        if not model_dir:
            raise ConfigError("flash checkpoints need a model dir; source: RunConfig(model_dir=)")
        self.config = config
        self.model_dir = model_dir
        self.root = shm_root(config, model_dir)
        self.num_ps = int(num_ps)
        self.num_trainers = int(num_trainers)
        if isinstance(variables, Mapping):
            named = list(variables.items())
        else:
            named = [(variable_name(v), v) for v in (variables if variables is not None else tf.compat.v1.global_variables())]
        by_ps: dict[int, list[tuple[str, tf.Variable]]] = {p: [] for p in range(self.num_ps)}
        for name, v in named:
            p = maybe_ps_index(v.device)
            if p is not None:
                if not hasattr(v, "handle"):
                    raise ConfigError(f"variable {name!r} is not a resource variable; rule: flash "
                                      "checkpoints copy resource variables; source: the model's variables")
                by_ps[p].append((name, v))
        self.variables = {p: [v for _, v in sorted(nvs, key=lambda nv: nv[0])] for p, nvs in by_ps.items()}
        self.names = {p: tuple(sorted(n for n, _ in nvs)) for p, nvs in by_ps.items()}
        self.bytes = {p: sum(int(np.prod(v.shape.as_list())) * v.dtype.base_dtype.size for v in vs)
                      for p, vs in self.variables.items()}
        # Writes are background work of GB at big tables: the session's operation timeout (there to end
        # waits on a dead task) cut them at 400,000 rows.
        self._long = tf.compat.v1.RunOptions(timeout_in_ms=LONG_OP_TIMEOUT_MS)
        step = step if step is not None else tf.compat.v1.train.get_global_step()
        with tf.name_scope("ec_flash"):
            self._build_gate()
            shadows = self._build_capture(logs, step)
            self._build_files(shadows)

    # ---- building ---------------------------------------------------------------------------------

    def _build_gate(self) -> None:
        with tf.device(ps_device(0)):
            self._epoch = tf.compat.v1.placeholder(tf.int64, [], name="epoch")
            self._trainer = tf.compat.v1.placeholder(tf.int32, [], name="trainer")
            gate = tf.raw_ops.VarHandleOp(dtype=tf.int64, shape=[2], shared_name="ec_flash_gate", name="gate")
            # One slot per trainer, then the count of every write to a slot (`activity`).
            parked = tf.raw_ops.VarHandleOp(dtype=tf.int64, shape=[self.num_trainers + 1], shared_name="ec_flash_parked",
                                            name="parked")
            self._gate_handles = [gate, parked]
            self.gate_value = tf.raw_ops.ReadVariableOp(resource=gate, dtype=tf.int64, name="gate_value")
            self._parked_value = tf.raw_ops.ReadVariableOp(resource=parked, dtype=tf.int64)
            self._gate_ready = tf.logical_and(tf.raw_ops.VarIsInitializedOp(resource=gate),
                                              tf.raw_ops.VarIsInitializedOp(resource=parked))
            self._gate_init = tf.group(
                tf.raw_ops.AssignVariableOp(resource=gate, value=tf.zeros([2], tf.int64)),
                tf.raw_ops.AssignVariableOp(resource=parked, value=tf.zeros([self.num_trainers + 1], tf.int64)))
            one = tf.reshape(self._epoch, [1])
            self._request = tf.raw_ops.ResourceScatterUpdate(resource=gate, indices=[0], updates=one)
            self._release = tf.raw_ops.ResourceScatterUpdate(resource=gate, indices=[1], updates=one)
            # The slot first, then the count: a read that sees the count of a write sees its slot too
            # (two ops of one call run in any order; a reader in between would see the count alone).
            slot = tf.raw_ops.ResourceScatterUpdate(resource=parked, indices=tf.reshape(self._trainer, [1]), updates=one)
            with tf.control_dependencies([slot]):
                self._park = tf.raw_ops.ResourceScatterAdd(resource=parked, indices=[self.num_trainers],
                                                           updates=tf.ones([1], tf.int64))

    def _quiet_reads(self, logs: Mapping[int, tf.Tensor], step: Any) -> dict[str, Any]:
        reads: dict[str, Any] = {}
        for p, log in sorted(logs.items()):
            with tf.device(log.device):
                reads[f"pending{p}"] = delta_log_pending(log)[0]
        if step is not None:
            with tf.device(step.device):
                reads["step"] = tf.raw_ops.ReadVariableOp(resource=step.handle, dtype=step.dtype.base_dtype)
        return reads

    def _build_capture(self, logs: Mapping[int, tf.Tensor], step: Any) -> dict[int, list[tf.Tensor]]:
        self._before = self._quiet_reads(logs, step)
        shadows: dict[int, list[tf.Tensor]] = {}
        self._shadows = shadows
        copies = []
        for p, vs in self.variables.items():
            with tf.device(ps_device(p)):
                shadows[p] = []
                for name, v in zip(self.names[p], vs):
                    dtype = v.dtype.base_dtype
                    shadow = tf.raw_ops.VarHandleOp(dtype=dtype, shape=v.shape, shared_name=f"ec_flash_shadow/{name}")
                    # A read copies the bytes (our ops keep updated variables in copy-on-read mode;
                    # a variable never updated in place keeps its buffer until an assign replaces it).
                    copies.append(tf.raw_ops.AssignVariableOp(
                        resource=shadow, value=tf.raw_ops.ReadVariableOp(resource=v.handle, dtype=dtype)))
                    shadows[p].append(shadow)
        self._copy = tf.group(copies, name="capture")
        with tf.control_dependencies([self._copy]):
            self._after = self._quiet_reads(logs, step)
        return shadows

    def _build_files(self, shadows: dict[int, list[tf.Tensor]]) -> None:
        """Per device: a small-file put/get (manifests); per PS: serialize its shadows, ship its files
        to another device, restore its variables from files read on a given device."""
        self._path = {d: tf.compat.v1.placeholder(tf.string, [], name=f"path{d}") for d in range(self.num_ps)}
        self._blob = {d: tf.compat.v1.placeholder(tf.string, [], name=f"blob{d}") for d in range(self.num_ps)}
        self._put, self._get, self._list = {}, {}, {}
        for d in range(self.num_ps):
            with tf.device(ps_device(d)):
                self._put[d] = tf.io.write_file(self._path[d], self._blob[d])
                self._get[d] = tf.io.read_file(self._path[d])
                self._list[d] = tf.io.matching_files(self._path[d])
        self._src = {p: tf.compat.v1.placeholder(tf.string, [], name=f"src{p}") for p in range(self.num_ps)}
        self._dst = {p: tf.compat.v1.placeholder(tf.string, [], name=f"dst{p}") for p in range(self.num_ps)}
        self._serialize, self._ship, self._restore = {}, {}, {}
        for p, vs in self.variables.items():
            if not vs:
                raise ConfigError(f"PS {p} holds no variable to snapshot; source: the model's variable placement")
            with tf.device(ps_device(p)):
                # One tensor bundle per copy, written straight from the shadows' buffers.
                self._serialize[p] = tf.raw_ops.SaveV2(
                    prefix=tf.strings.join([self._dst[p], BUNDLE], "/"), tensor_names=list(self.names[p]),
                    shape_and_slices=[""] * len(vs),
                    tensors=[tf.raw_ops.ReadVariableOp(resource=s, dtype=v.dtype.base_dtype) for s, v in zip(shadows[p], vs)])
            for reader in sorted({p, self.peer(p)}):
                for writer in sorted({p, self.peer(p)}):
                    self._ship[(p, reader, writer)] = self._ship_op(p, reader, writer)
                self._restore[(p, reader)] = self._restore_op(p, reader)

    def _ship_op(self, p: int, reader: int, writer: int) -> tf.Operation:
        writes = []
        for name in FILES:
            with tf.device(ps_device(reader)):
                blob = tf.io.read_file(tf.strings.join([self._src[p], name], "/"))
            with tf.device(ps_device(writer)):
                writes.append(tf.io.write_file(tf.strings.join([self._dst[p], name], "/"), blob))
        return tf.group(writes)

    def _restore_op(self, p: int, reader: int) -> tf.Operation:
        vs = self.variables[p]
        with tf.device(ps_device(reader)):  # read where the copy is, assign where the variables are
            values = tf.raw_ops.RestoreV2(prefix=tf.strings.join([self._src[p], BUNDLE], "/"), tensor_names=list(self.names[p]),
                                          shape_and_slices=[""] * len(vs), dtypes=[v.dtype.base_dtype for v in vs])
        with tf.device(ps_device(p)):
            return tf.group([tf.raw_ops.AssignVariableOp(resource=v.handle, value=x) for v, x in zip(vs, values)])

    # ---- the gate ---------------------------------------------------------------------------------

    def resources(self, p: int) -> list[tf.Tensor]:
        """The handles of what the rounds keep in PS `p`'s memory (its shadows; PS 0: the gate)."""
        return list(self._shadows[p]) + (list(self._gate_handles) if p == 0 else [])

    def peer(self, p: int) -> int:
        """The PS whose host holds PS `p`'s peer copy."""
        return (p + 1) % self.num_ps

    def init_gate(self, sess: Any) -> None:
        """Creates the gate on PS 0 if it is not there (before trainers step: they read it every step)."""
        if not _rerun(sess, self._gate_ready):
            _rerun(sess, self._gate_init)

    def request(self, sess: Any, epoch: int) -> None:
        _rerun(sess, self._request, feeds((self._epoch, epoch)))

    def release(self, sess: Any, epoch: int) -> None:
        _rerun(sess, self._release, feeds((self._epoch, epoch)))

    def park(self, sess: Any, trainer: int, epoch: int) -> None:
        _rerun(sess, self._park, feeds((self._trainer, trainer), (self._epoch, epoch)))

    def parked(self, sess: Any) -> np.ndarray:
        """Every trainer's slot (ABSENT, PRESENT or the epoch it parked for)."""
        return _rerun(sess, self._parked_value)[: self.num_trainers]

    def slots(self, sess: Any) -> tuple[np.ndarray, int]:
        """Every trainer's slot and `activity`, the count of writes to them, read at once.

        A trainer writes its slot before it can step outside a round's pause (its session began, it
        stopped waiting for a release, it ended), so an unchanged count across the capture proves
        that no trainer stepped during it (the strict rounds of jobs without delta logs).
        """
        value = _rerun(sess, self._parked_value)
        return value[: self.num_trainers], int(value[self.num_trainers])

    def gate(self, sess: Any) -> tuple[int, int]:
        requested, released = _rerun(sess, self.gate_value)
        return int(requested), int(released)

    # ---- a round ----------------------------------------------------------------------------------

    def capture(self, sess: Any) -> int | None:
        """Copies every variable into its shadow; the global step of the copy, or None when a step was
        in flight (then the shadows hold nothing usable).  Hold the reconciler's lock around it."""
        before = _rerun(sess, self._before)
        if any(len(v) for k, v in before.items() if k.startswith("pending")):
            return None
        after = _rerun(sess, [self._copy, self._after])[1]
        if any(len(v) for k, v in after.items() if k.startswith("pending")) or after.get("step") != before.get("step"):
            return None
        return int(before.get("step", 0))

    def write(self, sess: Any, epoch: int, global_step: int, slot: int, tiers: Sequence[Tier]) -> None:
        """Writes the captured shadows to `slot` of `tiers` (own first: the others copy its files)."""
        manifests = {p: Manifest(epoch, global_step, p, self.num_ps, self.names[p]) for p in range(self.num_ps)}
        for tier in tiers:
            dirs = {p: self.slot_dir(tier, p, slot) for p in range(self.num_ps)}
            holder = {p: self._holder(tier, p) for p in range(self.num_ps)}
            self._put_all(sess, {holder[p]: (os.path.join(dirs[p], MANIFEST), b"") for p in dirs})
            if tier is Tier.OWN:
                sess.run([self._serialize[p] for p in dirs], feeds(*[(self._dst[p], dirs[p]) for p in dirs]),
                         options=self._long)
            else:
                own = {p: self.slot_dir(Tier.OWN, p, slot) for p in dirs}
                sess.run([self._ship[(p, p, holder[p])] for p in dirs],
                         feeds(*[(self._src[p], own[p]) for p in dirs], *[(self._dst[p], dirs[p]) for p in dirs]),
                         options=self._long)
            self._put_all(sess, {holder[p]: (os.path.join(dirs[p], MANIFEST), manifests[p].encode()) for p in dirs})

    def _put_all(self, sess: Any, files: Mapping[int, tuple[str, bytes]]) -> None:
        # One put per device per call: a PS's own and peer manifests go in separate calls.
        sess.run([self._put[d] for d in files],
                 feeds(*[(self._path[d], path) for d, (path, _) in files.items()],
                       *[(self._blob[d], blob) for d, (_, blob) in files.items()]), options=self._long)

    def _holder(self, tier: Tier, p: int) -> int:
        return self.peer(p) if tier is Tier.PEER else p

    def slot_dir(self, tier: Tier, p: int, slot: int) -> str:
        return slot_dir(tier, p, slot, root=self.root, model_dir=self.model_dir)

    def tiers(self) -> list[Tier]:
        """The memory tiers a round writes (no peer with one PS)."""
        return [Tier.OWN] if self.num_ps == 1 else [Tier.OWN, Tier.PEER]

    # ---- restore ----------------------------------------------------------------------------------

    def find(self, sess: Any) -> list[Copy]:
        """Every complete copy any PS holds, in any tier and slot (listed and read on the PS that holds it)."""
        found = []
        for p in range(self.num_ps):
            for tier in (Tier.OWN, Tier.PEER, Tier.DISK):
                if tier is Tier.PEER and self.num_ps == 1:
                    continue
                d = self._holder(tier, p)
                pattern = os.path.join(os.path.dirname(self.slot_dir(tier, p, 0)), "slot*", MANIFEST)
                for path in sess.run(self._list[d], feeds((self._path[d], pattern))):
                    match = re.search(r"slot(\d+)$", os.path.dirname(path.decode()))
                    if match is None or int(match.group(1)) >= SLOTS:
                        continue
                    try:
                        blob = sess.run(self._get[d], feeds((self._path[d], path.decode())))
                    except tf.errors.NotFoundError:  # emptied and removed meanwhile
                        continue
                    manifest = Manifest.decode(blob)
                    if manifest is not None and manifest.ps == p:
                        found.append(Copy(tier, int(match.group(1)), manifest))
        return found

    def choose(self, sess: Any) -> Choice | None:
        """The newest snapshot complete on every PS (`tf_ecrec.flash.config.choose`), or None."""
        return choose(self.find(sess), self.num_ps, self.names)

    def restore(self, sess: Any, choice: Choice, options: Any = None) -> int:
        """Assigns every PS variable from `choice` on its own PS; returns the bytes restored."""
        ops, pairs = [], []
        for p, copy in sorted(choice.copies.items()):
            reader = self._holder(copy.tier, p)
            ops.append(self._restore[(p, reader)])
            pairs.append((self._src[p], self.slot_dir(copy.tier, p, copy.slot)))
        sess.run(ops, feeds(*pairs), options=options)
        return sum(self.bytes.values())
