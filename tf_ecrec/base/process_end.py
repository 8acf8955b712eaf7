"""Ending a process whose work is done, without the interpreter's teardown.

With TensorFlow loaded, a normal exit spends about a second tearing down gRPC channels, thread
pools and servers; a task process the launcher waits on looks alive meanwhile, and a process whose
training thread cannot be stopped would never get there.  `end_process` flushes what a normal exit
would (TensorFlow's cached event-file writers, the logging handlers, stdout and stderr), removes the
files autograph wrote for the functions it converted (it deletes them at exit, which ``os._exit``
skips: every trainer left some in the temp directory, thousands a day on a busy host), and then
leaves with ``os._exit``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn


def end_process(code: int) -> NoReturn:
    """Flushes event files, logs and the standard streams, then ends this process with `code`."""
    if "tensorflow" in sys.modules:
        with contextlib.suppress(Exception):  # event files written through the cache: flushed and closed
            sys.modules["tensorflow"].compat.v1.summary.FileWriterCache.clear()
    _remove_autograph_files()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


AUTOGRAPH_PREFIX = "__autograph_generated_file"
"""The name autograph gives the module (and the temp file) of each function it converts."""


def _remove_autograph_files() -> None:
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) if name.startswith(AUTOGRAPH_PREFIX) else None
        if path and os.path.basename(path).startswith(AUTOGRAPH_PREFIX):
            with contextlib.suppress(OSError):
                os.remove(path)
