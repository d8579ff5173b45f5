"""SLO classes, their targets and the queue bounds: one frozen config for ``vtc`` and ``slo``.

The defaults come from the reference machine's engine (2 CPU cores, SmolLM2-135M Q4_1,
llama.cpp through the worker; bench/results/fairness/README.md and the engine bench):

    one sequence, one decode step          ~18 ms
    batched decode, 16 sequences           ~188 ms per step (only ~1.5x the throughput of
                                           one stream: the CPU is compute bound)
    prefill alone                          ~155 tokens/s (~6.4 ms per prompt token)

A line through those points prices a step of ``s`` sequences carrying ``t`` tokens:

    step_s(s, t) = 6.7 ms + 11.3 ms * s + 6.4 ms * (t - s)
                   1 decode: 18 ms    16 decodes: 188 ms    a 128-token chunk alone: 0.83 s

It is only the prior: ``StepCostModel`` learns the per-sequence and per-token terms from the
measured steps (prefill beside running streams runs 2-3x slower than this line), and
plans against a high quantile of its error (``step_quantile``).

and the targets follow from it:

- ``interactive_itl_s = 0.25``: a little slower than a busy batched step (16 streams:
  ~190 ms) yet faster than anyone reads (4 tokens/s). Planned at ``itl_headroom`` (200 ms) a
  step holds ~16 decodes, or a few decodes and a ~25-token prefill chunk, so the ``slo``
  policy caps the batch and the step there, and batch streams yield the step to an
  interactive prefill.
- ``interactive_ttft_s = 2.0``: a 128-token prompt prefills in ~0.85 s alone (~1.1 s in
  ITL-sized chunks beside a few interactive streams), which leaves room for a short queue.
- ``batch_deadline_s = 120``: a 1,000-token batch job (prompt + output) at the throughput of a
  busy machine (16 streams at ~190 ms per step: ~5 tokens/s each) takes ~3 minutes at worst
  and ~30 s with a fair share of a lightly loaded one; two minutes is a real deadline that
  leaves interactive traffic first claim on the machine.
- ``batch_aging_s = 30``: a batch request waiting a quarter of its deadline is promoted, so
  it still has ~90 s to run. What promotion buys depends on the policy: under ``slo`` it goes
  ahead of everything not promoted before it, interactive included (``SloPolicy`` bounds its
  wait); under the default ``quanta`` it goes ahead of other batch only, never ahead of
  interactive.

These are the same targets ``quanta_core.metrics.slo`` scores goodput against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from quanta_core.requests import SloClass


@dataclass(frozen=True, slots=True)
class QueueBound:
    """At most this many requests, and prompt tokens, waiting in one queue."""

    max_requests: int
    max_tokens: int

    def __post_init__(self) -> None:
        if self.max_requests < 1 or self.max_tokens < 1:
            raise ValueError(f"queue bounds must be >= 1: {self}")


@dataclass(frozen=True, slots=True)
class SloConfig:
    # targets
    interactive_ttft_s: float = 2.0
    interactive_itl_s: float = 0.25
    batch_deadline_s: float = 120.0
    batch_aging_s: float = 30.0  # a batch request waiting this long is promoted (see above)
    # Plan steps (at the cost model's high quantile) at this fraction of the ITL target: the
    # client's gap also holds the cycle's own time and the trip to the client, and the target
    # is a p99 while the margin is a p95 of a finite window.
    itl_headroom: float = 0.8
    # Running slots batch leaves free (unless promoted by aging), so that an interactive
    # arrival starts at the next step instead of waiting for a batch job to end.
    interactive_reserve: int = 1
    # queue bounds (waiting requests and their prompt tokens), per class and in all; a
    # queued batch request is shed to make room in the shared bound for an interactive one
    interactive_queue: QueueBound = QueueBound(64, 16_384)
    batch_queue: QueueBound = QueueBound(256, 131_072)
    total_queue: QueueBound = QueueBound(256, 131_072)
    # VTC prices: service is (input + 2 * output) / weight
    input_cost: float = 1.0
    output_cost: float = 2.0
    # step-cost prior (seconds; see the module docstring), learnt online (``StepCostModel``):
    # least squares with forgetting (memory ~1 / (1 - forgetting) steps), the prior worth
    # ``step_prior_weight`` typical steps per coefficient, a margin at ``step_quantile``
    # of the last ``step_window`` steps' errors
    step_base_s: float = 0.0067
    step_seq_s: float = 0.0113
    step_token_s: float = 0.0064
    # per thousand (query, key) pairs attended: the reference CPU's calibration (~1 ms)
    step_attn_s: float = 0.001
    step_forgetting: float = 0.98
    step_prior_weight: float = 0.2
    step_quantile: float = 0.95
    step_window: int = 100
    # an answer's length before any has finished (admission estimates), then learnt online
    expected_output_tokens: int = 128
    # the ``quanta`` policy: the running set grows while a decode step is priced within
    # this fraction of ``interactive_itl_s`` (the client's gap adds the cycle and the trip);
    # a tenant runs only as many streams in a step as keep its counter within ``fair_lag``
    # weighted tokens of the lowest running tenant's of its class (``policies.shares``)
    grow_headroom: float = 0.9
    # ... and a burst that reaches a calm machine (no interactive request waiting for its
    # first token in the last ``burst_window_s``) is queued when its projected first token
    # is within ``1 + burst_grace`` targets (inf: whatever it is, up to the queue bounds):
    # once it is served nobody waits behind it, so a refusal would buy nothing. Sustained
    # overload gets no grace: the target is the bound. A machine that refused interactive
    # work in the last ``burst_quiet_s`` is not calm (that is overload arriving in bursts).
    burst_window_s: float = 1.0
    burst_quiet_s: float = 5.0
    burst_grace: float = math.inf
    burst_itl_s: float = 1.0  # while such a burst waits, steps may grow to this (smooth)
    # While an interactive request waits for its first token below capacity, a step carries
    # prefill up to this long, past the token budget (the ``quanta`` policy's first tokens
    # first): the running streams' tokens ride along, a gap each about this long on average.
    first_token_step_s: float = 1.0
    # ... and up to this long while a waiting prompt is longer than such a step holds: on the
    # 2-core CPU a step then carries the engine's whole pass (512 tokens), where one
    # second's steps spent a pass of decodes on every ~280 prompt tokens and the last first
    # token of a long burst came ~10 % after llama-server's (whose 2,048-token steps leave
    # its streams 3-7 s gaps). Short prompts keep the short steps: the streams stay smooth.
    first_token_long_step_s: float = 2.0
    # The ``quanta`` policy's retry-after: when the projected first token, this fraction
    # later, is within the target. The projection errs both ways (the first-token
    # estimate's median absolute error is ~20 % in the scenario suite,
    # bench/results/scenarios/); told the exact time, a retry finds the queue a little
    # longer about as often as shorter, and is refused again.
    retry_margin: float = 0.2
    fair_lag: float = 32.0
    # ... and refuses on the first-token target only while the interactive work admitted
    # over the last ``load_window_s`` (each arrival priced alone, at the learnt line)
    # exceeds that time, reckoned over at least ``load_min_s`` (``policies.load``): below
    # capacity, a clump of long prompts is queued, not refused.
    load_window_s: float = 60.0
    load_min_s: float = 5.0

    def __post_init__(self) -> None:
        positive = (
            self.interactive_ttft_s,
            self.interactive_itl_s,
            self.batch_deadline_s,
            self.step_seq_s,
            self.step_token_s,
        )
        if min(positive) <= 0:
            raise ValueError(f"SLO targets and step costs must be > 0: {self}")
        if self.step_attn_s < 0:
            raise ValueError(f"step_attn_s must be >= 0: {self}")
        if self.batch_aging_s < 0 or self.step_base_s < 0 or self.interactive_reserve < 0:
            raise ValueError(f"batch_aging_s, step_base_s, interactive_reserve >= 0: {self}")
        if not 0 < self.itl_headroom <= 1 or not 0 < self.step_forgetting <= 1:
            raise ValueError(f"itl_headroom and step_forgetting must be in (0, 1]: {self}")
        if not 0 < self.step_quantile <= 1 or self.step_window < 1 or self.step_prior_weight <= 0:
            raise ValueError(f"step_quantile in (0, 1], step_window >= 1, prior weight > 0: {self}")
        if min(self.burst_window_s, self.burst_grace, self.burst_quiet_s) < 0:
            raise ValueError(f"burst_window_s, burst_grace, burst_quiet_s must be >= 0: {self}")
        if not 0 < self.load_min_s <= self.load_window_s:
            raise ValueError(f"need 0 < load_min_s <= load_window_s: {self}")
        if self.retry_margin < 0:
            raise ValueError(f"retry_margin must be >= 0: {self}")
        if self.burst_itl_s <= 0:
            raise ValueError(f"burst_itl_s must be > 0: {self}")
        if not 0 < self.first_token_step_s <= self.first_token_long_step_s:
            raise ValueError(f"need 0 < first_token_step_s <= first_token_long_step_s: {self}")
        if not 0 < self.grow_headroom <= 1 or self.fair_lag < 0:
            raise ValueError(f"grow_headroom in (0, 1] and fair_lag >= 0: {self}")
        if self.input_cost < 0 or self.output_cost < 0 or self.expected_output_tokens < 1:
            raise ValueError(f"costs must be >= 0 and expected_output_tokens >= 1: {self}")

    def queue_bound(self, slo_class: SloClass) -> QueueBound:
        return self.interactive_queue if slo_class is SloClass.INTERACTIVE else self.batch_queue
