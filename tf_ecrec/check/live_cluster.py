"""Inspecting a live cluster from outside the training graph: manifests, reads, digests, parity checks.

The chief writes a *manifest* of the model's variables (name, dtype, shape,
device) when it builds its graph.  From the manifest alone, any process can
read the variables' current values straight from the PS tasks: it opens a
session on a PS's server (only PS devices visible) and reads each variable
through a handle with the variable's shared name on its device.  No model
code, no checkpoint, no participation in training is needed, which is what
the launcher's final digest, ``tf-ecrec verify`` and recovery build on.
Everything reads through a `PsReader` in slices of at most `READ_BYTES`, so
digesting or verifying a model of many GB needs a few hundred MB here.

The digest (`variables_digest`) is a SHA-256 over every model variable in
name order: name, dtype, shape and raw bytes.  Two runs that end with the
same bytes in every variable (slots and global step included) have the same
digest.  Parity and replica variables are redundancy, not model state: the
digest leaves them out, and `tf_ecrec.check.verify` checks them instead.
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

from tf_ecrec.cluster.ps_session import own_server, propagated_config
from tf_ecrec.errors import ConfigError, RecoveryError

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


READ_BYTES = 256 << 20  # bytes per session call of a `PsReader` (and per slice of a variable)

class ArrayReader:
    """The `PsReader` interface over variables already in memory (tests, the fault-schedule harness)."""

    def __init__(self, values: Mapping[str, np.ndarray]) -> None:
        self._values = values

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(np.shape(self._values[name]))

    def dtype(self, name: str) -> np.dtype:
        return np.asarray(self._values[name]).dtype

    def read(self, requests: Sequence[tuple[str, Any]]) -> list[np.ndarray]:
        return [np.asarray(self._values[n]) if rows is None else np.asarray(self._values[n])[rows] for n, rows in requests]


def dial_back_address(ps_addresses: Sequence[str]) -> str:
    """A free address of this machine that the PS tasks at `ps_addresses` can reach, for a reader's server.

    A PS pulls the row indices fed to a gather from the server of the
    session that fed them, so that server must listen where the PS hosts can
    dial: the source address of this machine's route to the first PS
    (127.0.0.1 when the PS tasks run here; the machine's address on their
    network when they run on other hosts).

    Raises:
      ConfigError: no PS address, or one that is not ``host:port``.
      RecoveryError: the first PS's host does not resolve or has no route.
    """
    if not ps_addresses:
        raise ConfigError("no PS addresses to read from; source: the PS addresses")
    host, _, port = ps_addresses[0].rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"PS address {ps_addresses[0]!r}; rule: host:port; source: the PS addresses")
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(sockaddr)  # sends nothing: picks the route and its source address
            local = probe.getsockname()[0]
        with socket.socket(family, socket.SOCK_STREAM) as free:
            free.bind((local, 0))
            chosen = free.getsockname()[1]
    except OSError as exc:
        raise RecoveryError(f"no route to PS {ps_addresses[0]!r} ({exc}); is its host reachable from here?") from exc
    return f"[{local}]:{chosen}" if family == socket.AF_INET6 else f"{local}:{chosen}"


class PsReader:
    """Rows of the manifest's variables, read from the live PS tasks in bounded calls.

    Each variable gets two ops on its own PS: a whole read and a gather of fed
    row indices (`ResourceGather` copies only the rows asked for; a whole
    `ReadVariableOp` on a table that sparse ops touched copies all of it on
    the PS first).  `read` serves any list of (variable, rows) in one session
    call, so a caller bounds its memory by what it asks for at once; callers
    keep each call under `READ_BYTES` (gRPC cannot carry a message over 2 GB).
    The session reaches the PS tasks through the addresses it carries
    (ClusterSpec propagation): a PS's own cluster spec may name a peer at an
    address it has left (``--restart-at new-port``).  Its own server listens
    at `dial_back_address`, where the PS tasks can pull fed row indices from.

    Raises (from the constructor and `read`):
      RecoveryError: a PS cannot be reached or a variable is missing or
        uninitialised on it, before `timeout_secs`.
    """

    def __init__(self, records: Sequence[Mapping[str, Any]], ps_addresses: Sequence[str], timeout_secs: float = 60.0) -> None:
        import tensorflow as tf

        self._ps = list(ps_addresses)
        self._records = {r["name"]: r for r in records}
        self._graph = tf.Graph()
        self._whole: dict[str, Any] = {}
        self._gather: dict[str, tuple[Any, Any]] = {}
        with self._graph.as_default():
            for r in records:
                if not r["device"].startswith("/job:ps"):
                    raise ConfigError(f"variable {r['name']} lives on {r['device']!r}, not on a PS; source: manifest")
                dtype = tf.as_dtype(r["dtype"])
                with tf.device(r["device"]):
                    handle = tf.raw_ops.VarHandleOp(dtype=dtype, shape=r["shape"], shared_name=r["name"], container="")
                    self._whole[r["name"]] = tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)
                    if r["shape"]:
                        rows = tf.compat.v1.placeholder(tf.int32, [None])
                        self._gather[r["name"]] = (rows, tf.raw_ops.ResourceGather(resource=handle, indices=rows, dtype=dtype))
        address = dial_back_address(self._ps)
        self._server = own_server(address)
        config = propagated_config({"ps": self._ps, "reader": [address]}, timeout_secs)
        self._session = tf.compat.v1.Session(self._server.target, graph=self._graph, config=config)

    def __enter__(self) -> PsReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._session.close()

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._records[name]["shape"])

    def dtype(self, name: str) -> np.dtype:
        import tensorflow as tf

        return np.dtype(tf.as_dtype(self._records[name]["dtype"]).as_numpy_dtype)

    def read(self, requests: Sequence[tuple[str, Any]]) -> list[np.ndarray]:
        """The values of each (variable, rows) request; rows None reads the whole variable."""
        import tensorflow as tf

        out: list[Any] = [None] * len(requests)
        pending = list(enumerate(requests))
        while pending:  # a session call fetches each op once: a variable asked twice takes two calls
            fetches, feeds, taken, seen, later = [], {}, [], set(), []
            for i, (name, rows) in pending:
                if name in seen:
                    later.append((i, (name, rows)))
                    continue
                seen.add(name)
                taken.append(i)
                if rows is None or name not in self._gather:
                    fetches.append(self._whole[name])
                else:
                    ph, op = self._gather[name]
                    feeds[ph] = np.asarray(rows, np.int32)
                    fetches.append(op)
            try:
                values = self._session.run(fetches, feeds)
            except tf.errors.OpError as exc:
                raise RecoveryError(
                    f"cannot read {len(fetches)} variables from PS {self._ps} ({exc.message.splitlines()[0]}); "
                    "is every PS up and initialised?"
                ) from exc
            for i, value in zip(taken, values):
                out[i] = np.asarray(value)
            pending = later
        return out


def row_slices(rows: int, row_bytes: int, budget: int | None = None) -> list[tuple[int, int]]:
    """[lo, hi) ranges covering `rows` rows of `row_bytes` each, at most `budget` bytes apiece."""
    step = max(1, (budget or READ_BYTES) // max(1, row_bytes))
    return [(lo, min(lo + step, rows)) for lo in range(0, rows, step)]


def _row_bytes(reader: Any, name: str) -> int:
    shape = reader.shape(name)
    return int(np.prod(shape[1:], dtype=np.int64)) * reader.dtype(name).itemsize


def read_variables(
    records: Sequence[Mapping[str, Any]],
    ps_addresses: Sequence[str],
    timeout_secs: float = 60.0,
) -> dict[str, np.ndarray]:
    """Current values of the manifest's variables, read from the PS tasks into memory.

    The whole model ends up in this process: for a large model, use a `PsReader`
    and read what is needed in bounded slices (`streamed_digest`,
    `tf_ecrec.check.verify.check_parity` do).

    Raises:
      RecoveryError: a PS cannot be reached or a variable is missing or
        uninitialised on it, before `timeout_secs`.
    """
    with PsReader(records, ps_addresses, timeout_secs) as reader:
        out: dict[str, np.ndarray] = {}
        small: list[str] = []
        for r in records:
            shape = reader.shape(r["name"])
            if not shape or shape[0] * _row_bytes(reader, r["name"]) <= READ_BYTES:
                small.append(r["name"])
                continue
            out[r["name"]] = value = np.empty(shape, reader.dtype(r["name"]))
            for lo, hi in row_slices(shape[0], _row_bytes(reader, r["name"])):
                value[lo:hi] = reader.read([(r["name"], np.arange(lo, hi))])[0]
        batch: list[str] = []
        size = 0
        for name in small + [None]:  # whole reads of small variables, several per call
            nbytes = 0 if name is None else int(np.prod(reader.shape(name), dtype=np.int64)) * reader.dtype(name).itemsize
            if batch and (name is None or size + nbytes > READ_BYTES):
                out.update(zip(batch, reader.read([(n, None) for n in batch])))
                batch, size = [], 0
            if name is not None:
                batch.append(name)
                size += nbytes
    return {r["name"]: out[r["name"]] for r in records}


def _digest_header(h: Any, name: str, dtype: np.dtype, shape: Sequence[int]) -> None:
    h.update(name.encode())
    h.update(b"\0" + str(dtype).encode() + b"\0" + repr(tuple(shape)).encode() + b"\0")


def variables_digest(values: Mapping[str, np.ndarray]) -> str:
    """SHA-256 hex digest of variables in canonical (name) order."""
    h = hashlib.sha256()
    for name in sorted(values):
        v = np.asarray(values[name])
        _digest_header(h, name, v.dtype, v.shape)
        h.update(np.ascontiguousarray(v).tobytes())
    return h.hexdigest()


def streamed_digest(reader: Any, names: Iterable[str]) -> tuple[str, int]:
    """`variables_digest` of the named variables, read in row slices: (digest, bytes read).

    Equal to `variables_digest` of the same values held in memory; no more
    than one slice of `READ_BYTES` is held at a time.
    """
    h = hashlib.sha256()
    total = 0
    for name in sorted(names):
        shape, dtype = reader.shape(name), reader.dtype(name)
        _digest_header(h, name, dtype, shape)
        if not shape:
            value = np.ascontiguousarray(reader.read([(name, None)])[0])
            h.update(value.tobytes())
            total += value.nbytes
            continue
        for lo, hi in row_slices(shape[0], _row_bytes(reader, name)):
            value = np.ascontiguousarray(reader.read([(name, np.arange(lo, hi))])[0])
            h.update(value.tobytes())
            total += value.nbytes
    return h.hexdigest(), total
