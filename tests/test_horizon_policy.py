"""The ``horizon`` policy on the fake executor: memory-aware admission (exact admit/hold
decisions on a tiny pool), no preemption on a KV-bound burst, shortest first, and the aging
bound."""

from __future__ import annotations

from quanta_core.engine.types import SamplingParams
from quanta_core.requests import FinishReason
from quanta_core.scheduler.config import HorizonConfig
from tests.scheduler_harness import Harness, expected_tokens, prompt

RUN_OUT = SamplingParams(ignore_eos=True)


def started(h: Harness) -> list[str]:
    """Request ids in the order of their first step."""
    firsts = {}
    for r in h.results().values():
        assert r.timings.first_scheduled is not None
        firsts[r.request_id] = (r.timings.first_scheduled, r.request_id)
    return [rid for _, rid in sorted(firsts.values())]


def test_admits_what_the_pool_holds_at_every_completion() -> None:
    # 8 blocks of 4 cells. Each request: a 4-token prompt and 8 tokens: 12 cells = 3 blocks
    # at its end. Cycle 1 starts two (6 blocks at t=8); a third would need 9, though 6 blocks
    # are free. At cycle c the two hold 3 + c cells with 9 - c to go, and a third peaks at
    # 6 + ceil((13 - c) / 4) blocks when they end: it fits from cycle 5. A fourth beside the
    # three needs 10 blocks then: it waits until the first two end (after cycle 8).
    h = Harness.make(policy="horizon", block_size=4, num_kv_blocks=8, max_running=8)
    for i in range(4):
        h.submit(f"r{i}", prompt(4, base=10 * i + 1), 8, sampling=RUN_OUT)
    starts: dict[int, int] = {}
    for cycle in range(1, 40):
        if not h.sched.has_work:
            break
        plan = h.cycle()
        if cycle == 1:
            assert h.sched.kv.num_free_blocks == 6
        n = sum(1 for s in plan.slices if s.start_pos == 0)
        if n:
            starts[cycle] = n
    assert starts == {1: 2, 5: 1, 9: 1}
    assert h.sched.num_preemptions == 0
    assert all(r.completion_tokens == 8 for r in h.results().values())


def test_a_short_request_starts_beside_a_long_one_when_it_ends_in_time() -> None:
    # 10 blocks of 4: the long one (4 + 24 tokens: 7 blocks at its end) runs; a short one
    # (4 + 4) peaks at 3 + 2 blocks beside it: it starts; a second long one would hold 7 + 7
    # when the first ends: it waits, though it arrived first of the two.
    h = Harness.make(policy="horizon", block_size=4, num_kv_blocks=10, max_running=8)
    h.submit("long", prompt(4, base=1), 24, sampling=RUN_OUT)
    h.cycle()
    h.submit("long2", prompt(4, base=100), 24, sampling=RUN_OUT)
    h.submit("short", prompt(4, base=200), 4, sampling=RUN_OUT)
    plan = h.cycle()
    assert len(plan.slices) == 2  # long's decode and short's prompt
    h.run()
    assert started(h) == ["long", "short", "long2"]
    assert h.sched.num_preemptions == 0


def test_kv_bound_burst_no_preemption_where_fcfs_preempts() -> None:
    # 24 requests of 6 + 30 tokens on 64 blocks of 4 (256 cells: 7 requests at full length).
    def burst(policy: str) -> Harness:
        h = Harness.make(policy=policy, block_size=4, num_kv_blocks=64, max_running=16)
        for i in range(24):
            h.submit(f"r{i}", prompt(6, base=7 * i + 1), 30, sampling=RUN_OUT)
        h.run()
        return h

    fcfs, horizon = burst("fcfs"), burst("horizon")
    assert fcfs.sched.num_preemptions > 0
    assert horizon.sched.num_preemptions == 0
    for i in range(24):
        r = horizon.results()[(f"r{i}", 0)]
        assert r.finish_reason is FinishReason.LENGTH
        assert list(r.output_tokens) == expected_tokens(prompt(6, base=7 * i + 1), 30)


def test_shortest_predicted_first_within_a_tenant() -> None:
    h = Harness.make(policy="horizon", max_running=1)
    h.submit("busy", prompt(4, base=1), 3, sampling=RUN_OUT)
    h.cycle()
    for name, n in (("n40", 40), ("n5", 5), ("n20", 20)):
        h.submit(name, prompt(4, base=100 + n), n, sampling=RUN_OUT)
    h.run()
    assert started(h) == ["busy", "n5", "n20", "n40"]


def test_learned_lengths_order_requests_of_equal_max_tokens() -> None:
    # Same max_tokens; the predictor learned that tenant-key "terse"'s answers are short.
    h = Harness.make(policy="horizon", max_running=1)
    for i in range(8):
        h.sched.predictor.observe(_learned(h, "terse", i), 3)
        h.sched.predictor.observe(_learned(h, "wordy", i), 60)
    h.submit("busy", prompt(4, base=1), 3)
    h.cycle()
    h.submit("w", prompt(4, base=100), 64, key_id="wordy")
    h.submit("t", prompt(4, base=200), 64, key_id="terse")
    h.executor.eos_after = {"w/0": 60, "t/0": 3}
    h.run()
    assert started(h) == ["busy", "t", "w"]


def _learned(h: Harness, key_id: str, i: int):  # type: ignore[no-untyped-def]
    from quanta_core.requests import GenerationRequest
    from quanta_core.scheduler.choice import Choice

    req = GenerationRequest(f"{key_id}{i}", prompt(4, base=300), 64, key_id=key_id)
    return Choice.choices_of(req, 0.0, 0)[0]


def test_aging_bound_a_long_request_is_overtaken_only_within_its_window() -> None:
    # aging 0.01 s/token: the long request (4 + 100 tokens) may be overtaken by arrivals of
    # the next 1.04 s only. Short requests arrive every cycle (0.01 s) for 3 s, each as long
    # as a cycle takes to serve, so shortest-first alone would starve it.
    cfg = HorizonConfig(aging_s_per_token=0.01)
    h = Harness.make(policy="horizon", max_running=1, horizon=cfg)
    h.submit("busy", prompt(4, base=1), 3, sampling=RUN_OUT)
    h.cycle()
    t_long = h.clock.now()
    h.submit("long", prompt(4, base=2), 100, sampling=RUN_OUT)
    for i in range(300):
        h.submit(f"s{i}", prompt(1, base=10 + i), 1, sampling=RUN_OUT)
        h.cycle()
    h.run()
    res = {r.request_id: r for r in h.results().values()}
    first_long = res["long"].timings.first_scheduled
    assert first_long is not None
    window_end = t_long + 0.01 * (4 + 100)
    late = [r for rid, r in res.items() if rid.startswith("s") and r.timings.arrival > window_end]
    early = [r for rid, r in res.items() if rid.startswith("s") and r.timings.arrival < t_long]
    assert late and not early
    assert all(r.timings.first_scheduled > first_long for r in late)  # type: ignore[operator]
    overtook = [r for r in res.values() if r.timings.first_scheduled < first_long]  # type: ignore[operator]
    assert len(overtook) > 50  # shortest first did overtake it, within the window
