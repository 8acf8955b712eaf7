"""Reading a live cluster's variables from outside the training graph.

The chief writes a *manifest* of the model's variables (name, dtype, shape,
device) when it builds its graph.  From the manifest alone, any process can
read the variables' current values straight from the PS tasks: it opens a
session on a PS's server (only PS devices visible) and reads each variable
through a handle with the variable's shared name on its device.  No model
code, no checkpoint, no participation in training is needed, which is what
the launcher's final digest, ``tf-ecrec verify`` and recovery build on.

The digest (`variables_digest`) is a SHA-256 over every model variable in
name order: name, dtype, shape and raw bytes.  Two runs that end with the
same bytes in every variable (slots and global step included) have the same
digest.  Parity and replica variables are redundancy, not model state: the
digest leaves them out, and `tf_ecrec.verify` checks them instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tf_ecrec.errors import ConfigError, RecoveryError
from tf_ecrec.failover import own_server, propagated_config

_LOG = logging.getLogger(__name__)


def variable_records(variables: Iterable[Any]) -> list[dict[str, Any]]:
    """Manifest entries of graph variables (resource variables only)."""
    out = []
    for v in variables:
        out.append(
            {
                "name": v.op.name,
                "dtype": v.dtype.base_dtype.name,
                "shape": [int(d) for d in v.shape],
                "device": v.device,
            }
        )
    return sorted(out, key=lambda r: r["name"])


def write_manifest(path: str, records: Sequence[Mapping[str, Any]], **extra: Any) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump({"variables": list(records), **extra}, fh, indent=1)
    os.replace(path + ".tmp", path)


def read_manifest(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read variable manifest {path!r} ({exc}); source: {path}") from exc
    if "variables" not in manifest:
        raise ConfigError(f"variable manifest {path!r} has no 'variables' list; source: {path}")
    return manifest


READ_BYTES = 256 << 20  # bytes per read of `read_variables`


def read_variables(
    records: Sequence[Mapping[str, Any]],
    ps_addresses: Sequence[str],
    timeout_secs: float = 60.0,
) -> dict[str, np.ndarray]:
    """Current values of the manifest's variables, read from the PS tasks.

    Raises:
      RecoveryError: a PS cannot be reached or a variable is missing or
        uninitialised on it, before `timeout_secs`.
    """
    import tensorflow as tf

    graph = tf.Graph()
    # Each variable is read in row slices of at most READ_BYTES: a response over gRPC's 2 GB message
    # limit cannot be serialized, and tables of a few GB hold variables that large.
    parts: dict[str, list[Any]] = {}
    part_bytes: dict[Any, int] = {}
    where: dict[Any, tuple[str, int | None, list[int], Any]] = {}  # read -> (variable, first row or None: whole, shape, dtype)
    with graph.as_default():
        for r in records:
            if not r["device"].startswith("/job:ps"):
                raise ConfigError(f"variable {r['name']} lives on {r['device']!r}, not on a PS; source: manifest")
            with tf.device(r["device"]):
                dtype = tf.as_dtype(r["dtype"])
                handle = tf.raw_ops.VarHandleOp(dtype=dtype, shape=r["shape"], shared_name=r["name"], container="")
                value = tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)
                shape = [int(d) for d in r["shape"]]
                row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.size if shape else dtype.size
                if not shape or shape[0] * row_bytes <= READ_BYTES:
                    parts[r["name"]] = [value]
                    part_bytes[value] = max(1, shape[0] if shape else 1) * row_bytes
                    where[value] = (r["name"], None, shape, dtype.as_numpy_dtype)
                    continue
                step = max(1, READ_BYTES // max(1, row_bytes))
                parts[r["name"]] = [value[lo : min(lo + step, shape[0])] for lo in range(0, shape[0], step)]
                for i, part in enumerate(parts[r["name"]]):
                    part_bytes[part] = step * row_bytes
                    where[part] = (r["name"], i * step, shape, dtype.as_numpy_dtype)
    # The reader's own server, and the PS addresses carried by the session (ClusterSpec
    # propagation, state shared with the trainers): the PS tasks' own cluster specs may name a
    # PS at an address it has left (--restart-at new-port).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    server = own_server(address)
    config = propagated_config({"ps": list(ps_addresses), "reader": [address]}, timeout_secs)
    target = server.target
    # Slices go straight into each variable's array as they arrive: no second copy of the model.
    out: dict[str, np.ndarray] = {}
    batches: list[list[Any]] = [[]]
    size = 0
    for fetch in (f for fs in parts.values() for f in fs):
        if batches[-1] and size + part_bytes[fetch] > READ_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(fetch)
        size += part_bytes[fetch]
    try:
        with tf.compat.v1.Session(target, graph=graph, config=config) as sess:
            for batch in batches:
                for fetch, value in zip(batch, sess.run(batch)):
                    name, lo, shape, dtype = where[fetch]
                    if lo is None:  # the whole variable in one read
                        out[name] = value
                        continue
                    if name not in out:
                        out[name] = np.empty(shape, dtype)
                    out[name][lo : lo + value.shape[0]] = value
    except tf.errors.OpError as exc:
        raise RecoveryError(
            f"cannot read {len(records)} variables from PS {list(ps_addresses)} ({exc.message.splitlines()[0]}); "
            "is every PS up and initialised?"
        ) from exc
    return {name: out[name] for name in parts}


def variables_digest(values: Mapping[str, np.ndarray]) -> str:
    """SHA-256 hex digest of variables in canonical (name) order."""
    h = hashlib.sha256()
    for name in sorted(values):
        v = np.ascontiguousarray(values[name])
        h.update(name.encode())
        h.update(b"\0" + str(v.dtype).encode() + b"\0" + repr(tuple(v.shape)).encode() + b"\0")
        h.update(v.tobytes())
    return h.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tf_ecrec.inspect MANIFEST PS_ADDR[,PS_ADDR...]``: print the digest as JSON."""
    import argparse

    parser = argparse.ArgumentParser(description="Digest the variables of a live PS cluster.")
    parser.add_argument("manifest")
    parser.add_argument("ps", help="comma-separated PS addresses")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    manifest = read_manifest(args.manifest)
    values = read_variables(manifest["variables"], args.ps.split(","), args.timeout)
    out: dict[str, Any] = {}
    model = values
    if "ec" in manifest:
        from tf_ecrec.verify import check_parity, redundancy_names

        out["parity"] = check_parity(manifest["ec"], values)
        redundant = redundancy_names(manifest["ec"])
        model = {k: v for k, v in values.items() if k not in redundant}
    out.update(
        {
            "variables_sha256": variables_digest(model),
            "variables": len(model),
            "bytes": int(sum(v.nbytes for v in model.values())),
        }
    )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
