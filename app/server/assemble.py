"""The real core: tokenizer, llama.cpp worker, scheduler and driver, built from Settings.

Blocking (loads the model); the lifecycle runs it in a thread, then starts the driver in the
event loop. The only module of ``app`` that imports the llama.cpp side of the core.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from app.server.core import Core, CoreStats
from app.server.scheduling import scheduler_config
from app.server.settings import Settings
from quanta_core.clock import WallClock
from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor
from quanta_core.engine.llama_cpp.grammar import (
    json_object_grammar,
    json_schema_grammar,
    tool_call_grammar,
)
from quanta_core.engine.llama_cpp.tokenizer import Tokenizer
from quanta_core.engine.protocol import Executor
from quanta_core.engine.tool_grammar import ToolCallGrammar
from quanta_core.predictor import LengthPredictor
from quanta_core.scheduler import Choice, Driver, Scheduler
from quanta_core.scheduler.warmup import warm_up
from quanta_core.sim.step_trace import StepTracer

# A token quota reserves this quantile of a request's predicted output (app/tenancy/quotas.py:
# ``Ask``): most requests end inside it, and one that goes on is charged as it does.
RESERVE_QUANTILE = 0.9

log = logging.getLogger("quanta.assemble")


class LlamaGrammars:
    def json_object(self) -> str:
        return json_object_grammar()

    def json_schema(self, schema: dict[str, Any]) -> str:
        return json_schema_grammar(schema)

    def tool_calls(self, spec: ToolCallGrammar) -> str:
        return tool_call_grammar(spec)


def load_predictor(path: Path) -> LengthPredictor:
    """What the last run learned of output lengths; an unreadable file is set aside (it is
    a cache of experience: the server starts without it rather than not at all)."""
    try:
        return LengthPredictor.load(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("predictor state %s unreadable (%s): starting without it", path, exc)
        return LengthPredictor()


def save_predictor(predictor: LengthPredictor, path: Path) -> None:
    try:
        predictor.save(path)
    except OSError as exc:
        log.warning("predictor state %s not saved: %s", path, exc)


def build_core(settings: Settings) -> Core:
    config = settings.engine_config()  # a layout that cannot fit fails here (FitError)
    log.info("%s", settings.describe_layout())
    sched_config = scheduler_config(settings)  # a bad policy fails before the model loads
    tokenizer = Tokenizer.load(config.model_path)
    clock = WallClock()
    executor: Executor = LlamaCppExecutor.start(config)
    if settings.step_trace is not None:
        executor = StepTracer(executor, clock, settings.step_trace.open("w", buffering=1 << 16))
    predictor_path = settings.predictor_path()
    scheduler = Scheduler(
        sched_config, executor.info, clock, predictor=load_predictor(predictor_path)
    )
    if settings.warmup:
        warm_up(scheduler, executor)
    driver = Driver(scheduler, executor, clock, overlap=settings.overlaps_steps())

    def stats() -> CoreStats:
        s = driver.stats()
        return CoreStats(
            running=s.num_running,
            waiting=s.num_waiting,
            kv_usage=s.kv_usage,
            prefix_cache_hits=s.prefix_cache_hits,
            prefix_cache_queries=s.prefix_cache_queries,
            preemptions=s.num_preemptions,
            waiting_by_class=s.waiting_by_class,
            tenants=tuple(
                (t.tenant, t.slo_class, t.counter, t.waiting, t.running) for t in s.tenants
            ),
            block_size=scheduler.kv.block_size,
            num_blocks=scheduler.kv.num_blocks,
        )

    def close() -> None:
        save_predictor(scheduler.predictor, predictor_path)
        executor.close()
        tokenizer.close()

    return Core(
        model_name=settings.served_model_name(),
        n_ctx=scheduler.max_seq_tokens,
        created=int(time.time()),
        tokenizer=tokenizer,
        driver=driver,
        grammars=LlamaGrammars(),
        stats=stats,
        close=close,
        aliases=settings.model_aliases(),
        snapshot=driver.snapshot,
        prefix_cache_per_tenant=settings.prefix_cache_sharing == "tenant",
        likely_output=lambda request: scheduler.predictor.remaining(
            Choice.choices_of(request, 0.0, 0)[0], RESERVE_QUANTILE
        ),
    )
