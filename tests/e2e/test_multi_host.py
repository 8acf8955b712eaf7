"""PS tasks and trainers on separate hosts (network namespaces): a PS cut off, replaced on another host.

The job is a protected script in the public style (``tests/adoption/fm_protected.py``,
``tf_ecrec.train_and_evaluate``), one process per task with its TF_CONFIG, as
a TF_CONFIG launcher starts it: ps:0 on host a, ps:1 on host b, the chief and
a worker on host c; every task listens at its host's address.  The trainers
follow a cluster file (``TF_ECREC_CLUSTER_FILE``, TF_CONFIG's cluster dict),
which the test writes as an operator would: a lost PS listed with an empty
address, then its replacement's address once it listens.  ``probe`` is a host
of its own for the checks (``tf-ecrec verify``, direct reads of a PS).

What the job does when a PS host is cut off (the zombie case): the PS process
lives on but nothing reaches it, so the trainers' steps on it time out
(``session_timeout_secs``) and they wait for the cluster file to name every
PS; the operator replaces the PS on another host, the chief rebuilds it from
parity (as for a dead PS) and training goes on.  When the cut host comes
back, its PS still runs with the state it had at the cut; the job's sessions
name only the replacement, so the zombie is never read or written again, and
the job's parity is exact against the replacement.

One job for all of it: a PS killed and started again on another host (a process that dies rather
than goes silent) is the same move as far as the job is concerned, and the launcher's e2e tests
kill PS processes on one host; launched jobs are most of the test command's CPU.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest
from harness import zygote
from harness.h2_capture import frames_from, methods, read_segments
from harness.netns import HostCluster, Network, hosts, unavailable

from tf_ecrec.session.cluster_source import ENV_CLUSTER_FILE, write_cluster_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tests", "adoption", "fm_protected.py")
DIGEST = os.path.join(REPO, "tests", "harness", "ps_digest.py")
PORT = 2222
TRAINERS = ("chief:0", "worker:0")
HELD_CALLS = frozenset(f"/tensorflow.WorkerService/{m}" for m in (
    "DeleteWorkerSession", "DeregisterGraph", "CleanupGraph", "CleanupAll", "RecvTensor"))
"""Calls a cut-off PS may get once back that do not use it (see the zombie test)."""


@pytest.fixture
def net():
    reason = unavailable()
    if reason is not None:
        pytest.fail(f"network namespaces unavailable: {reason} (tests/setup_machine.sh installs iproute2; run as root)")
    with hosts(["a", "b", "c", "d", "probe"]) as network:
        yield network


def _job(tmp_path, net: Network) -> tuple[HostCluster, str, str, str]:
    """The job (not started), its model dir, cluster file and stop file."""
    model_dir, cluster_file, stop = str(tmp_path / "model"), str(tmp_path / "cluster.json"), str(tmp_path / "stop")
    command = [sys.executable, SCRIPT, "--model_dir", model_dir, "--max_steps", "1000000",
               "--session_timeout_secs", "10", "--stop_file", stop]
    placement = {"ps:0": net["a"], "ps:1": net["b"], "chief:0": net["c"], "worker:0": net["c"]}
    job = HostCluster(command, placement, str(tmp_path / "logs"), env={ENV_CLUSTER_FILE: cluster_file}, port=PORT)
    write_cluster_file(cluster_file, job.cluster)
    return job, model_dir, cluster_file, stop


def _replace_ps1(job: HostCluster, net: Network, cluster_file: str) -> str:
    """What an operator does for a lost ps:1: list it as not alive, start it on host d, publish its address."""
    write_cluster_file(cluster_file, {**job.cluster, "ps": [job.address("ps:0"), ""]})
    address = job.move("ps:1", net["d"])
    job.start("ps:1")
    proc = job.tasks["ps:1"]
    net["d"].wait_listening(int(address.rsplit(":", 1)[1]), timeout=120, alive=lambda: proc.poll() is None)
    write_cluster_file(cluster_file, job.cluster)
    return address


def _recoveries(model_dir: str) -> list[dict]:
    path = os.path.join(model_dir, "recovery.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _wait_for_rebuild(job: HostCluster, model_dir: str, timeout: float) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = [e for e in _recoveries(model_dir) if e["lost_ps"] == [1]]
        if found:
            return found[0]
        for task in TRAINERS:
            assert job.tasks[task].poll() is None, f"{task} exited:\n{job.log(task)[-4000:]}"
        time.sleep(0.5)
    raise AssertionError(f"no recovery of ps:1 in {timeout} s: {_recoveries(model_dir)}\n{job.log('chief:0')[-4000:]}")


def _finish(job: HostCluster, stop: str) -> None:
    with open(stop, "w", encoding="utf-8"):
        pass
    codes = job.wait(list(TRAINERS), timeout=240)
    failed = [t for t in TRAINERS if codes.get(t) != 0]
    # The last traceback of each failed trainer, whole: its first lines name the call, the last the error.
    assert not failed, "\n\n".join(f"{t} exited with {codes.get(t)}:\n" + _last_traceback(job.log(t)) for t in failed)


def _last_traceback(log: str) -> str:
    at = log.rfind("Traceback (most recent call last)")
    return log[at:][:6000] if at >= 0 else log[-6000:]


def _on(host, argv: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return zygote.run(host.python(argv), env=env, timeout=timeout)


def _verify(net: Network, job: HostCluster, model_dir: str) -> dict:
    """``tf-ecrec verify`` from the probe host against the PS addresses the job uses now."""
    ps = ",".join(job.cluster["ps"])
    done = _on(net["probe"], [sys.executable, "-m", "tf_ecrec.cli", "verify", "--model-dir", model_dir, "--ps", ps],
               job.env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0 and result["stripes_checked"] > 0, result
    return result


class _Digester:
    """``harness.ps_digest --serve`` on a host: what a PS holds, read in a session call (TensorFlow imported once)."""

    def __init__(self, host, env: dict[str, str]) -> None:
        ask, self._ask = os.pipe()
        self._answers, answer = os.pipe()
        try:
            self._proc = zygote.popen(host.python([sys.executable, DIGEST, "--serve"]), env=env, stdin=ask,
                                      stdout=answer, stderr=subprocess.DEVNULL, name="digest")
        finally:
            os.close(ask)
            os.close(answer)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with os.fdopen(self._answers, encoding="utf-8") as answers:
            for line in answers:
                self._lines.put(line)
        self._lines.put("")  # the process ended

    def _next(self, timeout: float) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the digest process gave no answer in {timeout} s") from None
        assert line, f"the digest process ended (exit {self._proc.poll()})"
        return line

    def wait_ready(self, timeout: float = 180) -> None:
        assert self._next(timeout).strip() == "ready"

    def read(self, manifest: str, ps: list[str], task: int, timeout: float = 120) -> dict:
        os.write(self._ask, f"{manifest} {','.join(ps)} {task}\n".encode())
        answer = json.loads(self._next(timeout))
        assert "error" not in answer, answer
        return answer

    def close(self) -> None:
        os.close(self._ask)
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=30)


def test_a_partitioned_ps_is_replaced_and_the_zombie_is_never_used_again(tmp_path, net):
    job, model_dir, cluster_file, stop = _job(tmp_path, net)
    manifest = os.path.join(model_dir, "variables.json")
    zombie = None
    digester = _Digester(net["probe"], job.env)  # its TensorFlow import overlaps the job's start
    try:
        job.start_all()
        cut_at = job.wait_for_step(100, timeout=240)
        digester.wait_ready()
        zombie, zombie_address = job.tasks["ps:1"], job.address("ps:1")
        net["b"].link_down()  # ps:1 runs on, unreachable
        cut = time.time()
        address = _replace_ps1(job, net, cluster_file)  # the PS comes back on host d, at d's address
        assert address.startswith(net["d"].address + ":")
        rebuilt = _wait_for_rebuild(job, model_dir, timeout=180)
        assert rebuilt["method"] == "parity" and rebuilt["steps_rolled_back"] == 0, _recoveries(model_dir)
        # What settlement undid (returned steps not yet durable: their records are trained again) is bounded.
        assert rebuilt["global_step"] + rebuilt["steps_undone"] >= cut_at, rebuilt
        job.wait_for_step(rebuilt["global_step"] + 60, timeout=240)
        cut_for = time.time() - cut

        # What the job's hosts had written to the zombie while it was cut off (requests in flight at the cut,
        # the failed session's teardown): TCP delivers it once the link is back, whenever its backed-off
        # retransmission timer fires (up to two minutes later). Written before it came back, so not a use.
        zombie_host = zombie_address.rsplit(":", 1)[0]
        queued = {c: n for h in ("a", "c") for c, n in net[h].tcp_written(zombie_host, PORT).items()}
        with net["b"].capture(PORT, str(tmp_path / "zombie_segments.jsonl")) as captured:
            net["b"].link_up()  # the zombie is reachable again, still alive, its old cluster in its TF_CONFIG
            assert zombie.poll() is None, "the cut-off PS died; the test needs it alive"
            old_ps = [job.address("ps:0"), zombie_address]
            seen = digester.read(manifest, old_ps, 1)
            at_reconnect = job.last_step()
            job.wait_for_step(at_reconnect + 100, timeout=240)  # training goes on with the zombie reachable
            _finish(job, stop)
            final = job.last_step()
            later = {p: n for p, n in net["b"].tcp_peers(PORT).items() if not p.startswith(net["probe"].address + ":")}

        # Nothing the job did once the zombie was back used it: no new connection from a job host (one being
        # opened at the cut is listed, with nothing written), and on each, past what was written before (the
        # sender's own count, taken while the link was down), no call that reads or writes it, read frame by
        # frame from what reached its host (`harness.h2_capture`). Past that count come the frames the zombie's
        # own delivered responses provoke (WINDOW_UPDATE, PING), and calls gRPC held while the link was down:
        # the old session's teardown, and a PS's RecvTensor of a step of that old session, which only a
        # RunGraph on the zombie could serve. A step, or a session, on the zombie needs a RunGraph,
        # RegisterGraph or CreateWorkerSession: none. And not a change in any of its variables; its copy of the
        # global step is from before the cut.
        assert all(p in queued for p in later), (queued, later)
        segments = read_segments(captured)
        after = {p: frames_from(segments, p, *queued[p]) for p, n in later.items() if n > queued[p][1]}
        used = {p: m for p, f in after.items() if (m := [m for m in methods(f) if m not in HELD_CALLS])}
        assert not used, used
        assert digester.read(manifest, old_ps, 1) == seen
        steps = {name: value for name, value in seen["scalars"].items() if "global_step" in name}
        assert steps, seen["scalars"]
        # The zombie's copies stopped at the kill: at most the recovered step plus what settlement undid (returned
        # steps not durable yet) plus a step in flight per trainer.
        bound = rebuilt["global_step"] + rebuilt["steps_undone"] + len(TRAINERS)
        assert all(value <= bound for value in steps.values()), (steps, rebuilt)
        assert final >= rebuilt["global_step"] + 160
        print(f"cut off for {cut_for:.1f} s; zombie's global step copies {steps}, job's final step {final}; "
              f"calls the zombie got from the job once back: {({p: methods(fs) for p, fs in after.items()})}")

        _verify(net, job, model_dir)  # exact against the replacement on host d
        assert "Restoring parameters from" not in job.log("chief:0")
    finally:
        digester.close()
        job.stop()
        if zombie is not None and zombie.poll() is None:
            zombie.kill()
            zombie.wait(timeout=30)
