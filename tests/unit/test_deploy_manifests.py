"""The Kubernetes manifests of ``deploy/``: every kustomization renders, every object is valid, the invariants hold.

Rendered offline with ``kubectl kustomize``; core objects are checked
against Kubernetes' own OpenAPI schemas (``kubernetes-validate``, bundled,
strict: unknown fields fail), the TFJob against the TFJob schema of
``tests/data/tfjob_v1.schema.json`` and each of its pod templates against
Kubernetes' PodTemplateSpec.  The invariants are the ones docs/kubernetes.md
explains: restart policies per role, PS memory request = limit, the job
master and how tasks reach it, commands that run modules of this package,
a job spec that fits the replicas.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
from harness.k8s_manifests import DEPLOY, OVERLAYS, REPO, Pod, find, job_spec, kubectl, pods, render, tfjob_tf_config

from tf_ecrec.launcher import k8s
from tf_ecrec.launcher.job.spec import JobSpec

K8S_VERSION = "1.34.0"  # the newest schema kubernetes-validate==1.34.1 bundles
KUSTOMIZATIONS = [f"overlays/{o}" for o in OVERLAYS] + ["base", "verify"]
TASK_ROLES = ("ps", "chief", "worker", "spare")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {k: render(k) for k in KUSTOMIZATIONS}


def _tfjob_schema() -> dict:
    with open(os.path.join(REPO, "tests", "data", "tfjob_v1.schema.json"), encoding="utf-8") as fh:
        return json.load(fh)


def _task_pods(objects: list[dict]) -> list[Pod]:
    return [p for p in pods(objects) if p.role in TASK_ROLES]


def _memory_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    number, unit = re.fullmatch(r"(\d+)([A-Za-z]*)", quantity).groups()
    return int(number) * units.get(unit, 1)


def test_kubectl_has_a_kustomize_with_components():
    out = subprocess.run([kubectl(), "version", "--client"], capture_output=True, text=True, timeout=60)
    found = re.search(r"Kustomize Version: v(\d+)\.(\d+)", out.stdout)
    assert found and (int(found.group(1)), int(found.group(2))) >= (3, 7), (
        f"deploy/ needs kustomize >= 3.7 (components) in kubectl:\n{out.stdout}{out.stderr}")


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_object_is_valid_against_its_schema(rendered, kustomization):
    objects = rendered[kustomization]
    assert objects
    for obj in objects:
        if obj["kind"] == "TFJob":
            jsonschema.Draft202012Validator(_tfjob_schema()).validate(obj)
            for rtype, rs in obj["spec"]["tfReplicaSpecs"].items():
                template = {"apiVersion": "v1", "kind": "PodTemplate",
                            "metadata": {"name": f"{obj['metadata']['name']}-{rtype.lower()}"}, "template": rs["template"]}
                kubernetes_validate.validate(template, K8S_VERSION, strict=True)
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_validators_refuse_what_kubernetes_and_the_operator_would():
    tfjob = find(render("overlays/tfjob"), "TFJob")[0]
    bad = json.loads(json.dumps(tfjob))
    bad["spec"]["tfReplicaSpecs"]["PS"]["restartPolicy"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(_tfjob_schema()).validate(bad)
    bad = json.loads(json.dumps(tfjob))
    bad["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    with pytest.raises(jsonschema.ValidationError):  # the operator injects TF_CONFIG into "tensorflow" only
        jsonschema.Draft202012Validator(_tfjob_schema()).validate(bad)
    bad = json.loads(json.dumps(tfjob))
    bad["spec"]["tfReplicaSpecs"]["Chief"]["replicas"] = 2
    with pytest.raises(jsonschema.ValidationError):  # one chief
        jsonschema.Draft202012Validator(_tfjob_schema()).validate(bad)
    statefulset = find(render("overlays/statefulset"), "StatefulSet", "dlrm-ps")[0]
    statefulset["spec"]["template"]["spec"]["containers"][0]["memmory"] = "4Gi"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_restart_policies_are_the_documented_ones(rendered, overlay):
    objects = rendered[f"overlays/{overlay}"]
    task_pods = _task_pods(objects)
    assert {p.role for p in task_pods} >= {"ps", "chief", "worker"}
    for pod in task_pods:
        if pod.owner_kind == "TFJob":
            assert pod.restart_policy == {"ps": "Always", "chief": "OnFailure", "worker": "OnFailure"}[pod.role], pod.name
        else:  # a StatefulSet restarts every exit: a finished trainer parks, a PS never does
            assert pod.owner_kind == "StatefulSet" and pod.restart_policy == "Always", pod.name
            parks = pod.env_value(k8s.ENV_PARK) == "1"
            assert parks == (pod.role in ("chief", "worker")), pod.name
    for statefulset in find(objects, "StatefulSet"):
        assert statefulset["spec"]["podManagementPolicy"] == "Parallel"
        assert statefulset["spec"]["updateStrategy"]["type"] == "OnDelete"
    (master,) = find(objects, "Deployment", "dlrm-master")
    assert master["spec"]["replicas"] == 1 and master["spec"]["strategy"]["type"] == "Recreate"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ps_memory_request_equals_limit(rendered, overlay):
    ps = [p for p in _task_pods(rendered[f"overlays/{overlay}"]) if p.role in ("ps", "spare")]
    assert len(ps) >= 3
    for pod in ps:
        resources = pod.container["resources"]
        assert _memory_bytes(resources["requests"]["memory"]) == _memory_bytes(resources["limits"]["memory"]), pod.name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_task_reaches_the_job_master_with_its_token(rendered, overlay):
    objects = rendered[f"overlays/{overlay}"]
    (master,) = find(objects, "Deployment", "dlrm-master")
    (service,) = find(objects, "Service", "dlrm-master")
    container = master["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][-2:] == ["tf_ecrec.cli", "master"]
    args = dict(a.lstrip("-").split("=", 1) for a in container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert int(args["port"]) == ports[service["spec"]["ports"][0]["targetPort"]]
    assert service["spec"]["selector"].items() <= master["spec"]["template"]["metadata"]["labels"].items()
    # The master's --token-file is the key of the Secret that every task's TF_ECREC_MASTER_TOKEN reads.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in master["spec"]["template"]["spec"]["volumes"]}
    token_volume = next(n for n, path in mounts.items() if args["token-file"].startswith(path + "/"))
    secret_name = volumes[token_volume]["secret"]["secretName"]
    key = args["token-file"][len(mounts[token_volume]) + 1:]
    (secret,) = find(objects, "Secret", secret_name)
    token = base64.b64decode(secret["data"][key]).decode()
    assert token and token == token.strip() and "\n" not in token  # gRPC metadata: no whitespace around it
    state = volumes[next(n for n, path in mounts.items() if path == args["state-dir"])]
    assert find(objects, "PersistentVolumeClaim", state["persistentVolumeClaim"]["claimName"])
    address = f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    for pod in _task_pods(objects):
        assert pod.env_value("TF_ECREC_MASTER_ADDRESS") == address, pod.name
        (ref,) = [v["valueFrom"]["secretKeyRef"] for v in pod.container["env"] if v["name"] == "TF_ECREC_MASTER_TOKEN"]
        assert (ref["name"], ref["key"]) == (secret_name, key), pod.name


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_container_runs_a_module_of_this_package(rendered, kustomization):
    commands = set()
    for pod in pods(rendered[kustomization]):
        argv = pod.container["command"] + pod.container.get("args", [])
        assert argv[:2] == ["python", "-m"], (pod.name, argv)
        module = argv[2]
        assert module.startswith("tf_ecrec.") and importlib.util.find_spec(module) is not None, (pod.name, module)
        origin = importlib.util.find_spec(module).origin
        assert origin and origin.startswith(os.path.join(REPO, "tf_ecrec")), origin
        sub = argv[3] if module == "tf_ecrec.cli" else None
        commands.add((module, sub))
    for module, sub in sorted(commands, key=str):
        if sub is not None:  # the subcommand exists and its flags parse
            out = subprocess.run([sys.executable, "-m", module, sub, "--help"], capture_output=True, text=True,
                                 timeout=120, env={**os.environ, "PYTHONPATH": REPO})
            assert out.returncode == 0 and "usage:" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_job_spec_fits_the_replicas_and_the_volumes(rendered, overlay):
    objects = rendered[f"overlays/{overlay}"]
    spec = JobSpec.from_json(job_spec(objects))  # the project's own validation of every field
    assert spec.fault_tolerance.value == "ecrec" and spec.uses_master
    task_pods = _task_pods(objects)
    roles = [p.role for p in task_pods]
    assert roles.count("ps") == spec.ps and roles.count("chief") == 1
    assert roles.count("chief") + roles.count("worker") == spec.workers
    for pod in task_pods:
        mounts = {m["mountPath"]: m["name"] for m in pod.container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod.spec["volumes"]}
        job_json = pod.container["command"][-1]
        config_map = volumes[mounts[os.path.dirname(job_json)]]["configMap"]["name"]
        assert os.path.basename(job_json) in find(objects, "ConfigMap", config_map)[0]["data"], pod.name
        if pod.role == "chief":  # the model dir outlives the chief: recovery.jsonl, variables.json
            claim = volumes[mounts[spec.model_dir]]["persistentVolumeClaim"]["claimName"]
            assert find(objects, "PersistentVolumeClaim", claim)
        elif pod.role == "worker":
            assert "emptyDir" in volumes[mounts[spec.model_dir]], pod.name


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_referenced_config_map_secret_and_claim_exists(rendered, kustomization):
    objects = rendered[kustomization]
    if kustomization == "verify":  # applied beside a job: its claim comes from the base
        objects = objects + rendered["base"]
    for pod in pods(objects):
        for volume in pod.spec.get("volumes", []):
            for kind, field, key in (("ConfigMap", "configMap", "name"), ("Secret", "secret", "secretName"),
                                     ("PersistentVolumeClaim", "persistentVolumeClaim", "claimName")):
                if field in volume:
                    assert find(objects, kind, volume[field][key]), (pod.name, volume)
        for var in pod.container.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                (secret,) = find(objects, "Secret", ref["name"])
                assert ref["key"] in secret["data"], (pod.name, ref)


@pytest.mark.parametrize("overlay", ["statefulset", "statefulset-spare"])
def test_statefulset_pods_derive_the_addresses_their_headless_service_gives_them(rendered, overlay):
    objects = rendered[f"overlays/{overlay}"]
    spec = JobSpec.from_json(job_spec(objects))
    for statefulset in find(objects, "StatefulSet"):
        (service,) = find(objects, "Service", statefulset["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
        labels = statefulset["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        pod = next(p for p in pods([statefulset]))
        job = pod.env_value(k8s.ENV_JOB)
        identity = k8s.parse_pod_name(pod.name, job)
        assert identity.role == pod.role, pod.name
        assert (pod.env_value(k8s.ENV_SERVICE) or job) == service["metadata"]["name"]
        assert int(pod.container["ports"][0]["containerPort"]) == k8s.DEFAULT_PORT == service["spec"]["ports"][0]["port"]
        fields = [v["valueFrom"]["fieldRef"]["fieldPath"] for v in pod.container["env"] if v["name"] == k8s.ENV_POD_NAME]
        assert fields == ["metadata.name"]
    cluster = k8s.statefulset_cluster("dlrm", "dlrm", k8s.DEFAULT_PORT, spec.ps, spec.workers)
    names = {p.name for p in pods(objects)}
    assert {a.split(".")[0] for addresses in cluster.values() for a in addresses} <= names


@pytest.mark.parametrize("overlay", ["tfjob-spare", "statefulset-spare"])
def test_the_cluster_file_of_a_spare_lists_the_ps_addresses_the_tasks_have(rendered, overlay):
    objects = rendered[f"overlays/{overlay}"]
    (config_map,) = find(objects, "ConfigMap", "dlrm-cluster")
    listed = json.loads(config_map["data"]["cluster.json"])["ps"]
    spec = JobSpec.from_json(job_spec(objects))
    if overlay.startswith("tfjob"):
        (tfjob,) = find(objects, "TFJob")
        assert listed == tfjob_tf_config(tfjob, "ps", 0)["cluster"]["ps"]
    else:
        assert listed == k8s.statefulset_cluster("dlrm", "dlrm", k8s.DEFAULT_PORT, spec.ps, spec.workers)["ps"]
    for pod in _task_pods(objects):
        assert pod.env_value("TF_ECREC_CLUSTER_FILE") == "/etc/tf-ecrec/cluster/cluster.json", pod.name
    (spare,) = [p for p in pods(objects) if p.role == "spare"]
    assert k8s.parse_pod_name(spare.name, spare.env_value(k8s.ENV_JOB)).role == "spare"


def test_the_dockerfile_builds_the_ops_against_the_tensorflow_it_installed_first():
    with open(os.path.join(DEPLOY, "Dockerfile"), encoding="utf-8") as fh:
        lines = [line.strip() for line in fh if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    text = "\n".join(lines)
    tensorflow = text.index('"tensorflow==2.15.1"')  # the distribution setup.py requires: no second one
    install = text.index("pip install --no-build-isolation .")
    assert tensorflow < text.index("COPY . .") < install
    assert "load_library()" in text[install:]  # the image refuses to build with ops it cannot load
    with open(os.path.join(DEPLOY, "Dockerfile.dockerignore"), encoding="utf-8") as fh:
        ignored = fh.read().split()
    assert "**/*.so" in ignored  # a library built on the host is never copied in
