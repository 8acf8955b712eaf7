"""Erasure-coded tables under TF2 `tf.distribute.experimental.ParameterServerStrategy` (docs/pss.md).

`protect` a strategy, build the model's tables with `tf_ecrec.keras.ECEmbeddings`
in its scope, compile with `PSSProtection.optimizer`, and train with
``model.fit`` or a `ClusterCoordinator` loop.
"""

from tf_ecrec.pss.fit import FitResult, fit
from tf_ecrec.pss.partitioner import ECPartitioner
from tf_ecrec.pss.placement import PSPlacement
from tf_ecrec.pss.protection import PSSProtection, current_protection, protect
from tf_ecrec.pss.recovery import PSSRecovery, PSSRecoveryResult, is_ps_failure


def prepare_process() -> None:
    """Readies this process to coordinate: the op library loaded, gRPC channels that reconnect fast.

    Call it before making the strategy: TensorFlow reads its gRPC options
    when it makes its first channel, and a channel to a restarted PS would
    otherwise wait out gRPC's 20 s connection backoff.
    """
    from tf_ecrec.ops import load_library
    from tf_ecrec.ps_session import fast_reconnect

    fast_reconnect()
    load_library()


__all__ = [
    "ECPartitioner", "FitResult", "PSPlacement", "PSSProtection", "PSSRecovery", "PSSRecoveryResult",
    "current_protection", "fit", "is_ps_failure", "prepare_process", "protect",
]
