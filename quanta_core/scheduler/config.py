"""The scheduler's knobs: one frozen dataclass, built by the caller from its settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from quanta_core.scheduler.slo import SloConfig


class PolicyName(StrEnum):
    SEQUENTIAL = "sequential"  # one request at a time, run to completion
    STATIC = "static"  # form a batch, run it until all of it finishes
    FCFS = "fcfs"  # continuous batching, first come first served, preempt the newest
    VTC = "vtc"  # fair share between tenants by virtual token counters, one pool
    SLO = "slo"  # VTC within SLO classes, interactive first, batch aged, admission control
    HORIZON = "horizon"  # VTC; predicted lengths: memory-aware admission, shortest first
    QUANTA = "quanta"  # slo, with a cost-governed running set, preemption for interactive,
    # memory-aware starts and per-step weighted shares: the server's default


@dataclass(frozen=True, slots=True)
class HorizonConfig:
    """The ``horizon`` policy's knobs (``quanta_core.scheduler.policies.horizon``)."""

    # The remaining-length quantile admission projects with: higher preempts less often and
    # admits fewer at once (with p90 about one running request in ten outlives its projection).
    admission_quantile: float = 0.9
    # Aging of shortest-first: a request is never overtaken by one arriving more than this
    # many seconds per token of its work (prompt + max_tokens) after it.
    aging_s_per_token: float = 0.02
    # While streams decode, a step is planned to last at most this (the step-cost model's
    # estimate, its margin included): a prompt beside them is prefilled in chunks that fit, so
    # that no stream's gap nears the 1 s that counts as a stall (bench/results/horizon).
    step_target_s: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 < self.admission_quantile <= 1.0 or self.aging_s_per_token < 0:
            raise ValueError(f"admission_quantile in (0, 1], aging_s_per_token >= 0: {self}")
        if self.step_target_s <= 0:
            raise ValueError(f"step_target_s must be > 0: {self}")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    policy: PolicyName = PolicyName.FCFS
    block_size: int = 16
    max_running: int = 16  # choices running at once; also capped by the engine's n_seq_max
    token_budget: int = 512  # tokens per step; capped by the engine's n_batch
    num_kv_blocks: int | None = None  # None: n_ctx // block_size
    enable_prefix_cache: bool = True
    # Cached prefix tokens kept in the engine beyond what running requests hold; None: as
    # many as the pool has room for (every cached cell slows each step a little).
    prefix_cache_tokens: int | None = None
    stash_budget_bytes: int = 1 << 30  # host RAM for stashed KV
    # Cost estimates that decide stash vs recompute (defaults: the 2-core CPU of DESIGN.md,
    # where a stash+restore of 1,000 tokens takes ~5 ms and prefill runs at ~220 tokens/s).
    stash_bytes_per_s: float = 4.6e9
    prefill_tokens_per_s: float = 220.0
    # What decides copying a prefix between KV streams (a stream per sequence) or computing
    # it: a copy moves the whole stream, at this rate (bench/results/kv-layout).
    stream_copy_bytes_per_s: float = 5.4e9
    # A request that was on the engine this many times when it died is failed, not retried.
    max_engine_deaths_per_request: int = 2
    # Run KvManager.check_integrity() after every cycle (tests; O(blocks) per cycle).
    check_integrity: bool = False
    # SLO classes, queue bounds and the step-cost prior (the ``vtc`` and ``slo`` policies)
    slo: SloConfig = field(default_factory=SloConfig)
    horizon: HorizonConfig = field(default_factory=HorizonConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", PolicyName(self.policy))
        if self.block_size < 1 or self.max_running < 1 or self.token_budget < 1:
            raise ValueError(f"block_size, max_running and token_budget must be >= 1: {self}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.prefix_cache_tokens is not None and self.prefix_cache_tokens < 0:
            raise ValueError(f"prefix_cache_tokens must be >= 0, got {self.prefix_cache_tokens}")
        if self.stream_copy_bytes_per_s <= 0:
            raise ValueError(f"stream_copy_bytes_per_s must be > 0: {self}")
        if self.stash_budget_bytes < 0:
            raise ValueError(f"stash_budget_bytes must be >= 0, got {self.stash_budget_bytes}")


@dataclass(frozen=True, slots=True)
class StepLimits:
    """One cycle's caps: the configured ones, or a policy's tighter ones."""

    max_running: int  # choices holding a sequence
    token_budget: int  # tokens in one step
    # the most one step can carry at all (the engine's n_batch); 0: ``token_budget``. A
    # policy may let a step go past its budget up to this (``quanta``: first tokens first).
    pass_tokens: int = 0

    @property
    def most_tokens(self) -> int:
        return max(self.pass_tokens, self.token_budget)
