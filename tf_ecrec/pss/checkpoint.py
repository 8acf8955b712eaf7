"""The checkpoint a TF2 job falls back to when a loss is beyond its code.

`save` writes every variable of the model and its protection (data, slots,
parity, replicas, dense weights, the iteration count) by name, with
``tf.train.Checkpoint``; `tf_ecrec.pss.fit` calls it between ``model.fit``
calls, when no step is in flight, so parity in the checkpoint is the code
of the data in it.  `restore` is what `PSSRecovery.recover` does with one
when more PS were lost than the code covers: the lost PS's variables are
re-created (as for a rebuild), every variable is read back from the
checkpoint (the survivors' too, so that all of them are of one step),
the delta logs' pending steps are discarded (they describe a state that is
gone) and the generation raised; training goes on from the checkpoint's
step, the steps since it rolled back.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING

import tensorflow as tf

from tf_ecrec.device import variable_name

if TYPE_CHECKING:
    from tf_ecrec.pss.recovery import PSSRecovery, PSSRecoveryResult

_LOG = logging.getLogger(__name__)


def named_variables(recovery: PSSRecovery) -> dict[str, tf.Variable]:
    """The variables a checkpoint holds, by a key made of each one's name (the current objects)."""
    opt = recovery.optimizer
    variables = [*recovery.model.variables, *opt.protection_variables(), opt.iterations]
    out: dict[str, tf.Variable] = {}
    seen: set[int] = set()
    for v in variables:
        if id(v) in seen:
            continue
        seen.add(id(v))
        key = re.sub(r"[^A-Za-z0-9_]", "_", variable_name(v))
        while key in out:  # two variables of one name: the later one gets a suffix, in a stable order
            key += "_"
        out[key] = v
    return out


def save(recovery: PSSRecovery, prefix: str) -> str:
    """Writes the checkpoint (call it when no step is in flight); returns its path."""
    return str(tf.train.Checkpoint(**named_variables(recovery)).write(prefix))


def restore(recovery: PSSRecovery, lost: list[int], path: str, result: PSSRecoveryResult, started: float) -> PSSRecoveryResult:
    """Re-creates the lost PS's variables and reads every variable from the checkpoint at `path`."""
    alive = [p for p in range(recovery.protection.num_ps) if p not in lost]
    settle = recovery._reconciler()
    recovery.raise_generation(settle, alive)
    discarded = settle.built.discard(settle, alive)
    replaced = recovery._replace(lost)
    tf.train.Checkpoint(**named_variables(recovery)).read(path).assert_existing_objects_matched()
    recovery._resume()
    result.method = "checkpoint"
    result.variables_rebuilt = len(replaced)
    result.step = int(recovery.optimizer.iterations.numpy())
    result.settled = {"undone": 0, "finished": 0, "committed": 0, "discarded": discarded}
    result.seconds = time.monotonic() - started
    _LOG.warning("PS %s lost beyond the code: restored the checkpoint %s (step %d) in %.1fs", lost, path, result.step,
                 result.seconds)
    return result


def adopt_restored_values(recovery: PSSRecovery) -> int:
    """After every variable was read from a backup behind the protocol's back (a restarted coordinator's
    ``BackupAndRestore``, `tf_ecrec.pss.backup`): the logs' pending steps discarded (they describe a state that
    is gone), the generation raised on every PS (a step of the old one is refused), the step retraced.
    Returns how many pending steps were discarded."""
    alive = list(range(recovery.protection.num_ps))
    settle = recovery._reconciler()
    recovery.protection.generation = recovery.raise_generation(settle, alive)  # for an optimizer built after
    discarded = settle.built.discard(settle, alive)
    recovery._resume()
    return discarded
