"""TF2 ParameterServerStrategy: the step cost of the protection and a PS rebuilt from parity, by table size.

    python benchmarks/pss_recovery.py --table-mb 16,128,512

For each size, in a fresh process (a strategy binds its process), on 3 PS and 2 workers
(`tests/harness/pss_cluster.py`), with a 2+1 code: a protected model (one `ECEmbeddings`
collection of 8 tables, a dense layer, `ECOptimizerV2` over Keras Adagrad) and the same model
unprotected (8 `tf.keras.layers.Embedding` tables placed round robin, stock Keras Adagrad) are
trained by ``model.fit`` in alternating rounds, so the machine's noise hits both: the ratio of their
step rates is the protection's cost under the strategy.  Then, with no step in flight, PS 1 is
SIGKILLed and restarted and `PSSRecovery.recover` rebuilds it; printed: its phases (reconnect, the
rest), bytes rebuilt and their rate, and the seconds from the restart to the first step of the
next ``fit``.  Sizes are of one copy of the tables (data, without slots or parity).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from tf_ecrec.cluster.tf_config import with_tf_environment  # noqa: E402  (before TensorFlow is imported)

os.environ.update(with_tf_environment(os.environ))

TABLES = 8
DIM = 32
BATCH = 256


def one(table_mb: int, rounds: int, steps: int) -> dict[str, Any]:
    """Measures one size (in this process, which becomes the coordinator)."""
    import numpy as np
    import tensorflow as tf
    from harness.pss_cluster import PSSCluster

    import tf_ecrec.keras
    import tf_ecrec.pss
    from tf_ecrec.pss.recovery import PSSRecovery

    tf_ecrec.pss.prepare_process()
    rows = max(1000, table_mb * (1 << 20) // (TABLES * DIM * 4))
    cluster = PSSCluster(3, 2)
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        cluster.resolver(), variable_partitioner=tf_ecrec.pss.ECPartitioner())
    protection = tf_ecrec.pss.protect(strategy, "2+1")

    class Model(tf.keras.Model):
        def __init__(self, protected: bool) -> None:
            super().__init__()
            if protected:
                self.emb = tf_ecrec.keras.ECEmbeddings([(f"t{i}", rows) for i in range(TABLES)], DIM, name="tables")
                self.lookup = self.emb
            else:
                self.tables = [tf.keras.layers.Embedding(rows, DIM) for _ in range(TABLES)]
                self.lookup = lambda ids: tf.stack([t(ids[:, i]) for i, t in enumerate(self.tables)], axis=1)
            self.dense = tf.keras.layers.Dense(1)

        def call(self, ids: tf.Tensor) -> tf.Tensor:
            return self.dense(tf.reshape(self.lookup(ids), [-1, TABLES * DIM]))

    def dataset_fn(ctx: Any) -> tf.data.Dataset:
        rng = np.random.default_rng(ctx.input_pipeline_id)
        ids = rng.integers(0, rows, size=(BATCH * 64, TABLES))
        y = rng.normal(size=(BATCH * 64, 1)).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices((ids, y)).repeat().batch(BATCH)

    data = tf.keras.utils.experimental.DatasetCreator(dataset_fn)
    with strategy.scope():
        models = {"protected": Model(True), "unprotected": Model(False)}
        models["protected"].compile(optimizer=protection.optimizer(tf.keras.optimizers.Adagrad(0.05)), loss="mse")
        models["unprotected"].compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="mse")
    for model in models.values():  # build and trace outside the timed rounds
        model.fit(data, epochs=1, steps_per_epoch=5, verbose=0)
    seconds = dict.fromkeys(models, 0.0)
    for _ in range(rounds):
        for name, model in models.items():
            t = time.perf_counter()
            model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
            seconds[name] += time.perf_counter() - t
    rate = {name: rounds * steps / s for name, s in seconds.items()}
    model = models["protected"]
    recovery = PSSRecovery(protection, model)
    cluster.kill("ps", 1)
    restarted = time.perf_counter()
    cluster.restart("ps", 1)
    result = recovery.recover(timeout_secs=300)
    t = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)
    first_step = time.perf_counter() - t
    report = model.optimizer.describe()
    cluster.close()
    rebuild = result.seconds - result.reconnect_seconds
    return {
        "table_mb": table_mb, "rows_per_table": rows,
        "steps_per_sec_protected": round(rate["protected"], 1), "steps_per_sec_unprotected": round(rate["unprotected"], 1),
        "protected_over_unprotected": round(rate["protected"] / rate["unprotected"], 3),
        "lost": result.lost, "bytes_rebuilt": result.bytes_rebuilt, "reconnect_s": round(result.reconnect_seconds, 2),
        "rebuild_s": round(rebuild, 2), "rebuild_gb_per_s": round(result.bytes_rebuilt / max(rebuild, 1e-9) / 1e9, 3),
        "restart_to_recovered_s": round(time.perf_counter() - restarted - first_step, 2),
        "first_step_after_s": round(first_step, 2), "settled": result.settled, "code": report["code"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-mb", default="16,128,512", help="sizes of one copy of the tables, MB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40, help="steps per model per round")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one(args.one, args.rounds, args.steps)), flush=True)
        os._exit(0)  # the coordinator's threads would wait on the stopped cluster
    rows = []
    for size in [int(s) for s in args.table_mb.split(",")]:
        out = subprocess.run([sys.executable, __file__, "--one", str(size), "--rounds", str(args.rounds),
                              "--steps", str(args.steps)], capture_output=True, text=True, timeout=3600)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode != 0 or not lines:
            print(f"size {size} MB failed:\n{out.stderr[-3000:]}", file=sys.stderr)
            return 1
        rows.append(json.loads(lines[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print("\ntable MB | steps/s protected | unprotected | ratio | rebuilt MB | rebuild s | GB/s | reconnect s | first step s")
    for r in rows:
        print(f"{r['table_mb']:8} | {r['steps_per_sec_protected']:17} | {r['steps_per_sec_unprotected']:11} | "
              f"{r['protected_over_unprotected']:5} | {r['bytes_rebuilt'] / 2**20:10.1f} | {r['rebuild_s']:9} | "
              f"{r['rebuild_gb_per_s']:4} | {r['reconnect_s']:11} | {r['first_step_after_s']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
