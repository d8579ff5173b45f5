#!/usr/bin/env bash
# Issue 7's "It must show", measured with `quanta bench` against the real server:
#
#   1a fairness_long_short          equal weights, long vs short prompts      fcfs vs vtc
#   1b fairness_weights             weights 1:2                               fcfs vs vtc
#   2  interactive_vs_batch_flood   interactive at a modest rate, batch flood  fcfs vs slo
#   3  overload_2x                  interactive load at ~2x capacity           fcfs vs slo
#
#   scripts/bench_fairness.sh
#   RUNS="overload_2x:slo overload_2x:fcfs" scripts/bench_fairness.sh
#   RUNS=capacity scripts/bench_fairness.sh      # capacity for 64+64-token requests (fcfs)
#
# Each run: a fresh throw-away database, `quanta run --policy P`, the workload's tenants
# created through the admin API (name, weight; one key with the tenant's SLO class), a temp
# copy of the workload with those keys filled in, `quanta bench run`, the server stopped.
# Writes $OUT/<scenario>-<policy>.json (+ .cdf/.ttft/.service/.tokens.png); for overload_2x
# also <scenario>-<policy>.probe.json: a side probe (one request every PROBE_S seconds)
# recording each answer's status, time to the response headers and its retry-after (the bench
# rows keep the status and timing but not the headers). At the end: `quanta bench compare` for
# each pair, and the key figures of every run ($OUT/figures.json, printed).
#
# Run it on a quiet machine: nothing else should use the CPU while it measures.
#
# Environment (defaults in brackets):
#   MODEL      GGUF file                                  [quanta's default model]
#   THREADS    llama.cpp threads                          [2]
#   PORT       port of the server under test              [8091]
#   OUT        results directory                          [bench/results/fairness]
#   RUNS       scenario:policy pairs, space-separated     [all eight, scenario 1 first]
#   PROBE_S    overload probe period (s)                  [1.0]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
QUANTA="$ROOT/.venv/bin/quanta"

MODEL="${MODEL:-$("$PY" -c 'from app.server.settings import default_model_path; print(default_model_path())')}"
THREADS="${THREADS:-2}"
PORT="${PORT:-8091}"
OUT="${OUT:-bench/results/fairness}"
PROBE_S="${PROBE_S:-1.0}"
RUNS="${RUNS:-fairness_long_short:fcfs fairness_long_short:vtc fairness_weights:fcfs fairness_weights:vtc interactive_vs_batch_flood:fcfs interactive_vs_batch_flood:slo overload_2x:fcfs overload_2x:slo}"
URL="http://127.0.0.1:$PORT"
export COLUMNS="${COLUMNS:-200}"  # the bench tables, unwrapped in a log
mkdir -p "$OUT"

# shellcheck source=scripts/lib_server.sh
source "$ROOT/scripts/lib_server.sh"
PROBE_PID=""
stop_server() {
    if [[ -n "$PROBE_PID" ]] && kill -0 "$PROBE_PID" 2>/dev/null; then
        kill -TERM "$PROBE_PID" || true
        wait "$PROBE_PID" || true
    fi
    PROBE_PID=""
    stop_quanta_server
}
trap stop_server EXIT

# Creates the workload's tenants through the admin API and writes a copy of the workload
# with each tenant's api_key filled in. Prints one key (the first tenant's) for the probe.
setup_tenants() {  # $1 workload, $2 output copy
    "$PY" - "$URL" "$QUANTA_ADMIN_KEY" "$1" "$2" <<'EOF'
import re, sys, tomllib, httpx
url, admin, src, dst = sys.argv[1:5]
text = open(src).read()
spec = tomllib.loads(text)
h = {"Authorization": f"Bearer {admin}"}
keys = []
with httpx.Client(base_url=url, headers=h, timeout=10) as c:
    for t in spec["tenants"]:
        r = c.post("/admin/v1/tenants", json={"name": t["name"], "weight": float(t.get("weight", 1.0))})
        r.raise_for_status()
        tid = r.json()["id"]
        r = c.post(f"/admin/v1/tenants/{tid}/keys",
                   json={"name": t["name"], "slo_class": t.get("class", "interactive")})
        r.raise_for_status()
        keys.append(r.json()["value"])
# Drop any api_key line (placeholder or not), then put one right after each [[tenants]].
lines = [l for l in text.splitlines() if not re.match(r"^\s*#?\s*api_key\s*=", l)]
out, k = [], 0
for l in lines:
    out.append(l)
    if l.strip() == "[[tenants]]":
        out.append(f'api_key = "{keys[k]}"')
        k += 1
assert k == len(keys)
open(dst, "w").write("\n".join(out) + "\n")
print(keys[0])
EOF
}

# The overload probe: one streaming request every PROBE_S seconds (the workload's shape),
# recording status, time to the response headers, retry-after; an admitted probe is closed
# after its headers (the server cancels it), so it adds little load.
probe() {  # $1 api key, $2 output file
    "$PY" - "$URL" "$1" "$2" "$PROBE_S" <<'EOF' &
import json, random, signal, sys, time, httpx
url, key, dst, period = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
rows, stop = [], False
def done(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, done)
body = {"model": "m", "prompt": [random.randrange(200, 20000) for _ in range(64)], "max_tokens": 64, "stream": True, "ignore_eos": True}
models = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
body["model"] = models["data"][0]["id"]
with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as c:
    while not stop:
        t0 = time.perf_counter()
        try:
            with c.stream("POST", url + "/v1/completions", json=body) as r:
                dt = time.perf_counter() - t0
                rows.append({"t": t0, "status": r.status_code, "headers_s": dt,
                             "retry_after": r.headers.get("retry-after"),
                             "retry_after_ms": r.headers.get("retry-after-ms"),
                             "body": r.read().decode()[:300] if r.status_code != 200 else None})
        except httpx.HTTPError as e:
            rows.append({"t": t0, "status": None, "error": str(e)})
        time.sleep(max(0.0, period - (time.perf_counter() - t0)))
json.dump(rows, open(dst, "w"), indent=1)
EOF
    PROBE_PID=$!
}

run() {  # $1 scenario, $2 policy
    local scenario="$1" policy="$2" workload="bench/workloads/$1.toml"
    STATE="$(mktemp -d -t quanta-fair-XXXXXX)"
    export QUANTA_DATABASE_URL="sqlite+aiosqlite:///$STATE/quanta.db"
    export QUANTA_DATA_DIR="$STATE/data"
    export QUANTA_CONFIG=""  # no developer config leaks into a measurement
    export QUANTA_ADMIN_KEY="admin-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    "$QUANTA" migrate >/dev/null
    echo "=== $scenario under $policy ===" >&2
    "$QUANTA" run --port "$PORT" --model "$MODEL" --policy "$policy" --threads "$THREADS" \
        --log-level warning &
    SERVER_PID=$!
    wait_ready
    local key
    key="$(setup_tenants "$workload" "$STATE/workload.toml")"
    if [[ "$scenario" == overload_2x ]]; then
        probe "$key" "$OUT/$scenario-$policy.probe.json"
    fi
    # Every tenant sends with its own key (the copy's api_key); --api-key (the first tenant's)
    # only lets the bench read /v1/models. The bench exits non-zero when requests failed,
    # rejections included: that is a figure here, not an error of the script.
    "$QUANTA" bench run --url "$URL" --workload "$STATE/workload.toml" --api-key "$key" \
        --out "$OUT/$scenario-$policy.json" --label "$scenario-$policy" --quiet \
        || echo "bench: $scenario-$policy had failed requests (see the table above)" >&2
    stop_server
}

# Capacity for 64-token prompts and 64-token answers (the overload workload's requests):
# 40 at once, fcfs; requests/s of the run is what the machine serves.
capacity() {
    STATE="$(mktemp -d -t quanta-fair-XXXXXX)"
    export QUANTA_DATABASE_URL="sqlite+aiosqlite:///$STATE/quanta.db"
    export QUANTA_DATA_DIR="$STATE/data"
    export QUANTA_CONFIG=""
    "$QUANTA" migrate >/dev/null
    local key
    key="$("$QUANTA" tenants create cap | sed -n 's/^api key (shown once): //p')"
    "$QUANTA" run --port "$PORT" --model "$MODEL" --policy fcfs --threads "$THREADS" \
        --log-level warning &
    SERVER_PID=$!
    wait_ready
    cat >"$STATE/cap.toml" <<'EOF'
name = "capacity-64-64"
seed = 1
requests = 40
rate = "inf"
endpoint = "completions"
ignore_eos = true
[[tenants]]
name = "cap"
class = "interactive"
prompt = 64
output = 64
EOF
    "$QUANTA" bench run --url "$URL" --workload "$STATE/cap.toml" --api-key "$key" \
        --out "$OUT/capacity-fcfs.json" --label capacity-fcfs --quiet --no-plots || true
    stop_server
}

for r in $RUNS; do
    if [[ "$r" == capacity ]]; then
        capacity
    else
        run "${r%%:*}" "${r##*:}"
    fi
done

for pair in fairness_long_short:fcfs:vtc fairness_weights:fcfs:vtc \
    interactive_vs_batch_flood:fcfs:slo overload_2x:fcfs:slo; do
    IFS=: read -r s a b <<<"$pair"
    if [[ -f "$OUT/$s-$a.json" && -f "$OUT/$s-$b.json" ]]; then
        echo "=== $s: $a vs $b ==="
        "$QUANTA" bench compare "$OUT/$s-$a.json" "$OUT/$s-$b.json"
    fi
done

# The key figures of every run, for the README: cumulative service difference over the span in
# which both tenants were backlogged (and its growth), Jain's index on the weighted service,
# per-class p99 TTFT / ITL vs targets, batch deadline, rejection latency and retry-after, goodput.
"$PY" - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
figures = {}
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    name = os.path.basename(path)[:-5]
    if name.endswith(".probe") or name == "figures":
        continue
    d = json.load(open(path))
    if d.get("schema") != "quanta.bench/1":
        continue
    s, rows = d["summary"], d["requests"]
    f = {"duration_s": round(s["duration_s"], 1)}
    o = s["overall"]
    f["overall"] = {k: o[k] for k in ("requests", "completed", "rejected", "failed", "good",
                                       "goodput_fraction", "goodput_per_s", "requests_per_s",
                                       "output_tokens_per_s")}
    for cls, c in s["classes"].items():
        f[cls] = {"requests": c["requests"], "completed": c["completed"],
                  "rejected": c["rejected"], "good": c["good"],
                  "goodput_fraction": c["goodput_fraction"],
                  "ttft_p99_ms": c["ttft"]["p99_ms"], "ttft_p50_ms": c["ttft"]["p50_ms"],
                  "itl_p99_ms": c["itl"]["p99_ms"], "tpot_p99_ms": c["tpot"]["p99_ms"],
                  "e2e_p99_ms": c["e2e"]["p99_ms"], "e2e_max_ms": c["e2e"]["max_ms"],
                  "targets": s["targets"].get(cls)}
    for cls, fr in s["fairness"].items():
        if fr.get("backlogged_windows"):
            f.setdefault("fairness", {})[cls] = {k: fr[k] for k in (
                "window_s", "backlogged_windows", "max_service_difference",
                "mean_service_difference", "mean_jain", "min_jain")}
    # Cumulative weighted service over the span in which both tenants were backlogged in the
    # scheduler's sense: each had a request waiting to start (sent, no first token yet). The
    # bench's own windows count a tenant as backlogged while it has any request outstanding,
    # which includes the tail where its last requests run and it cannot take more service.
    tenants = sorted({r["tenant"] for r in rows})
    if len(tenants) == 2 and all(r["slo_class"] == rows[0]["slo_class"] for r in rows):
        def first(r):
            return r["token_times"][0] if r["token_times"] else (r["finished"] or r["sent"])
        def queued(t, x):
            return any(r["tenant"] == t and r["sent"] <= x < first(r) for r in rows)
        events = {t: [] for t in tenants}
        for r in rows:
            if r["token_times"]:
                w = r["weight"]
                events[r["tenant"]].append((r["token_times"][0], r["prompt_tokens"] / w))
                events[r["tenant"]] += [(x, 2.0 / w) for x in r["token_times"]]
        def served(t, x):
            return sum(v for w, v in events[t] if w <= x)
        t0 = min(r["sent"] for r in rows)
        t1 = max(first(r) for r in rows)
        both = [t0 + k for k in range(int(t1 - t0) + 1) if all(queued(t, t0 + k) for t in tenants)]
        if both:
            a, b = both[0], both[-1]
            base = {t: served(t, a) for t in tenants}
            def diff(x):
                return (served(tenants[0], x) - base[tenants[0]]) - (served(tenants[1], x) - base[tenants[1]])
            got = {t: served(t, b) - base[t] for t in tenants}
            tot = sum(got.values())
            jain = tot * tot / (2 * sum(v * v for v in got.values())) if tot else None
            diffs = [abs(diff(x)) for x in both]
            f["backlogged_span"] = {
                "tenants": tenants,
                "from_s": round(a - t0), "to_s": round(b - t0),
                "weighted_service": {t: round(v) for t, v in got.items()},
                "share": {t: round(v / tot, 3) for t, v in got.items()} if tot else None,
                "jain": jain,
                "difference_max": round(max(diffs)),
                "difference_at_end": round(diffs[-1]),
                f"difference_every_10s ({tenants[0]} - {tenants[1]})":
                    [round(diff(x)) for x in both[::10]],
            }
    rej = [r for r in rows if r["status"] in (429, 503)]
    if rej:
        lat = sorted((r["finished"] - r["sent"]) * 1000 for r in rej if r["finished"] is not None)
        f["rejections"] = {"count": len(rej),
                           "by_status": {str(c): sum(1 for r in rej if r["status"] == c)
                                         for c in (429, 503)},
                           "latency_ms_p50": lat[len(lat) // 2] if lat else None,
                           "latency_ms_p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
                           "latency_ms_max": lat[-1] if lat else None,
                           "within_50ms": sum(1 for v in lat if v <= 50)}
        # The rows keep the body, not the headers: the retry-after of an "expected first token
        # in E s, over the target of T s" refusal is E - T (slo_admission.py), sent as
        # retry-after: ceil(E - T) and retry-after-ms; the probe records real headers.
        import math, re
        est = []
        for r in rej:
            m = re.search(r"in ([\d.]+) s, over the \w+ target of ([\d.]+) s", r["error"] or "")
            if m:
                est.append(float(m.group(1)) - float(m.group(2)))
        if est:
            est.sort()
            f["rejections"]["retry_after_s_from_message"] = {
                "count": len(est), "min": round(est[0], 2), "median": round(est[len(est) // 2], 2),
                "max": round(est[-1], 2),
                "header_values": sorted({max(1, math.ceil(e)) for e in est})}
    probe = os.path.join(out, name + ".probe.json")
    if os.path.exists(probe):
        p = json.load(open(probe))
        rj = [x for x in p if x.get("status") in (429, 503)]
        ra = sorted(float(x["retry_after_ms"]) / 1000 for x in rj if x.get("retry_after_ms"))
        hs = sorted(x["headers_s"] * 1000 for x in rj)
        f["probe"] = {"sent": len(p), "rejected": len(rj),
                      "with_retry_after": sum(1 for x in rj if x.get("retry_after")),
                      "retry_after_s_min": ra[0] if ra else None,
                      "retry_after_s_median": ra[len(ra) // 2] if ra else None,
                      "retry_after_s_max": ra[-1] if ra else None,
                      "reject_headers_ms_max": hs[-1] if hs else None,
                      "example": rj[0] if rj else None}
    figures[name] = f
json.dump(figures, open(os.path.join(out, "figures.json"), "w"), indent=1)
print(json.dumps(figures, indent=1))
EOF
