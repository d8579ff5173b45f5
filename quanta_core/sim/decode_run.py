"""Steps taken in bulk: a stretch of cycles whose plans are known in advance.

When every running request is decoding (and at most one, last in the slice order, is being
prefilled a chunk of what the budget leaves), and nothing can change the scheduler's next
plans but an event from outside (an arrival, a cancel), the next plans are certain: each
decoding request gets one token a step, the prompt its next chunk, in the same order, no KV op,
nothing admitted. ``steady.next_run`` says how many such steps are certain (a ``DecodeRun``);
the loop runs as many as end before its next event and hands the sampled tokens and the steps'
end times to ``take_run``, which leaves every structure exactly as those cycles one by one
would have, through the scheduler's, KV manager's and policy's public calls:

    cycle j (one by one)     schedule: grow each sequence, in slice order (new blocks at a
                             block boundary, from the free ones, else by evicting cached
                             ones: Truncate ops the engine runs after the step is priced)
                             update:   hash each full block, in slice order; one token each
                             decoding request, the chunk charged to the prompt's tenant;
                             the policy's ``on_progress`` per slice, then its ``on_step``
    in bulk                  all the grows in (step, slice) order, then all the hashes in
                             (step, slice) order: grows touch the pool, hashes the cache, and
                             a block is always grown before it is hashed in both orders; the
                             policy's calls in (step, slice) order
    in bulk, evicting        the grows step by step, each step's truncations run in the
                             engine before the next step is priced (``RunGrowth``); then the
                             hashes (``steady`` ends such a run before a step that evicts a
                             cached block whose hash a prompt's chunk computes earlier in it:
                             one by one, that block would not have become the cache entry)

Why hashes may wait for the grows while evicting: an eviction only drops cache entries of
cached blocks and a hash only adds one to a running (never evicted) block. A block a decode
fills holds a token its request sampled there; no cached block holds that chain (a request's
own cached blocks, kept when it was preempted, are those its restart found again, none
deeper), so no hash a decode computes met an entry evicted later in the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quanta_core.engine.types import KvOp, SeqOutput, SeqSlice, StepPlan, StepResult, StepTimings
from quanta_core.kv.kv_manager import KvManager
from quanta_core.kv.slots import SlotManager
from quanta_core.scheduler.choice import Choice, ChoiceStatus
from quanta_core.scheduler.policies.base import Policy
from quanta_core.scheduler.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """Up to ``steps`` steps of the slices of ``choices`` (in slice order) on ``seqs``,
    which hold ``starts`` computed tokens: one token a step each, except the last one's
    ``chunk`` when that is above 1 (a prompt's chunk, nothing sampled). ``owners``: the
    sampler of each choice that samples (the decoding ones)."""

    choices: tuple[Choice, ...]
    seqs: tuple[int, ...]
    starts: tuple[int, ...]
    owners: tuple[str, ...]
    steps: int
    chunk: int = 1
    # Of ``steps``, how many take their new blocks from free ones only; in the later ones a
    # block boundary evicts a cached block (``RunGrowth``: the simulator takes them step by
    # step on the KV side, as the engine's idle cells change with each eviction).
    free_steps: int | None = None  # None: all of them

    def per_step(self, i: int) -> int:
        """Tokens slice ``i`` computes a step."""
        return self.chunk if i == len(self.seqs) - 1 else 1


def block_events(
    kv: KvManager | SlotManager, run: DecodeRun, steps: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The (step, slice) pairs, in that order, whose slice needs a new block in that step
    (grows) and after which one of its blocks is full (hashes), over ``steps`` steps."""
    bs = kv.block_size
    grows: list[tuple[int, int]] = []  # (step, slice): a step whose slice needs new blocks
    hashes: list[tuple[int, int]] = []  # (step, slice): a step after which a block is full
    for i, (seq, start) in enumerate(zip(run.seqs, run.starts, strict=True)):
        n = run.per_step(i)
        reserved = kv.num_blocks_of(seq) * bs
        if n == 1:
            j = reserved - start + 1  # the first step whose token needs a block
            while j <= steps:
                grows.append((j, i))
                j += bs
            j = bs - start % bs  # the first step after which a block is full
            while j <= steps:
                hashes.append((j, i))
                j += bs
            continue
        for j in range(1, steps + 1):
            end = start + n * j
            if end > reserved:
                grows.append((j, i))
                reserved = -(-end // bs) * bs
            if end // bs > (end - n) // bs:
                hashes.append((j, i))
    grows.sort()
    hashes.sort()
    return grows, hashes


class RunGrowth:
    """The KV side of a run, a step at a time on the grows: ``grow(j)`` makes step ``j``'s
    grows (in slice order, evicting as ``schedule`` would) and returns the KV ops they
    queued, which the engine runs before step ``j + 1`` (its idle cells change with them).
    The hashes wait for the sampled tokens (``finish``); see the module's docstring."""

    def __init__(self, kv: KvManager | SlotManager, run: DecodeRun) -> None:
        self.kv, self.run = kv, run
        self._grows, self._hashes = block_events(kv, run, run.steps)
        self._next = 0  # the first grow not made yet
        self.steps = 0  # steps whose grows are made

    def grow(self, j: int) -> list[KvOp]:
        if j != self.steps + 1:
            raise ValueError(f"step {j} of a run grown to step {self.steps}")
        kv, run, grows = self.kv, self.run, self._grows
        k = self._next
        while k < len(grows) and grows[k][0] == j:
            i = grows[k][1]
            if not kv.grow(run.seqs[i], run.starts[i] + run.per_step(i) * j):
                raise RuntimeError(f"a steady run of sequence {run.seqs[i]} found no block")
            k += 1
        self._next = k
        self.steps = j
        return kv.drain_ops()

    def grow_all(self, steps: int) -> None:
        """Every grow of the first ``steps`` steps at once (a run whose blocks come from free
        ones: no op, nothing between the steps to run)."""
        for j in range(self.steps + 1, steps + 1):
            if self.grow(j):
                raise RuntimeError(f"step {j} of a run from free blocks evicted a cached one")

    def finish(self, steps: int) -> None:
        """The rest of the KV side of the run's first ``steps`` steps (all grown)."""
        if steps != self.steps:
            raise ValueError(f"{steps} steps of a run grown to step {self.steps}")
        kv, run = self.kv, self.run
        seqs, starts, choices = run.seqs, run.starts, run.choices
        for i, seq in enumerate(seqs):
            kv.grow(seq, starts[i] + run.per_step(i) * steps)  # within its blocks
        for j, i in self._hashes:
            if j > steps:
                break
            r = choices[i]
            kv.commit(seqs[i], r.tokens, starts[i] + run.per_step(i) * j, chain=r.block_chain)


def take_run(
    sched: Scheduler,
    run: DecodeRun,
    steps: int,
    tokens: Sequence[Sequence[int]],
    ends: Sequence[float],
    growth: RunGrowth | None = None,
    seconds: Sequence[float] = (),
    ops: Sequence[Sequence[KvOp]] = (),
) -> None:
    """Take in ``steps`` (at most ``run.steps``) steps of ``run`` at once, as ``schedule``
    and ``update`` one by one would have: ``tokens[i]`` are what ``run.choices[i]`` sampled
    (the decoding ones), one a step, the steps ending at ``ends``, each taking ``seconds``
    of the engine's time and leading with ``ops`` (a step's evictions; for a policy that
    learns from steps: ``on_step``). No token may end a generation (the simulated engine
    never samples one). ``growth``: the run's grows already made, step by step (none: all
    from free blocks, made here)."""
    if not 0 < steps <= run.steps or len(ends) != steps:
        raise ValueError(f"{steps} steps ({len(ends)} ends) of a run of {run.steps}")
    if seconds and len(seconds) != steps:
        raise ValueError(f"{len(seconds)} step times for {steps} steps")
    decoding = run.choices if run.chunk == 1 else run.choices[:-1]
    starts = run.starts  # before the tokens are taken in: the slices' positions
    eog = sched.eog
    for r, sampled in zip(decoding, tokens, strict=True):
        if r.status is not ChoiceStatus.RUNNING or len(sampled) != steps:
            raise RuntimeError(f"{r.owner} is not in the steady run it was handed")
        take_tokens(r, sampled, ends, eog)
    prefill, charges = None, []
    if run.chunk > 1:
        prefill = run.choices[-1]
        charges = prefill_chunks(prefill, run.chunk, steps)
    if growth is None:
        if run.free_steps is not None and steps > run.free_steps:
            raise ValueError(f"{steps} steps of a run that evicts after {run.free_steps}")
        growth = RunGrowth(sched.kv, run)
        growth.grow_all(steps)
    elif growth.run is not run:
        raise ValueError("the growth of another run")
    growth.finish(steps)
    policy = sched.policy
    if type(policy).on_progress is not Policy.on_progress:
        charge_steps(policy, decoding, steps, prefill, charges)
    if type(policy).on_step is not Policy.on_step:
        plans = run_plans(run, starts, steps, ops, not sched.info.kv_unified)
        for j, plan in enumerate(plans):
            policy.on_step(plan, run_result(run, plan, tokens, j, seconds[j] if seconds else 0.0))
    if sched.config.check_integrity:
        sched.check_integrity()


def charge_steps(
    policy: Policy,
    decoding: Sequence[Choice],
    steps: int,
    prefill: Choice | None,
    charges: Sequence[int],
) -> None:
    """``on_progress`` as ``steps`` steps one by one would have called it: one token for each
    of ``decoding`` (in this order), then ``charges[j]`` new prompt tokens of ``prefill`` in
    step ``j``."""
    for j in range(steps):
        for r in decoding:
            policy.on_progress(r, 0, 1)
        if prefill is not None and charges[j]:
            policy.on_progress(prefill, charges[j], 0)


def run_plans(
    run: DecodeRun, starts: Sequence[int], steps: int, ops: Sequence[Sequence[KvOp]], by_seq: bool
) -> list[StepPlan]:
    """The plans of the run's first ``steps`` steps (``ops[j]``: step ``j``'s KV ops),
    their slices as ``schedule`` lays them out (``by_seq``: in sequence-id order, as a
    stream per sequence has them)."""
    plans = []
    order = sorted(range(len(run.seqs)), key=run.seqs.__getitem__) if by_seq else None
    for j in range(steps):
        slices = []
        for i, r in enumerate(run.choices):
            n = run.per_step(i)
            start = starts[i] + n * j
            slices.append(
                SeqSlice(
                    seq=run.seqs[i],
                    tokens=tuple(r.tokens[start : start + n]),
                    start_pos=start,
                    sample=n == 1,  # a decode; a prompt's chunk in a run is never its last
                    owner=r.owner,
                    sampling=r.sampling,
                )
            )
        if order is not None:
            slices = [slices[i] for i in order]
        plans.append(StepPlan(tuple(ops[j]) if ops else (), tuple(slices)))
    return plans


def run_result(
    run: DecodeRun, plan: StepPlan, tokens: Sequence[Sequence[int]], j: int, seconds: float
) -> StepResult:
    """The engine's result of step ``j`` of ``run`` (``plan``): each decode's token."""
    by_seq = {seq: row[j] for seq, row in zip(run.seqs, tokens, strict=False)}
    outputs = tuple(SeqOutput(s.seq, by_seq[s.seq]) for s in plan.slices if s.sample)
    return StepResult(outputs=outputs, timings=StepTimings(engine_s=seconds, total_s=seconds))


def take_tokens(
    r: Choice, tokens: Sequence[int], ends: Sequence[float], eog: frozenset[int]
) -> None:
    """``r`` sampled ``tokens``, one a step, at ``ends`` (none of them its last)."""
    if not r.sampling.ignore_eos and not eog.isdisjoint(tokens):
        raise RuntimeError(f"{r.owner}: a bulk step sampled an end-of-generation token")
    if r.first_token is None:
        r.first_token = ends[0]
    r.tokens.extend(tokens)
    r.token_times.extend(ends)
    if r.sampling.logprobs is not None:
        r.logprobs.extend([None] * len(tokens))
        r.top_logprobs.extend([()] * len(tokens))
    r.num_computed_tokens += len(tokens)
    r.needs_replay = False
    r.has_sampler = True
    r.restored_key = None


def prefill_chunks(r: Choice, chunk: int, steps: int) -> list[int]:
    """``r`` was prefilled ``chunk`` tokens a step for ``steps`` steps (none sampled): the
    prompt tokens each step computed for the first time (what its tenant is charged)."""
    charges = []
    start = r.num_computed_tokens
    for j in range(steps):
        charges.append(r.charge_input(start + chunk * j, start + chunk * (j + 1)))
    r.num_computed_tokens = start + chunk * steps
    r.restored_key = None
    return charges
