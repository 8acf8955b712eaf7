"""The gRPC servicer: translates protobuf messages to :class:`MasterState` calls.

No logic lives here.  Errors from the state become status codes; the
trailing metadata key :data:`~tf_ecrec.master.wire.ERROR_KEY` names the tf_ecrec error class so that
the client raises the same type:

=============================  ====================  =========================
tf_ecrec error                 status code           when
=============================  ====================  =========================
``InvalidRequestError``        INVALID_ARGUMENT      malformed id, range, count
``NotFoundError``              NOT_FOUND             unknown task/dataset/shard
``StaleGenerationError``       FAILED_PRECONDITION   older generation or lease
``MembershipLost``             FAILED_PRECONDITION   task declared lost or left
``MasterError``                FAILED_PRECONDITION   conflicting definitions
``BarrierTimeout``             DEADLINE_EXCEEDED     barrier incomplete in time
``AuthenticationError``        UNAUTHENTICATED       token mismatch (interceptor)
``MasterUnavailable``          UNAVAILABLE           shutting down; retry
anything else                  INTERNAL              a bug; logged with traceback
=============================  ====================  =========================
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from tf_ecrec import errors
from tf_ecrec.master.proto import master_pb2 as pb
from tf_ecrec.master.proto import master_pb2_grpc as pb_grpc
from tf_ecrec.master.sharding import DEFAULT_MAX_SHARD_FAILURES, DatasetSpec, DataStats, ShardStatus
from tf_ecrec.master.state.master_state import MasterState
from tf_ecrec.master.state.tasks import ClusterView
from tf_ecrec.master.wire import ERROR_KEY, shard_status_pb, task_status_pb

_LOG = logging.getLogger(__name__)

# Most specific first: the first matching class decides the code.
_STATUS = (
    (errors.MasterUnavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFoundError, grpc.StatusCode.NOT_FOUND),
    (errors.StaleGenerationError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.MembershipLost, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.BarrierTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.AuthenticationError, grpc.StatusCode.UNAUTHENTICATED),
    (errors.MasterError, grpc.StatusCode.FAILED_PRECONDITION),
)

F = TypeVar("F", bound=Callable[..., Any])


def abort_with(context: grpc.ServicerContext, exc: errors.EcRecError) -> None:
    """Aborts the RPC with the status for ``exc``, naming its class in metadata."""
    for cls, code in _STATUS:  # noqa: B007 (code is read after the break)
        if isinstance(exc, cls):
            break
    else:
        code = grpc.StatusCode.INTERNAL
    context.set_trailing_metadata(((ERROR_KEY, type(exc).__name__),))
    context.abort(code, str(exc))


def _rpc(method: F) -> F:
    @functools.wraps(method)
    def wrapper(self: MasterServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except errors.EcRecError as exc:
            abort_with(context, exc)
        except Exception as exc:  # the boundary: log and report INTERNAL.
            _LOG.exception("Internal error in %s", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"Internal error: {exc!r}")
        raise AssertionError("unreachable")  # pragma: no cover - abort raises.
    return wrapper  # type: ignore[return-value]


def cluster_pb(view: ClusterView) -> pb.Cluster:
    return pb.Cluster(version=view.version, ps_version=view.ps_version, tasks=[
        pb.TaskInfo(task_type=t.task_type, task_index=t.task_index, address=t.address,
                    generation=t.generation, status=task_status_pb(t.status))
        for t in view.tasks])


def data_state_pb(stats: DataStats) -> pb.DataState:
    return pb.DataState(
        dataset=stats.dataset, records_total=stats.records_total,
        records_trained=stats.records_trained, records_retrained=stats.records_retrained,
        records_requeued=stats.records_requeued, records_failed=stats.records_failed,
        records_in_flight=stats.records_in_flight, shards_failed=stats.shards_failed,
        failed_shard_ids=list(stats.failed_shard_ids), finished=stats.finished,
        lease_holders=list(stats.lease_holders))


class MasterServicer(pb_grpc.MasterServicer):
    """Serves one :class:`MasterState`."""

    def __init__(self, state: MasterState, heartbeat_interval: float) -> None:
        self._state = state
        self._heartbeat_interval = heartbeat_interval

    @_rpc
    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.RegisterResponse:
        record, view = self._state.register(request.task_type, request.task_index,
                                            request.address, request.instance_id)
        return pb.RegisterResponse(
            task=pb.TaskRef(task_id=record.task_id, generation=record.generation),
            cluster=cluster_pb(view), heartbeat_interval_s=self._heartbeat_interval)

    @_rpc
    def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        version, ps_version = self._state.heartbeat(request.task.task_id,
                                                    request.task.generation)
        return pb.HeartbeatResponse(version=version, ps_version=ps_version)

    @_rpc
    def Deregister(self, request: pb.DeregisterRequest, context: Any) -> pb.DeregisterResponse:
        self._state.deregister(request.task.task_id, request.task.generation)
        return pb.DeregisterResponse()

    @_rpc
    def GetCluster(self, request: pb.GetClusterRequest, context: Any) -> pb.Cluster:
        return cluster_pb(self._state.cluster())

    @_rpc
    def UpdateTaskAddress(self, request: pb.UpdateTaskAddressRequest, context: Any) -> pb.Cluster:
        return cluster_pb(self._state.update_address(
            request.task.task_id, request.task.generation, request.address))

    @_rpc
    def ReportFailure(self, request: pb.ReportFailureRequest,
                      context: Any) -> pb.ReportFailureResponse:
        requeued = self._state.report_failure(request.task_id, request.generation,
                                              request.reason, request.dataset,
                                              list(request.shard_ids),
                                              failed=not request.not_a_failure)
        return pb.ReportFailureResponse(records_requeued=requeued,
                                        cluster=cluster_pb(self._state.cluster()))

    @_rpc
    def Barrier(self, request: pb.BarrierRequest, context: Any) -> pb.BarrierResponse:
        arrived = self._state.barrier(
            request.task.task_id, request.task.generation, request.name, request.generation,
            list(request.participants), list(request.task_types), request.timeout_s)
        return pb.BarrierResponse(arrived=arrived)

    @_rpc
    def RegisterDataset(self, request: pb.RegisterDatasetRequest,
                        context: Any) -> pb.RegisterDatasetResponse:
        spec = DatasetSpec(
            name=request.name, total_records=request.total_records,
            shard_records=request.shard_records, num_epochs=request.num_epochs,
            shuffle_seed=request.shuffle_seed if request.HasField("shuffle_seed") else None,
            max_shard_failures=request.max_shard_failures or DEFAULT_MAX_SHARD_FAILURES, stream=request.stream)
        created, stats = self._state.register_dataset(spec)
        return pb.RegisterDatasetResponse(created=created, state=data_state_pb(stats))

    @_rpc
    def GetShard(self, request: pb.GetShardRequest, context: Any) -> pb.GetShardResponse:
        status, lease = self._state.get_shard(request.task.task_id, request.task.generation,
                                              request.dataset, request.request_id)
        if lease is None:
            return pb.GetShardResponse(status=shard_status_pb(status),
                                       retry_after_s=0.5 if status is ShardStatus.WAIT else 0)
        epoch, _, _ = self._state.dataset_spec(request.dataset).shard_range(lease.shard_id)
        return pb.GetShardResponse(status=pb.GetShardResponse.SHARD, shard=pb.Shard(
            shard_id=lease.shard_id, attempt=lease.attempt, epoch=epoch,
            start=lease.start, end=lease.end))

    @_rpc
    def ReportProgress(self, request: pb.ReportProgressRequest,
                       context: Any) -> pb.ReportProgressResponse:
        done = self._state.report_progress(
            request.task.task_id, request.task.generation, request.dataset,
            request.shard_id, request.attempt, request.records)
        return pb.ReportProgressResponse(shard_done=done)

    @_rpc
    def GetDataState(self, request: pb.GetDataStateRequest, context: Any) -> pb.DataState:
        return data_state_pb(self._state.data_stats(request.dataset))

    @_rpc
    def GetShardCheckpoint(self, request: pb.GetShardCheckpointRequest,
                           context: Any) -> pb.ShardCheckpoint:
        return pb.ShardCheckpoint(dataset=request.dataset,
                                  blob=self._state.shard_checkpoint(request.dataset))

    @_rpc
    def RestoreShardCheckpoint(self, request: pb.ShardCheckpoint,
                               context: Any) -> pb.RestoreShardCheckpointResponse:
        stats = self._state.restore_shard_checkpoint(request.task.task_id, request.task.generation,
                                                     request.dataset, request.blob)
        return pb.RestoreShardCheckpointResponse(state=data_state_pb(stats))

    @_rpc
    def ExtendDataset(self, request: pb.ExtendDatasetRequest, context: Any) -> pb.DataState:
        return data_state_pb(self._state.extend_dataset(request.name, request.available, request.closed))
