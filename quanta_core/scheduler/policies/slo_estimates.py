"""What admission and the promise keeper expect of requests, from the step-cost model.

Output lengths are unknown: a request is expected to produce ``min(max_tokens, E)`` tokens,
E the running mean of finished answers (``expected_output_tokens`` before the first), except
one that ignores end-of-generation: it produces ``max_tokens``.

An interactive prefill runs in ITL-sized chunks beside the interactive streams only: batch
streams yield the step to it (``SloPolicy.defers``), so its chunk is what a step of those
streams leaves under the inter-token target. Under ``quanta`` it runs in full-budget steps
instead, which queued prompts share: each is priced at its tokens' share of such a step.
Everything else (batch, and the slots' release times) is priced beside the busy running set.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence

from quanta_core.requests import SloClass
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.policies.promises import Job, Slots
from quanta_core.scheduler.slo import SloConfig
from quanta_core.scheduler.step_cost import StepCosts


def mean_context(running: Collection[Choice]) -> float:
    """The cells a running sequence holds, on average (what each decode attends over)."""
    return sum(r.num_tokens for r in running) / len(running) if running else 0.0


def prefill_left(r: Choice) -> int:
    """Prompt (or recompute) tokens still to compute before ``r`` samples."""
    return max(r.num_tokens - r.num_computed_tokens - 1, 0)


class SloEstimates:
    def __init__(
        self,
        config: SloConfig,
        cost: StepCosts,
        itl_target_s: float | None = None,
        alone_full_budget: bool = False,
    ) -> None:
        """``itl_target_s``: the step an interactive prefill chunk is sized to (default: the
        ``slo`` policy's, ``interactive_itl_s * itl_headroom``); ``alone_full_budget``: a
        prompt on an idle engine runs in full-budget steps (``quanta``), not in such
        chunks."""
        self.config = config
        self.cost = cost
        self.expected_output = float(config.expected_output_tokens)
        if itl_target_s is None:
            itl_target_s = config.interactive_itl_s * config.itl_headroom
        self.itl_target_s = itl_target_s
        self.alone_full_budget = alone_full_budget

    def observe_output(self, n_tokens: int) -> None:
        """A request finished with ``n_tokens`` output tokens (STOP or LENGTH)."""
        self.expected_output += 0.1 * (n_tokens - self.expected_output)

    def expected(self) -> int:
        return max(round(self.expected_output), 1)

    def outputs_left(self, r: Choice) -> int:
        """Tokens ``r`` is expected to generate still: all of ``max_tokens`` where it ignores
        end-of-generation (known exactly), else up to the mean answer."""
        total = r.max_tokens if r.sampling.ignore_eos else min(r.max_tokens, self.expected())
        return max(total - r.num_output, 1)

    def interactive_prefill_s(
        self, n_tokens: int, n_streams: int, budget: int, start: int = 0, full: bool = False
    ) -> float:
        """Prefilling ``n_tokens`` from position ``start`` beside ``n_streams`` interactive
        streams; ``full``: in full-budget steps (``quanta``'s time to first token first, in
        a calm burst), not in chunks sized to the inter-token target."""
        if full:
            # Queued prompts pack into the same full steps: each pays its tokens' share (and
            # its own attention: a chunk at the middle of it, on average).
            chunk = max(budget - n_streams, 1)
            pairs = chunk * (start + n_tokens / 2) / 1000
            step = self.cost.estimate(n_streams + 1, n_streams + chunk, pairs)
            return n_tokens / chunk * step
        step = self.cost.max_tokens(n_streams + 1, self.itl_target_s, budget, start=start)
        return self.cost.prefill_s(n_tokens, n_streams, step, start)

    def alone_prefill_s(self, r: Choice, budget: int) -> float:
        """Prefilling ``r`` on an idle engine (``alone_full_budget``: in full-budget steps, as
        ``quanta`` runs it with no stream to keep smooth)."""
        start = r.num_computed_tokens
        if self.alone_full_budget:
            return self.cost.prefill_s(prefill_left(r) + 1, 0, budget, start)
        return self.interactive_prefill_s(prefill_left(r) + 1, 0, budget, start)

    # ---- the projection's inputs ----

    def view(
        self,
        now: float,
        running: Collection[Choice],
        queued: Sequence[Choice],
        cap: int,
        budget: int,
        lane: bool = True,
        full: bool = False,
    ) -> tuple[Slots, float, int]:
        """The running slots as ``queued`` will find them, the decode step's seconds, and
        the interactive streams an interactive prefill runs beside. ``lane``: the running
        interactive prefills hold the prefill lane (in arrival order); else they are jobs
        of their own (``running_prefills``), and the lane is free now."""
        cap = max(cap, 1)
        busy = max(min(cap, len(running) + len(queued) + 1), 1)
        decode_s = self.cost.decode_step_s(busy, mean_context(running))
        streams = sum(1 for r in running if r.slo_class is SloClass.INTERACTIVE)
        streams = min(streams + len(queued), cap - 1)
        lane_held, at = lane, now
        ends: list[float] = []
        priced: dict[tuple[int, int], float] = {}  # by tokens and start: a burst has few
        for r in running:
            todo = prefill_left(r)
            if r.slo_class is SloClass.INTERACTIVE:
                start = r.num_computed_tokens
                prefill = priced.get((todo, start), -1.0)
                if prefill < 0:
                    prefill = priced[(todo, start)] = (
                        self.interactive_prefill_s(todo, streams, budget, start, full)
                        if todo
                        else 0.0
                    )
                at += prefill if lane_held else 0.0
            else:
                start = r.num_computed_tokens
                prefill = self.cost.prefill_s(todo, busy - 1, budget, start) if todo else 0.0
            ends.append(now + prefill + self.outputs_left(r) * decode_s)
        ends.sort()
        n = len(ends)
        free = ends[n - cap :] if n >= cap else [now] * (cap - n) + ends
        return Slots(tuple(free), at), decode_s, streams

    def running_prefills(
        self,
        running: Collection[Choice],
        dues: Mapping[Choice, float],
        streams: int,
        budget: int,
        full: bool = False,
    ) -> list[Job]:
        """The running interactive requests still prefilling, as jobs that hold their slot,
        due at their promise (``dues``; none: now, they go first)."""
        out: list[Job] = []
        for r in running:
            todo = prefill_left(r)
            if r.slo_class is SloClass.INTERACTIVE and todo:
                start = r.num_computed_tokens
                prefill = self.interactive_prefill_s(todo, streams, budget, start, full)
                out.append(Job(prefill, 0.0, dues.get(r, -math.inf), holds_slot=True))
        return out

    def job_of(
        self,
        prompt_len: int,
        max_tokens: int,
        decode_s: float,
        streams: int,
        budget: int,
        full: bool = False,
    ) -> Job:
        """A not yet submitted interactive request of these sizes (a booked retry)."""
        prefill = self.interactive_prefill_s(prompt_len, streams, budget, full=full)
        return Job(prefill, max(min(max_tokens, self.expected()), 1) * decode_s)

    def jobs(
        self,
        queued: Iterable[Choice],
        promises: Mapping[Choice, float],
        decode_s: float,
        streams: int,
        budget: int,
        full: bool = False,
    ) -> list[Job]:
        """``job`` of each of ``queued``, due at its promise: each size priced once (a burst
        is hundreds of requests of a few sizes, and every arrival projects them all)."""
        priced: dict[tuple[SloClass, int, int, int], Job] = {}
        out: list[Job] = []
        expected = self.expected()
        for r in queued:
            # ``prefill_left`` and ``outputs_left``, inline: this runs for every queued
            # request at every arrival.
            todo = max(r.num_tokens - r.num_computed_tokens - 1, 0)
            total = r.max_tokens if r.sampling.ignore_eos else min(r.max_tokens, expected)
            size = (r.slo_class, todo, max(total - r.num_output, 1), r.num_computed_tokens)
            job = priced.get(size)
            if job is None:
                job = priced[size] = self.job(r, None, decode_s, streams, budget, full)
            due = promises.get(r)
            out.append(job if due is None else Job(job.prefill_s, job.hold_s, due))
        return out

    def job(
        self,
        r: Choice,
        due: float | None,
        decode_s: float,
        streams: int,
        budget: int,
        full: bool = False,
    ) -> Job:
        """``r`` queued; ``due`` its promised first token (None: no promise); ``full`` as
        ``interactive_prefill_s``'s."""
        todo = prefill_left(r) + 1
        start = r.num_computed_tokens
        if r.slo_class is SloClass.INTERACTIVE:
            prefill = self.interactive_prefill_s(todo, streams, budget, start, full)
        else:
            prefill = self.cost.prefill_s(todo, streams, budget, start)
        hold = self.outputs_left(r) * decode_s
        return Job(prefill, hold, float("inf") if due is None else due)
