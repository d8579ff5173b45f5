"""The length predictor's accuracy, online: each request is predicted at arrival from what
finished before it, then its true length is taught (in arrival order: as if each had ended
before the next arrived, which is kind to the predictor on a fast trace).

    quanta bench horizon accuracy trace bench/traces/azure_llm_2023_conv.csv
    quanta bench horizon accuracy served bench/results/horizon/chat-natural.json

Figures: MAE of the p50 (tokens), the share of true lengths at or below the p90 (coverage),
the same for the remaining length once 64 tokens were generated (the refinement a running
request gets), and the two baselines: ``max_tokens`` (every request runs to its cap) and the
global running mean. Writes ``accuracy-<source>.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from statistics import fmean
from typing import Any

from quanta_core.predictor import LengthPredictor
from quanta_core.requests import GenerationRequest
from quanta_core.scheduler.choice import Choice
from quanta_core.workload import read_trace

Sample = tuple[str, int, int, int]  # tenant, prompt length, max_tokens, true output length
REFINE_AT = 64


def choice(tenant: str, prompt_len: int, max_tokens: int, generated: int = 0) -> Choice:
    req = GenerationRequest("x", (1,) * prompt_len, max_tokens, tenant=tenant)
    r = Choice.choices_of(req, 0.0, 0)[0]
    r.tokens.extend([1] * generated)
    return r


def evaluate(samples: Iterable[Sample]) -> dict[str, Any]:
    p = LengthPredictor()
    err50: list[int] = []
    covered: list[bool] = []
    refined_err: list[int] = []
    refined_cov: list[bool] = []
    cap_err: list[int] = []
    mean_err: list[float] = []
    for tenant, prompt_len, max_tokens, true in samples:
        r = choice(tenant, prompt_len, max_tokens)
        pred = p.predict(r)
        err50.append(abs(pred.p50 - true))
        covered.append(true <= pred.p90)
        cap_err.append(abs(max_tokens - true))
        mean = p.global_mean() or max_tokens
        mean_err.append(abs(min(mean, max_tokens) - true))
        if true > REFINE_AT:
            later = p.predict(choice(tenant, prompt_len, max_tokens, REFINE_AT))
            refined_err.append(abs(later.p50 - (true - REFINE_AT)))
            refined_cov.append(true - REFINE_AT <= later.p90)
        p.observe(r, true)
    return {
        "requests": len(err50),
        "mae_p50": round(fmean(err50), 1),
        "p90_coverage": round(sum(covered) / len(covered), 3),
        f"after_{REFINE_AT}": {
            "requests": len(refined_err),
            "mae_p50": round(fmean(refined_err), 1) if refined_err else None,
            "p90_coverage": round(sum(refined_cov) / len(refined_cov), 3) if refined_cov else None,
        },
        "baselines": {
            "max_tokens_mae": round(fmean(cap_err), 1),
            "global_mean_mae": round(fmean(mean_err), 1),
        },
    }


def trace_samples(path: Path, limit: int | None, cap: int) -> list[Sample]:
    rows = read_trace(str(path))[:limit]
    return [("trace", r.prompt_tokens, cap, min(r.output_tokens, cap)) for r in rows]


def served_samples(path: Path) -> list[Sample]:
    doc = json.loads(path.read_text())
    rows = sorted((r for r in doc["requests"] if r["ok"]), key=lambda r: r["sent"])
    return [(r["tenant"], r["prompt_tokens"], r["max_tokens"], r["output_tokens"]) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("source", choices=["trace", "served"])
    parser.add_argument("path", type=Path)
    parser.add_argument("--limit", type=int, default=10_000, help="trace: the first N rows")
    parser.add_argument("--cap", type=int, default=2048, help="trace: max_tokens of each")
    parser.add_argument("--out", type=Path, default=Path("bench/results/horizon"))
    args = parser.parse_args()
    if args.source == "trace":
        samples = trace_samples(args.path, args.limit, args.cap)
    else:
        samples = served_samples(args.path)
    figures = {"source": str(args.path), **evaluate(samples)}
    if args.source == "trace":
        figures["max_tokens"] = args.cap
    print(json.dumps(figures, indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"accuracy-{args.source}.json").write_text(json.dumps(figures, indent=1) + "\n")
