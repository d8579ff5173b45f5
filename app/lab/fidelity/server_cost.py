"""The server's own time per cycle and per streamed token, read from real servers' step traces:
what ``quanta bench fidelity run`` gives its probe-speed simulations (``SERVER_COST``).

    quanta bench fidelity server-cost OUT.json TRACE.jsonl [TRACE.jsonl ...]

Per count of tokens a step handed to streams, the median of the gap before the step plus its
boundary, over all the traces' steps; then ``per_cycle + per_token x tokens`` fitted through
them (``quanta_core.sim.step_trace.server_cost_of``). Written as ``{"server_cost":
{"per_cycle_ms", "per_token_ms"}}``, the shape ``bench_http_overhead`` writes too.
"""

from __future__ import annotations

import json
from pathlib import Path

from quanta_core.sim.step_trace import read_trace, server_cost_of


def main(out: Path, traces: list[Path]) -> None:
    records = []
    for path in traces:
        with path.open() as f:
            records += read_trace(f)
    cost = server_cost_of(records)
    doc = {
        "server_cost": {
            "per_cycle_ms": 1e3 * cost.per_cycle_s,
            "per_token_ms": 1e3 * cost.per_token_s,
        },
        "from": [str(p) for p in traces],
        "steps": len(records),
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{cost.per_cycle_s * 1e3:.2f} ms per cycle + {cost.per_token_s * 1e3:.3f} ms per token")
