"""The machine the engine is fitted to (cores, RAM, the GPU's free memory) and the model's
shape, read for ``quanta_core.engine.fit``: what ``Settings.layout`` fits when a user sets
nothing but the model.

Free VRAM is read with ``nvidia-smi`` (the CUDA builds llama-cpp-python makes); where it
cannot be read the KV is sized as on a CPU and the start says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from quanta_core.engine.fit import Device, EngineLayout, ModelShape

MiB = 1 << 20
NVIDIA_SMI_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Fitted:
    model: ModelShape
    device: Device
    layout: EngineLayout


def probe_model(path: Path) -> ModelShape:
    from quanta_core.engine.llama_cpp.probe import model_shape  # loads llama.cpp

    return model_shape(str(path))


def probe_device() -> Device:
    from quanta_core.engine.llama_cpp.probe import gpu_offload  # loads llama.cpp

    ram, available = ram_bytes()
    gpu = gpu_offload()
    free, total, name = nvidia_memory() if gpu else (None, None, "")
    return Device(
        cpu_cores=os.cpu_count() or 1,
        ram_bytes=ram,
        ram_available_bytes=available,
        gpu_offload=gpu,
        vram_free_bytes=free,
        vram_total_bytes=total,
        gpu_name=name,
    )


def ram_bytes() -> tuple[int, int]:
    """Total and available RAM (MemAvailable: what can be had without swapping)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return total, int(line.split()[1]) * 1024
    except OSError:
        pass
    return total, total


def nvidia_memory() -> tuple[int | None, int | None, str]:
    """Free and total memory of the GPUs llama.cpp would use (all of them, or those
    ``CUDA_VISIBLE_DEVICES`` names by index), summed: llama.cpp splits layers across them."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, None, ""
    fields = "index,name,memory.free,memory.total"
    query = [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(
            query,
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None, ""
    return parse_nvidia_smi(out, os.environ.get("CUDA_VISIBLE_DEVICES"))


def parse_nvidia_smi(out: str, visible: str | None) -> tuple[int | None, int | None, str]:
    """``index, name, free MiB, total MiB`` lines; ``visible``: CUDA_VISIBLE_DEVICES."""
    wanted = None
    if visible is not None and all(p.strip().isdigit() for p in visible.split(",") if p.strip()):
        wanted = {int(p) for p in visible.split(",") if p.strip()}
    free = total = 0
    names: list[str] = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        if wanted is not None and int(parts[0]) not in wanted:
            continue
        try:
            free += int(float(parts[2])) * MiB
            total += int(float(parts[3])) * MiB
        except ValueError:
            return None, None, ""
        names.append(parts[1])
    if not names:
        return None, None, ""
    name = names[0] if len(names) == 1 else f"{len(names)} x {names[0]}"
    return free, total, name
