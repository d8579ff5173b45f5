"""A fake core for API tests: a byte tokenizer and a scripted driver, no model."""

from __future__ import annotations

import asyncio
import codecs
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.server.core import Core, CoreStats
from quanta_core.engine.tool_grammar import ToolCallGrammar
from quanta_core.engine.types import TopLogprob
from quanta_core.requests import (
    ChoiceFinished,
    ChoiceResult,
    ChoiceTimings,
    FinishReason,
    GenerationRequest,
    TokenEvent,
)
from quanta_core.scheduler import Refused

MODEL = "fake-model"


class ByteDetokenizer:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(bytes([token]))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class ByteTokenizer:
    """One token per UTF-8 byte."""

    n_vocab = 256
    chat_template: str | None = None

    def encode(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        return list(text.encode())

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> list[int]:
        if any(m["role"] == "assistant" and m["content"] == "RAISE" for m in messages):
            raise ValueError("template refused")
        return self.encode("".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<a>")

    def token_bytes(self, token: int) -> bytes:
        return bytes([token])

    def detokenizer(self) -> ByteDetokenizer:
        return ByteDetokenizer()


class FakeGrammars:
    def json_object(self) -> str:
        return "root ::= object"

    def json_schema(self, schema: dict[str, Any]) -> str:
        if schema.get("type") == "bogus":
            raise ValueError("unsupported type 'bogus'")
        return "root ::= " + json.dumps(schema)

    def tool_calls(self, spec: ToolCallGrammar) -> str:
        for _, parameters in spec.functions:
            self.json_schema(json.loads(parameters))
        return "root ::= " + json.dumps([name for name, _ in spec.functions])


@dataclass
class FakeHandle:
    driver: FakeDriver
    request: GenerationRequest

    async def __aiter__(self) -> AsyncIterator[TokenEvent | ChoiceFinished]:  # type: ignore[override]
        req, d = self.request, self.driver
        d.running += 1
        try:
            outputs = [[*d.script[i % len(d.script)].encode()] for i in range(req.n)]
            produced: list[list[int]] = [[] for _ in range(req.n)]
            done = [False] * req.n
            step = 0
            while not all(done):
                await asyncio.sleep(d.delay_s)
                for i in range(req.n):
                    if done[i]:
                        continue
                    if req.request_id in d.cancelled:
                        done[i] = True
                        yield ChoiceFinished(self._result(i, FinishReason.CANCELLED, produced[i]))
                    elif d.fail_after is not None and step >= d.fail_after:
                        done[i] = True
                        finished = self._result(i, FinishReason.ERROR, produced[i], "engine died")
                        yield ChoiceFinished(finished)
                    elif step >= len(outputs[i]) and not req.sampling.ignore_eos:
                        done[i] = True
                        yield ChoiceFinished(self._result(i, FinishReason.STOP, produced[i]))
                    elif len(produced[i]) >= req.max_tokens:
                        done[i] = True
                        yield ChoiceFinished(self._result(i, FinishReason.LENGTH, produced[i]))
                    else:
                        token = outputs[i][step] if step < len(outputs[i]) else ord("x")
                        produced[i].append(token)
                        top = (TopLogprob(token, -0.5), TopLogprob(ord("?"), -1.5))
                        k = req.sampling.logprobs
                        yield TokenEvent(
                            req.request_id,
                            i,
                            token,
                            -0.5 if k is not None else None,
                            top[: k or 0],
                        )
                step += 1
        finally:
            d.running -= 1

    def _result(
        self, index: int, reason: FinishReason, tokens: list[int], error: str | None = None
    ) -> ChoiceResult:
        return ChoiceResult(
            request_id=self.request.request_id,
            index=index,
            finish_reason=reason,
            prompt_tokens=len(self.request.prompt_tokens),
            cached_tokens=self.driver.cached_tokens,
            completion_tokens=len(tokens),
            output_tokens=tuple(tokens),
            timings=ChoiceTimings(
                arrival=0.0, admitted=0.1, first_scheduled=0.1, first_token=0.3, finished=0.5
            ),
            error=error,
            token_times=(0.3, 0.35, 0.45),
        )

    async def results(self) -> list[ChoiceResult]:
        raise NotImplementedError


@dataclass
class FakeDriver:
    script: list[str] = field(default_factory=lambda: ["Hello world"])
    delay_s: float = 0.0
    refuse: Refused | None = None  # what submit raises
    fail_after: int | None = None  # tokens per choice before the engine "fails" it
    cached_tokens: int = 0
    running: int = 0
    submitted: list[GenerationRequest] = field(default_factory=list)
    cancelled: set[str] = field(default_factory=set)
    stopped_with: float | None = None
    likely_output: int | None = None  # the length predictor's answer (None: no predictor)

    def submit(self, request: GenerationRequest) -> FakeHandle:
        self.submitted.append(request)
        if self.refuse is not None:
            raise self.refuse
        return FakeHandle(self, request)

    async def start(self) -> None:
        pass

    def cancel(self, request_id: str) -> bool:
        self.cancelled.add(request_id)
        return True

    def stats(self) -> CoreStats:
        return CoreStats(running=self.running, kv_usage=0.25 if self.running else 0.0)

    async def stop(self, grace_s: float) -> None:
        self.stopped_with = grace_s


def fake_core(driver: FakeDriver, n_ctx: int = 512) -> Core:
    likely = driver.likely_output
    return Core(
        model_name=MODEL,
        n_ctx=n_ctx,
        created=1_700_000_000,
        tokenizer=ByteTokenizer(),
        driver=driver,
        grammars=FakeGrammars(),
        stats=driver.stats,
        close=lambda: None,
        likely_output=None if likely is None else lambda _: likely,
    )
