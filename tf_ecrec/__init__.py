"""tf_ecrec: erasure-coded fault tolerance for TensorFlow Estimator PS training.

The public API (imported lazily: ``import tf_ecrec`` alone does not import
TensorFlow)::

    tf_ecrec.ECConfig(k, r)                     the code
    tf_ecrec.ec_model_fn(model_fn, ec)          turn protection on for a model_fn
    tf_ecrec.EmbeddingCollection(name, tables, dim)   protected tables, inside the model_fn
    tf_ecrec.ECOptimizer(optimizer)             updates that keep parity and replicas exact
    tf_ecrec.ECDeviceFn()                       RunConfig device_fn placing storage per the layout
    tf_ecrec.EmbeddingTable(name, shape)        one protected table of any width, 1-D included
    tf_ecrec.train_and_evaluate(estimator, train_spec, eval_spec, ec=...)
    tf_ecrec.train(estimator, input_fn, ec=...) a user's Estimator protected, under any TF_CONFIG launcher
    tf_ecrec.offline_estimator(estimator)       the trained model outside the cluster: predict, export_saved_model
    tf_ecrec.feature_column.embedding_column(categorical_column, dim)   a protected table for canned estimators

Importing ``tf_ecrec`` in a process that has imported TensorFlow loads the
compiled op library (checked against the installed TensorFlow): a parameter
server whose script imports ``tf_ecrec`` after ``tensorflow`` serves the
kernels with no further call.  Without TensorFlow in the process nothing is
loaded (the first op built, or ``tf_ecrec.ops.load_library()``, does it).
"""

import sys
from typing import Any

from tf_ecrec.erasure.code import ECConfig
from tf_ecrec.errors import EcRecError
from tf_ecrec.version import __version__

_LAZY = {
    "ec_model_fn": ("tf_ecrec.estimator.model_fn", "ec_model_fn"),
    "EmbeddingCollection": ("tf_ecrec.step.embedding", "EmbeddingCollection"),
    "ECOptimizer": ("tf_ecrec.step.optimizer", "ECOptimizer"),
    "ECDeviceFn": ("tf_ecrec.layout.device", "ECDeviceFn"),
    "EmbeddingTable": ("tf_ecrec.step.embedding_table", "EmbeddingTable"),
    "train": ("tf_ecrec.estimator.job", "train"),
    "train_and_evaluate": ("tf_ecrec.estimator.job", "train_and_evaluate"),
    "offline_estimator": ("tf_ecrec.estimator.offline", "offline_estimator"),
}

__all__ = ["ECConfig", "EcRecError", "__version__", *_LAZY]

if "tensorflow" in sys.modules:  # a TensorFlow process (a user's PS too) serves the kernels from its import on
    from tf_ecrec.ops.loader import load_if_tensorflow

    load_if_tensorflow()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'tf_ecrec' has no attribute {name!r}")
