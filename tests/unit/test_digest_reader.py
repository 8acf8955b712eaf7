"""The launcher's end-of-job reader, started ahead of time (tf_ecrec.launcher.digest_reader).

Real reader processes. Its successful read of a live cluster is what every launched e2e job's report
digest and parity come from (tests/e2e); here: what it does when the read cannot happen.
"""

from __future__ import annotations

import os
import resource
import time

import pytest

from tf_ecrec.errors import LaunchError
from tf_ecrec.launcher.digest_reader import DigestReader


def test_a_failed_read_names_the_addresses_and_carries_the_readers_own_error(tmp_path):
    missing = tmp_path / "no_manifest.json"
    reader = DigestReader(str(missing), str(tmp_path / "digest.log"), timeout=120)
    reader.start()
    with pytest.raises(LaunchError) as err:
        reader.read(["127.0.0.1:1", "127.0.0.1:2"])
    message = str(err.value)
    assert "['127.0.0.1:1', '127.0.0.1:2']" in message and "exit code 1" in message
    assert "cannot read variable manifest" in message and str(missing) in message  # the reader's ConfigError


def test_a_reader_left_waiting_is_stopped_by_close(tmp_path):
    reader = DigestReader(str(tmp_path / "m.json"), str(tmp_path / "digest.log"))
    reader.close()  # never started: nothing to stop
    assert not reader.started
    reader.start()
    proc = reader._proc
    time.sleep(0.5)
    assert proc is not None and proc.poll() is None  # loading TensorFlow, then waiting for addresses
    reader.close()
    assert proc.poll() is not None


def test_a_read_works_with_descriptors_above_what_select_takes(tmp_path):
    # A launcher (or a long test worker) with many files open: the reader's pipe gets a descriptor above
    # 1023, which select() refuses ("filedescriptor out of range"); the read waits with poll().
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2048)), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        reader = DigestReader(str(tmp_path / "missing.json"), str(tmp_path / "digest.log"), timeout=120)
        reader.start()
        assert reader._stdout is not None and reader._stdout > 1024
        with pytest.raises(LaunchError, match="cannot read variable manifest"):
            reader.read(["127.0.0.1:1"])
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
