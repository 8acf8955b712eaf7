"""A hook that measures trained records per second and reports sessions and progress.

It serves two readers:

- TensorBoard: every `every_secs` it writes ``tf_ecrec/records_per_sec`` and,
  when a session is re-created after a failure, ``tf_ecrec/session_start_step``
  (the global step the new session starts from: a drop shows a rollback);
- whoever passes a `StatusReporter` (the local launcher, ``tf-ecrec run``,
  passes the sender of its status channel): reports ``session``, ``step``
  and ``done``, each with keyword fields.

Throttling is two `tf.compat.v1.train.SecondOrStepTimer` (summaries, and
progress reports), which may be passed in; rates are measured with `clock`.

Call order (per MonitoredSession)::

    begin()                      find the global step and the batch-records tensor
    after_create_session(s, c)   read the global step, report "session"   (again after each recovery)
    before_run()                 fetch global step + records of this batch
    after_run()                  accumulate; report when the send timer triggers, write
                                 the rate when the summary timer does
    end(s)                       report the totals ("done")

The records of a batch, and the corrupt records skipped in it, come from the
graph collections ``BATCH_RECORDS_COLLECTION`` and ``CORRUPT_RECORDS_COLLECTION``
of `tf_ecrec.data.pipeline` (see `with_data_accounting`); without the first
the configured `batch_size` is assumed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import tensorflow as tf

from tf_ecrec.data.pipeline import BATCH_RECORDS_COLLECTION, CORRUPT_RECORDS_COLLECTION
from tf_ecrec.errors import ConfigError

_LOG = logging.getLogger(__name__)


class StatusReporter(Protocol):
    """Where the hook's reports go; must never block nor raise (it runs on the training thread)."""

    def send(self, kind: str, **fields: Any) -> None:
        """Reports one event: `kind` is "session", "step" or "done"."""
        ...


class ThroughputHook(tf.compat.v1.train.SessionRunHook):
    """Counts trained records, writes throughput summaries, reports progress.

    Args:
      status: where to report sessions, progress and totals, or None.
      summary_dir: where to write TensorBoard summaries, or None.
      batch_size: records per step when the graph does not say.
      every_secs: summary period.
      send_every_secs: minimum period of progress reports.
      totals: called at the end; its dict is added to the "done" report.
      summary_timer: throttles summaries (default ``SecondOrStepTimer(every_secs=every_secs)``).
      send_timer: throttles progress reports (default ``SecondOrStepTimer(every_secs=send_every_secs)``).
      clock: seconds, for the measured rate (default `time.time`).
    """

    def __init__(
        self,
        status: StatusReporter | None = None,
        summary_dir: str | None = None,
        batch_size: int | None = None,
        every_secs: float = 5.0,
        send_every_secs: float = 0.02,
        totals: Callable[[], dict[str, Any]] | None = None,
        *,
        summary_timer: tf.compat.v1.train.SecondOrStepTimer | None = None,
        send_timer: tf.compat.v1.train.SecondOrStepTimer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if every_secs <= 0 or send_every_secs < 0:
            raise ConfigError(
                f"every_secs must be > 0 and send_every_secs >= 0, got {every_secs}, {send_every_secs}; "
                "source: ThroughputHook"
            )
        self._status = status
        self._summary_dir = summary_dir
        self._batch_size = batch_size
        self._summary_timer = summary_timer or tf.compat.v1.train.SecondOrStepTimer(every_secs=every_secs)
        self._send_timer = send_timer or tf.compat.v1.train.SecondOrStepTimer(every_secs=send_every_secs)
        self._clock = clock
        self._totals = totals
        self._records_total = 0
        self._corrupt_total = 0
        self._records_unsent = 0
        self._steps_total = 0
        self._sessions = 0
        self._window_start = 0.0
        self._window_records = 0
        self._last_step = -1

    @property
    def records_trained(self) -> int:
        """Records this task trained so far (every step's actual batch)."""
        return self._records_total

    @property
    def corrupt_records(self) -> int:
        """Corrupt records skipped in the batches this task trained."""
        return self._corrupt_total

    def begin(self) -> None:
        self._global_step = tf.compat.v1.train.get_global_step()
        if self._global_step is None:
            raise ConfigError("ThroughputHook needs a global step in the graph; source: the model_fn")
        counts = tf.compat.v1.get_collection(BATCH_RECORDS_COLLECTION)
        self._records = tf.add_n([tf.cast(c, tf.int64) for c in counts]) if counts else None
        corrupt = tf.compat.v1.get_collection(CORRUPT_RECORDS_COLLECTION)
        self._corrupt = tf.add_n([tf.cast(c, tf.int64) for c in corrupt]) if corrupt else None
        if self._records is None and self._batch_size is None:
            raise ConfigError(
                f"ThroughputHook needs the batch size: put tf.size(labels) in the graph collection "
                f"{BATCH_RECORDS_COLLECTION!r} or pass batch_size; source: ThroughputHook"
            )
        self._writer = tf.compat.v1.summary.FileWriterCache.get(self._summary_dir) if self._summary_dir else None

    def after_create_session(self, session: tf.compat.v1.Session, coord: Any) -> None:
        step = int(session.run(self._global_step))
        self._sessions += 1
        self._last_step = step
        if self._status:
            self._status.send("session", step=step, session=self._sessions)
        if self._writer is not None and self._sessions > 1:
            self._write({"tf_ecrec/session_start_step": step}, step)
        # A new measuring window: the summary timer triggers `every_secs` from now.
        self._summary_timer.reset()
        self._summary_timer.update_last_triggered_step(step)
        self._window_start, self._window_records = self._clock(), 0

    def before_run(self, run_context: tf.compat.v1.train.SessionRunContext) -> tf.compat.v1.train.SessionRunArgs:
        fetches = {"step": self._global_step}
        if self._records is not None:
            fetches["records"] = self._records
        if self._corrupt is not None:
            fetches["corrupt"] = self._corrupt
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context: Any, run_values: tf.compat.v1.train.SessionRunValues) -> None:
        results = run_values.results
        records = int(results["records"]) if "records" in results else int(self._batch_size or 0)
        self._last_step = int(results["step"])
        self._records_total += records
        self._corrupt_total += int(results.get("corrupt", 0))
        self._records_unsent += records
        self._window_records += records
        self._steps_total += 1
        if self._status and self._send_timer.should_trigger_for_step(self._last_step):
            self._send_timer.update_last_triggered_step(self._last_step)
            self._status.send("step", step=self._last_step, records=self._records_unsent)
            self._records_unsent = 0
        if self._writer is not None and self._summary_timer.should_trigger_for_step(self._last_step):
            self._summary_timer.update_last_triggered_step(self._last_step)
            now = self._clock()
            rate = self._window_records / max(now - self._window_start, 1e-9)
            self._write({"tf_ecrec/records_per_sec": rate}, self._last_step)
            self._window_start, self._window_records = now, 0

    def end(self, session: tf.compat.v1.Session) -> None:
        self._last_step = int(session.run(self._global_step))  # the step fetched last ran before its increment
        if self._status:
            if self._records_unsent:
                self._status.send("step", step=self._last_step, records=self._records_unsent)
                self._records_unsent = 0
            extra = self._totals() if self._totals else {}
            self._status.send(
                "done",
                step=self._last_step,
                records=self._records_total,
                steps=self._steps_total,
                corrupt_records=self._corrupt_total,
                **extra,
            )
        if self._writer is not None:
            self._writer.flush()

    def _write(self, values: dict[str, float], step: int) -> None:
        assert self._writer is not None  # callers write only with a summary writer
        summary = tf.compat.v1.Summary(
            value=[tf.compat.v1.Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()]
        )
        self._writer.add_summary(summary, step)
