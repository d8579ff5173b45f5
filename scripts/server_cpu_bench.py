#!/usr/bin/env python
"""The server's own CPU per streamed token, with an engine that costs nothing.

    scripts/server_cpu_bench.py --streams 64 --tokens 256 [--profile prof.txt]

`quanta run` as it is (HTTP, tenancy, the usage journal, the scheduler, the driver, real
detokenisation of the default model's vocabulary), except that its engine is the fake
executor: steps return at once, so all the CPU the server process spends is the server's, and
a 2-core machine measures the per-step and per-token path a GPU makes the bottleneck. The
client is `quanta bench run` (B streams at once, ignore_eos). Prints one JSON line: server
CPU seconds and microseconds per streamed token. ``--profile``: py-spy (on PATH) samples the
server while the measured run streams (raw folded stacks).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PORT = 8129
SMOLLM2_VOCAB = 49152  # the default model's (the server detokenises with it)


def serve_on_fake_engine() -> None:
    """The server process: `quanta run` with the fake executor in the llama.cpp worker's place."""
    from app.server import assemble
    from app.server.serve import serve
    from app.server.settings import Settings
    from quanta_core.engine.config import EngineConfig
    from quanta_core.engine.fake import FakeExecutor

    class FakeWorker:
        @staticmethod
        def start(config: EngineConfig) -> FakeExecutor:
            # Its tokens are ids of the default model's vocabulary: detokenised for real.
            return FakeExecutor(
                n_ctx=config.n_ctx,
                n_seq_max=config.n_seq_max,
                n_batch=config.n_batch,
                n_vocab=SMOLLM2_VOCAB,
            )

    setattr(assemble, "LlamaCppExecutor", FakeWorker)  # noqa: B010  (the worker's place)
    sys.exit(serve(Settings()))


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quanta(*args: str, env: dict[str, str]) -> str:
    argv = [sys.executable, "-m", "app.cli", *args]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"quanta {args[0]} failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")
    return done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    if args.streams > 256:
        parser.error("--streams: at most 256 (the engine's sequence slots)")
    state = Path(tempfile.mkdtemp(prefix="quanta-cpu-"))
    env = {
        **os.environ,
        "QUANTA_DATABASE_URL": f"sqlite+aiosqlite:///{state}/quanta.db",
        "QUANTA_DATA_DIR": str(state / "data"),
        "QUANTA_CONFIG": "",
        "QUANTA_PORT": str(PORT),
        "QUANTA_LOG_LEVEL": "warning",
        "QUANTA_N_SEQ_MAX": "256",
        "QUANTA_N_CTX": str(256 * (32 + args.tokens) + 4096),
        "QUANTA_N_BATCH": "2048",
        "QUANTA_TOKEN_BUDGET": "2048",
        "QUANTA_OVERLAP_STEPS": "true",  # as on a GPU
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    quanta("migrate", env=env)
    out = quanta("tenants", "create", "bench", env=env)
    key = next(ln.split(": ", 1)[1] for ln in out.splitlines() if ln.startswith("api key"))
    workload = state / "workload.toml"
    workload.write_text(
        f'name = "cpu-{args.streams}"\nseed = 1\nrequests = {args.streams}\nrate = inf\n'
        f'endpoint = "completions"\nignore_eos = true\n\n[[tenants]]\nname = "people"\n'
        f'class = "interactive"\nprompt = 32\noutput = {args.tokens}\n'
    )
    code = (
        "import sys; sys.argv[0] = 'quanta'; from scripts.server_cpu_bench import "
        "serve_on_fake_engine as s; s()"
    )
    server = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=state)
    try:
        for _ in range(240):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/readyz", timeout=2):
                    break
            except OSError:
                time.sleep(0.25)

        def client(name: str) -> dict[str, float]:
            quanta(
                "bench",
                "run",
                "--quiet",
                "--no-plots",
                "--url",
                f"http://127.0.0.1:{PORT}",
                "--api-key",
                key,
                "--workload",
                str(workload),
                "--out",
                str(state / f"{name}.json"),
                env=env,
            )
            summary = json.loads((state / f"{name}.json").read_text())["summary"]["overall"]
            return summary  # type: ignore[no-any-return]

        client("warm-up")
        spy = None
        if args.profile is not None:
            spy = subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "-r",
                    "250",
                    "-f",
                    "raw",
                    "-o",
                    str(args.profile),
                    "-p",
                    str(server.pid),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)
        cpu0 = cpu_s(server.pid)
        summary = client("run")
        cpu = cpu_s(server.pid) - cpu0
        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
    finally:
        server.terminate()
        server.wait(60)
        shutil.rmtree(state, ignore_errors=True)
    tokens = summary["output_tokens"]
    row = {
        "label": args.label,
        "streams": args.streams,
        "tokens": tokens,
        "completed": summary["completed"],
        "server_cpu_s": cpu,
        "server_cpu_us_per_token": cpu / tokens * 1e6,
        "load_avg": os.getloadavg()[0],
    }
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
