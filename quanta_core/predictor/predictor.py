"""Online output-length prediction: what is known at arrival, and what finished requests taught.

Each finished choice's output length goes into sliding windows (``LengthWindow``) under keys
from the most specific to the most general:

    1  key|prefix|max_tokens     the same API key and system prompt, same max_tokens
    2  key|class|max_tokens|p    the same API key, class, max_tokens and prompt-length bucket
    3  tenant|max_tokens
    4  tenant
    5  max_tokens                 every tenant
    6  global

A prediction reads the first key whose window holds at least ``min_samples`` lengths above
what the choice already generated, and gives quantiles of the *remaining* length from them
(``LengthWindow.remaining``); so the projection of a running request refines itself each step
(a request that outlived the short answers is projected from the long ones). Nothing learned
yet, or the request outlived every length seen: ``max_tokens`` minus what it generated, the
one bound that always holds. ``ignore_eos`` is known at arrival: such a choice runs to
``max_tokens`` exactly. Every answer is clamped to ``[1, max_tokens - generated]``.

State: the windows, saved as a small JSON document (``to_json`` / ``from_json``, ``save`` /
``load``); at most ``max_keys`` keys, the least recently updated dropped first.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quanta_core.predictor.window import LengthWindow

if TYPE_CHECKING:  # the scheduler package imports this one
    from quanta_core.scheduler.choice import Choice

_VERSION = 1


@dataclass(frozen=True, slots=True)
class Prediction:
    """Remaining output tokens of a choice: its median and 90th percentile, and the level of
    the key they came from (1..6, 0: the ``max_tokens`` bound)."""

    p50: int
    p90: int
    level: int


def length_keys(r: Choice) -> tuple[str, ...]:
    """The keys of ``r``'s windows, most specific first (see the module's table)."""
    who = r.key_id or r.tenant
    mt = r.max_tokens
    bucket = r.prompt_len.bit_length()  # powers of two: 64..127 tokens is bucket 7
    keys = [] if r.prefix_hash is None else [f"1|{who}|{r.prefix_hash}|{mt}"]
    keys += [f"2|{who}|{r.slo_class.value}|{mt}|{bucket}", f"3|{r.tenant}|{mt}"]
    keys += [f"4|{r.tenant}", f"5|{mt}", "6"]
    return tuple(keys)


class LengthPredictor:
    def __init__(self, window: int = 256, min_samples: int = 8, max_keys: int = 4096) -> None:
        if min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, not {min_samples}")
        self.window = window
        self.min_samples = min_samples
        self.max_keys = max_keys
        self._windows: OrderedDict[str, LengthWindow] = OrderedDict()
        self.observed = 0

    def __len__(self) -> int:
        return len(self._windows)

    def _keys(self, r: Choice) -> tuple[str, ...]:
        if not r.length_keys:
            r.length_keys = length_keys(r)
        return r.length_keys

    def remaining(self, r: Choice, q: float, ahead: int = 0) -> int:
        """The ``q``-quantile of the tokens ``r`` will still generate (at least 1); with
        ``ahead``, once it has generated that many more (what the same state will say
        then: the simulator's steady runs look ahead with it)."""
        return self._remaining(r, q, ahead)[0]

    def _remaining(self, r: Choice, q: float, ahead: int = 0) -> tuple[int, int]:
        generated = r.num_output + ahead
        bound = max(r.max_tokens - generated, 1)
        if r.sampling.ignore_eos:
            return bound, 0
        windows, need = self._windows, self.min_samples
        for key in self._keys(r):
            w = windows.get(key)
            if w is not None and w.count_above(generated) >= need:
                rem = w.remaining(generated, q)
                assert rem is not None
                return min(max(rem, 1), bound), int(key[0])
        return bound, 0

    def predict(self, r: Choice) -> Prediction:
        p50, level = self._remaining(r, 0.5)
        return Prediction(p50, self._remaining(r, 0.9)[0], level)

    def observe(self, r: Choice, length: int | None = None) -> None:
        """``r`` ended having generated ``length`` tokens (default: its count so far, the
        end-of-generation token included)."""
        n = r.num_output + r.eog_tokens if length is None else length
        for key in self._keys(r):
            self._add(key, n)
        self.observed += 1

    def _add(self, key: str, length: int) -> None:
        w = self._windows.get(key)
        if w is None:
            w = self._windows[key] = LengthWindow(self.window)
            while len(self._windows) > self.max_keys:
                self._windows.popitem(last=False)
        else:
            self._windows.move_to_end(key)
        w.add(length)

    def global_mean(self) -> float:
        w = self._windows.get("6")
        return w.mean() if w is not None else 0.0

    # ---- state ----

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _VERSION,
            "window": self.window,
            "observed": self.observed,
            "keys": {k: w.values() for k, w in self._windows.items()},
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any], min_samples: int = 8) -> LengthPredictor:
        if doc.get("version") != _VERSION:
            raise ValueError(f"predictor state version {doc.get('version')!r}, not {_VERSION}")
        p = cls(window=int(doc["window"]), min_samples=min_samples)
        for key, values in doc["keys"].items():
            w = p._windows[str(key)] = LengthWindow(p.window)
            for v in values:
                w.add(int(v))
        p.observed = int(doc.get("observed", 0))
        return p

    def save(self, path: Path) -> None:
        """Write the state atomically (a crash mid-write leaves the old file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), separators=(",", ":")))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> LengthPredictor:
        """The saved state, or an empty predictor when there is none (a first start)."""
        if not path.exists():
            return cls()
        return cls.from_json(json.loads(path.read_text()))
