"""Steps taken in bulk: a stretch of cycles whose plans are known in advance (the simulator).

When every running request is decoding (and at most one, last in the slice order, is being
prefilled a chunk of what the budget leaves), and nothing can change the scheduler's next
plans but an event from outside (an arrival, a cancel), the next plans are certain: each
decoding request gets one token a step, the prompt its next chunk, in the same order, no KV op,
nothing admitted. The scheduler says how many such steps are certain
(``Scheduler.steady_decodes``, a ``DecodeRun``); the simulator runs as many as end before its
next event and hands the sampled tokens and the steps' end times to
``Scheduler.run_decodes``, which leaves every structure exactly as those cycles one by one
would have:

    cycle j (one by one)     schedule: grow each sequence, in slice order (new blocks at a
                             block boundary, from the free ones, else by evicting cached
                             ones: Truncate ops the engine runs after the step is priced)
                             update:   hash each full block, in slice order; one token each
                             decoding request, the chunk charged to the prompt's tenant
    in bulk                  all the grows in (step, slice) order, then all the hashes in
                             (step, slice) order: grows touch the pool, hashes the cache, and
                             a block is always grown before it is hashed in both orders; the
                             policy's charges in (step, slice) order (``on_steady_steps``)
    in bulk, evicting        the grows step by step, each step's truncations run in the
                             engine before the next step is priced (``RunGrowth``); then the
                             hashes, skipping a hash an entry evicted later still held

What makes a step differ from the one before, and so ends a run (it is then taken one by one):
a request's last token (it finishes), a prompt's last chunk (it samples, and leaves budget to
admit with), a block boundary with neither a free nor a cached block left (a preemption), a
block boundary that evicts while a waiting request is short of blocks by less than the free
and cached ones (an eviction could shorten its prefix hit and let it start), a waiting request
that might start, a policy whose answers move with each step
(``Policy.steady_decodes``), a waiting request the policy would start some steps in
(``Policy.steady_held``: ``horizon``'s memory gate, as the running set nears its projected
ends), and any event from outside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quanta_core.engine.types import KvOp
from quanta_core.kv.kv_manager import KvManager
from quanta_core.kv.slots import SlotManager
from quanta_core.scheduler.choice import Choice


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


def grow_and_hash(kv: KvManager | SlotManager, run: DecodeRun, steps: int) -> None:
    """The KV side of ``steps`` steps of ``run`` whose blocks come from free ones, in the
    order the cycles would have done it (the choices' tokens already hold what the steps
    sampled)."""
    grows, hashes = block_events(kv, run, steps)
    seqs, starts, choices = run.seqs, run.starts, run.choices
    for j, i in grows:
        if not kv.grow(seqs[i], starts[i] + run.per_step(i) * j):
            raise RuntimeError(f"a steady run of sequence {seqs[i]} found no free block")
    for i, seq in enumerate(seqs):
        kv.grow(seq, starts[i] + run.per_step(i) * steps)  # within its blocks: the count alone
    for j, i in hashes:
        r = choices[i]
        kv.commit(seqs[i], r.tokens, starts[i] + run.per_step(i) * j, chain=r.block_chain)


class RunGrowth:
    """The KV side of a run whose grows evict cached blocks, a step at a time: ``grow(j)``
    makes step ``j``'s grows (in slice order, evicting as ``schedule`` would) and returns the
    KV ops they queued, which the engine runs before step ``j + 1`` (its idle cells change
    with them). The hashes wait for the sampled tokens (``finish``): an eviction only drops
    cache entries and a hash only adds one to a running (never evicted) block, so taking the
    hashes after the grows gives the same cache, provided a hash that an entry evicted after
    its step still held is not taken by the new block (``KvManager.commit``'s
    ``evicted_after``)."""

    def __init__(self, kv: KvManager | SlotManager, run: DecodeRun) -> None:
        self.kv, self.run = kv, run
        self._grows, self._hashes = block_events(kv, run, run.steps)
        self._next = 0  # the first grow not made yet
        self._evicted_at: dict[int, int] = {}  # cache entry's hash -> the step that evicted it
        self.steps = 0  # steps whose grows are made

    def grow(self, j: int) -> list[KvOp]:
        if j != self.steps + 1:
            raise ValueError(f"step {j} of a run grown to step {self.steps}")
        kv, run, grows = self.kv, self.run, self._grows
        log: list[int] = []
        kv.forget_log = log
        try:
            k = self._next
            while k < len(grows) and grows[k][0] == j:
                i = grows[k][1]
                if not kv.grow(run.seqs[i], run.starts[i] + run.per_step(i) * j):
                    raise RuntimeError(f"a steady run of sequence {run.seqs[i]} found no block")
                k += 1
            self._next = k
        finally:
            kv.forget_log = None
        for h in log:
            self._evicted_at[h] = j
        self.steps = j
        return kv.drain_ops()

    def finish(self, steps: int) -> None:
        """The rest of the KV side of the run's first ``steps`` steps (all grown)."""
        if steps != self.steps:
            raise ValueError(f"{steps} steps of a run grown to step {self.steps}")
        kv, run = self.kv, self.run
        seqs, starts, choices = run.seqs, run.starts, run.choices
        for i, seq in enumerate(seqs):
            kv.grow(seq, starts[i] + run.per_step(i) * steps)  # within its blocks
        evicted = self._evicted_at
        for j, i in self._hashes:
            if j > steps:
                break
            end = starts[i] + run.per_step(i) * j
            r = choices[i]
            kv.commit(seqs[i], r.tokens, end, evicted, j, r.block_chain)


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
