"""``--data stream:DIR``: the launcher tells the job master which records of the stream arrived.

The producer writes whole files into DIR (`tf_ecrec.data.stream`); every `POLL_SECS` the launcher
takes the new ones (`StreamDirectory.refresh`) and extends the master's stream dataset to the
records that exist, and closes it once the producer wrote ``_CLOSED``.  The trainers lease only
records that exist and end when the master says the closed stream is all trained.  Until a trainer
registered the dataset the master does not know it: the feed tries again at the next poll.  While
the stream is open and every record that arrived is trained, the job is waiting for data, not
stalled (`idle`).
"""

from __future__ import annotations

from typing import Any

from tf_ecrec.data.stream import StreamDirectory
from tf_ecrec.errors import EcRecError, NotFoundError

POLL_SECS = 0.5


class StreamFeed:
    """Extends the master's stream dataset as files arrive (see the module docstring)."""

    def __init__(self, stream_dir: str, watch: Any, on_corrupt: str = "skip") -> None:
        self.stream = StreamDirectory(stream_dir, on_corrupt=on_corrupt)
        self._watch = watch
        self._sent: tuple[int, bool] | None = None
        self._last = 0.0

    def drive(self, now: float) -> None:
        if now - self._last < POLL_SECS:
            return
        self._last = now
        current = (self.stream.refresh(), self.stream.closed)
        if current == self._sent:
            return
        try:
            self._watch.extend(*current)
        except NotFoundError:
            return  # not registered yet: no trainer has started its input
        except EcRecError:
            return  # the master is away (a kill): the next poll sends it again
        self._sent = current

    def idle(self, data_state: Any) -> bool:
        """The stream is open and every record that arrived has been trained: waiting for data."""
        return (not self.stream.closed and data_state is not None
                and data_state.records_trained >= data_state.records_total)
