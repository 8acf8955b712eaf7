"""The model a launched job trains: a built-in example or a user's module (``--model my_pkg.my_model``)."""

from __future__ import annotations

import importlib
from typing import Any

from tf_ecrec.data.schema import NUM_CAT
from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.job.spec import JobSpec

# The models a job may train, by import path: the launcher imports them only by name (importlib),
# never statically (tf_ecrec.examples exists only when the package is installed).
MODEL_MODULES = {"dlrm": "tf_ecrec.examples.dlrm", "dcn": "tf_ecrec.examples.dcn",
                 "keras_dlrm": "tf_ecrec.examples.keras_dlrm", "wide_deep_canned": "tf_ecrec.examples.wide_deep_canned"}


def load_model(name: str, keras: bool = False) -> Any:
    """The model module of ``--model``: a built-in name, or a user's module by import path.

    The contract of a model module (the built-in ``tf_ecrec.examples.dlrm`` follows it):

    - ``model_fn(features, labels, mode, params, config)``: an Estimator
      model_fn.  ``features`` is ``{"dense": float32 [batch, 13], "cat":
      int64 [batch, 26]}`` (the Criteo layout of ``--data``), ``labels``
      float32 [batch]; with ``--tables N`` the model's ``table_sizes`` has N
      sizes and categorical i < N is hashed into ``table_sizes[i]`` rows (the
      rest are 0: `data_sizes`), so a model reads ``cat[:, :len(table_sizes)]``.
      Under ``--fault-tolerance ecrec``, ``params["ec"]`` is True and the
      model must build its tables with `tf_ecrec.EmbeddingTable` or
      `tf_ecrec.EmbeddingCollection` and wrap its optimizer in
      `tf_ecrec.ECOptimizer` (the launcher wraps the model_fn with
      `tf_ecrec.ec_model_fn`, which refuses a model that does not);
    - ``default_params(**flags)`` (optional): the params, given the flags
      ``table_sizes`` (``--tables`` sizes, 26 by default), ``embedding_dim``, ``bottom_mlp``,
      ``optimizer``, ``learning_rate``, ``storage``, ``storage_code``;
      without it the params are those flags.

    Under ``--strategy pss`` (`keras`), ``keras_model(params)`` replaces
    ``model_fn``: an uncompiled Keras model over those features, its tables
    `tf_ecrec.keras.ECEmbeddings` (the built-in ``tf_ecrec.examples.keras_dlrm``
    follows it; `tf_ecrec.launcher.task.pss_job` compiles and trains it).

    Raises:
      ConfigError: the module cannot be imported or breaks the contract.
    """
    path = MODEL_MODULES.get(name, name)
    try:
        module = importlib.import_module(path)
    except ImportError as exc:
        raise ConfigError(f"--model {name!r}: cannot import module {path!r} ({exc}); rule: a built-in model "
                          f"({', '.join(MODEL_MODULES)}) or a module on PYTHONPATH; source: --model") from exc
    if keras:
        if not callable(getattr(module, "keras_model", None)):
            raise ConfigError(f"--model {name!r}: module {path!r} has no callable keras_model; rule: a model module for "
                              "--strategy pss defines keras_model(params); source: --model")
    elif not callable(getattr(module, "model_fn", None)):
        raise ConfigError(f"--model {name!r}: module {path!r} has no callable model_fn; rule: a model module defines "
                          "model_fn(features, labels, mode, params, config); source: --model")
    if hasattr(module, "default_params") and not callable(module.default_params):
        raise ConfigError(f"--model {name!r}: {path}.default_params is not callable; source: --model")
    return module


def model_params(job: JobSpec, module: Any) -> dict[str, Any]:
    d = job.embedding_dim
    flags = {
        "table_sizes": [job.table_rows] * job.tables,
        "embedding_dim": d,
        "bottom_mlp": [64, d],
        "optimizer": job.optimizer.value,
        "learning_rate": job.learning_rate,
        "storage": job.table_storage.value,
        "storage_code": job.ec,
    }
    if not hasattr(module, "default_params"):
        return flags
    params = dict(module.default_params(**flags))
    if len(params.get("table_sizes", ())) != job.tables:
        raise ConfigError(f"--model {job.model!r}: default_params returned table_sizes={params.get('table_sizes')!r}; "
                          f"rule: {job.tables} sizes (--tables), one per Criteo categorical it reads; source: the model module")
    return params


def data_sizes(params: dict[str, Any]) -> list[int]:
    """The rows the data hashes each of its 26 categoricals into: the model's ``table_sizes`` for the first
    ``len(table_sizes)`` (``--tables``), 1 for the rest (all ids 0: columns no table reads)."""
    sizes = [int(n) for n in params["table_sizes"]]
    return sizes + [1] * (NUM_CAT - len(sizes))
