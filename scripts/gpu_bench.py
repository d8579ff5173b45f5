#!/usr/bin/env python
"""GPU benchmarks, run on the device by scripts/gpu_run.sh (they also run on a CPU build).

    gpu_bench.py serve --model M --out DIR      raw llama_decode vs Quanta served, 1..256 streams
    gpu_bench.py llama --model M --out DIR --llama-server BIN    Quanta vs llama-server
    gpu_bench.py calibrate --model M --out DIR  a cost model of this machine, and the simulator's
                                                prediction of one served run against it

Raw: llama_decode of B sequences in this process (the model's layers on the GPU), then the
greedy token of every sequence (numpy argmax over its logits): what any server must do per
step. Served: `quanta run` with the GPU settings below, `quanta bench run` sending B streaming
requests at once; the decode rate is read in the window where all B streams are decoding (from
the last first token to the first last token), so neither counts prefill. Server CPU: the
server process's user + system time over the run, per streamed token (its engine worker is a
separate process, not counted; the client is measured apart).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

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
    "QUANTA_TOKEN_BUDGET": "512",
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
        body = sorted(times[2:])
        mean = sum(body) / len(body)
        rows.append(
            {
                "streams": b,
                "steps": len(body),
                "step_ms_mean": mean * 1e3,
                "step_ms_p50": body[len(body) // 2] * 1e3,
                "tokens_per_s": b / mean,
            }
        )
        log(f"raw {b:4d} streams: {mean * 1e3:7.2f} ms a step, {b / mean:8.1f} tokens/s")
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(m)
    return rows


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
    """A throw-away `quanta run` (or llama-server) on PORT, with its own database."""

    def __init__(self, argv: list[str], env: dict[str, str], health: str) -> None:
        self.state = tempfile.mkdtemp(prefix="quanta-gpu-")
        self.env = {**os.environ, **env}
        self.argv, self.health = argv, health
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, env=self.env)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[0]} exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{self.health}", timeout=2):
                    return
            except OSError:
                time.sleep(0.25)
        raise RuntimeError("server not ready")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def quanta_server(model: str, extra: dict[str, str] | None = None) -> tuple[Server, str]:
    state = tempfile.mkdtemp(prefix="quanta-db-")
    env = {
        "QUANTA_DATABASE_URL": f"sqlite+aiosqlite:///{state}/quanta.db",
        "QUANTA_DATA_DIR": f"{state}/data",
        "QUANTA_CONFIG": "/nonexistent/quanta.toml",
        "QUANTA_MODEL_PATH": model,
        "QUANTA_PORT": str(PORT),
        "QUANTA_LOG_LEVEL": "warning",
        **GPU_ENV,
        **(extra or {}),
    }
    full = {**os.environ, **env}
    subprocess.run(["quanta", "migrate"], env=full, check=True, capture_output=True)
    out = subprocess.run(
        ["quanta", "tenants", "create", "bench"], env=full, check=True, capture_output=True
    ).stdout.decode()
    key = next(ln.split(": ", 1)[1] for ln in out.splitlines() if ln.startswith("api key"))
    return Server(["quanta", "run"], env, "/readyz"), key


def workload(path: Path, b: int, tokens: int, prompt: int = PROMPT) -> Path:
    path.write_text(
        f'name = "gpu-{b}-at-once"\nseed = {b}\nrequests = {b}\nrate = inf\n'
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
    }


def served(model: str, streams: tuple[int, ...], tokens: int, out: Path) -> list[dict[str, Any]]:
    server, key = quanta_server(model)
    server.start()
    assert server.proc is not None
    rows = []
    client_log = Path(server.state) / "client.log"
    try:
        for b in streams:
            wl = workload(out / f"wl-{b}.toml", b, tokens)
            res = Path(server.state) / f"served-{b}.json"
            cpu0, t0 = cpu_s(server.proc.pid), time.perf_counter()
            worker0 = children_cpu_s(server.proc.pid)
            client_cpu = client(["--url", f"http://127.0.0.1:{PORT}", "--api-key", key,
                                 "--workload", str(wl), "--out", str(res)],
                                client_log)  # fmt: skip
            wall, cpu = time.perf_counter() - t0, cpu_s(server.proc.pid) - cpu0
            worker = children_cpu_s(server.proc.pid) - worker0
            row = {"streams": b, **decode_window(res), "wall_s": wall, "server_cpu_s": cpu}
            row["worker_cpu_us_per_token"] = worker / row["output_tokens"] * 1e6
            row["server_cpu_us_per_token"] = cpu / row["output_tokens"] * 1e6
            row["client_cpu_us_per_token"] = client_cpu / row["output_tokens"] * 1e6
            rows.append(row)
            wl.unlink()
            log(
                f"served {b:4d} streams: {row['decode_tokens_per_s']:8.1f} tokens/s decoding, "
                f"server {row['server_cpu_us_per_token']:.0f} us CPU/token, "
                f"client {row['client_cpu_us_per_token']:.0f}, "
                f"engine worker {row['worker_cpu_us_per_token']:.0f}"
            )
    finally:
        server.stop()
    return rows


def traced(model: str, b: int, tokens: int, out: Path) -> dict[str, Any]:
    """One more served run of ``b`` streams with the step trace on: where a decode step's
    time goes (the worker's own engine time, the process boundary, the server between steps).
    The tracer costs a little itself, so these are not the figures above."""
    trace = Path(tempfile.mkdtemp(prefix="quanta-trace-")) / "steps.jsonl"
    server, key = quanta_server(model, {"QUANTA_STEP_TRACE": str(trace)})
    server.start()
    try:
        wl = workload(out / f"wl-{b}.toml", b, tokens)
        res = Path(server.state) / "traced.json"
        client(["--url", f"http://127.0.0.1:{PORT}", "--api-key", key, "--workload", str(wl),
                "--out", str(res)], Path(server.state) / "client.log")  # fmt: skip
        wl.unlink()
    finally:
        server.stop()
    steps = [json.loads(line) for line in trace.open()]
    decode = [r for r in steps if r.get("plan") and len(r["plan"]["slices"]) == b
              and all(len(x["tokens"]) == 1 for x in r["plan"]["slices"])]  # fmt: skip

    def median_ms(key: str) -> float:
        values = sorted(r[key] for r in decode if r[key] is not None)
        return values[len(values) // 2] * 1e3 if values else float("nan")

    row = {"streams": b, "decode_steps": len(decode), "engine_ms": median_ms("engine"),
           "total_ms": median_ms("total"), "gap_ms": median_ms("gap")}  # fmt: skip
    log(f"traced {b} streams: {row}")
    return row


def cmd_serve(args: argparse.Namespace) -> dict[str, Any]:
    streams = tuple(args.streams)
    # Raw decodes as many steps as a served answer has tokens: every step of either attends
    # over the same cells (in one unified KV buffer, the cells of every sequence).
    raw = raw_decode(args.model, streams, args.steps or args.tokens, args.gpu_layers)
    srv = served(args.model, streams, args.tokens, args.out)
    attribution = traced(args.model, max(streams), args.tokens, args.out)
    table = []
    for r, s in zip(raw, srv, strict=True):
        ratio = s["decode_tokens_per_s"] / r["tokens_per_s"]
        table.append({"streams": r["streams"], "raw_tokens_per_s": r["tokens_per_s"],
                      "served_tokens_per_s": s["decode_tokens_per_s"], "ratio": ratio,
                      "server_cpu_us_per_token": s["server_cpu_us_per_token"]})  # fmt: skip
    print(f"{'streams':>8} {'raw tok/s':>10} {'served':>10} {'ratio':>6} {'srv us/tok':>10}")
    for t in table:
        print(f"{t['streams']:8d} {t['raw_tokens_per_s']:10.1f} {t['served_tokens_per_s']:10.1f} "
              f"{t['ratio']:6.3f} {t['server_cpu_us_per_token']:10.1f}")  # fmt: skip
    return {"raw": raw, "served": srv, "table": table, "step_trace": attribution}


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
    state = Path(tempfile.mkdtemp(prefix="quanta-gpu-llama-"))
    log_to = state / "client.log"
    url = f"http://127.0.0.1:{PORT}"
    for policy in ("fcfs", "slo"):  # fcfs: Quanta's default
        server, key = quanta_server(args.model, {"QUANTA_POLICY": policy})
        env = {**os.environ, **server.env}
        etl = subprocess.run(
            ["quanta", "tenants", "create", "etl", "--slo-class", "batch"],
            env=env, check=True, capture_output=True,
        ).stdout.decode()  # fmt: skip
        etl_key = next(ln.split(": ", 1)[1] for ln in etl.splitlines() if ln.startswith("api"))
        flood = flood_workload(args.out / "flood.toml", key, etl_key)
        server.start()
        try:
            for name, wl in (("crowd", crowd), ("flood", flood)):
                if name == "crowd" and policy != "fcfs":
                    continue
                res = state / f"{name}-quanta-{policy}.json"
                common = ["--url", url, "--api-key", key, "--workload", str(wl), "--out", str(res)]
                out[f"{name}-quanta-{policy}"] = measure(server, f"{name} quanta {policy}",
                                                         common, log_to)  # fmt: skip
                if name == "crowd":
                    (args.out / "crowd-quanta-fcfs.json").write_bytes(res.read_bytes())
        finally:
            server.stop()
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


# ---- calibrate ----


def cmd_calibrate(args: argparse.Namespace) -> dict[str, Any]:
    """`quanta calibrate` with the GPU settings; the cost model lands in --out."""
    env = {**os.environ, **GPU_ENV, "QUANTA_MODEL_PATH": args.model,
           "QUANTA_CONFIG": "/nonexistent/quanta.toml"}  # fmt: skip
    model_out = args.out / "cost_model.json"
    started = time.perf_counter()
    subprocess.run(["quanta", "calibrate", "--model", args.model, "--out", str(model_out),
                    "--plot", str(args.out / "cost_model.png"), *args.calibrate_args],
                   env=env, check=True)  # fmt: skip
    return {"cost_model": str(model_out), "calibrate_s": time.perf_counter() - started}


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
    parser.add_argument("bench", choices=["serve", "llama", "calibrate"])
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
    args = parser.parse_args()
    global SMALL
    SMALL = args.small
    args.out.mkdir(parents=True, exist_ok=True)
    commands = {"serve": cmd_serve, "llama": cmd_llama, "calibrate": cmd_calibrate}
    result = {"bench": args.bench, "environment": environment(), **commands[args.bench](args)}
    (args.out / f"{args.bench}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
