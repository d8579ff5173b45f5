"""When the scheduler's next plans are certain: the steady decode runs the simulator takes in
bulk (``decode_run``), read from the scheduler's, KV manager's and policy's public queries.

What makes a step differ from the one before, and so ends a run (it is then taken one by one):
a request's last token (it finishes), a prompt's last chunk (it samples, and leaves budget to
admit with), a block boundary with neither a free nor a cached block left (a preemption), a
block boundary that evicts while a waiting request is short of blocks by less than the free
and cached ones (an eviction could shorten its prefix hit and let it start), a block boundary
that evicts after a prompt's chunk computed the hash of a cached block (one by one, that block
was still the cache entry then), a waiting request that might start, a policy whose answers
move with each step (``Policy.steady_steps``: ``horizon``'s memory gate, say, as the running
set nears its projected ends), and any event from outside.
"""

from __future__ import annotations

from collections.abc import Sequence

from quanta_core.kv.kv_manager import KvManager, cdiv
from quanta_core.kv.prefix_cache import BlockChain
from quanta_core.kv.slots import SlotManager
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.config import StepLimits
from quanta_core.scheduler.policies.base import StartDecision
from quanta_core.scheduler.scheduler import Scheduler
from quanta_core.sim.decode_run import DecodeRun


def next_run(sched: Scheduler, limit: int, evict: bool = False) -> DecodeRun | None:
    """The next cycles, if nothing comes from outside, while their plans are certain:
    every running request decodes one token a step in the same order, and one of them,
    last in that order, may be prefilled a chunk of what the budget leaves a step (not
    its last chunk); no KV op, nothing starts, finishes or is preempted. At most ``limit``
    steps; ``None`` when fewer than two are certain. ``evict``: its later steps may evict
    cached blocks at block boundaries (the caller takes those with ``RunGrowth``), unless
    that could let a waiting request start. Changes nothing."""
    if sched.token_events or sched.has_boundary_work:
        return None
    running, policy, kv = sched.running, sched.policy, sched.kv
    if not running or kv.has_pending_ops:
        return None  # ops lead the next plan (a finish's truncation, say)
    steps, max_seq = limit, sched.max_seq_tokens
    prefilling: Choice | None = None
    for r in running:  # the cheap tests first: they fail most cycles that are not steady
        n_tokens = len(r.tokens)
        if r.siblings_blocked:
            return None
        if n_tokens - r.num_computed_tokens != 1:
            if prefilling is not None:
                return None  # two prompts share what is left: step by step
            prefilling = r
            continue
        if r.needs_replay or r.charged_input < r.prompt_len:
            return None
        # Its last token's step finishes it: that one is taken one by one.
        steps = min(steps, min(r.prompt_len + r.max_tokens, max_seq) - n_tokens - 1)
    if steps < 2:
        return None
    steps = policy.steady_steps(running, steps)
    if steps < 2:
        return None
    limits = policy.limits(running, sched.base_limits)
    order = policy.order_running(list(running))
    n = len(order)
    if n != len(running) or n > limits.token_budget or policy.make_room(running, limits):
        return None
    if any(policy.defers(r) for r in order):
        return None
    chunk = 1
    if prefilling is not None:
        # Last, it takes all the budget leaves (so nothing is admitted beside it); its
        # last chunk samples and leaves budget over: that step is taken one by one.
        chunk = limits.token_budget - (n - 1)
        if order[-1] is not prefilling or chunk < 2:
            return None
        todo = prefilling.num_tokens - prefilling.num_computed_tokens
        steps = min(steps, (todo - 1) // chunk)
    elif policy.waiting:
        holds = nothing_starts(sched, n, limits)
        if holds is None:
            return None
        evict = evict and holds
    if steps < 2:
        return None
    seqs = tuple(r.seq for r in order if r.seq is not None)
    starts = tuple(r.num_computed_tokens for r in order)
    per_step = list(zip(seqs, starts, [1] * (n - 1) + [chunk], strict=True))
    free_steps = steps_from_free(kv, per_step, steps)
    if evict and free_steps < steps:
        steps = steps_from_free(kv, per_step, steps, evict=True)
        if prefilling is not None and isinstance(kv, KvManager):
            steps = min(steps, max(free_steps, _first_cached_hash(kv, prefilling, chunk, steps)))
    else:
        steps = free_steps
    if steps < 2:
        return None
    sampled = order if chunk == 1 else order[:-1]
    owners = tuple(r.owner for r in sampled)
    return DecodeRun(tuple(order), seqs, starts, owners, steps, chunk, free_steps)


def nothing_starts(sched: Scheduler, n_decoding: int, limits: StepLimits) -> bool | None:
    """Whether the scheduler's admission beside ``n_decoding`` decodes starts nobody, now and
    while they only decode: ``None`` if not known; ``True`` if even when their growth evicts
    cached blocks; ``False`` if only while it takes free ones (the head's shortfall of blocks
    only grows then; an eviction may unpin its prefix hit's blocks: ``start_stays_blocked``)."""
    policy, kv, running = sched.policy, sched.kv, sched.running
    budget = limits.token_budget - n_decoding
    if budget <= 0 or len(running) >= limits.max_running:
        return True
    if kv.num_seqs_available <= 0:
        return True  # an eviction turns a holder's id free: the count stays
    r = policy.waiting.peek()
    if r is None:
        return True
    room = policy.room(n_decoding, n_decoding)
    allowed = budget if room is None else min(budget, room)
    if allowed <= 0:
        return True
    decision = policy.may_start(r, running)
    if decision is StartDecision.STOP:
        return True
    if decision is StartDecision.SKIP:
        return None  # who comes after it is another question: not known to hold
    if r.stash_key is not None:
        # A restore needs fresh blocks, and every block grown takes one, evicted or free.
        return True if restore_stays_blocked(kv, r.tokens, r.stash_tokens, allowed) else None
    copy_from, chain = sched.copy_source(r), r.block_chain
    seqs = [o.seq for o in running if o.seq is not None]
    if start_stays_blocked(kv, r.tokens, allowed, copy_from, chain, seqs, evict=True):
        return True
    if start_stays_blocked(kv, r.tokens, allowed, copy_from, chain, seqs):
        return False
    return None


def start_stays_blocked(
    kv: KvManager | SlotManager,
    tokens: Sequence[int],
    budget: int,
    copy_from: tuple[int, int] | None = None,
    chain: BlockChain | None = None,
    running: Sequence[int] = (),
    evict: bool = False,
) -> bool:
    """Whether the KV manager's ``allocate`` (same arguments) fails now and goes on failing
    while the ``running`` sequences only grow (nothing freed, started or, unless ``evict``,
    evicted).

    In one buffer growing only takes free blocks, so the shortfall stays unless the prefix
    found in the cache deepens (a deeper hit shares blocks instead of reserving them): that
    takes a running sequence that holds the hit's chain (or a start of it) and hashes its next
    blocks. If one could, the answer is ``False`` (not known to stay), as it is when the start
    fails for another reason or might succeed. ``evict``: also while that growth evicts cached
    blocks. An eviction may cut the hit short and unpin its blocks, but a shorter hit never
    needs fewer blocks (the need is min(the prompt's blocks - the hit's, the budget's blocks))
    and every block grown takes one from free plus cached: it stays if the need is above free
    plus cached, pinned or not. With a slot per sequence growing never takes a slot: a start
    fails on and on only for want of one (or of room in one)."""
    if isinstance(kv, SlotManager):
        return kv.num_seqs_available == 0 or len(tokens) > kv.slot_tokens
    need = kv.start_need(tokens, budget, copy_from, chain)
    if need is None:
        return False
    if need.blocks <= kv.num_free_blocks - (0 if evict else need.pinned):
        return False
    if copy_from is not None or not kv.enable_prefix_cache:
        return True  # a sibling's prompt is a fixed prefix; no cache, no hit
    hit = need.hit
    depth = len(hit)
    if depth >= (len(tokens) - 1) // kv.block_size:
        return True  # the hit is as deep as a start may share
    for seq in running:
        hashes = kv.block_hashes(seq)
        if len(hashes) <= depth and tuple(hashes) == hit[: len(hashes)]:
            return False  # its next blocks may carry on the hit's chain
    return True


def restore_stays_blocked(
    kv: KvManager | SlotManager, tokens: Sequence[int], n_stashed: int, budget: int
) -> bool:
    """Whether the KV manager's ``restore`` fails now for want of blocks (or of a slot), and
    so goes on failing while the running sequences only grow: they never give any back."""
    if isinstance(kv, SlotManager):
        return kv.num_seqs_available == 0 or len(tokens) > kv.slot_tokens
    num_new = min(len(tokens) - n_stashed, budget)
    return num_new > 0 and cdiv(n_stashed + num_new, kv.block_size) > kv.num_free_blocks


def steps_from_free(
    kv: KvManager | SlotManager,
    seqs: Sequence[tuple[int, int, int]],
    limit: int,
    evict: bool = False,
) -> int:
    """The most steps (up to ``limit``) in which each ``(seq, computed, per_step)`` grows
    ``per_step`` tokens a step with the blocks it lacks all taken from free ones (no cached
    block evicted); ``evict``: from free ones and then cached ones, evicted as ``grow`` does
    (each eviction frees the block and its holders' deeper ones, all cached: every block
    grown takes one from free plus cached, and no more). A slot per sequence: within it."""
    if isinstance(kv, SlotManager):
        steps = limit
        for _, computed, n in seqs:
            steps = min(steps, (kv.slot_tokens - computed) // n)
        return max(steps, 0)
    bs = kv.block_size
    needs: list[int] = []  # the step that needs each new block, one entry per block
    for seq, computed, n in seqs:
        reserved = kv.num_blocks_of(seq) * bs
        if n == 1:
            needs.extend(range(reserved - computed + 1, limit + 1, bs))
            continue
        for j in range(1, limit + 1):
            end = computed + n * j
            while end > reserved:
                needs.append(j)
                reserved += bs
    free = kv.num_free_blocks - (0 if evict else kv.num_cached_blocks)
    if len(needs) <= free:
        return limit
    needs.sort()
    return needs[free] - 1  # the step before the first block beyond the free ones


def _first_cached_hash(kv: KvManager, r: Choice, chunk: int, limit: int) -> int:
    """The first of the next ``limit`` steps after which ``r``'s prompt, prefilled ``chunk``
    tokens a step, fills a block whose hash a cached block carries (``limit`` if none): one by
    one that block does not become the cache entry, so no later step of the run may evict the
    cached one (it would, taken in bulk)."""
    bs, start = kv.block_size, r.num_computed_tokens
    first = start // bs  # the first block not full yet
    last = (start + chunk * limit) // bs  # the blocks full after ``limit`` steps
    chain = r.block_chain
    chain.upto(r.tokens, bs, last)
    for b in range(first, last):
        if kv.caches(chain.hashes[b]):
            return cdiv((b + 1) * bs - start, chunk)  # the step that fills block ``b``
    return limit
