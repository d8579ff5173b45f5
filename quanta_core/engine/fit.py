"""The engine's layout fitted to the model and the machine: what a user leaves unset.

A pure function: ``fit_engine(model, device, wanted) -> EngineLayout``. The web layer probes
the model file and the machine and passes what the user set; every value the user set wins,
and everything else is chosen here, with a one-line reason each (printed at start).

The KV cache is llama.cpp's, allocated whole when the context is made, ``kv_bytes_per_token``
bytes a cell. ``n_ctx_seq`` (``QUANTA_N_CTX``) is the longest request in either layout::

    kv_unified=False (the default): a stream per slot, each attends over its own cells
        slot 0 [n_ctx_seq cells] slot 1 [n_ctx_seq cells] ... slot S-1 [n_ctx_seq cells]
    kv_unified=True: one buffer of n_ctx_seq cells that every sequence attends over
        [n_ctx_seq cells, shared by slots 0 .. S-1]

Unset, a unified buffer gets the cells the streams would have had (slots x context).

The rules, in order (each is what the measurements behind it found):

1. Where the layers go. A CUDA build offloads every layer when the weights, the compute
   buffers, a margin and ``GPU_MIN_SLOTS`` slots of ``CTX_FLOOR`` cells fit the free VRAM;
   otherwise as many layers as fit next to that KV (a small GPU). A build without a GPU
   backend keeps everything on the CPU.
2. The KV budget. On a GPU: the free VRAM left after the weights, compute buffers and margin
   (as vLLM's ``gpu_memory_utilization`` takes the card). On a CPU: ``CPU_RAM_FRACTION`` of
   the RAM, so a server beside other work does not take it all. ``QUANTA_KV_MEMORY_GB`` sets it.
3. The context a sequence holds (``QUANTA_N_CTX``, the longest request: prompt + output).
   The model's training context when the budget holds ``min_slots`` of them, else halved
   until it does, never below ``CTX_FLOOR`` (a 4k-token prompt and a 1k answer).
4. The slots (``QUANTA_N_SEQ_MAX``): as many of those contexts as the budget holds, up to
   ``max_slots`` (what the default policy runs at once on that device).
5. Steps: on a GPU a pass of ``GPU_N_BATCH`` tokens and flash attention on; on a CPU
   ``CPU_N_BATCH`` and a token budget of ``CPU_TOKEN_BUDGET`` (chunked prefill between
   decodes), flash attention as llama.cpp decides (``auto``).

Explicit values are checked against what the machine has (free VRAM, available RAM, or
``QUANTA_KV_MEMORY_GB`` when set) and refused with a ``FitError`` naming the variable.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

GiB = 1 << 30
MiB = 1 << 20
# The shortest default context a slot gets: a 4,000-token prompt (coding traffic runs to
# ~3.8k, the long suite's CPU bucket to 4k) and an answer of up to 1,024 tokens. Any multiple
# of 256 suits llama.cpp's streams; a power of two would be 8192, which on a CPU's default
# KV budget leaves fewer slots than twenty people at once need.
CTX_FLOOR = 5120
MIN_CTX = 256  # below this a slot holds no useful request
CPU_RAM_FRACTION = 1 / 8
# Twenty people at once (DESIGN.md) must each have a slot; beyond 32 sequences a 2-core CPU's
# step outgrows the interactive inter-token target, so more slots would only hold memory.
CPU_SLOTS = (20, 32)  # (slots the context shrinks to keep, most slots)
# 64 long prompts at once on the H200; 256 is llama.cpp's most sequences a context.
GPU_SLOTS = (64, 256)
GPU_MIN_SLOTS = 8  # fewer slots than this with every layer on the GPU: offload fewer layers
CPU_N_BATCH = 512
GPU_N_BATCH = 2048
N_UBATCH = 512
CPU_TOKEN_BUDGET = 128
# Room on the GPU beyond the weights, KV and compute buffers: each process's CUDA context and
# the allocator's slack.
GPU_MARGIN_MIN = 1 * GiB
GPU_MARGIN_FRACTION = 0.05
CPU_MARGIN = 1 * GiB  # RAM left to the server itself beside the weights and KV


class FitError(ValueError):
    """What the user set cannot fit this machine; the message names the variable."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the GGUF file says of the model's size."""

    name: str
    n_ctx_train: int
    n_layer: int
    kv_bytes_per_token: int  # K and V of every layer for one token (f16 cache)
    weight_bytes: int  # the file's size: the weights to place
    n_vocab: int
    n_embd: int


@dataclass(frozen=True, slots=True)
class Device:
    """The machine: cores, RAM, and the GPU a llama.cpp build with a GPU backend can use."""

    cpu_cores: int
    ram_bytes: int  # total
    ram_available_bytes: int
    gpu_offload: bool = False  # llama.cpp was built with a GPU backend
    vram_free_bytes: int | None = None  # None: not known (no GPU, or no nvidia-smi)
    vram_total_bytes: int | None = None
    gpu_name: str = ""


@dataclass(frozen=True, slots=True)
class Wanted:
    """The user's explicit settings; None: fit it."""

    n_ctx: int | None = None  # tokens a sequence holds (prompt + output)
    n_seq_max: int | None = None
    kv_unified: bool = False
    kv_memory_bytes: int | None = None
    n_gpu_layers: int | None = None  # -1: all
    flash_attn: str | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    token_budget: int | None = None
    threads: int | None = None


@dataclass(frozen=True, slots=True)
class EngineLayout:
    kv_unified: bool
    n_ctx_seq: int  # the longest request: a stream's cells, or the unified buffer's
    n_seq_max: int
    n_gpu_layers: int  # -1: all
    flash_attn: str
    n_batch: int
    n_ubatch: int
    token_budget: int
    threads: int
    kv_budget_bytes: int
    kv_bytes_per_token: int
    on_gpu: bool  # some layers on a GPU
    why: dict[str, str] = field(default_factory=dict)  # setting -> the reason for its value

    @property
    def n_ctx(self) -> int:
        """llama.cpp's n_ctx: the cells of every slot together."""
        return self.n_ctx_seq if self.kv_unified else self.n_ctx_seq * self.n_seq_max

    @property
    def kv_bytes(self) -> int:
        return self.n_ctx * self.kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class _Memory:
    """Where the KV goes and how much of it: the default budget and the hard ceiling."""

    budget: int
    ceiling: int
    n_gpu_layers: int
    on_gpu: bool
    slots: tuple[int, int]
    why_budget: str
    why_layers: str


def fit_engine(model: ModelShape, device: Device, wanted: Wanted) -> EngineLayout:
    if wanted.kv_memory_bytes is not None and wanted.kv_memory_bytes <= 0:
        raise FitError("QUANTA_KV_MEMORY_GB must be above 0")
    n_ubatch = wanted.n_ubatch or N_UBATCH
    mem = _memory(model, device, wanted, n_ubatch)
    why: dict[str, str] = {"kv_budget": mem.why_budget, "n_gpu_layers": mem.why_layers}
    if wanted.kv_unified:
        ctx, slots = _unified(model, wanted, mem, why)
    else:
        ctx, slots = _context_and_slots(model, wanted, mem, why)
    if ctx > model.n_ctx_train:
        why["n_ctx"] += f"; beyond the model's training context ({model.n_ctx_train})"
    n_batch = wanted.n_batch or (GPU_N_BATCH if mem.n_gpu_layers == -1 else CPU_N_BATCH)
    budget = wanted.token_budget or (n_batch if mem.on_gpu else CPU_TOKEN_BUDGET)
    flash = wanted.flash_attn or ("on" if mem.on_gpu else "auto")
    if mem.on_gpu:
        why["flash_attn"] = "on with layers on a GPU"
        why["steps"] = "whole prompts in a pass on a GPU"
    else:
        why["flash_attn"] = "llama.cpp's choice on a CPU"
        why["steps"] = "small prefill chunks: running streams decode between them"
    if wanted.flash_attn:
        why["flash_attn"] = "set"
    if wanted.n_batch or wanted.token_budget:
        why["steps"] = "set"
    why["kv_unified"] = (
        "one buffer for all (QUANTA_KV_UNIFIED=true)"
        if wanted.kv_unified
        else "a stream per sequence: each attends over its own cells"
    )
    return EngineLayout(
        kv_unified=wanted.kv_unified,
        n_ctx_seq=ctx,
        n_seq_max=slots,
        n_gpu_layers=mem.n_gpu_layers,
        flash_attn=flash,
        n_batch=n_batch,
        n_ubatch=min(n_ubatch, n_batch),
        token_budget=min(budget, n_batch),
        threads=wanted.threads or device.cpu_cores,
        kv_budget_bytes=mem.budget,
        kv_bytes_per_token=model.kv_bytes_per_token,
        on_gpu=mem.on_gpu,
        why=why,
    )


def _memory(model: ModelShape, device: Device, wanted: Wanted, n_ubatch: int) -> _Memory:
    if not device.gpu_offload or wanted.n_gpu_layers == 0:
        reason = "set (QUANTA_N_GPU_LAYERS=0)" if device.gpu_offload else "no GPU backend"
        layers = 0 if wanted.n_gpu_layers is None else wanted.n_gpu_layers
        return _cpu_memory(model, device, wanted, layers, reason)
    if device.vram_free_bytes is None:
        layers = -1 if wanted.n_gpu_layers is None else wanted.n_gpu_layers
        mem = _cpu_memory(model, device, wanted, layers, "free VRAM unknown: all layers")
        if wanted.kv_memory_bytes is None:
            why = mem.why_budget + "; free VRAM unknown (no nvidia-smi): set QUANTA_KV_MEMORY_GB"
            return replace(mem, on_gpu=True, why_budget=why)
        return replace(mem, on_gpu=True)
    free = device.vram_free_bytes
    compute = n_ubatch * (model.n_vocab + 4 * model.n_embd) * 4
    room = free - compute - max(GPU_MARGIN_MIN, int(free * GPU_MARGIN_FRACTION))
    after_weights = room - model.weight_bytes
    floor_kv = GPU_MIN_SLOTS * min(model.n_ctx_train, CTX_FLOOR) * model.kv_bytes_per_token
    all_layers = wanted.n_gpu_layers == -1 or (
        wanted.n_gpu_layers is not None and wanted.n_gpu_layers >= model.n_layer
    )
    vram = f"{_gib(free)} free VRAM - {_gib(model.weight_bytes)} weights - compute and margin"
    if all_layers or (wanted.n_gpu_layers is None and after_weights >= floor_kv):
        if after_weights <= 0:
            raise FitError(
                f"the weights ({_gib(model.weight_bytes)}) do not fit the GPU's "
                f"{_gib(free)} free: lower QUANTA_N_GPU_LAYERS"
            )
        budget = wanted.kv_memory_bytes or after_weights
        if budget > after_weights:
            raise FitError(
                f"QUANTA_KV_MEMORY_GB ({_gib(budget)}) is more than the GPU holds beside the "
                f"weights ({_gib(after_weights)})"
            )
        why = "set (QUANTA_KV_MEMORY_GB)" if wanted.kv_memory_bytes else vram
        reason = "set" if wanted.n_gpu_layers is not None else "all fit"
        return _Memory(budget, budget, -1, True, GPU_SLOTS, why, reason)
    # A small GPU: the KV sized as on a CPU, and as many layers (each with its share of that
    # KV) as fit the VRAM.
    cpu = _cpu_memory(model, device, wanted, 0, "")
    per_layer = (model.weight_bytes / (model.n_layer + 1)) + cpu.budget / model.n_layer
    if wanted.n_gpu_layers is not None:
        layers = wanted.n_gpu_layers
        if layers * per_layer > room:
            raise FitError(
                f"QUANTA_N_GPU_LAYERS={layers} needs ~{_gib(layers * per_layer)} of VRAM; "
                f"{_gib(room)} is free beside compute buffers: at most "
                f"{max(0, int(room // per_layer))}"
            )
        reason = "set (QUANTA_N_GPU_LAYERS)"
    else:
        layers = max(0, min(model.n_layer - 1, int(room // per_layer)))
        reason = f"{layers} of {model.n_layer} fit {_gib(free)} free VRAM beside their KV"
    return replace(cpu, n_gpu_layers=layers, on_gpu=layers != 0, why_layers=reason)


def _cpu_memory(
    model: ModelShape, device: Device, wanted: Wanted, layers: int, why_layers: str
) -> _Memory:
    ceiling = device.ram_available_bytes - model.weight_bytes - CPU_MARGIN
    if wanted.kv_memory_bytes is not None:
        if wanted.kv_memory_bytes > ceiling:
            raise FitError(
                f"QUANTA_KV_MEMORY_GB ({_gib(wanted.kv_memory_bytes)}) is more than the "
                f"available RAM holds beside the weights ({_gib(ceiling)})"
            )
        budget = wanted.kv_memory_bytes
        return _Memory(
            budget, budget, layers, False, CPU_SLOTS, "set (QUANTA_KV_MEMORY_GB)", why_layers
        )
    budget = min(int(device.ram_bytes * CPU_RAM_FRACTION), max(ceiling, 0))
    why = f"1/{round(1 / CPU_RAM_FRACTION)} of {_gib(device.ram_bytes)} RAM"
    return _Memory(budget, max(ceiling, 0), layers, False, CPU_SLOTS, why, why_layers)


def _context_and_slots(
    model: ModelShape, wanted: Wanted, mem: _Memory, why: dict[str, str]
) -> tuple[int, int]:
    per_token = model.kv_bytes_per_token
    least, most = mem.slots
    train = model.n_ctx_train
    if wanted.n_ctx is not None and wanted.n_seq_max is not None:
        ctx, slots = wanted.n_ctx, wanted.n_seq_max
        _check(ctx * slots * per_token, mem, f"QUANTA_N_CTX={ctx} x QUANTA_N_SEQ_MAX={slots}")
        why["n_ctx"] = why["n_seq_max"] = "set"
    elif wanted.n_ctx is not None:
        ctx = wanted.n_ctx
        slots = max(1, min(most, mem.budget // (ctx * per_token)))
        _check(ctx * slots * per_token, mem, f"QUANTA_N_CTX={ctx}")
        why["n_ctx"] = "set"
        why["n_seq_max"] = f"as many as the budget holds, up to {most}"
    elif wanted.n_seq_max is not None:
        slots = wanted.n_seq_max
        ctx = _power_of_two_at_most(min(train, mem.budget // (slots * per_token)))
        if ctx < MIN_CTX:
            raise FitError(
                f"QUANTA_N_SEQ_MAX={slots} leaves each slot {ctx} tokens of a "
                f"{_gib(mem.budget)} KV budget: lower it, or raise QUANTA_KV_MEMORY_GB"
            )
        why["n_ctx"] = (
            "the model's training context"
            if ctx >= train
            else f"what {slots} slots hold of the budget"
        )
        why["n_seq_max"] = "set"
    else:
        floor = min(train, CTX_FLOOR)
        ctx = train
        while ctx > floor and least * ctx * per_token > mem.budget:
            ctx = max(floor, _power_of_two_at_most(ctx - 1))
        slots = min(most, mem.budget // (ctx * per_token))
        if slots < 1:
            raise FitError(
                f"one {ctx}-token sequence needs {_gib(ctx * per_token)} of KV and the budget "
                f"is {_gib(mem.budget)}: set QUANTA_KV_MEMORY_GB or a smaller QUANTA_N_CTX"
            )
        if slots >= 16:
            slots -= slots % 8
        why["n_ctx"] = (
            "the model's training context"
            if ctx == train
            else f"the training context ({train}) in {least} slots exceeds the budget"
        )
        why["n_seq_max"] = (
            f"the most on this device ({most})" if slots == most else "as many as the budget holds"
        )
    return ctx, slots


def _unified(
    model: ModelShape, wanted: Wanted, mem: _Memory, why: dict[str, str]
) -> tuple[int, int]:
    """One buffer: QUANTA_N_CTX cells (a request may fill it), any number of slots."""
    slots = wanted.n_seq_max or mem.slots[1]
    if wanted.n_ctx is not None:
        _check(wanted.n_ctx * model.kv_bytes_per_token, mem, f"QUANTA_N_CTX={wanted.n_ctx}")
        why["n_ctx"] = "set: the one buffer's cells"
        why["n_seq_max"] = "set" if wanted.n_seq_max else f"the most on this device ({slots})"
        return wanted.n_ctx, slots
    per_stream = _context_and_slots(model, replace(wanted, n_seq_max=None), mem, {})
    cells = per_stream[0] * per_stream[1]
    why["n_ctx"] = f"the cells {per_stream[1]} streams of {per_stream[0]} would take"
    why["n_seq_max"] = "set" if wanted.n_seq_max else f"the most on this device ({slots})"
    return cells, slots


def _check(kv_bytes: int, mem: _Memory, what: str) -> None:
    if kv_bytes > mem.ceiling:
        raise FitError(
            f"{what} needs {_gib(kv_bytes)} of KV cache; this machine holds {_gib(mem.ceiling)} "
            "(QUANTA_KV_MEMORY_GB, or the memory free beside the weights): lower it"
        )


def _power_of_two_at_most(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 0


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


def describe(layout: EngineLayout, model: ModelShape, device: Device) -> str:
    """The layout and why, one block for the server's start."""
    w = layout.why
    gpu = (
        f", GPU {device.gpu_name or '?'} ({_gib(device.vram_free_bytes)} free)"
        if device.vram_free_bytes is not None
        else ", GPU backend (free VRAM unknown)"
        if device.gpu_offload
        else ""
    )
    layers = "all" if layout.n_gpu_layers == -1 else str(layout.n_gpu_layers)
    if layout.kv_unified:
        cells = f"one buffer of {layout.n_ctx} cells"
    else:
        cells = f"a stream per sequence, {layout.n_seq_max} x {layout.n_ctx_seq} = {layout.n_ctx}"
        cells += " cells"
    lines = [
        "engine layout (QUANTA_* settings unset are fitted; `set` marks the user's):",
        f"  model      {model.name}: {model.n_layer} layers, trained on {model.n_ctx_train} "
        f"tokens, KV {model.kv_bytes_per_token / 1024:.1f} KiB a token, "
        f"weights {_gib(model.weight_bytes)}",
        f"  machine    {device.cpu_cores} cores, {_gib(device.ram_bytes)} RAM{gpu}",
        f"  KV budget  {_gib(layout.kv_budget_bytes)}: {w['kv_budget']}",
        f"  n_ctx      {layout.n_ctx_seq} tokens a request (QUANTA_N_CTX): {w['n_ctx']}",
        f"  n_seq_max  {layout.n_seq_max} slots (QUANTA_N_SEQ_MAX): {w['n_seq_max']}",
        f"  KV cache   {cells}, {_gib(layout.kv_bytes)} "
        f"(QUANTA_KV_UNIFIED={str(layout.kv_unified).lower()})",
        f"  GPU layers {layers} (QUANTA_N_GPU_LAYERS): {w['n_gpu_layers']}",
        f"  attention  flash {layout.flash_attn} (QUANTA_FLASH_ATTN): {w['flash_attn']}",
        f"  steps      n_batch {layout.n_batch}, n_ubatch {layout.n_ubatch}, token budget "
        f"{layout.token_budget}, {layout.threads} threads: {w['steps']}",
    ]
    return "\n".join(lines)
