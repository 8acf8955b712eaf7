"""What a launched job costs when its launcher is forked from a process that has TensorFlow loaded.

The test suite forks its ``tf-ecrec run`` launchers from one fork server per pytest process
(`tests/harness/zygote.py`), and such a launcher forks its own server from itself instead of starting
one that imports TensorFlow (`tf_ecrec.launcher.forkserver.ForkServer.start`).  This runs the same job
both ways, interleaved (exec, fork, exec, fork, ...), and prints each run's CPU (user + sys of the
launcher and everything it waited for) and wall time, and the medians' ratio:

    python benchmarks/forked_launch.py --repeats 3

Flags this script does not know go to every ``tf-ecrec run`` as they are.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

JOB = ["--fault-tolerance", "ecrec", "--ec", "2+1", "--ps", "3", "--workers", "2", "--steps", "300",
       "--kill", "ps:1@step=150", "--table-rows", "2000", "--embedding-dim", "8", "--quiet", "--no-plot"]


def _children_cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args, extra = parser.parse_known_args(argv)
    from harness import zygote  # pylint: disable=import-outside-toplevel

    if zygote.server() is None:
        print("no fork server (TF_ECREC_FORKSERVER=0 or no subreaper): nothing to compare", file=sys.stderr)
        return 1
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    root = tempfile.mkdtemp(prefix="forked_launch_")
    runs: dict[str, list[tuple[float, float, float]]] = {"exec": [], "fork": []}
    try:
        for repeat in range(args.repeats):
            for mode in runs:
                model_dir = os.path.join(root, f"{mode}-{repeat}")
                argv_ = [sys.executable, "-m", "tf_ecrec.cli", "run", "--model-dir", model_dir, *JOB, *extra]
                (user0, sys0), started = _children_cpu(), time.monotonic()
                if mode == "exec":
                    done = subprocess.run(argv_, capture_output=True, text=True, env=env, check=False)
                else:
                    done = zygote.run(argv_, env=env)
                (user1, sys1), wall = _children_cpu(), time.monotonic() - started
                if done.returncode != 0:
                    print(done.stderr[-3000:], file=sys.stderr)
                    return 1
                runs[mode].append((user1 - user0, sys1 - sys0, wall))
                print(f"{mode} #{repeat}: {user1 - user0:.1f} user + {sys1 - sys0:.1f} sys CPU-s, {wall:.1f} s",
                      flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n| launcher | CPU-s (median) | wall s (median) |\n|---|---|---|")
    medians = {}
    for mode, values in runs.items():
        medians[mode] = (statistics.median(u + s for u, s, _ in values), statistics.median(w for _, _, w in values))
        print(f"| {mode} | {medians[mode][0]:.1f} | {medians[mode][1]:.1f} |")
    print(f"\nfork / exec: CPU {medians['fork'][0] / medians['exec'][0]:.2f}, wall {medians['fork'][1] / medians['exec'][1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
