"""The real engine: SmolLM2-135M in a llama.cpp worker process, driven step by step."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from quanta_core.engine import (
    CopyPrefix,
    DropStash,
    EngineDied,
    EngineHung,
    EngineInputError,
    Restore,
    SamplingParams,
    SeqSlice,
    Stash,
    StepPlan,
    Truncate,
)
from quanta_core.engine.config import EngineConfig
from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor
from quanta_core.engine.llama_cpp.grammar import json_object_grammar
from quanta_core.engine.llama_cpp.tokenizer import Tokenizer
from quanta_core.kv import KvManager

pytestmark = pytest.mark.model

N_SEQ = 8


@pytest.fixture(scope="module")
def tok(model_path: Path) -> Iterator[Tokenizer]:
    t = Tokenizer.load(str(model_path))
    yield t
    t.close()


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[LlamaCppExecutor]:
    config = EngineConfig(
        model_path=str(model_path),
        n_ctx=2048,
        n_seq_max=N_SEQ,
        n_batch=256,
        n_ubatch=256,
        threads=2,
        step_timeout_s=30,
    )
    ex = LlamaCppExecutor.start(config)
    yield ex
    ex.close()


@pytest.fixture(autouse=True)
def empty_engine(engine: LlamaCppExecutor) -> Iterator[None]:
    """Every test starts and ends with an empty engine (all sequences freed)."""
    yield
    held = [s.seq for s in engine.memory_stats().sequences]
    engine.step(StepPlan(kv_ops=tuple(Truncate(seq) for seq in held)))


def greedy_alone(engine: LlamaCppExecutor, seq: int, prompt: list[int], n: int) -> list[int]:
    """Reference: one sequence, prompt in one step, then one decode per step."""
    owner = f"alone-{seq}-{len(prompt)}-{prompt[-1]}"
    out = engine.step(StepPlan(slices=(SeqSlice(seq, tuple(prompt), 0, True, owner),)))
    tokens = [out.outputs[0].token]
    pos = len(prompt)
    for _ in range(n - 1):
        res = engine.step(StepPlan(slices=(SeqSlice(seq, (tokens[-1],), pos, True, owner),)))
        tokens.append(res.outputs[0].token)
        pos += 1
    engine.step(StepPlan(kv_ops=(Truncate(seq),), release=(owner,)))
    return tokens


PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "def fibonacci(n):\n    ",
    "List three colours: red,",
]


def test_batched_steps_match_each_sequence_alone(engine: LlamaCppExecutor, tok: Tokenizer) -> None:
    prompts = [tok.encode(p) for p in PROMPTS]
    n_new = 12
    alone = [greedy_alone(engine, 0, p, n_new) for p in prompts]

    # Together: seq 0 prefills alone; seq 1 joins while 0 decodes (a mixed batch); seq 2's
    # prompt is chunked over two steps; seq 3 joins last. Every step is one llama_decode.
    generated: dict[int, list[int]] = {i: [] for i in range(4)}
    pos = {i: 0 for i in range(4)}
    pending = {i: list(p) for i, p in enumerate(prompts)}
    joins = {0: 0, 1: 1, 2: 2, 3: 4}
    chunk = {2: 3}  # seq 2: 3 prompt tokens at a time
    step = 0
    while any(len(g) < n_new for g in generated.values()):
        slices = []
        for i in range(4):
            if step < joins[i] or len(generated[i]) >= n_new:
                continue
            if pending[i]:
                size = chunk.get(i, len(pending[i]))
                piece, pending[i] = pending[i][:size], pending[i][size:]
                slices.append(SeqSlice(i, tuple(piece), pos[i], not pending[i], f"b{i}"))
                pos[i] += len(piece)
            else:
                slices.append(SeqSlice(i, (generated[i][-1],), pos[i], True, f"b{i}"))
                pos[i] += 1
        result = engine.step(StepPlan(slices=tuple(slices)))
        for out in result.outputs:
            generated[out.seq].append(out.token)
        step += 1
    engine.step(StepPlan(release=tuple(f"b{i}" for i in range(4))))
    assert [generated[i] for i in range(4)] == alone


def test_one_kv_stream_per_sequence_decodes_what_one_buffer_does(
    engine: LlamaCppExecutor, tok: Tokenizer, model_path: Path
) -> None:
    """``kv_unified=False`` (QUANTA_KV_UNIFIED=false): each sequence in its own stream of
    n_ctx / n_seq_max cells; four prompts in one step, then decoded together, give what each
    gives alone in the shared buffer."""
    prompts = [tok.encode(p) for p in PROMPTS]
    n_new = 8
    alone = [greedy_alone(engine, 0, p, n_new) for p in prompts]
    config = EngineConfig(
        model_path=str(model_path), n_ctx=4 * 256, n_seq_max=4, kv_unified=False, threads=2
    )
    split = LlamaCppExecutor.start(config)
    try:
        assert split.info.kv_unified is False
        owners = [f"s{i}" for i in range(4)]
        plan = StepPlan(
            slices=tuple(SeqSlice(i, tuple(p), 0, True, owners[i]) for i, p in enumerate(prompts))
        )
        generated = [[out.token] for out in split.step(plan).outputs]
        for k in range(1, n_new):
            plan = StepPlan(
                slices=tuple(
                    SeqSlice(i, (generated[i][-1],), len(prompts[i]) + k - 1, True, owners[i])
                    for i in range(4)
                )
            )
            for i, out in enumerate(split.step(plan).outputs):
                generated[i].append(out.token)
    finally:
        split.close()
    assert generated == alone


def test_shared_prefix_by_seq_cp_matches_computing_it(
    engine: LlamaCppExecutor, tok: Tokenizer
) -> None:
    system = tok.encode("You are a helpful assistant. Answer briefly and precisely.\n")
    a = system + tok.encode("Question: what is two plus two?\nAnswer:", add_special=False)
    b = system + tok.encode("Question: name a large animal.\nAnswer:", add_special=False)
    reference = greedy_alone(engine, 5, b, 8)

    engine.step(StepPlan(slices=(SeqSlice(0, tuple(a), 0, True, "pa"),)))
    shared = len(system)
    # seq 1 takes the system prompt's KV from seq 0 and computes only its own question.
    first = engine.step(
        StepPlan(
            kv_ops=(CopyPrefix(src=0, dst=1, n_tokens=shared),),
            slices=(SeqSlice(1, tuple(b[shared:]), shared, True, "pb"),),
        )
    )
    tokens = [first.outputs[0].token]
    pos = len(b)
    while len(tokens) < 8:
        res = engine.step(StepPlan(slices=(SeqSlice(1, (tokens[-1],), pos, True, "pb"),)))
        tokens.append(res.outputs[0].token)
        pos += 1
    engine.step(StepPlan(release=("pa", "pb")))
    assert tokens == reference


def test_stash_and_restore_continue_with_identical_tokens(
    engine: LlamaCppExecutor, tok: Tokenizer
) -> None:
    prompt = tok.encode("Once upon a time, in a small village,")
    reference = greedy_alone(engine, 0, prompt, 10)

    res = engine.step(StepPlan(slices=(SeqSlice(2, tuple(prompt), 0, True, "st"),)))
    tokens = [res.outputs[0].token]
    pos = len(prompt)
    for _ in range(4):
        res = engine.step(StepPlan(slices=(SeqSlice(2, (tokens[-1],), pos, True, "st"),)))
        tokens.append(res.outputs[0].token)
        pos += 1
    stashed = engine.step(StepPlan(kv_ops=(Stash(seq=2, key="st"),)))
    assert stashed.stashed[0].key == "st"
    assert stashed.stashed[0].n_bytes >= pos * engine.info.kv_bytes_per_token
    assert engine.memory_stats().n_stashes == 1
    # Another sequence uses the engine meanwhile; then the stash comes back in another slot.
    greedy_alone(engine, 2, tok.encode("Something else entirely"), 3)
    engine.step(StepPlan(kv_ops=(Restore(seq=6, key="st"),)))
    assert engine.memory_stats().n_stashes == 0
    while len(tokens) < 10:
        res = engine.step(StepPlan(slices=(SeqSlice(6, (tokens[-1],), pos, True, "st"),)))
        tokens.append(res.outputs[0].token)
        pos += 1
    engine.step(StepPlan(release=("st",)))
    assert tokens == reference


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (StepPlan(slices=(SeqSlice(N_SEQ, (1, 2), 0),)), "unknown sequence"),
        (StepPlan(slices=(SeqSlice(0, (1, 2), 5),)), "starts at position 5"),
        (StepPlan(slices=(SeqSlice(0, tuple(range(1, 300)), 0),)), "over n_batch"),
        (StepPlan(slices=(SeqSlice(0, (1, 2), 2047),)), "overflows the context"),
        (StepPlan(slices=(SeqSlice(0, (10**7,), 0),)), "out of range"),
        (StepPlan(kv_ops=(CopyPrefix(0, 1, 4),)), "copy of 4 tokens"),
        (StepPlan(kv_ops=(Restore(0, "nope"),)), "no stash"),
        (StepPlan(kv_ops=(DropStash("nope"),)), "no stash"),
    ],
)
def test_bad_input_is_refused_and_the_worker_survives(
    engine: LlamaCppExecutor, plan: StepPlan, message: str
) -> None:
    pid = engine.pid
    with pytest.raises(EngineInputError, match=message):
        engine.step(plan)
    assert engine.pid == pid
    assert engine.memory_stats().sequences == ()
    assert len(greedy_alone(engine, 0, [1, 2, 3], 2)) == 2


def test_the_worker_defends_itself_when_the_callers_check_is_bypassed(
    engine: LlamaCppExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine._mirror, "check", lambda plan: None)
    with pytest.raises(EngineInputError, match="unknown sequence"):
        engine.step(StepPlan(slices=(SeqSlice(99, (1,), 0),)))
    with pytest.raises(EngineInputError, match="over n_batch"):
        engine.step(StepPlan(slices=(SeqSlice(0, tuple(range(1, 300)), 0),)))
    monkeypatch.undo()
    assert len(greedy_alone(engine, 0, [1, 2, 3], 2)) == 2


def test_a_grammar_that_does_not_parse_is_refused(engine: LlamaCppExecutor) -> None:
    bad = SamplingParams(grammar="root ::= (((")
    with pytest.raises(EngineInputError, match="grammar"):
        engine.step(StepPlan(slices=(SeqSlice(0, (1, 2), 0, True, "g", bad),)))
    assert engine.memory_stats().sequences == ()


def test_json_grammar_constrains_the_output(engine: LlamaCppExecutor, tok: Tokenizer) -> None:
    prompt = tok.encode_chat(
        [
            {
                "role": "user",
                "content": "Reply with a JSON object with keys name and age for Bob, who is 30.",
            }
        ]
    )
    params = SamplingParams(temperature=0.0, grammar=json_object_grammar())
    res = engine.step(StepPlan(slices=(SeqSlice(0, tuple(prompt), 0, True, "j", params),)))
    tokens = [res.outputs[0].token]
    pos = len(prompt)
    while tokens[-1] not in engine.info.eog_tokens and len(tokens) < 60:
        res = engine.step(StepPlan(slices=(SeqSlice(0, (tokens[-1],), pos, True, "j", params),)))
        tokens.append(res.outputs[0].token)
        pos += 1
    engine.step(StepPlan(release=("j",)))
    assert tokens[-1] in engine.info.eog_tokens, "the grammar must let the object end"
    assert isinstance(json.loads(tok.decode(tokens[:-1])), dict)


@pytest.mark.parametrize("top_p", [0.95, 1.0])  # a chain; a row drawn with the step's rows
def test_seeded_sampling_repeats_and_logprobs_are_reported(
    engine: LlamaCppExecutor, top_p: float
) -> None:
    params = SamplingParams(temperature=1.0, top_p=top_p, seed=1234, logprobs=3)

    def run(owner: str) -> list[tuple[int, float | None]]:
        res = engine.step(StepPlan(slices=(SeqSlice(0, (1, 504, 3458), 0, True, owner, params),)))
        out = [res.outputs[0]]
        for i in range(5):
            res = engine.step(
                StepPlan(slices=(SeqSlice(0, (out[-1].token,), 3 + i, True, owner, params),))
            )
            out.append(res.outputs[0])
        engine.step(StepPlan(kv_ops=(Truncate(0),), release=(owner,)))
        for o in out:
            assert len(o.top_logprobs) == 3
            assert o.logprob is not None and o.logprob <= 0.0
            assert o.top_logprobs[0].logprob >= o.top_logprobs[1].logprob
        return [(o.token, o.logprob) for o in out]

    assert run("s1") == run("s2")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ignore_eos_never_samples_an_end_token(
    engine: LlamaCppExecutor, tok: Tokenizer, temperature: float
) -> None:
    # An empty-ish chat turn makes the model want to stop at once; it may not.
    prompt = tok.encode_chat([{"role": "user", "content": "Say nothing."}])
    prompt += tok.encode("OK.", add_special=False)
    params = SamplingParams(temperature=temperature, ignore_eos=True)
    res = engine.step(StepPlan(slices=(SeqSlice(0, tuple(prompt), 0, True, "e", params),)))
    tokens = [res.outputs[0].token]
    for i in range(20):
        res = engine.step(
            StepPlan(slices=(SeqSlice(0, (tokens[-1],), len(prompt) + i, True, "e", params),))
        )
        tokens.append(res.outputs[0].token)
    engine.step(StepPlan(release=("e",)))
    assert not set(tokens) & set(engine.info.eog_tokens)


def kill_soon(ex: LlamaCppExecutor) -> threading.Timer:
    """SIGKILL the worker 50 ms from now, while the caller runs long prefills."""
    pid = ex.pid
    assert pid is not None
    killer = threading.Timer(0.05, os.kill, (pid, signal.SIGKILL))
    killer.start()
    return killer


def test_killed_worker_is_a_typed_error_then_a_fresh_worker_works(
    model_path: Path,
) -> None:
    config = EngineConfig(
        model_path=str(model_path),
        n_ctx=1024,
        n_seq_max=4,
        n_batch=512,
        threads=2,
        step_timeout_s=30,
    )
    with LlamaCppExecutor.start(config) as ex:
        ex.step(StepPlan(slices=(SeqSlice(1, (1, 2, 3), 0, True, "k"),)))
        ex.step(StepPlan(kv_ops=(Stash(1, "kept"),)))
        ex.step(StepPlan(slices=(SeqSlice(2, (1, 2, 3), 0, True, "k2"),)))
        pid = ex.pid
        killer = kill_soon(ex)
        with pytest.raises(EngineDied) as caught:
            for _ in range(20):
                ex.step(StepPlan(slices=(SeqSlice(3, tuple(range(1, 500)), 0),)))
                ex.step(StepPlan(kv_ops=(Truncate(3),)))
        killer.join()
        assert caught.value.held_seqs >= {2}
        assert caught.value.exit_code == -signal.SIGKILL
        with pytest.raises(EngineDied):
            ex.step(StepPlan(slices=(SeqSlice(0, (1,), 0),)))
        ex.restart()
        assert ex.pid != pid
        assert ex.memory_stats().sequences == ()
        assert ex.memory_stats().n_stashes == 1  # the stash outlived the worker
        ex.step(StepPlan(kv_ops=(Restore(0, "kept"),)))
        res = ex.step(StepPlan(slices=(SeqSlice(0, (42,), 3, True, "k"),)))
        assert len(res.outputs) == 1


async def test_step_async_matches_step_and_outlives_a_cancelled_caller(
    engine: LlamaCppExecutor, tok: Tokenizer
) -> None:
    prompt = tuple(tok.encode(PROMPTS[0]))
    expected = greedy_alone(engine, 0, list(prompt), 6)
    res = await engine.step_async(StepPlan(slices=(SeqSlice(0, prompt, 0, True, "a"),)))
    tokens = [res.outputs[0].token]
    for i in range(5):
        plan = StepPlan(slices=(SeqSlice(0, (tokens[-1],), len(prompt) + i, True, "a"),))
        tokens.append((await engine.step_async(plan)).outputs[0].token)
    assert tokens == expected
    # Cancelled while the worker runs it: the step still completes, so the next one follows.
    long = StepPlan(slices=(SeqSlice(1, tuple(range(1, 200)), 0),))
    task = asyncio.create_task(engine.step_async(long))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    follow = StepPlan(slices=(SeqSlice(1, (7,), 199, True, "b"),), release=("a",))
    assert len((await engine.step_async(follow)).outputs) == 1
    engine.step(StepPlan(release=("b",)))


async def test_a_worker_killed_during_step_async_is_a_typed_error(model_path: Path) -> None:
    config = EngineConfig(model_path=str(model_path), n_ctx=1024, n_seq_max=2, threads=2)
    with LlamaCppExecutor.start(config) as ex:
        killer = kill_soon(ex)
        with pytest.raises(EngineDied) as caught:
            for _ in range(20):
                await ex.step_async(StepPlan(slices=(SeqSlice(0, tuple(range(1, 500)), 0),)))
                await ex.step_async(StepPlan(kv_ops=(Truncate(0),)))
        killer.join()
        assert caught.value.exit_code == -signal.SIGKILL
        ex.restart()
        plan = StepPlan(slices=(SeqSlice(0, (1, 2), 0, True, "k"),))
        assert len((await ex.step_async(plan)).outputs) == 1


async def test_loop_steps_mix_with_stash_steps_and_a_death_between_steps(
    model_path: Path,
) -> None:
    """The loop keeps watching the worker's socket from one step to the next: a stash step
    (sent by a thread) between loop steps, and a worker that dies while no step is in
    flight, are each found by the next step."""
    config = EngineConfig(model_path=str(model_path), n_ctx=512, n_seq_max=2, threads=1)
    with LlamaCppExecutor.start(config) as ex:
        first = await ex.start_step(StepPlan(slices=(SeqSlice(0, (1, 2, 3), 0, True, "k"),)))
        await ex.start_step(StepPlan(kv_ops=(Stash(0, "s"),)))
        await ex.start_step(StepPlan(kv_ops=(Restore(0, "s"),)))
        token = first.outputs[0].token
        again = await ex.start_step(StepPlan(slices=(SeqSlice(0, (token,), 3, True, "k"),)))
        assert len(again.outputs) == 1
        pid = ex.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.2)  # the socket's end comes while no step waits for it
        with pytest.raises(EngineDied):
            await ex.start_step(StepPlan(slices=(SeqSlice(0, (5,), 4, True, "k"),)))
        ex.restart()
        plan = StepPlan(slices=(SeqSlice(0, (1, 2), 0, True, "k"),))
        assert len((await ex.start_step(plan)).outputs) == 1


def test_a_hung_worker_is_detected_by_the_timeout(model_path: Path) -> None:
    config = EngineConfig(
        model_path=str(model_path),
        n_ctx=512,
        n_seq_max=2,
        n_batch=64,
        threads=1,
        step_timeout_s=0.5,
    )
    with LlamaCppExecutor.start(config) as ex:
        pid = ex.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(EngineHung):
            ex.step(StepPlan(slices=(SeqSlice(0, (1, 2), 0, True, "h"),)))
        ex.restart()
        assert len(ex.step(StepPlan(slices=(SeqSlice(0, (1, 2), 0, True, "h"),))).outputs) == 1


async def test_a_hung_worker_under_step_async_times_out_while_the_loop_runs_on(
    model_path: Path,
) -> None:
    config = EngineConfig(
        model_path=str(model_path), n_ctx=512, n_seq_max=2, threads=1, step_timeout_s=0.5
    )
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    with LlamaCppExecutor.start(config) as ex:
        pid = ex.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        ticker = asyncio.create_task(tick())
        with pytest.raises(EngineHung):
            await ex.step_async(StepPlan(slices=(SeqSlice(0, (1, 2), 0, True, "h"),)))
        ticker.cancel()
        assert ticks >= 10  # the loop was not blocked while it waited for the worker
        ex.restart()
        plan = StepPlan(slices=(SeqSlice(0, (1, 2), 0, True, "h"),))
        assert len((await ex.step_async(plan)).outputs) == 1


def test_penalties_change_a_repetitive_greedy_answer(
    engine: LlamaCppExecutor, tok: Tokenizer
) -> None:
    prompt = tok.encode("one one one one one one one one one one one")
    plain = greedy_alone(engine, 0, prompt, 6)
    penalised = SamplingParams(temperature=0.0, frequency_penalty=2.0, presence_penalty=1.0)
    res = engine.step(StepPlan(slices=(SeqSlice(0, tuple(prompt), 0, True, "p", penalised),)))
    tokens = [res.outputs[0].token]
    for i in range(5):
        nxt = SeqSlice(0, (tokens[-1],), len(prompt) + i, True, "p", penalised)
        tokens.append(engine.step(StepPlan(slices=(nxt,))).outputs[0].token)
    engine.step(StepPlan(release=("p",)))
    assert plain.count(plain[0]) == 3  # the plain answer repeats itself...
    assert tokens[:4] == plain[:4]
    assert tokens[4:] != plain[4:]  # ...until the penalty has grown larger than the lead


def batched_greedy(
    engine: LlamaCppExecutor, prompts: list[list[int]], params: list[SamplingParams], n: int
) -> list[list[int]]:
    """All prompts in one step, then one decode step for all of them at a time."""
    owners = [f"g{i}-{hash(p)}" for i, p in enumerate(params)]
    slices = [SeqSlice(i, tuple(p), 0, True, owners[i], params[i]) for i, p in enumerate(prompts)]
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(n):
        for o in engine.step(StepPlan(slices=tuple(slices))).outputs:
            out[o.seq].append(o.token)
        slices = [
            SeqSlice(i, (out[i][-1],), s.start_pos + len(s.tokens), True, owners[i], params[i])
            for i, s in enumerate(slices)
        ]
    held = tuple(Truncate(i) for i in range(len(prompts)))
    engine.step(StepPlan(kv_ops=held, release=tuple(owners)))
    return out


def test_one_argmax_per_step_picks_what_the_greedy_chain_picks(
    engine: LlamaCppExecutor, tok: Tokenizer
) -> None:
    prompts = [tok.encode(p) for p in PROMPTS]
    plain = SamplingParams(temperature=0.0)
    # A positive bias (however small) keeps a request on llama.cpp's own sampler chain.
    vocab_end = engine.info.n_vocab - 1
    chain = SamplingParams(temperature=0.0, logit_bias=((vocab_end, 1e-9),))
    fast = batched_greedy(engine, prompts, [plain] * 4, 8)
    assert fast == batched_greedy(engine, prompts, [chain] * 4, 8)
    # Mixed in one batch, and a banned argmax: that row falls back to its chain.
    banned = fast[0][0]
    ban = SamplingParams(temperature=0.0, logit_bias=((banned, float("-inf")),))
    ban_chain = SamplingParams(
        temperature=0.0, logit_bias=((banned, float("-inf")), (vocab_end, 1e-9))
    )
    mixed = batched_greedy(engine, prompts, [ban, chain, plain, chain], 4)
    assert mixed[0][0] != banned
    assert mixed[0] == batched_greedy(engine, prompts[:1], [ban_chain], 4)[0]
    assert mixed[1:] == [f[:4] for f in fast[1:]]


def test_a_stash_comes_back_into_cells_the_prefix_cache_held(model_path: Path) -> None:
    """The block manager's ops, in their order, on a real engine whose cells are all taken by
    a cached prefix and the free remainder: the restore finds its cells because the cache's
    truncation runs first."""
    config = EngineConfig(
        model_path=str(model_path), n_ctx=256, n_seq_max=4, n_batch=256, n_ubatch=256, threads=2
    )
    ex = LlamaCppExecutor.start(config)
    try:
        kv = KvManager(ex.info.n_ctx // 16, 16, 4, enable_prefix_cache=True)

        def run(tokens: list[int]) -> int:
            adm = kv.allocate(tokens, 256)
            assert adm is not None
            ex.step(StepPlan(tuple(kv.drain_ops()), (SeqSlice(adm.seq, tuple(tokens), 0),)))
            kv.commit(adm.seq, tokens, len(tokens))
            return adm.seq

        prompt = list(range(1000, 1040))
        kv.stash(run(prompt), "st")
        ex.step(StepPlan(tuple(kv.drain_ops())))
        cached = list(range(2000, 2224))  # 14 of the 16 blocks, kept by the prefix cache
        kv.free(run(cached), len(cached))
        ex.step(StepPlan(tuple(kv.drain_ops())))
        adm = kv.restore("st", [*prompt, 7], n_stashed=len(prompt), budget=256)
        assert adm is not None
        res = ex.step(
            StepPlan(tuple(kv.drain_ops()), (SeqSlice(adm.seq, (7,), len(prompt), True, "st"),))
        )
        assert len(res.outputs) == 1
        assert ex.memory_stats().n_stashes == 0
        ex.step(StepPlan(release=("st",)))
    finally:
        ex.close()


@pytest.fixture(scope="module")
def streams(model_path: Path) -> Iterator[LlamaCppExecutor]:
    """A stream of 256 cells per sequence (``kv_unified=False``), 4 sequences."""
    config = EngineConfig(
        model_path=str(model_path), n_ctx=4 * 256, n_seq_max=4, kv_unified=False, threads=2
    )
    ex = LlamaCppExecutor.start(config)
    yield ex
    ex.close()


def test_a_prefix_copied_between_streams_matches_computing_it(
    engine: LlamaCppExecutor, streams: LlamaCppExecutor, tok: Tokenizer
) -> None:
    """Between streams a copy is of the whole stream (then cut to the prefix): the copy
    runs while its source decodes in the same step, and the copy's next tokens are those
    of the prompt computed from scratch."""
    system = tok.encode("You are a helpful assistant. Answer briefly and precisely.\n")
    a = system + tok.encode("Question: what is two plus two?\nAnswer:", add_special=False)
    b = system + tok.encode("Question: name a large animal.\nAnswer:", add_special=False)
    reference = greedy_alone(engine, 5, b, 6)
    first_a = streams.step(StepPlan(slices=(SeqSlice(0, tuple(a), 0, True, "pa"),)))
    shared = len(system)
    both = streams.step(
        StepPlan(
            kv_ops=(CopyPrefix(src=0, dst=3, n_tokens=shared),),
            slices=(
                SeqSlice(0, (first_a.outputs[0].token,), len(a), True, "pa"),
                SeqSlice(3, tuple(b[shared:]), shared, True, "pb"),
            ),
        )
    )
    held = {m.seq: (m.pos_min, m.pos_max) for m in streams.memory_stats().sequences}
    assert held == {0: (0, len(a)), 3: (0, len(b) - 1)}
    tokens = [both.outputs[1].token]
    pos = len(b)
    while len(tokens) < 6:
        res = streams.step(StepPlan(slices=(SeqSlice(3, (tokens[-1],), pos, True, "pb"),)))
        tokens.append(res.outputs[0].token)
        pos += 1
    streams.step(StepPlan(kv_ops=(Truncate(0), Truncate(3)), release=("pa", "pb")))
    assert tokens == reference


def test_a_stream_in_a_copy_is_neither_stashed_nor_restored_in_the_same_plan(
    streams: LlamaCppExecutor, tok: Tokenizer
) -> None:
    """llama.cpp copies a stream at the next decode: a stash or restore of it before that
    would read or write cells in flight, so the worker refuses such a plan unchanged."""
    prompt = tuple(tok.encode("Once upon a time, in a small village,"))
    streams.step(StepPlan(slices=(SeqSlice(1, prompt, 0),)))
    with pytest.raises(EngineInputError, match="being copied"):
        streams.step(StepPlan(kv_ops=(CopyPrefix(1, 2, 4), Stash(2, "k"))))
    held = {m.seq: m.pos_max for m in streams.memory_stats().sequences}
    assert held == {1: len(prompt) - 1}
    streams.step(StepPlan(kv_ops=(Truncate(1),)))


def test_stash_and_restore_between_streams_continue_with_identical_tokens(
    engine: LlamaCppExecutor, streams: LlamaCppExecutor, tok: Tokenizer
) -> None:
    prompt = tok.encode("The quick brown fox")
    reference = greedy_alone(engine, 0, prompt, 6)
    res = streams.step(StepPlan(slices=(SeqSlice(0, tuple(prompt), 0, True, "sr"),)))
    tokens = [res.outputs[0].token]
    streams.step(StepPlan(kv_ops=(Stash(seq=0, key="sr"),)))
    streams.step(StepPlan(kv_ops=(Restore(seq=2, key="sr"),)))
    pos = len(prompt)
    while len(tokens) < 6:
        res = streams.step(StepPlan(slices=(SeqSlice(2, (tokens[-1],), pos, True, "sr"),)))
        tokens.append(res.outputs[0].token)
        pos += 1
    streams.step(StepPlan(kv_ops=(Truncate(2),), release=("sr",)))
    assert tokens == reference
