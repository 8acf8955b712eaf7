"""What the master's server and its clients agree on beyond ``master.proto``.

The metadata keys of a call (the job token, the error class a failed call
names) and the translation of task and shard statuses to and from the
protobuf enums.
Both :mod:`~tf_ecrec.master.servicer` (and the server's token check) and
:mod:`~tf_ecrec.master.client` import this module; neither imports the other.
"""

from __future__ import annotations

from tf_ecrec import errors
from tf_ecrec.master.proto import master_pb2 as pb
from tf_ecrec.master.sharding import ShardStatus
from tf_ecrec.master.state.tasks import TaskStatus

TOKEN_KEY = "x-tf-ecrec-token"  # Request metadata: the job token.
ERROR_KEY = "tf-ecrec-error"    # Trailing metadata: the tf_ecrec error class of a failure.

# Errors the server may name under ERROR_KEY, by class name.
NAMED_ERRORS: dict[str, type[errors.EcRecError]] = {cls.__name__: cls for cls in (
    errors.InvalidRequestError, errors.NotFoundError, errors.StaleGenerationError,
    errors.MembershipLost, errors.BarrierTimeout, errors.AuthenticationError,
    errors.MasterUnavailable, errors.MasterError)}

_TASK_STATUS_PB = {TaskStatus.ALIVE: pb.ALIVE, TaskStatus.LOST: pb.LOST,
                   TaskStatus.LEFT: pb.LEFT}
_TASK_STATUS_OF_PB: dict[int, TaskStatus] = {code: status for status, code in _TASK_STATUS_PB.items()}
_SHARD_STATUS_PB = {ShardStatus.SHARD: pb.GetShardResponse.SHARD,
                    ShardStatus.WAIT: pb.GetShardResponse.WAIT,
                    ShardStatus.END: pb.GetShardResponse.END,
                    ShardStatus.DRAIN: pb.GetShardResponse.DRAIN}
_SHARD_STATUS_OF_PB: dict[int, ShardStatus] = {code: status for status, code in _SHARD_STATUS_PB.items()}


def task_status_pb(status: TaskStatus) -> pb.TaskStatus:
    """The protobuf ``TaskStatus`` of a task's status."""
    return _TASK_STATUS_PB[status]


def task_status_of_pb(code: int) -> TaskStatus:
    """The status of a protobuf ``TaskStatus``; UNKNOWN for one this side does not know."""
    return _TASK_STATUS_OF_PB.get(code, TaskStatus.UNKNOWN)


def shard_status_pb(status: ShardStatus) -> pb.GetShardResponse.Status:
    """The protobuf ``GetShardResponse.Status`` of a shard request's outcome."""
    return _SHARD_STATUS_PB[status]


def shard_status_of_pb(code: int) -> ShardStatus:
    """The outcome of a shard request; WAIT (ask again) for a code this side does not know."""
    return _SHARD_STATUS_OF_PB.get(code, ShardStatus.WAIT)
