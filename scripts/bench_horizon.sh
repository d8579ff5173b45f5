#!/usr/bin/env bash
# Issue 22's real-server figure: the KV-bound burst (bench/workloads/kv_burst.toml) under
# `fcfs` and `horizon`, in turns, each on a fresh server with QUANTA_N_CTX=2048 and every
# other setting at its default; then scripts/horizon_figures.py reads the runs.
#
#   scripts/bench_horizon.sh                       # 2 turns: fcfs, horizon, fcfs, horizon
#   TURNS=1 POLICIES="horizon" scripts/bench_horizon.sh
#
# Environment: TURNS [2], POLICIES ["fcfs horizon"], N_CTX [2048], PORT [8093],
# OUT [bench/results/horizon], THREADS [2], WORKLOAD [bench/workloads/kv_burst.toml],
# LABEL [kv-burst] (the results' name: <LABEL>-<policy>-t<turn>.json).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY=/work/main/.venv/bin/python
export PYTHONPATH="$ROOT"
QUANTA=("$PY" -m app.cli)
TURNS="${TURNS:-2}"
POLICIES="${POLICIES:-fcfs horizon}"
N_CTX="${N_CTX:-2048}"
PORT="${PORT:-8093}"
THREADS="${THREADS:-2}"
OUT="${OUT:-bench/results/horizon}"
WORKLOAD="${WORKLOAD:-bench/workloads/kv_burst.toml}"
URL="http://127.0.0.1:$PORT"
export COLUMNS="${COLUMNS:-200}"
mkdir -p "$OUT"

# shellcheck source=scripts/lib_server.sh
source "$ROOT/scripts/lib_server.sh"
trap stop_quanta_server EXIT

run() {  # $1 policy, $2 turn
    local policy="$1" label="${LABEL:-kv-burst}-$1-t$2"
    STATE="$(mktemp -d -t quanta-horizon-XXXXXX)"
    export QUANTA_DATABASE_URL="sqlite+aiosqlite:///$STATE/quanta.db"
    export QUANTA_DATA_DIR="$STATE/data"
    export QUANTA_CONFIG=""  # no developer config leaks into a measurement
    export QUANTA_N_CTX="$N_CTX"
    "${QUANTA[@]}" migrate >/dev/null
    local key
    key="$("${QUANTA[@]}" tenants create burst | sed -n 's/^api key (shown once): //p')"
    echo "=== $label ===" >&2
    "${QUANTA[@]}" run --port "$PORT" --policy "$policy" --threads "$THREADS" \
        --log-level warning &
    SERVER_PID=$!
    wait_ready
    "${QUANTA[@]}" bench run --url "$URL" --workload "$WORKLOAD" --api-key "$key" \
        --out "$OUT/$label.json" --label "$label" --quiet --no-plots \
        || echo "bench: $label had failed requests" >&2
    curl -s "$URL/metrics" >"$OUT/$label.metrics.txt" || true
    stop_quanta_server
}

for turn in $(seq 1 "$TURNS"); do
    for policy in $POLICIES; do
        run "$policy" "$turn"
    done
done
if [[ "${LABEL:-kv-burst}" == kv-burst ]]; then
    "$PY" -m scripts.horizon_figures served "$OUT"
fi
