"""Erasure-coded tables under TF2 `tf.distribute.experimental.ParameterServerStrategy` (docs/pss.md).

`protect` a strategy, build the model's tables with `tf_ecrec.keras.ECEmbeddings`
in its scope, compile with `PSSProtection.optimizer`, and train with
``model.fit`` or a `ClusterCoordinator` loop.
"""

from tf_ecrec.pss.partitioner import ECPartitioner
from tf_ecrec.pss.placement import PSPlacement
from tf_ecrec.pss.protection import PSSProtection, current_protection, protect

__all__ = ["ECPartitioner", "PSPlacement", "PSSProtection", "current_protection", "protect"]
