"""TensorFlow's ParameterServerStrategy tutorial, protected (``estimator_examples/pss_tutorial.py``), run as a user
runs it: every task a separate process of the same script with its own TF_CONFIG, no launcher.  A PS starts
late, a PS is SIGKILLed mid-training and restarted, then the coordinator is SIGKILLed and started again."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

from harness import zygote
from harness.ports import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "estimator_examples", "pss_tutorial.py")
EPOCHS, STEPS_PER_EPOCH = 6, 20


def test_the_guide_shows_exactly_the_lines_the_script_marks_as_the_adoption():
    with open(SCRIPT, encoding="utf-8") as fh:
        marked = [line.strip() for line in fh if re.search(r"\S  # tf_ecrec(:|$)", line.rstrip())]
    with open(os.path.join(REPO, "docs", "pss.md"), encoding="utf-8") as fh:
        section = fh.read().split("## TensorFlow's tutorial, protected", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "docs/pss.md shows no adoption block for the tutorial"
    assert [line.strip() for line in block.group(1).splitlines() if line.strip()] == marked


class Tasks:
    """The script's tasks, each a process with its TF_CONFIG and its own log file."""

    def __init__(self, tmp_path) -> None:
        self.cluster = {"chief": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}" for _ in range(2)],
                        "ps": [f"127.0.0.1:{free_port()}" for _ in range(3)]}
        self.dir = tmp_path
        self.working_dir = str(tmp_path / "work")
        self.procs: dict[str, object] = {}

    def log(self, task: str) -> str:
        return str(self.dir / f"{task.replace(':', '-')}.log")

    def start(self, job: str, index: int) -> None:
        task = f"{job}:{index}"
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
               "TF_CONFIG": json.dumps({"cluster": self.cluster, "task": {"type": job, "index": index}})}
        argv = [sys.executable, SCRIPT, "--working-dir", self.working_dir, "--epochs", str(EPOCHS),
                "--steps-per-epoch", str(STEPS_PER_EPOCH)]
        with open(self.log(task), "ab") as out:
            self.procs[task] = zygote.popen(argv, env=env, stdout=out, stderr=out, name=task)

    def kill(self, task: str) -> None:
        proc = self.procs[task]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def read(self, task: str) -> str:
        with open(self.log(task), encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def wait_for(self, what: str, ready, timeout: float = 240.0) -> None:
        """Until `ready()`, while the chief runs (its exit is the evidence that nothing more will come)."""
        deadline = time.monotonic() + timeout
        while not ready():
            chief = self.procs["chief:0"]
            assert chief.poll() is None, f"the chief exited ({chief.returncode}) before {what}:\n{self.read('chief:0')[-4000:]}"
            assert time.monotonic() < deadline, f"no {what} in {timeout:.0f} s:\n{self.read('chief:0')[-4000:]}"
            time.sleep(0.1)

    def backup_step(self) -> int:
        """The epoch of the chief's latest backup (BackupAndRestore's checkpoint index), 0 before the first."""
        index = os.path.join(self.working_dir, "backup", "chief", "checkpoint")
        try:
            with open(index, encoding="utf-8") as fh:
                first = fh.readline()
        except FileNotFoundError:
            return 0
        return int(first.rsplit("-", 1)[1].strip().strip('"'))

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)


def test_the_tutorial_script_survives_a_late_ps_a_killed_ps_and_a_killed_coordinator(tmp_path):
    tasks = Tasks(tmp_path)
    try:
        for job, index in (("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("ps", 1)):
            tasks.start(job, index)
        time.sleep(3.0)  # the coordinator waits for the PS that is not serving yet
        assert tasks.procs["chief:0"].poll() is None, tasks.read("chief:0")[-3000:]
        tasks.start("ps", 2)
        tasks.wait_for("first backup", lambda: tasks.backup_step() >= 1)
        tasks.kill("ps:1")
        time.sleep(1.0)
        tasks.start("ps", 1)
        tasks.wait_for("recovery of ps:1", lambda: "recovered PS [1] from parity" in tasks.read("chief:0"))
        after_recovery = tasks.backup_step() + 1
        tasks.wait_for("a backup after the recovery", lambda: tasks.backup_step() >= after_recovery)
        backed_up = tasks.backup_step()
        assert backed_up < EPOCHS, "the job ended before its coordinator could be killed"
        tasks.kill("chief:0")
        tasks.start("chief", 0)
        chief = tasks.procs["chief:0"]
        assert chief.wait(timeout=300) == 0, tasks.read("chief:0")[-5000:]
        log = tasks.read("chief:0")
        result = json.loads(log.strip().splitlines()[-1])
        # The restarted coordinator began from its last backup (after the PS's recovery), not from step 0.
        assert result["restored_step"] == backed_up * STEPS_PER_EPOCH, (result, backed_up)
        assert result["step"] == EPOCHS * STEPS_PER_EPOCH, result
        parity = result["parity"]
        assert parity["stripes_checked"] > 0 and parity["replicas_checked"] > 0, parity
        assert parity["mismatches"] == 0 and parity["replica_mismatches"] == 0, parity
        # ModelCheckpoint wrote the model at the epochs' ends, through both failures.
        assert os.path.exists(os.path.join(tasks.working_dir, "ckpt", "saved_model.pb"))
    finally:
        tasks.close()
