# Sourced by the benchmark scripts that run a throw-away `quanta run` (bench_fairness.sh,
# bench_fidelity.sh). They set URL, start the server in the background into SERVER_PID, keep
# its state directory in STATE, and call `wait_ready`, then `stop_quanta_server`.

SERVER_PID=""
STATE=""

stop_quanta_server() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID"
        wait "$SERVER_PID" || true
    fi
    SERVER_PID=""
    if [[ -n "$STATE" ]]; then
        rm -rf "$STATE"
    fi
    STATE=""
}

wait_ready() {
    for _ in $(seq 1 600); do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "the server exited while starting" >&2
            exit 1
        fi
        if [[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/readyz")" == "200" ]]; then
            return
        fi
        sleep 0.2
    done
    echo "the server did not become ready" >&2
    exit 1
}
