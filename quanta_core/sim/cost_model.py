"""What one engine step costs, as a small linear model fitted from the real engine.

    step_s = per_pass         * 1 if the step runs any token           (a forward pass)
           + per_batched_pass * 1 if it runs more than one token        (the matrix path)
           + per_decode       * decode tokens       (slices of one token, and the last
                                                      token of each chunk that samples)
           + per_prefill      * prefill tokens      (the other tokens of longer slices)
           + per_attended     * attended pairs / 1000
           + per_batch_kv     * batch tokens * the batch's KV cells / 1e6
           + per_kv_held      * the batch's KV cells / 1000
           + per_stash * stashed tokens  + per_restore * restored tokens
           + per_idle_kv      * idle KV cells / 1000
           + per_batch_idle   * batch tokens * idle KV cells / 1e6
           + per_stream_read  * sum over micro-batches of sequences * n_kv / 1000  (streams)
           + per_stream_kv    * sum over micro-batches of tokens * n_kv / 1e6      (streams)
           + per_extra_pass   * micro-batches beyond the first

What each term stands for on llama.cpp's CPU backend:

  per_pass          a forward pass's fixed cost: the graph built and its ~30 layers' thread
                    barriers, the worker's round trip. A stash- or restore-only step runs no
                    pass and does not pay it (with it on every step, the 4 ms stash of 64
                    tokens pulled the fitted intercept to 0).
  per_batched_pass  what a pass of two or more tokens costs on top: llama.cpp multiplies the
                    weights by a vector for one token and takes its matrix path for more.
                    At a short context two sequences cost about three times one, four
                    about the same as two.
  per_decode        a decode token's own work: its share of the weight products, its logits
                    over the vocabulary and its sampler.
  per_prefill       a prefill token's share of the weight products (no logits). A prompt's
                    last chunk samples: its last token has a logits row and a sampler, and
                    is priced as a decode token (a burst's first steps sample a new row
                    for every prompt they finish).
  per_attended      each sequence's own causal attention: a token at position p attends to
                    p + 1 positions, so a slice of n tokens starting at p attends
                    n * p + n * (n + 1) / 2 pairs.
  per_batch_kv      the batch's tokens against all of the batch's cells: a batch costs more
                    than its sequences' own attention, as if every token's row spanned the
                    whole batch's cells in the shared (``kv_unified``) buffer: 16 decodes at
                    512 tokens of context cost 2.2x the same at 128, one sequence 1.3x
                    (bench/results/engine.json).
  per_kv_held       the batch's cells once per step: the views and the mask over them.
  per_stash/restore a token's KV copied to host RAM and back (~22.5 KiB each).
  per_idle_kv       the cells of sequences *not* in the batch (the prefix cache's holders),
  per_batch_idle    per step and per batch token: llama.cpp spans its whole buffer in use,
                    masking them. Cheaper per cell than the batch's own (their cells lie
                    together, the batch's interleave), not free: beside 2,048 idle cells a
                    decode of 1 sequence took 16 % longer, of 16 sequences 7 %
                    (quanta bench cached-cells).
  per_stream_read   with a KV stream per sequence (``kv_unified=False``) a micro-batch
  per_stream_kv     spans ``n_kv`` cells of each of its sequences' streams: the longest of
                    them once the micro-batch is in, padded to 256, at least 256, at most a
                    stream (llama.cpp's ``get_n_kv``). Reading those cells costs per
                    sequence (a decode's attention: memory, on a GPU most of it), scoring
                    them per token (a prompt chunk's, masked or not). The other sequences'
                    streams are not in the step's views: the unified terms above (batch x
                    the batch's cells, the idle cells) are 0 in this layout.
  per_extra_pass    llama.cpp splits a step into micro-batches and runs a forward pass for
                    each: at most ``n_ubatch`` tokens a pass in one buffer; with streams an
                    equal number of tokens from each sequence of a run of *consecutive*
                    sequence ids in batch order (``split_equal``). A mixed step is two passes
                    there (a token of every sequence, then the rest of the chunk), and a
                    decode of ids 0, 2, 4 three.

"The batch's KV cells" are the cells its sequences hold once the batch is in; "idle cells"
those every other sequence holds before the step (a cached prefix shared with a running
sequence is counted with both). Every coefficient is in seconds, so the model reads as "a
decode token costs 3 ms, ...". A file without the idle or the stream terms (fitted before
they existed) loads with them at 0, and predicts as it did.

Which layout a model prices is its calibration's engine (``meta["kv_unified"]``); the
features are counted for a ``KvLayout``, and a simulated engine takes the model's.

The file (``config/cost_models/<model>__<machine>.json``, ``...__streams.json`` for a stream
per sequence) is the coefficients plus how they
were measured: the model file, the machine, the threads, the fit's error, and the reference
probe's time (``meta.probe``) that ``quanta calibrate --probe-only`` compares against.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from quanta_core.engine.types import EngineInfo, Restore, SeqSlice, Stash, StepPlan

# /2: per_pass (was "intercept", paid by every step) and per_batched_pass.
SCHEMA = "quanta.cost_model/2"
_OLD_SCHEMAS = ("quanta.cost_model/1",)


class StepFeatures(NamedTuple):
    """What a step's cost depends on, counted from its plan.

    The pass indicators are derived from the token counts, not stored: a samples file written
    before they existed is fitted with them all the same. A named tuple, not a frozen
    dataclass: the simulator builds one per step, and a tuple is built several times faster."""

    seqs: int = 0  # slices in the batch (not a regressor: decode tokens and prefill say it)
    decode_tokens: int = 0
    prefill_tokens: int = 0
    attended_k: float = 0.0  # attended (query, key) pairs of each sequence's own, in thousands
    batch_kv_m: float = 0.0  # batch tokens x the batch's KV cells, in millions
    kv_held_k: float = 0.0  # the KV cells of the batch's sequences once it is in, in thousands
    stash_tokens: int = 0
    restore_tokens: int = 0
    idle_k: float = 0.0  # KV cells of the sequences outside the batch, in thousands
    batch_idle_m: float = 0.0  # batch tokens x those cells, in millions
    # Of the prefill tokens, the last of each chunk that samples (last, so that a step
    # trace or samples file written before it loads with 0).
    sampled_chunks: int = 0
    # Streams only: each micro-batch's sequences x its n_kv, in thousands; tokens x n_kv,
    # in millions; summed over the micro-batches.
    stream_read_k: float = 0.0
    stream_kv_m: float = 0.0
    extra_passes: int = 0  # micro-batches (forward passes) beyond the first

    def as_row(self) -> tuple[float, ...]:
        """The regressors in ``COEFFICIENTS`` order."""
        tokens = self.decode_tokens + self.prefill_tokens
        return (
            1.0 if tokens else 0.0,
            1.0 if tokens > 1 else 0.0,
            float(self.decode_tokens + self.sampled_chunks),
            float(self.prefill_tokens - self.sampled_chunks),
            self.attended_k,
            self.batch_kv_m,
            self.kv_held_k,
            float(self.stash_tokens),
            float(self.restore_tokens),
            self.idle_k,
            self.batch_idle_m,
            self.stream_read_k,
            self.stream_kv_m,
            float(self.extra_passes),
        )


# Also the fit's priority: a column that depends on earlier ones is not fitted (set to 0).
COEFFICIENTS = (
    "per_pass",
    "per_batched_pass",
    "per_decode",
    "per_prefill",
    "per_attended",
    "per_batch_kv",
    "per_kv_held",
    "per_stash",
    "per_restore",
    "per_idle_kv",
    "per_batch_idle",
    "per_stream_read",
    "per_stream_kv",
    "per_extra_pass",
)

# llama.cpp pads a step's KV span to a multiple of this (and never below it).
KV_PAD = 256


@dataclass(frozen=True, slots=True)
class KvLayout:
    """How the engine lays out its KV cells, as far as a step's price depends on it.

    unified   one buffer for every sequence (``kv_unified=True``): a step spans every cell
              in use, its own sequences' and the others'
    streams   a stream of ``stream_cells`` cells per sequence: a micro-batch spans its own
              sequences' streams up to the longest of them (see ``micro_batches``)
    """

    unified: bool = True
    stream_cells: int = 0  # n_ctx / n_seq_max where not unified
    n_ubatch: int = 512  # most tokens in one forward pass

    @classmethod
    def of(cls, info: EngineInfo, n_ubatch: int = 512) -> KvLayout:
        n_ubatch = max(1, min(n_ubatch, info.n_batch))
        if info.kv_unified:
            return cls(True, 0, n_ubatch)
        return cls(False, info.n_ctx // max(info.n_seq_max, 1), n_ubatch)

    def n_kv(self, held: int) -> int:
        """The cells a stream holding ``held`` tokens spans: padded, within the stream."""
        padded = max(KV_PAD, -(-held // KV_PAD) * KV_PAD)
        return min(padded, self.stream_cells) if self.stream_cells else padded


UNIFIED = KvLayout()


def micro_batches(slices: Sequence[tuple[int, int]], n_ubatch: int) -> list[list[tuple[int, int]]]:
    """How llama.cpp splits a batch for a stream per sequence (``split_equal``, sequential):
    ``slices`` are (sequence, tokens) in batch order; each micro-batch is (sequence, tokens
    it takes) for a run of ids that rise by one in batch order, each taking the same count.

        [(0, 1), (1, 1), (2, 120)]   ->  [[(0, 1), (1, 1), (2, 1)], [(2, 119)]]
        [(0, 1), (2, 1), (4, 1)]     ->  [[(0, 1)], [(2, 1)], [(4, 1)]]
        [(3, 1), (1, 1), (4, 1)]     ->  [[(3, 1), (4, 1)], [(1, 1)]]
    """
    left = [[seq, n] for seq, n in slices if n > 0]
    out: list[list[tuple[int, int]]] = []
    while left:
        run: list[list[int]] = []
        for item in left:  # a sequence's tokens are contiguous: its first unused one
            if not run or item[0] == run[-1][0] + 1:
                run.append(item)
                if len(run) > n_ubatch:
                    break
        each = min(min(item[1] for item in run), max(1, n_ubatch // len(run)))
        out.append([(item[0], each) for item in run])
        for item in run:
            item[1] -= each
        left = [item for item in left if item[1] > 0]
    return out


def stream_terms(
    slices: Sequence[tuple[int, int, int]], layout: KvLayout
) -> tuple[float, float, int]:
    """``(stream_read_k, stream_kv_m, extra_passes)`` of a batch of (sequence, start,
    tokens) slices in batch order. In one buffer: no stream terms, a pass per ``n_ubatch``
    tokens."""
    if layout.unified:
        tokens = sum(n for _, _, n in slices)
        return 0.0, 0.0, max(0, -(-tokens // layout.n_ubatch) - 1)
    held = {seq: start for seq, start, _ in slices}
    read = span = 0
    batches = micro_batches([(seq, n) for seq, _, n in slices], layout.n_ubatch)
    for mb in batches:
        longest = 0
        for seq, n in mb:
            held[seq] += n
            longest = max(longest, held[seq])
        n_kv = layout.n_kv(longest)
        read += len(mb) * n_kv
        span += sum(n for _, n in mb) * n_kv
    return read / 1000.0, span / 1e6, len(batches) - 1


def attended_pairs(start_pos: int, n_tokens: int) -> int:
    return n_tokens * start_pos + n_tokens * (n_tokens + 1) // 2


def features_of(
    plan: StepPlan,
    lengths: Mapping[int, int],
    stash_lengths: Mapping[str, int],
    layout: KvLayout = UNIFIED,
) -> StepFeatures:
    """Count ``plan``'s features on an engine of ``layout``. ``lengths`` (tokens each
    sequence holds) and ``stash_lengths`` (tokens each stash holds) are the state *before*
    the plan.

    The batch's cells are each sliced sequence's length once its slice is in; the idle cells
    every other sequence's length before the plan (its ops are not followed: a step that
    stashes or truncates a bystander is rare)."""
    stash = restore = 0
    ops, slices = plan.kv_ops, plan.slices
    if ops:  # most steps have none (the simulator counts every step)
        stash = sum(lengths.get(op.seq, 0) for op in ops if isinstance(op, Stash))
        restore = sum(stash_lengths.get(op.key, 0) for op in ops if isinstance(op, Restore))
    decode = prefill = pairs = held = held_before = sampled = 0
    for s in slices:
        n, start = len(s.tokens), s.start_pos
        if n == 1:
            decode += 1
            pairs += start + 1  # attended_pairs(start, 1), inline: most slices are decodes
        else:
            prefill += n
            pairs += attended_pairs(start, n)
            sampled += s.sample
        held += start + n
        held_before += lengths.get(s.seq, 0)
    batch = decode + prefill
    stream_read, stream_kv, extra = _stream_terms_of(slices, layout, batch)
    if layout.unified:
        idle = sum(lengths.values()) - held_before if batch else 0
        batch_kv = batch * held / 1e6
    else:  # the step's views hold its own streams only
        idle, batch_kv = 0, 0.0
    # ``_make`` from a tuple in field order: the simulator builds one per step, and the named
    # tuple's constructor takes its arguments at twice the cost.
    return StepFeatures._make(
        (
            len(slices),  # seqs
            decode,
            prefill,
            pairs / 1000.0,  # attended_k
            batch_kv,  # batch_kv_m
            held / 1000.0 if batch else 0.0,  # kv_held_k
            stash,
            restore,
            idle / 1000.0,  # idle_k
            batch * idle / 1e6,  # batch_idle_m
            sampled,  # sampled_chunks
            stream_read,  # stream_read_k
            stream_kv,  # stream_kv_m
            extra,  # extra_passes
        )
    )


def _stream_terms_of(
    slices: Sequence[SeqSlice], layout: KvLayout, batch: int
) -> tuple[float, float, int]:
    if layout.unified:  # most steps fit one pass: no list built
        return 0.0, 0.0, max(0, -(-batch // layout.n_ubatch) - 1) if batch else 0
    return stream_terms([(s.seq, s.start_pos, len(s.tokens)) for s in slices], layout)


def steady_features(n_decode: int, chunk: int, pairs: int, held: int, idle: int) -> StepFeatures:
    """``features_of`` a step of ``n_decode`` one-token slices and, if ``chunk`` > 1, one
    prefill slice of ``chunk`` tokens: ``pairs`` attended in all, ``held`` cells once it is
    in, ``idle`` cells held by the others. The same numbers, computed the same way, without
    a plan (the simulator's steady runs)."""
    prefill = chunk if chunk > 1 else 0
    batch = n_decode + prefill
    return StepFeatures._make(
        (
            n_decode + (prefill > 0),
            n_decode,
            prefill,
            pairs / 1000.0,
            batch * held / 1e6,
            held / 1000.0,
            0,
            0,
            idle / 1000.0,
            batch * idle / 1e6,
            0,  # a steady run's chunk does not sample
            0.0,  # one buffer (a stream per sequence is priced step by step)
            0.0,
            0,
        )
    )


@dataclass(frozen=True, slots=True)
class CostModel:
    per_pass: float = 0.0
    per_batched_pass: float = 0.0
    per_decode: float = 0.0
    per_prefill: float = 0.0
    per_attended: float = 0.0
    per_batch_kv: float = 0.0
    per_kv_held: float = 0.0
    per_stash: float = 0.0
    per_restore: float = 0.0
    per_idle_kv: float = 0.0
    per_batch_idle: float = 0.0
    per_stream_read: float = 0.0
    per_stream_kv: float = 0.0
    per_extra_pass: float = 0.0
    # How it was measured: model, machine, threads, grid, the fit's error. Free-form, kept.
    meta: Mapping[str, Any] = field(default_factory=dict)

    def predict(self, f: StepFeatures) -> float:
        """Seconds for a step with features ``f``; an empty step costs nothing."""
        seconds = self.per_stash * f.stash_tokens + self.per_restore * f.restore_tokens
        tokens = f.decode_tokens + f.prefill_tokens
        if tokens:
            seconds += (
                self.per_pass
                + (self.per_batched_pass if tokens > 1 else 0.0)
                + self.per_decode * (f.decode_tokens + f.sampled_chunks)
                + self.per_prefill * (f.prefill_tokens - f.sampled_chunks)
                + self.per_attended * f.attended_k
                + self.per_batch_kv * f.batch_kv_m
                + self.per_kv_held * f.kv_held_k
                + self.per_idle_kv * f.idle_k
                + self.per_batch_idle * f.batch_idle_m
                + self.per_stream_read * f.stream_read_k
                + self.per_stream_kv * f.stream_kv_m
                + self.per_extra_pass * f.extra_passes
            )
        return max(0.0, seconds)

    def steady_pricer(self, n_decode: int, chunk: int) -> Callable[[int, int, int], float]:
        """``pricer(pairs, held, idle)``: ``predict(steady_features(n_decode, chunk, pairs,
        held, idle))``, the same float operations in the same order, without building the
        features (a decode run prices each of its steps)."""
        prefill = chunk if chunk > 1 else 0
        batch = n_decode + prefill
        if not batch:
            return lambda pairs, held, idle: max(0.0, self.per_stash * 0 + self.per_restore * 0)
        base = self.per_stash * 0 + self.per_restore * 0
        fixed = (
            self.per_pass
            + (self.per_batched_pass if batch > 1 else 0.0)
            + self.per_decode * n_decode
            + self.per_prefill * prefill
        )
        attended, batch_kv, kv_held = self.per_attended, self.per_batch_kv, self.per_kv_held
        idle_kv, batch_idle = self.per_idle_kv, self.per_batch_idle

        def pricer(pairs: int, held: int, idle: int) -> float:
            seconds = base + (
                fixed
                + attended * (pairs / 1000.0)
                + batch_kv * (batch * held / 1e6)
                + kv_held * (held / 1000.0)
                + idle_kv * (idle / 1000.0)
                + batch_idle * (batch * idle / 1e6)
            )
            return max(0.0, seconds)

        return pricer

    def scaled(self, factor: float) -> CostModel:
        """This model with every step ``factor`` times as long (``meta["speed_factor"]``).

        Every term is linear, so scaling the coefficients scales each prediction exactly:
        how ``quanta sim --speed-factor`` replays a calibration on a machine that now runs
        the reference probe ``factor`` times slower."""
        if not factor > 0:
            raise ValueError(f"a speed factor must be above 0, not {factor}")
        scaled = {name: factor * value for name, value in self.coefficients().items()}
        previous = float(self.meta.get("speed_factor", 1.0))
        return CostModel(**scaled, meta={**self.meta, "speed_factor": previous * factor})

    def coefficients(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in COEFFICIENTS}

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "coefficients": self.coefficients(), "meta": dict(self.meta)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CostModel:
        if not isinstance(doc, Mapping):
            raise ValueError("not a cost model file (not a JSON object)")
        schema = doc.get("schema")
        if schema in _OLD_SCHEMAS:
            # Not loaded with the new terms at 0: its intercept was paid by stash-only steps
            # too, and its other terms were fitted without a batched pass to absorb its cost.
            raise ValueError(
                f"cost model schema {schema} predates the per-pass and batched-pass terms "
                f"({SCHEMA}): fit it again with `quanta calibrate --refit SAMPLES.json` "
                "or `quanta calibrate`"
            )
        if schema != SCHEMA:
            raise ValueError(f"not a cost model file (schema {schema!r}, want {SCHEMA})")
        coefficients = doc.get("coefficients")
        if not isinstance(coefficients, Mapping):
            raise ValueError("cost model file has no 'coefficients' object")
        unknown = set(coefficients) - set(COEFFICIENTS)
        if unknown:
            raise ValueError(f"unknown cost model coefficients: {sorted(unknown)}")
        values = {name: float(coefficients.get(name, 0.0)) for name in COEFFICIENTS}
        return cls(**values, meta=dict(doc.get("meta") or {}))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> CostModel:
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read cost model {path}: {exc}") from exc
        try:
            return cls.from_json(doc)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
