"""``quanta run`` starts cleanly and stops cleanly: SIGTERM lets in-flight streams finish."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import httpx
import pytest

from tests.server_process import start_server

pytestmark = pytest.mark.model


def test_sigterm_drains_in_flight_streams_then_exits_cleanly(model_path: Path) -> None:
    server = start_server("--n-ctx", "1024", "--threads", "1", "--grace", "20")
    try:
        server.wait_ready()
        assert httpx.get(f"{server.url}/healthz").json()["status"] == "ready"
        model = httpx.get(f"{server.url}/v1/models", headers=server.auth).json()["data"][0]["id"]
        body = {
            "model": model,
            "stream": True,
            "max_tokens": 40,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "Count to fifty."}],
        }
        started, lines = threading.Event(), []

        def stream() -> None:
            with httpx.stream(
                "POST",
                f"{server.url}/v1/chat/completions",
                json=body,
                timeout=60,
                headers=server.auth,
            ) as r:
                for line in r.iter_lines():
                    started.set()
                    if line:
                        lines.append(line)

        reader = threading.Thread(target=stream)
        reader.start()
        assert started.wait(30)
        server.process.send_signal(signal.SIGTERM)
        reader.join(60)
        assert lines[-1] == "data: [DONE]"
        finishes = [json.loads(line[6:])["choices"][0]["finish_reason"] for line in lines[:-1]]
        assert finishes[-1] == "length"  # it ran to its end, not cut off
        assert server.process.wait(30) == 0
    finally:
        server.stop()


def test_a_core_that_cannot_start_makes_run_exit_nonzero(model_path: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a model")
    server = start_server("--model", str(broken))
    assert server.process.wait(60) == 1


def test_a_layout_that_cannot_fit_stops_the_start_naming_the_setting(
    model_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    env = {"QUANTA_N_CTX": "262144", "QUANTA_N_SEQ_MAX": "64"}  # 360 GiB of KV
    server = start_server(env=env)
    assert server.process.wait(60) == 1
    err = capfd.readouterr().err
    assert "the engine cannot start: QUANTA_N_CTX=262144 x QUANTA_N_SEQ_MAX=64 needs" in err
    assert "Traceback" not in err


def test_a_bad_setting_makes_run_exit_2_before_it_starts(model_path: Path) -> None:
    server = start_server("--policy", "no-such-policy")
    assert server.process.wait(60) == 2
