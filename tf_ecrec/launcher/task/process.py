"""What a launched task process does for itself while it serves: wait in Python, and the injected OOM.

The launcher's side of both (killing a hung task, reading an OOM kill) is `tf_ecrec.launcher.exits`.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any


def consume_memory_on_signal() -> None:
    """In a PS process: on SIGUSR1, allocate (and touch) memory until the kernel stops the process."""
    hog: list[bytearray] = []

    def grow() -> None:
        while True:
            hog.append(bytearray(16 << 20))  # zero-filled: the pages are touched
            time.sleep(0.005)

    def on_signal(signum: int, frame: Any) -> None:
        threading.Thread(target=grow, name="injected-oom", daemon=True).start()

    signal.signal(signal.SIGUSR1, on_signal)


def wait_forever(*keep: Any) -> None:
    """The main thread of a task whose work runs on other threads (`keep`: what they need alive, a
    server), waiting in Python so that signal handlers run."""
    while keep is not None:
        time.sleep(1.0)
