"""``--data stream:DIR`` (or a Redis Streams partition): the launcher tells the job master which records arrived.

The producer writes whole files into DIR, or appends records to the partition
(`tf_ecrec.data.stream.open_stream`); every `POLL_SECS` the launcher reads the stream's end
(``refresh``) and extends the master's stream dataset to the records that exist, and closes it once
the producer closed the stream (``_CLOSED``, or the topic's closed marker).  The trainers lease only
records that exist, in whole shards while the stream is open (its last partial shard once it is
closed: `tf_ecrec.master.sharding.DatasetSpec`), and end when the master says the closed stream is
all trained.  Until a trainer registered the dataset the master does not know it: the feed tries
again at the next poll.  While the stream is open and every record that can be leased is trained,
the job is waiting for data, not stalled (`idle`), and a trainer without records is not hung
(`leasable`).
"""

from __future__ import annotations

import logging
from typing import Any

from tf_ecrec.data.stream import open_stream
from tf_ecrec.errors import EcRecError, NotFoundError, StreamUnavailable

_LOG = logging.getLogger(__name__)

POLL_SECS = 0.5


class StreamFeed:
    """Extends the master's stream dataset as files arrive (see the module docstring)."""

    def __init__(self, stream_dir: str, watch: Any, shard_records: int, on_corrupt: str = "skip") -> None:
        self.stream = open_stream(stream_dir, on_corrupt=on_corrupt)
        self._shard_records = shard_records
        self._watch = watch
        self._sent: tuple[int, bool] | None = None
        self._last = 0.0
        self._warned = -1e9

    def drive(self, now: float) -> None:
        if now - self._last < POLL_SECS:
            return
        self._last = now
        try:
            current = (self.stream.refresh(), self.stream.closed)
        except StreamUnavailable as exc:  # the broker is away: the records it holds are not lost; poll again
            if now - self._warned > 30:
                self._warned = now
                _LOG.warning("%s", exc)
            return
        if current == self._sent:
            return
        try:
            self._watch.extend(*current)
        except NotFoundError:
            return  # not registered yet: no trainer has started its input
        except EcRecError:
            return  # the master is away (a kill): the next poll sends it again
        self._sent = current

    def leasable(self, data_state: Any) -> int:
        """Of the records the master knows (``data_state.records_total``), those it hands out now:
        whole shards while the stream is open, all of them once it is closed."""
        total = int(data_state.records_total)
        closed = self._sent is not None and self._sent[1]  # as the master was told
        return total if closed else total - total % self._shard_records

    def idle(self, data_state: Any) -> bool:
        """The stream is open and every record that can be leased has been trained: waiting for data."""
        return (not self.stream.closed and data_state is not None
                and data_state.records_trained >= self.leasable(data_state))
