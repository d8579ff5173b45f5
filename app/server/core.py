"""The core as the web layer sees it: a tokenizer, a driver and the model's few facts.

``build_core(settings)`` assembles the real one (llama.cpp worker, scheduler, driver); tests
hand ``create_app`` a fake. Only this module knows how the parts are wired.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.server.settings import Settings
from quanta_core.engine.tool_grammar import ToolCallGrammar
from quanta_core.requests import ChoiceFinished, ChoiceResult, GenerationRequest, TokenEvent
from quanta_core.scheduler.snapshot import SchedulerSnapshot


class Detokenizer(Protocol):
    """Token ids to text, one at a time (multi-byte characters held until whole)."""

    def push(self, token: int) -> str: ...

    def flush(self) -> str: ...


class Tokenizer(Protocol):
    n_vocab: int
    chat_template: str | None  # the model's own (Jinja); None: it has none

    def encode(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]: ...

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        continue_final_message: bool = False,
        add_generation_prompt: bool = True,
        extra: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The chat rendered by the model's template (raises ``ValueError`` if it refuses)."""
        ...

    def token_bytes(self, token: int) -> bytes: ...

    def detokenizer(self) -> Detokenizer: ...


class Handle(Protocol):
    def __aiter__(self) -> AsyncIterator[TokenEvent | ChoiceFinished]: ...

    async def results(self) -> list[ChoiceResult]: ...


@dataclass(frozen=True, slots=True)
class CoreStats:
    """The scheduler's gauges and counters, read at each scrape of ``/metrics``."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    prefix_cache_hits: int = 0  # tokens served from the prefix cache, cumulative
    prefix_cache_queries: int = 0  # prompt tokens looked up, cumulative
    preemptions: int = 0  # cumulative
    waiting_by_class: tuple[tuple[str, int], ...] = ()  # (class, waiting)
    # fair policies: (tenant, class, virtual token counter, waiting, running)
    tenants: tuple[tuple[str, str, float, int, int], ...] = ()
    block_size: int = 0  # tokens per KV block
    num_blocks: int = 0  # KV blocks in the pool


class Driver(Protocol):
    async def start(self) -> None: ...

    def submit(self, request: GenerationRequest) -> Handle:
        """Queue or start ``request``; raise ``quanta_core.scheduler.Refused`` when admission
        refuses it at once (the HTTP status is known before any event)."""
        ...

    def cancel(self, request_id: str) -> bool: ...

    async def stop(self, grace_s: float) -> None:
        """Admit nothing more; let in-flight requests finish for ``grace_s``, then fail them."""
        ...


class Grammars(Protocol):
    """Compiles ``response_format`` and tool calls into GBNF (llama.cpp's converter lives in
    the core). A schema it cannot enforce raises ``ValueError`` naming what."""

    def json_object(self) -> str: ...

    def json_schema(self, schema: dict[str, Any]) -> str: ...

    def tool_calls(self, spec: ToolCallGrammar) -> str: ...


@dataclass(frozen=True, slots=True)
class Core:
    model_name: str
    n_ctx: int
    created: int  # when the model was loaded (Unix time), for /v1/models
    tokenizer: Tokenizer
    driver: Driver
    grammars: Grammars
    stats: Callable[[], CoreStats]
    close: Callable[[], None]  # stops the engine worker (after ``driver.stop``)
    aliases: tuple[str, ...] = ()  # more names clients may send for the model
    # What the scheduler is doing now, for the live view (None: a core that cannot tell).
    snapshot: Callable[[], SchedulerSnapshot] | None = None
    # Cached prompt prefixes are shared within a tenant (its id salts the cache), else by all.
    prefix_cache_per_tenant: bool = True
    # The output a choice of this request will likely produce (a quota reserves it; None:
    # a core that cannot tell, max_tokens is reserved).
    likely_output: Callable[[GenerationRequest], int] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return (self.model_name, *self.aliases)


CoreFactory = Callable[[Settings], Core]
