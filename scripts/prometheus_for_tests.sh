#!/usr/bin/env bash
# Prometheus from Debian's packages, for the test that evaluates the Grafana dashboard's
# queries against a running server (tests/test_grafana_dashboard.py). Exits non-zero (printing
# why) where it cannot install it; that test then checks each query's series by a scrape
# alone. Used by .ci/run; safe to run again.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if command -v prometheus >/dev/null; then
    exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "no Prometheus and no way to install one" >&2
    exit 1
fi
timeout 600 apt-get update -qq >&2
timeout 900 apt-get install -y -qq --no-install-recommends prometheus >&2
