#!/usr/bin/env bash
# Quanta and llama.cpp's llama-server, side by side: the same model file, context size,
# parallel slots, threads and workload, measured by the same client (`quanta bench run`).
#
#   scripts/bench_side_by_side.sh                      # twenty-at-once
#   WORKLOAD=bench/workloads/two_tenants.toml scripts/bench_side_by_side.sh
#
# Writes bench/results/<workload>-<server>.json (+ .cdf/.ttft/.service/.tokens.png) for:
#   quanta-sequential   quanta run --policy sequential   (one request at a time)
#   quanta-fcfs         quanta run --policy fcfs         (continuous batching, first come first)
#   llama-server-np1    llama-server -np 1               (one slot: llama.cpp's sequential)
#   llama-server        llama-server -np $SLOTS          (continuous batching over $SLOTS slots)
# and prints `quanta bench compare` for the pairs that answer a question.
#
# Run it on a quiet machine: nothing else should use the CPU while it measures.
#
# Environment (defaults in brackets):
#   WORKLOAD   a workload file; empty: the twenty-at-once preset        [empty]
#   MODEL      GGUF file                                                 [quanta's default model]
#   N_CTX      KV cells shared by all sequences, on both servers         [4096]
#   SLOTS      parallel sequences: quanta --n-seq-max, llama-server -np   [20]
#   THREADS    llama.cpp threads, on both servers                        [nproc]
#   PORT       port of the server under test                             [8089]
#   LLAMA_SERVER  the binary; empty: built by scripts/build_llama_server.sh  [empty]
#   OUT        results directory                                         [bench/results]
#   RUNS       which runs, space-separated    [quanta-sequential quanta-fcfs llama-server-np1 llama-server]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
QUANTA="$ROOT/.venv/bin/quanta"

WORKLOAD="${WORKLOAD:-}"
MODEL="${MODEL:-$("$PY" -c 'from app.server.settings import default_model_path; print(default_model_path())')}"
N_CTX="${N_CTX:-4096}"
SLOTS="${SLOTS:-20}"
THREADS="${THREADS:-$(nproc)}"
PORT="${PORT:-8089}"
OUT="${OUT:-bench/results}"
RUNS="${RUNS:-quanta-sequential quanta-fcfs llama-server-np1 llama-server}"
URL="http://127.0.0.1:$PORT"

if [[ -n "$WORKLOAD" ]]; then
    NAME="$(basename "$WORKLOAD" .toml)"
    SOURCE=(--workload "$WORKLOAD")
else
    NAME="twenty-at-once"
    SOURCE=(--preset twenty-at-once)
fi
mkdir -p "$OUT"

SERVER_PID=""
stop_server() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID"
        wait "$SERVER_PID" || true
    fi
    SERVER_PID=""
}
trap stop_server EXIT

wait_ready() {  # $1: health path
    for _ in $(seq 1 600); do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "the server exited while starting" >&2
            exit 1
        fi
        if [[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL$1")" == "200" ]]; then
            return
        fi
        sleep 0.2
    done
    echo "the server did not become ready" >&2
    exit 1
}

# Quanta with tenancy needs an API key: a throw-away database with one tenant.
QUANTA_STATE="$(mktemp -d -t quanta-bench-XXXXXX)"
export QUANTA_DATABASE_URL="sqlite+aiosqlite:///$QUANTA_STATE/quanta.db"
export QUANTA_DATA_DIR="$QUANTA_STATE/data"
export QUANTA_CONFIG=""  # no developer config leaks into a measurement
export QUANTA_MAX_RUNNING="$SLOTS"            # as many running as llama-server has slots
API_KEY=""
if "$QUANTA" tenants --help >/dev/null 2>&1; then
    "$QUANTA" migrate >&2
    API_KEY="$("$QUANTA" tenants create bench | sed -n 's/^api key (shown once): //p')"
fi

bench() {  # $1: run label
    local args=(bench run --url "$URL" "${SOURCE[@]}" --out "$OUT/$NAME-$1.json" --label "$NAME-$1")
    if [[ -n "$API_KEY" && "$1" == quanta-* ]]; then
        args+=(--api-key "$API_KEY")
    fi
    "$QUANTA" "${args[@]}"
}

run_quanta() {  # $1: policy
    "$QUANTA" run --port "$PORT" --model "$MODEL" --policy "$1" --n-ctx "$N_CTX" \
        --n-seq-max "$SLOTS" --threads "$THREADS" --log-level warning &
    SERVER_PID=$!
    wait_ready /readyz
    bench "quanta-$1"
    stop_server
}

run_llama_server() {  # $1: slots, $2: label
    local bin="${LLAMA_SERVER:-}"
    if [[ -z "$bin" ]]; then
        bin="$("$ROOT/scripts/build_llama_server.sh" | tail -n 1)"
    fi
    # --kv-unified: one KV buffer shared by all slots, as Quanta's engine runs it.
    "$bin" -m "$MODEL" -c "$N_CTX" -np "$1" -t "$THREADS" -tb "$THREADS" --kv-unified \
        --host 127.0.0.1 --port "$PORT" --no-webui --log-disable &
    SERVER_PID=$!
    wait_ready /health
    bench "$2"
    stop_server
}

for run in $RUNS; do
    case "$run" in
        quanta-sequential) run_quanta sequential ;;
        quanta-fcfs) run_quanta fcfs ;;
        llama-server-np1) run_llama_server 1 llama-server-np1 ;;
        llama-server) run_llama_server "$SLOTS" llama-server ;;
        *) echo "unknown run: $run" >&2; exit 2 ;;
    esac
done

compare() {
    if [[ -f "$OUT/$NAME-$1.json" && -f "$OUT/$NAME-$2.json" ]]; then
        "$QUANTA" bench compare "$OUT/$NAME-$1.json" "$OUT/$NAME-$2.json"
    fi
}
compare quanta-sequential quanta-fcfs
compare llama-server-np1 quanta-sequential
compare llama-server quanta-fcfs
rm -rf "$QUANTA_STATE"
