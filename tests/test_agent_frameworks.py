"""Agent frameworks, unchanged, run a two-tool agent loop against a real ``quanta run``:
the OpenAI Agents SDK (over the Responses API, its default, and over chat completions) and
LangChain's ``ChatOpenAI.bind_tools``.

The small model's choices do not matter; what is checked is that every turn is well formed
end to end: the framework parses each answer, runs the tools it asked for with arguments of
their schemas, and sends the results back in a request the server takes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI

from tests.server_process import ServerProcess, running_server

pytestmark = pytest.mark.model

QUESTION = "What is the weather in Paris, and what is 2 + 3?"


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[ServerProcess]:
    with running_server("--n-ctx", "4096", "--threads", "2", "--grace", "5") as proc:
        yield proc


@pytest.fixture(scope="module")
def model(server: ServerProcess) -> str:
    import httpx

    return str(httpx.get(f"{server.url}/v1/models", headers=server.auth).json()["data"][0]["id"])


class Calls:
    """What the tools were called with (by the framework, from the model's answers)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def weather(self, city: str) -> str:
        assert isinstance(city, str)
        self.seen.append(("get_weather", {"city": city}))
        return f"It is 21 C and sunny in {city}."

    def add(self, a: int, b: int) -> int:
        assert isinstance(a, int) and isinstance(b, int)
        self.seen.append(("add", {"a": a, "b": b}))
        return a + b


def agent_tools(calls: Calls) -> list[Any]:
    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return calls.weather(city)

    @function_tool
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        return calls.add(a, b)

    return [get_weather, add]


async def run_agent(model: Any, calls: Calls, *, streamed: bool) -> Any:
    set_tracing_disabled(True)
    agent = Agent(
        name="helper",
        instructions="Use the tools to answer.",
        tools=agent_tools(calls),
        model=model,
        # The first turn must call, once (the SDK resets the choice to auto after a call, so
        # the loop can end); the model's later choices are its own. The budget is roomy: the
        # SDK refuses an answer cut by it (an incomplete response).
        model_settings=ModelSettings(
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=200,
            temperature=0.0,
        ),
    )
    try:
        if streamed:
            run = Runner.run_streamed(agent, QUESTION, max_turns=3)
            async for _ in run.stream_events():
                pass
            return run
        return await Runner.run(agent, QUESTION, max_turns=3)
    except MaxTurnsExceeded as exc:  # the model kept calling: the loop itself was fine
        return exc.run_data


def check_loop(result: Any, calls: Calls) -> None:
    kinds = [item.type for item in result.new_items]
    assert "tool_call_item" in kinds and "tool_call_output_item" in kinds, kinds
    assert calls.seen and {name for name, _ in calls.seen} <= {"get_weather", "add"}
    # every result went back: the model was asked again after the tools ran
    assert len(result.raw_responses) >= 2


@pytest.mark.parametrize("streamed", [False, True])
def test_openai_agents_over_the_responses_api(
    server: ServerProcess, model: str, streamed: bool
) -> None:
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0)
    calls = Calls()
    result = asyncio.run(run_agent(OpenAIResponsesModel(model, client), calls, streamed=streamed))
    check_loop(result, calls)


@pytest.mark.parametrize("streamed", [False, True])
def test_openai_agents_over_chat_completions(
    server: ServerProcess, model: str, streamed: bool
) -> None:
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0)
    calls = Calls()
    result = asyncio.run(
        run_agent(OpenAIChatCompletionsModel(model, client), calls, streamed=streamed)
    )
    check_loop(result, calls)


def langchain_tools(calls: Calls) -> list[Any]:
    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return calls.weather(city)

    @tool
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        return calls.add(a, b)

    return [get_weather, add]


@pytest.mark.parametrize("streamed", [False, True])
def test_langchain_bind_tools_loop(server: ServerProcess, model: str, streamed: bool) -> None:
    calls = Calls()
    tools = {t.name: t for t in langchain_tools(calls)}
    llm = ChatOpenAI(
        model=model,
        base_url=f"{server.url}/v1",
        api_key=server.api_key,  # type: ignore[arg-type]
        max_tokens=120,  # type: ignore[call-arg]
        temperature=0,
        max_retries=0,
    )
    messages: list[BaseMessage] = [HumanMessage(QUESTION)]
    for turn in range(3):
        bound = llm.bind_tools(
            list(tools.values()),
            tool_choice="any" if turn == 0 else "auto",
            parallel_tool_calls=turn != 0,
        )
        if streamed:
            answer: Any = None
            for chunk in bound.stream(messages):
                answer = chunk if answer is None else answer + chunk
        else:
            answer = bound.invoke(messages)
        assert isinstance(answer, AIMessage)
        assert not answer.invalid_tool_calls
        messages.append(answer)
        if not answer.tool_calls:
            break
        for call in answer.tool_calls:
            output = tools[call["name"]].invoke(call["args"])
            messages.append(ToolMessage(str(output), tool_call_id=call["id"]))
    assert calls.seen
    assert sum(isinstance(m, ToolMessage) for m in messages) >= 1
    assert len([m for m in messages if isinstance(m, AIMessage)]) >= 2
