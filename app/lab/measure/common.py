"""What the measurements share: the machine's description and the results file."""

from __future__ import annotations

import json
import os
import platform
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from rich.console import Console

console = Console()


def environment(**extra: Any) -> dict[str, Any]:
    return {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "llama_cpp_python": version("llama-cpp-python"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    }


def write_results(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"written to {path}")
