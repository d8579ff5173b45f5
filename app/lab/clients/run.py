"""guidellm and aiperf, the load tools people already run, as real clients of Quanta and of
llama.cpp's llama-server, beside ``quanta bench``: the same model, the same workload (8
concurrent users, 128-token prompts, 128-token answers with ignore-EOS, streamed from
/v1/completions), one server at a time, a fresh one for every tool, the tools in turns.

    quanta bench clients run          # writes bench/results/clients/, prints the table

The tools are pinned and installed on demand into venvs of their own (never the project's):
guidellm 0.8.1 and aiperf 0.13.0. Their tokenizer is the default model's own, taken from its
GGUF file by transformers (with the gguf package) and kept in a private Hugging Face cache
under a local name; the tools run with HF_HUB_OFFLINE=1, so nothing is downloaded. Each
tool's CPU time is taken with /usr/bin/time: on a small machine the client competes with the
server for the cores, and that bounds how far the tools' figures can agree.

The tools keep USERS streams busy back to back: a batch workload. An interactive key is
refused (503, retry-after) whenever its first token is projected past the 2 s target, and the
tools send again at once and count each refusal as an error; ``--slo-class interactive``
measures that.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.lab.bench.servers import find_llama_server
from app.lab.server import QUANTA, ROOT, QuantaServer, free_port, stop_process, wait_ready
from app.server.settings import default_model_path

GUIDELLM, AIPERF = "guidellm-0.8.1", "aiperf-0.13.0"
TOKENIZER_NAME = "quanta/smollm2-tokenizer"
WORKLOAD = "bench/workloads/clients_8_users.toml"
ISL = OSL = 128


def install_tools(home: Path, model: Path) -> Path:
    """The tools' venvs and the tokenizer snapshot; the snapshot's folder."""
    for venv, package in ((GUIDELLM, "guidellm==0.8.1 gguf==0.19.0"), (AIPERF, "aiperf==0.13.0")):
        tool = home / venv / "bin" / venv.split("-")[0]
        if not tool.exists():
            subprocess.run([sys.executable, "-m", "venv", str(home / venv)], check=True)
            pip = [str(home / venv / "bin" / "pip"), "install", "--quiet", *package.split()]
            subprocess.run(pip, check=True)
    # aiperf offline resolves names only through the cache; guidellm is given the snapshot.
    repo = home / "hf" / "hub" / f"models--{TOKENIZER_NAME.replace('/', '--')}"
    snap = repo / "snapshots" / "local"
    if not (snap / "tokenizer.json").exists():
        snap.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text("local")
        save = (
            "import sys; from pathlib import Path; from transformers import AutoTokenizer; "
            "m = Path(sys.argv[1]); "
            "AutoTokenizer.from_pretrained(m.parent, gguf_file=m.name).save_pretrained(sys.argv[2])"
        )
        python = str(home / GUIDELLM / "bin" / "python")
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        subprocess.run([python, "-c", save, str(model), str(snap)], check=True, env=env)
    return snap


@contextmanager
def server(name: str, args: argparse.Namespace, model: Path) -> Iterator[tuple[str, str | None]]:
    """A fresh server: its URL and a key (None: llama-server takes none)."""
    if name == "quanta":  # its defaults, but for the threads (as llama-server's)
        flags = (
            "--threads",
            str(args.threads),
            "--n-ctx",
            str(args.n_ctx),
            "--log-level",
            "warning",
        )
        with QuantaServer.fresh(*flags, prefix="quanta-clients-") as quanta:
            yield quanta.url, quanta.tenant_key("clients", args.slo_class)
        return
    binary = args.llama_server or find_llama_server()
    if binary is None:
        sys.exit("llama-server is not built: scripts/build_llama_server.sh")
    port = free_port()
    # --kv-unified: one KV buffer shared by all slots, as Quanta's engine runs it.
    command = [str(binary), "-m", str(model), "-c", str(args.n_ctx), "-np", str(args.slots)]
    command += ["-t", str(args.threads), "-tb", str(args.threads), "--kv-unified"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--no-webui", "--log-disable"]
    log = (args.out / "llama-server-server.log").open("ab")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        wait_ready(process, f"http://127.0.0.1:{port}/health")
        yield f"http://127.0.0.1:{port}", None
    finally:
        stop_process(process, 30)


def run_tool(tool: str, tag: str, url: str, key: str | None, args: argparse.Namespace) -> int:
    home, out, model_id = args.clients_dir, args.out, default_model_path().stem
    timed = ["/usr/bin/time", "-o", str(out / f"{tag}.time"), "-f", "%U %S %e"]
    offline = {"HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env = {**os.environ, **offline}
    if tool == "guidellm":
        backend = f"kind=openai_http,target={url},model={model_id},request_format=/v1/completions"
        backend += f",api_key={key}" if key else ""
        command = [str(home / GUIDELLM / "bin" / "guidellm"), "run", "--backend", backend]
        command += ["--profile", f"kind=concurrent,streams={args.users}"]
        command += ["--constraint", f"kind=max_duration,seconds={args.duration}"]
        command += ["--tokenizer", f"kind=huggingface_auto,model={args.tokenizer}"]
        command += ["--data", f"kind=synthetic_text,prompt_tokens={ISL},output_tokens={OSL}"]
        command += ["--output", f"kind=json,path={out / f'{tag}.json'}"]
        command += ["--disable-console-interactive"]
    elif tool == "aiperf":
        artifacts = Path(f"/tmp/quanta-aiperf-{tag}")
        shutil.rmtree(artifacts, ignore_errors=True)
        command = [str(home / AIPERF / "bin" / "aiperf"), "profile", "--model", model_id]
        command += ["--url", url, *(["--api-key", key] if key else [])]
        command += ["--endpoint-type", "completions", "--streaming"]
        command += ["--concurrency", str(args.users), "--benchmark-duration", str(args.duration)]
        command += ["--isl", str(ISL), "--osl", str(OSL), "--extra-inputs", "ignore_eos:true"]
        command += ["--tokenizer", TOKENIZER_NAME, "--artifact-dir", str(artifacts)]
        command += ["--ui-type", "simple"]
    elif tool == "quanta-bench":
        command = [*QUANTA, "bench", "run", "--url", url, "--workload", WORKLOAD]
        command += [*(["--api-key", key] if key else []), "--out", str(out / f"{tag}.json")]
        command += ["--label", tag, "--no-plots", "--quiet"]
    else:
        sys.exit(f"unknown tool: {tool}")
    with (out / f"{tag}.log").open("w") as log:
        code = subprocess.run([*timed, *command], env=env, cwd=ROOT, stdout=log, stderr=log)
    if tool == "aiperf" and code.returncode == 0:
        shutil.copy(artifacts / "profile_export_aiperf.json", out / f"{tag}.json")
    return code.returncode


def main() -> None:
    parser = argparse.ArgumentParser(prog="quanta bench clients run", description=__doc__)
    parser.add_argument("--duration", type=int, default=60, help="seconds of load per tool")
    parser.add_argument("--users", type=int, default=8, help="concurrent streams")
    parser.add_argument("--servers", default="quanta,llama-server", help="comma-separated")
    parser.add_argument("--tools", default="quanta-bench,guidellm,aiperf")
    parser.add_argument("--n-ctx", type=int, default=8192, help="KV cells, on both servers")
    parser.add_argument("--slots", type=int, default=16, help="llama-server -np")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--slo-class", default="batch", help="Quanta's key's class")
    parser.add_argument("--clients-dir", type=Path, default=Path.home() / ".cache/quanta/clients")
    parser.add_argument("--llama-server", type=Path, default=None, help="(default: the built one)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/clients"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.clients_dir.mkdir(parents=True, exist_ok=True)
    model = default_model_path()
    tools = args.tools.split(",")
    if {"guidellm", "aiperf"} & set(tools):
        args.tokenizer = install_tools(args.clients_dir, model)
    for log in args.out.glob("*-server.log"):
        log.unlink()
    for name in args.servers.split(","):
        for tool in tools:
            load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            print(f"{name} · {tool} · load average {load}", file=sys.stderr)
            with server(name, args, model) as (url, key):
                if run_tool(tool, f"{name}-{tool}", url, key, args):
                    print(f"{name} · {tool} failed (see {args.out}/{name}-{tool}.log)")
    subprocess.run([*QUANTA, "bench", "clients", "table", str(args.out)], cwd=ROOT, check=True)
