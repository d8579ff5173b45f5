"""``quanta``: the command line. ``quanta run`` serves the OpenAI-compatible API."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

HELP = "Quanta: a multi-tenant LLM inference server."
# ``quanta run``'s options whose names are not the setting's (``--n-ctx`` is ``n_ctx``'s).
RUN_FLAGS = {"model_path": "--model", "grace_s": "--grace"}


def build_cli() -> typer.Typer:
    """Every command. Their modules are imported here, not at the top: ``quanta sim`` (see
    ``main``) needs none of the others' (the tenancy commands alone pull in the database
    stack, a large share of a simulation's start-up). The lab's commands (``app.lab.cli``)
    need the ``lab`` extra; without it they say so and the others work."""
    from app.admin.cli import audit, keys_cli, quotas_cli, tenants_cli, usage
    from app.fleet.command import fleet
    from app.lab.cli import add_lab_commands
    from app.tenancy.cli import migrate

    cli = typer.Typer(help=HELP, no_args_is_help=True)
    cli.callback()(_options)
    cli.command()(migrate)
    cli.add_typer(tenants_cli, name="tenants")
    cli.add_typer(keys_cli, name="keys")
    cli.add_typer(quotas_cli, name="quotas")
    cli.command()(usage)
    cli.command()(audit)
    add_lab_commands(cli)
    cli.command()(run)
    cli.command()(fleet)
    cli.command()(version)
    return cli


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"quanta {package_version()}")
        raise typer.Exit()


def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """Quanta: a multi-tenant LLM inference server."""


def package_version() -> str:
    try:
        return importlib.metadata.version("quanta")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def sim_cli() -> typer.Typer:
    """``quanta`` with the ``sim`` command alone (the same options and help for it)."""
    from app.lab.sim import sim

    cli = typer.Typer(help=HELP, no_args_is_help=True)
    cli.callback()(_options)  # a group, as the whole CLI is: ``quanta sim ...``
    cli.command()(sim)
    return cli


def __getattr__(name: str) -> typer.Typer:
    if name == "cli":  # ``from app.cli import cli``: the whole CLI, built on first use
        globals()["cli"] = built = build_cli()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run(
    host: Annotated[str | None, typer.Option(help="address to listen on")] = None,
    port: Annotated[int | None, typer.Option(help="port (0: any free port)")] = None,
    model: Annotated[Path | None, typer.Option(help="GGUF file (default: SmolLM2-135M)")] = None,
    model_name: Annotated[str | None, typer.Option(help="the model id clients send")] = None,
    served_model_names: Annotated[
        str | None, typer.Option(help="more model ids for it (aliases), comma-separated")
    ] = None,
    policy: Annotated[str | None, typer.Option(help="scheduling policy")] = None,
    n_ctx: Annotated[
        int | None,
        typer.Option(help="the longest request, prompt + output (unset: fitted to the machine)"),
    ] = None,
    n_seq_max: Annotated[
        int | None, typer.Option(help="engine sequence slots (unset: fitted to the machine)")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="llama.cpp threads")] = None,
    n_gpu_layers: Annotated[
        int | None, typer.Option(help="layers on the GPU (0: none, -1: all)")
    ] = None,
    grace: Annotated[float | None, typer.Option(help="seconds in-flight requests get")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning…")] = None,
) -> None:
    """Serve the model: /v1/chat/completions, /v1/completions, /v1/models, /metrics."""
    flags: dict[str, Any] = {
        "host": host,
        "port": port,
        "model_path": model,
        "model_name": model_name,
        "served_model_names": served_model_names,
        "policy": policy,
        "n_ctx": n_ctx,
        "n_seq_max": n_seq_max,
        "threads": threads,
        "n_gpu_layers": n_gpu_layers,
        "grace_s": grace,
        "log_level": log_level,
    }
    from app.server.config import load_settings
    from app.server.config_file import ConfigError
    from app.tenancy.cli import config_failure

    try:
        settings = load_settings(
            flags, flag_names=RUN_FLAGS, warn=lambda line: typer.echo(line, err=True)
        )
    except ConfigError as exc:
        raise config_failure(exc) from None
    from app.server.serve import serve  # the web stack, for this command only

    code = serve(settings)
    if code:
        raise typer.Exit(code=code)


def version() -> None:
    """Print the version."""
    typer.echo(f"quanta {package_version()}")


def main() -> None:
    # A simulation imports only what it runs: whole-process time is what issue 22 measures.
    from app.lab.cli import missing_libraries

    alone = sys.argv[1:2] == ["sim"] and not missing_libraries()
    command = sim_cli() if alone else build_cli()
    command()


if __name__ == "__main__":
    main()
