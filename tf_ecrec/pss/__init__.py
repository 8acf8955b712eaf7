"""Erasure-coded tables under TF2 `tf.distribute.experimental.ParameterServerStrategy` (docs/pss.md).

`protect` a strategy, build the model's tables with `tf_ecrec.keras.ECEmbeddings`
in its scope, compile with `PSSProtection.optimizer`, and train with
``model.fit`` or a `ClusterCoordinator` loop.
"""

import os
from typing import Any

from tf_ecrec.pss.anchors import PSPlacement
from tf_ecrec.pss.fit import FitResult, fit
from tf_ecrec.pss.partitioner import ECPartitioner
from tf_ecrec.pss.protection import PSSProtection, current_protection, protect
from tf_ecrec.pss.recovery import PSSRecovery, PSSRecoveryResult, is_ps_failure

WAIT_SECS = 300.0
"""How long `prepare_process` waits by default for the tasks TF_CONFIG names to serve."""


def prepare_process(wait_secs: float = WAIT_SECS) -> float:
    """Readies this process to coordinate: the op library loaded, gRPC channels that reconnect fast, and,
    when TF_CONFIG is set, every PS and worker it names serving; returns the seconds that wait took.

    Call it before making the strategy: TensorFlow reads its gRPC options
    when it makes its first channel, and a channel to a restarted PS would
    otherwise wait out gRPC's 20 s connection backoff.  Those options make a
    call to a task that is not up fail at once, which the strategy's
    connection to the cluster does not survive (the process aborts inside
    gRPC): so the tasks are awaited here first, whatever order they start in,
    the ones still missing logged every 10 s.

    Raises:
      ClusterUnavailable: a task TF_CONFIG names did not answer within `wait_secs`
        (the message names it and its address).
    """
    from tf_ecrec.cluster.ps_session import fast_reconnect, wait_until_serving
    from tf_ecrec.cluster.tf_config import ClusterConfig
    from tf_ecrec.ops import load_library

    fast_reconnect()
    load_library()
    if not os.environ.get("TF_CONFIG"):
        return 0.0
    config = ClusterConfig.from_environment()
    tasks = {f"{job}:{i}": address for job in ("ps", "worker") for i, address in enumerate(config.cluster.get(job, ()))
             if (job, i) != (config.task_type, config.task_index)}
    return wait_until_serving(tasks, float(wait_secs), "TF_CONFIG (tf_ecrec.pss.prepare_process)")


def start_server(resolver: Any = None) -> Any:
    """Starts this process's PS or worker task of a protected job and returns its ``tf.distribute.Server``
    (call ``join()`` on it): the op library loaded (the step runs tf_ecrec ops on every task) and gRPC
    channels that reconnect fast (a PS moves deltas to the other PS, and one restarted must be reached again
    at once).  The task is `resolver`'s (default: ``TFConfigClusterResolver``, from TF_CONFIG)."""
    import tensorflow as tf

    from tf_ecrec.cluster.ps_session import fast_reconnect
    from tf_ecrec.ops import load_library

    fast_reconnect()  # before the server makes its first channel
    load_library()
    resolver = resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
                                protocol=resolver.rpc_layer or "grpc", start=True)


def check_parity(model: Any) -> dict[str, Any]:
    """Reads every table, slot, parity and replica of `model` (compiled with its protection's optimizer; call it
    when no step is in flight, after `fit`) and checks each parity chunk and replica against the data it encodes
    (`tf_ecrec.check.verify.check_parity`): ``mismatches`` and ``replica_mismatches`` are 0 when they are exact."""
    from tf_ecrec.check.verify import check_parity as check
    from tf_ecrec.errors import ConfigError
    from tf_ecrec.pss.keras_optimizer import protected_optimizer, protected_values

    with model.distribute_strategy.scope():
        protection = current_protection()
    if protection is None:
        raise ConfigError("the model's strategy is not protected by tf_ecrec.pss.protect; source: tf_ecrec.pss.check_parity")
    return check(protected_optimizer(model, protection).describe(), protected_values(model))


__all__ = [
    "ECPartitioner", "FitResult", "PSPlacement", "PSSProtection", "PSSRecovery", "PSSRecoveryResult",
    "check_parity", "current_protection", "fit", "is_ps_failure", "prepare_process", "protect", "start_server",
]
