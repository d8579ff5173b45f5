"""A deterministic executor with no model, for scheduler tests.

It keeps each sequence's tokens and "samples" a token that depends on the whole sequence
(like a model would), so a scheduler that loses, duplicates or misplaces a token changes the
output. End of generation comes only from a script: ``eos_after[owner] = n`` makes that
request's n-th sampled token the end-of-generation token.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from quanta_core.engine.errors import EngineDied
from quanta_core.engine.kv_mirror import KvMirror
from quanta_core.engine.types import (
    CopyPrefix,
    DropStash,
    EngineInfo,
    MemoryStats,
    Restore,
    SeqMemory,
    SeqOutput,
    Stash,
    StashInfo,
    StepPlan,
    StepResult,
    Truncate,
)

FAKE_EOS = 0
KV_BYTES_PER_TOKEN = 1024


def fake_next_token(tokens: list[int], n_vocab: int) -> int:
    """A token that depends on every token of the sequence, never the EOS token."""
    digest = hashlib.blake2b(repr(tokens).encode(), digest_size=8).digest()
    return 1 + int.from_bytes(digest, "little") % (n_vocab - 1)


@dataclass
class FakeExecutor:
    n_ctx: int = 4096
    n_seq_max: int = 16
    n_batch: int = 512
    n_vocab: int = 1000
    kv_unified: bool = True  # False: a stream of n_ctx / n_seq_max cells per sequence
    eos_after: Mapping[str, int] = field(default_factory=dict)
    crash_at_step: int | None = None  # raise EngineDied on this step number (0-based)
    steps: list[StepPlan] = field(default_factory=list)  # every plan that ran, in order
    restarts: int = 0
    _contents: dict[int, list[int]] = field(default_factory=dict)
    _stashes: dict[str, list[int]] = field(default_factory=dict)
    _sampled: dict[str, int] = field(default_factory=dict)  # owner -> tokens sampled so far
    _mirror: KvMirror = field(init=False)

    def __post_init__(self) -> None:
        self._mirror = KvMirror.for_engine(self.info)

    @property
    def mirror(self) -> KvMirror:
        """What the engine holds: sequence lengths and stashes, as the worker's mirror."""
        return self._mirror

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(
            n_ctx=self.n_ctx,
            n_seq_max=self.n_seq_max,
            n_batch=self.n_batch,
            n_vocab=self.n_vocab,
            eog_tokens=(FAKE_EOS,),
            kv_bytes_per_token=KV_BYTES_PER_TOKEN,
            kv_unified=self.kv_unified,
            model_name="fake",
        )

    def step(self, plan: StepPlan) -> StepResult:
        self._mirror.check(plan)
        if self.crash_at_step is not None and len(self.steps) == self.crash_at_step:
            held = self._mirror.held_seqs()
            self._mirror.forget_engine()
            self._contents.clear()
            self._sampled.clear()
            self.crash_at_step = None
            raise EngineDied("fake engine crashed", held, exit_code=-9)
        self._mirror.apply(plan)
        self.steps.append(plan)
        stashed = [self._apply_op(op) for op in plan.kv_ops]
        for owner in plan.release:
            self._sampled.pop(owner, None)
        outputs = []
        for s in plan.slices:
            seq_tokens = self._contents.setdefault(s.seq, [])
            seq_tokens.extend(s.tokens)
            if s.sample:
                outputs.append(SeqOutput(s.seq, self._sample(seq_tokens, s.owner, s.replay)))
        return StepResult(
            outputs=tuple(outputs), stashed=tuple(info for info in stashed if info is not None)
        )

    def _sample(self, seq_tokens: list[int], owner: str, replay: tuple[int, ...]) -> int:
        if owner not in self._sampled:
            self._sampled[owner] = len(replay)
        self._sampled[owner] += 1
        if self.eos_after.get(owner) == self._sampled[owner]:
            return FAKE_EOS
        return fake_next_token(seq_tokens, self.n_vocab)

    def _apply_op(self, op: object) -> StashInfo | None:
        match op:
            case CopyPrefix(src=src, dst=dst, n_tokens=n):
                self._contents[dst] = self._contents[src][:n]
            case Truncate(seq=seq, start=start):
                del self._contents.setdefault(seq, [])[start:]
            case Stash(seq=seq, key=key):
                self._stashes[key] = self._contents.pop(seq)
                return StashInfo(key, len(self._stashes[key]) * KV_BYTES_PER_TOKEN)
            case Restore(seq=seq, key=key):
                self._contents[seq] = self._stashes.pop(key)
            case DropStash(key=key):
                del self._stashes[key]
        return None

    def contents(self, seq: int) -> list[int]:
        """The tokens ``seq`` holds (for assertions)."""
        return list(self._contents.get(seq, []))

    def memory_stats(self) -> MemoryStats:
        return MemoryStats(
            sequences=tuple(
                SeqMemory(seq, 0, n - 1) for seq, n in sorted(self._mirror.lengths.items())
            ),
            stash_bytes=sum(len(t) for t in self._stashes.values()) * KV_BYTES_PER_TOKEN,
            n_stashes=len(self._stashes),
        )

    def restart(self) -> None:
        self.restarts += 1
        self._mirror.forget_engine()
        self._contents.clear()
        self._sampled.clear()

    def close(self) -> None:
        pass
