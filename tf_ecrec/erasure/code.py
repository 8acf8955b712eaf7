"""`ECConfig`: the erasure code protecting a job, as a value.

``ECConfig(k=2, r=1)`` stripes every protected table over ``k`` data chunks
on ``k`` PS tasks and keeps ``r`` parity chunks on ``r`` other PS tasks; dense
variables and the global step get ``r`` replicas.  A job of ``N`` PS tasks
survives the loss of any ``r`` of them at a memory cost of ``r/k`` of the
protected bytes (plus ``r`` copies of the dense ones).  ``r = 1`` is XOR,
``r >= 2`` Reed-Solomon (see `tf_ecrec.erasure.codec`).

Three values are easy to confuse: `ECConfig` is the job's choice of code
(what the user writes); `tf_ecrec.erasure.codec.Code` is that code's coefficient
matrix (what encodes and decodes, built from an `ECConfig`'s ``k`` and
``r``); `tf_ecrec.cluster.tf_config.ClusterConfig` is the cluster (TF_CONFIG).
"""

from __future__ import annotations

import dataclasses
import re

from tf_ecrec.errors import ConfigError

_SPEC = re.compile(r"^\s*(\d+)\s*\+\s*(\d+)\s*$")


@dataclasses.dataclass(frozen=True)
class ECConfig:
    """k data chunks plus r parity chunks per stripe.

    Attributes:
      k: data chunks per stripe (>= 1).
      r: parity chunks per stripe, the number of PS failures survived (>= 1).
    """

    k: int = 2
    r: int = 1

    def __post_init__(self) -> None:
        for name in ("k", "r"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ECConfig.{name} must be an integer >= 1, got {value!r}; source: ECConfig")

    @classmethod
    def parse(cls, text: str, source: str = "--ec") -> ECConfig:
        """Parses "K+R", e.g. "2+1"."""
        m = _SPEC.match(text or "")
        if not m:
            raise ConfigError(f"erasure code {text!r} is malformed; expected K+R such as 2+1 or 4+2; source: {source}")
        return cls(int(m.group(1)), int(m.group(2)))

    def check_cluster(self, num_ps: int, source: str = "--ps") -> None:
        """Raises ConfigError unless `num_ps` PS tasks can hold a stripe (k + r distinct PS)."""
        if self.k + self.r > num_ps:
            raise ConfigError(
                f"code {self} needs k + r = {self.k + self.r} distinct PS tasks per stripe, "
                f"but the job has {num_ps}; add PS tasks or use a smaller code; source: {source}"
            )

    def __str__(self) -> str:
        return f"{self.k}+{self.r}"


def default_code(num_ps: int) -> ECConfig:
    """The code used when none is given: 1+1 on 2 PS, 2+1 on 3 or more (one PS loss survived).

    2+1 rather than a wider k: the memory overhead is r/k, but a wider stripe
    costs more per step (measured: 4+1 at 0.52x and 2+1 at 0.63x of
    unprotected throughput on 5 PS, docs/benchmarks.md).
    """
    if num_ps < 2:
        raise ConfigError(f"erasure-coded protection needs >= 2 PS tasks, the job has {num_ps}; "
                          "source: TF_CONFIG ps job")
    return ECConfig(1, 1) if num_ps == 2 else ECConfig(2, 1)
