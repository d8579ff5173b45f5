"""The server's own CPU time per streamed token, with an engine that costs nothing.

A child process serves the real app (litestar on uvicorn, as ``quanta run`` does) over the
real driver and scheduler, with the fake executor in place of llama.cpp and the default
model's tokenizer (vocabulary only: no weights, no engine). The parent drives B concurrent
streaming requests of T tokens each (``ignore_eos``, ``include_usage``, as
``bench_http_overhead`` does) with httpx, ROUNDS times per endpoint, and asks the child for
its CPU time (``time.process_time``) before and after each round. The fake executor's own
step time (thread CPU) is subtracted: what is left is the server's work per token —
scheduler update, dispatch, detokenize, render, JSON, litestar and uvicorn — which on the
real machine is taken from llama.cpp's threads. Each fake step sleeps ``--step-ms`` (time, no
CPU), so the streams batch up as on the real engine, one token each per step; the server is
pinned to the first CPU, the client to the last.

    .venv/bin/python -m scripts.profile_stream_path [--streams 16] [--tokens 200]
        [--rounds 5] [--step-ms 20] [--endpoints completions,chat]
        [--profile cprofile|py-spy]
        [--out bench/results/stream_path.json]

``--profile cprofile`` profiles the event loop's thread (on its CPU clock) during one more
round and prints the top functions (cProfile inflates small calls: use it for where, not how
much); ``--profile py-spy`` samples the child with py-spy and prints self and inclusive shares
(wall time: a thread waiting for the GIL counts too). The µs per token come from the rounds
without a profiler. Each round also reports the loop's and the engine thread's CPU, the
garbage collector's and the kernel's share (``--out``, default
``bench/results/stream_path.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import httpx

from app.server.core import Core, CoreStats
from app.server.settings import Settings, default_model_path
from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import StepPlan, StepResult
from scripts.benchlib import console, environment, write_results
from tests.server_process import ROOT, free_port
from tests.tenancy_setup import fresh_db

PROMPT = "Write a long story about a lighthouse keeper and the sea."


# ---- the child: the server ----


class TimedExecutor(FakeExecutor):
    """The fake executor, counting its own CPU time (it runs in the engine thread), and
    sleeping ``step_s`` per step: a step takes time but no CPU, so the streams batch up as
    they do on the real engine (one token each per step) instead of racing a free loop."""

    step_cpu_s: float = 0.0
    step_s: float = 0.0

    def step(self, plan: StepPlan) -> StepResult:
        start = time.thread_time()
        try:
            return super().step(plan)
        finally:
            TimedExecutor.step_cpu_s += time.thread_time() - start
            time.sleep(self.step_s)


def fake_engine_core(settings: Settings) -> Core:
    from app.server.assemble import LlamaGrammars
    from app.server.scheduling import scheduler_config
    from quanta_core.clock import WallClock
    from quanta_core.engine.llama_cpp.tokenizer import Tokenizer
    from quanta_core.scheduler import Driver, Scheduler

    tokenizer = Tokenizer.load(str(default_model_path()))
    executor = TimedExecutor(
        n_ctx=settings.layout.n_ctx,
        n_seq_max=settings.layout.n_seq_max,
        n_batch=settings.layout.n_batch,
        n_vocab=tokenizer.n_vocab,
    )
    clock = WallClock()
    scheduler = Scheduler(scheduler_config(settings), executor.info, clock)
    driver = Driver(scheduler, executor, clock)
    return Core(
        model_name="fake-engine",
        n_ctx=scheduler.max_seq_tokens,
        created=int(time.time()),
        tokenizer=tokenizer,
        driver=driver,
        grammars=LlamaGrammars(),
        stats=lambda: CoreStats(),
        close=tokenizer.close,
    )


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process, by thread name (Linux)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = collections.defaultdict(float)
    for task in Path("/proc/self/task").iterdir():
        fields = (task / "stat").read_text().rpartition(")")[2].split()
        name = names.get(int(task.name), "")
        kind = "loop" if name == "MainThread" else "engine" if "engine" in name else "other"
        out[f"thread:{kind}"] += (int(fields[11]) + int(fields[12])) / ticks
    return dict(out)


def pin(which: int) -> None:
    """The server on the first CPU, the client on the last: fewer migrations, less noise."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[0] if which == 0 else cpus[-1]})


def serve(port: int, step_ms: float) -> None:
    """Serve on ``port``; answer each line on stdin with the CPU seconds so far (JSON)."""
    import uvicorn

    pin(0)

    from app.server.app import create_app
    from app.server.serve import freeze_startup_heap

    TimedExecutor.step_s = step_ms / 1000

    app = create_app(Settings(), core_factory=fake_engine_core)
    app.state["lifecycle"].on_ready = freeze_startup_heap  # as ``quanta run`` does
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    profiler = cProfile.Profile(time.thread_time)  # the loop's CPU, not its waits
    gc_s = [0.0, 0.0]  # total, the start of the collection under way

    def gc_timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_s[1] = time.thread_time()
        else:
            gc_s[0] += time.thread_time() - gc_s[1]

    gc.callbacks.append(gc_timer)
    loop_ready = threading.Event()
    loop: asyncio.AbstractEventLoop | None = None

    async def run() -> None:
        nonlocal loop
        loop = asyncio.get_running_loop()
        loop_ready.set()
        await server.serve()

    def control() -> None:
        loop_ready.wait()
        assert loop is not None
        for line in sys.stdin:
            command = line.strip()
            if command == "profile-start":
                loop.call_soon_threadsafe(profiler.enable)
            elif command.startswith("profile-stop "):
                stopped = threading.Event()

                def stop(stopped: threading.Event = stopped) -> None:
                    profiler.disable()
                    stopped.set()

                loop.call_soon_threadsafe(stop)
                stopped.wait()
                profiler.dump_stats(command.split(" ", 1)[1])
            cpu = {"process_s": time.process_time(), "step_s": TimedExecutor.step_cpu_s}
            cpu |= thread_cpu()
            cpu["sys_s"] = os.times().system
            cpu["gc_s"] = gc_s[0]
            print(json.dumps(cpu), flush=True)
        server.should_exit = True

    threading.Thread(target=control, daemon=True).start()
    factory = config.get_loop_factory()  # as ``quanta run`` (uvicorn's ``Server.run``) has it
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(run())


# ---- the parent: the client ----


class Child:
    def __init__(self, port: int, step_ms: float, env: dict[str, str]) -> None:
        command = [sys.executable, "-m", "scripts.profile_stream_path", "--serve", str(port)]
        command += ["--step-ms", str(step_ms)]
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.url = f"http://127.0.0.1:{port}"

    def ask(self, command: str = "cpu") -> dict[str, float]:
        stdin: IO[str] | None = self.process.stdin
        stdout: IO[str] | None = self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(command + "\n")
        stdin.flush()
        answer: dict[str, float] = json.loads(stdout.readline())
        return answer

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError("the server did not become ready")

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def body(endpoint: str, index: int, tokens: int) -> tuple[str, dict[str, Any]]:
    common = {
        "model": "fake-engine",
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        messages = [{"role": "user", "content": f"{PROMPT} ({index})"}]
        return "/v1/chat/completions", {**common, "messages": messages}
    return "/v1/completions", {**common, "prompt": f"{PROMPT} ({index})"}


async def stream_one(client: httpx.AsyncClient, endpoint: str, index: int, tokens: int) -> int:
    """The server's count of completion tokens (from the usage chunk, the last but [DONE])."""
    path, payload = body(endpoint, index, tokens)
    last = b""
    async with client.stream("POST", path, json=payload) as response:
        response.raise_for_status()
        async for data in response.aiter_raw():  # as little client work as can be
            last = (last + data)[-4096:]
    usage, done, end = last.split(b"\n\n")[-3:]
    assert (done, end) == (b"data: [DONE]", b"") and usage.startswith(b"data: {"), last
    n: int = json.loads(usage[6:])["usage"]["completion_tokens"]
    return n


async def one_round(url: str, key: str, endpoint: str, streams: int, tokens: int) -> int:
    headers = {"authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=streams + 1)
    async with httpx.AsyncClient(base_url=url, timeout=600, headers=headers, limits=limits) as c:
        counts = await asyncio.gather(*(stream_one(c, endpoint, i, tokens) for i in range(streams)))
    return sum(counts)


def measured_round(
    child: Child, key: str, endpoint: str, streams: int, tokens: int
) -> dict[str, float]:
    before = child.ask()
    wall = time.perf_counter()
    n = asyncio.run(one_round(child.url, key, endpoint, streams, tokens))
    wall = time.perf_counter() - wall
    after = child.ask()
    server_s = (after["process_s"] - before["process_s"]) - (after["step_s"] - before["step_s"])
    threads = {
        k: round(1e6 * (after[k] - before.get(k, 0.0)) / n, 1)
        for k in after
        if k.startswith("thread:")
    }
    return {
        "threads_us_per_token": threads,  # type: ignore[dict-item]
        "gc_us_per_token": 1e6 * (after["gc_s"] - before["gc_s"]) / n,
        "sys_us_per_token": 1e6 * (after["sys_s"] - before["sys_s"]) / n,
        "tokens": n,
        "wall_s": wall,
        "server_cpu_s": server_s,
        "fake_step_cpu_s": after["step_s"] - before["step_s"],
        "us_per_token": 1e6 * server_s / n,
    }


def py_spy_shares(raw: Path, top: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """Self and inclusive shares of the functions in py-spy's raw (collapsed) output."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [f.rsplit(":", 1)[0] + ")" if ":" in f else f for f in stack.split(";")]
        own[frames[-1]] += int(count)
        for name in set(frames):
            inclusive[name] += int(count)
        total += int(count)

    def share(counts: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(name, 100 * k / total) for name, k in counts.most_common(top)]

    return share(own), share(inclusive)


def profile(child: Child, key: str, args: argparse.Namespace, endpoint: str) -> None:
    if args.profile == "cprofile":
        out = Path(f"/tmp/stream_path_{endpoint}.prof")
        child.ask("profile-start")
        asyncio.run(one_round(child.url, key, endpoint, args.streams, args.tokens))
        child.ask(f"profile-stop {out}")
        console.print(f"[bold]cProfile, {endpoint}[/] ({out})")
        pstats.Stats(str(out)).sort_stats("tottime").print_stats(args.top)
        return
    raw = Path(f"/tmp/stream_path_{endpoint}.pyspy.txt")
    spy = subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw", "--rate",
         "500", "--nonblocking", "-o", str(raw), "-p", str(child.process.pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)
    for _ in range(args.rounds):
        asyncio.run(one_round(child.url, key, endpoint, args.streams, args.tokens))
    spy.send_signal(2)
    spy.wait(30)
    own, inclusive = py_spy_shares(raw, args.top)
    for title, rows in (("self", own), ("inclusive", inclusive)):
        console.print(f"[bold]py-spy, {endpoint}: {title} time[/] ({raw})")
        for name, share in rows:
            console.print(f"{share:5.1f}%  {name}", soft_wrap=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--step-ms", type=float, default=20.0, help="each fake step sleeps")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--endpoints", default="completions,chat")
    parser.add_argument("--profile", choices=("cprofile", "py-spy"))
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("bench/results/stream_path.json"))
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.step_ms)
        return
    db = fresh_db()
    key = db.create_key("profile")
    env = {
        **os.environ,
        "QUANTA_CONFIG": "",
        "QUANTA_MAX_RUNNING": str(args.streams),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **db.env(),
    }
    child = Child(free_port(), args.step_ms, env)
    pin(1)
    rows: dict[str, Any] = {}
    try:
        child.wait_ready()
        for endpoint in args.endpoints.split(","):
            asyncio.run(one_round(child.url, key, endpoint, args.streams, args.tokens))  # warm
            rounds = [
                measured_round(child, key, endpoint, args.streams, args.tokens)
                for _ in range(args.rounds)
            ]
            rows[endpoint] = {
                "us_per_token": statistics.median(r["us_per_token"] for r in rounds),
                "rounds": rounds,
            }
            per_round = ", ".join(f"{r['us_per_token']:.1f}" for r in rounds)
            console.print(
                f"{endpoint}: {rows[endpoint]['us_per_token']:.1f} µs of server CPU per token "
                f"(rounds: {per_round}; "
                f"{rounds[0]['tokens']} tokens a round, fake engine "
                f"{1e6 * rounds[0]['fake_step_cpu_s'] / rounds[0]['tokens']:.1f} µs/token "
                "not counted)"
            )
            if args.profile:
                profile(child, key, args, endpoint)
    finally:
        child.stop()
    write_results(
        args.out,
        {
            "environment": environment(),
            "streams": args.streams,
            "tokens": args.tokens,
            "step_ms": args.step_ms,
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
