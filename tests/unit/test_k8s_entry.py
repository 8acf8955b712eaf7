"""The pod entry of deploy/ (`tf_ecrec.launcher.k8s`): what each pod runs, with what TF_CONFIG."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tf_ecrec.cluster.tf_config import TF_ENVIRONMENT
from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher import k8s
from tf_ecrec.launcher.job.spec import ENV_SPARE_ADDRESS, JobSpec
from tf_ecrec.session.cluster_source import ENV_CLUSTER_FILE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = JobSpec(ps=3, workers=3, fault_tolerance="ecrec")
STATEFULSET = {k8s.ENV_JOB: "dlrm"}
PS = ["dlrm-ps-0.dlrm:2222", "dlrm-ps-1.dlrm:2222", "dlrm-ps-2.dlrm:2222"]


def _tf_config(launch: k8s.TaskLaunch) -> dict:
    return json.loads(launch.env["TF_CONFIG"])


def test_a_statefulset_pod_derives_its_tf_config_from_its_name():
    launch = k8s.plan_launch({**STATEFULSET, k8s.ENV_POD_NAME: "dlrm-worker-1", k8s.ENV_PARK: "1"}, JOB)
    assert _tf_config(launch) == {
        "cluster": {"chief": ["dlrm-chief-0.dlrm:2222"], "worker": ["dlrm-worker-0.dlrm:2222", "dlrm-worker-1.dlrm:2222"],
                    "ps": PS},
        "task": {"type": "worker", "index": 1},
    }
    assert launch.task == "worker:1" and launch.park
    ps = k8s.plan_launch({**STATEFULSET, k8s.ENV_POD_NAME: "dlrm-ps-2", k8s.ENV_PARK: "1"}, JOB)
    assert _tf_config(ps)["task"] == {"type": "ps", "index": 2} and not ps.park  # a PS never parks


def test_service_port_and_host_name_are_read_when_given():
    env = {**STATEFULSET, k8s.ENV_SERVICE: "tasks", k8s.ENV_PORT: "3000", "HOSTNAME": "dlrm-chief-0"}
    config = _tf_config(k8s.plan_launch(env, JobSpec(ps=2, workers=1, fault_tolerance="ecrec", ec="1+1")))
    assert config["cluster"] == {"chief": ["dlrm-chief-0.tasks:3000"], "ps": ["dlrm-ps-0.tasks:3000", "dlrm-ps-1.tasks:3000"]}


def test_an_operators_tf_config_goes_on_unchanged():
    injected = json.dumps({"cluster": {"chief": ["dlrm-chief-0.ns.svc:2222"], "ps": ["dlrm-ps-0.ns.svc:2222",
                                       "dlrm-ps-1.ns.svc:2222", "dlrm-ps-2.ns.svc:2222"]},
                           "task": {"type": "chief", "index": 0}, "environment": "cloud"})
    launch = k8s.plan_launch({"TF_CONFIG": injected}, JOB)
    assert launch.env == {"TF_CONFIG": injected} and launch.task == "chief:0" and not launch.park


def test_the_address_map_puts_the_pods_on_local_ports():
    mapping = {a: f"127.0.0.1:{4000 + i}" for i, a in enumerate(PS)} | {"dlrm-chief-0.dlrm:2222": "127.0.0.1:5000"}
    env = {**STATEFULSET, k8s.ENV_POD_NAME: "dlrm-chief-0", k8s.ENV_ADDRESS_MAP: json.dumps(mapping)}
    config = _tf_config(k8s.plan_launch(env, JobSpec(ps=3, workers=1, fault_tolerance="ecrec")))
    assert config["cluster"] == {"chief": ["127.0.0.1:5000"], "ps": ["127.0.0.1:4000", "127.0.0.1:4001", "127.0.0.1:4002"]}


def test_a_spare_stands_by_at_its_own_address(tmp_path):
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"ps": [PS[0], "", PS[2]]}))
    env = {**STATEFULSET, k8s.ENV_SERVICE: "dlrm-spare", k8s.ENV_POD_NAME: "dlrm-spare-0", ENV_CLUSTER_FILE: str(cluster)}
    launch = k8s.plan_launch(env, JOB)
    assert launch.env[ENV_SPARE_ADDRESS] == "dlrm-spare-0.dlrm-spare:2222"
    assert _tf_config(launch)["cluster"]["ps"] == [PS[0], "0.0.0.0:65534", PS[2]]  # ps:1 down: a placeholder
    with pytest.raises(ConfigError, match=ENV_CLUSTER_FILE):
        k8s.plan_launch({**env, ENV_CLUSTER_FILE: ""}, JOB)


def test_a_ps_whose_role_went_to_a_spare_comes_back_as_a_spare_and_trainers_follow_the_file(tmp_path):
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"ps": [PS[0], "dlrm-spare-0.dlrm-spare:2222", PS[2]]}))
    env = {**STATEFULSET, ENV_CLUSTER_FILE: str(cluster)}
    replaced = k8s.plan_launch({**env, k8s.ENV_POD_NAME: "dlrm-ps-1"}, JOB)
    assert replaced.env[ENV_SPARE_ADDRESS] == PS[1] and replaced.task.startswith("spare")
    kept = k8s.plan_launch({**env, k8s.ENV_POD_NAME: "dlrm-ps-2"}, JOB)
    assert ENV_SPARE_ADDRESS not in kept.env and kept.task == "ps:2"
    chief = k8s.plan_launch({**env, k8s.ENV_POD_NAME: "dlrm-chief-0"}, JOB)
    assert _tf_config(chief)["cluster"]["ps"] == [PS[0], "dlrm-spare-0.dlrm-spare:2222", PS[2]]


@pytest.mark.parametrize("env, needle", [
    ({}, "neither TF_CONFIG nor TF_ECREC_K8S_JOB"),
    ({**STATEFULSET, k8s.ENV_POD_NAME: "dlrm-evaluator-0"}, "pod name 'dlrm-evaluator-0' is not <job>-<role>-<ordinal>"),
    ({**STATEFULSET, k8s.ENV_POD_NAME: "other-ps-0"}, "source: environment variable TF_ECREC_POD_NAME"),
    ({**STATEFULSET, k8s.ENV_POD_NAME: "dlrm-worker-5"}, "task index 5 is out of range"),
    ({**STATEFULSET, k8s.ENV_POD_NAME: "dlrm-ps-0", k8s.ENV_PORT: "http"}, "TF_ECREC_K8S_PORT='http'"),
    ({**STATEFULSET, k8s.ENV_POD_NAME: "dlrm-ps-0", k8s.ENV_ADDRESS_MAP: "[1]"}, "rule: a JSON object"),
])
def test_bad_pods_are_refused_naming_the_value_and_the_source(env, needle):
    with pytest.raises(ConfigError) as err:
        k8s.plan_launch(env, JOB)
    assert needle in str(err.value)


def test_exit_codes_are_a_shells():
    assert k8s.exit_code(0) == 0 and k8s.exit_code(3) == 3
    assert k8s.exit_code(-signal.SIGKILL) == 137 and k8s.exit_code(-signal.SIGTERM) == 143


def test_a_bad_pod_exits_3_before_any_task_starts(tmp_path):
    job_json = tmp_path / "job.json"
    job_json.write_text(json.dumps(JOB.to_json()))
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update({**STATEFULSET, k8s.ENV_POD_NAME: "dlrm-nothing-0", "PYTHONPATH": REPO})
    out = subprocess.run([sys.executable, "-m", "tf_ecrec.launcher.k8s", str(job_json)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 3 and "ConfigError: pod name 'dlrm-nothing-0'" in out.stderr, out.stderr[-2000:]


FAKE_TASK = '''
import signal, sys, time
mode = open(sys.argv[1] + ".mode").read()
if mode == "done":
    sys.exit(0)
if mode == "killed":
    import os
    os.kill(os.getpid(), signal.SIGKILL)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # "leave": finish the step, report, exit 0
import os
print("training with TF_ENABLE_ONEDNN_OPTS=" + os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset"), flush=True)
time.sleep(60)
'''


def _entry(tmp_path, mode: str, park: bool) -> subprocess.Popen:
    """The entry, as a pod runs it, with a stand-in task (a module that exits as `mode` says)."""
    (tmp_path / "fake_task.py").write_text(FAKE_TASK)
    job_json = tmp_path / "job.json"
    job_json.write_text(json.dumps(JOB.to_json()))
    (tmp_path / "job.json.mode").write_text(mode)
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", *TF_ENVIRONMENT)}  # as a pod's
    env.update({**STATEFULSET, k8s.ENV_POD_NAME: "dlrm-chief-0", k8s.ENV_PARK: "1" if park else "0",
                "PYTHONPATH": os.pathsep.join([REPO, str(tmp_path)])})
    code = ("import logging; logging.basicConfig(level=logging.INFO); from tf_ecrec.launcher import k8s; "
            f"raise SystemExit(k8s.run({str(job_json)!r}, module='fake_task'))")
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _wait_for(proc: subprocess.Popen, text: str) -> str:
    seen = ""
    while text not in seen:  # bounded by the test's timeout
        line = proc.stdout.readline()
        assert line, f"the entry exited ({proc.wait()}) before {text!r}:\n{seen}"
        seen += line
    return seen


@pytest.mark.timeout(60)
def test_a_finished_statefulset_trainer_parks_until_sigterm_then_exits_0(tmp_path):
    proc = _entry(tmp_path, "done", park=True)
    _wait_for(proc, "parked until SIGTERM")
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


@pytest.mark.timeout(60)
def test_a_trainer_that_leaves_on_sigterm_exits_as_terminated_not_as_done(tmp_path):
    proc = _entry(tmp_path, "train", park=True)
    # The pod's environment does not name it: the task gets the product's TensorFlow settings.
    _wait_for(proc, "training with TF_ENABLE_ONEDNN_OPTS=0")
    proc.send_signal(signal.SIGTERM)  # the task exits 0 (it left the job); the pod was terminated
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM


@pytest.mark.timeout(60)
def test_a_task_killed_by_a_signal_exits_128_plus_the_signal(tmp_path):
    proc = _entry(tmp_path, "killed", park=True)
    assert proc.wait(timeout=30) == 128 + signal.SIGKILL
