"""Is each PS answering?  The launcher's probe of its PS tasks, for the ones that die without exiting.

A killed PS process is seen at once (its exit, then connections refused).  A hung one (SIGSTOP, a
stuck kernel, a machine swapping to a halt) or one cut off from the network stays a live process
with an open port: the kernel still completes TCP handshakes into its listen backlog, and every
call to it just waits.  Trainers would find out only when a step's session call times out
(``--session-timeout``), and then wait again for the PS to come back.

`PsProbe` asks each PS's TensorFlow worker service for its status (``GetStatus``, the call a
master makes to list a task's devices; it touches no variable) every `interval` seconds, each
call with a deadline, all concurrently, and remembers when each PS last answered.  The supervisor
(`tf_ecrec.launcher.exits.ExitWatch`) kills a PS that answered since it started and then stayed
silent for ``--ps-hang-secs`` seconds; the kill is then handled as any PS failure (a spare takes
its role, or it is restarted, and the job rebuilds it from parity).  So the detection bound is
``--ps-hang-secs`` after its last answer, plus at most one `interval`.

A PS that is only slow to answer is not hung: on a shared machine a PS busy with a rebuild's slices
beside other jobs went 4 s without answering the probe and was killed, which cost a second move and
rebuild for nothing.  So the silence is weighed against the process's own evidence, its CPU time
(`is_hung`): a PS that spent at least `BUSY_SHARE` of a core since it went silent for half of
``--ps-hang-secs`` (read then and at the bound: a PS that answers is never read, its hundred thread
files read twenty times a second took a third of a core of the launcher's) is working, and is given
up to `BUSY_GRACE` times ``--ps-hang-secs`` before it is killed all the same.  A stopped
process spends nothing; one cut off by a partition, or stuck on a lock, next to nothing (its
heartbeat threads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tf_ecrec.cluster.ps_session import GET_STATUS

BUSY_SHARE = 0.2
"""Share of one core a silent PS must have run or waited to run (`tf_ecrec.launcher.cpu_usage.busy_seconds`)
since its last answer to count as busy, not hung."""
BUSY_GRACE = 5.0
"""A busy PS silent for this many times ``--ps-hang-secs`` is killed all the same (nothing waits for ever)."""


def is_hung(silent_secs: float, busy_share: float | None, hang_secs: float) -> bool:
    """Whether a PS silent for `silent_secs` that spent `busy_share` of a core meanwhile (None: not known)
    is hung, under ``--ps-hang-secs`` `hang_secs` (see the module doc)."""
    if silent_secs <= hang_secs:
        return False
    if busy_share is not None and busy_share >= BUSY_SHARE:
        return silent_secs > BUSY_GRACE * hang_secs
    return True


class PsProbe:
    """Probes the PS addresses it is given (`watch`) from a daemon thread; `last_answer` reads the result.

    Args:
      interval: seconds between two probes of one PS.
      timeout: the deadline of one probe.
      clock: wall seconds (the supervisor's ``time.time``).
    """

    def __init__(self, interval: float = 0.5, timeout: float = 2.0, clock: Callable[[], float] = time.time) -> None:
        self._interval = interval
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._targets: dict[str, str] = {}
        self._answers: dict[str, tuple[str, float]] = {}  # name -> (address, when it last answered)
        self._pending: set[str] = set()
        self._channels: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tf-ecrec-ps-probe", daemon=True)
        self._thread.start()

    def watch(self, targets: Mapping[str, str]) -> None:
        """The PS to probe now, by task name -> address (a PS not listed is not probed)."""
        with self._lock:
            self._targets = dict(targets)

    def last_answer(self, name: str, address: str) -> float | None:
        """When the PS `name` last answered at `address` (None: never there)."""
        with self._lock:
            answer = self._answers.get(name)
        return answer[1] if answer is not None and answer[0] == address else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._timeout + 2.0)
        for channel in self._channels.values():
            channel.close()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                targets = [(n, a) for n, a in self._targets.items() if n not in self._pending]
                self._pending.update(n for n, _ in targets)
            for name, address in targets:
                self._probe(name, address)

    def _probe(self, name: str, address: str) -> None:
        import grpc

        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.insecure_channel(address)
        call = channel.unary_unary(GET_STATUS, request_serializer=lambda x: x, response_deserializer=lambda x: x)
        future = call.future(b"", timeout=self._timeout)

        def done(f: Any) -> None:
            answered = f.exception() is None
            with self._lock:
                self._pending.discard(name)
                if answered:
                    self._answers[name] = (address, self._clock())

        future.add_done_callback(done)
