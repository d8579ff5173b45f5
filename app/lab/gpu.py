"""GPU benchmarks, run on the device by scripts/gpu_run.sh (they also run on a CPU build).

    quanta bench gpu serve --model M --out DIR    raw llama_decode vs Quanta served, 1..256
                                                  streams
    quanta bench gpu llama --model M --out DIR --llama-server BIN    Quanta vs llama-server
    quanta bench gpu long --model M --out DIR --llama-server BIN     real prompt lengths:
                                                  Quanta's defaults vs llama-server -np N
    quanta bench gpu replay --model M --out DIR --llama-server BIN   the conversation trace at
                                                  its recorded lengths: goodput vs llama-server
    quanta bench gpu calibrate --model M --out DIR   a cost model of this machine, and the
                                                  simulator's predictions of two served runs

Raw: llama_decode of B sequences in this process (the model's layers on the GPU), then the
greedy token of every sequence (numpy argmax over its logits): what any server must do per
step. Engine: Quanta's worker (its ``Engine``) in this process, stepped with the plans the
scheduler sends. Served: `quanta run` with the GPU settings below and its step trace on,
`quanta bench run` sending B streaming requests at once; the decode rate is read in the window
where all B streams are decoding (from the last first token to the first last token), so
neither counts prefill, and the trace tells each size's worker step, process boundary and
server gap. Server CPU: the server process's user + system time over the run, per streamed
token (its engine worker is a separate process, counted apart; the client is measured apart).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.lab.server import stop_process, wait_ready

if TYPE_CHECKING:
    from quanta_core.sim.server_cost import ServerCost

PROMPT = 32
TOKENS = 256
STREAMS = (1, 16, 64, 128, 256)
PORT = 8091
# Quanta on a GPU: every layer offloaded, flash attention, up to 256 sequences decoding in one
# step (so a step's token budget above that), a context for 256 x (prompt + answer).
GPU_ENV = {
    "QUANTA_N_GPU_LAYERS": "-1",
    "QUANTA_FLASH_ATTN": "on",
    "QUANTA_N_SEQ_MAX": "256",
    "QUANTA_MAX_RUNNING": "256",
    "QUANTA_N_CTX": str(256 * (PROMPT + TOKENS) + 4096),
    "QUANTA_N_BATCH": "2048",
    "QUANTA_N_UBATCH": "512",
}


def log(*args: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *args, file=sys.stderr, flush=True)


# ---- raw engine ----


def raw_decode(
    model: str, streams: tuple[int, ...], steps: int, gpu_layers: int
) -> list[dict[str, Any]]:
    import llama_cpp
    import numpy as np

    from quanta_core.engine.llama_cpp.logs import quiet_llama_logs

    quiet_llama_logs()
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = gpu_layers
    m = llama_cpp.llama_model_load_from_file(model.encode(), mp)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = int(GPU_ENV["QUANTA_N_CTX"])
    cp.n_batch, cp.n_ubatch = 2048, 512
    cp.n_seq_max = max(streams)
    cp.kv_unified = True
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    cp.n_threads = cp.n_threads_batch = os.cpu_count() or 1
    cp.no_perf = True
    ctx = llama_cpp.llama_init_from_model(m, cp)
    mem = llama_cpp.llama_get_memory(ctx)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(m))
    cap = max(max(streams), 2048)
    batch = llama_cpp.llama_batch_init(cap, 0, 1)
    rng = np.random.default_rng(0)

    def decode(tokens: np.ndarray, pos: np.ndarray, seqs: np.ndarray, logits: bool) -> None:
        n = len(tokens)
        for i in range(n):
            batch.token[i] = int(tokens[i])
            batch.pos[i] = int(pos[i])
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = int(seqs[i])
            batch.logits[i] = logits
        batch.n_tokens = n
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    rows = []
    for b in streams:
        llama_cpp.llama_memory_clear(mem, True)
        prompt = rng.integers(300, n_vocab, size=b * PROMPT)
        seqs = np.repeat(np.arange(b), PROMPT)
        pos = np.tile(np.arange(PROMPT), b)
        for start in range(0, len(prompt), 2048):
            end = start + 2048
            decode(prompt[start:end], pos[start:end], seqs[start:end], False)
        tokens = rng.integers(300, n_vocab, size=b)
        times = []
        for step in range(steps):
            t0 = time.perf_counter()
            decode(tokens, np.full(b, PROMPT + step), np.arange(b), True)
            ptr = llama_cpp.llama_get_logits(ctx)
            logits = np.ctypeslib.as_array(ptr, shape=(b, n_vocab))
            tokens = logits.argmax(axis=1)
            times.append(time.perf_counter() - t0)
        rows.append({"streams": b, **step_stats(times, b)})
        mean = rows[-1]["step_ms_mean"] / 1e3
        log(f"raw {b:4d} streams: {mean * 1e3:7.2f} ms a step, {b / mean:8.1f} tokens/s")
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(m)
    return rows


def step_stats(times: list[float], b: int) -> dict[str, Any]:
    """Mean and median step time (the first two steps left out: warm-up), the mean of the
    first and last tenth (contexts grow over the run), and tokens/s."""
    body = times[2:]
    mean = sum(body) / len(body)
    tenth = max(1, len(body) // 10)
    return {
        "steps": len(body),
        "step_ms_mean": mean * 1e3,
        "step_ms_p50": sorted(body)[len(body) // 2] * 1e3,
        "step_ms_first_tenth": sum(body[:tenth]) / tenth * 1e3,
        "step_ms_last_tenth": sum(body[-tenth:]) / tenth * 1e3,
        "tokens_per_s": b / mean,
    }


def engine_decode(model: str, streams: tuple[int, ...], steps: int) -> list[dict[str, Any]]:
    """Quanta's engine worker in this process (its ``Engine``, the plans the scheduler sends:
    greedy, ignore_eos), no server: what the worker's own step costs over raw's."""
    from quanta_core.engine.config import EngineConfig
    from quanta_core.engine.llama_cpp.logs import quiet_llama_logs
    from quanta_core.engine.llama_cpp.wire import StepCall
    from quanta_core.engine.llama_cpp.worker import Engine
    from quanta_core.engine.types import SamplingParams, SeqSlice, StepPlan, Truncate

    quiet_llama_logs()
    env = GPU_ENV
    engine = Engine(
        EngineConfig(
            model_path=model,
            n_ctx=int(env["QUANTA_N_CTX"]),
            n_seq_max=int(env["QUANTA_N_SEQ_MAX"]),
            n_batch=int(env["QUANTA_N_BATCH"]),
            n_ubatch=int(env["QUANTA_N_UBATCH"]),
            threads=os.cpu_count() or 1,
            n_gpu_layers=int(env["QUANTA_N_GPU_LAYERS"]),
            flash_attn=env["QUANTA_FLASH_ATTN"],
        )
    )
    sampling = SamplingParams(temperature=0.0, ignore_eos=True)
    rows = []
    for b in streams:
        owners = [f"b{b}-{k}" for k in range(b)]
        tokens = [300 + (7 * k) % 1000 for k in range(b)]
        per_step = max(1, engine.n_batch // PROMPT)
        for first in range(0, b, per_step):  # the prompts, a batch's worth a step
            ks = range(first, min(b, first + per_step))
            plan = StepPlan(slices=tuple(
                SeqSlice(k, tuple(300 + (k * 31 + j) % 5000 for j in range(PROMPT)), 0, True,
                         owners[k], sampling) for k in ks))  # fmt: skip
            for out in engine.step(StepCall(plan)).result.outputs:
                tokens[out.seq] = out.token
        times, decode, sample = [], [], []
        for step in range(steps):
            plan = StepPlan(slices=tuple(
                SeqSlice(k, (tokens[k],), PROMPT + step, True, owners[k], sampling)
                for k in range(b)))  # fmt: skip
            t0 = time.perf_counter()
            reply = engine.step(StepCall(plan))
            times.append(time.perf_counter() - t0)
            decode.append(reply.result.timings.decode_s)
            sample.append(reply.result.timings.sample_s)
            for out in reply.result.outputs:
                tokens[out.seq] = out.token
        free = StepPlan(kv_ops=tuple(Truncate(k) for k in range(b)), release=tuple(owners))
        engine.step(StepCall(free))
        row = {"streams": b, **step_stats(times, b)}
        row["decode_ms_p50"] = sorted(decode[2:])[len(decode[2:]) // 2] * 1e3
        row["sample_ms_p50"] = sorted(sample[2:])[len(sample[2:]) // 2] * 1e3
        rows.append(row)
        log(f"engine {b:4d} streams: {row['step_ms_mean']:7.2f} ms a step "
            f"(decode {row['decode_ms_p50']:.2f}, sample {row['sample_ms_p50']:.2f}), "
            f"{row['tokens_per_s']:8.1f} tokens/s")  # fmt: skip
    llama_cpp_free(engine)
    return rows


def llama_cpp_free(engine: Any) -> None:
    import llama_cpp

    llama_cpp.llama_free(engine.ctx)
    llama_cpp.llama_model_free(engine.model)


# ---- served ----


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid``'s child processes (Quanta's engine worker)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                total += cpu_s(int(child))
    return total


class Server:
    """A throw-away `quanta run` (or llama-server) on ``port``, with its own database."""

    def __init__(self, argv: list[str], env: dict[str, str], health: str, port: int = PORT) -> None:
        self.state = tempfile.mkdtemp(prefix="quanta-gpu-")
        self.env = {**os.environ, **env}
        self.argv, self.health, self.port = argv, health, port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, env=self.env)
        wait_ready(self.proc, f"http://127.0.0.1:{self.port}{self.health}", timeout_s=600)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


def quanta_server(
    model: str,
    extra: dict[str, str] | None = None,
    port: int = PORT,
    code: str | None = None,
    settings: dict[str, str] | None = None,
) -> tuple[Server, str]:
    """`quanta run` on ``port``; ``code``: a PYTHONPATH that puts another tree of Quanta's
    source first (the code before a change), for the server and its set-up commands;
    ``settings``: the engine's (default: GPU_ENV; ``{}``: Quanta's own defaults)."""
    state = tempfile.mkdtemp(prefix="quanta-db-")
    env = {
        "QUANTA_DATABASE_URL": f"sqlite+aiosqlite:///{state}/quanta.db",
        "QUANTA_DATA_DIR": f"{state}/data",
        "QUANTA_CONFIG": "",
        "QUANTA_MODEL_PATH": model,
        "QUANTA_PORT": str(port),
        "QUANTA_LOG_LEVEL": "warning",
        **(GPU_ENV if settings is None else settings),
        **(extra or {}),
        **({"PYTHONPATH": code} if code else {}),
    }
    full = {**os.environ, **env}
    subprocess.run(["quanta", "migrate"], env=full, check=True, capture_output=True)
    out = subprocess.run(
        ["quanta", "tenants", "create", "bench"], env=full, check=True, capture_output=True
    ).stdout.decode()
    key = next(ln.split(": ", 1)[1] for ln in out.splitlines() if ln.startswith("api key"))
    return Server(["quanta", "run"], env, "/readyz", port), key


def workload(
    path: Path, b: int, tokens: int, prompt: int = PROMPT, seed: int | None = None
) -> Path:
    seed = b if seed is None else seed
    path.write_text(
        f'name = "gpu-{b}-at-once"\nseed = {seed}\nrequests = {b}\nrate = inf\n'
        f'endpoint = "completions"\nignore_eos = true\n\n'
        f'[[tenants]]\nname = "people"\nclass = "interactive"\nprompt = {prompt}\n'
        f"output = {tokens}\n"
    )
    return path


def client(args: list[str], log_to: Path) -> float:
    """Run `quanta bench run ARGS` (its tables into ``log_to``); its CPU seconds."""
    with log_to.open("a") as f:
        proc = subprocess.Popen(
            ["quanta", "bench", "run", "--quiet", "--no-plots", *args], stdout=f, stderr=f
        )
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"quanta bench run failed ({status})")
    return usage.ru_utime + usage.ru_stime


def decode_window(results: Path) -> dict[str, float]:
    """Tokens/s while every stream decodes: from the last first token to the first last one."""
    rows = [r for r in json.loads(results.read_text())["requests"] if r["ok"]]
    start = max(r["token_times"][0] for r in rows)
    end = min(r["token_times"][-1] for r in rows)
    inside = sum(1 for r in rows for t in r["token_times"] if start < t <= end)
    summary = json.loads(results.read_text())["summary"]["overall"]
    return {
        "decode_tokens_per_s": inside / (end - start) if end > start else float("nan"),
        "window_s": end - start,
        "output_tokens": summary["output_tokens"],
        "output_tokens_per_s": summary["output_tokens_per_s"],
        "ttft_p99_ms": summary["ttft"]["p99_ms"],
        "itl_p50_ms": summary["itl"]["p50_ms"],
        "itl_p99_ms": summary["itl"]["p99_ms"],
        # A stream the server refused is not in the window: fewer completed than sent means
        # the window measured fewer streams than the row's size.
        "completed": summary["completed"],
        "rejected": summary["rejected"],
    }


def served(
    model: str,
    streams: tuple[int, ...],
    tokens: int,
    out: Path,
    extra: dict[str, str],
    codes: dict[str, str | None],
) -> dict[str, list[dict[str, Any]]]:
    """One server per entry of ``codes`` (a name: the PYTHONPATH of its code, None for this
    tree's), all up at once on their own ports, their steps traced; at each size they serve
    in turns (the first of each pair alternates), so both see the machine as it is then.
    Each size's row gets the medians of its full decode steps (every stream, one token each)
    from its server's trace."""
    servers: dict[str, tuple[Server, str, Path]] = {}
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in codes}
    spans: dict[str, list[tuple[float, float]]] = {name: [] for name in codes}
    try:
        for i, (name, code) in enumerate(codes.items()):
            trace = Path(tempfile.mkdtemp(prefix="quanta-trace-")) / "steps.jsonl"
            server, key = quanta_server(model, {**extra, "QUANTA_STEP_TRACE": str(trace)},
                                        PORT + 1 + i, code)  # fmt: skip
            server.start()
            servers[name] = (server, key, trace)
        for j, b in enumerate(streams):
            names = list(codes) if j % 2 == 0 else list(reversed(codes))
            for name in names:
                server, key, _ = servers[name]
                row, span = served_size(server, key, b, tokens, out)
                rows[name].append(row)
                spans[name].append(span)
                log(
                    f"{name} {b:4d} streams: {row['decode_tokens_per_s']:8.1f} tokens/s "
                    f"decoding, server {row['server_cpu_us_per_token']:.0f} us CPU/token, "
                    f"client {row['client_cpu_us_per_token']:.0f}, "
                    f"engine worker {row['worker_cpu_us_per_token']:.0f}"
                )
    finally:
        for server, _, _ in servers.values():
            server.stop()
    for name, (_, _, trace) in servers.items():
        steps = [json.loads(line) for line in trace.open()]
        for row, (lo, hi) in zip(rows[name], spans[name], strict=True):
            at = [r for r in steps if lo <= r["start"] <= hi]
            row["steps"] = trace_summary(at, row["streams"])
            log(f"  {name}, steps of {row['streams']}: {row['steps']}")
        trace.unlink()
    return rows


def served_size(
    server: Server, key: str, b: int, tokens: int, out: Path
) -> tuple[dict[str, Any], tuple[float, float]]:
    """B streams at once against ``server``: its row, and the span of the run (monotonic)."""
    assert server.proc is not None
    wl = workload(out / f"wl-{b}.toml", b, tokens)
    res = Path(server.state) / f"served-{b}.json"
    cpu0, t0 = cpu_s(server.proc.pid), time.perf_counter()
    worker0, mono0 = children_cpu_s(server.proc.pid), time.monotonic()
    client_cpu = client(["--url", f"http://127.0.0.1:{server.port}", "--api-key", key,
                         "--workload", str(wl), "--out", str(res)],
                        Path(server.state) / "client.log")  # fmt: skip
    wall, cpu = time.perf_counter() - t0, cpu_s(server.proc.pid) - cpu0
    worker = children_cpu_s(server.proc.pid) - worker0
    span = (mono0, time.monotonic())
    row: dict[str, Any] = {"streams": b, **decode_window(res), "wall_s": wall,
                           "server_cpu_s": cpu}  # fmt: skip
    row["worker_cpu_us_per_token"] = worker / row["output_tokens"] * 1e6
    row["server_cpu_us_per_token"] = cpu / row["output_tokens"] * 1e6
    row["client_cpu_us_per_token"] = client_cpu / row["output_tokens"] * 1e6
    wl.unlink()
    return row, span


def trace_summary(steps: list[dict[str, Any]], b: int) -> dict[str, Any]:
    """Where a served decode step's time goes, medians over the steps that decode all ``b``
    streams one token each: the worker's llama_decode and sampling, its whole step
    (``engine``), the step call as the server sees it (``total``: the process boundary and
    the wait for the event loop to read the reply), and the server between steps (``gap``).
    ``period`` = total + gap: one token of every stream."""

    def full(r: dict[str, Any]) -> bool:
        slices = r["plan"]["slices"] if r.get("plan") else []
        return len(slices) == b and all(len(x["tokens"]) == 1 for x in slices)

    decode = [r for r in steps if full(r)]

    def median_ms(key: str) -> float | None:
        values = sorted(r[key] for r in decode if r.get(key) is not None)
        return values[len(values) // 2] * 1e3 if values else None

    row: dict[str, Any] = {"all": len(steps), "full_decode": len(decode)}
    for key in ("decode", "sample", "engine", "total", "gap"):
        row[f"{key}_ms"] = median_ms(key)
    periods = sorted(r["total"] + r["gap"] for r in decode if r.get("gap") is not None)
    row["period_ms"] = periods[len(periods) // 2] * 1e3 if periods else None
    return row


def cmd_serve(args: argparse.Namespace) -> dict[str, Any]:
    streams = tuple(args.streams)
    partial = args.out / f"serve{'-' + args.tag if args.tag else ''}.partial.json"
    done: dict[str, Any] = {}

    def keep(name: str, value: Any) -> Any:  # what is done survives a later failure
        done[name] = value
        partial.write_text(json.dumps(done, indent=1))
        return value

    # Raw decodes as many steps as a served answer has tokens: every step of either attends
    # over the same cells (in one unified KV buffer, the cells of every sequence).
    steps = args.steps or args.tokens
    parts = set(args.parts)
    if "raw" in parts:
        keep("raw", raw_decode(args.model, streams, steps, args.gpu_layers))
    if "engine" in parts:
        keep("engine", engine_decode(args.model, streams, steps))
    # Quanta's default on a GPU overlaps the streams' writes with the next step; the same
    # run with the overlap off is the server as it was.
    # Quanta's default policy unless --serve-policy says otherwise; a refused stream is not
    # served at that size, so each row records how many completed.
    policy = {"QUANTA_POLICY": args.serve_policy}
    if "served" in parts:
        # With BENCH_BEFORE (a PYTHONPATH: gpu_run.sh sets it from the carried tree of the
        # code before a change), that code serves too, in turns with this tree's.
        before = os.environ.get("BENCH_BEFORE")
        codes: dict[str, str | None] = {"served": None}
        if before:
            codes = {"served_before": before, "served": None}
        for name, rows in served(args.model, streams, args.tokens, args.out, policy,
                                 codes).items():  # fmt: skip
            keep(name, rows)
    if "plain" in parts:  # the smallest, a middle and the largest size: device time is short
        sizes = tuple(sorted({streams[0], streams[len(streams) // 2], streams[-1]}))
        plain = {**policy, "QUANTA_OVERLAP_STEPS": "false"}
        by_code = served(args.model, sizes, args.tokens, args.out, plain, {"plain": None})
        keep("served_no_overlap", by_code["plain"])
    done["settings_from_environment"] = {
        k: v for k, v in os.environ.items() if k.startswith("QUANTA_")
    }
    done["table"] = serve_table(done)
    partial.unlink()
    return done


def serve_table(done: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per size: tokens/s of each part that ran, served / raw, server CPU/token."""
    names = {"raw": "tokens_per_s", "engine": "tokens_per_s", "served": "decode_tokens_per_s",
             "served_before": "decode_tokens_per_s",
             "served_no_overlap": "decode_tokens_per_s"}  # fmt: skip
    parts = [p for p in names if p in done]
    table = []
    for b in sorted({r["streams"] for p in parts for r in done[p]}):
        row: dict[str, Any] = {"streams": b}
        for part in parts:
            r = next((r for r in done[part] if r["streams"] == b), None)
            if r is None:
                continue
            row[part] = r[names[part]]
            if "server_cpu_us_per_token" in r:
                row[f"{part}_server_cpu_us_per_token"] = r["server_cpu_us_per_token"]
                row[f"{part}_completed"] = r["completed"]
        for part in ("served", "served_before", "served_no_overlap"):
            if part in row and "raw" in row:
                row[f"{part}_over_raw"] = row[part] / row["raw"]
        table.append(row)
    keys = list(dict.fromkeys(k for row in table for k in row if k != "streams"))
    print("streams " + " ".join(f"{k[:14]:>14}" for k in keys))
    for row in table:
        cells = (f"{row[k]:14.2f}" if k in row else f"{'-':>14}" for k in keys)
        print(f"{row['streams']:7d} " + " ".join(cells))
    return table


# ---- llama-server vs Quanta ----


SMALL = False  # --small: the same runs, a tenth of the work (a pipeline check on a CPU)


def crowd_workload(path: Path) -> Path:
    """Twenty-at-once scaled to the GPU: 200 people at once, 256 tokens each."""
    return workload(path, 20, 16) if SMALL else workload(path, 200, 256)


def flood_workload(path: Path, chat_key: str, etl_key: str) -> Path:
    """Interactive vs batch: 512 batch requests at once (2x the 256 running), while the
    interactive tenant asks 4 times a second for 20 s."""
    chat_n, chat_out, etl_n, etl_out = (8, 8, 32, 16) if SMALL else (80, 32, 512, 256)
    chat_prompt = '{ dist = "uniform", min = 32, max = 128 }'
    etl_prompt = '{ dist = "uniform", min = 64, max = 256 }'
    path.write_text(
        f"""name = "gpu-interactive-vs-batch-flood"
seed = 3
endpoint = "completions"
ignore_eos = true
window_s = 5.0

[slo.interactive]
ttft_s = 2.0
tpot_s = 0.25
[slo.batch]
deadline_s = 120

[[tenants]]
name = "chat"
api_key = "{chat_key}"
class = "interactive"
rate = 4.0
requests = {chat_n}
prompt = {chat_prompt}
output = {chat_out}

[[tenants]]
name = "etl"
api_key = "{etl_key}"
class = "batch"
rate = "inf"
requests = {etl_n}
prompt = {etl_prompt}
output = {etl_out}
"""
    )
    return path


def summary_of(results: Path) -> dict[str, Any]:
    data = json.loads(results.read_text())["summary"]
    keep = ("requests", "completed", "failed", "rejected", "output_tokens", "output_tokens_per_s",
            "ttft", "itl", "tpot", "e2e", "goodput_fraction")  # fmt: skip
    out: dict[str, Any] = {"overall": {k: data["overall"].get(k) for k in keep}}
    for name, group in data.get("classes", {}).items():
        out[name] = {k: group.get(k) for k in keep}
    out["duration_s"] = data.get("duration_s")
    return out


def measure(server: Server, label: str, args: list[str], log_to: Path) -> dict[str, Any]:
    """One client run against ``server``; its summary and both sides' CPU seconds."""
    assert server.proc is not None
    cpu0 = cpu_s(server.proc.pid)
    client_cpu = client(args, log_to)
    res = Path(args[args.index("--out") + 1])
    row = summary_of(res)
    row["server_cpu_s"] = cpu_s(server.proc.pid) - cpu0
    row["client_cpu_s"] = client_cpu
    o = row["overall"]
    log(f"{label}: {o['output_tokens_per_s']:.0f} tokens/s, TTFT p99 {o['ttft']['p99_ms']:.0f} ms")
    PARTIAL[label] = row
    if PARTIAL_FILE is not None:  # what is done survives a later failure
        PARTIAL_FILE.write_text(json.dumps(PARTIAL, indent=1))
    return row


def records_dir(out: Path) -> Path:
    """Where the benches keep what a summary drops (each request's record, the server's
    step trace, the calibration's samples): in results.tgz, for reading and refitting."""
    path = out / "records"
    path.mkdir(parents=True, exist_ok=True)
    return path


PARTIAL: dict[str, Any] = {}
PARTIAL_FILE: Path | None = None


def llama_server(binary: str, model: str) -> Server:
    argv = [binary, "-m", model, "-c", GPU_ENV["QUANTA_N_CTX"], "-np", "256", "--kv-unified",
            "-ngl", "999", "-fa", "on", "-b", "2048", "-ub", "512", "--host", "127.0.0.1",
            "--port", str(PORT), "--no-webui", "--log-disable"]  # fmt: skip
    return Server(argv, {}, "/health")


def cmd_llama(args: argparse.Namespace) -> dict[str, Any]:
    global PARTIAL_FILE
    PARTIAL_FILE = args.out / "llama.partial.json"
    out: dict[str, Any] = {}
    crowd = crowd_workload(args.out / "crowd.toml")
    state = records_dir(args.out)  # every request's record, for reading (and simulating) later
    log_to = state / "client.log"
    url = f"http://127.0.0.1:{PORT}"
    for policy in () if args.llama_server_only else ("quanta",):  # Quanta's default
        trace = str(state / f"steps-quanta-{policy}.jsonl")
        server, key = quanta_server(
            args.model, {"QUANTA_POLICY": policy, "QUANTA_STEP_TRACE": trace}
        )
        env = {**os.environ, **server.env}
        etl = subprocess.run(
            ["quanta", "tenants", "create", "etl", "--slo-class", "batch"],
            env=env, check=True, capture_output=True,
        ).stdout.decode()  # fmt: skip
        etl_key = next(ln.split(": ", 1)[1] for ln in etl.splitlines() if ln.startswith("api"))
        flood_workload(args.out / "flood.toml", key, etl_key)
        flood = args.out / "flood.toml"
        server.start()
        try:
            for name, wl in (("crowd", crowd), ("flood", flood)):
                res = state / f"{name}-quanta-{policy}.json"
                common = ["--url", url, "--api-key", key, "--workload", str(wl), "--out", str(res)]
                out[f"{name}-quanta-{policy}"] = measure(server, f"{name} quanta {policy}",
                                                         common, log_to)  # fmt: skip
        finally:
            server.stop()
    if args.llama_server_only:  # llama-server takes any key: the workload's are placeholders
        flood_workload(args.out / "flood.toml", "none", "none")
    server = llama_server(args.llama_server, args.model)
    server.start()
    try:
        for name, wl in (("crowd", crowd), ("flood", args.out / "flood.toml")):
            res = state / f"{name}-llama-server.json"
            common = ["--url", url, "--api-key", "none", "--workload", str(wl), "--out", str(res)]
            out[f"{name}-llama-server"] = measure(server, f"{name} llama-server", common, log_to)
    finally:
        server.stop()
    (args.out / "flood.toml").unlink()
    PARTIAL_FILE.unlink()
    return {"runs": out}


# ---- long prompts ----

# (prompt tokens, answer tokens, requests at once): the 64 x 2,000 first, then the
# bucket sweep. Sent with a batch key at T = 0.7 (the shape): throughput points.
LONG_POINTS = (
    (2000, 256, 64), (2000, 256, 16), (128, 256, 64), (8000, 128, 16), (16000, 128, 8),
)  # fmt: skip
# The synthetic 8B's trained context (what llama-server refuses past, whatever its -c): a
# longer point raises it in llama-server's model (--override-kv), as Quanta's QUANTA_N_CTX does.
TRAINED_CONTEXT = 8192
LONG_POINTS_SMALL = ((256, 16, 4), (512, 16, 2))


def long_workload(path: Path, n: int, prompt: int, output: int, key: str) -> Path:
    path.write_text(
        f'name = "gpu-long-{n}x{prompt}"\nseed = {prompt + n}\nrequests = {n}\nrate = inf\n'
        f'endpoint = "completions"\nignore_eos = true\ntemperature = 0.7\n\n'
        f'[[tenants]]\nname = "long"\napi_key = "{key}"\nclass = "batch"\n'
        f"prompt = {prompt}\noutput = {output}\n"
    )
    return path


def long_row(results: Path) -> dict[str, Any]:
    """A point's figures; where no stream completed (all refused), its summary alone."""
    data = json.loads(results.read_text())["summary"]["overall"]
    try:
        window = decode_window(results)
    except ValueError:
        window = {"output_tokens_per_s": data["output_tokens_per_s"],
                  "completed": data["completed"], "rejected": data["rejected"]}  # fmt: skip
    return {**window, "ttft_p50_ms": data["ttft"]["p50_ms"],
            "ttft_mean_ms": data["ttft"].get("mean_ms")}  # fmt: skip


def batched_bench(binary: str, model: str, prompt: int, output: int, sizes: tuple[int, ...],
                  layout: str) -> str:  # fmt: skip
    """llama-batched-bench's table for ``sizes`` sequences of ``prompt`` + ``output`` tokens,
    a KV stream per sequence (``-no-kvu``) or one buffer (``-kvu``)."""
    argv = [binary, "-m", model, "-c", str(max(sizes) * (prompt + output) + 256), "-b", "2048",
            "-ub", "512", "-npp", str(prompt), "-ntg", str(output),
            "-npl", ",".join(map(str, sizes)), "-ngl", "999", "-fa", "on"]  # fmt: skip
    argv.append("-kvu" if layout == "unified" else "-no-kvu")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    return done.stdout + done.stderr[-2000:]


def cmd_long(args: argparse.Namespace) -> dict[str, Any]:
    """Quanta with nothing set but the model vs llama-server as users run it (``-np N``, a
    context of N slots that hold the requests, every layer offloaded), in turns at each point;
    then llama-batched-bench at 16 and 64 sequences x 2,048 (a stream per sequence and one
    buffer): the engine's own decode rate, which the served rate is compared with."""
    global PARTIAL_FILE
    PARTIAL_FILE = args.out / "long.partial.json"
    state = records_dir(args.out)
    log_to = state / "client.log"
    points = LONG_POINTS_SMALL if SMALL else LONG_POINTS
    out: dict[str, Any] = {"points": []}
    rows: dict[tuple[int, int, int], dict[str, Any]] = {}
    # Nothing set but the model, except where a request is longer than the model's trained
    # context (what the defaults give a slot): there QUANTA_N_CTX holds it, as a user sets it.
    groups: dict[int, list[tuple[int, int, int]]] = {}
    for point in points:
        need = point[0] + point[1]
        groups.setdefault(0 if need <= 8192 else -(-need // 1024) * 1024, []).append(point)
    for n_ctx, group in groups.items():
        settings = {"QUANTA_N_CTX": str(n_ctx)} if n_ctx else {}
        # The step trace (what each step ran, and its cost) changes no decision: it is for
        # reading where a point's time went, and for the simulator's check.
        trace = {"QUANTA_STEP_TRACE": str(state / f"steps-long-{n_ctx or 'default'}.jsonl")}
        server, key = quanta_server(args.model, extra=trace, settings=settings)
        server.start()  # it prints the engine layout it chose (pipeline.log)
        try:
            for prompt, output, n in group:
                wl = long_workload(args.out / "long.toml", n, prompt, output, key)
                res = state / f"long-quanta-{n}x{prompt}.json"
                common = ["--url", f"http://127.0.0.1:{PORT}", "--api-key", key, "--workload",
                          str(wl), "--out", str(res)]  # fmt: skip
                measure(server, f"long {n}x{prompt} quanta", common, log_to)
                rows[(prompt, output, n)] = {"quanta": long_row(res), "quanta_settings": settings}
        finally:
            server.stop()
    for prompt, output, n in points:
        slot = prompt + output + 64
        argv = [args.llama_server, "-m", args.model, "-c", str(n * slot), "-np", str(n),
                "-ngl", "999", "--host", "127.0.0.1", "--port", str(PORT), "--no-webui",
                "--log-disable"]  # fmt: skip
        if slot > TRAINED_CONTEXT:
            argv += ["--override-kv", f"llama.context_length=int:{slot}"]
        peer = Server(argv, {}, "/health")
        peer.start()
        try:
            wl = long_workload(args.out / "long.toml", n, prompt, output, "none")
            res = state / f"long-llama-server-{n}x{prompt}.json"
            common = ["--url", f"http://127.0.0.1:{PORT}", "--api-key", "none", "--workload",
                      str(wl), "--out", str(res)]  # fmt: skip
            row = rows.setdefault((prompt, output, n), {})
            try:
                measure(peer, f"long {n}x{prompt} llama-server -np {n}", common, log_to)
            except RuntimeError as exc:  # e.g. a prompt past the model's trained context
                row["llama_server_error"] = str(exc)
                out["points"].append({"prompt": prompt, "output": output, "streams": n, **row})
                continue
            row["llama_server"] = long_row(res)
        finally:
            peer.stop()
        q, p = row.get("quanta"), row["llama_server"]
        if q is None or not p["output_tokens_per_s"] or not p["ttft_p50_ms"]:
            out["points"].append({"prompt": prompt, "output": output, "streams": n, **row})
            continue
        entry = {"prompt": prompt, "output": output, "streams": n, **row,
                 "tokens_per_s_ratio": q["output_tokens_per_s"] / p["output_tokens_per_s"],
                 "ttft_p50_ratio": q["ttft_p50_ms"] / p["ttft_p50_ms"]}  # fmt: skip
        out["points"].append(entry)
        log(f"{n} x {prompt}: tokens/s {entry['tokens_per_s_ratio']:.2f}x llama-server, "
            f"first token p50 {entry['ttft_p50_ratio']:.2f}x")  # fmt: skip
        PARTIAL_FILE.write_text(json.dumps(out, indent=1))
    bench = Path(args.llama_server).with_name("llama-batched-bench")
    if bench.exists() and not SMALL:
        out["batched_bench"] = {
            layout: batched_bench(str(bench), args.model, 2048, 128, (16, 64), layout)
            for layout in ("streams", "unified")
        }
    (args.out / "long.toml").unlink(missing_ok=True)
    PARTIAL_FILE.unlink()
    return out


# ---- the conversation trace ----

# The long suite's replay sized for one device call: this share of its 400 requests, at
# arrivals fitted to a machine this many times faster than the reference CPU (what the
# H100 served at 64 x 2,000 in prompt-token units, issue 38's capacity model).
REPLAY_SCALE = 0.3
REPLAY_SPEED_FACTOR = 0.055


def cmd_replay(args: argparse.Namespace) -> dict[str, Any]:
    """``quanta bench scenarios --suite long --only conv-replay``: the Azure conversation
    trace at its recorded lengths, Quanta (nothing set but the model) and llama-server -np 64
    from the same client; goodput at the interactive targets."""
    out = records_dir(args.out) / "scenarios"
    argv = ["quanta", "bench", "scenarios", "--suite", "long", "--only", "conv-replay",
            "--servers", "quanta,llama-server", "--gpu", "--speed-factor",
            str(REPLAY_SPEED_FACTOR), "--scale", str(REPLAY_SCALE), "--model", args.model,
            "--llama-server", args.llama_server, "--threads", str(os.cpu_count() or 1),
            "--out", str(out)]  # fmt: skip
    log("replay:", " ".join(argv))
    done = subprocess.run(argv, capture_output=True, text=True)
    figures = out / "figures.json"
    return {
        "argv": argv,
        "returncode": done.returncode,
        "output": done.stdout[-6000:] + done.stderr[-3000:],
        "figures": json.loads(figures.read_text()) if figures.exists() else None,
    }


# ---- calibrate ----


def steady_workload(path: Path) -> Path:
    """Arrivals spread out (Poisson, 6/s: about three quarters of what the H200 cost model
    serves of this mix), prompts and answers of mixed lengths: a server's ordinary day,
    beside the crowd's burst."""
    n, rate, prompt, output = (
        (20, 2.0, (16, 64), (8, 32)) if SMALL else (400, 6.0, (32, 512), (64, 256))
    )
    path.write_text(
        f'name = "gpu-steady"\nseed = 5\nrequests = {n}\nrate = {rate}\n'
        f'endpoint = "completions"\nignore_eos = true\n\n'
        f'[[tenants]]\nname = "people"\nclass = "interactive"\n'
        f'prompt = {{ dist = "uniform", min = {prompt[0]}, max = {prompt[1]} }}\n'
        f'output = {{ dist = "uniform", min = {output[0]}, max = {output[1]} }}\n'
    )
    return path


def intake_ms(results: Path) -> float:
    """The server's intake of one request of a burst, in ms: when the scheduler had each
    request (its ``sent`` + TTFT - its queue and prefill), from the first to the last, over
    the requests between (``quanta sim --server-request-ms``)."""
    rows = [r for r in json.loads(results.read_text())["requests"] if r["ok"]]
    submits: list[float] = sorted(
        r["sent"] + r["token_times"][0] - r["server_queue_s"] - r["server_prefill_s"] for r in rows
    )
    return 1e3 * (submits[-1] - submits[0]) / max(len(submits) - 1, 1)


def serve_run(name: str, wl: Path, args: argparse.Namespace) -> dict[str, Path]:
    """One served run of ``wl`` with its step trace; before it, on the same server, a burst
    of one-token requests (prompts of their own) that measures the server's intake."""
    state = records_dir(args.out)
    files = {"measured": state / f"{name}-measured.json", "intake": state / f"{name}-intake.json",
             "trace": state / f"steps-{name}-measured.jsonl"}  # fmt: skip
    probe = workload(args.out / "intake.toml", 20 if SMALL else 200, 1, seed=7)
    server, key = quanta_server(args.model, {"QUANTA_STEP_TRACE": str(files["trace"])})
    server.start()
    try:
        for wl_path, out in ((probe, files["intake"]), (wl, files["measured"])):
            client(["--url", f"http://127.0.0.1:{PORT}", "--api-key", key, "--workload",
                    str(wl_path), "--out", str(out)], state / "client.log")  # fmt: skip
    finally:
        server.stop()
    probe.unlink()
    return files


def server_cost(traces: list[Path], intakes: list[Path], model: Path) -> ServerCost:
    """The server's own costs as these runs saw them: per cycle and per streamed token from
    the step traces (beyond what the cost model already prices of a step call), the intake
    of a request from the bursts."""
    from quanta_core.sim.step_trace import read_trace, server_cost_of

    records = []
    for path in traces:
        with path.open() as f:
            records += read_trace(f)
    priced_ms = json.loads(model.read_text())["meta"].get("caller_overhead_ms_p50") or 0.0
    cost = server_cost_of(records, priced_ms / 1e3)
    per_request = sum(intake_ms(p) for p in intakes) / len(intakes) / 1e3
    return dataclasses.replace(cost, per_request_s=per_request)


def predict(
    name: str,
    wl: Path,
    files: dict[str, Path],
    other: ServerCost,
    model: Path,
    env: dict[str, str],
) -> dict[str, Any]:
    """`quanta sim` of a served run on ``model``, twice: the engine alone, and with the
    server's costs (``other``: per cycle and per token from the *other* served run's trace;
    its intake from this run's own burst). Predicted vs measured throughput, TTFT (mean,
    p99) and ITL p50."""
    m = summary_of(files["measured"])["overall"]
    intake = intake_ms(files["intake"])
    with_server = (1e3 * other.per_cycle_s, 1e3 * other.per_token_s, intake)
    compare: dict[str, Any] = {"workload": wl.read_text(), "measured": m,
                               "server_cost_ms": dict(zip(("per_cycle", "per_token", "per_request"),
                                                          with_server, strict=True))}  # fmt: skip
    for sim, ms in (("engine_alone", (0.0, 0.0, 0.0)), ("with_server", with_server)):
        predicted = files["measured"].with_name(f"{name}-simulated-{sim}.json")
        flags = [
            f"--server-{k}-ms={v:.4f}"
            for k, v in zip(("cycle", "token", "request"), ms, strict=True)
        ]
        subprocess.run(["quanta", "sim", "--workload", str(wl), "--cost-model", str(model),
                        "--out", str(predicted), *flags], env=env, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        p = summary_of(predicted)["overall"]
        row: dict[str, Any] = {"predicted": p}
        for figure, mv, pv in (
            ("output_tokens_per_s", m["output_tokens_per_s"], p["output_tokens_per_s"]),
            ("ttft_mean_ms", m["ttft"]["mean_ms"], p["ttft"]["mean_ms"]),
            ("ttft_p99_ms", m["ttft"]["p99_ms"], p["ttft"]["p99_ms"]),
            ("itl_p50_ms", m["itl"]["p50_ms"], p["itl"]["p50_ms"]),
        ):
            row[figure] = {"measured": mv, "predicted": pv, "predicted_over_measured": pv / mv}
            log(f"predict {name} ({sim}) {figure}: measured {mv:.1f}, predicted {pv:.1f} "
                f"({pv / mv:.3f})")  # fmt: skip
        compare[sim] = row
    return compare


def cmd_calibrate(args: argparse.Namespace) -> dict[str, Any]:
    """`quanta calibrate` with the GPU settings (the cost model lands in --out), then two
    served runs, the crowd (200 at once x 256 tokens) and a steady day (Poisson arrivals,
    mixed lengths), each predicted by `quanta sim` on that cost model; the server's costs
    both runs measured go into the cost model (``meta["server_cost_ms"]``)."""
    env = {**os.environ, **GPU_ENV, "QUANTA_MODEL_PATH": args.model,
           "QUANTA_CONFIG": ""}  # fmt: skip
    model_out = args.out / "cost_model.json"
    started = time.perf_counter()
    subprocess.run(["quanta", "calibrate", "--model", args.model, "--out", str(model_out),
                    "--plot", str(args.out / "cost_model.png"),
                    "--samples", str(records_dir(args.out) / "calibrate-samples.json"),
                    *args.calibrate_args],
                   env=env, check=True)  # fmt: skip
    result: dict[str, Any] = {"cost_model": str(model_out),
                              "calibrate_s": time.perf_counter() - started}  # fmt: skip
    result["fit"] = json.loads(model_out.read_text())["meta"].get("fit")
    partial = args.out / "calibrate.partial.json"
    partial.write_text(json.dumps(result, indent=1))  # what is done survives a failure
    workloads = {"crowd": crowd_workload(args.out / "predict-crowd.toml"),
                 "steady": steady_workload(args.out / "predict-steady.toml")}  # fmt: skip
    runs = {name: serve_run(name, wl, args) for name, wl in workloads.items()}
    result["predictions"] = {}
    for name, other in (("crowd", "steady"), ("steady", "crowd")):
        cost = server_cost([runs[other]["trace"]], [runs[other]["intake"]], model_out)
        result["predictions"][name] = predict(
            name, workloads[name], runs[name], cost, model_out, env
        )
    both = server_cost([r["trace"] for r in runs.values()], [r["intake"] for r in runs.values()],
                       model_out)  # fmt: skip
    doc = json.loads(model_out.read_text())
    doc["meta"]["server_cost_ms"] = both.in_meta(
        "quanta bench gpu calibrate: the step traces of the crowd and the steady day (per cycle, "
        "per streamed token), a burst of short requests before each (intake)"
    )
    model_out.write_text(json.dumps(doc, indent=2) + "\n")
    result["server_cost_ms"] = doc["meta"]["server_cost_ms"]
    for wl in workloads.values():
        wl.unlink()
    partial.unlink()
    return result


def environment() -> dict[str, Any]:
    def sh(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    return {
        "gpu": sh("nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader"),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "settings": GPU_ENV,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", choices=["serve", "llama", "long", "replay", "calibrate"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--llama-server", default="llama-server")
    parser.add_argument("--streams", type=int, nargs="+", default=list(STREAMS))
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument(
        "--steps", type=int, default=None, help="raw decode steps (default: --tokens, as served)"
    )
    parser.add_argument("--gpu-layers", type=int, default=-1)
    parser.add_argument("--calibrate-args", nargs="*", default=[], help="passed to calibrate")
    parser.add_argument("--small", action="store_true", help="a tenth of the work")
    parser.add_argument(
        "--parts", nargs="+", default=["raw", "engine", "served", "plain"],
        help="serve: raw, engine (the worker in-process), served, plain (served, no overlap)",
    )  # fmt: skip
    parser.add_argument("--serve-policy", default="quanta", help="serve: the server's policy")
    parser.add_argument("--llama-server-only", action="store_true", help="llama: skip Quanta")
    parser.add_argument("--tag", default="", help="results file: BENCH-TAG.json")
    args = parser.parse_args()
    global SMALL
    SMALL = args.small
    args.out.mkdir(parents=True, exist_ok=True)
    commands = {"serve": cmd_serve, "llama": cmd_llama, "long": cmd_long,
                "replay": cmd_replay, "calibrate": cmd_calibrate}  # fmt: skip
    result = {"bench": args.bench, "environment": environment(), **commands[args.bench](args)}
    name = f"{args.bench}-{args.tag}" if args.tag else args.bench
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
