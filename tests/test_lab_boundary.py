"""The product and the lab apart: the server imports none of the lab's libraries, and without
the ``lab`` extra the lab's commands say which extra to install while the server's work.

Each check runs a fresh Python (``sys.modules`` of this test process holds everything the
suite imported). "Without the extra" is a meta-path finder that refuses matplotlib: the one
library of the extra that nothing else installs (litestar brings pyyaml and rich, typer rich).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.lab.cli import COMMANDS, INSTALL, LIBRARIES

ROOT = Path(__file__).resolve().parents[1]

BLOCKER = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Refuse())
"""


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def loaded_after(statement: str) -> set[str]:
    """The top-level packages of ``LIBRARIES`` a fresh Python has loaded after ``statement``."""
    code = f"{statement}\nimport json, sys\n"
    code += "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    done = python(code)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1])) & set(LIBRARIES)


def test_the_server_package_imports_none_of_the_labs_libraries() -> None:
    assert loaded_after("import app.server") == set()


def test_the_serving_stack_imports_no_plotting_or_tables() -> None:
    # The app, its assembly and uvicorn's runner: what ``quanta run`` executes. (litestar
    # itself imports pyyaml, its own dependency, for its OpenAPI document.)
    loaded = loaded_after("import app.server.app, app.server.serve, app.server.assemble")
    assert loaded <= {"yaml"}


def test_the_server_harness_needs_none_of_the_labs_libraries() -> None:
    # The product's tests start their servers with it (tests/server_process.py). (httpx
    # imports rich, typer's dependency, for its own command line when it is installed.)
    assert loaded_after("import app.lab.server") <= {"rich"}


def cli_without_extra(*args: str) -> subprocess.CompletedProcess[str]:
    code = BLOCKER + f"sys.argv = ['quanta', *{list(args)!r}]\nfrom app.cli import main\nmain()"
    return python(code)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_lab_command_without_the_extra_names_the_extra(command: str) -> None:
    done = cli_without_extra(command, "--some-option", "value")
    assert done.returncode == 2
    assert INSTALL in done.stderr
    assert "matplotlib" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_servers_commands_work_without_the_extra() -> None:
    listed = cli_without_extra("--help")
    assert listed.returncode == 0, listed.stderr
    assert "run" in listed.stdout and "migrate" in listed.stdout
    for command in ("run", "migrate", "tenants"):
        done = cli_without_extra(command, "--help")
        assert done.returncode == 0, done.stderr
        assert "Usage" in done.stdout


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_test_or_lab_module_imports_scripts() -> None:
    # scripts/ holds set-up and CI helpers; a measurement is a ``quanta`` command.
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("tests", "app", "quanta_core")
        for path in (ROOT / folder).rglob("*.py")
        if "scripts" in imported_roots(path)
    ]
    assert offenders == []
