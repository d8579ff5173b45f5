#!/usr/bin/env bash
# Issue 8's fidelity experiment: the same workload run for real (`quanta bench run` against
# `quanta run --policy P`) and simulated (`quanta sim` with the calibrated cost model), for
# sequential, static and fcfs at three loads; then the relative error of the simulation in
# throughput, mean and p99 TTFT and mean inter-token latency (scripts/fidelity_table.py).
#
#   scripts/bench_fidelity.sh
#   POLICIES=fcfs LOADS="light:0.5" REQUESTS=8 scripts/bench_fidelity.sh    # a quick try
#
# The workload: REQUESTS requests of 64-token prompts and 64-token answers (completions, token
# ids, ignore-EOS), Poisson arrivals at the load's rate. fcfs serves about 0.8 requests/s of
# these on the 2-core machine (bench/results/fairness/capacity-fcfs.json), so the loads are
# ~0.6x, 1x and 1.5x of that; each real run takes 1-2 minutes.
# Each real run: a fresh throw-away database, one tenant and key (`quanta tenants create`),
# `quanta run --policy P` with no developer config (QUANTA_CONFIG points nowhere; the
# simulation is given the same), `quanta bench run`, the server stopped.
# Run it on a quiet machine: nothing else should use the CPU while it measures.
#
# Environment (defaults in brackets):
#   MODEL       GGUF file                             [quanta's default model]
#   COST_MODEL  cost model JSON                       [quanta sim's default: config/cost_models/]
#   THREADS     llama.cpp threads                     [2]
#   PORT        port of the server under test         [8092]
#   OUT         results directory                     [bench/results/fidelity]
#   POLICIES    policies                              [sequential static fcfs]
#   LOADS       name:requests_per_s pairs             [light:0.5 medium:0.8 heavy:1.2]
#   REQUESTS    requests per run                      [60]
#   SKIP_REAL   1: only simulate (reuse real-*.json)  [0]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
QUANTA="$ROOT/.venv/bin/quanta"

MODEL="${MODEL:-$("$PY" -c 'from app.settings import default_model_path; print(default_model_path())')}"
THREADS="${THREADS:-2}"
PORT="${PORT:-8092}"
OUT="${OUT:-bench/results/fidelity}"
POLICIES="${POLICIES:-sequential static fcfs}"
LOADS="${LOADS:-light:0.5 medium:0.8 heavy:1.2}"
REQUESTS="${REQUESTS:-60}"
SKIP_REAL="${SKIP_REAL:-0}"
URL="http://127.0.0.1:$PORT"
export COLUMNS="${COLUMNS:-200}"
export QUANTA_CONFIG=/nonexistent/quanta.toml  # the same (default) settings, real and simulated
mkdir -p "$OUT"
COST_FLAG=()
if [[ -n "${COST_MODEL:-}" ]]; then
    COST_FLAG=(--cost-model "$COST_MODEL")
fi

# shellcheck source=scripts/lib_server.sh
source "$ROOT/scripts/lib_server.sh"
trap stop_quanta_server EXIT

workload() {  # $1 load name, $2 rate, $3 file
    cat >"$3" <<EOF
name = "fidelity-$1"
seed = 11
requests = $REQUESTS
rate = $2
endpoint = "completions"
ignore_eos = true
[[tenants]]
name = "fid"
class = "interactive"
prompt = 64
output = 64
EOF
}

real() {  # $1 policy, $2 load name, $3 workload file
    STATE="$(mktemp -d -t quanta-fid-XXXXXX)"
    export QUANTA_DATABASE_URL="sqlite+aiosqlite:///$STATE/quanta.db"
    export QUANTA_DATA_DIR="$STATE/data"
    "$QUANTA" migrate >/dev/null
    local key
    key="$("$QUANTA" tenants create fid | sed -n 's/^api key (shown once): //p')"
    echo "=== real: $1 at $2 ===" >&2
    "$QUANTA" run --port "$PORT" --model "$MODEL" --policy "$1" --threads "$THREADS" \
        --log-level warning &
    SERVER_PID=$!
    wait_ready
    "$QUANTA" bench run --url "$URL" --workload "$3" --api-key "$key" \
        --out "$OUT/real-$1-$2.json" --label "real-$1-$2" --quiet --no-plots \
        || echo "bench: real-$1-$2 had failed requests (see the table above)" >&2
    stop_quanta_server
}

for load in $LOADS; do
    name="${load%%:*}" rate="${load##*:}"
    file="$OUT/workload-$name.toml"
    workload "$name" "$rate" "$file"
    for policy in $POLICIES; do
        if [[ "$SKIP_REAL" != 1 ]]; then
            real "$policy" "$name" "$file"
        fi
        echo "=== simulated: $policy at $name ===" >&2
        "$QUANTA" sim --workload "$file" --policy "$policy" "${COST_FLAG[@]}" \
            --out "$OUT/sim-$policy-$name.json" --label "sim-$policy-$name" >/dev/null
        if [[ -f "$OUT/real-$policy-$name.json" ]]; then
            "$QUANTA" bench compare "$OUT/real-$policy-$name.json" "$OUT/sim-$policy-$name.json"
        fi
    done
done

"$PY" -m scripts.fidelity_table "$OUT"
