"""Token-length distributions for prompts and answers.

In a workload file a length is a number (fixed) or a table:

    prompt = 64
    prompt = { dist = "uniform", min = 32, max = 256 }
    output = { dist = "normal", mean = 128, std = 32, min = 8, max = 512 }
    output = { dist = "lognormal", mean = 128, std = 64, max = 1024 }
    output = { dist = "exponential", mean = 100, min = 1, max = 1024 }

``mean`` and ``std`` are of the length itself, not of its logarithm. Samples are rounded and
clipped to [min, max] (min defaults to 1).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class DistKind(StrEnum):
    FIXED = "fixed"
    UNIFORM = "uniform"
    NORMAL = "normal"
    LOGNORMAL = "lognormal"
    EXPONENTIAL = "exponential"


@dataclass(frozen=True, slots=True)
class LengthDist:
    kind: DistKind = DistKind.FIXED
    mean: float = 128.0
    std: float = 0.0
    min: int = 1
    max: int | None = None

    def sample(self, rng: random.Random) -> int:
        match self.kind:
            case DistKind.FIXED:
                x = self.mean
            case DistKind.UNIFORM:
                x = rng.randint(self.min, self.max if self.max is not None else self.min)
            case DistKind.NORMAL:
                x = rng.gauss(self.mean, self.std)
            case DistKind.LOGNORMAL:
                sigma2 = math.log(1.0 + (self.std / self.mean) ** 2)
                x = rng.lognormvariate(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2))
            case DistKind.EXPONENTIAL:
                x = rng.expovariate(1.0 / self.mean)
        n = max(self.min, round(x))
        return n if self.max is None else min(self.max, n)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dist": self.kind.value,
            "mean": self.mean,
            "std": self.std,
            "min": self.min,
            "max": self.max,
        }


def fixed(n: int) -> LengthDist:
    return LengthDist(DistKind.FIXED, mean=float(n), min=n, max=n)


def parse_length(value: int | float | dict[str, Any]) -> LengthDist:
    if isinstance(value, int | float):
        return fixed(int(value))
    kind = DistKind(value.get("dist", "fixed"))
    lo = int(value.get("min", 1))
    hi = value.get("max")
    if kind is DistKind.UNIFORM:
        if hi is None:
            raise ValueError("a uniform length needs min and max")
        mean = (lo + int(hi)) / 2
    else:
        mean = float(value.get("mean", value.get("value", lo)))
    if kind is DistKind.FIXED:
        return fixed(int(mean))
    if mean <= 0:
        raise ValueError("a length's mean must be positive")
    return LengthDist(kind, mean, float(value.get("std", 0.0)), lo, None if hi is None else int(hi))
