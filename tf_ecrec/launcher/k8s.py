"""A task's entry in a Kubernetes pod: ``python -m tf_ecrec.launcher.k8s JOB_JSON``.

Every container of the manifests in ``deploy/`` (but the job master's) runs
this.  It works out the task's TF_CONFIG, runs the task entry
(``python -m tf_ecrec.launcher.task.entry JOB_JSON``, `tf_ecrec.launcher.task.entry`)
as its child with that TF_CONFIG in the child's environment, forwards
SIGTERM and SIGINT to it, and exits with its exit code (``128 + N`` when
the child died of signal N, as a shell reports it).  This process never
sets TF_CONFIG in its own environment (`tf_ecrec.cluster.tf_config.tf_config_env` is
its one writer); it builds the child's environment.

Where TF_CONFIG comes from:

- set already (a Kubeflow TFJob: the operator injects it): passed on;
- otherwise (a StatefulSet pod) derived from the pod's name
  ``<job>-<role>-<ordinal>`` (``TF_ECREC_POD_NAME``, the downward API's
  ``metadata.name``; else the host name) and the job spec's counts:
  ``chief: [<job>-chief-0]``, ``worker: [<job>-worker-0 .. -<workers-2>]``,
  ``ps: [<job>-ps-0 .. -<ps-1>]``, each at ``<pod>.<service>:<port>``, the
  stable DNS name a headless Service gives a StatefulSet pod.
  ``<job>`` is ``TF_ECREC_K8S_JOB``, ``<service>`` is
  ``TF_ECREC_K8S_SERVICE`` (default: the job name) and ``<port>`` is
  ``TF_ECREC_K8S_PORT`` (default 2222).

``TF_ECREC_K8S_ADDRESS_MAP`` (a JSON object ``{"dns-name:port":
"host:port"}``) replaces derived addresses, to run the pods as local
processes on loopback ports (the tests do; see docs/kubernetes.md).

A spare PS (``--spare-ps`` of ``tf-ecrec run``, here a pod named
``<job>-spare-<i>``) stands by at its own address until the cluster file
(``TF_ECREC_CLUSTER_FILE``, a mounted ConfigMap) lists it as a PS.  A PS
pod whose address the cluster file no longer lists (its role was given to
a spare while it was down) comes back as a spare itself, instead of
serving a role another task holds.

``TF_ECREC_K8S_PARK=1`` (the StatefulSet trainers: a StatefulSet restarts
every container that exits, even with 0) keeps the container up after the
task exited 0, until SIGTERM.

A task that exits 0 after this process forwarded it a signal (a trainer
asked to stop finishes its step, reports its progress and leaves the job)
exits ``128 + N``: the pod was terminated, not done, and 0 would make it
count as finished (a TFJob succeeds when its chief does).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tf_ecrec.cluster.tf_config import ClusterConfig, with_tf_environment
from tf_ecrec.errors import ConfigError, EcRecError
from tf_ecrec.launcher.forked_process import start_child
from tf_ecrec.launcher.job.spec import ENV_SPARE_ADDRESS, JobSpec
from tf_ecrec.session.cluster_source import ENV_CLUSTER_FILE, FileClusterSource

_LOG = logging.getLogger(__name__)

ENV_POD_NAME = "TF_ECREC_POD_NAME"
ENV_JOB = "TF_ECREC_K8S_JOB"
ENV_SERVICE = "TF_ECREC_K8S_SERVICE"
ENV_PORT = "TF_ECREC_K8S_PORT"
ENV_ADDRESS_MAP = "TF_ECREC_K8S_ADDRESS_MAP"
ENV_PARK = "TF_ECREC_K8S_PARK"
DEFAULT_PORT = 2222
ROLES = ("chief", "worker", "ps", "spare")
TASK_MODULE = "tf_ecrec.launcher.task.entry"


@dataclasses.dataclass(frozen=True)
class PodIdentity:
    """A StatefulSet pod's place: its job, its role (a StatefulSet per role) and its ordinal."""

    job: str
    role: str
    ordinal: int


@dataclasses.dataclass(frozen=True)
class TaskLaunch:
    """What the entry starts: the environment the task gets on top of this process's, and whether to park."""

    env: dict[str, str]
    task: str
    park: bool


def parse_pod_name(pod: str, job: str, source: str = ENV_POD_NAME) -> PodIdentity:
    """``<job>-<role>-<ordinal>`` as a `PodIdentity`.

    Raises:
      ConfigError: the name is not of that form for `job` and a role of `ROLES`.
    """
    found = re.fullmatch(rf"{re.escape(job)}-({'|'.join(ROLES)})-(\d+)", pod)
    if found is None:
        raise ConfigError(f"pod name {pod!r} is not <job>-<role>-<ordinal> with job {job!r} and a role of "
                          f"{list(ROLES)}; source: {source}")
    return PodIdentity(job, found.group(1), int(found.group(2)))


def pod_address(pod: str, service: str, port: int) -> str:
    """The stable DNS name and port a headless Service gives a StatefulSet pod (in the pod's namespace)."""
    return f"{pod}.{service}:{port}"


def statefulset_cluster(job: str, service: str, port: int, num_ps: int, workers: int) -> dict[str, list[str]]:
    """The TF_CONFIG cluster of a job of StatefulSets: one chief, ``workers - 1`` workers, ``num_ps`` PS."""
    if num_ps < 1 or workers < 1:
        raise ConfigError(f"ps={num_ps}, workers={workers}; rule: >= 1 each (the chief counts as a worker); "
                          "source: the job spec")
    counts = {"chief": 1, "worker": workers - 1, "ps": num_ps}
    return {role: [pod_address(f"{job}-{role}-{i}", service, port) for i in range(n)]
            for role, n in counts.items() if n}


def parse_address_map(text: str | None) -> dict[str, str]:
    """``TF_ECREC_K8S_ADDRESS_MAP`` as a dict (empty when unset)."""
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{ENV_ADDRESS_MAP} is not JSON ({exc}); source: environment variable {ENV_ADDRESS_MAP}") from exc
    if not isinstance(parsed, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in parsed.items()):
        raise ConfigError(f"{ENV_ADDRESS_MAP}={text!r}; rule: a JSON object of \"name:port\" -> \"host:port\" strings; "
                          f"source: environment variable {ENV_ADDRESS_MAP}")
    return parsed


def _port(environ: Mapping[str, str]) -> int:
    text = environ.get(ENV_PORT, str(DEFAULT_PORT))
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ConfigError(f"{ENV_PORT}={text!r}; rule: a port in 1..65535; source: environment variable {ENV_PORT}")
    return int(text)


def _pod_name(environ: Mapping[str, str]) -> tuple[str, str]:
    if environ.get(ENV_POD_NAME):
        return environ[ENV_POD_NAME], f"environment variable {ENV_POD_NAME}"
    return environ.get("HOSTNAME") or socket.gethostname(), "the host name"


def _cluster_ps(environ: Mapping[str, str], num_ps: int) -> list[str | None] | None:
    """The PS addresses of the cluster file, or None when the pod has none."""
    path = environ.get(ENV_CLUSTER_FILE)
    return FileClusterSource(path, num_ps).ps_addresses() if path else None


def _spare_config(ps: Sequence[str | None]) -> dict[str, Any]:
    # A spare reads its PS count from TF_CONFIG (tf_ecrec.launcher.task.entry.stand_by); a PS that is down
    # in the file gets a placeholder that is never dialled, as stand_by does.
    return {"cluster": {"ps": [a or f"0.0.0.0:{65535 - i}" for i, a in enumerate(ps)]},
            "task": {"type": "ps", "index": 0}}


def plan_launch(environ: Mapping[str, str], job: JobSpec) -> TaskLaunch:
    """What this pod runs (see the module doc); reads the cluster file when one is mounted.

    Raises:
      ConfigError: no TF_CONFIG and no pod identity to derive it from, a bad
        override, a spare without a cluster file.
    """
    park = environ.get(ENV_PARK, "") not in ("", "0")
    mapping = parse_address_map(environ.get(ENV_ADDRESS_MAP))
    if environ.get("TF_CONFIG"):
        config = ClusterConfig.from_environment(environ)
        tf_config, address = config.to_tf_config(), config.address
        if mapping:
            tf_config["cluster"] = {k: [mapping.get(a, a) for a in v] for k, v in tf_config["cluster"].items()}
            address = mapping.get(address, address)
    else:
        name = environ.get(ENV_JOB)
        if not name:
            raise ConfigError(f"neither TF_CONFIG nor {ENV_JOB} is set; rule: a TFJob injects TF_CONFIG, a StatefulSet "
                              f"pod sets {ENV_JOB} (and {ENV_POD_NAME}) to derive it; source: the pod's environment")
        pod, source = _pod_name(environ)
        me = parse_pod_name(pod, name, source)
        service, port = environ.get(ENV_SERVICE) or name, _port(environ)
        address = mapping.get(pod_address(pod, service, port), pod_address(pod, service, port))
        if me.role == "spare":
            ps = _cluster_ps(environ, job.ps)
            if ps is None:
                raise ConfigError(f"pod {pod} is a spare PS, which learns its role from the cluster file; "
                                  f"{ENV_CLUSTER_FILE} is not set; source: environment variable {ENV_CLUSTER_FILE}")
            return TaskLaunch({"TF_CONFIG": json.dumps(_spare_config(ps)), ENV_SPARE_ADDRESS: address},
                              f"spare:{me.ordinal}", park=False)
        cluster = statefulset_cluster(name, service, port, job.ps, job.workers)
        cluster = {k: [mapping.get(a, a) for a in v] for k, v in cluster.items()}
        tf_config = {"cluster": cluster, "task": {"type": me.role, "index": me.ordinal}}
        config = ClusterConfig.from_tf_config(tf_config, source=f"the StatefulSet pod {pod} and the job spec")
    rewritten = bool(mapping) or not environ.get("TF_CONFIG")
    ps = _cluster_ps(environ, config.num_ps) if config.task_type in ("ps", "chief", "worker") else None
    if ps is not None and config.task_type == "ps" and address not in ps:
        _LOG.warning("%s at %s: the cluster file gives its role to %s; standing by as a spare", config.task,
                     address, ps[config.task_index])
        return TaskLaunch({"TF_CONFIG": json.dumps(_spare_config(ps)), ENV_SPARE_ADDRESS: address},
                          f"spare ({config.task} replaced)", park=False)
    if ps is not None and config.task_type != "ps":
        # A trainer (re)started after a spare took a PS's role starts with the PS where they are now.
        now = [a or old for a, old in zip(ps, tf_config["cluster"]["ps"])]
        rewritten = rewritten or now != list(tf_config["cluster"]["ps"])
        tf_config["cluster"]["ps"] = now
    # The operator's TF_CONFIG goes on unchanged (with its other keys, such as "environment") unless rewritten.
    env = {"TF_CONFIG": json.dumps(tf_config) if rewritten else environ["TF_CONFIG"]}
    return TaskLaunch(env, config.task, park=park and config.task_type != "ps")


def exit_code(returncode: int) -> int:
    """A child's `Popen.returncode` as a container exit code: ``128 + N`` for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def run(job_json: str, environ: Mapping[str, str] | None = None, module: str = TASK_MODULE) -> int:
    """Plans the launch, runs the task (`module`) as a child, forwards signals, parks if asked; returns the exit code."""
    environ = os.environ if environ is None else environ
    launch = plan_launch(environ, JobSpec.load(job_json))
    _LOG.info("starting %s with TF_CONFIG %s", launch.task, launch.env["TF_CONFIG"])
    # The handler only appends: it runs on the main thread between bytecodes, possibly while that thread holds a
    # lock (an Event's condition), so setting an Event from it can deadlock the park (seen in CI under load).
    received: list[int] = []
    proc = start_child(module, [job_json], {**with_tf_environment(environ), **launch.env})

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    code = exit_code(proc.wait())
    if code == 0 and received:
        # A trainer asked to stop finishes its step, reports and leaves with 0; the pod was terminated
        # (deleted, evicted, drained), not done: 0 would count as success (a TFJob whose chief succeeded).
        code = 128 + received[0]
    if code == 0 and launch.park and not received:
        _LOG.info("%s finished with exit 0; parked until SIGTERM (its StatefulSet would restart an exited container)",
                  launch.task)
        while not received:
            time.sleep(0.5)  # interrupted by the signal; the handler has appended before sleep resumes
    else:
        _LOG.info("%s exited with %d", launch.task, code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if len(argv) != 1:
        print("usage: python -m tf_ecrec.launcher.k8s JOB_JSON  (TF_CONFIG, or a StatefulSet pod's identity, in the "
              "environment)", file=sys.stderr)
        return 2
    try:
        return run(argv[0])
    except EcRecError as exc:
        _LOG.error("%s: %s", type(exc).__name__, exc)
        return 3


if __name__ == "__main__":
    raise SystemExit(main())
