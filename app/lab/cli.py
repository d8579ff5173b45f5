"""The lab's commands on ``quanta``: every measurement is one of them.

    quanta bench run|compare|summarize|scenarios   load against a server (app.lab.bench)
    quanta bench engine|scheduler|…                one part measured (app.lab.measure)
    quanta bench reliability soak|chaos|overload   a server under abuse (app.lab.reliability)
    quanta bench fidelity run|table|…              real vs simulated (app.lab.fidelity)
    quanta bench horizon served|sim|…              the horizon policy's figures (app.lab.horizon)
    quanta bench clients run|table                 third-party load tools (app.lab.clients)
    quanta bench fleet SCENARIO                    a fleet behind Envoy (app.lab.fleet)
    quanta bench gpu serve|llama|long|…            on a GPU machine (app.lab.gpu, gpu_run.sh)
    quanta calibrate | sim | sweep | step-report | step-replay

They need the ``lab`` extra (tables, plots, YAML: ``LIBRARIES``); without it each of them
says which extra to install, and the server's commands work as before. This module imports
nothing but typer until a command runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

LIBRARIES = ("matplotlib", "rich", "yaml")  # what `pip install 'quanta[lab]'` adds
INSTALL = "pip install 'quanta[lab]'"
COMMANDS = ("bench", "calibrate", "sim", "sweep", "step-report", "step-replay")
PASS_ARGS: dict[str, Any] = {"allow_extra_args": True, "ignore_unknown_options": True}

# quanta bench NAME [ARGS…]: the module's argparse ``main`` gets ARGS (``--help`` too).
MEASUREMENTS: tuple[tuple[str, str, str], ...] = (
    ("engine", "app.lab.measure.engine", "engine step vs batch and context, prefill, stash"),
    ("scheduler", "app.lab.measure.scheduler", "scheduler cycle overhead; a burst's admission"),
    ("twenty-core", "app.lab.measure.twenty_core", "twenty people at once, in the core"),
    ("cached-cells", "app.lab.measure.cached_cells", "decode step beside cached prefix cells"),
    ("http-overhead", "app.lab.measure.http_overhead", "HTTP streaming vs the engine alone"),
    ("kv-layout", "app.lab.measure.kv_layout", "one KV buffer vs a stream per sequence"),
    ("settings-ab", "app.lab.measure.settings_ab", "two servers alike but for some settings"),
    ("auth", "app.lab.measure.auth", "authentication + quota checks per request"),
    ("metrics-scrape", "app.lab.measure.metrics_scrape", "what a /metrics scrape costs"),
    ("sim-speed", "app.lab.measure.sim_speed", "simulator speed, 10,000 requests"),
    ("sim-process", "app.lab.measure.sim_process", "one whole `quanta sim` process, timed"),
    ("sweep-speed", "app.lab.measure.sweep_speed", "the default `quanta sweep`, timed"),
    ("long-prompts", "app.lab.measure.long_prompts", "the default policy at real lengths"),
    ("batched-bench", "app.lab.calibrate.batched_bench", "llama-batched-bench rows as a model"),
    ("fleet", "app.lab.fleet", "replicas behind Envoy: quotas, revocation, kills, weights"),
    ("gpu", "app.lab.gpu", "on a GPU: raw vs served, vs llama-server, calibration"),
)
RELIABILITY: tuple[tuple[str, str, str], ...] = (
    ("soak", "app.lab.reliability.soak", "mixed load for minutes: memory, ledger, slots"),
    ("chaos", "app.lab.reliability.chaos", "engine and server killed under load"),
    ("overload", "app.lab.reliability.overload", "10x capacity, open loop"),
)
HORIZON: tuple[tuple[str, str, str], ...] = (
    ("served", "app.lab.horizon.served", "the served KV-bound burst, fcfs and horizon in turns"),
    ("sim", "app.lab.horizon.sim", "the same burst simulated over pool and burst sizes"),
    ("ablation", "app.lab.horizon.ablation", "what admission projects with, simulated"),
    ("accuracy", "app.lab.horizon.accuracy", "the length predictor's accuracy, online"),
    ("figures", "app.lab.horizon.figures", "the figures of runs already made"),
)


def missing_libraries() -> list[str]:
    """The lab's libraries this Python cannot import."""
    missing = []
    for name in LIBRARIES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def add_lab_commands(cli: typer.Typer) -> None:
    """The lab's commands on ``cli``: the real ones, or where the extra is missing, ones that
    say so."""
    missing = missing_libraries()
    if missing:
        for name in COMMANDS:
            cli.command(name, context_settings=PASS_ARGS, add_help_option=False)(
                _needs_extra(name, missing)
            )
        return
    from app.lab.calibrate.command import calibrate
    from app.lab.sim import sim
    from app.lab.steps import step_replay, step_report
    from app.lab.sweep import sweep

    cli.add_typer(bench_commands(), name="bench")
    cli.command()(calibrate)
    cli.command()(sim)
    cli.command()(sweep)
    cli.command(name="step-report")(step_report)
    cli.command(name="step-replay")(step_replay)


def _needs_extra(name: str, missing: list[str]) -> Callable[[typer.Context], None]:
    def command(ctx: typer.Context) -> None:
        typer.echo(
            f"quanta {name} is a lab command: it needs {', '.join(missing)}, which the lab "
            f'extra installs: {INSTALL} (from a checkout: pip install -e ".[lab]")',
            err=True,
        )
        raise typer.Exit(code=2)

    command.__doc__ = f"(needs the lab extra: {INSTALL})"
    return command


def bench_commands() -> typer.Typer:
    """``quanta bench``: the load runner's commands and every measurement."""
    from app.lab.bench.cli import bench_cli

    for name, module, help_text in MEASUREMENTS:
        _add_module(bench_cli, name, module, help_text)
    for title, table in (
        ("A server under abuse: memory, ledger, how requests end.", RELIABILITY),
        ("The horizon policy's figures, served and simulated.", HORIZON),
    ):
        group = typer.Typer(help=title, no_args_is_help=True)
        for name, module, help_text in table:
            _add_module(group, name, module, help_text)
        bench_cli.add_typer(group, name="reliability" if table is RELIABILITY else "horizon")
    bench_cli.add_typer(_fidelity(), name="fidelity")
    bench_cli.add_typer(_clients(), name="clients")
    return bench_cli


def _add_module(group: typer.Typer, name: str, module: str, help_text: str) -> None:
    """``name`` runs ``module.main()`` with the arguments after it (argparse reads them)."""

    def command(ctx: typer.Context) -> None:
        prog = f"quanta {ctx.command_path.split(' ', 1)[1]}"
        sys.argv = [prog, *ctx.args]
        code = importlib.import_module(module).main()
        raise typer.Exit(code=code or 0)

    group.command(name, help=help_text, context_settings=PASS_ARGS, add_help_option=False)(command)


FIDELITY = Path("bench/results/fidelity")


def _fidelity() -> typer.Typer:
    group = typer.Typer(help="The simulator against the real server.", no_args_is_help=True)

    @group.command("run", context_settings=PASS_ARGS, add_help_option=False)
    def run(ctx: typer.Context) -> None:
        """The same workload real and simulated, policies × loads (--help: its options)."""
        from app.lab.fidelity.run import main

        sys.argv = ["quanta bench fidelity run", *ctx.args]
        main()

    @group.command("table")
    def table(folder: Annotated[Path, typer.Argument()] = FIDELITY) -> None:
        """The error table of a folder of real-/sim- pairs: fidelity.json, fidelity.md."""
        from app.lab.fidelity.table import main

        main(folder)

    @group.command("cross")
    def cross(folder: Annotated[Path, typer.Argument()] = FIDELITY) -> None:
        """Each run simulated with a cost model fitted from the other runs' served steps."""
        from app.lab.fidelity.cross import main

        main(folder)

    @group.command("replay")
    def replay(folder: Annotated[Path, typer.Argument()] = FIDELITY) -> None:
        """Each run simulated with a cost model from the engine alone replaying the others."""
        from app.lab.fidelity.replay import main

        main(folder)

    @group.command("repeat")
    def repeat(folders: Annotated[list[Path], typer.Argument(min=2)]) -> None:
        """Real runs of one workload against each other: the machine's noise floor."""
        from app.lab.fidelity.repeat import main

        main(folders)

    @group.command("server-cost")
    def server_cost(
        out: Annotated[Path, typer.Argument(help="the JSON to write")],
        traces: Annotated[list[Path], typer.Argument(help="step traces (.jsonl)")],
    ) -> None:
        """The server's own time per cycle and per streamed token, from step traces."""
        from app.lab.fidelity.server_cost import main

        main(out, traces)

    return group


def _clients() -> typer.Typer:
    group = typer.Typer(help="guidellm and aiperf beside `quanta bench`.", no_args_is_help=True)

    @group.command("run", context_settings=PASS_ARGS, add_help_option=False)
    def run(ctx: typer.Context) -> None:
        """guidellm, aiperf and `quanta bench` against Quanta and llama-server (--help)."""
        from app.lab.clients.run import main

        sys.argv = ["quanta bench clients run", *ctx.args]
        main()

    @group.command("table")
    def table(
        folder: Annotated[Path, typer.Argument()] = Path("bench/results/clients"),
    ) -> None:
        """Each client's own figures side by side; writes summary.json."""
        from app.lab.clients.table import main

        main(folder)

    return group
