"""Per-request samplers, built from ``SamplingParams`` (runs in the worker).

Most rows of a step need no chain: a greedy row is the logits' argmax, and a row drawn at a
temperature with at most a logit bias (no truncation, penalty or grammar) is one draw from
softmax((logits + bias) / T). Those rows are drawn for the whole step in a few passes over the
logits matrix (``greedy_rows``, ``TemperedRows``) instead of a llama.cpp chain per row, which
copies the whole vocabulary into a candidate array each time (~0.4 ms a row at 49k tokens,
~1.8 ms at 128k: most of a GPU step at 64 streams). The other rows run their chain.

A grammar over a 49k-token vocabulary is slow to apply to every candidate (most of a second
per token for JSON here), so — as llama.cpp's own common sampler does — the chain samples
without it first and the grammar checks only the chosen token; only when it refuses is the
grammar applied to the whole vocabulary and the token drawn again.
"""

from __future__ import annotations

import ctypes
import itertools
import random
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np

from quanta_core.engine.types import SamplingParams

NEG_INF = float("-inf")
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)


class SamplingError(ValueError):
    """The parameters cannot make a sampler (e.g. a grammar that does not parse)."""


def build_chain(n_vocab: int, eog: Iterable[int], params: SamplingParams) -> Any:
    """A llama.cpp sampler chain, in llama.cpp's own order: logit bias, penalties, the
    truncations (top-k, top-p, min-p), temperature, then the draw (or greedy)."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = llama_cpp.llama_sampler_chain_add
    biases = list(params.logit_bias)
    if params.ignore_eos:
        biases += [(t, NEG_INF) for t in eog]
    if biases:
        array = (llama_cpp.llama_logit_bias * len(biases))(
            *(llama_cpp.llama_logit_bias(token, bias) for token, bias in biases)
        )
        add(chain, llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(biases), array))
    if params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0:
        add(
            chain,
            llama_cpp.llama_sampler_init_penalties(
                n_vocab,
                params.penalty_last_n,
                params.repetition_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            ),
        )
    if params.greedy:
        add(chain, llama_cpp.llama_sampler_init_greedy())
        return chain
    if params.top_k > 0:
        add(chain, llama_cpp.llama_sampler_init_top_k(params.top_k))
    if params.top_p < 1.0:
        add(chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
    if params.min_p > 0.0:
        add(chain, llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
    add(chain, llama_cpp.llama_sampler_init_temp(params.temperature))
    seed = params.seed if params.seed is not None else random.getrandbits(32)
    add(chain, llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))
    return chain


class Sampler:
    """One request's sampler: a chain, and a grammar checked lazily when there is one.

    ``min_tokens``: until that many tokens were accepted, the end-of-generation tokens' logits
    are set to -inf in the step's logits before the draw (the chain itself cannot change).
    """

    def __init__(self, vocab: Any, n_vocab: int, eog: Iterable[int], params: SamplingParams):
        eog = tuple(eog)
        self._eog = np.array(eog, dtype=np.int64)
        self._min_tokens = 0 if params.ignore_eos else params.min_tokens
        self._accepted = 0
        self._grammar = None
        if params.grammar is not None:
            self._grammar = llama_cpp.llama_sampler_init_grammar(
                vocab, params.grammar.encode(), b"root"
            )
            if not self._grammar:
                raise SamplingError("the grammar does not parse")
        self._chain = build_chain(n_vocab, eog, params)
        self._n_vocab = n_vocab
        self.plain_greedy = _plain_greedy(params, eog) if self._grammar is None else None
        self.tempered = _tempered(params, eog) if self._grammar is None else None
        if self.tempered is not None:
            seed = params.seed if params.seed is not None else random.getrandbits(64)
            self.rng = np.random.default_rng(seed)
        self._candidates = np.empty(n_vocab, dtype=TOKEN_DATA) if self._grammar else None
        self._one = np.empty(1, dtype=TOKEN_DATA) if self._grammar else None

    def sample(self, ctx: Any, idx: int) -> int:
        """Draw a token from the logits of batch row ``idx`` and accept it."""
        early = self._accepted < self._min_tokens
        if self._grammar is None and not early:
            self._accepted += 1
            return int(llama_cpp.llama_sampler_sample(self._chain, ctx, idx))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, idx), (self._n_vocab,))
        if early:
            logits[self._eog] = NEG_INF
        if self._grammar is None:
            self._accepted += 1
            return int(llama_cpp.llama_sampler_sample(self._chain, ctx, idx))
        token = self._draw(logits, with_grammar=False)
        if not self._grammar_allows(token):
            token = self._draw(logits, with_grammar=True)
        self.accept(token)
        return token

    def tempered_bias(self) -> Bias:
        """This step's bias for a tempered draw: the end held back until ``min_tokens``."""
        assert self.tempered is not None
        if self._accepted < self._min_tokens:
            return self.tempered.early_bias
        return self.tempered.bias

    def accept(self, token: int) -> None:
        self._accepted += 1
        if self._grammar is not None:
            llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)

    def free(self) -> None:
        llama_cpp.llama_sampler_free(self._chain)
        if self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)

    def _draw(self, logits: np.ndarray, *, with_grammar: bool) -> int:
        cand = self._candidates
        assert cand is not None
        cand["id"] = np.arange(self._n_vocab, dtype=np.int32)
        cand["logit"] = logits
        cand["p"] = 0.0
        array = _token_array(cand)
        if with_grammar:
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(array))
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(array))
        chosen = _as_records(array)[array.selected]
        return int(chosen["id"])

    def _grammar_allows(self, token: int) -> bool:
        one = self._one
        assert one is not None
        one[0] = (token, 1.0, 0.0)
        array = _token_array(one)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(array))
        return bool(np.isfinite(one[0]["logit"]))


def _plain_greedy(params: SamplingParams, eog: Iterable[int]) -> frozenset[int] | None:
    """For a greedy chain without state (no penalties) and no bias above zero: the tokens
    it biases. Its choice is then the logits' argmax, unless that is one of these tokens;
    None for any other chain."""
    if not params.greedy or params.presence_penalty or params.frequency_penalty:
        return None
    if params.repetition_penalty != 1.0 or (params.min_tokens and not params.ignore_eos):
        return None  # a penalty's state, or the end held back for the first tokens
    if any(bias > 0 for _, bias in params.logit_bias):
        return None
    biased = {token for token, bias in params.logit_bias if bias != 0}
    if params.ignore_eos:
        biased.update(eog)
    return frozenset(biased)


@dataclass(frozen=True)
class Bias:
    """Logit bias as two arrays: token ids and what is added to their logits."""

    ids: np.ndarray
    values: np.ndarray

    @classmethod
    def of(cls, pairs: Iterable[tuple[int, float]]) -> Bias:
        merged: dict[int, float] = {}
        for token, bias in pairs:  # llama.cpp adds every entry: repeats add up
            merged[token] = merged.get(token, 0.0) + bias
        ids = np.fromiter(merged, dtype=np.int64, count=len(merged))
        return cls(ids, np.fromiter(merged.values(), dtype=np.float32, count=len(merged)))


@dataclass(frozen=True)
class Tempered:
    """A chain that is only a temperature and a logit bias: drawn with ``TemperedRows``."""

    temperature: float
    bias: Bias
    early_bias: Bias  # with the end-of-generation tokens at -inf (``min_tokens``)


def _tempered(params: SamplingParams, eog: Iterable[int]) -> Tempered | None:
    if params.greedy or params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0.0:
        return None
    if params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0:
        return None
    pairs = list(params.logit_bias)
    held = [(t, NEG_INF) for t in eog]
    if params.ignore_eos:
        pairs += held
    return Tempered(params.temperature, Bias.of(pairs), Bias.of(pairs + held))


class TemperedRows:
    """Draws a token for each of many rows of logits at once, each row with its own
    temperature, bias and generator: exactly softmax((logits + bias) / T), as llama.cpp's
    temperature and distribution samplers draw it.

    The draw is by inverse CDF in two levels, so that no pass builds a cumulative sum of the
    whole vocabulary: the rows' exponentials are summed in blocks of ``BLOCK`` tokens, the
    uniform draw picks a block from the blocks' running sum and a token inside the block from
    that block's. Rows are split between ``pool``'s threads where the matrix is large (numpy
    releases the GIL in these passes)."""

    BLOCK = 256
    # Logits a thread takes at least, and the most threads: past these, starting and joining
    # threads costs more than it saves (measured on a 16-core GPU host: 16 x 128k logits in
    # 3.7 ms on one thread, 2.0 ms on four, 4.3 ms on sixteen).
    SPLIT = 1 << 19
    MAX_THREADS = 8

    def __init__(self, n_vocab: int, pool: Executor | None = None, threads: int = 1) -> None:
        self._n_vocab = n_vocab
        self._n_blocks = -(-n_vocab // self.BLOCK)
        self._scratch = np.zeros((0, self._n_blocks * self.BLOCK), dtype=np.float32)
        self._pool = pool
        self._threads = threads

    def draw(self, logits: np.ndarray, samplers: Sequence[Sampler]) -> list[int]:
        """One token per row of ``logits`` (rows, n_vocab), row ``i`` drawn by ``samplers[i]``
        (each with ``tempered`` set); ``logits`` is read, never written."""
        rows = len(samplers)
        if len(self._scratch) < rows:
            self._scratch = np.zeros((rows, self._n_blocks * self.BLOCK), dtype=np.float32)
        chunks = 1
        if self._pool is not None:
            chunks = max(1, min(rows, self._threads, self.MAX_THREADS, logits.size // self.SPLIT))
        bounds = np.linspace(0, rows, chunks + 1).astype(int)
        parts = [(int(a), int(b)) for a, b in itertools.pairwise(bounds) if b > a]
        if len(parts) == 1:
            return self._draw(logits, samplers, *parts[0])
        assert self._pool is not None
        futures = [self._pool.submit(self._draw, logits, samplers, a, b) for a, b in parts]
        return [token for f in futures for token in f.result()]

    def _draw(self, logits: np.ndarray, samplers: Sequence[Sampler], a: int, b: int) -> list[int]:
        block, v = self.BLOCK, self._n_vocab
        exps = self._scratch[a:b]
        w = exps[:, :v]
        np.copyto(w, logits[a:b])
        for i, sampler in enumerate(samplers[a:b]):
            bias = sampler.tempered_bias()
            if len(bias.ids):
                np.add.at(w[i], bias.ids, bias.values)
        w -= w.max(axis=1, keepdims=True)
        temps = np.array([s.tempered.temperature for s in samplers[a:b]], dtype=np.float32)  # type: ignore[union-attr]
        w *= (1.0 / temps)[:, None]
        np.exp(w, out=w)  # the tail past n_vocab stays 0
        sums = np.cumsum(
            exps.reshape(b - a, self._n_blocks, block).sum(axis=2), axis=1, dtype=np.float64
        )
        tokens = []
        for i, sampler in enumerate(samplers[a:b]):
            u = sampler.rng.random() * sums[i, -1]
            k = min(int(np.searchsorted(sums[i], u, side="right")), self._n_blocks - 1)
            inside = np.cumsum(exps[i, k * block : (k + 1) * block], dtype=np.float64)
            left = u - (sums[i, k - 1] if k else 0.0)
            j = min(int(np.searchsorted(inside, left, side="right")), block - 1)
            while exps[i, k * block + j] == 0.0 and j > 0:  # rounding at a block's end
                j -= 1
            tokens.append(k * block + j)
        return tokens


def greedy_rows(logits: np.ndarray) -> np.ndarray:
    """The argmax of every row of a (rows, n_vocab) logits matrix: the first highest, as
    llama.cpp's greedy sampler picks it. One pass for the whole batch instead of a candidate
    array of the whole vocabulary per sequence (measured: bench/results/gpu/README.md)."""
    tokens: np.ndarray = logits.argmax(axis=1)
    return tokens


def _token_array(records: np.ndarray) -> Any:
    pointer = records.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
    return llama_cpp.llama_token_data_array(pointer, len(records), -1, False)


def _as_records(array: Any) -> np.ndarray:
    """The array's current contents (samplers may shrink it and move its data pointer)."""
    raw = ctypes.cast(
        array.data, ctypes.POINTER(ctypes.c_uint8 * (array.size * TOKEN_DATA.itemsize))
    )
    return np.frombuffer(raw.contents, dtype=TOKEN_DATA)


class SamplerSet:
    """The live samplers, one per owner (request choice). They outlive stash/restore."""

    def __init__(self, vocab: Any, n_vocab: int, eog: tuple[int, ...]) -> None:
        self._vocab = vocab
        self._n_vocab = n_vocab
        self._eog = eog
        self._samplers: dict[str, Sampler] = {}

    def get(self, owner: str, params: SamplingParams, replay: Iterable[int]) -> Sampler:
        sampler = self._samplers.get(owner)
        if sampler is None:
            sampler = Sampler(self._vocab, self._n_vocab, self._eog, params)
            for token in replay:  # resume grammar and penalty state after a recompute
                sampler.accept(token)
            self._samplers[owner] = sampler
        return sampler

    def release(self, owner: str) -> None:
        sampler = self._samplers.pop(owner, None)
        if sampler is not None:
            sampler.free()

    def __len__(self) -> int:
        return len(self._samplers)
