"""Which machine this is, as a cost model's file name says it: ``<cpus>cpu-<cpu model>``."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path


def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$", " ", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:40] or "cpu"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def machine_slug(threads: int) -> str:
    """``<cpus>cpu-<cpu model>``, e.g. ``2cpu-amd-epyc``; ``-<n>t`` when threads != cpus.

    Not the hostname: containers and VMs rename themselves, the CPU stays.
    """
    cpus = os.cpu_count() or 1
    name = f"{cpus}cpu-{_slug(cpu_model())}"
    return name if threads == cpus else f"{name}-{threads}t"
