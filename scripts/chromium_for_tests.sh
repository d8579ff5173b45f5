#!/usr/bin/env bash
# Headless Chromium and its driver from Debian's packages, for the live view's browser test
# (tests/test_live_view_browser.py). Exits non-zero (printing why) where it cannot install
# them; that test is then skipped. Used by .ci/run; safe to run again.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "no Chromium and no way to install one" >&2
    exit 1
fi
timeout 600 apt-get update -qq >&2
timeout 900 apt-get install -y -qq chromium chromium-driver >&2
