#!/usr/bin/env bash
# Issue 22 on the simulator: bench/sweeps/kv_burst.toml (fcfs vs horizon over KV pool sizes)
# for bursts of 12, 24 and 48 requests, then the plots (scripts/horizon_figures.py sim).
#
#   scripts/bench_horizon_sim.sh          # BURSTS="12 24 48" OUT=bench/results/horizon
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY=/work/main/.venv/bin/python
export PYTHONPATH="$ROOT"
OUT="${OUT:-bench/results/horizon}"
for n in ${BURSTS:-12 24 48}; do
    "$PY" -m app.cli sweep --grid bench/sweeps/kv_burst.toml --requests "$n" --jobs 1 \
        --no-plots --quiet --out "$OUT/sweep-burst$n"
done
"$PY" -m scripts.horizon_figures sim "$OUT"
