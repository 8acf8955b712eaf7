"""The manifests of ``deploy/``, rendered offline with ``kubectl kustomize``, and the pods they make.

`render` returns the objects of one kustomization; `pods` lists the pods a
cluster would run for them (a TFJob's replicas as the training operator
names them, ``<job>-<type>-<i>``; a StatefulSet's ``<name>-<ordinal>``; one
pod for a Deployment or a Job), each with its pod template.
`tfjob_tf_config` is the TF_CONFIG the operator injects into a TFJob pod.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(REPO, "deploy")
OVERLAYS = ("tfjob", "statefulset", "tfjob-spare", "statefulset-spare")
TFJOB_PORT_NAME = "tfjob-port"


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        raise AssertionError("kubectl is not installed: run tests/setup_machine.sh (Debian package kubernetes-client)")
    return path


def render(kustomization: str) -> list[dict[str, Any]]:
    """The objects of ``deploy/<kustomization>`` (e.g. ``overlays/tfjob``), as ``kubectl kustomize`` renders them."""
    out = subprocess.run([kubectl(), "kustomize", os.path.join(DEPLOY, kustomization)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, f"kubectl kustomize deploy/{kustomization} failed:\n{out.stderr}"
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


@dataclasses.dataclass(frozen=True)
class Pod:
    """A pod the objects make: its name, its owner, its role and index, its template and restart policy."""

    name: str
    owner_kind: str
    owner: str
    role: str
    index: int
    template: dict[str, Any]
    restart_policy: str

    @property
    def spec(self) -> dict[str, Any]:
        return self.template["spec"]

    @property
    def container(self) -> dict[str, Any]:
        return self.spec["containers"][0]

    def env_value(self, name: str) -> str | None:
        for var in self.container.get("env", []):
            if var["name"] == name:
                return var.get("value")
        return None


def pods(objects: list[dict[str, Any]]) -> Iterator[Pod]:
    for obj in objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == "TFJob":
            for rtype, rs in obj["spec"]["tfReplicaSpecs"].items():
                for i in range(rs.get("replicas", 1)):
                    yield Pod(f"{name}-{rtype.lower()}-{i}", kind, name, rtype.lower(), i, rs["template"],
                              rs.get("restartPolicy", "Never"))
        elif kind == "StatefulSet":
            template = obj["spec"]["template"]
            role = template["metadata"]["labels"].get("app.kubernetes.io/component", name)
            for i in range(obj["spec"].get("replicas", 1)):
                yield Pod(f"{name}-{i}", kind, name, role, i, template, template["spec"].get("restartPolicy", "Always"))
        elif kind in ("Deployment", "Job"):
            template = obj["spec"]["template"]
            yield Pod(f"{name}-local", kind, name, name, 0, template,
                      template["spec"].get("restartPolicy", "Always"))


def tfjob_port(pod: Pod) -> int:
    for port in pod.container.get("ports", []):
        if port.get("name") == TFJOB_PORT_NAME:
            return int(port["containerPort"])
    return 2222  # the operator's default


def tfjob_tf_config(tfjob: dict[str, Any], task_type: str, index: int, namespace: str | None = None) -> dict[str, Any]:
    """The TF_CONFIG the training operator injects into replica ``task_type:index`` of `tfjob`.

    The cluster lists every replica but the evaluator at ``<job>-<type>-<i>.<namespace>.svc:<tfjob-port>``.
    """
    name = tfjob["metadata"]["name"]
    namespace = namespace or tfjob["metadata"].get("namespace") or "default"
    cluster: dict[str, list[str]] = {}
    for pod in pods([tfjob]):
        if pod.role != "evaluator":
            cluster.setdefault(pod.role, []).append(f"{pod.name}.{namespace}.svc:{tfjob_port(pod)}")
    assert name and cluster
    return {"cluster": cluster, "task": {"type": task_type, "index": index}, "environment": "cloud"}


def job_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The job spec (job.json of ConfigMap dlrm-job)."""
    (config_map,) = find(objects, "ConfigMap", "dlrm-job")
    return json.loads(config_map["data"]["job.json"])
