"""The scenarios that define the project, as workloads: what ``quanta bench scenarios`` runs.

    twenty        20 people at once, 32-token prompts, 128-token answers (DESIGN.md)
    flood         an interactive tenant (one request per ~3 s, 16-token answers) beside a
                  batch flood of 96 requests at once (over twice any policy's running set)
    kv-burst      24 x (60 + 200 tokens) at once on 2,048 KV cells (~8 fit)
    overload      interactive load at ~2x this machine's capacity from four tenants; a
                  refused request is retried once, at its retry-after
    weights       two batch tenants of weights 1 and 2, 12 closed-loop users each

Each is short (tens of seconds on the 2-core reference machine). ``scale`` shrinks the
counts and durations (the suite's own test runs them against a stub at a tiny scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from quanta_core.metrics import SloTargets
from quanta_core.requests import SloClass
from quanta_core.workload import TenantSpec, WorkloadSpec, fixed
from quanta_core.workload.lengths import DistKind, LengthDist

INTERACTIVE, BATCH = SloClass.INTERACTIVE, SloClass.BATCH
# The server's default targets (quanta_core/scheduler/slo.py), scored by the same code.
TARGETS = {
    INTERACTIVE: SloTargets(ttft_s=2.0, tpot_s=0.25),
    BATCH: SloTargets(deadline_s=120.0),
}
SMOOTH_GAP_S = 1.0  # "smooth": no inter-token gap over this


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    spec: WorkloadSpec
    # Quanta's --n-ctx and llama-server's -c (None: Quanta's own default, and llama-server
    # the ``llama_ctx`` below)
    n_ctx: int | None = 8192
    retries: int = 0  # refused requests are sent again at their retry-after this often
    kind: str = ""  # which key figures it reports ("": by its name)
    # Consecutive scenarios of one group run on one start of each server, in turn ("": its
    # own start); the server is sized for the largest of them.
    group: str = ""
    llama_slots: int = 20  # llama-server -np
    llama_ctx: int | None = None  # llama-server -c (None: n_ctx)
    text_prompts: bool = False  # real text (text_prompts.py) instead of seeded token ids
    # goodput's first-token target grows by this per prompt token too (None: it does not)
    ttft_per_token_s: float | None = None

    @property
    def key_kind(self) -> str:
        return self.kind or self.name


def _n(count: int, scale: float) -> int:
    return max(1, math.ceil(count * scale))


def _uniform(lo: int, hi: int) -> LengthDist:
    return LengthDist(DistKind.UNIFORM, min=lo, max=hi)


def twenty(scale: float = 1.0) -> Scenario:
    people = TenantSpec("people", prompt=fixed(32), output=fixed(128), requests=_n(20, scale))
    spec = WorkloadSpec("twenty", (people,), requests=None, rate=math.inf, targets=TARGETS)
    return Scenario("twenty", spec, n_ctx=None, llama_ctx=8192)  # Quanta's defaults


def flood(scale: float = 1.0) -> Scenario:
    chat = TenantSpec(
        "chat", prompt=_uniform(32, 64), output=fixed(16), rate=1 / 3, requests=_n(12, scale)
    )
    etl = TenantSpec(
        "etl",
        slo_class=BATCH,
        prompt=_uniform(16, 48),
        output=fixed(32),
        rate=math.inf,
        requests=_n(96, scale),
    )
    spec = WorkloadSpec("flood", (chat, etl), seed=3, requests=None, targets=TARGETS)
    return Scenario("flood", spec, n_ctx=None, llama_ctx=8192)  # Quanta's defaults


def kv_burst(scale: float = 1.0) -> Scenario:
    burst = TenantSpec("burst", prompt=fixed(60), output=fixed(200), requests=_n(24, scale))
    spec = WorkloadSpec("kv-burst", (burst,), requests=None, rate=math.inf, targets=TARGETS)
    return Scenario("kv-burst", spec, n_ctx=2048)


# The overload scenario's rate on the reference machine (the one the committed CPU cost model
# was calibrated on): about twice what the default policy serves there of 64 + 64-token
# requests (~1.5/s: ~95 output tokens/s, bench/results/scenarios/). ``quanta bench
# scenarios`` divides it by the machine's speed factor (``cli.machine_overload_rate``).
OVERLOAD_RATE = 3.0


def overload(scale: float = 1.0, rate: float = OVERLOAD_RATE) -> Scenario:
    """``rate``: requests/s, about twice what the default policy serves on the machine."""
    tenants = tuple(
        TenantSpec(name, prompt=fixed(64), output=fixed(64))
        for name in ("alice", "bob", "carol", "dave")
    )
    spec = WorkloadSpec(
        "overload",
        tenants,
        seed=5,
        requests=None,
        rate=rate,
        duration_s=30.0 * scale,
        targets=TARGETS,
    )
    return Scenario("overload", spec, n_ctx=None, llama_ctx=8192, retries=1)


def weights(scale: float = 1.0) -> Scenario:
    tenants = (
        TenantSpec(
            "one", slo_class=BATCH, weight=1.0, prompt=fixed(64), output=fixed(32), users=12
        ),
        TenantSpec(
            "two", slo_class=BATCH, weight=2.0, prompt=fixed(64), output=fixed(32), users=12
        ),
    )
    spec = WorkloadSpec(
        "weights",
        tenants,
        seed=11,
        requests=_n(2000, scale),
        users=24,
        duration_s=40.0 * scale,
        targets=TARGETS,
        window_s=10.0 * scale,
    )
    # Quanta on its defaults (the split is a claim about what a user gets); llama-server -c
    # as the others'
    return Scenario("weights", spec, n_ctx=None, llama_ctx=8192)


ALL = {"twenty": twenty, "flood": flood, "kv-burst": kv_burst, "overload": overload}
ALL["weights"] = weights
