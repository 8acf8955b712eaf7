"""A PS's own copy persisted to the disk tier by the PS process itself (SIGTERM: a preemption).

The round writer persists every ``persist_every``-th snapshot PS to PS; this covers the moment a
PS is told to go: `persist_newest` copies its newest complete copy in shared memory to the disk
slot that does not hold the newest disk copy, manifest emptied first and written last, and gives
up (leaving that slot without a manifest) if a round overwrote the source meanwhile.
"""

from __future__ import annotations

import logging
import os

import tensorflow as tf

from tf_ecrec.flash.config import MANIFEST, SLOTS, FlashConfig, Manifest, Tier, shm_root, slot_dir

_LOG = logging.getLogger(__name__)


def _manifest(directory: str) -> Manifest | None:
    path = os.path.join(directory, MANIFEST)
    try:
        with tf.io.gfile.GFile(path, "rb") as fh:
            return Manifest.decode(fh.read())
    except tf.errors.NotFoundError:
        return None


def persist_newest(config: FlashConfig, model_dir: str, ps: int) -> Manifest | None:
    """Copies PS `ps`'s newest complete copy in this host's shared memory to the disk tier; returns
    its manifest, or None when there was none (or a round overwrote it during the copy)."""
    root = shm_root(config, model_dir)
    own = [(m, slot) for slot in range(SLOTS)
           if (m := _manifest(slot_dir(Tier.OWN, ps, slot, root=root, model_dir=model_dir))) is not None]
    if not own:
        return None
    manifest, slot = max(own, key=lambda ms: ms[0].epoch)
    src = slot_dir(Tier.OWN, ps, slot, root=root, model_dir=model_dir)
    disk = {s: _manifest(slot_dir(Tier.DISK, ps, s, root=root, model_dir=model_dir)) for s in range(SLOTS)}
    if any(m is not None and m.epoch == manifest.epoch for m in disk.values()):
        return manifest  # already there
    target = min(range(SLOTS), key=lambda s: disk[s].epoch if disk[s] is not None else -1)  # type: ignore[union-attr]
    dst = slot_dir(Tier.DISK, ps, target, root=root, model_dir=model_dir)
    tf.io.gfile.makedirs(dst)
    with tf.io.gfile.GFile(os.path.join(dst, MANIFEST), "wb") as fh:
        fh.write(b"")
    for name in tf.io.gfile.listdir(src):
        if name != MANIFEST:
            tf.io.gfile.copy(os.path.join(src, name), os.path.join(dst, name), overwrite=True)
    if _manifest(src) != manifest:
        _LOG.warning("flash checkpoint of PS %d not persisted: a round rewrote it during the copy", ps)
        return None
    with tf.io.gfile.GFile(os.path.join(dst, MANIFEST), "wb") as fh:
        fh.write(manifest.encode())
    return manifest
