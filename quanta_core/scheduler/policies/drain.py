"""How fast a class's backlog is really served: admission's check on its own projection.

The step-cost projection plays the requests ahead of a batch arrival onto the running slots
as if batch kept them. Under sustained load interactive arrivals keep overtaking and
preempting batch (as they should), so batch is served slower than projected, and the
projection alone admits batch work that cannot end by its deadline. ``BacklogDrain``
measures the rate instead: the class's tokens computed per second (prompt and output) over
the last ``window_s`` of an unbroken backlog (its queue not empty at any cycle's start).

    backlog:  ──┬──────────────────────────────── now
                since   ▮ ▮▮  ▮ ▮▮▮ ▮  ▮▮ ▮       rate = tokens / (now - max(since, now - window))

Until the backlog is ``min_span_s`` old there is no rate: a burst reaching a calm machine is
projected as before (and served in the order it came, so a refusal would buy nothing).
"""

from __future__ import annotations

from collections import deque

WINDOW_S = 10.0
MIN_SPAN_S = 2.0  # a few steps' worth: shorter says too little about the rate


class BacklogDrain:
    def __init__(self, window_s: float = WINDOW_S, min_span_s: float = MIN_SPAN_S) -> None:
        self.window_s = window_s
        self.min_span_s = min_span_s
        self._since: float | None = None  # when the current backlog began
        self._served: deque[tuple[float, int]] = deque()  # (step's end, the class's tokens)
        self._tokens = 0  # the sum over ``_served``

    @property
    def backlogged(self) -> bool:
        return self._since is not None

    def note(self, now: float, backlogged: bool) -> None:
        """The class's queue at a cycle's start: ``backlogged`` if anything waits."""
        if not backlogged:
            self._since = None
            self._served.clear()
            self._tokens = 0
        elif self._since is None:
            self._since = now

    def served(self, at: float, n_tokens: int) -> None:
        """A step that ended at ``at`` computed ``n_tokens`` of the class's tokens."""
        if self._since is not None and n_tokens > 0:
            self._served.append((at, n_tokens))
            self._tokens += n_tokens

    def seconds_for(self, n_tokens: int, now: float) -> float | None:
        """Seconds the class takes to be served ``n_tokens`` more at the measured rate; None
        while the backlog is too young to say."""
        if self._since is None:
            return None
        start = max(self._since, now - self.window_s)
        while self._served and self._served[0][0] < start:
            self._tokens -= self._served.popleft()[1]
        span = now - start
        if now - self._since < self.min_span_s:
            return None
        return n_tokens * span / max(self._tokens, 1)
