"""A simulated engine: plans are checked and applied as on the real one, the step's time comes
from the cost model, and the "sampled" tokens are cheap and deterministic.

    plan ─▶ KvMirror (invalid: EngineInputError, nothing changed)
         ─▶ features_of(plan, state before it) ─▶ cost_model.predict (x speed()) ─▶ total_s

``speed``, if given, is the machine's speed at the step (a multiplier read at each step): a
real run's speed over time (``quanta sim --speed-profile``).

Steps that only decode may also be taken in bulk (``decode_seconds`` then ``decode``, for
the loop's ``steady.next_run`` runs): the same mirror, times and tokens as those
steps one by one, without a plan per step. Not with ``speed``: it reads the clock per step.

The executor does not move the clock: the event loop puts the step's end at
``now + total_s``. Token ``k`` of a request is a function of its owner and ``k`` only, so a
sampler rebuilt after a recompute (``replay``) continues the same stream, and no token is ever
an end-of-generation token (workloads fix output lengths with ``max_tokens``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Generator, Sequence

import numpy as np

from quanta_core.engine.errors import EngineInputError
from quanta_core.engine.kv_mirror import KvMirror
from quanta_core.engine.types import (
    EngineInfo,
    KvOp,
    MemoryStats,
    SeqMemory,
    SeqOutput,
    Stash,
    StashInfo,
    StepPlan,
    StepResult,
    StepTimings,
    Truncate,
)
from quanta_core.sim.cost_model import (
    CostModel,
    KvLayout,
    StepFeatures,
    features_of,
    stream_terms,
)
from quanta_core.sim.prompts import int_objects

_MIX = 2654435761  # Knuth's multiplicative hash: spreads k over 32 bits
# A decode run samples its tokens in one array pass from this many on (below, numpy's
# set-up costs more than the loop it replaces).
_ARRAY_TOKENS = 256


class SimExecutor:
    def __init__(
        self, info: EngineInfo, cost_model: CostModel, speed: Callable[[], float] | None = None
    ) -> None:
        self._info = info
        self.cost_model = cost_model
        # ``info``'s layout (run.py's sim_engine_info takes it from the model's calibration:
        # a model prices one layout) and the calibration's micro-batch size.
        self.layout = KvLayout.of(info, int(cost_model.meta.get("n_ubatch", 512)))
        self._speed = speed
        self._mirror = KvMirror.for_engine(info)
        # Prompts were checked at submit and every sampled token is in range (see sample).
        self._mirror.check_token_ids = False
        self._samplers: dict[str, tuple[int, int]] = {}  # owner -> (seed, tokens sampled)
        self._eog = frozenset(info.eog_tokens)
        self._span = info.n_vocab - 1  # tokens 1 .. n_vocab - 1
        self._eog_sampled = sorted(t for t in self._eog if 1 <= t <= self._span)  # can be hit

    @property
    def info(self) -> EngineInfo:
        return self._info

    def step(self, plan: StepPlan) -> StepResult:
        mirror = self._mirror
        features = features_of(plan, mirror.lengths, mirror.stash_lengths, self.layout)
        # Move the mirror past the plan: an invalid plan raises and changes nothing.
        stashed: tuple[StashInfo, ...] = ()
        if plan.kv_ops:
            mirror.adopt(mirror.after(plan))  # ops may touch any sequence or stash: on a copy
            per_token = self._info.kv_bytes_per_token
            stashed = tuple(
                StashInfo(op.key, mirror.stash_lengths[op.key] * per_token)
                for op in plan.kv_ops
                if type(op) is Stash and op.key in mirror.stash_lengths
            )
        else:
            mirror.apply(plan)  # most steps: slices only, checked in full before applied
        for owner in plan.release:
            self._samplers.pop(owner, None)
        sample = self.sample
        outputs = tuple(
            [SeqOutput(s.seq, sample(s.owner, len(s.replay))) for s in plan.slices if s.sample]
        )
        seconds = self.cost_model.predict(features)
        if self._speed is not None:
            seconds *= self._speed()
        return StepResult(
            outputs=outputs,
            stashed=stashed,
            timings=StepTimings(engine_s=seconds, total_s=seconds),
        )

    @property
    def decodes_in_bulk(self) -> bool:
        return self._speed is None

    def decode_seconds(self, seqs: Sequence[int], chunk: int = 1) -> Generator[float, int, None]:
        """The seconds of each next step in which every one of ``seqs`` decodes one token,
        the last one a prompt's ``chunk`` instead when it is above 1 (``step`` of those plans
        would say the same), for as many steps as are asked. ``send(cells)``: the other
        sequences hold ``cells`` fewer from the next step on (``apply_ops`` of a step's
        evictions); ``next``: as many as before."""
        lengths = self._mirror.lengths
        if not self.layout.unified:
            yield from self._stream_decode_seconds(seqs, chunk)
        held = sum(lengths.get(seq, 0) for seq in seqs)
        idle = sum(lengths.values()) - held  # cells of the sequences outside the batch
        if chunk == 1:
            n = len(seqs)
            price = self.cost_model.steady_pricer(n, 1)  # predict(steady_features(...))
            while True:
                held += n  # each slice's own attention: its start + 1 pairs, as its cells
                dropped = yield price(held, held, idle)
                if dropped:
                    idle -= dropped
        n = len(seqs) - 1
        price = self.cost_model.steady_pricer(n, chunk)
        start = lengths.get(seqs[-1], 0)  # the prompt's
        decoded = held - start  # the decoding sequences' cells before the step
        tail = chunk * (chunk + 1) // 2
        while True:
            decoded += n
            pairs = decoded + chunk * start + tail  # attended_pairs(start, chunk)
            start += chunk
            dropped = yield price(pairs, decoded + start, idle)
            if dropped:
                idle -= dropped

    def _stream_decode_seconds(
        self, seqs: Sequence[int], chunk: int
    ) -> Generator[float, int, None]:
        """``decode_seconds`` with a stream per sequence: each step priced from its own
        features (its micro-batches' spans grow with their longest sequence), the other
        sequences' cells costing nothing."""
        starts = [self._mirror.lengths.get(seq, 0) for seq in seqs]
        sizes = [1] * len(seqs)
        if chunk > 1:
            sizes[-1] = chunk
        n_decode = len(seqs) - (chunk > 1)
        prefill = chunk if chunk > 1 else 0
        predict = self.cost_model.predict
        while True:
            slices = list(zip(seqs, starts, sizes, strict=True))
            pairs = sum(n * p + n * (n + 1) // 2 for _, p, n in slices)
            held = sum(p + n for _, p, n in slices)
            read, stream_kv, extra = stream_terms(slices, self.layout)
            f = StepFeatures(
                len(seqs),
                n_decode,
                prefill,
                pairs / 1000.0,
                0.0,
                held / 1000.0,
                stream_read_k=read,
                stream_kv_m=stream_kv,
                extra_passes=extra,
            )
            yield predict(f)  # the others' cells cost nothing here: a drop changes no price
            starts = [p + n for p, n in zip(starts, sizes, strict=True)]

    def apply_ops(self, ops: Sequence[KvOp]) -> int:
        """Run a steady step's KV ops (its evictions: truncations of cache holders, outside
        the batch) as ``step`` runs a plan's, after that step; the cells they freed."""
        if not ops:
            return 0
        mirror = self._mirror
        cuts = [op for op in ops if type(op) is Truncate]
        if len(cuts) != len(ops):
            raise EngineInputError(f"a steady step's ops are truncations only, not {ops}")
        # Checked first, then applied in place: a truncation's checks do not depend on the
        # state, so none can fail half-way.
        for op in cuts:
            mirror.check_truncate(op)
        lengths, dropped = mirror.lengths, 0
        for op in cuts:
            held = lengths.get(op.seq, 0)
            if op.start < held:
                dropped += held - op.start
                if op.start:
                    lengths[op.seq] = op.start
                else:
                    del lengths[op.seq]
        return dropped

    def decode(
        self,
        seqs: Sequence[int],
        starts: Sequence[int],
        owners: Sequence[str],
        steps: int,
        chunk: int = 1,
    ) -> list[list[int]]:
        """Run ``steps`` steps in which sequence ``seqs[i]``, holding ``starts[i]`` tokens,
        decodes one token a step for ``owners[i]`` (the last one a prompt's ``chunk``
        instead, sampling nothing, when ``chunk`` is above 1): the tokens each sampled."""
        mirror = self._mirror
        lengths = mirror.lengths
        per_step = [1] * len(seqs)
        per_step[-1] = chunk
        if sum(per_step) > mirror.n_batch:
            raise EngineInputError(f"batch of {sum(per_step)} tokens is over n_batch")
        for seq, start, n in zip(seqs, starts, per_step, strict=True):
            if lengths.get(seq, 0) != start or start + n * steps > mirror.n_ctx:
                raise EngineInputError(f"sequence {seq}: {steps} steps from {start} do not fit")
        for seq, n in zip(seqs, per_step, strict=True):
            lengths[seq] += n * steps
        if len(owners) * steps >= _ARRAY_TOKENS:
            return self._sample_runs(owners, steps)
        return [self._sample_run(owner, steps) for owner in owners]

    def _advance(self, owner: str, steps: int) -> tuple[int, int]:
        """``owner``'s sampler seed and tokens sampled so far, then ``steps`` more counted
        (no replay: a decode run's samplers exist or start)."""
        state = self._samplers.get(owner)
        seed, k = state if state is not None else (zlib.crc32(owner.encode()), 0)
        self._samplers[owner] = (seed, k + steps)
        return seed, k

    def _sample_runs(self, owners: Sequence[str], steps: int) -> list[list[int]]:
        """``_sample_run`` of every owner, in one array pass: the same integer arithmetic
        (every value fits in 64 bits: seed < 2³², k < 2³¹), the same end-of-generation
        skips."""
        seeds, firsts = zip(*(self._advance(owner, steps) for owner in owners), strict=True)
        k = np.asarray(firsts, dtype=np.int64)[:, None] + np.arange(steps, dtype=np.int64)
        seed = np.asarray(seeds, dtype=np.int64)[:, None]
        span = self._span
        tokens = 1 + ((seed + k * _MIX) & 0xFFFFFFFF) % span
        while True:  # ``while token in eog: token = token % span + 1``, token by token
            hit = None
            for e in self._eog_sampled:
                hit = tokens == e if hit is None else hit | (tokens == e)
            if hit is None or not hit.any():
                break
            tokens[hit] = tokens[hit] % span + 1
        sampled: list[list[int]] = int_objects(span + 1)[tokens].tolist()
        return sampled

    def _sample_run(self, owner: str, steps: int) -> list[int]:
        """``sample`` ``steps`` times (no replay: a decode run's samplers exist or start)."""
        seed, k = self._advance(owner, steps)
        span = self._span
        tokens = [1 + ((seed + i * _MIX) & 0xFFFFFFFF) % span for i in range(k, k + steps)]
        eog = self._eog
        if not eog.isdisjoint(tokens):
            for i, token in enumerate(tokens):
                while token in eog:
                    token = token % span + 1
                tokens[i] = token
        return tokens

    def sample(self, owner: str, replayed: int) -> int:
        """The next token of ``owner`` (a choice), deterministic in its id and position."""
        state = self._samplers.get(owner)
        seed, k = state if state is not None else (zlib.crc32(owner.encode()), replayed)
        self._samplers[owner] = (seed, k + 1)
        token = 1 + ((seed + k * _MIX) & 0xFFFFFFFF) % self._span
        while token in self._eog:
            token = token % self._span + 1
        return token

    def memory_stats(self) -> MemoryStats:
        lengths = self._mirror.lengths
        stashes = self._mirror.stash_lengths
        return MemoryStats(
            sequences=tuple(SeqMemory(seq, 0, n - 1) for seq, n in sorted(lengths.items())),
            stash_bytes=sum(stashes.values()) * self._info.kv_bytes_per_token,
            n_stashes=len(stashes),
        )

    def restart(self) -> None:
        """A simulated engine never dies; a restart still empties it, as a real one would."""
        self._mirror.forget_engine()
        self._samplers.clear()

    def close(self) -> None:
        pass
