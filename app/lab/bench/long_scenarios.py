"""The scenarios at the prompt lengths people send: ``quanta bench scenarios --suite long``.

    len-P-xC       C requests of P real-text prompt tokens + 128 out at once (T = 0.7,
                   ignore EOS); the points of one P run on one start of each server
    conv-replay    the Azure 2023 conversation trace at its recorded lengths, its arrivals
                   slowed to about 3/4 of the machine's capacity; goodput at the targets
    coding         24 requests of mixed lengths (prompts 33-3,718, median ~600; answers
                   6-94), Poisson at about 3/4 of capacity, interactive key
    shared-prefix  one 1,500-token system prompt, then distinct user turns one at a time:
                   the later first tokens against the first's (the prefix cache's case)
    flood-long     batch prompts of 3-4k tokens at once beside an interactive tenant with
                   short prompts: the interactive first token and gaps

Every workload is a ``WorkloadSpec`` (quanta_core/workload), so ``quanta sim`` and the bench
run the same definitions: ``build(machine)`` is the whole suite, in the order it runs.

Rates are fitted to the machine by a capacity model: a request costs its prompt tokens plus
``DECODE_UNITS`` per generated token, and the machine does ``CAPACITY_UNITS`` a second at
reference speed (the 2-core CPU the committed cost model was calibrated on, where the
coding stream's 0.25 requests/s is about 3/4 of what llama-server serves), divided by the
machine's ``speed_factor`` (the calibration probe's time here over its time there).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.lab.bench.scenarios import BATCH, TARGETS, Scenario
from quanta_core.workload import (
    TenantSpec,
    TraceRow,
    TraceSpec,
    WorkloadSpec,
    fixed,
    read_trace,
    replay,
)
from quanta_core.workload.lengths import DistKind, LengthDist

TRACE = Path(__file__).resolve().parents[3] / "bench/traces/azure_llm_2023_conv.csv"
OUTPUT = 128  # every bucket's answer
TEMPERATURE = 0.7
SLOT_ROUND = 256  # llama-server's slot: the longest request, rounded up to this
LOAD = 0.75  # the open-loop streams' rate, of the capacity model's
CAPACITY_UNITS = 325.0  # prompt-token units a second at reference speed
DECODE_UNITS = 2.5  # a generated token costs this many prompt tokens (batched decode)
# The replay's goodput also counts a first token within the server's target plus the
# prompt's own prefill alone (the reference machine's ~155 tokens/s, quanta_core/scheduler/
# slo.py, times the speed factor): a 2 s first token is out of reach of a 1,000-token prompt
# on a CPU however well it is scheduled.
REFERENCE_PREFILL_S = 0.0064
CPU_MAX_TRACE_PROMPT = 4096  # the CPU replays a window without longer prompts


@dataclass(frozen=True, slots=True)
class Machine:
    """What the suite is fitted to."""

    gpu: bool = False
    speed_factor: float = 1.0  # seconds here per second on the reference machine

    @property
    def capacity_units(self) -> float:
        return CAPACITY_UNITS / self.speed_factor


@dataclass(frozen=True, slots=True)
class Bucket:
    prompt: int
    concurrency: tuple[int, ...]


# The CPU's 8 x 1,000 and 4 x 3,000 are the points issue 38 measured; a 4k prompt runs
# alone there (four at once would take as long as the rest of the suite).
CPU_BUCKETS = (
    Bucket(128, (1, 4, 8)),
    Bucket(1000, (1, 4, 8)),
    Bucket(3000, (4,)),
    Bucket(4000, (1,)),
)
GPU_BUCKETS = (
    Bucket(128, (1, 16, 64)),
    Bucket(2000, (1, 16, 64)),
    Bucket(8000, (1, 16)),
    Bucket(16000, (1, 8)),
)


def _round_up(n: int, step: int = SLOT_ROUND) -> int:
    return step * math.ceil(n / step)


def _spec(name: str, tenants: tuple[TenantSpec, ...], **kw: object) -> WorkloadSpec:
    return WorkloadSpec(
        name,
        tenants,
        requests=None,
        temperature=TEMPERATURE,
        targets=TARGETS,
        **kw,  # type: ignore[arg-type]
    )


def bucket_scenarios(bucket: Bucket, scale: float = 1.0) -> list[Scenario]:
    """One scenario per concurrency, all on one server start (``-np`` the largest)."""
    slots = max(bucket.concurrency)
    out = []
    for c in bucket.concurrency:
        n = max(1, math.ceil(c * scale))
        people = TenantSpec("people", prompt=fixed(bucket.prompt), output=fixed(OUTPUT), requests=n)
        name = f"len-{_short(bucket.prompt)}-x{c}"
        out.append(
            Scenario(
                name,
                _spec(name, (people,), rate=math.inf),
                n_ctx=None,
                kind="bucket",
                group=f"len-{_short(bucket.prompt)}",
                llama_slots=slots,
                llama_ctx=slots * _round_up(bucket.prompt + OUTPUT),
                text_prompts=True,
            )
        )
    return out


def _short(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def trace_time_scale(arrivals: Sequence[float], rate: float) -> float:
    """The factor that slows ``arrivals`` (seconds, ascending) to ``rate`` a second."""
    if len(arrivals) < 2 or arrivals[-1] <= arrivals[0]:
        return 1.0
    native = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    return native / rate


def request_units(prompt: float, output: float) -> float:
    return prompt + DECODE_UNITS * output


def representative_start(
    rows: Sequence[TraceRow], requests: int, max_prompt: int | None, tolerance: float = 0.1
) -> int:
    """The first row from which ``requests`` consecutive rows have a median prompt within
    ``tolerance`` of the whole trace's and none longer than ``max_prompt`` (a short replay
    from the trace's start would be of its shorter prompts); 0 if none has."""
    whole = statistics.median(r.prompt_tokens for r in rows)
    for k in range(len(rows) - requests + 1):
        window = [r.prompt_tokens for r in rows[k : k + requests]]
        if max_prompt is not None and max(window) > max_prompt:
            continue
        if abs(statistics.median(window) - whole) <= tolerance * whole:
            return k
    return 0


def conv_replay(machine: Machine, requests: int, trace: Path = TRACE) -> Scenario:
    """``requests`` consecutive requests of the trace at their recorded lengths (the first
    representative window), the arrivals slowed (``time_scale``) to ``LOAD`` of the capacity
    model's rate for their lengths."""
    everything = read_trace(str(trace))
    max_prompt = None if machine.gpu else CPU_MAX_TRACE_PROMPT
    start = representative_start(everything, requests, max_prompt)
    window = TraceSpec(str(trace), start_s=everything[start].arrival, limit=requests)
    rows = list(replay(everything, window))
    mean = request_units(
        sum(r.prompt_tokens for r in rows) / len(rows),
        sum(r.output_tokens for r in rows) / len(rows),
    )
    rate = LOAD * machine.capacity_units / mean
    scale = trace_time_scale([r.arrival for r in rows], rate)
    longest = max(r.prompt_tokens + r.output_tokens for r in rows)
    slots = 64 if machine.gpu else 8
    spec = _spec(
        "conv-replay",
        (TenantSpec("conv"),),
        trace=dataclasses.replace(window, time_scale=scale),
        seed=3,
    )
    return Scenario(
        "conv-replay",
        spec,
        n_ctx=None,
        kind="replay",
        llama_slots=slots,
        llama_ctx=slots * _round_up(longest),
        text_prompts=True,
        ttft_per_token_s=REFERENCE_PREFILL_S * machine.speed_factor,
    )


CODING_PROMPT = LengthDist(DistKind.LOGNORMAL, mean=850.0, std=850.0, min=33, max=3718)
CODING_OUTPUT = LengthDist(DistKind.UNIFORM, min=6, max=94)


def coding(machine: Machine, requests: int) -> Scenario:
    """Mixed lengths (median prompt ~600), Poisson at ``LOAD`` of capacity."""
    rate = LOAD * machine.capacity_units / request_units(CODING_PROMPT.mean, 50.0)
    coder = TenantSpec(
        "coder", prompt=CODING_PROMPT, output=CODING_OUTPUT, rate=rate, requests=requests
    )
    slots = 64 if machine.gpu else 8
    return Scenario(
        "coding",
        _spec("coding", (coder,), seed=7),
        n_ctx=None,
        kind="coding",
        llama_slots=slots,
        llama_ctx=slots * _round_up(3718 + 94),
        text_prompts=True,
    )


SYSTEM_PROMPT = 1500


def shared_prefix(requests: int) -> Scenario:
    """One user, one request at a time, each the same 1,500-token system prompt and a
    40-120-token turn of its own; 32 tokens out."""
    app = TenantSpec(
        "app",
        prompt=LengthDist(DistKind.UNIFORM, min=SYSTEM_PROMPT + 40, max=SYSTEM_PROMPT + 120),
        output=fixed(32),
        prefix_tokens=SYSTEM_PROMPT,
    )
    spec = WorkloadSpec(
        "shared-prefix",
        (app,),
        seed=5,
        requests=requests,
        users=1,
        temperature=TEMPERATURE,
        targets=TARGETS,
    )
    return Scenario(
        "shared-prefix",
        spec,
        n_ctx=None,
        kind="prefix",
        llama_slots=4,
        llama_ctx=4 * _round_up(SYSTEM_PROMPT + 120 + 32),
        text_prompts=True,
    )


def flood_long(machine: Machine, batch: int, interactive: int, rate: float) -> Scenario:
    """``batch`` prompts of 3-4k tokens at once (batch key, 64 out) beside an interactive
    tenant sending 64-128-token prompts (32 out) at ``rate`` a second."""
    etl = TenantSpec(
        "etl",
        slo_class=BATCH,
        prompt=LengthDist(DistKind.UNIFORM, min=3000, max=4000),
        output=fixed(64),
        rate=math.inf,
        requests=batch,
    )
    chat = TenantSpec(
        "chat",
        prompt=LengthDist(DistKind.UNIFORM, min=64, max=128),
        output=fixed(32),
        rate=rate,
        requests=interactive,
    )
    slots = batch + min(interactive, 4 if not machine.gpu else 16)
    return Scenario(
        "flood-long",
        _spec("flood-long", (chat, etl), seed=13),
        n_ctx=None,
        kind="flood-long",
        llama_slots=slots,
        llama_ctx=slots * _round_up(4000 + 64),
        text_prompts=True,
    )


def build(machine: Machine, scale: float = 1.0) -> list[Scenario]:
    """The whole long suite for ``machine``, in the order it runs; ``scale`` shrinks the
    counts (the suite's tests run it at a tiny scale)."""

    def n(count: int) -> int:
        return max(1, math.ceil(count * scale))

    buckets = GPU_BUCKETS if machine.gpu else CPU_BUCKETS
    out = [s for b in buckets for s in bucket_scenarios(b, scale)]
    if machine.gpu:
        out += [
            conv_replay(machine, n(400)),
            coding(machine, n(400)),
            shared_prefix(n(8)),
            flood_long(machine, n(64), n(60), 2.0),
        ]
    else:
        out += [
            conv_replay(machine, n(12)),
            coding(machine, n(24)),
            shared_prefix(n(6)),
            flood_long(machine, n(4), n(16), 0.4),
        ]
    return out


def names(machine: Machine) -> list[str]:
    return [s.name for s in build(machine, scale=0.01)]
