"""Stop strings: text is released only once it cannot be the start of a stop string.

    generated so far:   ...the answer is 4<|   (stop = "<|end|>")
    released:           ...the answer is 4
    held back:                            <|   (a prefix of "<|end|>")

A stop string may arrive split over any number of tokens, so the tail that is still a prefix
of some stop string is held until the next text decides it. The stop string itself is never
released.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class StopMatcher:
    stops: Sequence[str]
    _held: str = ""
    stopped: bool = field(default=False, init=False)

    def push(self, text: str) -> str:
        """The text that can be released now; after a match, ``stopped`` is set."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buffer = self._held + text
        cut = _earliest_match(buffer, self.stops)
        if cut is not None:
            self._held = ""
            self.stopped = True
            return buffer[:cut]
        keep = _longest_prefix_tail(buffer, self.stops)
        self._held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """At the end of generation without a match, whatever was held back is released."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    @property
    def held(self) -> str:
        return self._held


def _earliest_match(text: str, stops: Sequence[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _longest_prefix_tail(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
