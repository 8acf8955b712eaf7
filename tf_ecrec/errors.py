"""The one exception family of tf_ecrec.

Every error the package raises on purpose derives from :class:`EcRecError`.
Messages name the offending value, the rule it broke and where the value came
from (a flag, TF_CONFIG, a file and line, a ZooKeeper path), so that the user
can act on them without reading our code.  Errors from TensorFlow, gRPC, kazoo
or the OS are wrapped where they enter our code::

    try:
        spec = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({exc}); source: "
                          "environment variable TF_CONFIG") from exc

Subclasses that also derive from a builtin (``ValueError``, ``TimeoutError``,
``ImportError``) can be caught either way.
"""

from __future__ import annotations


class EcRecError(Exception):
    """Base class of every error raised by tf_ecrec."""


# --- configuration and input -------------------------------------------------


class ConfigError(EcRecError, ValueError):
    """A configuration value breaks a rule (flags, TF_CONFIG, codes, placement)."""


class DataError(EcRecError, ValueError):
    """Training data is malformed (a corrupt record under ``--on-corrupt fail``)."""


class StreamUnavailable(DataError, ConnectionError):
    """A stream's broker did not answer; the records are not known to be bad: read again later."""


class LaunchError(EcRecError):
    """The local cluster launcher could not start or keep running a task."""


# --- custom ops ----------------------------------------------------------------


class OpLibraryError(EcRecError, ImportError):
    """The compiled op library is missing or was built for another TensorFlow."""


class PSKernelsMissing(OpLibraryError):
    """A PS task serves without the op library's kernels (its process never loaded tf_ecrec)."""


# --- erasure coding and recovery -----------------------------------------------


class CodecError(EcRecError, ValueError):
    """Encoding or decoding was asked something the code cannot do."""


class ReconstructionError(EcRecError):
    """More chunks of a stripe are lost than the code's parity can rebuild."""


class ParityMismatchError(EcRecError):
    """A stripe's parity does not equal the code of its data (invariant 1)."""


# --- cluster membership, master and failover -------------------------------------


class MembershipError(EcRecError):
    """Base class of membership (embedded or ZooKeeper) failures."""


class MembershipLost(MembershipError):
    """This task's membership was lost (session expired, declared dead)."""


class MembershipTimeout(MembershipError, TimeoutError):
    """A membership operation did not finish before its deadline."""


class MasterError(EcRecError):
    """The job master rejected a request (bad id, stale generation, bad token)."""


class MasterUnavailable(MasterError, TimeoutError):
    """The job master could not be reached before the deadline."""


class StaleGenerationError(MasterError):
    """A request carried a cluster generation older than the master's."""


class AuthenticationError(MasterError):
    """The shared job token did not match."""


class BarrierTimeout(EcRecError, TimeoutError):
    """Not every expected task reached a barrier before its deadline."""


class ClusterUnavailable(EcRecError, TimeoutError):
    """Tasks a cluster definition names did not answer before a deadline (named in the message)."""


class RecoveryError(EcRecError):
    """Rebuilding a lost parameter server failed."""


class NotFoundError(MasterError, LookupError):
    """The master knows no task, dataset or lease by the name given."""


class InvalidRequestError(MasterError, ValueError):
    """A request to the master is malformed (bad task type, range or count)."""
