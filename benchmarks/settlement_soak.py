"""Soak the settlement protocol: many seeded failure sequences through the fault-schedule harness.

    python benchmarks/settlement_soak.py --sequences 200 [--first-seed 1000] [--out soak.json]
                                         [--background] [--ticks 800]

Alternates 2+1 on 3 PS and 2+2 on 4 PS (three asynchronous workers, Adagrad),
on one in-process cluster; with ``--background`` lost rows are rebuilt while
the workers go on, and the chief also dies inside rebuild calls; prints running totals (sequences tried, failures
injected by kind, steps, parity checks, violations) and writes them as JSON.
Exits non-zero if any violation was found, printing the first ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from harness.fault_schedule import Sequence, Stats
from integration.tf_cluster import InProcessCluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--out", default="")
    parser.add_argument("--background", action="store_true", help="rebuild in the background (docs/rebuild.md)")
    parser.add_argument("--ticks", type=int, default=800, help="events per sequence")
    parser.add_argument("--carried", action="store_true",
                        help="each step's commit carried by the worker's next run (tf_ecrec.step.carried_commit)")
    parser.add_argument("--batched", action="store_true",
                        help="steps of applies and a count, folded by the workers' fold rounds (tf_ecrec.step.batched_commit)")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    cluster = InProcessCluster(num_ps=4)
    total = Stats()
    started = time.time()
    for i in range(args.sequences):
        k, r, num_ps = (2, 1, 3) if i % 2 == 0 else (2, 2, 4)
        total.add(Sequence(cluster.target("chief"), args.first_seed + i, k=k, r=r, num_ps=num_ps,
                           background=args.background, ticks=args.ticks, carried=args.carried,
                           batched=args.batched).run())
        summary = {f.name: getattr(total, f.name) for f in dataclasses.fields(total) if f.name != "violations"}
        summary["violations"] = len(total.violations)
        summary["seconds"] = round(time.time() - started, 1)
        print(json.dumps(summary), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({**summary, "first_violations": total.violations[:20]}, f, indent=1)
    for v in total.violations[:20]:
        print("VIOLATION", v)
    return 1 if total.violations else 0


if __name__ == "__main__":
    sys.exit(main())
