"""What the examples' plain Estimator scripts share: one process of a TF_CONFIG cluster.

A script (``python estimator_examples/dlrm.py --model-dir D``, one process per task of the
cluster TF_CONFIG names, or alone without it) parses the common flags (`parser`), makes its
RunConfig (`run_config`), serves if it is a PS (`serve_or_position` returns None after the
server ends), and trains on its static share of the records (`input_fn`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.errors import ConfigError


def parser(description: str, optimizers: Sequence[str]) -> argparse.ArgumentParser:
    """The flags every example script takes (`optimizers`: the choices of --optimizer); a script adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data", default="synthetic", help="synthetic or criteo:PATH[,PATH...]")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--optimizer", default="adagrad", choices=list(optimizers))
    p.add_argument("--checkpoint-steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    return p


def run_config(args: argparse.Namespace) -> tf.estimator.RunConfig:
    """The RunConfig of the common flags (TF_CONFIG, if set, gives the cluster and the task)."""
    return tf.estimator.RunConfig(
        model_dir=args.model_dir,
        tf_random_seed=args.seed,
        save_checkpoints_steps=args.checkpoint_steps,
        save_checkpoints_secs=None if args.checkpoint_steps else 600,
    )


def serve_or_position(config: tf.estimator.RunConfig) -> tuple[int, int] | None:
    """Starts this task's server; a PS serves until it is stopped and gets None.

    Returns:
      ``(num_workers, position)`` of a trainer: the trainers' count and its place among them (the
      chief first, then worker 0, 1, ...); ``(1, 0)`` without a cluster.
    """
    if not config.cluster_spec:
        return 1, 0
    from tf_ecrec.cluster.tf_config import ClusterConfig

    cluster = ClusterConfig.from_environment()
    server = tf.distribute.Server(config.cluster_spec, job_name=config.task_type, task_index=config.task_id, start=True)
    if cluster.task_type == "ps":
        server.join()
        return None
    return cluster.num_workers, cluster.worker_position


def input_fn(
    args: argparse.Namespace, table_sizes: Sequence[int], num_workers: int, position: int
) -> Callable[[], tf.data.Dataset]:
    """The input_fn of `--data`: this trainer's static share of the records, in batches."""
    from tf_ecrec.data.criteo import CriteoFiles
    from tf_ecrec.data.pipeline import StaticShards, make_dataset
    from tf_ecrec.data.synthetic import SyntheticCriteo

    source: Any
    if args.data == "synthetic":
        source = SyntheticCriteo(list(table_sizes), args.steps * args.batch_size, seed=args.seed)
    elif args.data.startswith("criteo:"):
        source = CriteoFiles(args.data[len("criteo:") :].split(","))
    else:
        raise ConfigError(f"--data must be synthetic or criteo:PATH, got {args.data!r}; source: --data")

    def fn() -> tf.data.Dataset:
        shards = StaticShards(source.num_records, 8 * args.batch_size, num_workers, position)
        return make_dataset(source, shards, args.batch_size, list(table_sizes))

    return fn
