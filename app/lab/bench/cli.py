"""``quanta bench run`` and ``quanta bench compare``.

quanta bench run --preset twenty-at-once --url http://127.0.0.1:8000 --out bench/results/x.json
quanta bench run --workload bench/workloads/two_tenants.toml --api-key $KEY --rate 2
quanta bench compare bench/results/a.json bench/results/b.json
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from app.lab.bench.client import Target
from app.lab.bench.compare import print_comparison
from app.lab.bench.processes import Senders, processes_for
from app.lab.bench.report import build_result, environment, load_result, records_of, write_result
from app.lab.bench.runner import RunOptions
from app.lab.bench.scenarios import Scenario
from app.lab.bench.table import print_result
from app.lab.bench.workloads import apply_overrides, make_plan, resolve_workload
from quanta_core.metrics import RequestRecord, summarize
from quanta_core.workload import (
    Endpoint,
    PlannedRequest,
    WorkloadError,
    WorkloadSpec,
)

bench_cli = typer.Typer(
    help="Measurements: load against a server (run, scenarios), and each part alone.",
    no_args_is_help=True,
)
console = Console()


def discover_model(url: str, api_key: str | None) -> str:
    """The first model the server lists (Quanta and llama-server both list one)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url + "/v1/models", headers=headers, timeout=10.0)
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return "default"


def measure(
    spec: WorkloadSpec,
    plan: list[PlannedRequest],
    target: Target,
    options: RunOptions,
    *,
    processes: int = 1,
    quiet: bool = False,
) -> list[RequestRecord]:
    with (
        Senders(spec, plan, target, options, processes) as senders,
        Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"),
            TimeElapsedColumn(),
            console=console,
            disable=quiet,
            transient=False,
        ) as progress,
    ):
        task = progress.add_task(spec.name, total=len(plan), failed=0)
        failed = 0

        def done(record: RequestRecord) -> None:
            nonlocal failed
            failed += 0 if record.ok else 1
            progress.update(task, advance=1, failed=failed)

        return senders.run(on_done=done)


@bench_cli.command("run")
def run(
    url: Annotated[str, typer.Option(help="the server's base URL")] = "http://127.0.0.1:8000",
    api_key: Annotated[
        str | None, typer.Option(envvar="QUANTA_API_KEY", help="Bearer key for every tenant")
    ] = None,
    workload: Annotated[Path | None, typer.Option(help="workload file (TOML or YAML)")] = None,
    preset_name: Annotated[
        str | None, typer.Option("--preset", help="a named workload: twenty-at-once")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="results file (.json)")] = None,
    label: Annotated[str | None, typer.Option(help="the run's name in tables")] = None,
    model: Annotated[str | None, typer.Option(help="model id (default: the server's)")] = None,
    requests: Annotated[int | None, typer.Option(help="override: request count")] = None,
    rate: Annotated[float | None, typer.Option(help="override: requests/s (inf)")] = None,
    burstiness: Annotated[float | None, typer.Option(help="override: gamma shape")] = None,
    concurrency: Annotated[int | None, typer.Option(help="override: cap in flight")] = None,
    users: Annotated[int | None, typer.Option(help="override: closed loop, N users")] = None,
    seed: Annotated[int | None, typer.Option(help="override: seed")] = None,
    endpoint: Annotated[Endpoint | None, typer.Option(help="override: endpoint")] = None,
    window: Annotated[float | None, typer.Option(help="fairness window (s)")] = None,
    plots: Annotated[bool, typer.Option(help="write PNG plots next to --out")] = True,
    timeout: Annotated[float, typer.Option(help="per-request read timeout (s)")] = 600.0,
    quiet: Annotated[bool, typer.Option(help="no progress bar")] = False,
    processes: Annotated[
        int | None,
        typer.Option(
            help="client processes sending an open-loop plan, each every N-th request "
            "(default: one per 4 cores, at most 8, one per 32 requests)"
        ),
    ] = None,
) -> None:
    """Send a workload to a server, print the figures, write them (and plots) to --out."""
    try:
        spec = apply_overrides(
            resolve_workload(workload, preset_name),
            {
                "requests": requests,
                "rate": rate,
                "burstiness": burstiness,
                "concurrency": concurrency,
                "users": users,
                "seed": seed,
                "endpoint": endpoint,
                "window_s": window,
            },
        )
        plan = make_plan(spec)
    except (WorkloadError, ValueError, OSError) as exc:
        console.print(f"[red]workload: {exc}")
        raise typer.Exit(code=2) from None
    try:
        senders = processes_for(spec, len(plan), processes)
    except ValueError as exc:
        console.print(f"[red]{exc}")
        raise typer.Exit(code=2) from None
    url = url.rstrip("/")
    target = Target(
        url=url,
        model=model or discover_model(url, api_key),
        endpoint=spec.endpoint,
        seed=spec.seed,
        ignore_eos=spec.ignore_eos,
        temperature=spec.temperature,
    )
    name = label or spec.name
    out = out or Path("bench/results") / f"{name}.json"
    env = environment(url, api_key)
    options = RunOptions(api_key, timeout)
    records = measure(spec, plan, target, options, processes=senders, quiet=quiet)
    summary = summarize(records, spec.targets, window_s=spec.window_s)
    flags = {
        "url": url,
        "model": target.model,
        "workload": None if workload is None else str(workload),
        "preset": preset_name,
        "processes": senders,
    }
    result = build_result(
        label=name, spec=spec, flags=flags, env=env, records=records, summary=summary
    )
    write_result(result, out)
    print_result(result, console)
    console.print(f"results: {out}")
    if plots:
        from app.lab.bench.plots import plot_all

        for path in plot_all(result, records, out):
            console.print(f"plot: {path}")
    failed = summary.overall.failed
    if failed:
        first = next(r for r in records if not r.ok)
        console.print(f"[yellow]{failed} request(s) failed; first: {first.error}")
    if records and summary.overall.completed == 0:
        raise typer.Exit(code=1)  # nothing was measured but failures


@bench_cli.command("compare")
def compare(
    a: Annotated[Path, typer.Argument(help="results file A (the baseline)")],
    b: Annotated[Path, typer.Argument(help="results file B")],
) -> None:
    """Print two runs side by side, with B/A ratios."""
    try:
        ra, rb = load_result(a), load_result(b)
    except (OSError, ValueError) as exc:
        console.print(f"[red]{exc}")
        raise typer.Exit(code=2) from None
    print_comparison(ra, rb, console)


@bench_cli.command("summarize")
def resummarize(
    results: Annotated[Path, typer.Argument(help="a results file")],
    plots: Annotated[bool, typer.Option(help="write the PNG plots again")] = False,
) -> None:
    """Print a results file's figures again (and optionally redraw its plots)."""
    result = load_result(results)
    print_result(result, console)
    if plots:
        from app.lab.bench.plots import plot_all

        try:
            records = records_of(result)
        except ValueError as exc:
            console.print(f"[red]{results}: {exc}")
            raise typer.Exit(code=2) from None
        for path in plot_all(result, records, results):
            console.print(f"plot: {path}")


@bench_cli.command("scenarios")
def scenarios(
    servers: Annotated[
        str | None,
        typer.Option(
            help="comma-separated: quanta policies, llama-server, llama-server-kvu (default: "
            "quanta,fcfs,slo,llama-server,llama-server-kvu; the long suite's: "
            "quanta,llama-server,llama-server-kvu)"
        ),
    ] = None,
    suite: Annotated[
        str, typer.Option(help="short: the five scenarios; long: at real prompt lengths")
    ] = "short",
    only: Annotated[
        str | None, typer.Option(help="comma-separated scenarios (default: all, in order)")
    ] = None,
    out: Annotated[Path, typer.Option(help="results directory")] = Path("bench/results/scenarios"),
    model: Annotated[Path | None, typer.Option(help="GGUF file (default: Quanta's)")] = None,
    threads: Annotated[int, typer.Option(help="llama.cpp threads, every server")] = 2,
    port: Annotated[int, typer.Option(help="port of the server under test (0: a free one)")] = 0,
    llama_server: Annotated[
        Path | None, typer.Option(help="llama-server binary (default: the built one)")
    ] = None,
    scale: Annotated[float, typer.Option(help="shrink counts and durations")] = 1.0,
    overload_rate: Annotated[
        float | None,
        typer.Option(min=0.01, help="overload's requests/s (default: ~2x this machine's)"),
    ] = None,
    gpu: Annotated[
        bool | None,
        typer.Option(help="the long suite's GPU sizes (default: if llama.cpp offloads)"),
    ] = None,
    speed_factor: Annotated[
        float | None,
        typer.Option(
            min=0.0001,
            help="the long suite: this machine's time over the reference's (default: probed)",
        ),
    ] = None,
) -> None:
    """Every scenario against every server in turn (fresh, default settings): one table."""
    from app.lab.bench.servers import LLAMA_SERVERS, RealServers, find_llama_server
    from app.lab.bench.suite import run_suite
    from app.lab.bench.text_prompts import model_tokenizer
    from app.server.settings import default_model_path

    if suite not in ("short", "long"):
        console.print(f"[red]unknown suite {suite!r} (short, long)")
        raise typer.Exit(code=2)
    model_path = model or default_model_path()
    wanted = [n.strip() for n in only.split(",")] if only else None
    if suite == "long":
        chosen_scenarios = _long_suite(model_path, threads, scale, gpu, speed_factor)
        servers = servers or "quanta,llama-server,llama-server-kvu"
    else:
        probe = wanted is None or "overload" in wanted
        chosen_scenarios = _short_suite(model_path, threads, scale, overload_rate, probe)
    servers = servers or "quanta,fcfs,slo,llama-server,llama-server-kvu"
    known = [s.name for s in chosen_scenarios]
    names = wanted or known
    unknown = [n for n in names if n not in known]
    if unknown:
        console.print(f"[red]unknown scenarios: {unknown} (known: {', '.join(known)})")
        raise typer.Exit(code=2)
    chosen_scenarios = [s for s in chosen_scenarios if s.name in names]
    chosen = [s.strip() for s in servers.split(",") if s.strip()]
    binary = llama_server or find_llama_server()
    if binary is None and any(n in LLAMA_SERVERS for n in chosen):
        console.print("llama-server is not built (scripts/build_llama_server.sh): left out")
        chosen = [n for n in chosen if n not in LLAMA_SERVERS]
    launcher = RealServers(model_path, threads, port, binary)
    # SIGTERM unwinds like Ctrl-C: the server under test is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tokenize = model_tokenizer(model_path) if suite == "long" else None
    run_suite(chosen_scenarios, chosen, launcher, out, console.print, tokenize=tokenize)
    write_tables(out)


def _short_suite(
    model: Path, threads: int, scale: float, overload_rate: float | None, probe: bool
) -> list[Scenario]:
    """The five, overload at ``overload_rate`` (None: ~2x this machine's capacity, probed
    only when ``probe``)."""
    from app.lab.bench.scenarios import ALL, overload

    if overload_rate is None and probe:
        overload_rate = machine_overload_rate(model, threads)
    return [
        overload(scale, overload_rate) if n == "overload" and overload_rate else make(scale)
        for n, make in ALL.items()
    ]


def _long_suite(
    model: Path, threads: int, scale: float, gpu: bool | None, factor: float | None
) -> list[Scenario]:
    from app.lab.bench.long_scenarios import Machine, build

    if gpu is None:
        import llama_cpp

        gpu = bool(llama_cpp.llama_supports_gpu_offload())
    if factor is None:
        factor = machine_speed_factor(model, threads)
    if factor is None:
        factor = 1.0
        console.print("long suite: rates at the reference machine's (no speed factor)")
    machine = Machine(gpu=gpu, speed_factor=factor)
    console.print(f"long suite: {'GPU' if gpu else 'CPU'} sizes, speed factor {factor:.2f}")
    return build(machine, scale)


def machine_speed_factor(model: Path, threads: int) -> float | None:
    """How many times slower this machine runs the reference probe (about 5 s on the
    engine) than the committed cost model's calibration did; None where it cannot tell."""
    from app.lab.calibrate.command import measure_probe_alone
    from app.lab.calibrate.probe import speed_factor
    from app.lab.sim.command import CostModelMissing, default_cost_model_path
    from app.server.settings import ModelNotFoundError, Settings
    from quanta_core.engine.errors import EngineError
    from quanta_core.sim.cost_model import CostModel

    try:
        reference = CostModel.load(default_cost_model_path())
        settings = Settings(model_path=model, threads=threads)
        return speed_factor(measure_probe_alone(settings).total_s, reference)
    except (ValueError, CostModelMissing, EngineError, ModelNotFoundError) as exc:
        console.print(f"no speed factor: {exc}")
        return None


def machine_overload_rate(model: Path, threads: int) -> float:
    """Overload at about twice this machine's capacity: the reference machine's rate over
    how many times slower this one runs the reference probe than the committed cost
    model's calibration did. The reference rate where it cannot tell."""
    from app.lab.bench.scenarios import OVERLOAD_RATE

    factor = machine_speed_factor(model, threads)
    if factor is None:
        console.print(f"overload: the reference rate, {OVERLOAD_RATE}/s")
        return OVERLOAD_RATE
    rate = OVERLOAD_RATE / factor
    console.print(
        f"overload: this machine runs the reference probe x{factor:.2f} the calibration's "
        f"time: {rate:.2f} requests/s (the reference machine's {OVERLOAD_RATE}/s)"
    )
    return rate


def write_tables(out: Path) -> None:
    """``table.md`` from ``figures.json`` (every part of the suite run into ``out``)."""
    from app.lab.bench.scenario_table import estimates_markdown, markdown, ratios_markdown

    cells = json.loads((out / "figures.json").read_text())
    table = markdown(cells)
    ratios = ratios_markdown(cells)
    estimates = estimates_markdown(cells)
    (out / "table.md").write_text(table + "\n" + ratios + "\n" + estimates)
    console.print(table)
    console.print(ratios)
    console.print(estimates)
