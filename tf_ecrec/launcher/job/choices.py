"""The closed sets of the launcher's flags, as enums whose values are the flags' spellings.

`tf_ecrec.cli` offers the values as argparse choices; `tf_ecrec.launcher.job.spec.JobSpec` holds
members (a spelling from the command line or job.json becomes one, an unknown one is refused).
"""

from __future__ import annotations

import enum


def values(kind: type[enum.Enum]) -> list[str]:
    """The flag spellings of `kind`, in declaration order (argparse's ``choices``)."""
    return [m.value for m in kind]


class FaultTolerance(str, enum.Enum):
    """``--fault-tolerance``: what protects the tables (the value is the flag's spelling)."""

    NONE = "none"
    CHECKPOINT = "checkpoint"
    ECREC = "ecrec"
    FLASH = "flash"  # flash checkpoints on their own (tf_ecrec.flash.stock): no erasure coding

    @property
    def ours(self) -> bool:
        """Recovery is tf_ecrec's (ecrec, flash): its ops run on the PS, its session creation decides
        what to restore and reports it, flash checkpoints may be taken."""
        return self in (FaultTolerance.ECREC, FaultTolerance.FLASH)


class Strategy(str, enum.Enum):
    """``--strategy``: how the job trains: Estimator sessions, or TF2 ParameterServerStrategy with Keras fit."""

    ESTIMATOR = "estimator"
    PSS = "pss"


class Storage(str, enum.Enum):
    """``--storage``: how the embedding tables are stored."""

    PARTITIONED = "partitioned"
    COLLECTION = "collection"


class RestartAt(str, enum.Enum):
    """``--restart-at``: where a killed PS comes back."""

    SAME = "same"
    NEW_PORT = "new-port"


class Optimizer(str, enum.Enum):
    """``--optimizer``: the update rule of the built-in models."""

    ADAGRAD = "adagrad"
    SGD = "sgd"
    ADAM = "adam"
    FTRL = "ftrl"
    MOMENTUM = "momentum"
    RMSPROP = "rmsprop"


class OnCorrupt(str, enum.Enum):
    """``--on-corrupt``: what a corrupt Criteo line does."""

    SKIP = "skip"
    FAIL = "fail"
