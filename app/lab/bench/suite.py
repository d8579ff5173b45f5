"""``quanta bench scenarios``: every scenario against every server, in turns, one table.

For each scenario, each server in turn (the default policy first): start it fresh (its
tenants created), send the scenario's workload with the same client (``runner.run_plan``),
stop it; the scenarios of one group (a prompt length's concurrencies) run one after another
on one start. Real-text prompts are tokenized before any server starts. Each run is
written as a bench results file, ``<scenario>-<server>.json``; the table's cells and key
figures go to ``figures.json`` and ``table.md``, one TTFT CDF per scenario to
``<scenario>.png``. The machine's load average is kept with every run: this machine is
shared, and the figures are only worth their ratios within one suite run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from app.lab.bench.cells import estimate_errors, focus_class, generic, key_figures, last_attempts
from app.lab.bench.cli import discover_model
from app.lab.bench.client import Target
from app.lab.bench.report import build_result, environment, write_result
from app.lab.bench.runner import RunOptions, run_plan
from app.lab.bench.scenarios import ALL, Scenario
from app.lab.bench.servers import Launcher, Running, ServerSpec
from app.lab.bench.text_prompts import Tokenize, prompt_ids_for
from app.lab.bench.workloads import make_plan
from quanta_core.metrics import RequestRecord, summarize
from quanta_core.workload import WorkloadSpec

Log = Callable[[str], None]


def _with_keys(spec: WorkloadSpec, keys: dict[str, str]) -> WorkloadSpec:
    tenants = tuple(dataclasses.replace(t, api_key=keys.get(t.name)) for t in spec.tenants)
    return dataclasses.replace(spec, tenants=tenants)


def groups(scenarios: Sequence[Scenario]) -> list[list[Scenario]]:
    """Consecutive scenarios of one named group together; every other scenario alone."""
    out: list[list[Scenario]] = []
    for s in scenarios:
        if out and s.group and out[-1][-1].group == s.group:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def server_spec(group: Sequence[Scenario]) -> ServerSpec:
    """One server start for every scenario of ``group``: their tenants, the largest sizes."""
    tenants = {t.name: t for s in group for t in s.spec.tenants}
    sizes = [s.n_ctx for s in group if s.n_ctx is not None]
    llama = [c for s in group if (c := s.llama_ctx or s.n_ctx) is not None]
    return ServerSpec(
        n_ctx=max(sizes) if sizes else None,
        tenants=tuple(tenants.values()),
        llama_slots=max(s.llama_slots for s in group),
        llama_ctx=max(llama) if llama else None,
    )


def run_one(
    scenario: Scenario,
    server: str,
    launcher: Launcher,
    out: Path,
    timeout_s: float = 600.0,
    prompts: Mapping[int, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """One scenario against one server, started for it alone: its cell."""
    with launcher(server, server_spec([scenario])) as running:
        return run_on(scenario, server, running, out, timeout_s, prompts)


def run_on(
    scenario: Scenario,
    server: str,
    running: Running,
    out: Path,
    timeout_s: float = 600.0,
    prompts: Mapping[int, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """One scenario against a running server: its cell."""
    load_before = os.getloadavg()
    spec = _with_keys(scenario.spec, running.keys)
    first_key = next(iter(running.keys.values()), None)
    target = Target(
        url=running.url,
        model=discover_model(running.url, first_key),
        endpoint=spec.endpoint,
        seed=spec.seed,
        ignore_eos=spec.ignore_eos,
        temperature=spec.temperature,
    )
    attempts: list[RequestRecord] = []
    options = RunOptions(first_key, timeout_s, retries=scenario.retries, prompts=prompts)
    plan = make_plan(spec)
    began = time.monotonic()
    asyncio.run(run_plan(spec, plan, target, options, on_done=attempts.append))
    wall_s = time.monotonic() - began
    env = environment(running.url, first_key)
    records = last_attempts(attempts)
    label = f"{scenario.name}-{server}"
    summary = summarize(records, spec.targets, window_s=spec.window_s)
    flags = {
        "server": server,
        "n_ctx": scenario.n_ctx,
        "llama_slots": scenario.llama_slots,
        "llama_ctx": scenario.llama_ctx,
        "retries": scenario.retries,
        "text_prompts": prompts is not None,
    }
    result = build_result(
        label=label, spec=spec, flags=flags, env=env, records=attempts, summary=summary
    )
    write_result(result, out / f"{label}.json")
    return {
        "scenario": scenario.name,
        "kind": scenario.key_kind,
        "server": server,
        **generic(records, focus_class(scenario)),
        "key": key_figures(scenario, attempts),
        "estimate": estimate_errors(records),
        "wall_s": wall_s,
        "load_avg_before": list(load_before),
        "load_avg_after": list(os.getloadavg()),
        "records": records,
    }


def scenario_prompts(
    scenarios: Sequence[Scenario], tokenize: Tokenize | None
) -> dict[str, dict[int, list[int]]]:
    """The real-text prompts of the scenarios that ask for them (none without a tokenizer:
    they send seeded token ids then)."""
    if tokenize is None:
        return {}
    return {
        s.name: prompt_ids_for(s.spec, make_plan(s.spec), tokenize)
        for s in scenarios
        if s.text_prompts
    }


def run_suite(
    scenarios: Sequence[Scenario],
    servers: Sequence[str],
    launcher: Launcher,
    out: Path,
    log: Log = print,
    tokenize: Tokenize | None = None,
) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    prompts = scenario_prompts(scenarios, tokenize)
    cells: list[dict[str, Any]] = []
    for group in groups(scenarios):
        for server in servers:
            log(f"{', '.join(s.name for s in group)}: {server}")
            try:
                with launcher(server, server_spec(group)) as running:
                    for scenario in group:
                        cell = run_on(
                            scenario, server, running, out, prompts=prompts.get(scenario.name)
                        )
                        log(f"  {scenario.name}: {server}: {cell['wall_s']:.0f} s")
                        cells.append(cell)
            except RuntimeError as exc:  # a server that would not start: a gap, not a stop
                log(f"{group[0].name}: {server} did not run: {exc}")
        for scenario in group:
            _plot(scenario.name, [c for c in cells if c["scenario"] == scenario.name], out)
    figures = merge_figures(out / "figures.json", cells)
    (out / "figures.json").write_text(json.dumps(figures, indent=1) + "\n")
    log(f"the suite took {time.monotonic() - began:.0f} s")
    return cells


def merge_figures(path: Path, cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """This run's cells, after the cells of earlier runs into the same folder that it did
    not run again (so that a suite may be run in parts)."""
    new = {
        (c["scenario"], c["server"]): {k: v for k, v in c.items() if k != "records"} for c in cells
    }
    old = json.loads(path.read_text()) if path.is_file() else []
    merged = [new.pop((c["scenario"], c["server"]), c) for c in old]
    order = {name: i for i, name in enumerate(ALL)}
    # stable: scenarios outside ALL (the long suite's) keep the order they ran in
    return sorted([*merged, *new.values()], key=lambda c: order.get(c["scenario"], len(order)))


def _plot(name: str, cells: list[dict[str, Any]], out: Path) -> None:
    if not cells:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), constrained_layout=True)
    for c in cells:
        rs = [r for r in c["records"] if r.ok and r.token_times]
        for ax, values in (
            (axes[0], sorted(r.ttft for r in rs if r.ttft is not None)),
            (axes[1], sorted(g for r in rs for g in r.itls)),
        ):
            if values:
                ys = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, ys, where="post", label=c["server"])
    axes[0].set_xlabel("time to first token (s)")
    axes[1].set_xlabel("inter-token gap (s)")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.set_ylabel("fraction")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{name}: every server in turn, the same client")
    fig.savefig(out / f"{name}.png", dpi=80)
    plt.close(fig)
