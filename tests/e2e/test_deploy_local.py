"""The manifests of deploy/ run as local processes: a PS SIGKILLed mid-training is rebuilt from parity.

Each overlay is rendered (``kubectl kustomize``) and every pod's container is
run as a process, as a kubelet would run it (`harness.k8s_local.LocalPods`):
its command, arguments and environment from the manifests, its ConfigMap,
Secret, emptyDir and PVC volumes as directories, the image's paths replaced
by them.  The cluster's names map to loopback ports:

- TFJob: the test plays the training operator and injects TF_CONFIG with
  every replica at ``dlrm-<type>-<i>.default.svc:2222`` mapped to
  ``127.0.0.1:<free port>``;
- StatefulSet: each pod derives its TF_CONFIG from its name
  (`tf_ecrec.launcher.k8s`); ``TF_ECREC_K8S_ADDRESS_MAP`` maps the derived
  ``dlrm-<role>-<i>.dlrm:2222`` to loopback ports;
- both: ``dlrm-master:50051`` (the Service of the job master) to the local
  master's port.

The job spec (ConfigMap dlrm-job) is shrunk to a job this machine trains in
a minute or two.  Then: the job master and every task start, ``dlrm-ps-1``
is SIGKILLed once a third of the data is trained and started again with the
same command (a pod restarted behind its stable name), the trainers finish
with exit 0, the chief's ``recovery.jsonl`` says parity with 0 steps rolled
back, and the verify Job of ``deploy/verify`` exits 0 on the live PS.
"""

from __future__ import annotations

import json
import os
import signal
import time

from harness import zygote
from harness.k8s_local import LocalPods
from harness.k8s_manifests import Pod, find, job_spec, pods, render, tfjob_tf_config
from harness.process_cluster import free_port

from tf_ecrec.errors import EcRecError
from tf_ecrec.launcher.k8s import ENV_ADDRESS_MAP
from tf_ecrec.master.client import MasterClient

MASTER_POD = "dlrm-master-local"
TRAINERS = ["dlrm-chief-0", "dlrm-worker-0"]
SMALL = {"steps": 600, "batch_size": 128, "table_rows": 2000, "tables": 4, "embedding_dim": 8, "shard_batches": 2}


def _shrink(objects: list[dict]) -> dict:
    (config_map,) = find(objects, "ConfigMap", "dlrm-job")
    spec = {**json.loads(config_map["data"]["job.json"]), **SMALL}
    config_map["data"]["job.json"] = json.dumps(spec)
    return spec


def _task_pods(objects: list[dict]) -> list[Pod]:
    return [p for p in pods(objects) if p.role in ("ps", "chief", "worker")]


def _start_master(local: LocalPods, address: str, token: str) -> MasterClient:
    local.start(MASTER_POD)
    local.wait_for_log(MASTER_POD, f"tf-ecrec master listening on {address}", timeout=120)
    return MasterClient(address, None, token=token, timeout=5.0)


def _wait_for_progress(master: MasterClient, local: LocalPods, fraction: float, timeout: float = 600) -> int:
    """Waits until `fraction` of the dataset is trained; returns the records trained."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            stats = master.data_state("train")
        except EcRecError:  # not registered yet
            stats = None
        if stats is not None and stats.records_trained >= fraction * stats.records_total:
            assert not stats.finished, "the data was trained before the kill: make the job longer"
            return stats.records_trained
        for name in TRAINERS:
            if local.procs[name].poll() is not None:
                raise AssertionError(f"{name} exited with {local.procs[name].returncode}:\n{local.log(name)[-4000:]}")
        time.sleep(0.5)
    raise AssertionError(f"{fraction:.0%} of the data not trained in {timeout} s:\n{local.log('dlrm-chief-0')[-4000:]}")


def _kill_and_restart_ps(local: LocalPods, name: str, env: dict[str, str]) -> None:
    code = local.kill(name)
    assert code == -signal.SIGKILL, code
    local.start(name, env)  # the pod restarted behind its stable name: the same address


def _check_recovery_and_parity(local: LocalPods, objects: list[dict], root: str) -> None:
    spec = job_spec(objects)
    model_dir = local.volume_dir(local.pods["dlrm-chief-0"], "/var/lib/tf-ecrec/model")
    assert spec["model_dir"] == "/var/lib/tf-ecrec/model"
    with open(os.path.join(model_dir, "recovery.jsonl"), encoding="utf-8") as fh:
        entries = [json.loads(line) for line in fh if line.strip()]
    rebuilt = [e for e in entries if e["lost_ps"] == [1]]
    assert rebuilt and rebuilt[0]["method"] == "parity", entries
    assert rebuilt[0]["steps_rolled_back"] == 0 and rebuilt[0]["step_before"] > 0, entries
    # Only returned steps not yet durable were taken back (their records are trained again), and counted.
    assert rebuilt[0]["global_step"] + rebuilt[0]["steps_undone"] >= rebuilt[0]["step_before"], entries
    assert "checkpoint" not in {e["method"] for e in entries}, entries

    # The verify Job of deploy/verify, on the same claim (dlrm-model), against the live PS.
    checker = LocalPods(render("verify") + objects, root)
    argv, env = checker.command("dlrm-verify-local")
    assert argv[1:4] == ["-m", "tf_ecrec.cli", "verify"] and model_dir in argv, argv
    out = zygote.run(argv, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0 and result["stripes_checked"] > 0, result


def _token(objects: list[dict]) -> str:
    import base64

    (secret,) = find(objects, "Secret", "dlrm-master-token")
    return base64.b64decode(secret["data"]["token"]).decode()


def test_the_tfjob_runs_with_an_operators_tf_config_and_survives_a_killed_ps(tmp_path):
    objects = render("overlays/tfjob")
    _shrink(objects)
    (tfjob,) = find(objects, "TFJob")
    task_pods = _task_pods(objects)
    dns = tfjob_tf_config(tfjob, "ps", 0)["cluster"]
    loopback = {a: f"127.0.0.1:{free_port()}" for addresses in dns.values() for a in addresses}
    master = f"127.0.0.1:{free_port()}"
    local = LocalPods(objects, str(tmp_path), replace={
        "dlrm-master:50051": master, "--port=50051": f"--port={master.rpartition(':')[2]}",
        "--host=0.0.0.0": "--host=127.0.0.1"})

    def operator_env(pod: Pod) -> dict[str, str]:
        config = tfjob_tf_config(tfjob, pod.role, pod.index)
        config["cluster"] = {t: [loopback[a] for a in addresses] for t, addresses in config["cluster"].items()}
        return {"TF_CONFIG": json.dumps(config)}

    try:
        client = _start_master(local, master, _token(objects))
        for pod in task_pods:
            local.start(pod.name, operator_env(pod))
        _wait_for_progress(client, local, 1 / 3)
        _kill_and_restart_ps(local, "dlrm-ps-1", operator_env(local.pods["dlrm-ps-1"]))
        codes = local.wait(TRAINERS, timeout=900)
        assert codes == dict.fromkeys(TRAINERS, 0), {n: local.log(n)[-3000:] for n in TRAINERS}
        assert client.data_state("train").finished
        _check_recovery_and_parity(local, objects, str(tmp_path))
    finally:
        local.stop()


def test_the_statefulsets_derive_their_tf_config_and_survive_a_killed_ps(tmp_path):
    objects = render("overlays/statefulset")
    _shrink(objects)
    task_pods = _task_pods(objects)
    address_map = {f"{p.name}.dlrm:2222": f"127.0.0.1:{free_port()}" for p in task_pods}
    env = {ENV_ADDRESS_MAP: json.dumps(address_map)}
    master = f"127.0.0.1:{free_port()}"
    local = LocalPods(objects, str(tmp_path), replace={
        "dlrm-master:50051": master, "--port=50051": f"--port={master.rpartition(':')[2]}",
        "--host=0.0.0.0": "--host=127.0.0.1"})
    try:
        client = _start_master(local, master, _token(objects))
        for pod in task_pods:
            local.start(pod.name, env)
        _wait_for_progress(client, local, 1 / 3)
        _kill_and_restart_ps(local, "dlrm-ps-1", env)
        for name in TRAINERS:  # a StatefulSet would restart an exited trainer: a finished one parks
            local.wait_for_log(name, "finished with exit 0; parked until SIGTERM", timeout=900)
            assert local.procs[name].poll() is None, name
            local.signal(name, signal.SIGTERM)
        codes = local.wait(TRAINERS, timeout=60)
        assert codes == dict.fromkeys(TRAINERS, 0), {n: local.log(n)[-3000:] for n in TRAINERS}
        assert client.data_state("train").finished
        assert "TF_CONFIG" in local.log("dlrm-ps-1") and address_map["dlrm-ps-1.dlrm:2222"] in local.log("dlrm-ps-1")
        _check_recovery_and_parity(local, objects, str(tmp_path))
    finally:
        local.stop()
