"""What a launched job keeps in its model dir, by name: one owner for every path the launcher, its tasks and the CLI share.

::

    <model_dir>/job.json         the JobSpec every task reads (`job_file`)
    <model_dir>/cluster.json     the cluster trainers follow (`cluster_file`; tf_ecrec.session.cluster_source)
    <model_dir>/variables.json   the chief's variable manifest (`MANIFEST_FILE`; tf-ecrec verify, the digest)
    <model_dir>/logs/<task>.log  one log per task process, and master.log (`log_file`)
    <model_dir>/master/          the job master's state dir (`master_state_dir`)
    <model_dir>/master.token     the job master's token (`master_token_file`)
    <model_dir>/report.json      the run's report, unless --report names another path (`report_file`)
"""

from __future__ import annotations

import os

MANIFEST_FILE = "variables.json"
"""The chief's variable manifest, relative to the model dir."""


def job_file(model_dir: str) -> str:
    return os.path.join(model_dir, "job.json")


def cluster_file(model_dir: str) -> str:
    return os.path.join(model_dir, "cluster.json")


def manifest_file(model_dir: str) -> str:
    return os.path.join(model_dir, MANIFEST_FILE)


def digest_file(model_dir: str) -> str:
    """The digest a ``--strategy pss`` chief writes at the end (its variables are readable only by it)."""
    return os.path.join(model_dir, "digest.json")


def logs_dir(model_dir: str) -> str:
    return os.path.join(model_dir, "logs")


def log_file(model_dir: str, name: str) -> str:
    """The log of task `name` ("ps:0" -> logs/ps-0.log; "master" -> logs/master.log)."""
    return os.path.join(logs_dir(model_dir), name.replace(":", "-") + ".log")


def master_state_dir(model_dir: str) -> str:
    return os.path.join(model_dir, "master")


def master_token_file(model_dir: str) -> str:
    return os.path.join(model_dir, "master.token")


def report_file(model_dir: str, report: str | None = None) -> str:
    """`report` (--report) if given, else ``<model_dir>/report.json``."""
    return report or os.path.join(model_dir, "report.json")
