"""The ``quanta`` policy's rules, each on the fake executor (no timing is measured: the
fake's steps carry none, so the step-cost model stays at its prior and the figures below
are computed from that prior, not written down)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from app.server.settings import Settings
from quanta_core.clock import VirtualClock
from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import SamplingParams, Stash
from quanta_core.requests import ChoiceResult, FinishReason, RejectionKind, SloClass, TokenEvent
from quanta_core.scheduler import PolicyName, Scheduler, SchedulerConfig, SloConfig, make_policy
from quanta_core.scheduler.policies.quanta import QuantaPolicy, admission_rules
from quanta_core.scheduler.step_cost import StepCostModel, attended_k
from tests.scheduler_harness import Harness, expected_tokens, prompt

RUN_OUT = SamplingParams(ignore_eos=True)

INTER, BATCH = SloClass.INTERACTIVE, SloClass.BATCH
# Sustained overload in one burst: the offered load read over an instant, so that every
# arrival finds the machine over capacity (else the load rule queues what a few seconds of
# the engine serve).
INSTANT = 1e-6


def cost_cap(config: SloConfig, limit: int) -> int:
    model = StepCostModel(config)
    return model.max_seqs(config.interactive_itl_s * config.grow_headroom, limit)


def max_running(h: Harness) -> int:
    most = 0
    while h.sched.has_work:
        h.cycle()
        most = max(most, h.sched.stats().num_running)
    return most


def test_quanta_is_the_server_default_and_max_running_does_not_govern() -> None:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.policy == "quanta"
    assert isinstance(make_policy(settings.policy), QuantaPolicy)
    assert settings.max_running >= settings.layout.n_seq_max


@pytest.mark.parametrize("step_seq_s", [0.0113, 0.03])
def test_the_running_set_is_what_the_step_cost_keeps_within_the_itl_target(
    step_seq_s: float,
) -> None:
    # sustained (no calm-burst window): the set is sized to the inter-token target alone
    config = SloConfig(
        step_seq_s=step_seq_s,
        interactive_ttft_s=60.0,
        burst_window_s=0.0,
        load_window_s=INSTANT,
        load_min_s=INSTANT,
    )
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=256, slo=config)
    for k in range(40):
        h.submit(f"r{k}", prompt(8, base=100 + 10 * k), max_tokens=20, slo_class=INTER)
    assert max_running(h) == cost_cap(config, 64) < 40
    assert len(h.results()) == 40


def test_a_burst_on_a_calm_machine_grows_the_set_to_the_smooth_gap() -> None:
    config = SloConfig(interactive_ttft_s=60.0)
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=256, slo=config)
    for k in range(40):
        h.submit(f"r{k}", prompt(8, base=100 + 10 * k), max_tokens=20, slo_class=INTER)
    burst = StepCostModel(config).max_seqs(config.burst_itl_s * config.grow_headroom, 64)
    assert cost_cap(config, 64) < max_running(h) == min(burst, 40)


def test_max_running_is_an_upper_bound_a_user_may_set() -> None:
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=5)
    for k in range(12):
        h.submit(f"r{k}", prompt(8, base=100 + 10 * k), max_tokens=10, slo_class=INTER)
    assert max_running(h) == 5


def test_an_interactive_arrival_preempts_batch_when_the_set_is_full() -> None:
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=4)
    for k in range(6):
        h.submit(f"b{k}", prompt(8, base=100 + 10 * k), max_tokens=30, slo_class=BATCH)
    for _ in range(3):
        h.cycle()
    for k in range(2):  # the reserved slot takes one; the other needs a batch slot
        h.submit(f"i{k}", prompt(8, base=600 + 10 * k), max_tokens=4, slo_class=INTER)
    plan = h.cycle()
    owners = {s.owner for s in plan.slices}
    assert {"i0/0", "i1/0"} <= owners
    assert any(isinstance(op, Stash) for op in plan.kv_ops)
    h.run()
    results = h.results()
    for k in range(6):  # the stashed batch request resumes and loses nothing
        r = results[(f"b{k}", 0)]
        assert r.finish_reason is FinishReason.LENGTH
        assert list(r.output_tokens) == expected_tokens(prompt(8, base=100 + 10 * k), 30)
    assert h.sched.num_preemptions >= 1


def test_batch_keeps_one_running_request_under_an_interactive_flood() -> None:
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=3)
    for k in range(3):
        h.submit(f"b{k}", prompt(8, base=100 + 10 * k), max_tokens=40, slo_class=BATCH)
    h.cycle()
    for k in range(8):
        h.submit(f"i{k}", prompt(8, base=600 + 10 * k), max_tokens=30, slo_class=INTER)
    for _ in range(10):
        owners = [s.owner for s in h.cycle().slices]
        assert any(o.startswith("b") for o in owners)
    h.run()
    assert len(h.results()) == 11


def test_interactive_is_admitted_past_batch_it_can_overtake() -> None:
    """A batch flood does not change which interactive requests are refused: admission
    projects interactive work only (batch yields, or is preempted)."""

    def refused(with_batch: bool) -> list[str]:
        cfg = SloConfig(
            interactive_ttft_s=0.5, burst_window_s=0.0, load_window_s=INSTANT, load_min_s=INSTANT
        )  # sustained load
        h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", slo=cfg)
        if with_batch:
            for k in range(40):
                h.submit(f"b{k}", prompt(64, base=100 + k), max_tokens=50, slo_class=BATCH)
            for _ in range(5):
                h.cycle()
        for k in range(30):
            h.submit(f"i{k}", prompt(32, base=400 + k), max_tokens=8, slo_class=INTER)
        out = [
            rid
            for (rid, _), r in h.results().items()
            if rid.startswith("i") and r.finish_reason is FinishReason.REJECTED
        ]
        return sorted(out)

    alone = refused(with_batch=False)
    assert alone  # the target is tight enough that some are refused
    assert refused(with_batch=True) == alone


def test_a_refusal_says_machine_full_with_a_retry_after() -> None:
    cfg = SloConfig(
        interactive_ttft_s=0.5, burst_window_s=0.0, load_window_s=INSTANT, load_min_s=INSTANT
    )  # sustained load
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", slo=cfg)
    for k in range(30):
        h.submit(f"i{k}", prompt(32, base=400 + k), max_tokens=8, slo_class=INTER)
    rejected = [r for r in h.results().values() if r.finish_reason is FinishReason.REJECTED]
    assert rejected
    assert all(r.rejection is RejectionKind.OVERLOADED for r in rejected)
    assert all(r.retry_after_s is not None and r.retry_after_s > 0 for r in rejected)


def test_a_burst_that_does_not_fit_in_memory_queues_instead_of_preempting() -> None:
    def run(policy: str) -> Harness:
        h = Harness.make(
            FakeExecutor(n_ctx=512, n_seq_max=64),
            policy=policy,
            max_running=64,
            slo=SloConfig(interactive_ttft_s=60.0),
        )
        for k in range(8):
            h.submit(f"r{k}", prompt(40, base=100 + 50 * k), max_tokens=100, slo_class=INTER)
        h.run()
        return h

    h = run("quanta")
    assert h.sched.num_preemptions == 0
    assert all(r.finish_reason is FinishReason.LENGTH for r in h.results().values())
    assert run("fcfs").sched.num_preemptions > 0  # the same burst thrashes without the rule


def served_tokens(h: Harness, cycles: int) -> dict[str, int]:
    """Tokens streamed per tenant (request ids start with the tenant's name)."""
    for _ in range(cycles):
        h.cycle()
    out: dict[str, int] = {}
    for e in h.events:
        if isinstance(e, TokenEvent):
            tenant = e.request_id.rstrip("0123456789")
            out[tenant] = out.get(tenant, 0) + 1
    return out


@pytest.mark.parametrize(("policy", "shares_by_weight"), [("quanta", True), ("vtc", False)])
def test_batch_tenants_that_all_run_still_share_by_weight(
    policy: str, shares_by_weight: bool
) -> None:
    h = Harness.make(FakeExecutor(n_seq_max=64), policy=policy, max_running=12)
    for k in range(5):
        for tenant, weight in (("one", 1.0), ("two", 2.0)):
            h.submit(
                f"{tenant}{k}",
                prompt(8, base=100 + 20 * k + (0 if tenant == "one" else 10)),
                max_tokens=400,
                slo_class=BATCH,
                tenant=tenant,
                weight=weight,
            )
    tokens = served_tokens(h, 150)
    ratio = tokens["two"] / tokens["one"]
    if shares_by_weight:
        assert 1.8 <= ratio <= 2.2
        counters = h.sched.policy.counters[BATCH].counter  # type: ignore[attr-defined]
        lag = SloConfig().fair_lag
        # weighted service apart by at most the lag and one step's tokens
        assert abs(counters["one"] - counters["two"]) <= lag + 2 * 5
    else:
        assert ratio < 1.2


@pytest.mark.parametrize("fair_lag", [32.0, math.inf])
def test_interactive_tenants_that_all_run_share_by_weight_within_the_itl_target(
    fair_lag: float,
) -> None:
    # Steps priced at ~25 ms (the harness's clock moves 10 ms a cycle): a stream may sit out
    # a step or more and still get its next token within the inter-token target.
    cfg = SloConfig(step_base_s=0.001, step_seq_s=0.002, fair_lag=fair_lag)
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=12, slo=cfg)
    for k in range(6):
        for tenant, weight in (("one", 1.0), ("two", 2.0)):
            h.submit(
                f"{tenant}{k}",
                prompt(8, base=100 + 20 * k + (0 if tenant == "one" else 10)),
                max_tokens=200,
                slo_class=INTER,
                tenant=tenant,
                weight=weight,
                sampling=RUN_OUT,
            )
    tokens = served_tokens(h, 150)
    ratio = tokens["two"] / tokens["one"]
    if math.isinf(fair_lag):  # no tenant is ever far enough ahead: a token each, every step
        assert ratio < 1.1
        return
    assert 1.8 <= ratio <= 2.2
    target = cfg.interactive_itl_s * cfg.grow_headroom
    gaps = [b - a for r in h.sched.running for a, b in itertools.pairwise(r.token_times)]
    assert gaps and max(gaps) <= target + 1e-9


def weighted_streams(h: Harness, per_tenant: int, slo_class: SloClass = INTER) -> None:
    for k in range(per_tenant):
        for tenant, weight in (("one", 1.0), ("two", 2.0)):
            h.submit(
                f"{tenant}{k}",
                prompt(8, base=100 + 20 * k + (0 if tenant == "one" else 10)),
                max_tokens=400,
                slo_class=slo_class,
                tenant=tenant,
                weight=weight,
                sampling=RUN_OUT,
            )


def test_interactive_shares_hold_when_steps_are_priced_near_the_itl_target() -> None:
    # Steps priced near the target (a CPU's running set): a stream that sits out a step
    # misses it, and the share still holds; the light tenant's streams take turns, each a
    # token every other step, none stalled.
    cfg = SloConfig(step_base_s=0.06, step_seq_s=0.005)
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=12, slo=cfg)
    weighted_streams(h, 6)
    tokens = served_tokens(h, 200)
    assert 1.9 <= tokens["two"] / tokens["one"] <= 2.1
    cycle = 0.01  # the harness's clock per cycle
    since = h.clock.now() - 40 * cycle
    light = [
        sum(1 for t in r.token_times if t > since) for r in h.sched.running if r.tenant == "one"
    ]
    assert len(light) >= 3 and max(light) - min(light) <= 1  # turns, not a few stalled
    for r in h.sched.running:
        gaps = [b - a for a, b in itertools.pairwise(r.token_times[-40:])]
        most = 2 * cycle if r.tenant == "one" else cycle
        assert max(gaps) <= most + 1e-9, r.request_id


def test_a_prompt_charged_in_a_lump_slows_its_tenants_streams_without_stalling_them() -> None:
    cfg = SloConfig(step_base_s=0.06, step_seq_s=0.005)
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=12, slo=cfg)
    weighted_streams(h, 4)
    served_tokens(h, 60)
    # a long prompt of the light tenant: its counter leaps by 256 tokens' worth
    h.submit("onelong", prompt(256, base=500), 400, tenant="one", weight=1.0, sampling=RUN_OUT)
    start = h.clock.now()
    before = served_tokens(h, 60)
    light = [r for r in h.sched.running if r.tenant == "one" and r.request_id != "onelong"]
    for r in light:  # a token every other step before; at least every sixth while it repays
        gaps = [b - a for a, b in itertools.pairwise(t for t in r.token_times if t >= start)]
        assert gaps and max(gaps) <= 6 * 0.01 + 1e-9, r.request_id
    counters = h.sched.policy.counters[INTER].counter  # type: ignore[attr-defined]
    lead = counters["one"] - counters["two"]
    served_tokens(h, 150)  # the lump is being repaid: the light tenant's lead shrinks
    assert before["one"] > 0 and counters["one"] - counters["two"] < lead - 100


def test_a_tenant_alone_in_its_class_never_sits_out() -> None:
    cfg = SloConfig(step_base_s=0.06, step_seq_s=0.005)
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=12, slo=cfg)
    for k in range(6):
        h.submit(f"two{k}", prompt(8, base=100 + 10 * k), 400, tenant="two", weight=2.0)
        h.submit(f"b{k}", prompt(8, base=300 + 10 * k), 400, tenant="one", slo_class=BATCH)
    served_tokens(h, 100)
    inter = [r for r in h.sched.running if r.slo_class is INTER]
    assert len(inter) == 6
    for r in inter:  # a token every step since its first: nobody to share with
        assert len(r.token_times) == round((r.token_times[-1] - r.token_times[0]) / 0.01) + 1


def test_the_first_token_estimate_is_kept_and_checked() -> None:
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta")
    for k in range(10):
        h.submit(f"i{k}", prompt(16, base=100 + 20 * k), max_tokens=4, slo_class=INTER)
    h.run()
    served = [r for r in h.results().values() if r.finish_reason is FinishReason.LENGTH]
    assert served
    assert all(r.timings.ttft_estimate_s is not None for r in served)
    policy = h.sched.policy
    assert isinstance(policy, QuantaPolicy)
    assert len(policy.estimates) == len(served)
    for est, actual in policy.estimates:
        assert est > 0 and actual > 0


def test_a_kv_bound_burst_is_estimated_in_the_rounds_memory_allows() -> None:
    """Twelve at once, each 32 + 160 tokens ignoring end-of-generation (12 blocks of 16 at
    its end, more than the 128 tokens an answer is expected to take) on a pool of 48 blocks:
    the gate runs four at a time, so the last four start after two rounds of 160 steps.
    Their first-token estimates count those rounds (steps priced at the harness's 10 ms),
    where the running slots and the mean answer would put them early in the first."""
    cfg = SloConfig(step_base_s=0.01, step_seq_s=1e-6, step_token_s=1e-6)
    h = Harness.make(policy="quanta", block_size=16, num_kv_blocks=48, slo=cfg)
    for k in range(12):
        h.submit(f"i{k}", prompt(32, base=40 * k + 1), 160, slo_class=INTER, sampling=RUN_OUT)
    h.run()
    assert h.sched.num_preemptions == 0
    for k in range(4, 12):  # the second round and the third
        t = h.results()[(f"i{k}", 0)].timings
        assert t.first_token is not None and t.ttft_estimate_s is not None
        actual = t.first_token - t.arrival
        assert actual > (k // 4) * 160 * 0.01
        assert 0.9 < t.ttft_estimate_s / actual < 1.1


def test_a_burst_on_a_calm_machine_is_queued_within_the_grace() -> None:
    def admitted(grace: float) -> list[float]:
        cfg = SloConfig(interactive_ttft_s=0.5, burst_grace=grace)
        h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", slo=cfg)
        for k in range(30):
            h.submit(f"i{k}", prompt(32, base=400 + k), max_tokens=8, slo_class=INTER)
        h.run()
        return [
            r.timings.ttft_estimate_s or 0.0
            for r in h.results().values()
            if r.finish_reason is FinishReason.LENGTH
        ]

    strict, lenient, unbounded = admitted(0.0), admitted(1.0), admitted(math.inf)
    assert len(strict) < len(lenient) < len(unbounded) == 30
    assert max(strict) <= 0.5 < max(lenient) <= 1.0


def thirty_on_four_slots(
    bookings: bool = True, retry_margin: float = SloConfig().retry_margin
) -> tuple[Harness, QuantaPolicy]:
    """Sustained overload (no burst window): 30 at once on 4 slots, steps priced at the
    harness's 10 ms; ``bookings`` False: refusals book nothing."""
    cfg = SloConfig(
        interactive_ttft_s=0.2,
        burst_window_s=0.0,
        load_window_s=INSTANT,
        load_min_s=INSTANT,
        step_base_s=0.01,
        step_seq_s=1e-6,
        step_token_s=1e-6,
        retry_margin=retry_margin,
    )
    policy = QuantaPolicy(cfg, rules=replace(admission_rules(cfg), book_retries=bookings))
    ex, clock = FakeExecutor(n_seq_max=64), VirtualClock()
    config = SchedulerConfig(policy=PolicyName.QUANTA, max_running=4, slo=cfg)
    h = Harness(ex, Scheduler(config, ex.info, clock, policy=policy), clock)
    for k in range(30):
        h.submit(f"i{k}", prompt(32, base=100 + k), max_tokens=40, slo_class=INTER)
    return h, policy


def first_refused(h: Harness) -> tuple[ChoiceResult, float]:
    """The first of the thirty refused, and when it was told to come back."""
    first = next(
        r
        for (rid, _), r in sorted(h.results().items(), key=lambda kv: int(kv[0][0][1:]))
        if r.finish_reason is FinishReason.REJECTED
    )
    assert first.retry_after_s is not None
    return first, first.timings.arrival + first.retry_after_s


def retry_admitted(bookings: bool) -> tuple[bool, int]:
    """Sustained overload on 4 slots: 30 at once; the first refused request comes back at
    its retry-after, just after four fresh arrivals. Was it admitted, and how many fresh ones
    were refused? Steps are priced at the harness's 10 ms, so projections and the virtual
    clock agree."""
    h, _ = thirty_on_four_slots(bookings)
    first, back_at = first_refused(h)
    while h.clock.now() < back_at:
        h.cycle()
    for k in range(4):  # as many as the slots that free next
        h.submit(f"new{k}", prompt(32, base=300 + k), max_tokens=40, slo_class=INTER)
    base = 100 + int(first.request_id[1:])
    h.submit("retry", prompt(32, base=base), max_tokens=40, slo_class=INTER)
    h.run()
    results = h.results()
    fresh_refused = sum(
        1
        for (rid, _), r in results.items()
        if rid.startswith("new") and r.finish_reason is FinishReason.REJECTED
    )
    return results[("retry", 0)].finish_reason is FinishReason.LENGTH, fresh_refused


def test_a_retry_at_its_retry_after_finds_its_booked_place() -> None:
    admitted, fresh_refused = retry_admitted(bookings=True)
    assert admitted
    assert fresh_refused > 0  # the room went to the retry, not to later arrivals
    assert retry_admitted(bookings=False)[0] is False  # without the booking it is taken


def retry_on_slower_steps(margin: float) -> FinishReason | None:
    """Sustained overload on 4 slots, 30 at once, the steps 10 % slower than the cost model
    prices them: how the first refused request fares, back at its retry-after."""
    h, _ = thirty_on_four_slots(retry_margin=margin)
    first, back_at = first_refused(h)
    while h.clock.now() < back_at:
        h.cycle()
        h.clock.advance(0.001)  # the harness's 10 ms, and a tenth more
    h.submit(
        "retry", prompt(32, base=100 + int(first.request_id[1:])), max_tokens=40, slo_class=INTER
    )
    h.run()
    return h.results()[("retry", 0)].finish_reason


def test_a_retry_after_leaves_room_for_the_projection_to_be_wrong() -> None:
    assert retry_on_slower_steps(SloConfig().retry_margin) is FinishReason.LENGTH
    assert retry_on_slower_steps(0.0) is FinishReason.REJECTED  # told the bare projection


@pytest.mark.parametrize("policy", ["quanta", "slo"])
def test_a_step_cost_above_every_target_still_runs_an_empty_engine(policy: str) -> None:
    """One measured step far over the inter-token target (a busy machine) must not leave
    the engine idle with requests waiting: an empty step always takes a slice."""
    h = Harness.make(FakeExecutor(n_seq_max=64), policy=policy)
    cost = h.sched.policy.cost  # type: ignore[attr-defined]
    assert isinstance(cost, StepCostModel)
    for _ in range(5):
        cost.observe(1, 1, 5.0)  # 5 s for one decode: every estimate is over the target
    for k in range(3):
        h.submit(f"i{k}", prompt(8, base=100 + 10 * k), max_tokens=4, slo_class=INTER)
    h.run()
    assert {r.finish_reason for r in h.results().values()} == {FinishReason.LENGTH}


def test_every_running_stream_gets_its_token_when_the_set_outgrew_the_itl_size() -> None:
    config = SloConfig(interactive_ttft_s=60.0)
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=256, slo=config)
    for k in range(40):
        h.submit(f"r{k}", prompt(8, base=100 + 10 * k), max_tokens=30, slo_class=INTER)
    while len(h.streamed("r39")) < 2:  # the burst is in: all have their first tokens
        h.cycle()
    assert cost_cap(config, 64) < 40
    for _ in range(5):
        plan = h.cycle()
        assert len(plan.slices) == h.sched.stats().num_running == 40


def step_beside_streams(prompt_len: int, n_prompts: int, batch: bool = False) -> tuple[int, int]:
    """Four interactive streams decode; ``n_prompts`` interactive prompts of ``prompt_len``
    tokens arrive (beside a running 3,000-token batch prompt where ``batch``). The tokens of
    the step after they start, and its slices."""
    fake = FakeExecutor(n_seq_max=64, n_vocab=50_000)
    h = Harness.make(fake, policy="quanta", token_budget=128)
    if batch:
        h.submit("etl", prompt(3000, base=5000), max_tokens=8, slo_class=BATCH)
    for k in range(4):
        h.submit(f"s{k}", prompt(8, base=800 + 10 * k), max_tokens=200, slo_class=INTER)
    while any(len(h.streamed(f"s{k}")) < 2 for k in range(4)):
        h.cycle()
    for k in range(n_prompts):
        h.submit(
            f"p{k}", prompt(prompt_len, base=100 + prompt_len * k), max_tokens=8, slo_class=INTER
        )
    h.cycle()  # they start
    plan = h.cycle()
    return plan.num_tokens, len(plan.slices)


def test_waiting_prompts_take_steps_past_the_token_budget() -> None:
    # First tokens first: while prompts wait for their first token on a machine below
    # capacity, a step carries their prefill up to ``first_token_step_s`` (the engine's pass,
    # 512 tokens, at most), not the 128-token budget paced for the streams' inter-token
    # target; every stream still gets its token in it.
    tokens, slices = step_beside_streams(1000, 3)
    assert 128 < tokens <= 512
    assert slices >= 5  # the four streams ride along


BUDGET = 128  # the CPU's token budget


def first_token_steps(slo: SloConfig, batch: bool = False) -> list[dict[str, int]]:
    """Four interactive streams decode (beside a running 3,000-token batch prompt where
    ``batch``); a 600-token interactive prompt arrives. Each step's tokens by owner until
    its first token."""
    fake = FakeExecutor(n_ctx=32_768, n_seq_max=16, n_vocab=50_000)
    h = Harness.make(fake, policy="quanta", token_budget=BUDGET, slo=slo)
    if batch:
        h.submit("etl", prompt(3000, base=5000), max_tokens=8, slo_class=BATCH)
    for k in range(4):
        h.submit(f"s{k}", prompt(8, base=800 + 10 * k), max_tokens=400, slo_class=INTER)
    while any(len(h.streamed(f"s{k}")) < 2 for k in range(4)):
        h.cycle()
    h.submit("p", prompt(600, base=100), max_tokens=8, slo_class=INTER)
    steps = []
    while not h.streamed("p"):
        steps.append({s.owner: len(s.tokens) for s in h.cycle().slices})
    return steps


# No calm burst: only the load says whether the machine is below capacity. Read over two
# minutes, the streams' work is a fraction of it; over the time since they came (a fraction
# of a second), many times it. A prompt token at 1 ms: a first-token step (1 s) holds the
# engine's whole pass (512 tokens).
BELOW = SloConfig(
    interactive_ttft_s=60.0,
    burst_window_s=0.0,
    load_window_s=120.0,
    load_min_s=120.0,
    step_token_s=0.001,
)
OVER = replace(BELOW, load_window_s=60.0, load_min_s=INSTANT)


def test_below_capacity_a_waiting_prompt_takes_long_steps_outside_a_burst_too() -> None:
    # First tokens first is owed below capacity, not only in a calm burst: the prompt's
    # steps go past the 128-token budget. Over capacity the inter-token target bounds them.
    below = first_token_steps(BELOW)
    assert max(sum(s.values()) for s in below) > BUDGET
    over = first_token_steps(OVER)
    assert max(sum(s.values()) for s in over) <= BUDGET
    assert len(over) > len(below)


def test_batch_prefill_does_not_pad_a_first_token_step() -> None:
    # A long interactive prompt waits beside a long batch prompt: each step is what the
    # prompt and the running streams need (up to a long step); the batch prompt fills no
    # more than the token budget, never the long step's rest once the prompt needs less.
    steps = first_token_steps(BELOW, batch=True)
    assert len(steps) > 1 and max(sum(s.values()) for s in steps) > BUDGET
    for step in steps:
        interactive = sum(n for owner, n in step.items() if owner != "etl/0")
        assert sum(step.values()) <= max(interactive, BUDGET)


def long_prompt_over_capacity(n_tokens: int) -> FinishReason | None:
    """Three streams decode over capacity, their decodes nearly filling the inter-token
    target; a prompt of ``n_tokens`` arrives. Refused at once (REJECTED), or admitted
    (None)?"""
    cfg = SloConfig(
        burst_window_s=0.0,
        load_window_s=60.0,
        load_min_s=INSTANT,  # over capacity: refused where projected late
        step_seq_s=0.05,  # a step of four sequences nearly fills the target
    )
    h = Harness.make(
        FakeExecutor(n_ctx=16_384, n_seq_max=16, n_vocab=32_000), policy="quanta", slo=cfg
    )
    for k in range(3):
        h.submit(f"s{k}", prompt(8, base=800 + 10 * k), max_tokens=400, slo_class=INTER)
    for _ in range(10):
        h.cycle()
    assert all(len(h.streamed(f"s{k}")) > 2 for k in range(3))
    h.submit("p", prompt(n_tokens, base=100), max_tokens=8, slo_class=INTER)
    done = h.results().get(("p", 0))
    return None if done is None else done.finish_reason


def test_a_long_prompt_over_capacity_is_projected_in_full_steps() -> None:
    # Its target is twice its own prefill (seconds): over that time the machine does not
    # stay over capacity, and first tokens are owed again. Projected in steps sized to the
    # streams' inter-token target (a token a step beside them), it would read minutes late.
    assert long_prompt_over_capacity(1000) is None
    # A prompt within the 2 s target is still projected in such steps (over its seconds
    # the machine stays over capacity), and refused.
    assert long_prompt_over_capacity(100) is FinishReason.REJECTED


def test_a_second_arrival_joins_a_step_only_within_the_inter_token_target() -> None:
    # Two streams decode over capacity; two short prompts arrive at once. The step was
    # sized for one arrival: the second starts only where the step, with its sequence,
    # still fits the streams' inter-token target (``room``), else in the next step.
    cfg = SloConfig(
        interactive_ttft_s=60.0,
        burst_window_s=0.0,
        load_window_s=60.0,
        load_min_s=INSTANT,  # over capacity: the inter-token target bounds every step
        step_seq_s=0.05,  # a sequence more costs as much as eight tokens
    )
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", token_budget=128, slo=cfg)
    for k in range(2):
        h.submit(f"s{k}", prompt(8, base=800 + 10 * k), max_tokens=200, slo_class=INTER)
    while any(len(h.streamed(f"s{k}")) < 2 for k in range(2)):
        h.cycle()
    for k in range(2):
        h.submit(f"p{k}", prompt(8, base=100 + 10 * k), max_tokens=50, slo_class=INTER)
    policy = h.sched.policy
    assert isinstance(policy, QuantaPolicy)
    itl = cfg.interactive_itl_s * cfg.grow_headroom
    owners: set[str] = set()
    for _ in range(6):
        plan = h.cycle()
        owners |= {s.owner for s in plan.slices}
        pairs = sum(attended_k(s.start_pos, len(s.tokens)) for s in plan.slices)
        assert policy.cost.estimate(len(plan.slices), plan.num_tokens, pairs) <= itl
    assert {"p0/0", "p1/0"} <= owners  # both started, one step apart


def overloaded(quiet_s: float) -> tuple[int, int]:
    """Sustained overload on 4 slots makes a refusal; once the machine is idle again, ten
    arrive at once. How many of the ten were refused, and how many queued?"""
    cfg = SloConfig(
        interactive_ttft_s=0.2,
        burst_quiet_s=quiet_s,
        load_window_s=INSTANT,
        load_min_s=INSTANT,
        step_base_s=0.01,
        step_seq_s=1e-6,
        step_token_s=1e-6,
    )
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=4, slo=cfg)
    for k in range(20):  # a burst on a calm machine: all queued
        h.submit(f"i{k}", prompt(32, base=100 + k), max_tokens=40, slo_class=INTER)
    while h.clock.now() < cfg.burst_window_s + 0.1:
        h.cycle()
    h.submit("late", prompt(32, base=200), max_tokens=40, slo_class=INTER)  # not calm now
    assert h.results()[("late", 0)].finish_reason is FinishReason.REJECTED
    h.run()
    assert h.clock.now() < 1.1 + 5.0  # the ten come within the quiet time of that refusal
    for k in range(10):
        h.submit(f"b{k}", prompt(32, base=300 + k), max_tokens=40, slo_class=INTER)
    h.run()
    outcomes = [h.results()[(f"b{k}", 0)].finish_reason for k in range(10)]
    refused = outcomes.count(FinishReason.REJECTED)
    return refused, len(outcomes) - refused


def test_a_machine_that_just_refused_work_is_not_calm() -> None:
    refused, queued = overloaded(quiet_s=5.0)
    assert refused > 0 and queued > 0  # the target is the bound: what fits in it is served
    assert overloaded(quiet_s=0.0) == (0, 10)  # calm again at once: the burst is queued


def fresh_after_unclaimed_bookings(bookings: bool) -> FinishReason | None:
    """Sustained overload on 4 slots refuses and books 26 retries that never come; once the
    last booked time has passed (the bookings still held), a fresh request arrives."""
    h, policy = thirty_on_four_slots(bookings)
    told = [
        r.timings.arrival + r.retry_after_s
        for r in h.results().values()
        if r.finish_reason is FinishReason.REJECTED and r.retry_after_s is not None
    ]
    assert len(told) > 4
    while h.clock.now() < max(told) + 1.0:  # past every keep_s, before any lapses
        h.cycle()
    if bookings:
        assert policy.admission.bookings is not None and len(policy.admission.bookings) > 0
    h.submit("fresh", prompt(32, base=900), max_tokens=40, slo_class=INTER)
    done = h.results().get(("fresh", 0))  # a refusal finishes it at once
    return None if done is None else done.finish_reason


def test_a_booked_retry_that_does_not_come_keeps_no_room() -> None:
    assert fresh_after_unclaimed_bookings(bookings=False) is None  # admitted: not finished
    assert fresh_after_unclaimed_bookings(bookings=True) is None


def long_prompts(policy: str) -> tuple[int, list[float]]:
    """Ten prompts too long for the first-token target even alone, at once, on a loaded
    machine: how many were refused, and the first-token estimates of the admitted."""
    cfg = SloConfig(
        interactive_ttft_s=0.5,
        burst_window_s=0.0,
        load_window_s=INSTANT,
        load_min_s=INSTANT,
        step_token_s=0.01,
    )
    h = Harness.make(FakeExecutor(n_seq_max=64), policy=policy, slo=cfg)
    for k in range(10):
        h.submit(f"i{k}", prompt(200, base=50 + 5 * k), max_tokens=8, slo_class=INTER)
    h.run()
    results = [h.results()[(f"i{k}", 0)] for k in range(10)]
    refused = sum(1 for r in results if r.finish_reason is FinishReason.REJECTED)
    estimates = [r.timings.ttft_estimate_s for r in results if r.timings.ttft_estimate_s]
    return refused, estimates


def test_a_prompt_too_long_for_the_target_waits_no_longer_than_it_computes() -> None:
    cfg = SloConfig(interactive_ttft_s=0.5, step_token_s=0.01)
    alone = StepCostModel(cfg).prefill_s(200, 0, 512)
    assert alone > cfg.interactive_ttft_s
    refused, estimates = long_prompts("quanta")
    assert 0 < refused < 10
    assert estimates and max(estimates) <= 2 * alone + 1e-9
    assert long_prompts("slo")[0] == 0  # `slo` serves them best effort, however long queued


def test_a_retry_told_over_half_a_minute_finds_its_booked_place() -> None:
    """Sustained overload pushes the times told out by the backlog; a retry told over half
    a minute (clients honour up to a minute) is still booked: back at its time, just after
    fresh arrivals, it is admitted and they are not."""
    cfg = SloConfig(
        interactive_ttft_s=0.2,
        burst_window_s=0.0,
        load_window_s=INSTANT,
        load_min_s=INSTANT,
        step_base_s=0.01,
    )
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=2, slo=cfg)
    for k in range(120):
        h.submit(f"i{k}", prompt(32, base=100 + k), max_tokens=200, slo_class=INTER)
    late = next(
        r
        for (rid, _), r in sorted(h.results().items(), key=lambda kv: int(kv[0][0][1:]))
        if r.retry_after_s is not None and 31.0 < r.retry_after_s < 55.0
    )
    assert late.retry_after_s is not None
    while h.clock.now() < late.timings.arrival + late.retry_after_s:
        h.cycle()
    for k in range(2):  # as many as the slots
        h.submit(f"new{k}", prompt(32, base=600 + k), max_tokens=200, slo_class=INTER)
    base = 100 + int(late.request_id[1:])
    h.submit("retry", prompt(32, base=base), max_tokens=200, slo_class=INTER)
    assert ("retry", 0) not in h.results()  # admitted: not finished at once
    assert all(h.results()[(f"new{k}", 0)].rejection is not None for k in range(2))


def test_a_retry_too_far_out_is_not_booked() -> None:
    cfg = SloConfig(
        interactive_ttft_s=0.2,
        burst_window_s=0.0,
        load_window_s=INSTANT,
        load_min_s=INSTANT,
        step_base_s=0.01,
    )
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=2, slo=cfg)
    policy = h.sched.policy
    assert isinstance(policy, QuantaPolicy) and policy.admission.bookings is not None
    bookings = policy.admission.bookings
    for k in range(200):
        h.submit(f"i{k}", prompt(32, base=100 + k), max_tokens=200, slo_class=INTER)
    told = [
        r.retry_after_s
        for r in h.results().values()
        if r.finish_reason is FinishReason.REJECTED and r.retry_after_s is not None
    ]
    assert max(told) > bookings.horizon_s  # some were told to come back that late ...
    assert 0 < len(bookings) < len(told)  # ... and only those within the horizon booked
    assert max(told) < 3 * bookings.horizon_s  # so the times told stop growing


def test_a_short_prompt_goes_ahead_of_a_long_prefill_in_progress() -> None:
    """A 2,000-token prompt is prefilling (its first token due in twice its own prefill);
    a 100-token one arrives (due within the 2 s target). Served in arrival order it would
    wait out the whole long prefill and be refused; due first, it is admitted and the next
    step's prefill is its own, and the long one still makes its first token on time."""
    cfg = SloConfig(burst_window_s=0.0)  # not a calm burst: the target is the bound
    h = Harness.make(
        FakeExecutor(n_ctx=8192, n_seq_max=8, n_vocab=32_000), policy="quanta", slo=cfg
    )
    h.submit("long", prompt(2000, base=10), max_tokens=8, slo_class=INTER, sampling=RUN_OUT)
    for _ in range(3):
        h.cycle()
    h.submit("short", prompt(100, base=5000), max_tokens=8, slo_class=INTER, sampling=RUN_OUT)
    assert ("short", 0) not in h.results()  # not refused
    plan = h.cycle()
    owners = [s.owner for s in plan.slices]
    assert owners[0] == "short/0"
    h.run()
    results = h.results()
    assert {r.finish_reason for r in results.values()} == {FinishReason.LENGTH}
    short, long = results[("short", 0)].timings, results[("long", 0)].timings
    assert short.first_token is not None and long.first_token is not None
    assert short.first_token < long.first_token


def clump_behind_a_quiet_minute(load_window_s: float) -> list[str]:
    """A machine that is not calm (no burst window) and has served one small request a
    minute ago gets four 1,000-token prompts at once: seconds of work each, the fourth
    projected past twice its own prefill. Which are refused?"""
    cfg = SloConfig(burst_window_s=0.0, load_window_s=load_window_s, load_min_s=load_window_s)
    h = Harness.make(
        FakeExecutor(n_ctx=8192, n_seq_max=8, n_vocab=32_000), policy="quanta", slo=cfg
    )
    h.submit("early", prompt(16, base=10), max_tokens=4, slo_class=INTER)
    h.run()
    h.clock.advance(60.0)
    for k in range(4):
        h.submit(f"c{k}", prompt(1000, base=100 + 1000 * k), max_tokens=8, slo_class=INTER)
    return sorted(
        rid for (rid, _), r in h.results().items() if r.finish_reason is FinishReason.REJECTED
    )


def test_below_capacity_a_clump_of_long_prompts_is_queued_not_refused() -> None:
    # Offered over the last two minutes: well under what the engine serves. Read over an
    # instant, the same clump is an overload, and the target refuses its tail.
    assert clump_behind_a_quiet_minute(120.0) == []
    assert clump_behind_a_quiet_minute(INSTANT) != []


def test_a_long_batch_prompt_is_chunked_beside_interactive_streams_and_yields_to_them() -> None:
    """A 3,000-token batch prompt: alone, every step carries the whole token budget (no
    pacing while nobody interactive is there); beside decoding interactive streams, every
    step keeps within what the inter-token target allows and every stream gets its token;
    an interactive arrival gets its first chunk at the very next step, ahead of it."""
    cfg = SloConfig(burst_window_s=0.0)
    budget = 128
    h = Harness.make(
        FakeExecutor(n_ctx=16_384, n_seq_max=8, n_vocab=32_000),
        policy="quanta",
        token_budget=budget,
        slo=cfg,
    )
    h.submit("job", prompt(3000, base=10), max_tokens=8, slo_class=BATCH, sampling=RUN_OUT)
    for _ in range(5):
        assert sum(len(s.tokens) for s in h.cycle().slices) == budget
    for k in range(3):
        h.submit(f"i{k}", prompt(16, base=20_000 + 20 * k), 200, slo_class=INTER)
    while any(len(h.streamed(f"i{k}")) == 0 for k in range(3)):
        h.cycle()
    policy = h.sched.policy
    assert isinstance(policy, QuantaPolicy)
    itl = cfg.interactive_itl_s * cfg.grow_headroom
    for _ in range(5):
        plan = h.cycle()
        owners = {s.owner for s in plan.slices}
        assert {f"i{k}/0" for k in range(3)} <= owners
        assert "job/0" in owners  # it progresses, in what the streams leave
        assert sum(len(s.tokens) for s in plan.slices) <= policy.cost.max_tokens(4, itl, budget)
    h.submit("late", prompt(200, base=25_000), 8, slo_class=INTER)
    plan = h.cycle()
    chunk = {s.owner: len(s.tokens) for s in plan.slices}
    assert chunk.get("late/0", 0) > 1
    assert chunk.get("late/0", 0) >= chunk.get("job/0", 0)


def test_the_first_token_target_grows_with_the_prompts_own_prefill() -> None:
    """A prompt that takes ~1.5 s to prefill alone arrives behind a short one: its first
    token ~2.2 s out. Its target is twice its own prefill (3 s), not the 2 s a 30-token
    prompt gets, so it is admitted (the old step at 2 s refused it: it would have had to
    come within 0.5 s of its own prefill time)."""
    cfg = SloConfig(burst_window_s=0.0, load_window_s=INSTANT, load_min_s=INSTANT)
    cost = StepCostModel(cfg)
    n = next(n for n in range(16, 2000) if cost.at_mean().prefill_s(n, 0, 512) > 1.5)
    h = Harness.make(
        FakeExecutor(n_ctx=8192, n_seq_max=8, n_vocab=32_000), policy="quanta", slo=cfg
    )
    h.submit("short", prompt(100, base=10), max_tokens=8, slo_class=INTER)
    h.submit("mid", prompt(n, base=1000), max_tokens=8, slo_class=INTER)
    mid = h.results().get(("mid", 0))
    assert mid is None  # admitted: not finished at once
    h.run()
    done = h.results()[("mid", 0)]
    assert done.finish_reason is FinishReason.LENGTH
    assert done.timings.ttft_estimate_s is not None and done.timings.ttft_estimate_s > 2.0


def test_aged_batch_goes_ahead_of_other_batch_never_ahead_of_interactive() -> None:
    def first_tokens(aging: float) -> list[str]:
        # One batch slot (two running, one reserved): a0 runs; a1 (its tenant's, older)
        # and b1 (a fresh tenant's, lower counter) wait for it, and then an interactive i1.
        cfg = SloConfig(batch_aging_s=aging, interactive_ttft_s=60.0)
        h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=2, slo=cfg)
        h.submit("a0", prompt(8), max_tokens=30, tenant="a", slo_class=BATCH)
        for rid, tenant, cls in (("a1", "a", BATCH), ("b1", "b", BATCH), ("i1", "c", INTER)):
            for _ in range(3):
                h.cycle()
            h.submit(
                rid, prompt(8, base=200 + len(h.plans)), max_tokens=5, tenant=tenant, slo_class=cls
            )
        h.run()
        firsts = {rid: r.timings.first_token or math.inf for (rid, _), r in h.results().items()}
        return sorted(firsts, key=lambda k: firsts[k])

    assert first_tokens(math.inf) == ["a0", "i1", "b1", "a1"]  # VTC: the lower counter
    assert first_tokens(0.05) == ["a0", "i1", "a1", "b1"]  # aged: the oldest, after i1


def test_batch_alone_runs_at_the_inter_token_size_leaving_the_reserve() -> None:
    # No interactive request, so no step is paced: only the running cap keeps batch to the
    # set an interactive arrival would find within its inter-token target.
    config = SloConfig()
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=256, slo=config)
    for k in range(40):
        h.submit(f"b{k}", prompt(8, base=100 + 10 * k), max_tokens=20, slo_class=BATCH)
    assert max_running(h) == cost_cap(config, 64) - config.interactive_reserve < 39


def test_running_batch_decodes_yield_the_step_to_an_interactive_prefill() -> None:
    # Four batch streams decode; an interactive prompt arrives: its first chunk takes the
    # whole token budget (or more: first tokens first, here its whole prompt) and batch gets
    # what is left (its decodes, after it), not the step's first tokens.
    budget = 64
    cfg = SloConfig(burst_window_s=0.0)
    h = Harness.make(
        FakeExecutor(n_seq_max=64), policy="quanta", max_running=16, token_budget=budget, slo=cfg
    )
    for k in range(4):
        h.submit(f"b{k}", prompt(8, base=100 + 10 * k), max_tokens=50, slo_class=BATCH)
    for _ in range(3):
        h.cycle()
    h.submit("i", prompt(200, base=500), max_tokens=5, slo_class=INTER)
    chunk = {s.owner: len(s.tokens) for s in h.cycle().slices}
    assert next(iter(chunk)) == "i/0" and chunk["i/0"] >= budget
    assert all(n == 1 for owner, n in chunk.items() if owner != "i/0")


def test_running_batch_does_not_count_against_an_interactive_arrival() -> None:
    # Three long batch jobs hold three of four slots; six short interactive prompts arrive
    # under sustained load: projected behind interactive work only (batch is preempted for
    # them), all six meet the target, as if the batch were not there.
    cfg = SloConfig(
        interactive_ttft_s=1.0, burst_window_s=0.0, load_window_s=INSTANT, load_min_s=INSTANT
    )
    h = Harness.make(FakeExecutor(n_seq_max=64), policy="quanta", max_running=4, slo=cfg)
    for k in range(3):
        h.submit(f"b{k}", prompt(64, base=100 + k), max_tokens=200, slo_class=BATCH)
    for _ in range(5):
        h.cycle()
    for k in range(6):
        h.submit(f"i{k}", prompt(8, base=400 + 10 * k), max_tokens=8, slo_class=INTER)
    h.run()
    served = [r for (rid, _), r in h.results().items() if rid.startswith("i")]
    assert len(served) == 6 and all(r.finish_reason is FinishReason.LENGTH for r in served)
