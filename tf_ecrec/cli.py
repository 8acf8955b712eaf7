"""The ``tf-ecrec`` command.

Subcommands:

``run``
    launch a local PS cluster, train, inject failures, report
    (`tf_ecrec.launcher.supervisor`).
``gen-criteo``
    write a synthetic file in the Criteo TSV format.
``verify``
    check parity and replicas of a running erasure-coded job.
``master``
    run the job master standalone (`tf_ecrec.master.server`).

Errors from tf_ecrec (bad flags, a taken port, a failed task) are printed as
one clear message and exit with status 2 (usage) or 1 (run failure).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from tf_ecrec.errors import ConfigError, EcRecError
from tf_ecrec.launcher.job.choices import FaultTolerance, OnCorrupt, Optimizer, RestartAt, Storage, Strategy, values


def _run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="launch a local cluster, train, inject failures, report",
        description="Launch a local TF_CONFIG cluster (PS, chief, workers as processes), train, "
        "kill and restart tasks on cue, and write a report.",
    )
    p.add_argument("--model", default="dlrm",
                   help="dlrm, dcn, wide_deep_canned, keras_dlrm (--strategy pss), or a user's model module by import path (my_pkg.my_model; see docs/adoption.md)")
    p.add_argument("--data", default="synthetic",
                   help="synthetic | criteo:PATH[,PATH...] | stream:DIR | stream:redis://HOST:PORT/DB/TOPIC/PARTITION")
    p.add_argument("--strategy", default="estimator", choices=values(Strategy),
                   help="estimator (sessions, the default) or pss: TF2 ParameterServerStrategy with Keras fit "
                   "(--model keras_dlrm or a module with keras_model; docs/pss.md)")
    p.add_argument("--ps", type=int, default=3, help="parameter server tasks")
    p.add_argument("--workers", type=int, default=2, help="training workers, the chief included")
    p.add_argument(
        "--steps",
        type=int,
        default=3000,
        help="size of the data in steps: steps x batch-size records (Criteo: enough whole epochs of the files); "
        "with the job master the run ends when that data is trained, without it at this global step",
    )
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--model-dir", required=True, help="checkpoints, logs, job spec, manifest")
    p.add_argument("--seed", type=int, default=0, help="data and initialisation seed")
    p.add_argument("--deterministic", action="store_true", help="one worker, fixed order, deterministic ops")
    p.add_argument("--fault-tolerance", default="checkpoint", choices=values(FaultTolerance))
    p.add_argument("--ec", default=None, metavar="K+R",
                   help="erasure code for --fault-tolerance ecrec (and the layout of --storage collection); 2+1 "
                        "when not given. Given with another fault tolerance on partitioned tables, it is refused")
    p.add_argument(
        "--storage",
        default=None,
        choices=values(Storage),
        help="embedding tables as partitioned variables (stock; the default without ecrec) or as the "
        "collection ecrec protects (the default with ecrec): run none/checkpoint with --storage collection "
        "to compare against ecrec on the same variables",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--checkpoint-steps", type=int, default=None, help="checkpoint every N global steps")
    g.add_argument("--checkpoint-secs", type=float, default=None, help="checkpoint every S seconds")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--flash-checkpoint-steps", type=int, default=None,
                   help="with ecrec or flash: snapshot every PS into shared memory every N global steps "
                   "(tf_ecrec.flash; --fault-tolerance flash: 100 when no interval is given)")
    g.add_argument("--flash-checkpoint-secs", type=float, default=None, help="the same every S seconds")
    p.add_argument(
        "--kill",
        action="append",
        default=[],
        metavar="TASK@step=N|TASK@rebuild",
        help="SIGKILL TASK (ps:I, worker:I, chief:0, master, or spare:I standing by) at global step N and restart it "
             "(a killed spare is replaced by a new one); TASK@rebuild: while a lost PS's rows are rebuilt onto a "
             "spare in the background; repeatable",
    )
    p.add_argument("--restart-delay", type=float, default=2.0,
                   help="seconds between a kill and the restart; inf: never restarted (a spare, if any, takes over)")
    p.add_argument("--ps-wait", type=float, default=120.0, metavar="SECS",
                   help="how long trainers wait for a lost PS (or its replacement) with no step completed before "
                   "they fail with a RecoveryError naming it")
    p.add_argument("--ps-memory-mb", type=int, default=None,
                   help="each PS in its own memory cgroup with this limit; a PS killed at it is restarted with more")
    p.add_argument("--oom-growth", type=float, default=1.5, help="the limit of a PS restarted after an OOM, times this")
    p.add_argument("--hang-secs", type=float, default=300.0,
                   help="kill and restart a trainer with no step for this long while others train (0: off)")
    p.add_argument("--ps-hang-secs", type=float, default=4.0, metavar="SECS",
                   help="kill a PS that answered the launcher's probe and then nothing for this long (hung, "
                   "stopped, cut off; 5x as long if it kept a fifth of a core busy), then restart it or give its "
                   "role to a spare (0: off)")
    p.add_argument("--inject", action="append", default=[], metavar="oom:ps:I@step=N|hang:TASK@step=N",
                   help="at step N make a PS run out of memory, or freeze a task (SIGSTOP: a trainer with --hang-secs, a PS "
                   "with --ps-hang-secs); repeatable")
    p.add_argument(
        "--restart-at",
        default="same",
        choices=values(RestartAt),
        help="where a killed or crashed PS comes back: its old address, or a new port that every trainer "
        "follows by rebuilding TF_CONFIG, RunConfig, Estimator and session in process",
    )
    p.add_argument(
        "--spare-ps",
        type=int,
        default=0,
        metavar="N",
        help="PS processes started with the job that stand by: a killed PS's role goes to a spare at once "
        "(trainers follow its address as for --restart-at new-port), and a new spare starts behind it",
    )
    p.add_argument(
        "--rebuild-slice-mb",
        type=float,
        default=16.0,
        metavar="MB",
        help="megabytes of a lost chunk a rebuild moves per session call; bounds the rebuild's buffers on every "
        "PS (smaller slices interleave more finely with training)",
    )
    p.add_argument(
        "--rebuild-share",
        type=float,
        default=1.0,
        metavar="F",
        help="fraction of the time the background rebuild walks its slices (0 < F <= 1); the rest is left to "
        "training, so a lower share trades a longer rebuild for throughput while it runs (rows a lookup asks "
        "for are installed at once, whatever the share)",
    )
    p.add_argument(
        "--session-timeout",
        type=float,
        default=10.0,
        help="seconds a session call (a step, a hook's call) may take; bounds the wait of a session built "
        "for a PS address that is gone. Initialisation, recovery and checkpoint saves run under their own "
        "1-hour deadline, whatever the model's size",
    )
    p.add_argument("--report", default=None, help="report path (default MODEL_DIR/report.json)")
    p.add_argument("--no-plot", dest="plot", action="store_false",
                   help="no throughput plot beside the report (saves matplotlib's import and render, ~1.5 CPU-s)")
    p.add_argument("--optimizer", default="adagrad", choices=values(Optimizer))
    p.add_argument("--learning-rate", type=float, default=0.05)
    p.add_argument("--table-rows", type=int, default=20000, help="rows of each table")
    p.add_argument("--tables", type=int, default=26,
                   help="the model's tables: one per categorical of the first N of Criteo's 26 (fewer: a lighter run)")
    p.add_argument("--embedding-dim", type=int, default=16)
    p.add_argument("--on-corrupt", default="skip", choices=values(OnCorrupt), help="corrupt Criteo lines")
    p.add_argument("--shard-batches", type=int, default=8, help="batches per data shard")
    p.add_argument("--base-port", type=int, default=0, help="first port (consecutive); 0 picks free ports")
    p.add_argument("--quiet", action="store_true", help="no live progress line")
    m = p.add_argument_group(
        "job master",
        "By default the launcher runs a job master (tf-ecrec master) as its own process: it leases data shards "
        "of --shard-batches batches to the workers as they go, watches who is alive, and re-queues a dead "
        "worker's records; the report's data section comes from it.  --deterministic runs do without it "
        "(step-keyed data).",
    )
    g = m.add_mutually_exclusive_group()
    g.add_argument(
        "--no-master",
        dest="master",
        action="store_false",
        help="no job master: static round-robin shards, training stops at --steps",
    )
    g.add_argument("--master", dest="master_address", metavar="HOST:PORT", default=None,
                   help="use this running `tf-ecrec master` instead of starting one")
    m.add_argument("--master-token-file", default=None, help="the token of an external --master")
    m.add_argument("--zk", default=None, metavar="HOST:PORT[,...]/PATH",
                   help="membership and failure detection through ZooKeeper instead of heartbeats")
    m.add_argument("--task-timeout", type=float, default=10.0,
                   help="seconds a task may be silent before the master declares it lost (with --zk: at least 30)")
    m.add_argument("--add-worker", action="append", default=[], metavar="step=N",
                   help="start one more worker at global step N (its TF_CONFIG slot exists from the start); repeatable")
    m.add_argument("--remove-worker", action="append", default=[], metavar="worker:I@step=N",
                   help="stop worker I for good at global step N: it finishes its step, reports, leaves; repeatable")
    m.add_argument("--min-workers", type=int, default=None,
                   help="automatic scaling: the fewest trainers (chief included); with --max-workers")
    m.add_argument("--max-workers", type=int, default=None,
                   help="automatic scaling: the most trainers; a trainer is added while each addition raises the "
                   "job's records/s by 10%%, the last taken back when it does not (tf_ecrec.master.autoscale)")
    m.add_argument("--autoscale-window", type=float, default=15.0, help="seconds of training measured per trainer count")


def job_from_args(args: argparse.Namespace) -> Any:
    """The `JobSpec` of parsed ``tf-ecrec run`` arguments (typed errors for bad values)."""
    from tf_ecrec.launcher.job.kill_spec import parse_add_workers, parse_kills, parse_removes
    from tf_ecrec.launcher.job.spec import JobSpec

    if args.ec is not None and args.fault_tolerance != "ecrec" and args.storage != "collection":
        # Even --ec 2+1, the default code: a user who names a code expects it to protect something.
        raise ConfigError(f"--ec {args.ec} was given with --fault-tolerance {args.fault_tolerance}, which does not "
                          "erasure-code the tables; add --fault-tolerance ecrec (or --storage collection for its "
                          "layout unprotected); source: --ec")
    return JobSpec(
        model=args.model,
        data=args.data,
        ps=args.ps,
        workers=args.workers,
        steps=args.steps,
        batch_size=args.batch_size,
        model_dir=args.model_dir,
        seed=args.seed,
        deterministic=args.deterministic,
        fault_tolerance=args.fault_tolerance,
        ec=args.ec or "2+1",
        storage=args.storage,
        checkpoint_steps=args.checkpoint_steps,
        checkpoint_secs=args.checkpoint_secs,
        flash_checkpoint_steps=args.flash_checkpoint_steps,
        flash_checkpoint_secs=args.flash_checkpoint_secs,
        kills=parse_kills(args.kill),
        ps_memory_mb=args.ps_memory_mb,
        oom_growth=args.oom_growth,
        hang_secs=args.hang_secs,
        ps_hang_secs=args.ps_hang_secs,
        injections=tuple(args.inject),
        min_workers=args.min_workers,
        max_workers=args.max_workers,
        autoscale_window=args.autoscale_window,
        report=args.report,
        plot=args.plot,
        optimizer=args.optimizer,
        learning_rate=args.learning_rate,
        table_rows=args.table_rows,
        tables=args.tables,
        embedding_dim=args.embedding_dim,
        on_corrupt=args.on_corrupt,
        shard_batches=args.shard_batches,
        restart_delay=args.restart_delay,
        restart_at=args.restart_at,
        spare_ps=args.spare_ps,
        rebuild_slice_mb=args.rebuild_slice_mb,
        rebuild_share=args.rebuild_share,
        session_timeout=args.session_timeout,
        ps_wait=args.ps_wait,
        base_port=args.base_port,
        master=args.master,
        master_address=args.master_address,
        master_token_file=args.master_token_file,
        zk=args.zk,
        task_timeout=args.task_timeout,
        add_workers=parse_add_workers(args.add_worker),
        removes=parse_removes(args.remove_worker),
        strategy=args.strategy,
    )


def _run(args: argparse.Namespace) -> int:
    from tf_ecrec.launcher.job.spec import MODELS
    from tf_ecrec.launcher.supervisor import Supervisor

    job = job_from_args(args)
    if job.model not in MODELS or job.strategy is Strategy.PSS:
        # A user's module (and any under pss, which needs keras_model) is imported here first, so a broken one
        # fails before any process starts; the tasks import it the same way (`python -m` puts the working
        # directory first on sys.path).
        import os
        import sys

        from tf_ecrec.launcher.job.models import load_model

        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        load_model(job.model, keras=job.strategy is Strategy.PSS)
    Supervisor(job, live=False if args.quiet else None).run()
    return 0


def _gen_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gen-criteo", help="write a synthetic Criteo-format TSV file")
    p.add_argument("--out", required=True)
    p.add_argument("--records", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corrupt-every", type=int, default=0, help="make every N-th line corrupt (0: none)")


def _gen(args: argparse.Namespace) -> int:
    from tf_ecrec.data.synthetic import write_criteo_tsv

    if args.records < 1:
        raise ConfigError(f"--records {args.records} must be >= 1; source: --records")
    corrupt = write_criteo_tsv(args.out, args.records, seed=args.seed, corrupt_every=args.corrupt_every)
    print(f"wrote {args.records} records ({corrupt} corrupt) to {args.out}")
    return 0


def _verify_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="check parity and replicas of a running ecrec job",
        description="Read data, slots, parity and replicas from the live PS tasks of a job and check every "
        "stripe bit for bit. Steps in flight show as transient mismatches: pause training for an exact check.",
    )
    p.add_argument("--model-dir", required=True, help="the job's model dir (holds variables.json)")
    p.add_argument("--ps", default=None, help="PS addresses (default: those recorded in the manifest)")
    p.add_argument("--timeout", type=float, default=60.0)


def _verify(args: argparse.Namespace) -> int:
    import json

    from tf_ecrec.check.live_cluster import PsReader, read_manifest
    from tf_ecrec.check.verify import check_parity
    from tf_ecrec.launcher.job.model_dir import manifest_file

    manifest = read_manifest(manifest_file(args.model_dir))
    if "ec" not in manifest:
        raise ConfigError(f"the job in {args.model_dir} is not erasure-coded (no 'ec' in its manifest); source: --model-dir")
    ps = args.ps.split(",") if args.ps else manifest.get("ps")
    if not ps:
        raise ConfigError("no PS addresses: pass --ps; source: --ps")
    with PsReader(manifest["variables"], ps, args.timeout) as reader:
        result = check_parity(manifest["ec"], reader)
    print(json.dumps(result, indent=1))
    return 0 if result["mismatches"] == 0 and result["replica_mismatches"] == 0 else 1


def _export_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a finished ecrec job's model as a SavedModel that serves without tf_ecrec",
        description="Build the job's model from its model dir (job.json, variables.json) and export its latest "
        "checkpoint: stock TensorFlow ops only, the tables' data chunks and the dense weights.",
    )
    p.add_argument("--model-dir", required=True, help="the job's model dir")
    p.add_argument("--export-dir", default=None, help="where the timestamped SavedModel goes (default: MODEL_DIR/export)")


def _export(args: argparse.Namespace) -> int:
    from tf_ecrec.launcher.export import export

    print(export(args.model_dir, args.export_dir))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``tf-ecrec``'s subcommands and their flags.

    ``master`` is a stub here: ``main`` hands its arguments to `tf_ecrec.master.server.main`, whose
    own parser (`tf_ecrec.master.server.build_parser`) reads them.
    """
    parser = argparse.ArgumentParser(prog="tf-ecrec", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    _gen_parser(sub)
    _verify_parser(sub)
    _export_parser(sub)
    sub.add_parser("master", help="run the job master standalone (see tf-ecrec master --help)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["master"]:
        from tf_ecrec.master.server import main as master_main

        return master_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return {"run": _run, "gen-criteo": _gen, "verify": _verify, "export": _export}[args.command](args)
    except ConfigError as exc:
        print(f"tf-ecrec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except EcRecError as exc:
        print(f"tf-ecrec {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tf-ecrec {args.command}: interrupted; every task was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
