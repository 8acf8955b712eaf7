"""The pods of rendered manifests run as local processes, the way a kubelet would run them.

For each pod (`harness.k8s_manifests.Pod`) this does what the kubelet does
with its first container, on this machine:

- volumes become directories under ``root``: a ConfigMap's or Secret's keys
  are written as files, an emptyDir is the pod's own directory, a
  PersistentVolumeClaim is one directory per claim, shared by the pods that
  mount it;
- the image's paths (the mount paths) are replaced by those directories in
  the command, the arguments, the environment and the ConfigMap files;
- ``env`` is resolved: values, ``secretKeyRef``, ``fieldRef`` of
  ``metadata.name`` / ``metadata.namespace``;
- ``replace`` maps strings of the cluster to local ones in the arguments and
  the environment (``dlrm-master:50051`` -> ``127.0.0.1:PORT``);
- ``python`` is this interpreter; the package is the one under test
  (``PYTHONPATH``).  A pod's Python process is forked from the test process's
  fork server (`harness.zygote`), and the pod's entry forks its task from
  itself (`tf_ecrec.launcher.forked_process.start_child`): no pod imports
  TensorFlow of its own.

Extra environment per pod (the TF_CONFIG a TFJob operator injects, the
address map of `tf_ecrec.launcher.k8s`) is passed to `start`.  Output goes to
``<root>/logs/<pod>.log``.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from harness import zygote
from harness.k8s_manifests import REPO, Pod, find, pods


class LocalPods:
    """Runs the pods of `objects` as processes; ``procs`` maps a pod's name to its current process."""

    def __init__(self, objects: list[dict[str, Any]], root: str, replace: Mapping[str, str] | None = None) -> None:
        self.objects = objects
        self.root = root
        self.replace = dict(replace or {})
        self.pods = {p.name: p for p in pods(objects)}
        self.procs: dict[str, Any] = {}  # subprocess.Popen, or a process forked by `harness.zygote`
        os.makedirs(os.path.join(root, "logs"), exist_ok=True)
        self.base_env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("TF_ECREC_")}
        self.base_env.update({"PYTHONPATH": REPO, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})

    # ---- the kubelet's part ---------------------------------------------------------------

    def _data(self, kind: str, name: str) -> dict[str, str]:
        (obj,) = find(self.objects, kind, name)
        if kind == "Secret":
            return {k: base64.b64decode(v).decode() for k, v in obj.get("data", {}).items()}
        return dict(obj.get("data", {}))

    def volume_dir(self, pod: Pod, mount_path: str) -> str:
        """The local directory of the volume `pod` mounts at `mount_path`."""
        (mount,) = [m for m in pod.container.get("volumeMounts", []) if m["mountPath"] == mount_path]
        (volume,) = [v for v in pod.spec.get("volumes", []) if v["name"] == mount["name"]]
        if "persistentVolumeClaim" in volume:
            return os.path.join(self.root, "pvc", volume["persistentVolumeClaim"]["claimName"])
        return os.path.join(self.root, "pods", pod.name, mount["name"])

    def _paths(self, pod: Pod) -> list[tuple[str, str]]:
        mounts = [m["mountPath"] for m in pod.container.get("volumeMounts", [])]
        return sorted(((m, self.volume_dir(pod, m)) for m in mounts), key=lambda kv: -len(kv[0]))

    def _local(self, text: str, paths: Sequence[tuple[str, str]]) -> str:
        for image_path, local in paths:
            text = text.replace(image_path, local)
        for cluster, local in self.replace.items():
            text = text.replace(cluster, local)
        return text

    def _mount(self, pod: Pod, paths: Sequence[tuple[str, str]]) -> None:
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        for mount in pod.container.get("volumeMounts", []):
            directory = self.volume_dir(pod, mount["mountPath"])
            os.makedirs(directory, exist_ok=True)
            volume = volumes[mount["name"]]
            files: dict[str, str] = {}
            if "configMap" in volume:
                files = {k: self._local(v, paths) for k, v in self._data("ConfigMap", volume["configMap"]["name"]).items()}
            elif "secret" in volume:
                files = self._data("Secret", volume["secret"]["secretName"])
            for key, content in files.items():
                with open(os.path.join(directory, key), "w", encoding="utf-8") as fh:
                    fh.write(content)

    def command(self, name: str) -> tuple[list[str], dict[str, str]]:
        """The argv and environment of pod `name`, its volumes made."""
        pod = self.pods[name]
        paths = self._paths(pod)
        self._mount(pod, paths)
        argv = [self._local(a, paths) for a in pod.container.get("command", []) + pod.container.get("args", [])]
        if argv[0] == "python":
            argv[0] = sys.executable
        env = dict(self.base_env)
        for var in pod.container.get("env", []):
            if "value" in var:
                env[var["name"]] = self._local(var["value"], paths)
                continue
            ref = var["valueFrom"]
            if "secretKeyRef" in ref:
                env[var["name"]] = self._data("Secret", ref["secretKeyRef"]["name"])[ref["secretKeyRef"]["key"]]
            elif "configMapKeyRef" in ref:
                env[var["name"]] = self._data("ConfigMap", ref["configMapKeyRef"]["name"])[ref["configMapKeyRef"]["key"]]
            else:
                field = ref["fieldRef"]["fieldPath"]
                env[var["name"]] = {"metadata.name": name, "metadata.namespace": "default"}[field]
        return argv, env

    # ---- processes ---------------------------------------------------------------------------

    def log_path(self, name: str) -> str:
        return os.path.join(self.root, "logs", f"{name}.log")

    def log(self, name: str) -> str:
        try:
            with open(self.log_path(name), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except FileNotFoundError:
            return ""

    def start(self, name: str, extra_env: Mapping[str, str] | None = None) -> None:
        argv, env = self.command(name)
        env.update(extra_env or {})
        with open(self.log_path(name), "ab") as out:
            self.procs[name] = zygote.popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, name=name)

    def signal(self, name: str, signum: int) -> None:
        self.procs[name].send_signal(signum)

    def kill(self, name: str) -> int:
        """SIGKILL, as a container is killed; returns the exit status (its task dies with it: PDEATHSIG)."""
        self.signal(name, signal.SIGKILL)
        return self.procs[name].wait(timeout=30)

    def wait_for_log(self, name: str, text: str, timeout: float) -> None:
        deadline = time.time() + timeout
        while text not in self.log(name):
            proc = self.procs[name]
            if proc.poll() is not None and text not in self.log(name):
                raise AssertionError(f"{name} exited with {proc.returncode} before logging {text!r}:\n"
                                     f"{self.log(name)[-4000:]}")
            if time.time() > deadline:
                raise AssertionError(f"{name} did not log {text!r} in {timeout} s:\n{self.log(name)[-4000:]}")
            time.sleep(0.3)

    def wait(self, names: Sequence[str], timeout: float) -> dict[str, int]:
        deadline = time.time() + timeout
        codes = {}
        for name in names:
            try:
                codes[name] = self.procs[name].wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{name} still running after {timeout} s:\n{self.log(name)[-4000:]}") from None
        return codes

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
