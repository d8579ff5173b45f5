"""The scheduler: ``schedule() -> StepPlan`` and ``update(plan, result) -> events``.

One cycle, as an operating system would run it:

    cancelled?         free their KV now (cycle boundary: no step is in flight)
    anyone starved?    the policy lifts them (``begin_cycle``) and sets this cycle's caps on
                       running sequences and tokens (``limits``: the SLO policy's ITL bound)
    running            each gets its next tokens under the token budget; when blocks run out
                       a victim (policy) is stashed or dropped for recompute (cost)
    waiting            admitted in the policy's order while ids, blocks and budget allow
                       (not in a cycle that had to preempt)
    plan               KV ops in the order they were decided, then the slices

Tokens, not phases: a slice is ``tokens[num_computed : num_computed + n]``. A long prompt
takes several steps (chunked prefill) behind the running decodes, which come first.
Finished requests are freed in ``update``; their ops lead the next plan. ``submit`` answers at
once (the policy's ``on_submit``): start, queue, or reject, possibly shedding queued requests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from quanta_core.clock import Clock
from quanta_core.engine.types import (
    DropStash,
    EngineInfo,
    SeqOutput,
    SeqSlice,
    Stash,
    StepPlan,
    StepResult,
)
from quanta_core.kv.kv_manager import KvManager
from quanta_core.kv.slots import SlotManager
from quanta_core.predictor import LengthPredictor
from quanta_core.requests import (
    ChoiceFinished,
    FinishReason,
    GenerationRequest,
    RejectionKind,
    TokenEvent,
)
from quanta_core.scheduler.admission import AdmissionDecision, AdmissionVerdict
from quanta_core.scheduler.choice import Choice, ChoiceStatus
from quanta_core.scheduler.config import SchedulerConfig, StepLimits
from quanta_core.scheduler.handle import Event
from quanta_core.scheduler.policies import make_policy
from quanta_core.scheduler.policies.base import Policy, StartDecision, TenantStats
from quanta_core.scheduler.preemption import PreemptionCosts, PreemptMode
from quanta_core.scheduler.snapshot import (
    ChoiceView,
    DecisionLog,
    SchedulerSnapshot,
    Step,
    step_rates,
)

# Reasons whose KV is sound and worth keeping in the prefix cache.
_CACHEABLE = frozenset({FinishReason.STOP, FinishReason.LENGTH, FinishReason.CANCELLED})
_SERVED = frozenset({FinishReason.STOP, FinishReason.LENGTH})
# For the per-step loop: in Python 3.11 looking up an enum member costs a descriptor call.
_RUNNING = ChoiceStatus.RUNNING


def _seq_of(s: SeqSlice) -> int:
    return s.seq


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    kv_usage: float  # fraction of blocks held by running sequences
    kv_cached_blocks: int  # held only for the prefix cache (reclaimable)
    kv_waste_tokens: int  # reserved but unfilled cells of running sequences
    prefix_cache_queries: int  # tokens
    prefix_cache_hits: int  # tokens
    num_preemptions: int
    num_stashes: int
    stash_bytes: int
    engine_deaths: int
    waiting_by_class: tuple[tuple[str, int], ...] = ()  # (class, waiting choices)
    tenants: tuple[TenantStats, ...] = ()  # fair policies: counters and queues per tenant


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        info: EngineInfo,
        clock: Clock,
        *,
        token_events: bool = True,
        predictor: LengthPredictor | None = None,
        check_token_ids: bool = True,
        policy: Policy | None = None,
    ) -> None:
        """``policy``: one built by the caller (its rules set otherwise than ``config``
        says); by default ``config.policy``'s, made from ``config``."""
        self.config = config
        # A caller that needs only each choice's end (the simulator: a result carries its
        # tokens and their times) is spared an event per token.
        self.token_events = token_events
        # Off only where every prompt's ids are in the vocabulary by construction (the
        # simulator's generated prompts): the check reads every token of every prompt.
        self.check_token_ids = check_token_ids
        self.info = info
        self.clock = clock
        bs = config.block_size
        num_blocks = config.num_kv_blocks or info.n_ctx // bs
        self.kv: KvManager | SlotManager = make_kv(config, info)
        self.policy = make_policy(config.policy, config) if policy is None else policy
        self.policy.set_pool(num_blocks, bs)
        # Every served choice's length teaches it, whatever the policy (it is saved with the
        # server's state); the policies that predict read it.
        self.predictor = LengthPredictor() if predictor is None else predictor
        self.policy.set_predictor(self.predictor)
        self.token_budget = min(config.token_budget, info.n_batch)
        self.max_running = min(config.max_running, info.n_seq_max)
        self.base_limits = StepLimits(self.max_running, self.token_budget, info.n_batch)
        # The longest a sequence may grow: positions must fit the context and blocks the pool
        # (with one stream per sequence, its slot: n_ctx / n_seq_max cells).
        self.max_seq_tokens = (
            min(info.n_ctx, num_blocks * bs)
            if isinstance(self.kv, KvManager)
            else self.kv.slot_tokens
        )
        self.eog = frozenset(info.eog_tokens)
        self.costs = PreemptionCosts(
            info.kv_bytes_per_token,
            config.stash_bytes_per_s,
            config.prefill_tokens_per_s,
            config.stash_budget_bytes,
        )
        self._running: dict[Choice, None] = {}  # admission order
        self._by_seq: dict[int, Choice] = {}
        self._groups: dict[str, list[Choice]] = {}  # request_id -> choices, while any is live
        self._cancels: list[str] = []
        self._release: list[str] = []  # samplers to free in the next plan
        self._stash_bytes: dict[str, int] = {}  # key -> bytes (estimate until the step says)
        self._events: list[Event] = []
        self._order = 0
        self._admitting = True
        self.num_preemptions = 0
        self.engine_deaths = 0
        self.decisions = DecisionLog()  # one record per request, for the live view

    # ---- the public face ----

    def submit(self, req: GenerationRequest) -> AdmissionVerdict:
        """Start, queue or reject ``req`` at once; a rejected request finishes (REJECTED)
        with a reason, and for a load rejection its kind and a retry-after."""
        now = self.clock.now()
        self._order += 1
        choices = Choice.choices_of(req, now, self._order)
        reason = self._reject_reason(req)
        verdict = (
            AdmissionVerdict(AdmissionDecision.REJECT, reason)
            if reason is not None
            else self.policy.on_submit(choices, self._running, self.base_limits)
        )
        self.decisions.record(now, choices[0], verdict, len(self.policy.waiting))
        if verdict.decision is AdmissionDecision.REJECT:
            for r in choices:
                self._finish(
                    r,
                    FinishReason.REJECTED,
                    verdict.reason,
                    verdict.rejection,
                    verdict.retry_after_s,
                )
            return verdict
        for victim in verdict.shed:
            self._shed(victim.request_id, verdict.shed_retry_after_s)
        self._groups[req.request_id] = choices
        self.policy.waiting.push(choices[0])
        if len(choices) > 1 and not self.kv.shares_prefix(len(req.prompt_tokens) - 1):
            self._unblock_siblings(choices[0])  # computing the prompt costs less: no waiting
        return verdict

    def _shed(self, request_id: str, retry_after_s: float | None) -> None:
        """Reject a queued request to make room for another (it never ran: no work is lost)."""
        group = self._groups[request_id]
        if any(r.first_scheduled is not None or r.preemptions for r in group):
            raise RuntimeError(f"the policy shed {request_id}, which has run")
        reason = "shed from the queue under overload to make room for interactive traffic"
        self.decisions.shed(self.clock.now(), group[0], reason)
        for r in group:
            self._finish(r, FinishReason.REJECTED, reason, RejectionKind.OVERLOADED, retry_after_s)

    def cancel(self, request_id: str) -> bool:
        """Cancel at the next cycle boundary; ``False`` if no such request is live."""
        if request_id not in self._groups:
            return False
        self._cancels.append(request_id)
        return True

    def stop_admitting(self) -> None:
        """Refuse new requests, and those queued that never ran; in-flight ones go on."""
        self._admitting = False
        for r in list(self.policy.waiting):
            if r.first_scheduled is None:
                self.policy.waiting.remove(r)
                self._finish(r, FinishReason.REJECTED, "the server is stopping")

    def abort_all(self, error: str) -> list[Event]:
        """Fail every live request (ERROR) and free its KV."""
        for choices in list(self._groups.values()):
            for r in choices:
                if not r.is_finished:
                    self._finish(r, FinishReason.ERROR, error)
        return self.drain_events()

    @property
    def running(self) -> tuple[Choice, ...]:
        """The choices holding a sequence, in the order they get their tokens."""
        return tuple(self._running)

    def open_choices(self) -> list[Choice]:
        """Every choice of every request not yet finished as a whole."""
        return [c for group in self._groups.values() for c in group]

    @property
    def has_work(self) -> bool:
        return bool(self._groups or self._cancels or self._release)

    @property
    def has_boundary_work(self) -> bool:
        """Cancels to apply or samplers to release: the next cycle does more than step."""
        return bool(self._cancels or self._release)

    def drain_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def stats(self) -> SchedulerStats:
        kv = self.kv.stats()
        by_class: dict[str, int] = {}
        for r in self.policy.waiting:
            by_class[r.slo_class.value] = by_class.get(r.slo_class.value, 0) + 1
        return SchedulerStats(
            num_running=len(self._running),
            num_waiting=len(self.policy.waiting),
            kv_usage=kv.usage,
            kv_cached_blocks=kv.cached_blocks,
            kv_waste_tokens=kv.waste_tokens,
            prefix_cache_queries=kv.prefix_queries,
            prefix_cache_hits=kv.prefix_hits,
            num_preemptions=self.num_preemptions,
            num_stashes=len(self._stash_bytes),
            stash_bytes=sum(self._stash_bytes.values()),
            engine_deaths=self.engine_deaths,
            waiting_by_class=tuple(sorted(by_class.items())),
            tenants=self.policy.tenant_stats(self._running),
        )

    def snapshot(self, steps: Iterable[Step] = ()) -> SchedulerSnapshot:
        """The queues, the running set, the block map and the recent decisions, as plain
        data (``steps``: the driver's recent ones, for the step rates)."""
        now = self.clock.now()
        waiting = sorted(self.policy.waiting, key=lambda r: (r.order, r.index))
        return SchedulerSnapshot(
            now=now,
            policy=self.policy.name.value,
            block_size=self.kv.block_size,
            blocks=self.kv.block_map(),
            running=tuple(ChoiceView.of(r, now) for r in self._running),
            waiting=tuple(ChoiceView.of(r, now) for r in waiting),
            tenants=self.policy.tenant_stats(self._running),
            decisions=self.decisions.latest(),
            rates=step_rates(steps, now),
        )

    def check_integrity(self) -> None:
        self.kv.check_integrity()
        for r in self._running:
            if r.status is not ChoiceStatus.RUNNING or r.seq is None:
                raise RuntimeError(f"{r.owner} is listed running but is {r.status.value}")
            if self._by_seq.get(r.seq) is not r:
                raise RuntimeError(f"{r.owner}'s sequence {r.seq} is filed under another")
        if len(self._by_seq) != len(self._running):
            raise RuntimeError("a sequence id is filed for a request that is not running")

    # ---- the cycle ----

    def schedule(self) -> StepPlan:
        now = self.clock.now()
        if self._cancels:
            self._apply_cancels()
        running, policy, kv = self._running, self.policy, self.kv
        policy.begin_cycle(running, now)
        limits = policy.limits(running, self.base_limits)
        for victim in policy.make_room(running, limits):
            if victim.status is _RUNNING:
                self._preempt(victim, now)  # a slot (or memory) for a request that goes first
        budget = limits.token_budget
        slices: list[SeqSlice] = []
        queue = policy.order_running(list(running))
        preempted = False
        deferred: list[Choice] = []
        for i, r in enumerate(queue):
            if budget <= 0:
                break
            if r.status is not _RUNNING:
                continue  # evicted earlier in this loop
            if policy.defers(r):
                deferred.append(r)
                continue
            assert r.seq is not None
            n = min(len(r.tokens) - r.num_computed_tokens, budget)
            while not kv.grow(r.seq, r.num_computed_tokens + n):
                candidates = [c for c in queue[i:] if c.status is ChoiceStatus.RUNNING]
                victim = policy.pick_victim(candidates)
                self._preempt(victim, now)
                preempted = True
                if victim is r:
                    break
            if r.status is _RUNNING:
                slices.append(self._slice(r, n, now))
                budget -= n
        if not preempted and policy.waiting:  # most steps: nobody waits
            budget = self._start_waiting(budget, limits.max_running, slices, now)
        for r in deferred:
            budget = self._run_deferred(r, budget, slices, now)
        if not self.info.kv_unified:
            # llama.cpp runs a stream-per-sequence batch in passes over runs of consecutive
            # sequence ids, in batch order: ids in increasing order make the fewest passes.
            slices.sort(key=_seq_of)
        plan = StepPlan(tuple(kv.drain_ops()), tuple(slices), tuple(self._release))
        self._release.clear()
        return plan

    def _run_deferred(self, r: Choice, budget: int, slices: list[SeqSlice], now: float) -> int:
        """What admission left of the budget, for a running request the policy put after it
        (never a cause to preempt: without room it waits for the next step)."""
        allowed = self._room(budget, slices)
        if allowed <= 0 or r.status is not ChoiceStatus.RUNNING:
            return budget
        assert r.seq is not None
        n = min(r.num_tokens - r.num_computed_tokens, allowed)
        if not self.kv.grow(r.seq, r.num_computed_tokens + n):
            return budget
        slices.append(self._slice(r, n, now))
        return budget - n

    def _start_waiting(
        self, budget: int, max_running: int, slices: list[SeqSlice], now: float
    ) -> int:
        waiting = self.policy.waiting
        skipped: list[Choice] = []
        while budget > 0 and len(self._running) < max_running and self.kv.num_seqs_available > 0:
            r = waiting.peek()
            if r is None:
                break
            allowed = self._room(budget, slices)
            if allowed <= 0:
                break
            decision = self.policy.may_start(r, self._running)
            if decision is StartDecision.STOP:
                break
            waiting.pop()
            if decision is StartDecision.SKIP:
                skipped.append(r)
                continue
            n = self._try_start(r, allowed, now)
            if n is None:
                waiting.push(r)
                break
            self.policy.on_started(r)
            slices.append(self._slice(r, n, now))
            budget -= n
        for r in skipped:
            waiting.push(r)
        return budget

    def _room(self, budget: int, slices: list[SeqSlice]) -> int:
        """Tokens one more slice may take: the budget's, and the policy's step-cost room."""
        room = self.policy.room(len(slices), sum(len(s.tokens) for s in slices))
        return budget if room is None else min(budget, room)

    def _try_start(self, r: Choice, budget: int, now: float) -> int | None:
        """Give ``r`` a sequence and blocks; return its first chunk's size, or ``None``."""
        if r.stash_key is not None:
            adm = self.kv.restore(r.stash_key, r.tokens, r.stash_tokens, budget, r.block_chain)
            if adm is None:
                return None
            self._stash_bytes.pop(r.stash_key, None)
            r.restored_key, r.stash_key = r.stash_key, None
        else:
            adm = self.kv.allocate(r.tokens, budget, self.copy_source(r), r.block_chain)
            if adm is None:
                return None
        r.seq = adm.seq
        r.num_computed_tokens = adm.num_computed
        if r.cached_tokens is None:
            r.cached_tokens = min(adm.num_computed, r.prompt_len)
        if r.admitted is None:
            r.admitted = now
        elif r.status is ChoiceStatus.PREEMPTED:
            r.resumed_at.append(now)
        r.status = ChoiceStatus.RUNNING
        self._running[r] = None
        self._by_seq[adm.seq] = r
        return adm.num_new

    def copy_source(self, r: Choice) -> tuple[int, int] | None:
        """``(sequence, tokens)``: the sibling sequence whose prompt ``r`` may copy when it
        starts: choice 0's, while it holds it (not so after a crash or preemption)."""
        parent = r.parent
        if parent is None or parent.seq is None:
            return None
        if parent.num_computed_tokens < r.prompt_len - 1:
            return None
        return (parent.seq, r.prompt_len - 1)

    def _slice(self, r: Choice, n: int, now: float) -> SeqSlice:
        assert r.seq is not None
        start = r.num_computed_tokens
        end = start + n
        sample = end == len(r.tokens)
        if r.first_scheduled is None:
            r.first_scheduled = now
        replay: tuple[int, ...] = ()
        if sample:
            if r.needs_replay:
                replay = tuple(r.output)
            r.has_sampler = True
        return SeqSlice(
            seq=r.seq,
            tokens=tuple(r.tokens[start:end]),
            start_pos=start,
            sample=sample,
            owner=r.owner,
            sampling=r.sampling,
            replay=replay,
        )

    def _preempt(self, victim: Choice, now: float) -> None:
        assert victim.seq is not None
        in_use = sum(self._stash_bytes.values())
        mode = self.costs.choose(victim.num_computed_tokens, in_use)
        if mode is PreemptMode.STASH:
            key = f"{victim.owner}#{victim.preemptions + 1}"
            self.kv.stash(victim.seq, key)
            victim.stash_key = key
            victim.stash_tokens = victim.num_computed_tokens
            self._stash_bytes[key] = self.costs.stash_bytes(victim.num_computed_tokens)
        else:
            self.kv.free(victim.seq, victim.num_computed_tokens, keep_cache=True)
            self._drop_sampler(victim)
            victim.num_computed_tokens = 0
        self._leave_running(victim)
        victim.status = ChoiceStatus.PREEMPTED
        victim.preemptions += 1
        victim.preempted_at.append(now)
        self.num_preemptions += 1
        self.policy.waiting.push(victim)

    def _drop_sampler(self, r: Choice) -> None:
        """The worker's sampler goes; the next one is rebuilt from a replay of the outputs."""
        if r.has_sampler:
            self._release.append(r.owner)
            r.has_sampler = False
        r.needs_replay = r.num_output > 0

    def _leave_running(self, r: Choice) -> None:
        if r.seq is not None:
            del self._by_seq[r.seq]
            r.seq = None
        self._running.pop(r, None)
        self.policy.on_left_running(r)

    # ---- results ----

    def update(self, plan: StepPlan, result: StepResult) -> list[Event]:
        now = self.clock.now()
        for info in result.stashed:
            if info.key in self._stash_bytes:
                self._stash_bytes[info.key] = info.n_bytes
        outputs = {o.seq: o for o in result.outputs}
        by_seq, kv, policy = self._by_seq, self.kv, self.policy
        for s in plan.slices:
            r = by_seq.get(s.seq)
            if r is None:
                continue
            r.restored_key = None
            r.num_computed_tokens = end = s.start_pos + len(s.tokens)
            kv.commit(s.seq, r.tokens, end, chain=r.block_chain)
            if r.charged_input < r.prompt_len:  # else all charged: a decode, the common case
                charged = r.charge_input(s.start_pos, end)
                if charged:
                    policy.on_progress(r, charged, 0)
            if r.siblings_blocked and end >= r.prompt_len:
                self._unblock_siblings(r)
            if not s.sample:
                continue
            out = outputs.get(s.seq)
            if out is None:
                self._finish(r, FinishReason.ERROR, "the engine returned no token for it")
                continue
            r.needs_replay = False
            self._on_token(r, out, now)
        policy.on_step(plan, result)
        if self.config.check_integrity:
            self.check_integrity()
        return self.drain_events()

    def _on_token(self, r: Choice, out: SeqOutput, now: float) -> None:
        self.policy.on_progress(r, 0, 1)  # the end-of-generation token too: it was computed
        if r.first_token is None:
            r.first_token = now
        if out.token in self.eog and not r.sampling.ignore_eos:
            r.eog_tokens = 1
            self._finish(r, FinishReason.STOP)
            return
        r.append_output(out, now)
        if self.token_events:
            self._events.append(
                TokenEvent(r.request_id, r.index, out.token, out.logprob, out.top_logprobs)
            )
        n_tokens = len(r.tokens)
        if n_tokens - r.prompt_len >= r.max_tokens or n_tokens >= self.max_seq_tokens:
            self._finish(r, FinishReason.LENGTH)

    def _unblock_siblings(self, r: Choice) -> None:
        for sibling in r.siblings_blocked:
            if sibling.status is ChoiceStatus.BLOCKED:
                sibling.status = ChoiceStatus.WAITING
                self.policy.waiting.push(sibling)
        r.siblings_blocked = []

    def _finish(
        self,
        r: Choice,
        reason: FinishReason,
        error: str | None = None,
        rejection: RejectionKind | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        """End ``r``: free its sequence (or stash), its sampler, and tell the client."""
        if r.is_finished:
            return
        if r.seq is not None:
            self.kv.free(r.seq, r.num_computed_tokens, keep_cache=reason in _CACHEABLE)
            self._leave_running(r)
        if r.stash_key is not None:
            self.kv.drop_stash(r.stash_key)
            self._stash_bytes.pop(r.stash_key, None)
            r.stash_key = None
        self.policy.waiting.remove(r)
        if r.has_sampler:
            self._release.append(r.owner)
            r.has_sampler = False
        if r.siblings_blocked:
            # Choice 0 leaves before its prompt was computed: the others compute it themselves.
            if self._admitting:
                self._unblock_siblings(r)
            else:
                for sibling in r.siblings_blocked:
                    self._finish(sibling, FinishReason.REJECTED, "the server is stopping")
                r.siblings_blocked = []
        r.status = ChoiceStatus.FINISHED
        r.finish_reason = reason
        r.error = error
        r.rejection, r.retry_after_s = rejection, retry_after_s
        r.finished = self.clock.now()
        if reason in _SERVED:
            self.predictor.observe(r)
        self.policy.on_finished(r)
        self._events.append(ChoiceFinished(r.result()))
        group = self._groups.get(r.request_id)
        if group is not None and all(c.is_finished for c in group):
            del self._groups[r.request_id]

    def _apply_cancels(self) -> None:
        for request_id in self._cancels:
            for r in self._groups.get(request_id, ()):
                self._finish(r, FinishReason.CANCELLED)
        self._cancels.clear()

    def _reject_reason(self, req: GenerationRequest) -> str | None:
        if not self._admitting:
            return "the server is stopping"
        if req.request_id in self._groups:
            return f"request id {req.request_id!r} is already in flight"
        if not req.prompt_tokens:
            return "the prompt is empty"
        if req.max_tokens < 1 or req.n < 1:
            return f"max_tokens ({req.max_tokens}) and n ({req.n}) must be >= 1"
        if len(req.prompt_tokens) >= self.max_seq_tokens:
            return (
                f"the prompt has {len(req.prompt_tokens)} tokens; this engine's context "
                f"holds {self.max_seq_tokens} with the output"
            )
        n_vocab = self.info.n_vocab
        if not self.check_token_ids:
            return None
        if min(req.prompt_tokens) < 0 or max(req.prompt_tokens) >= n_vocab:
            bad = [t for t in req.prompt_tokens if not 0 <= t < n_vocab]
            return f"token ids out of the vocabulary: {bad[:5]}"
        return None

    # ---- failures ----

    def on_engine_died(self, plan: StepPlan) -> list[Event]:
        """The worker died running ``plan`` (and was restarted): nothing of it counts.

        Stashes survive. Running requests go back to the queue to be recomputed (prompt and
        outputs prefilled again, outputs replayed to a new sampler), or restored if the plan
        was restoring them. A request the engine died under too often fails (ERROR).
        """
        self.engine_deaths += 1
        stashing = {op.key for op in plan.kv_ops if isinstance(op, Stash)}
        for r, _ in self._forget_engine(wipe=False):
            r.engine_deaths += 1
            if r.engine_deaths >= self.config.max_engine_deaths_per_request:
                self._finish(
                    r, FinishReason.ERROR, f"the engine died {r.engine_deaths} times running it"
                )
            else:
                self.policy.waiting.push(r)
        self._forget_unsaved_stashes(stashing)  # the KV is not known to be saved
        for choices in self._groups.values():
            for r in choices:
                r.has_sampler = False
                r.needs_replay = r.num_output > 0
        self._release.clear()
        self._redo_drops(plan)
        return self.drain_events()

    def _redo_drops(self, plan: StepPlan) -> None:
        """The failed plan's ``DropStash`` never ran: those stashes are still held."""
        for op in plan.kv_ops:
            if isinstance(op, DropStash):
                self.kv.drop_stash(op.key)

    def on_plan_rejected(self, plan: StepPlan, error: str) -> list[Event]:
        """The engine refused ``plan`` (a scheduler bug; nothing changed in the engine).

        The requests it ran fail (ERROR). The engine's sequences are wiped and the other
        running requests are recomputed, so that the accounting is exact again.
        """
        bad = {s.seq for s in plan.slices}
        stashing = {op.key for op in plan.kv_ops if isinstance(op, Stash)}
        forgotten = self._forget_engine(wipe=True)
        self._release.extend(plan.release)  # never applied
        self._redo_drops(plan)
        for r, seq in forgotten:
            if seq in bad:
                self._finish(r, FinishReason.ERROR, f"the engine refused the plan: {error}")
            else:
                if r.stash_key is None:
                    self._drop_sampler(r)
                self.policy.waiting.push(r)
        # The stash never happened and the wipe took the KV: recompute.
        for r in self._forget_unsaved_stashes(stashing):
            self._drop_sampler(r)
        return self.drain_events()

    def _forget_unsaved_stashes(self, keys: set[str]) -> list[Choice]:
        """The choices whose stash was in a failed plan: they hold nothing and recompute."""
        unsaved = []
        for choices in self._groups.values():
            for r in choices:
                if r.stash_key is not None and r.stash_key in keys:
                    self._stash_bytes.pop(r.stash_key, None)
                    r.stash_key = None
                    r.num_computed_tokens = 0
                    unsaved.append(r)
        return unsaved

    def _forget_engine(self, wipe: bool) -> list[tuple[Choice, int]]:
        """No sequence holds anything any more: running requests become preempted.

        A request whose restore was in the failed plan gets its stash back (the plan did not
        run, so the stash is still there); the others will be recomputed.
        """
        forgotten: list[tuple[Choice, int]] = []
        for r in self._running:
            assert r.seq is not None
            forgotten.append((r, r.seq))
            r.seq = None
            self.policy.on_left_running(r)
            r.status = ChoiceStatus.PREEMPTED
            if r.restored_key is not None:
                r.stash_key, r.restored_key = r.restored_key, None
                self._stash_bytes[r.stash_key] = self.costs.stash_bytes(r.stash_tokens)
                r.num_computed_tokens = r.stash_tokens
            else:
                r.num_computed_tokens = 0
        self._running.clear()
        self._by_seq.clear()
        self.kv.reset(wipe_engine=wipe)
        return forgotten


def make_kv(config: SchedulerConfig, info: EngineInfo) -> KvManager | SlotManager:
    """The KV manager for the engine's layout: blocks over one buffer (``kv_unified``), or a
    slot per sequence id (a stream each)."""
    bs = config.block_size
    if info.kv_unified:
        return KvManager(
            config.num_kv_blocks or info.n_ctx // bs,
            bs,
            info.n_seq_max,
            config.enable_prefix_cache,
            max_cached_blocks=None
            if config.prefix_cache_tokens is None
            else config.prefix_cache_tokens // bs,
        )
    slot_tokens = info.n_ctx // info.n_seq_max
    # A stream copy moves every cell of the slot, whatever the prefix: it pays for a prefix
    # that would take longer to compute than the slot's bytes take to copy.
    copy_s = slot_tokens * info.kv_bytes_per_token / config.stream_copy_bytes_per_s
    return SlotManager(
        info.n_seq_max,
        slot_tokens,
        bs,
        config.enable_prefix_cache,
        min_copy_tokens=math.ceil(copy_s * config.prefill_tokens_per_s),
    )
