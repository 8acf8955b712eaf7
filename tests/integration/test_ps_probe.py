"""The launcher's PS probe against a real TensorFlow server process: answers while it runs, silence while it
is stopped (SIGSTOP keeps its port open: connections hang rather than fail), answers again once continued."""

import os
import signal
import subprocess
import sys
import time

from harness.ports import free_port

from tf_ecrec.launcher.ps_probe import PsProbe

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
        time.sleep(1.5)
        assert probe.last_answer("ps:0", address) == settled, "an answer from a stopped server"
        proc.send_signal(signal.SIGCONT)
        _wait_for(lambda: (probe.last_answer("ps:0", address) or 0) > stopped + 1.0, "an answer after SIGCONT")
    finally:
        probe.close()
        proc.kill()
        proc.wait(timeout=30)
