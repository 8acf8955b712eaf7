"""The job a launcher runs, as one validated value: flags in, `JobSpec` out.

Everything a task process needs is in the `JobSpec` (``<model_dir>/job.json``, handed to every
task); every rule about flag combinations is checked here, before any process starts.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from typing import Any, TypeVar

from tf_ecrec.data.schema import NUM_CAT
from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.job import diagnosis, elastic, intervals
from tf_ecrec.launcher.job.choices import FaultTolerance, OnCorrupt, Optimizer, RestartAt, Storage, Strategy
from tf_ecrec.launcher.job.kill_spec import KillSpec

MODELS = ("dlrm", "dcn", "keras_dlrm", "wide_deep_canned")
# A user's model module (`tf_ecrec.launcher.task.entry.load_model`): a dotted import path.
_MODULE_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

_E = TypeVar("_E", bound=enum.Enum)


def _member(kind: type[_E], value: Any, flag: str) -> _E:
    """`value` (a member or its flag spelling) as a member of `kind`; ConfigError naming `flag` otherwise."""
    try:
        return kind(value)
    except ValueError:
        allowed = tuple(m.value for m in kind)
        raise ConfigError(f"{flag} {value!r} is not one of {allowed}; source: {flag}") from None


_HOST_PORT = re.compile(r"^[^\s:/]+:(?P<port>\d{1,5})$")

ENV_SPARE_ADDRESS = "TF_ECREC_SPARE_ADDRESS"  # set by the launcher for a spare PS process: the address it stands by at


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """All flags of ``tf-ecrec run``, validated.  See `tf_ecrec.cli` for their help.

    Data and the job master (``master``, ``master_address``, ``zk``):

    - By default the launcher runs a job master (`tf_ecrec.master`) as its own
      process and the data is sharded dynamically: the dataset is
      ``records_total`` records (synthetic: ``steps * batch_size``; Criteo:
      the files' records times enough epochs to cover ``steps * batch_size``),
      cut into shards of ``shard_batches`` batches that workers lease as they
      go.  The run ends when every record has been trained (acknowledged);
      ``--steps`` sizes the data and no longer stops training, so a run
      with failures ends a few steps past it (re-trained records are steps too).
    - ``master_address``: use a running ``tf-ecrec master`` instead of starting
      one (then ``--kill master`` is not possible).
    - ``zk``: membership and failure detection through ZooKeeper instead of
      heartbeats to the master.
    - PS restarts (``--kill ps:I``, crashes): at the same address, or with
      ``restart_at="new-port"`` at a fresh port, which every trainer learns
      (the launcher's cluster file, ``<model_dir>/cluster.json``) and follows
      by rebuilding TF_CONFIG, RunConfig, Estimator and session in process
      (`tf_ecrec.session.failover`); ``session_timeout`` bounds a step's session call.
    - ``spare_ps``: PS processes started with the job and standing by; a
      killed or crashed PS's role goes to a spare at once (its address
      replaces the lost one in the cluster file, as a move does), with no
      wait for a process to start, and a new spare is started behind it.
      Without a spare left, the PS restarts as ``restart_at`` says.
    - ``storage``: how the model's embedding tables are stored.
      ``"collection"`` (`tf_ecrec.EmbeddingCollection`: one variable per PS
      holding its chunks of every table, laid out by the ``ec`` code) is what
      ecrec protects, and the like-for-like baseline of ``none`` and
      ``checkpoint`` (the same variables and lookups, no parity, the stock
      optimizer); ``"partitioned"`` (each table a partitioned variable over
      the PS) is how stock TensorFlow scripts store them.  Default: the
      collection under ecrec, partitioned otherwise.
    - ``rebuild_slice_mb``: a lost chunk's rows moved per call of a rebuild (`tf_ecrec.rebuild`): the
      bound on its buffers on every PS.  ``rebuild_share``: the fraction of the time a background
      rebuild walks its slices (below 1 it pauses between slices, leaving the machine to training).
    - ``strategy``: Estimator sessions, or ``pss`` (`tf_ecrec.launcher.task.pss_job`).
    - ``master=False`` (``--no-master``), and every ``--deterministic`` run,
      keep static round-robin sharding for exactly ``--steps`` steps with no
      master (deterministic runs read step-keyed data, which needs none).

    Elastic workers: ``add_workers`` are global steps at which one more
    worker starts; their TF_CONFIG slots (``worker:W-1``, ``worker:W``, ...,
    in step order) are in every task's cluster spec from the start and
    stay empty until then.  ``removes`` stop a worker for good (SIGTERM: it
    finishes its step, reports its progress and leaves; its leased records
    go back to the others).
    """

    model: str = "dlrm"
    data: str = "synthetic"
    ps: int = 3
    workers: int = 2
    steps: int = 3000
    batch_size: int = 256
    model_dir: str = "/tmp/tf_ecrec_run"
    seed: int = 0
    deterministic: bool = False
    fault_tolerance: FaultTolerance = FaultTolerance.CHECKPOINT
    checkpoint_steps: int | None = None
    checkpoint_secs: float | None = None
    flash_checkpoint_steps: int | None = None
    flash_checkpoint_secs: float | None = None
    ec: str = "2+1"
    storage: Storage | None = None
    kills: tuple[KillSpec, ...] = ()
    report: str | None = None
    plot: bool = True  # the report's throughput plot (a PNG beside it)
    optimizer: Optimizer = Optimizer.ADAGRAD
    table_rows: int = 20000
    tables: int = NUM_CAT  # the model's tables: the first N of the data's 26 categoricals
    embedding_dim: int = 16
    learning_rate: float = 0.05
    on_corrupt: OnCorrupt = OnCorrupt.SKIP
    shard_batches: int = 8
    restart_delay: float = 2.0
    restart_at: RestartAt = RestartAt.SAME
    spare_ps: int = 0
    rebuild_slice_mb: float = 16.0
    rebuild_share: float = 1.0
    session_timeout: float = 10.0
    ps_wait: float = 120.0
    base_port: int = 0
    master: bool = True
    master_address: str | None = None
    master_token_file: str | None = None
    zk: str | None = None
    task_timeout: float = 10.0
    add_workers: tuple[int, ...] = ()
    removes: tuple[KillSpec, ...] = ()
    strategy: Strategy = Strategy.ESTIMATOR
    ps_memory_mb: int | None = None
    oom_growth: float = 1.5
    hang_secs: float = 300.0
    ps_hang_secs: float = 4.0
    injections: tuple[str, ...] = ()
    min_workers: int | None = None
    max_workers: int | None = None
    autoscale_window: float = 15.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kills", tuple(self.kills))
        object.__setattr__(self, "add_workers", tuple(sorted(self.add_workers)))
        object.__setattr__(self, "removes", tuple(self.removes))
        object.__setattr__(self, "injections", tuple(self.injections))
        # Flag spellings (the command line, job.json) become members; an unknown one is refused here.
        object.__setattr__(self, "fault_tolerance", _member(FaultTolerance, self.fault_tolerance, "--fault-tolerance"))
        if self.storage is not None:
            object.__setattr__(self, "storage", _member(Storage, self.storage, "--storage"))
        object.__setattr__(self, "optimizer", _member(Optimizer, self.optimizer, "--optimizer"))
        object.__setattr__(self, "on_corrupt", _member(OnCorrupt, self.on_corrupt, "--on-corrupt"))
        object.__setattr__(self, "restart_at", _member(RestartAt, self.restart_at, "--restart-at"))
        object.__setattr__(self, "strategy", _member(Strategy, self.strategy, "--strategy"))
        self.validate()

    # ---- rules ---------------------------------------------------------------------------

    def validate(self) -> None:
        """Raises ConfigError for any bad value or combination; see the messages for the rules."""
        _check(self.model in MODELS or _MODULE_PATH.match(self.model) is not None,
               f"--model {self.model!r} is neither one of {MODELS} nor a module path such as my_pkg.my_model",
               "--model")
        _check(
            self.data == "synthetic" or any(self.data.startswith(p) and len(self.data) > len(p) for p in ("criteo:", "stream:")),
            f"--data {self.data!r} must be 'synthetic', 'criteo:PATH[,PATH...]', 'stream:DIR' or "
            "'stream:redis://HOST:PORT/DB/TOPIC/PARTITION'",
            "--data",
        )
        if self.stream_dir is not None and self.stream_dir.startswith("redis://"):
            from tf_ecrec.data.redis_stream import parse_partition_url

            parse_partition_url(self.stream_dir)  # ConfigError naming the rule
        _check(self.stream_dir is None or (self.uses_master and self.strategy is Strategy.ESTIMATOR),
               f"--data {self.data}: a stream is sharded by the job master, for Estimator trainers (not with "
               "--no-master, --deterministic or --strategy pss)", "--data")
        _check(self.ps >= 1, f"--ps {self.ps} must be >= 1 (a PS job needs a parameter server)", "--ps")
        _check(self.workers >= 1, f"--workers {self.workers} must be >= 1 (the chief counts as one)", "--workers")
        _check(self.steps >= 1, f"--steps {self.steps} must be >= 1", "--steps")
        _check(self.batch_size >= 1, f"--batch-size {self.batch_size} must be >= 1", "--batch-size")
        _check(self.table_rows >= 1, f"--table-rows {self.table_rows} must be >= 1", "--table-rows")
        _check(1 <= self.tables <= NUM_CAT, f"--tables {self.tables} must be in 1..{NUM_CAT} (the data's categoricals)", "--tables")
        _check(self.embedding_dim >= 1, f"--embedding-dim {self.embedding_dim} must be >= 1", "--embedding-dim")
        _check(self.learning_rate > 0, f"--learning-rate {self.learning_rate} must be > 0", "--learning-rate")
        _check(self.shard_batches >= 1, f"--shard-batches {self.shard_batches} must be >= 1", "--shard-batches")
        _check(self.restart_delay >= 0, f"--restart-delay {self.restart_delay} must be >= 0", "--restart-delay")
        _check(isinstance(self.spare_ps, int) and not isinstance(self.spare_ps, bool) and self.spare_ps >= 0,
               f"--spare-ps {self.spare_ps!r} must be an integer >= 0", "--spare-ps")
        _check(self.session_timeout > 0, f"--session-timeout {self.session_timeout} must be > 0", "--session-timeout")
        _check(0 < self.ps_wait < float("inf"), f"--ps-wait {self.ps_wait} must be > 0 and finite", "--ps-wait")
        _check(self.rebuild_slice_mb > 0, f"--rebuild-slice-mb {self.rebuild_slice_mb} must be > 0", "--rebuild-slice-mb")
        _check(0 < self.rebuild_share <= 1, f"--rebuild-share {self.rebuild_share} must be in (0, 1]", "--rebuild-share")
        _check(0 <= self.base_port < 65536 - 64, f"--base-port {self.base_port} must be 0 (pick free ports) or a port", "--base-port")
        intervals.validate(self)
        diagnosis.validate(self)
        _check(
            not (self.fault_tolerance is FaultTolerance.ECREC and self.storage is Storage.PARTITIONED),
            "--storage partitioned with --fault-tolerance ecrec: ecrec protects the collection storage only",
            "--storage",
        )
        _check(
            self.table_storage is Storage.PARTITIONED or self.fault_tolerance is FaultTolerance.ECREC or self.model == "dlrm",
            f"--storage collection without ecrec is built for --model dlrm only, not {self.model!r}",
            "--storage",
        )
        if self.table_storage is Storage.COLLECTION:
            from tf_ecrec.erasure.code import ECConfig

            ECConfig.parse(self.ec).check_cluster(self.ps)
        elif self.ec != "2+1":
            raise ConfigError(
                f"--ec {self.ec} was given with --fault-tolerance {self.fault_tolerance.value} and partitioned tables; the "
                "code applies to --fault-tolerance ecrec and to --storage collection (its layout) only; source: --ec"
            )
        if self.deterministic:
            _check(
                self.workers == 1,
                f"--deterministic needs --workers 1 (a fixed update order), got --workers {self.workers}",
                "--deterministic",
            )
        self._validate_master()
        for kill in self.kills:
            if kill.task_type == "master":
                _check(
                    self.owns_master,
                    f"--kill {kill}: the launcher runs no master to kill"
                    + (" (--master names one it does not own)" if self.master_address else ""),
                    "--kill",
                )
            else:
                self.check_task_exists(kill, "--kill")
            if kill.during:
                _check(self.fault_tolerance is FaultTolerance.ECREC and self.spare_ps > 0,
                       f"--kill {kill}: a lost PS is rebuilt in the background only onto a spare, with --fault-tolerance "
                       f"ecrec and --spare-ps >= 1 (got {self.fault_tolerance.value}, {self.spare_ps})", "--kill")
                continue
            _check(
                0 < kill.step < self.steps,
                f"--kill {kill}: step {kill.step} must be inside the run, 0 < step < --steps {self.steps}",
                "--kill",
            )
        elastic.validate(self)
        if self.strategy is Strategy.PSS:
            from tf_ecrec.launcher.job import pss_rules

            pss_rules.validate(self)

    @property
    def table_storage(self) -> Storage:
        """``storage``, or its default for the fault tolerance."""
        if self.storage is not None:
            return self.storage
        return Storage.COLLECTION if self.fault_tolerance is FaultTolerance.ECREC else Storage.PARTITIONED

    def check_task_exists(self, spec: KillSpec, flag: str) -> None:
        slots = self.worker_slots
        limit = {"ps": self.ps, "worker": slots, "chief": 1, "spare": self.spare_ps}[spec.task_type]
        if spec.task_type == "spare":
            has = f"starts spare:0..{limit - 1} (--spare-ps {limit})" if limit else "starts no spare (--spare-ps 0)"
        else:
            has = f"has ps:0..{self.ps - 1}, chief:0" + (f" and worker:0..{slots - 1}" if slots else " and no non-chief worker")
        _check(spec.task_index < limit, f"{flag} {spec}: {spec.task} does not exist; this job {has}", flag)
        added_at = self.added_at(spec.task)
        if added_at is not None:
            _check(
                spec.step > added_at,
                f"{flag} {spec}: {spec.task} is added at step {added_at} (--add-worker), so it can only be "
                f"stopped after that step",
                flag,
            )

    def _validate_master(self) -> None:
        _check(
            self.task_timeout > 0,
            f"--task-timeout {self.task_timeout} must be > 0 (seconds of silence before a task is declared lost)",
            "--task-timeout",
        )
        needs = [
            (self.master_address is not None, "--master"),
            (self.master_token_file is not None, "--master-token-file"),
            (self.zk is not None, "--zk"),
            (bool(self.add_workers), "--add-worker"),
            (bool(self.removes), "--remove-worker"),
            (any(k.task_type == "master" for k in self.kills), "--kill master"),
        ]
        for given, flag in needs:
            if given and not self.master:
                raise ConfigError(f"{flag} needs the job master, but --no-master was given; source: {flag}")
            if given and self.deterministic:
                raise ConfigError(
                    f"{flag} needs the job master, but --deterministic runs on step-keyed data without one; "
                    f"source: {flag}"
                )
        if self.master_address is not None:
            m = _HOST_PORT.match(self.master_address)
            _check(
                m is not None and 0 < int(m["port"]) < 65536,
                f"--master {self.master_address!r} must be HOST:PORT of a running `tf-ecrec master`",
                "--master",
            )
        if self.master_token_file is not None:
            _check(
                self.master_address is not None,
                "--master-token-file applies to an external --master (the launcher makes its own token)",
                "--master-token-file",
            )
        if self.zk is not None:
            try:
                from tf_ecrec.membership.zk_connection import parse_zk_url
            except ImportError as exc:  # kazoo is optional
                raise ConfigError(f"--zk needs the kazoo package ({exc}); source: --zk") from exc
            try:
                parse_zk_url(self.zk)
            except ConfigError as exc:
                raise ConfigError(f"--zk {self.zk!r}: {exc}; source: --zk") from exc

    # ---- derived ---------------------------------------------------------------------------

    @property
    def checkpoint_interval(self) -> dict[str, Any]:
        """RunConfig's checkpoint arguments for this job."""
        return intervals.checkpoint_interval(self)

    @property
    def flash(self) -> Any:
        """The job's `tf_ecrec.flash.config.FlashConfig`, or None without a flash checkpoint interval."""
        return intervals.flash_config(self)

    @property
    def uses_master(self) -> bool:
        """Whether tasks talk to a job master (dynamic data, membership): not with --no-master, --deterministic,
        or --strategy pss (its coordinator schedules the steps)."""
        return self.master and not self.deterministic and self.strategy is Strategy.ESTIMATOR

    @property
    def owns_master(self) -> bool:
        """Whether the launcher runs the master process itself (not an external --master)."""
        return self.uses_master and self.master_address is None

    @property
    def worker_slots(self) -> int:
        """Non-chief worker slots in TF_CONFIG (`tf_ecrec.launcher.job.elastic.worker_slots`)."""
        return elastic.worker_slots(self)

    @property
    def scaling(self) -> Any:
        """The `tf_ecrec.master.autoscale.ScalingConfig` of ``--min-workers/--max-workers``, or None."""
        return elastic.scaling_config(self)

    def added_at(self, task: str) -> int | None:
        """The --add-worker step of an added slot ("worker:I"), None for the initial tasks."""
        return elastic.added_at(self, task)

    @property
    def stream_dir(self) -> str | None:
        """``--data stream:TARGET``: the directory whose files arrive while the job trains, or a Redis Streams
        partition (``redis://HOST:PORT/DB/TOPIC/PARTITION``; `tf_ecrec.data.stream.open_stream`)."""
        return self.data[len("stream:") :] if self.data.startswith("stream:") else None

    @property
    def criteo_paths(self) -> list[str]:
        return self.data[len("criteo:") :].split(",") if self.data.startswith("criteo:") else []

    def to_json(self) -> dict[str, Any]:
        out = {k: v.value if isinstance(v, enum.Enum) else v for k, v in dataclasses.asdict(self).items()}
        out["kills"] = [str(k) for k in self.kills]
        out["removes"] = [str(k) for k in self.removes]
        out["add_workers"] = list(self.add_workers)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobSpec:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ConfigError(f"job spec has unknown fields {unknown}; source: job.json")
        data = dict(data)
        data["kills"] = tuple(KillSpec.parse(k) for k in data.get("kills", ()))
        data["removes"] = tuple(KillSpec.parse(k, "--remove-worker") for k in data.get("removes", ()))
        data["add_workers"] = tuple(int(s) for s in data.get("add_workers", ()))
        return cls(**data)

    @classmethod
    def load(cls, path: str) -> JobSpec:
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read job spec {path!r} ({exc}); source: {path}") from exc
        return cls.from_json(data)


def _check(ok: bool, message: str, source: str) -> None:
    if not ok:
        raise ConfigError(f"{message}; source: {source}")
