"""What one PS task holds, read straight from it: ``python ps_digest.py MANIFEST PS_ADDRESSES TASK``.

``python ps_digest.py --serve`` imports TensorFlow once, prints ``ready``, then answers each line
``MANIFEST PS_ADDRESSES TASK`` of its stdin with one JSON line (``{"error": ...}`` when the read
failed): a test that reads a PS while its job trains gets the answer in a session call, not after
a new process's TensorFlow import that the training it watches slows down.

Reads every variable of the manifest that lives on ``/job:ps/task:TASK``
from the PS at that index of the comma-separated ``PS_ADDRESSES`` (a direct
session, as ``tf-ecrec verify`` opens: nothing of the job's own is used) and
prints a JSON object: ``sha256`` (name to the SHA-256 of the value's bytes)
and ``scalars`` (name to the value of every scalar variable, such as a copy
of the global step).  Run on a test host to look at a PS the job has left.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys

from tf_ecrec.check.live_cluster import PsReader, read_manifest
from tf_ecrec.errors import ConfigError


def digest(manifest_path: str, ps: list[str], task: int) -> dict[str, dict[str, object]]:
    on_task = re.compile(rf"/job:ps/task:{task}(/|$)")
    records = [r for r in read_manifest(manifest_path)["variables"] if on_task.search(r["device"])]
    if not records:
        raise ConfigError(f"no variable of {manifest_path} lives on ps:{task}; source: the manifest")
    with PsReader(records, ps, timeout_secs=30.0) as reader:
        values = reader.read([(r["name"], None) for r in records])
    return {
        "sha256": {r["name"]: hashlib.sha256(v.tobytes()).hexdigest() for r, v in zip(records, values)},
        "scalars": {r["name"]: v.item() for r, v in zip(records, values) if v.ndim == 0},
    }


def serve() -> None:
    import tensorflow  # noqa: F401  (imported before "ready": the answers then cost only their reads)

    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        manifest, addresses, index = line.split()
        try:
            answer = digest(manifest, addresses.split(","), int(index))
        except Exception as e:  # the test reads the error
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        manifest, addresses, index = sys.argv[1:]
        print(json.dumps(digest(manifest, addresses.split(","), int(index))))
