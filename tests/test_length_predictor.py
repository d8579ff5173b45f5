"""The output-length predictor: its windows, its fallback chain, its learning, its state."""

from __future__ import annotations

from pathlib import Path

from quanta_core.engine.types import SamplingParams
from quanta_core.predictor import LengthPredictor, LengthWindow
from quanta_core.requests import GenerationRequest
from quanta_core.scheduler.choice import Choice


def choice(
    tenant: str = "a",
    max_tokens: int = 500,
    generated: int = 0,
    prompt_len: int = 60,
    prefix_hash: str | None = None,
    ignore_eos: bool = False,
) -> Choice:
    req = GenerationRequest(
        "r",
        tuple(range(1, prompt_len + 1)),
        max_tokens,
        sampling=SamplingParams(ignore_eos=ignore_eos),
        tenant=tenant,
        prefix_hash=prefix_hash,
    )
    r = Choice.choices_of(req, 0.0, 1)[0]
    r.tokens.extend([5] * generated)
    return r


def teach(p: LengthPredictor, lengths: list[int], **kw: object) -> None:
    for n in lengths:
        p.observe(choice(**kw), n)  # type: ignore[arg-type]


def test_window_quantiles_are_conditional_on_what_ran() -> None:
    w = LengthWindow(8, [12, 40, 41, 90, 150, 200, 230, 512])
    assert w.remaining(0, 0.5) == 90  # 4 of 8 at or below 90
    assert w.remaining(0, 0.9) == 512  # ceil(7.2) = 8th
    assert w.remaining(100, 0.5) == 100  # of 150 200 230 512: 200 - 100
    assert w.remaining(100, 0.9) == 412
    assert w.remaining(512, 0.5) is None
    assert w.count_above(100) == 4
    w.add(1)  # the oldest (12) goes
    assert w.values() == [40, 41, 90, 150, 200, 230, 512, 1]
    assert w.remaining(0, 0.125) == 1


def test_cold_start_is_max_tokens() -> None:
    p = LengthPredictor()
    pred = p.predict(choice(max_tokens=300, generated=20))
    assert (pred.p50, pred.p90, pred.level) == (280, 280, 0)


def test_ignore_eos_runs_to_max_tokens_whatever_was_learned() -> None:
    p = LengthPredictor(min_samples=1)
    teach(p, [10] * 20, max_tokens=300)
    assert p.remaining(choice(max_tokens=300, generated=5, ignore_eos=True), 0.5) == 295


def test_learns_per_tenant_and_falls_back_to_the_global_history() -> None:
    p = LengthPredictor(min_samples=8)
    teach(p, list(range(10, 110, 10)), tenant="a")  # 10, 20, ..., 100
    a = p.predict(choice(tenant="a"))
    assert (a.p50, a.p90, a.level) == (50, 90, 2)  # key, class, max_tokens, prompt bucket
    # Another prompt-length bucket: the tenant's window for this max_tokens
    assert p.predict(choice(tenant="a", prompt_len=300)).level == 3
    # Another tenant with the same max_tokens: every tenant's, for this max_tokens
    b = p.predict(choice(tenant="b"))
    assert (b.p50, b.p90, b.level) == (50, 90, 5)
    # Another max_tokens too: the global history, clamped to this request's bound
    c = p.predict(choice(tenant="b", max_tokens=60))
    assert (c.p50, c.p90, c.level) == (50, 60, 6)


def test_a_request_that_outlived_the_history_falls_back_to_its_bound() -> None:
    p = LengthPredictor(min_samples=8)
    teach(p, [20] * 8 + [200] * 8)
    assert p.remaining(choice(generated=10), 0.5) == 10  # 16 above 10, 8 of them at 20
    assert p.remaining(choice(generated=30), 0.5) == 170  # only the long ones are left
    assert p.predict(choice(generated=250, max_tokens=500)).p90 == 250  # nothing above


def test_looking_ahead_says_what_it_will_say_once_those_tokens_are_out() -> None:
    p = LengthPredictor(min_samples=4)
    teach(p, [30, 60, 90, 120, 150, 400, 410, 420], tenant="a")
    now = choice(tenant="a", generated=20)
    for ahead in (0, 1, 45, 100, 200, 395, 480):
        later = choice(tenant="a", generated=20 + ahead)
        for q in (0.5, 0.9):
            assert p.remaining(now, q, ahead) == p.remaining(later, q)
    run_out = choice(tenant="a", max_tokens=64, generated=10, ignore_eos=True)
    assert p.remaining(run_out, 0.9, 30) == 64 - 40


def test_the_system_prompt_key_is_most_specific() -> None:
    p = LengthPredictor(min_samples=4)
    teach(p, [300] * 8, prefix_hash="summarize")
    teach(p, [30] * 8, prefix_hash="yes-or-no")
    assert p.predict(choice(prefix_hash="yes-or-no")).p90 == 30
    assert p.predict(choice(prefix_hash="summarize")).p50 == 300
    unknown = p.predict(choice(prefix_hash="new"))
    assert (unknown.level, unknown.p50) == (2, 30)  # 8 of 16 at 30


def test_the_scheduler_teaches_it_finished_lengths() -> None:
    from tests.scheduler_harness import Harness, prompt

    h = Harness.make(max_running=4)
    for i in range(3):
        h.submit(f"r{i}", prompt(6, base=10 * i + 1), 7)
    h.run()
    assert h.sched.predictor.observed == 3
    assert h.sched.predictor.to_json()["keys"]["6"] == [7, 7, 7]


def test_state_survives_a_restart(tmp_path: Path) -> None:
    p = LengthPredictor(window=4)
    teach(p, [10, 20, 30, 40, 50], tenant="a")
    path = tmp_path / "state" / "predictor.json"
    p.save(path)
    q = LengthPredictor.load(path)
    assert q.to_json() == p.to_json()
    assert q.to_json()["keys"]["4|a"] == [20, 30, 40, 50]
    fresh = LengthPredictor.load(tmp_path / "none.json")
    assert len(fresh) == 0
