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
from collections.abc import Callable
from typing import TYPE_CHECKING

import tensorflow as tf

from tf_ecrec.errors import RecoveryError
from tf_ecrec.layout.device import variable_name

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


def checkpoint_step(recovery: PSSRecovery, path: str) -> int:
    """The iteration count the checkpoint at `path` holds."""
    key = next(k for k, v in named_variables(recovery).items() if v is recovery.optimizer.iterations)
    return int(tf.train.load_checkpoint(path).get_tensor(f"{key}/.ATTRIBUTES/VARIABLE_VALUE"))


def fall_back(recovery: PSSRecovery, lost: list[int], checkpoint: str | None, result: PSSRecoveryResult,
              started: float, error: RecoveryError) -> PSSRecoveryResult:
    """A loss beyond the code: restores the newest of the flash snapshot complete on every PS
    (`recovery.flash`, `tf_ecrec.pss.flash`) and the `checkpoint` (the snapshot when of the same step), or
    raises `error` when there is neither."""
    flash = recovery.flash
    choice = flash.latest() if flash is not None else None
    if choice is not None and checkpoint is not None and checkpoint_step(recovery, checkpoint) > choice.global_step:
        choice = None
    if choice is None and checkpoint is None:
        raise error
    recovery.unfinished = set(lost)
    if choice is not None:
        what, method = f"the flash snapshot of step {choice.global_step}", choice.method
        restored = restore(recovery, lost, lambda: flash.restore(choice), method, result, started)
    else:
        what, method = f"the checkpoint {checkpoint}", "checkpoint"
        def read() -> int:
            tf.train.Checkpoint(**named_variables(recovery)).read(checkpoint).assert_existing_objects_matched()
            return 0

        restored = restore(recovery, lost, read, method, result, started)
    recovery.unfinished = set()
    _LOG.warning("PS %s lost beyond the code: restored %s (step %d, method %s) in %.1fs", lost, what, restored.step,
                 method, restored.seconds)
    return restored


def restore(recovery: PSSRecovery, lost: list[int], read: Callable[[], int], method: str,
            result: PSSRecoveryResult, started: float) -> PSSRecoveryResult:
    """Re-creates the lost PS's variables, then `read` assigns every variable (survivors' too: all of one step)
    and returns the bytes it read from a flash snapshot (0 from a checkpoint)."""
    alive = [p for p in range(recovery.protection.num_ps) if p not in lost]
    settle = recovery.reconciler()
    recovery.raise_generation(settle, alive)
    discarded = settle.built.discard(settle, alive)
    replaced = recovery.replace_lost(lost)
    result.bytes_rebuilt = read()
    recovery.resume()
    result.method = method
    result.variables_rebuilt = len(replaced)
    result.step = int(recovery.optimizer.iterations.numpy())
    result.settled = {"undone": 0, "finished": 0, "committed": 0, "discarded": discarded}
    result.seconds = time.monotonic() - started
    return result


def adopt_restored_values(recovery: PSSRecovery) -> int:
    """After every variable was read from a backup behind the protocol's back (a restarted coordinator's
    ``BackupAndRestore``, `tf_ecrec.pss.backup`): the logs' pending steps discarded (they describe a state that
    is gone), the generation raised on every PS (a step of the old one is refused), the step retraced.
    Returns how many pending steps were discarded."""
    alive = list(range(recovery.protection.num_ps))
    settle = recovery.reconciler()
    recovery.protection.generation = recovery.raise_generation(settle, alive)  # for an optimizer built after
    discarded = settle.built.discard(settle, alive)
    recovery.resume()
    return discarded
