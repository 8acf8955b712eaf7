from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATUS_UNSPECIFIED: _ClassVar[TaskStatus]
    ALIVE: _ClassVar[TaskStatus]
    LOST: _ClassVar[TaskStatus]
    LEFT: _ClassVar[TaskStatus]
TASK_STATUS_UNSPECIFIED: TaskStatus
ALIVE: TaskStatus
LOST: TaskStatus
LEFT: TaskStatus

class TaskRef(_message.Message):
    __slots__ = ("task_id", "generation")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    generation: int
    def __init__(self, task_id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("task_type", "task_index", "address", "generation", "status")
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    task_type: str
    task_index: int
    address: str
    generation: int
    status: TaskStatus
    def __init__(self, task_type: _Optional[str] = ..., task_index: _Optional[int] = ..., address: _Optional[str] = ..., generation: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ...) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("version", "ps_version", "tasks")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PS_VERSION_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    version: int
    ps_version: int
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    def __init__(self, version: _Optional[int] = ..., ps_version: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("task_type", "task_index", "address", "instance_id")
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    task_type: str
    task_index: int
    address: str
    instance_id: str
    def __init__(self, task_type: _Optional[str] = ..., task_index: _Optional[int] = ..., address: _Optional[str] = ..., instance_id: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("task", "cluster", "heartbeat_interval_s")
    TASK_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    cluster: Cluster
    heartbeat_interval_s: float
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., cluster: _Optional[_Union[Cluster, _Mapping]] = ..., heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("version", "ps_version")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PS_VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    ps_version: int
    def __init__(self, version: _Optional[int] = ..., ps_version: _Optional[int] = ...) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ...) -> None: ...

class DeregisterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpdateTaskAddressRequest(_message.Message):
    __slots__ = ("task", "address")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    address: str
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., address: _Optional[str] = ...) -> None: ...

class ReportFailureRequest(_message.Message):
    __slots__ = ("task_id", "generation", "shard_ids", "dataset", "reason", "not_a_failure")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SHARD_IDS_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NOT_A_FAILURE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    generation: int
    shard_ids: _containers.RepeatedScalarFieldContainer[int]
    dataset: str
    reason: str
    not_a_failure: bool
    def __init__(self, task_id: _Optional[str] = ..., generation: _Optional[int] = ..., shard_ids: _Optional[_Iterable[int]] = ..., dataset: _Optional[str] = ..., reason: _Optional[str] = ..., not_a_failure: bool = ...) -> None: ...

class ReportFailureResponse(_message.Message):
    __slots__ = ("records_requeued", "cluster")
    RECORDS_REQUEUED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    records_requeued: int
    cluster: Cluster
    def __init__(self, records_requeued: _Optional[int] = ..., cluster: _Optional[_Union[Cluster, _Mapping]] = ...) -> None: ...

class BarrierRequest(_message.Message):
    __slots__ = ("task", "name", "generation", "participants", "task_types", "timeout_s")
    TASK_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    name: str
    generation: int
    participants: _containers.RepeatedScalarFieldContainer[str]
    task_types: _containers.RepeatedScalarFieldContainer[str]
    timeout_s: float
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., name: _Optional[str] = ..., generation: _Optional[int] = ..., participants: _Optional[_Iterable[str]] = ..., task_types: _Optional[_Iterable[str]] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class BarrierResponse(_message.Message):
    __slots__ = ("arrived",)
    ARRIVED_FIELD_NUMBER: _ClassVar[int]
    arrived: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, arrived: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterDatasetRequest(_message.Message):
    __slots__ = ("name", "total_records", "shard_records", "num_epochs", "shuffle_seed", "max_shard_failures", "stream")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RECORDS_FIELD_NUMBER: _ClassVar[int]
    SHARD_RECORDS_FIELD_NUMBER: _ClassVar[int]
    NUM_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_SHARD_FAILURES_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    name: str
    total_records: int
    shard_records: int
    num_epochs: int
    shuffle_seed: int
    max_shard_failures: int
    stream: bool
    def __init__(self, name: _Optional[str] = ..., total_records: _Optional[int] = ..., shard_records: _Optional[int] = ..., num_epochs: _Optional[int] = ..., shuffle_seed: _Optional[int] = ..., max_shard_failures: _Optional[int] = ..., stream: bool = ...) -> None: ...

class ExtendDatasetRequest(_message.Message):
    __slots__ = ("name", "available", "closed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    name: str
    available: int
    closed: bool
    def __init__(self, name: _Optional[str] = ..., available: _Optional[int] = ..., closed: bool = ...) -> None: ...

class RegisterDatasetResponse(_message.Message):
    __slots__ = ("created", "state")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    created: bool
    state: DataState
    def __init__(self, created: bool = ..., state: _Optional[_Union[DataState, _Mapping]] = ...) -> None: ...

class GetShardRequest(_message.Message):
    __slots__ = ("task", "dataset", "request_id")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    dataset: str
    request_id: int
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., dataset: _Optional[str] = ..., request_id: _Optional[int] = ...) -> None: ...

class Shard(_message.Message):
    __slots__ = ("shard_id", "attempt", "epoch", "start", "end")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    shard_id: int
    attempt: int
    epoch: int
    start: int
    end: int
    def __init__(self, shard_id: _Optional[int] = ..., attempt: _Optional[int] = ..., epoch: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class GetShardResponse(_message.Message):
    __slots__ = ("status", "shard", "retry_after_s")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[GetShardResponse.Status]
        SHARD: _ClassVar[GetShardResponse.Status]
        WAIT: _ClassVar[GetShardResponse.Status]
        END: _ClassVar[GetShardResponse.Status]
        DRAIN: _ClassVar[GetShardResponse.Status]
    STATUS_UNSPECIFIED: GetShardResponse.Status
    SHARD: GetShardResponse.Status
    WAIT: GetShardResponse.Status
    END: GetShardResponse.Status
    DRAIN: GetShardResponse.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    status: GetShardResponse.Status
    shard: Shard
    retry_after_s: float
    def __init__(self, status: _Optional[_Union[GetShardResponse.Status, str]] = ..., shard: _Optional[_Union[Shard, _Mapping]] = ..., retry_after_s: _Optional[float] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("task", "dataset", "shard_id", "attempt", "records")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    dataset: str
    shard_id: int
    attempt: int
    records: int
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., dataset: _Optional[str] = ..., shard_id: _Optional[int] = ..., attempt: _Optional[int] = ..., records: _Optional[int] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("shard_done",)
    SHARD_DONE_FIELD_NUMBER: _ClassVar[int]
    shard_done: bool
    def __init__(self, shard_done: bool = ...) -> None: ...

class GetDataStateRequest(_message.Message):
    __slots__ = ("dataset",)
    DATASET_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    def __init__(self, dataset: _Optional[str] = ...) -> None: ...

class DataState(_message.Message):
    __slots__ = ("dataset", "records_total", "records_trained", "records_retrained", "records_requeued", "records_failed", "records_in_flight", "shards_failed", "failed_shard_ids", "finished", "lease_holders")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    RECORDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RECORDS_TRAINED_FIELD_NUMBER: _ClassVar[int]
    RECORDS_RETRAINED_FIELD_NUMBER: _ClassVar[int]
    RECORDS_REQUEUED_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FAILED_FIELD_NUMBER: _ClassVar[int]
    RECORDS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FAILED_FIELD_NUMBER: _ClassVar[int]
    FAILED_SHARD_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    records_total: int
    records_trained: int
    records_retrained: int
    records_requeued: int
    records_failed: int
    records_in_flight: int
    shards_failed: int
    failed_shard_ids: _containers.RepeatedScalarFieldContainer[int]
    finished: bool
    lease_holders: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, dataset: _Optional[str] = ..., records_total: _Optional[int] = ..., records_trained: _Optional[int] = ..., records_retrained: _Optional[int] = ..., records_requeued: _Optional[int] = ..., records_failed: _Optional[int] = ..., records_in_flight: _Optional[int] = ..., shards_failed: _Optional[int] = ..., failed_shard_ids: _Optional[_Iterable[int]] = ..., finished: bool = ..., lease_holders: _Optional[_Iterable[str]] = ...) -> None: ...

class GetShardCheckpointRequest(_message.Message):
    __slots__ = ("dataset",)
    DATASET_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    def __init__(self, dataset: _Optional[str] = ...) -> None: ...

class ShardCheckpoint(_message.Message):
    __slots__ = ("dataset", "blob", "task")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    blob: bytes
    task: TaskRef
    def __init__(self, dataset: _Optional[str] = ..., blob: _Optional[bytes] = ..., task: _Optional[_Union[TaskRef, _Mapping]] = ...) -> None: ...

class RestoreShardCheckpointResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: DataState
    def __init__(self, state: _Optional[_Union[DataState, _Mapping]] = ...) -> None: ...
