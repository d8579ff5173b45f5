"""A closed-loop simulation on the fake executor: tenants keep requests outstanding, and the
service each received is read from the plans that ran (not from the scheduler's counters)."""

from __future__ import annotations

from dataclasses import dataclass

from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import StepPlan
from quanta_core.requests import ChoiceFinished, SloClass
from tests.scheduler_harness import Harness, prompt


@dataclass(frozen=True)
class Load:
    prompt_len: int
    max_tokens: int
    weight: float = 1.0
    outstanding: int = 4  # requests it keeps in flight
    slo_class: SloClass = SloClass.INTERACTIVE


def plan_service(
    plan: StepPlan, prompt_lens: dict[str, int], tenant_of: dict[str, str]
) -> dict[str, float]:
    """Input tokens computed (1 each) and tokens sampled (2 each), per tenant, in one plan."""
    out: dict[str, float] = {}
    for s in plan.slices:
        rid = s.owner.split("/")[0]
        t = tenant_of.get(rid)
        if t is None:
            continue  # submitted from outside the loop
        prompt_part = max(min(s.start_pos + len(s.tokens), prompt_lens[rid]) - s.start_pos, 0)
        out[t] = out.get(t, 0.0) + prompt_part + (2.0 if s.sample else 0.0)
    return out


def closed_loop(policy: str, loads: dict[str, Load], cycles: int, **config: object) -> Simulation:
    sim = Simulation(policy, loads, **config)
    for _ in range(cycles):
        sim.step()
    return sim


class Simulation:
    def __init__(self, policy: str, loads: dict[str, Load], **config: object) -> None:
        executor = FakeExecutor(n_ctx=8192, n_seq_max=16)
        defaults: dict[str, object] = {"max_running": 4, "token_budget": 64}
        defaults.update(config)
        self.h = Harness.make(executor, policy=policy, enable_prefix_cache=False, **defaults)
        self.loads = loads
        self.tenant_of: dict[str, str] = {}
        self.prompt_lens: dict[str, int] = {}
        self.live = dict.fromkeys(loads, 0)
        self.served = dict.fromkeys(loads, 0.0)
        self.history: list[dict[str, float]] = []
        self._n = 0
        self._seen_events = 0
        self._top_up()

    def _top_up(self) -> None:
        for tenant, load in self.loads.items():
            while self.live[tenant] < load.outstanding:
                rid = f"{tenant}-{self._n}"
                self._n += 1
                self.tenant_of[rid] = tenant
                self.prompt_lens[rid] = load.prompt_len
                self.live[tenant] += 1
                self.h.submit(
                    rid,
                    prompt(load.prompt_len, base=1 + self._n % 7),
                    max_tokens=load.max_tokens,
                    tenant=tenant,
                    weight=load.weight,
                    slo_class=load.slo_class,
                )

    def step(self) -> None:
        plan = self.h.cycle()
        for tenant, s in plan_service(plan, self.prompt_lens, self.tenant_of).items():
            self.served[tenant] += s
        self.history.append(dict(self.served))
        for e in self.h.events[self._seen_events :]:
            if isinstance(e, ChoiceFinished) and e.result.request_id in self.tenant_of:
                self.live[self.tenant_of[e.result.request_id]] -= 1
        self._seen_events = len(self.h.events)
        self._top_up()
