#!/usr/bin/env bash
# guidellm and aiperf, the load tools people already run, as real clients of Quanta and of
# llama.cpp's llama-server, beside `quanta bench`: the same model, the same workload (8
# concurrent users, 128-token prompts, 128-token answers with ignore-EOS, streamed from
# /v1/completions), one server at a time, the tools in turns against each.
#
#   scripts/bench_clients.sh          # writes bench/results/clients/, prints the table
#
# The tools are pinned and installed on demand into venvs of their own (never the project's):
# guidellm 0.8.1 and aiperf 0.13.0. Their tokenizer is the default model's own, taken from its
# GGUF file by transformers (with the gguf package) and kept in a private Hugging Face cache
# under a local name; the tools run with HF_HUB_OFFLINE=1, so nothing is downloaded.
# Each tool's CPU time is taken with /usr/bin/time: on a small machine the client competes
# with the server for the cores, and that bounds how far the tools' figures can agree.
#
# Environment (defaults in brackets):
#   DURATION   seconds of load for guidellm and aiperf                   [60]
#   USERS      concurrent streams                                        [8]
#   SERVERS    which servers, space-separated                            [quanta llama-server]
#   TOOLS      which clients, space-separated                  [quanta-bench guidellm aiperf]
#   N_CTX      KV cells, on both servers                                 [8192, Quanta's default]
#   SLOTS      llama-server -np (Quanta: its default max_running)        [16]
#   THREADS    llama.cpp threads, on both servers                        [nproc]
#   PORT       port of the server under test                             [8092]
#   CLIENTS_DIR  where the tools' venvs and tokenizer cache live   [~/.cache/quanta/clients]
#   LLAMA_SERVER the binary; empty: built by scripts/build_llama_server.sh  [empty]
#   OUT        results directory                                         [bench/results/clients]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-$ROOT/.venv/bin/python}"
QUANTA="${QUANTA:-$ROOT/.venv/bin/quanta}"
DURATION="${DURATION:-60}"
USERS="${USERS:-8}"
SERVERS="${SERVERS:-quanta llama-server}"
TOOLS="${TOOLS:-quanta-bench guidellm aiperf}"
N_CTX="${N_CTX:-8192}"
SLOTS="${SLOTS:-16}"
THREADS="${THREADS:-$(nproc)}"
SLO_CLASS="${SLO_CLASS:-batch}"
PORT="${PORT:-8092}"
CLIENTS_DIR="${CLIENTS_DIR:-$HOME/.cache/quanta/clients}"
OUT="${OUT:-bench/results/clients}"
URL="http://127.0.0.1:$PORT"
WORKLOAD=bench/workloads/clients_8_users.toml
ISL=128
OSL=128
GUIDELLM="$CLIENTS_DIR/guidellm-0.8.1"
AIPERF="$CLIENTS_DIR/aiperf-0.13.0"
HF="$CLIENTS_DIR/hf"
TOKENIZER_NAME="quanta/smollm2-tokenizer"
MODEL="$("$PY" -c 'from app.server.settings import default_model_path; print(default_model_path())')"
MODEL_ID="$(basename "$MODEL" .gguf)"
mkdir -p "$OUT" "$CLIENTS_DIR"

install_tools() {
    if [[ ! -x "$GUIDELLM/bin/guidellm" ]]; then
        python3 -m venv "$GUIDELLM"
        "$GUIDELLM/bin/pip" install --quiet guidellm==0.8.1 gguf==0.19.0
    fi
    if [[ ! -x "$AIPERF/bin/aiperf" ]]; then
        python3 -m venv "$AIPERF"
        "$AIPERF/bin/pip" install --quiet aiperf==0.13.0
    fi
    # The tokenizer, from the GGUF, as a snapshot in a Hugging Face cache of our own: aiperf
    # offline resolves names only through the cache; guidellm is given the snapshot's path.
    local repo="$HF/hub/models--${TOKENIZER_NAME/\//--}"
    local snap="$repo/snapshots/local"
    if [[ ! -f "$snap/tokenizer.json" ]]; then
        mkdir -p "$snap" "$repo/refs" && printf local >"$repo/refs/main"
        HF_HUB_OFFLINE=1 "$GUIDELLM/bin/python" -c "
import sys
from pathlib import Path
from transformers import AutoTokenizer
model = Path(sys.argv[1])
AutoTokenizer.from_pretrained(model.parent, gguf_file=model.name).save_pretrained(sys.argv[2])
" "$MODEL" "$snap"
    fi
    TOKENIZER_PATH="$snap"
}

SERVER_PID=""
stop_server() {  # a server that does not stop within 30 s of SIGTERM is killed
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID"
        for _ in $(seq 1 150); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.2
        done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
}
trap stop_server EXIT

wait_ready() {
    for _ in $(seq 1 600); do
        kill -0 "$SERVER_PID" 2>/dev/null || { echo "the server exited while starting" >&2; exit 1; }
        [[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" == "200" ]] && return
        sleep 0.2
    done
    echo "the server did not become ready" >&2
    exit 1
}

timed() {  # $1: file for "user sys wall" seconds; the rest: the command
    local file="$1"
    shift
    /usr/bin/time -o "$file" -f "%U %S %e" "$@"
}

run_tool() {  # $1: server label, $2: tool
    local tag="$1-$2" key=()
    case "$2" in
        guidellm)
            local backend="kind=openai_http,target=$URL,model=$MODEL_ID,request_format=/v1/completions"
            [[ -n "$API_KEY" && "$1" == quanta ]] && backend+=",api_key=$API_KEY"
            HF_HOME="$HF" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 timed "$OUT/$tag.time" \
                "$GUIDELLM/bin/guidellm" run --backend "$backend" \
                --profile "kind=concurrent,streams=$USERS" \
                --constraint "kind=max_duration,seconds=$DURATION" \
                --tokenizer "kind=huggingface_auto,model=$TOKENIZER_PATH" \
                --data "kind=synthetic_text,prompt_tokens=$ISL,output_tokens=$OSL" \
                --output "kind=json,path=$OUT/$tag.json" --disable-console-interactive \
                >"$OUT/$tag.log" 2>&1
            ;;
        aiperf)
            [[ -n "$API_KEY" && "$1" == quanta ]] && key=(--api-key "$API_KEY")
            rm -rf "/tmp/quanta-aiperf-$tag"
            HF_HOME="$HF" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 timed "$OUT/$tag.time" \
                "$AIPERF/bin/aiperf" profile --model "$MODEL_ID" --url "$URL" "${key[@]}" \
                --endpoint-type completions --streaming --concurrency "$USERS" \
                --benchmark-duration "$DURATION" --isl "$ISL" --osl "$OSL" \
                --extra-inputs ignore_eos:true --tokenizer "$TOKENIZER_NAME" \
                --artifact-dir "/tmp/quanta-aiperf-$tag" --ui-type simple >"$OUT/$tag.log" 2>&1
            cp "/tmp/quanta-aiperf-$tag/profile_export_aiperf.json" "$OUT/$tag.json"
            ;;
        quanta-bench)
            [[ -n "$API_KEY" && "$1" == quanta ]] && key=(--api-key "$API_KEY")
            timed "$OUT/$tag.time" "$QUANTA" bench run --url "$URL" --workload "$WORKLOAD" \
                "${key[@]}" --out "$OUT/$tag.json" --label "$tag" --no-plots --quiet \
                >"$OUT/$tag.log" 2>&1
            ;;
        *) echo "unknown tool: $2" >&2; exit 2 ;;
    esac
}

install_tools
STATE="$(mktemp -d -t quanta-clients-XXXXXX)"
export QUANTA_DATABASE_URL="sqlite+aiosqlite:///$STATE/quanta.db"
export QUANTA_DATA_DIR="$STATE/data"
export QUANTA_CONFIG=""  # no developer config leaks into a measurement
"$QUANTA" migrate >/dev/null 2>&1
# The tools keep USERS streams busy back to back: a batch workload. An interactive key is
# refused (503, retry-after) whenever its first token is projected past the 2 s target, and
# the tools send again at once and count each refusal as an error. SLO_CLASS=interactive
# measures that.
API_KEY="$("$QUANTA" tenants create clients --slo-class "$SLO_CLASS" --quiet)"

start_server() {  # $1: server; a fresh one for every tool, so no run inherits another's state
    case "$1" in
        quanta)  # its defaults, but for the threads (as llama-server's)
            "$QUANTA" run --port "$PORT" --threads "$THREADS" --n-ctx "$N_CTX" \
                --log-level warning >>"$OUT/quanta-server.log" 2>&1 &
            ;;
        llama-server)
            bin="${LLAMA_SERVER:-$("$ROOT/scripts/build_llama_server.sh" | tail -n 1)}"
            # --kv-unified: one KV buffer shared by all slots, as Quanta's engine runs it.
            "$bin" -m "$MODEL" -c "$N_CTX" -np "$SLOTS" -t "$THREADS" -tb "$THREADS" \
                --kv-unified --host 127.0.0.1 --port "$PORT" --no-webui --log-disable \
                >>"$OUT/llama-server-server.log" 2>&1 &
            ;;
        *) echo "unknown server: $1" >&2; exit 2 ;;
    esac
    SERVER_PID=$!
    wait_ready
}

rm -f "$OUT"/*-server.log
for server in $SERVERS; do
    for tool in $TOOLS; do
        echo "$server · $tool · load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
        start_server "$server"
        run_tool "$server" "$tool" || echo "$server · $tool failed (see $OUT/$server-$tool.log)" >&2
        stop_server
    done
done
rm -rf "$STATE"
"$PY" scripts/clients_table.py "$OUT"
