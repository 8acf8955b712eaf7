"""Session calls under a long deadline: initialisation, rebuilds, restores and saves of a large model.

A session's operation timeout is there to end waits on a dead task; it must
not cut the work itself.  `LongDeadlineSession` runs calls without their own
`RunOptions` under `LONG_OP_TIMEOUT_MS`; `TracingSession` also traces every
call (set `PROFILE_DIR_ENV`); `LongDeadlineSaver`, `long_deadline_scaffold`
and `long_deadline_model_fn` give unprotected training the same deadlines.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.client import session as tf_session

_LOG = logging.getLogger(__name__)

LONG_OP_TIMEOUT_MS = 3_600_000
"""Deadline of initialisation, rebuild and restore calls: a session's operation timeout (there to
end waits on a dead task) must not cut the work itself on a large model."""
PROFILE_DIR_ENV = "TF_ECREC_PROFILE_DIR"
"""When set, every session call of a recovery is traced: a Chrome trace per call and a summary of
each call's wall time against the span its ops ran in (the rest: partitioning, graph registration
on the PS tasks, RPCs) go to that directory (`TracingSession`)."""


class LongDeadlineSaver(tf.compat.v1.train.Saver):
    """The stock Saver, with saves and restores under `LONG_OP_TIMEOUT_MS` instead of the session's timeout.

    The session's operation timeout is there to end waits on a dead task; it
    must not cut the save or the restore of a large model (at 4 GB of tables
    a save takes longer than the default 10 s).
    """

    def save(self, sess: Any, *args: Any, **kwargs: Any) -> Any:  # see class docstring
        return super().save(LongDeadlineSession(sess), *args, **kwargs)

    def restore(self, sess: tf.compat.v1.Session, save_path: str) -> None:  # see class docstring
        self._restore(sess, save_path)

    def _restore(self, sess: tf.compat.v1.Session, save_path: str) -> None:
        """The stock restore op, run under the long deadline instead of the session's."""
        _LOG.info("Restoring parameters from %s", save_path)
        sess.run(
            self.saver_def.restore_op_name, {self.saver_def.filename_tensor_name: save_path},
            options=tf.compat.v1.RunOptions(timeout_in_ms=LONG_OP_TIMEOUT_MS),
        )



def checkpoints_kept(config: Any) -> dict[str, Any]:
    """A Saver's retention arguments from a RunConfig, as `tf.estimator.Estimator` sets its own saver's
    (its defaults, 5 and 10000 hours, without one)."""
    return {
        "max_to_keep": getattr(config, "keep_checkpoint_max", 5),
        "keep_checkpoint_every_n_hours": getattr(config, "keep_checkpoint_every_n_hours", 10000),
    }


def long_deadline_scaffold(base: tf.compat.v1.train.Scaffold | None = None, config: Any = None) -> tf.compat.v1.train.Scaffold:
    """A Scaffold for unprotected training whose initialisation, saves and restores run under
    `LONG_OP_TIMEOUT_MS` (keeps `base`'s local init and summary ops, and the checkpoints `config`, a
    RunConfig, keeps); build it in the model_fn."""
    init = tf.compat.v1.global_variables_initializer()
    long = tf.compat.v1.RunOptions(timeout_in_ms=LONG_OP_TIMEOUT_MS)
    kwargs: dict[str, Any] = {}
    if base is not None:
        kwargs = {"local_init_op": base.local_init_op, "summary_op": base.summary_op}
    return tf.compat.v1.train.Scaffold(
        init_op=tf.no_op(name="long_deadline_init_op"),
        init_fn=lambda scaffold, sess: sess.run(init, options=long),
        saver=LongDeadlineSaver(sharded=True, save_relative_paths=True, **checkpoints_kept(config)),
        **{k: v for k, v in kwargs.items() if v is not None},
    )


def long_deadline_model_fn(model_fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps an Estimator model_fn so that, in training, its Scaffold is `long_deadline_scaffold`."""
    accepted = set(inspect.signature(model_fn).parameters)

    def wrapped(features: Any, labels: Any, mode: str, params: Any, config: Any) -> Any:
        kwargs = {"features": features, "labels": labels, "mode": mode, "params": params, "config": config}
        spec = model_fn(**{k: v for k, v in kwargs.items() if k in accepted})
        if mode == tf.estimator.ModeKeys.TRAIN:
            spec = spec._replace(scaffold=long_deadline_scaffold(spec.scaffold, config))
        return spec

    return wrapped


class LongDeadlineSession(tf_session.SessionInterface):
    """A session whose calls without their own `RunOptions` run under `LONG_OP_TIMEOUT_MS`."""

    def __init__(self, sess: Any) -> None:
        self._sess = sess

    @property
    def graph(self) -> tf.Graph:
        return self._sess.graph

    @property
    def sess_str(self) -> str:
        return getattr(self._sess, "sess_str", "")

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
        if options is None:
            options = tf.compat.v1.RunOptions(timeout_in_ms=LONG_OP_TIMEOUT_MS)
        return self._sess.run(fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata)

    def partial_run_setup(self, *args: Any, **kwargs: Any) -> Any:
        return self._sess.partial_run_setup(*args, **kwargs)

    def partial_run(self, *args: Any, **kwargs: Any) -> Any:
        return self._sess.partial_run(*args, **kwargs)


class TracingSession(LongDeadlineSession):
    """Runs every call fully traced; appends ``{label, wall_s, ops_s}`` per call to
    ``recovery_calls.jsonl`` in `directory` and writes each call's Chrome trace there.

    ``ops_s`` is the span from the first op's start to the last op's end on any
    device; ``wall_s - ops_s`` is what the call spent elsewhere (pruning,
    partitioning and registering its graph on each PS in a new session, RPCs).
    """

    _count = 0

    def __init__(self, sess: Any, directory: str) -> None:
        super().__init__(sess)
        self._dir = directory
        os.makedirs(directory, exist_ok=True)

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
        from tensorflow.python.client import timeline

        traced = tf.compat.v1.RunOptions()
        if options is not None:
            traced.CopyFrom(options)
        traced.trace_level = tf.compat.v1.RunOptions.FULL_TRACE
        traced.output_partition_graphs = True
        meta = run_metadata if run_metadata is not None else tf.compat.v1.RunMetadata()
        t = time.perf_counter()
        out = self._sess.run(fetches, feed_dict=feed_dict, options=traced, run_metadata=meta)
        wall = time.perf_counter() - t
        starts = [n.all_start_micros for d in meta.step_stats.dev_stats for n in d.node_stats]
        ends = [n.all_start_micros + n.all_end_rel_micros for d in meta.step_stats.dev_stats for n in d.node_stats]
        TracingSession._count += 1
        n = TracingSession._count
        label = ",".join(sorted({getattr(f, "name", str(f)).split("/")[0] for f in tf.nest.flatten(fetches)}))[:200]
        with open(os.path.join(self._dir, "recovery_calls.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"call": n, "pid": os.getpid(), "label": label, "wall_s": round(wall, 4),
                                 "ops_s": round((max(ends) - min(starts)) / 1e6, 4) if starts else 0.0,
                                 "devices": len(meta.step_stats.dev_stats),
                                 "partition_nodes": sum(len(g.node) for g in meta.partition_graphs),
                                 "partition_mb": round(sum(g.ByteSize() for g in meta.partition_graphs) / 1e6, 3)})
                     + "\n")
        with open(os.path.join(self._dir, f"recovery_call_{os.getpid()}_{n}.json"), "w", encoding="utf-8") as fh:
            fh.write(timeline.Timeline(meta.step_stats).generate_chrome_trace_format())
        return out
