"""A step's tempered rows drawn at once: the distribution llama.cpp's chain draws from, each
row's own bias and generator, the same tokens however the rows are split between threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from quanta_core.engine.llama_cpp.sampling import Sampler, TemperedRows
from quanta_core.engine.types import SamplingParams

N_VOCAB = 1000  # not a multiple of the block: the last block is partly padding
EOG = (2, 999)


def sampler(**kw: object) -> Sampler:
    return Sampler(None, N_VOCAB, EOG, SamplingParams(**kw))  # type: ignore[arg-type]


def logits(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 3.0, (rows, N_VOCAB)).astype(np.float32)


def softmax(row: np.ndarray, temperature: float) -> np.ndarray:
    z = row.astype(np.float64) / temperature
    p = np.exp(z - z[np.isfinite(z)].max())
    return p / p.sum()


def test_only_plain_temperature_chains_are_drawn_at_once() -> None:
    assert sampler(temperature=0.7).tempered is not None
    assert sampler(temperature=0.7, logit_bias=((5, 3.0),)).tempered is not None
    assert sampler(temperature=0.0).tempered is None  # greedy: the argmax path
    assert sampler(temperature=0.7, top_p=0.9).tempered is None
    assert sampler(temperature=0.7, top_k=40).tempered is None
    assert sampler(temperature=0.7, min_p=0.05).tempered is None
    assert sampler(temperature=0.7, presence_penalty=0.5).tempered is None


def test_the_draws_follow_the_tempered_softmax() -> None:
    row = logits(1)
    s = sampler(temperature=0.7, seed=3)
    rows = TemperedRows(N_VOCAB)
    n = 20_000
    counts = np.bincount([rows.draw(row, [s])[0] for _ in range(n)], minlength=N_VOCAB)
    p = softmax(row[0], 0.7)
    top = np.argsort(-p)[:5]
    # Binomial standard error at p ~ 0.2 over 20,000 draws is ~0.003: 5 of them is a bug.
    assert np.abs(counts[top] / n - p[top]).max() < 0.015
    # Total variation over the whole vocabulary, against the ~0.06 of sampling noise here.
    assert 0.5 * np.abs(counts / n - p).sum() < 0.08


def test_bias_is_applied_before_the_temperature() -> None:
    row = np.zeros((1, N_VOCAB), dtype=np.float32)
    s = sampler(temperature=0.5, logit_bias=((7, 5.0), (8, float("-inf"))), seed=1)
    rows = TemperedRows(N_VOCAB)
    draws = [rows.draw(row, [s])[0] for _ in range(2000)]
    # exp(5 / 0.5) / (exp(10) + 998): token 7 about 96 % of the time, token 8 never.
    share = draws.count(7) / len(draws)
    assert 0.93 < share < 0.99
    assert 8 not in draws


def test_ignore_eos_and_min_tokens_hold_the_end_back() -> None:
    row = np.zeros((1, N_VOCAB), dtype=np.float32)
    row[0, list(EOG)] = 50.0  # the model wants to stop
    ignoring = sampler(temperature=1.0, ignore_eos=True, seed=1)
    early = sampler(temperature=1.0, min_tokens=3, seed=1)
    rows = TemperedRows(N_VOCAB)
    for _ in range(50):
        assert rows.draw(row, [ignoring])[0] not in EOG
    firsts = []
    for _ in range(3):
        token = rows.draw(row, [early])[0]
        early.accept(token)
        firsts.append(token)
    assert not set(firsts) & set(EOG)
    assert rows.draw(row, [early])[0] in EOG  # after min_tokens, the end is allowed


def test_a_seed_repeats_and_threads_change_nothing() -> None:
    batch = logits(12, seed=5)

    def run(pool: ThreadPoolExecutor | None) -> list[list[int]]:
        samplers = [sampler(temperature=0.9, seed=100 + i) for i in range(12)]
        rows = TemperedRows(N_VOCAB, pool, threads=4)
        rows.SPLIT = 1  # split even this small matrix, one row a thread
        return [rows.draw(batch, samplers) for _ in range(5)]

    alone = run(None)
    with ThreadPoolExecutor(4) as pool:
        assert run(pool) == alone
    assert len({tuple(step) for step in alone}) > 1


@pytest.mark.parametrize("temperature", [0.05, 2.0])
def test_extreme_temperatures_stay_in_the_vocabulary(temperature: float) -> None:
    batch = logits(4, seed=9)
    batch[np.arange(4), batch.argmax(axis=1)] += 1.0  # a clear best token in every row
    samplers = [sampler(temperature=temperature, seed=i) for i in range(4)]
    tokens = TemperedRows(N_VOCAB).draw(batch, samplers)
    assert all(0 <= t < N_VOCAB for t in tokens)
    if temperature < 0.1:  # exp(-1 / 0.05): nearly greedy
        assert tokens == batch.argmax(axis=1).tolist()
