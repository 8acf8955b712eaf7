"""The launcher's PS probe against a real TensorFlow server process: answers while it runs, silence while it
is stopped (SIGSTOP keeps its port open: connections hang rather than fail), answers again once continued."""

import os
import signal
import subprocess
import sys
import time

from harness.ports import free_port

from tf_ecrec.launcher.cpu_usage import busy_seconds, cpu_seconds
from tf_ecrec.launcher.ps_probe import BUSY_SHARE, PsProbe, is_hung

SERVER = ("import sys, time, tensorflow as tf; "
          "s = tf.distribute.Server(tf.train.ClusterSpec({'ps': [sys.argv[1]]}), job_name='ps', task_index=0); "
          "print('up', flush=True); time.sleep(600)")


def _wait_for(predicate, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout} s")


def test_the_probe_sees_a_real_server_answer_fall_silent_when_stopped_and_answer_again():
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-c", SERVER, address], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    probe = PsProbe(interval=0.1, timeout=0.5)
    try:
        assert proc.stdout.readline().strip() == "up"
        probe.watch({"ps:0": address})
        _wait_for(lambda: probe.last_answer("ps:0", address) is not None, "a first answer")
        assert probe.last_answer("ps:0", "127.0.0.1:1") is None  # answers are per address
        proc.send_signal(signal.SIGSTOP)
        stopped = time.time()
        time.sleep(1.0)  # two probe deadlines: an answer in flight at the stop has landed
        settled = probe.last_answer("ps:0", address)
        busy_before, at = busy_seconds(proc.pid), time.time()
        time.sleep(1.5)
        assert probe.last_answer("ps:0", address) == settled, "an answer from a stopped server"
        # The launcher weighs the silence against the time the process ran or waited to run (tf_ecrec.launcher.exits):
        # a stopped server does neither, so it is hung once silent longer than the bound.
        share = (busy_seconds(proc.pid) - busy_before) / (time.time() - at)
        assert share < BUSY_SHARE and is_hung(time.time() - settled, share, 1.0), share
        proc.send_signal(signal.SIGCONT)
        _wait_for(lambda: (probe.last_answer("ps:0", address) or 0) > stopped + 1.0, "an answer after SIGCONT")
    finally:
        probe.close()
        proc.kill()
        proc.wait(timeout=30)


def test_a_silent_process_busy_on_a_core_is_not_hung_until_its_grace_ends():
    """The other side of the rule on a real process: one that computes (a PS decoding a rebuild's slices beside
    other jobs) counts as busy by the time it ran or waited to run (`busy_seconds`), the evidence `is_hung` weighs,
    even starved: here it shares one core with nine busy loops, so its CPU time alone is about a tenth of a core,
    under BUSY_SHARE (a loaded run of the whole suite once gave a busy process 0.17 of a core)."""
    spin = "import time\nt = time.time()\nwhile time.time() - t < 30: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(10)]
    try:
        core = min(os.sched_getaffinity(0))
        for p in procs:
            os.sched_setaffinity(p.pid, {core})
        proc = procs[0]
        time.sleep(0.5)
        busy_before, cpu_before, at = busy_seconds(proc.pid), cpu_seconds(proc.pid), time.time()
        time.sleep(1.5)
        took = time.time() - at
        share, cpu_share = (busy_seconds(proc.pid) - busy_before) / took, (cpu_seconds(proc.pid) - cpu_before) / took
        assert cpu_share < BUSY_SHARE <= share, (cpu_share, share)  # starved, and busy all the same
        assert not is_hung(4.5, share, 4.0) and is_hung(20.5, share, 4.0)
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)
