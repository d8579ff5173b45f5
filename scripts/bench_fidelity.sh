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
# `quanta run --policy P` with no developer config (QUANTA_CONFIG is empty; the
# simulation is given the same), `quanta bench run`, the server stopped.
# Each real run is bracketed by the reference probe (`quanta calibrate --probe-only`, the
# engine alone, the same threads): right before the server starts and right after it stops.
# This VM's speed drifts by ±30 % over minutes; the mean of the two speed factors (the probe's
# time now / at the cost model's calibration) goes to that run's `quanta sim --speed-factor`,
# and both are kept in $OUT/probe-<policy>-<load>.json. The cost model must have been
# calibrated with the probe (`quanta calibrate`, not an older one).
# Each real server writes a step trace ($OUT/steps-<policy>-<load>.jsonl, not committed), and
# `quanta step-report` compares its engine steps with the cost model at the run's speed factor
# ($OUT/steps-<policy>-<load>.json): the engine's error apart from the server's time. A second
# simulation ($OUT/sim-inrun-<policy>-<load>.json) is given the machine as that trace saw it:
# per 10 s of the run, the speed factor that makes the model's time over those steps the
# engine's (`quanta sim --speed-profile`: the VM's speed drifts within a run too), and the
# server's time per cycle; what it misses then is the simulator's, not the machine's drift.
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
#               (and probe-*.json; the step traces, where kept, read again against the cost
#               model in use: SKIP_REAL=1 COST_MODEL=other.json re-judges the same runs)
#   REPLAY      1: after each real run, its steps again on the engine alone    [0]
#               (quanta step-replay: $OUT/replay-<policy>-<load>.json, served / alone)
#   SERVER_COST the server's own time per step    [bench/results/fidelity/server_cost.json]
#               (scripts/fidelity_server_cost.py over the step traces of the set of 12:57:
#               0.66 ms per cycle + 0.12 ms per streamed token; none: 0). A set's own
#               traces give the next set's: python -m scripts.fidelity_server_cost \
#               NEXT.json "$OUT"/steps-*.jsonl (a set simulated with its own server time
#               would take something from its runs)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
QUANTA="$ROOT/.venv/bin/quanta"

MODEL="${MODEL:-$("$PY" -c 'from app.server.settings import default_model_path; print(default_model_path())')}"
THREADS="${THREADS:-2}"
PORT="${PORT:-8092}"
OUT="${OUT:-bench/results/fidelity}"
POLICIES="${POLICIES:-sequential static fcfs}"
LOADS="${LOADS:-light:0.5 medium:0.8 heavy:1.2}"
REQUESTS="${REQUESTS:-60}"
SKIP_REAL="${SKIP_REAL:-0}"
REPLAY="${REPLAY:-0}"
URL="http://127.0.0.1:$PORT"
export COLUMNS="${COLUMNS:-200}"
export QUANTA_CONFIG=""  # the same (default) settings, real and simulated
mkdir -p "$OUT"
SERVER_COST="${SERVER_COST:-bench/results/fidelity/server_cost.json}"
SERVER_FLAG=()
if [[ -f "$SERVER_COST" ]]; then
    read -r CYCLE_MS TOKEN_MS < <("$PY" -c 'import json, sys
c = json.load(open(sys.argv[1])).get("server_cost") or {}
print(c.get("per_cycle_ms", 0.0), c.get("per_token_ms", 0.0))' "$SERVER_COST")
    SERVER_FLAG=(--server-cycle-ms "$CYCLE_MS" --server-token-ms "$TOKEN_MS")
    echo "server cost from $SERVER_COST: $CYCLE_MS ms per cycle + $TOKEN_MS ms per stream" >&2
fi
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

probe() {  # $1 probe file: the reference probe on the engine alone, and its speed factor
    "$QUANTA" calibrate --probe-only --model "$MODEL" --threads "$THREADS" "${COST_FLAG[@]}" \
        --out "$1" >/dev/null
    "$PY" - "$1" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
if doc["speed_factor"] is None:
    sys.exit(f"{doc['cost_model'] or 'the cost model'} has no reference probe: "
             "calibrate it again (`quanta calibrate`) before measuring fidelity")
print(f"probe: {doc['total_s']:.3f} s, speed factor {doc['speed_factor']:.3f}", file=sys.stderr)
EOF
}

probe_pair() {  # $1 before, $2 after, $3 the pair's file (the two kept inside it)
    "$PY" - "$1" "$2" "$3" <<'EOF'
import json, sys
before, after = (json.load(open(p)) for p in sys.argv[1:3])
factor = (before["speed_factor"] + after["speed_factor"]) / 2
doc = {"speed_factor": factor, "before": before, "after": after}
open(sys.argv[3], "w").write(json.dumps(doc, indent=1) + "\n")
EOF
    rm -f "$1" "$2"
}

speed_factor_of() {  # $1 a probe pair's file: its mean probe time over the cost model's
    # Against the cost model in use, not the one the probes were compared with when measured:
    # SKIP_REAL=1 COST_MODEL=other.json simulates the same runs with another calibration.
    "$PY" - "$1" "${COST_MODEL:-}" <<'EOF'
import json, sys
from pathlib import Path
from app.lab.calibrate.probe import speed_factor
from app.lab.sim.command import default_cost_model_path
from quanta_core.sim.cost_model import CostModel
pair = json.load(open(sys.argv[1]))
model = CostModel.load(Path(sys.argv[2]) if sys.argv[2] else default_cost_model_path())
print(speed_factor((pair["before"]["total_s"] + pair["after"]["total_s"]) / 2, model))
EOF
}

server_cycle_ms_of() {  # $1 a step report: the server's ms per cycle
    "$PY" -c 'import json, sys
print(1e3 * json.load(open(sys.argv[1]))["in_run"]["server_cycle_s"])' "$1"
}

real() {  # $1 policy, $2 load name, $3 workload file
    probe "$OUT/probe-$1-$2.before.json"
    STATE="$(mktemp -d -t quanta-fid-XXXXXX)"
    export QUANTA_DATABASE_URL="sqlite+aiosqlite:///$STATE/quanta.db"
    export QUANTA_DATA_DIR="$STATE/data"
    "$QUANTA" migrate >/dev/null
    local key
    key="$("$QUANTA" tenants create fid | sed -n 's/^api key (shown once): //p')"
    echo "=== real: $1 at $2 ===" >&2
    QUANTA_STEP_TRACE="$OUT/steps-$1-$2.jsonl" \
        "$QUANTA" run --port "$PORT" --model "$MODEL" --policy "$1" --threads "$THREADS" \
        --log-level warning &
    SERVER_PID=$!
    wait_ready
    "$QUANTA" bench run --url "$URL" --workload "$3" --api-key "$key" \
        --out "$OUT/real-$1-$2.json" --label "real-$1-$2" --quiet --no-plots \
        || echo "bench: real-$1-$2 had failed requests (see the table above)" >&2
    stop_quanta_server
    if [[ "$REPLAY" == 1 ]]; then
        echo "=== replayed on the engine alone: $1 at $2 ===" >&2
        QUANTA_MODEL_PATH="$MODEL" QUANTA_THREADS="$THREADS" \
            "$QUANTA" step-replay "$OUT/steps-$1-$2.jsonl" --out "$OUT/alone-$1-$2.jsonl" \
            --report "$OUT/replay-$1-$2.json"
    fi
    probe "$OUT/probe-$1-$2.after.json"
    probe_pair "$OUT/probe-$1-$2.before.json" "$OUT/probe-$1-$2.after.json" \
        "$OUT/probe-$1-$2.json"
}

step_report() {  # $1 policy, $2 load name: the run's step trace against the cost model in use
    "$QUANTA" step-report "$OUT/steps-$1-$2.jsonl" "${COST_FLAG[@]}" \
        --speed-factor "$(speed_factor_of "$OUT/probe-$1-$2.json")" --out "$OUT/steps-$1-$2.json"
}

for load in $LOADS; do
    name="${load%%:*}" rate="${load##*:}"
    file="$OUT/workload-$name.toml"
    workload "$name" "$rate" "$file"
    for policy in $POLICIES; do
        if [[ "$SKIP_REAL" != 1 ]]; then
            real "$policy" "$name" "$file"
        fi
        if [[ -f "$OUT/steps-$policy-$name.jsonl" && -f "$OUT/probe-$policy-$name.json" ]]; then
            step_report "$policy" "$name"  # again with SKIP_REAL: the cost model may be new
        fi
        SPEED_FLAG=()
        if [[ -f "$OUT/probe-$policy-$name.json" ]]; then
            SPEED_FLAG=(--speed-factor "$(speed_factor_of "$OUT/probe-$policy-$name.json")")
        else
            echo "no $OUT/probe-$policy-$name.json: simulated at the calibration's speed" >&2
        fi
        echo "=== simulated: $policy at $name ${SPEED_FLAG[*]} ===" >&2
        "$QUANTA" sim --workload "$file" --policy "$policy" "${COST_FLAG[@]}" \
            "${SPEED_FLAG[@]}" "${SERVER_FLAG[@]}" \
            --out "$OUT/sim-$policy-$name.json" --label "sim-$policy-$name" \
            >/dev/null
        if [[ -f "$OUT/real-$policy-$name.json" ]]; then
            "$QUANTA" bench compare "$OUT/real-$policy-$name.json" "$OUT/sim-$policy-$name.json"
        fi
        if [[ -f "$OUT/steps-$policy-$name.json" ]]; then
            report="$OUT/steps-$policy-$name.json"
            echo "=== simulated: $policy at $name as the run saw the machine ===" >&2
            "$QUANTA" sim --workload "$file" --policy "$policy" "${COST_FLAG[@]}" \
                --speed-profile "$report" --server-cycle-ms "$(server_cycle_ms_of "$report")" \
                --out "$OUT/sim-inrun-$policy-$name.json" --label "sim-inrun-$policy-$name" \
                >/dev/null
        fi
    done
done

"$PY" -m scripts.fidelity_table "$OUT"
