"""deploy/envoy.yaml with a fleet's own ports: the listener, the admin port, the replicas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "envoy.yaml"


def envoy_config(
    port: int, admin_port: int, replicas: list[int], host: str = "127.0.0.1"
) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(TEMPLATE.read_text())
    config["admin"]["address"]["socket_address"]["port_value"] = admin_port
    listener = config["static_resources"]["listeners"][0]
    listener["address"]["socket_address"].update(address=host, port_value=port)
    cluster = config["static_resources"]["clusters"][0]
    cluster["least_request_lb_config"]["choice_count"] = max(2, len(replicas))
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
        for p in replicas
    ]
    return config


def write_envoy_config(path: Path, port: int, admin_port: int, replicas: list[int]) -> Path:
    path.write_text(yaml.safe_dump(envoy_config(port, admin_port, replicas), sort_keys=False))
    return path
