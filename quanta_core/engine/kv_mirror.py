"""The caller's mirror of what each engine sequence holds, and the plan checks built on it.

Every executor keeps one: the plan is checked against it in full *before* anything is sent,
so an invalid plan changes nothing, and a dead worker's held sequences are known exactly.

    seq 3:  [0 1 2 3 4 5 6]       n_tokens(3) == 7: the next slice of seq 3 starts at 7
    CopyPrefix(src=3, dst=5, 4)   seq 5: [0 1 2 3]
    Truncate(3, start=5)          seq 3: [0 1 2 3 4]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quanta_core.engine.errors import EngineInputError
from quanta_core.engine.types import (
    CopyPrefix,
    DropStash,
    EngineInfo,
    KvOp,
    Restore,
    Stash,
    StepPlan,
    Truncate,
)


@dataclass
class KvMirror:
    n_seq_max: int
    n_ctx: int
    n_batch: int
    n_vocab: int
    lengths: dict[int, int] = field(default_factory=dict)  # seq -> tokens held (non-empty only)
    stash_lengths: dict[str, int] = field(default_factory=dict)  # key -> tokens stashed
    # Off only where every token id is known to be in range without looking (the simulator:
    # the scheduler checked each prompt at submit, and it samples its own tokens).
    check_token_ids: bool = True

    @classmethod
    def for_engine(cls, info: EngineInfo) -> KvMirror:
        # ``n_ctx``: the positions one sequence may hold (its stream's, with one per sequence)
        n_ctx = info.n_ctx if info.kv_unified else info.n_ctx // info.n_seq_max
        return cls(info.n_seq_max, n_ctx, info.n_batch, info.n_vocab)

    def n_tokens(self, seq: int) -> int:
        return self.lengths.get(seq, 0)

    def held_seqs(self) -> frozenset[int]:
        return frozenset(self.lengths)

    def forget_engine(self) -> None:
        """The engine is gone: no sequence holds anything. Stashes stay."""
        self.lengths.clear()

    def check(self, plan: StepPlan) -> None:
        """Raise ``EngineInputError`` unless ``plan`` is valid from the current state."""
        self.after(plan)

    def after(self, plan: StepPlan) -> KvMirror:
        """The state once ``plan`` has run, checked; this mirror is unchanged. Raises
        ``EngineInputError`` for an invalid plan. ``adopt`` it once the engine ran the plan:
        one pass over the plan instead of ``check`` then ``apply`` (the step's hot path)."""
        scratch = KvMirror(
            self.n_seq_max,
            self.n_ctx,
            self.n_batch,
            self.n_vocab,
            dict(self.lengths),
            # only KV ops touch the stashes: a plan without them shares this mirror's
            dict(self.stash_lengths) if plan.kv_ops else self.stash_lengths,
            self.check_token_ids,
        )
        scratch.apply(plan)
        return scratch

    def adopt(self, state: KvMirror) -> None:
        """Take over ``state`` (from ``after``) as the current state."""
        self.lengths = state.lengths
        self.stash_lengths = state.stash_lengths

    def apply(self, plan: StepPlan) -> None:
        """Advance the mirror by ``plan``; raise ``EngineInputError`` on the first fault.

        The slices are checked before any of them is applied, but the KV ops are applied one
        by one: with ops, ``check`` (or ``after``) first, or a fault half-way leaves this
        mirror half-applied. A plan without ops changes nothing when refused.
        """
        for op in plan.kv_ops:
            self._apply_op(op)
        n_seq_max, n_ctx, n_vocab = self.n_seq_max, self.n_ctx, self.n_vocab
        lengths, check_ids = self.lengths, self.check_token_ids
        ends: dict[int, int] = {}  # seq -> its length once the batch is in
        n_batch = 0
        for s in plan.slices:
            seq, tokens, start = s.seq, s.tokens, s.start_pos
            if not 0 <= seq < n_seq_max:
                self._check_seq(seq)
            if seq in ends:
                raise EngineInputError(f"sequence {seq} appears twice in one batch")
            if not tokens:
                raise EngineInputError(f"empty slice for sequence {seq}")
            end = start + len(tokens)
            if end > n_ctx:
                raise EngineInputError(
                    f"sequence {seq}: position {end - 1} overflows the context of {n_ctx}"
                )
            held = lengths.get(seq, 0)
            if start != held:
                raise EngineInputError(
                    f"sequence {seq}: slice starts at position {start}, "
                    f"but the sequence holds {held} tokens"
                )
            if check_ids and (min(tokens) < 0 or max(tokens) >= n_vocab):
                bad = [t for t in tokens if not 0 <= t < n_vocab]
                raise EngineInputError(f"sequence {seq}: token ids out of range: {bad[:5]}")
            ends[seq] = end
            n_batch += end - start
        if n_batch > self.n_batch:
            raise EngineInputError(f"batch of {n_batch} tokens is over n_batch={self.n_batch}")
        lengths.update(ends)

    def _apply_op(self, op: KvOp) -> None:
        match op:
            case CopyPrefix(src=src, dst=dst, n_tokens=n):
                self._check_seq(src)
                self._check_seq(dst)
                if src == dst:
                    raise EngineInputError(f"copy of sequence {src} onto itself")
                if not 0 < n <= self.n_tokens(src):
                    raise EngineInputError(
                        f"copy of {n} tokens from sequence {src}, which holds {self.n_tokens(src)}"
                    )
                if self.n_tokens(dst):
                    raise EngineInputError(f"copy into sequence {dst}, which is not empty")
                self.lengths[dst] = n
            case Truncate(seq=seq, start=start):
                self.check_truncate(op)
                self._set_length(seq, min(self.n_tokens(seq), start))
            case Stash(seq=seq, key=key):
                self._check_seq(seq)
                if not self.n_tokens(seq):
                    raise EngineInputError(f"stash of empty sequence {seq}")
                if key in self.stash_lengths:
                    raise EngineInputError(f"stash key {key!r} already in use")
                self.stash_lengths[key] = self.n_tokens(seq)
                self._set_length(seq, 0)
            case Restore(seq=seq, key=key):
                self._check_seq(seq)
                if key not in self.stash_lengths:
                    raise EngineInputError(f"no stash {key!r}")
                if self.n_tokens(seq):
                    raise EngineInputError(f"restore into sequence {seq}, which is not empty")
                self._set_length(seq, self.stash_lengths.pop(key))
            case DropStash(key=key):
                if key not in self.stash_lengths:
                    raise EngineInputError(f"no stash {key!r}")
                del self.stash_lengths[key]

    def check_truncate(self, op: Truncate) -> None:
        """Raise ``EngineInputError`` unless ``op`` is valid (from any state)."""
        self._check_seq(op.seq)
        if op.start < 0:
            raise EngineInputError(f"truncate of sequence {op.seq} at {op.start}")

    def _set_length(self, seq: int, n: int) -> None:
        if n:
            self.lengths[seq] = n
        else:
            self.lengths.pop(seq, None)

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.n_seq_max:
            raise EngineInputError(f"unknown sequence {seq} (n_seq_max={self.n_seq_max})")
