"""Install tf_ecrec, compiling its TensorFlow ops against the installed TensorFlow.

The ops are built from ``ops/`` with TensorFlow's own compile and link flags
(``tf.sysconfig``), so TensorFlow must be installed first and the build must
see it: install with ``pip install --no-build-isolation .`` (or ``-e .``).
The wheel is platform-specific (it carries ``tf_ecrec/ops/_ec_ops.so``).

Layout: ``tf_ecrec/`` is the package; the top-level ``hooks/`` directory is
installed as ``tf_ecrec.hooks`` and ``estimator_examples/`` as
``tf_ecrec.examples``.
"""

import importlib.util
import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def _version() -> str:
    scope: dict = {}
    with open(os.path.join(HERE, "tf_ecrec", "version.py"), encoding="utf-8") as fh:
        exec(fh.read(), scope)
    return scope["__version__"]


class BuildPyWithOps(build_py):
    """Compiles the op library into tf_ecrec/ops/ before the Python files are copied."""

    def run(self) -> None:
        spec = importlib.util.spec_from_file_location("_tf_ecrec_ops_build", os.path.join(HERE, "ops", "build.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.build(os.path.join(HERE, "tf_ecrec", "ops"))
        super().run()


class BinaryDistribution(Distribution):
    """The wheel carries a compiled library: tag it for the platform."""

    def has_ext_modules(self) -> bool:
        return True


setup(
    name="tf_ecrec",
    version=_version(),
    description="Erasure-coded fault tolerance for TensorFlow Estimator parameter-server training",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["tf_ecrec", "tf_ecrec.*"]) + ["tf_ecrec.hooks", "tf_ecrec.examples"],
    package_dir={"tf_ecrec.hooks": "hooks", "tf_ecrec.examples": "estimator_examples"},
    package_data={
        "tf_ecrec.ops": ["_ec_ops.so"],
        "tf_ecrec.master": ["proto/*.proto"],
        "tf_ecrec.examples": ["data/*.tsv"],
    },
    install_requires=[
        "tensorflow==2.15.1",  # not tensorflow-cpu: tensorflow-recommenders requires this distribution
        "tensorflow-estimator==2.15.0",
        "tensorflow-recommenders==0.7.3",
        "grpcio>=1.60,<2",
        "protobuf>=4.21,<5",
        "pyeclib==1.8.0",
        "kazoo==2.11.0",
        "numpy<2",
        "tqdm",
        "matplotlib",
    ],
    extras_require={"test": ["pytest>=7", "grpcio-tools==1.62.3", "redis==5.0.8"], "redis": ["redis==5.0.8"]},
    entry_points={"console_scripts": ["tf-ecrec = tf_ecrec.cli:main"]},
    cmdclass={"build_py": BuildPyWithOps},
    distclass=BinaryDistribution,
    zip_safe=False,
)
