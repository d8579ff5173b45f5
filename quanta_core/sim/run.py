"""One workload through one scheduler on the virtual clock: ``simulate(...) -> SimOutcome``.

    outcome = simulate(spec, build_plan(spec, rows), config, engine, cost_model)
    summarize(outcome.records, spec.targets, window_s=spec.window_s)

The client side behaves as ``quanta bench`` does (``app/lab/bench/runner.py``): open loop, a
request is *scheduled* at its arrival and *sent* when a slot under ``concurrency`` is free
(at once without a cap); closed loop, ``users`` users each send their next request when the
last one's answer is in (plus ``think_s``), until the plan or ``duration_s`` runs out. With
``retries``, a refused request (429 / 503) is sent again at its retry-after, up to that many
times, keeping its slot meanwhile (as the scenario suite's client). Every attempt becomes the
``RequestRecord`` the bench would have filled, with the server's own split
(queue, prefill, cached tokens, preemptions) where the server reports it. What is not
simulated: the HTTP and tenancy layers (their quotas, the client's network and parsing time);
a token reaches the "client" the moment the step that sampled it ends.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from quanta_core.clock import VirtualClock
from quanta_core.engine.protocol import Executor
from quanta_core.engine.types import EngineInfo, SamplingParams
from quanta_core.metrics.records import RequestRecord
from quanta_core.requests import (
    ChoiceResult,
    FinishReason,
    GenerationRequest,
    RejectionKind,
)
from quanta_core.scheduler.config import SchedulerConfig
from quanta_core.scheduler.policies.base import TenantStats
from quanta_core.scheduler.scheduler import Scheduler
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.executor import SimExecutor
from quanta_core.sim.loop import SimLoop
from quanta_core.sim.prompts import always_in_vocabulary, prompt_ids
from quanta_core.sim.server_cost import ServerCost
from quanta_core.sim.step_trace import SpeedProfile
from quanta_core.workload import PlannedRequest, WorkloadSpec

# The real engine's facts that a cost model file may not carry (SmolLM2-135M-Instruct,
# bench/results/engine.json); n_ctx, n_seq_max and n_batch come from the server's settings.
DEFAULT_N_VOCAB = 49152
DEFAULT_EOG_TOKENS = (0, 2)  # <|endoftext|>, <|im_end|>: never sampled by the sim anyway
DEFAULT_KV_BYTES_PER_TOKEN = 23052


@dataclass(frozen=True, slots=True)
class SimOutcome:
    records: list[RequestRecord]  # one per request sent, in plan order
    steps: int  # engine passes
    virtual_s: float  # the virtual clock at the end
    busy_s: float  # virtual seconds the engine was stepping
    wall_s: float  # real seconds the simulation took
    preemptions: int
    bulk_steps: int = 0  # of ``steps``, taken in steady decode runs (``SimLoop``)
    bulk_evictions: int = 0  # steps of those runs whose grows evicted cached blocks
    tenants: tuple[TenantStats, ...] = ()  # the fair policies' counters at the end

    def counts(self) -> dict[str, Any]:
        return {
            "requests": len(self.records),
            "steps": self.steps,
            "virtual_s": self.virtual_s,
            "busy_s": self.busy_s,
            "wall_s": self.wall_s,
            "preemptions": self.preemptions,
            "bulk_steps": self.bulk_steps,
            "bulk_evictions": self.bulk_evictions,
        }


def sim_engine_info(
    *,
    n_ctx: int,
    n_seq_max: int,
    n_batch: int,
    meta: dict[str, Any] | None = None,
    kv_unified: bool = True,
) -> EngineInfo:
    """The ``EngineInfo`` a real engine with these settings reports; the vocabulary and KV
    sizes from the cost model's ``meta`` when its calibration recorded them."""
    meta = meta or {}
    return EngineInfo(
        n_ctx=n_ctx,
        n_seq_max=n_seq_max,
        n_batch=n_batch,
        n_vocab=int(meta.get("n_vocab", DEFAULT_N_VOCAB)),
        eog_tokens=tuple(int(t) for t in meta.get("eog_tokens", DEFAULT_EOG_TOKENS)),
        kv_bytes_per_token=int(meta.get("kv_bytes_per_token", DEFAULT_KV_BYTES_PER_TOKEN)),
        kv_unified=bool(meta.get("kv_unified", kv_unified)),
        model_name=str(meta.get("model", "simulated")),
    )


def simulate(
    spec: WorkloadSpec,
    plan: Sequence[PlannedRequest],
    config: SchedulerConfig,
    engine: EngineInfo,
    cost_model: CostModel,
    server: ServerCost | None = None,
    speed: SpeedProfile | None = None,
    bulk: bool = True,
    retries: int = 0,
) -> SimOutcome:
    """Run ``plan`` through the scheduler on the virtual clock; ``server``: the server's own
    time per cycle (none: the engine alone); ``speed``: every step x the machine's speed at
    its start (none: as ``cost_model`` says); ``bulk``: steady decode steps at once (the
    same outcome; ``False``: one by one, ``SimLoop``); ``retries``: a refused request is
    sent again at its retry-after this many times at most."""
    clock = VirtualClock()
    speed_now = None if speed is None else lambda: speed.at(clock.now())
    executor = SimExecutor(engine, cost_model, speed_now)
    with _cyclic_gc_paused():
        return run_workload(spec, plan, config, executor, clock, server, bulk, retries)


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Python's cycle collector off for a simulation: a run allocates millions of short-lived
    containers, so the collector runs thousands of times, each pass re-scanning the live
    requests' prompts (millions of token references), and finds almost nothing (a few
    thousand objects in cycles on a 10,000-request trace). What it would have found is
    collected once it is back on."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def run_workload(
    spec: WorkloadSpec,
    plan: Sequence[PlannedRequest],
    config: SchedulerConfig,
    executor: Executor,
    clock: VirtualClock,
    server: ServerCost | None = None,
    bulk: bool = True,
    retries: int = 0,
) -> SimOutcome:
    """Run ``plan`` through the scheduler on ``executor``, the clock moved by each step's
    ``total_s``: the simulated engine's cost model, or a real engine's wall time (the
    calibration's served phase: arrivals then come in engine time, idle gaps skipped)."""
    # Results carry the tokens; the prompts' ids need no check where none can be out of the
    # vocabulary (``prompt_ids``).
    n_vocab = executor.info.n_vocab
    scheduler = Scheduler(
        config,
        executor.info,
        clock,
        token_events=False,
        check_token_ids=not always_in_vocabulary(n_vocab),
    )
    client = _Client(spec, plan, executor.info.n_vocab, retries)
    loop = SimLoop(scheduler, executor, clock, client.on_finished, server, bulk)
    client.loop = loop
    started = time.perf_counter()
    client.start()
    loop.run()
    wall = time.perf_counter() - started
    return SimOutcome(
        records=client.records(),
        steps=loop.steps,
        virtual_s=clock.now(),
        busy_s=loop.busy_s,
        wall_s=wall,
        preemptions=scheduler.num_preemptions,
        bulk_steps=loop.bulk_steps,
        bulk_evictions=loop.bulk_evictions,
        tenants=scheduler.stats().tenants,
    )


class _Client:
    """The bench's side of the run: sends requests, turns finished choices into records."""

    def __init__(
        self, spec: WorkloadSpec, plan: Sequence[PlannedRequest], n_vocab: int, retries: int = 0
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.n_vocab = n_vocab
        self.retries = retries
        self.loop: SimLoop | None = None
        self.weights = {t.name: t.weight for t in spec.tenants}
        self.sampling = SamplingParams(temperature=spec.temperature, ignore_eos=spec.ignore_eos)
        # request id -> (planned, sent, attempt)
        self.sent: dict[str, tuple[PlannedRequest, float, int]] = {}
        self._records: dict[tuple[int, int], RequestRecord] = {}  # (index, attempt)
        self._todo: deque[PlannedRequest] = deque(plan)  # closed loop: the users' queue
        self._waiting: deque[PlannedRequest] = deque()  # open loop: scheduled, no free slot
        self._in_flight = 0

    def start(self) -> None:
        assert self.loop is not None
        if self.spec.closed_loop:
            for _ in range(self.spec.users or 1):
                self._next_of_user(0.0)
            return
        for planned in self.plan:
            if self.spec.concurrency is None:
                self._send(planned, planned.arrival or 0.0)
            else:
                self.loop.call_at(planned.arrival or 0.0, self._scheduled(planned))

    def _scheduled(self, planned: PlannedRequest) -> Any:
        def action(now: float) -> None:
            assert self.spec.concurrency is not None
            if self._in_flight < self.spec.concurrency:
                self._send(planned, now)
            else:
                self._waiting.append(planned)

        return action

    def _next_of_user(self, now: float) -> None:
        duration = self.spec.duration_s
        if self._todo and (duration is None or now < duration):
            self._send(self._todo.popleft(), now)

    def _send(self, planned: PlannedRequest, now: float, attempt: int = 0) -> None:
        assert self.loop is not None
        request_id = f"r{planned.index}"
        tenant = planned.tenant
        request = GenerationRequest(
            request_id=request_id,
            prompt_tokens=prompt_ids(self.spec.seed, planned, self.spec.endpoint, self.n_vocab),
            max_tokens=planned.output_tokens,
            sampling=self.sampling,
            tenant=tenant,
            slo_class=planned.slo_class,
            weight=self.weights.get(tenant, 1.0),
        )
        self.sent[request_id] = (planned, now, attempt)
        if not attempt:
            self._in_flight += 1  # a retry holds the slot of its first try
        self.loop.arrive(now, request)

    def on_finished(self, result: ChoiceResult) -> None:
        assert self.loop is not None
        planned, sent, attempt = self.sent.pop(result.request_id)
        record = _record(planned, sent, result, self.weights.get(planned.tenant, 1.0), attempt)
        self._records[planned.index, attempt] = record
        now = self.loop.clock.now()
        wait = record.retry_after_s
        if attempt < self.retries and record.status in (429, 503) and wait is not None:
            self.loop.call_at(now + wait, lambda t: self._send(planned, t, attempt + 1))
            return
        self._in_flight -= 1
        if self.spec.closed_loop:
            think = self.spec.think_s
            if think > 0:
                self.loop.call_at(now + think, self._next_of_user)
            else:
                self._next_of_user(now)
        elif self._waiting:
            self._send(self._waiting.popleft(), now)

    def records(self) -> list[RequestRecord]:
        return [self._records[k] for k in sorted(self._records)]


def _status(result: ChoiceResult) -> int:
    """The HTTP status the server answers with (``app/openai/generation.py``)."""
    match result.finish_reason:
        case FinishReason.STOP | FinishReason.LENGTH:
            return 200
        case FinishReason.REJECTED if (
            result.rejection is RejectionKind.TENANT_OVER_SHARE and result.retry_after_s is not None
        ):
            return 429
        case FinishReason.REJECTED | FinishReason.CANCELLED:
            return 503
        case _:
            return 500


def _record(
    planned: PlannedRequest, sent: float, result: ChoiceResult, weight: float, attempt: int = 0
) -> RequestRecord:
    status = _status(result)
    common: dict[str, Any] = {
        "request_id": result.request_id,
        "tenant": planned.tenant,
        "slo_class": planned.slo_class,
        "sent": sent,
        "prompt_tokens": planned.prompt_tokens,
        "max_tokens": planned.output_tokens,
        "scheduled": planned.arrival,
        "weight": weight,
        "status": status,
        "attempt": attempt,
    }
    t = result.timings
    if status != 200:
        # Refused before the stream began: the client sees a status and a message at once.
        why = result.error or result.finish_reason.value
        return RequestRecord(
            **common, ok=False, finished=t.finished, error=why, retry_after_s=result.retry_after_s
        )
    return RequestRecord(
        **common,
        ok=True,
        finished=t.finished,
        token_times=result.token_times,
        output_tokens=result.completion_tokens,
        server_queue_s=t.queue_s,
        server_prefill_s=t.prefill_s,
        server_e2e_s=None if t.finished is None else t.finished - t.arrival,
        server_preemptions=result.preemptions,
        server_cached_tokens=result.cached_tokens,
        server_ttft_estimate_s=t.ttft_estimate_s,
    )
