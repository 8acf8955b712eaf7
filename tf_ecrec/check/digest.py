"""The digest of a live cluster, as a command: ``python -m tf_ecrec.check.digest MANIFEST PS_ADDR[,...]``.

Reads every variable the manifest names from the live PS tasks in bounded slices
(`tf_ecrec.check.live_cluster`), checks parity and replicas (`tf_ecrec.check.verify`) and prints the
digest of the model's own variables as one JSON line: what the launcher's end-of-job report reads
(`tf_ecrec.launcher.digest_reader`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from tf_ecrec.check.live_cluster import PsReader, read_manifest, streamed_digest


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tf_ecrec.check.digest MANIFEST PS_ADDR[,PS_ADDR...]``: print the digest as JSON.

    With ``-`` for the addresses, the process first loads what reading needs
    (TensorFlow, the ops, the parity checker), then waits for one line on
    stdin with the addresses: a reader started ahead of time that reads the
    cluster as it is when the line comes (`tf_ecrec.launcher.digest_reader`).
    The manifest is read then too.
    """
    import argparse

    parser = argparse.ArgumentParser(description="Digest the variables of a live PS cluster.")
    parser.add_argument("manifest")
    parser.add_argument("ps", help="comma-separated PS addresses, or - to read them from stdin once ready")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.ps == "-":
        import tensorflow  # noqa: F401  (loaded before the wait: that is what waiting ahead saves)

        import tf_ecrec.check.verify  # noqa: F401  (the parity checker)

        line = sys.stdin.readline().strip()
        if not line:
            print("tf_ecrec.check.digest: stdin closed before any PS address came; nothing read", file=sys.stderr)
            return 3
        args.ps = line
    manifest = read_manifest(args.manifest)
    out: dict[str, Any] = {}
    names = [r["name"] for r in manifest["variables"]]
    with PsReader(manifest["variables"], args.ps.split(","), args.timeout) as reader:
        if "ec" in manifest:
            from tf_ecrec.check.verify import check_parity, redundancy_names

            out["parity"] = check_parity(manifest["ec"], reader)
            redundant = redundancy_names(manifest["ec"])
            names = [n for n in names if n not in redundant]
        digest, nbytes = streamed_digest(reader, names)
    out.update({"variables_sha256": digest, "variables": len(names), "bytes": nbytes})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
