"""The context's provider shapes go through the real SDKs: ``request`` of
``GET /context?format=openai|anthropic`` is passed as is to
``chat.completions.create`` / ``messages.create`` of the ``openai`` and
``anthropic`` packages, which send it to the LLM wire test server; that server
refuses what the real APIs refuse about turns and tools (roles alternating,
tool calls paired with their results, tool_result blocks first, no empty text)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings

from core.domain.budget import BudgetConfig
from core.domain.messages import ConversationMessage, ToolCall
from core.ports.storage import IncomingMessage, ReadScope
from streams.metrics import Metrics
from streams.worker.ingest_notices import IngestNotices
from streams.worker.runtime import StaticRuntime
from streams.worker.turn_context import ContextRequest, Served, TurnContexts
from tests.support.llm_server import LLMTestServer
from tests.support.memory_store import InMemoryStore
from tests.support.plans import T0
from tests.unit.domain.conversations import conversations

pytestmark = pytest.mark.integration

API_KEY = "sk-test-context-shapes"
KEY = "acme/agent-7"


@pytest_asyncio.fixture
async def server() -> AsyncIterator[LLMTestServer]:
    async with LLMTestServer(api_key=API_KEY) as s:
        yield s


def agent_session() -> list[ConversationMessage]:
    """An agent's turns: a question, two parallel tool calls, their results (one
    without its call's id), an answer, a system note, a call still in flight."""

    def m(n: int, role: str, content: str, **fields: Any) -> ConversationMessage:
        return ConversationMessage(
            id=f"m{n}", conversation_id=KEY, role=role, content=content, created_at=T0, **fields
        )

    lookup = ToolCall(id="call-a", name="lookup_order", arguments={"order": 8812})
    refunds = ToolCall(id="call-b", name="list_refunds", arguments={"since": "2026-01-01"})
    rerun = ToolCall(id="call-c", name="retry_refund", arguments={"order": 8812})
    return [
        m(0, "user", "Why did the refund for order 8812 fail?"),
        m(1, "assistant", "", tool_calls=(lookup, refunds)),
        m(2, "tool", '{"status": "card_expired"}', tool_call_id="call-a"),
        m(3, "tool", "[]", tool_call_id="call-b"),
        m(4, "assistant", "The card on file expired on 2026-02-28."),
        m(5, "system", "The customer is on the premium plan."),
        m(6, "user", "Please retry it with the new card."),
        m(7, "user", "The one ending 4242."),
        m(8, "assistant", "Retrying now.", tool_calls=(rerun,)),
    ]


async def context_of(history: list[ConversationMessage], shape: str, limit: int = 1000) -> Any:
    store = InMemoryStore()
    group = [IncomingMessage(m, 25, 0, n) for n, m in enumerate(history)]
    await store.ingest.save_messages(group)
    contexts = TurnContexts(
        StaticRuntime(store, compactor=None),  # type: ignore[arg-type]
        BudgetConfig(context_budget=0.5, model_max_tokens=2 * limit),
        IngestNotices(),
        Metrics(),
    )
    answer = await contexts.answer(ContextRequest(KEY, ReadScope.everything(), shape))  # type: ignore[arg-type]
    assert isinstance(answer, Served)
    return json.loads(answer.body)["request"]


async def send(server: LLMTestServer, shape: str, request: dict[str, Any]) -> None:
    """Through the SDK, as a platform would: the request part as keyword arguments."""
    if shape == "openai":
        client = openai.AsyncOpenAI(api_key=API_KEY, base_url=server.openai_base_url, max_retries=0)
        async with client:
            await client.chat.completions.create(model="gpt-test", max_tokens=64, **request)
    else:
        system = request.get("system")
        arguments = {"messages": request["messages"], **({"system": system} if system else {})}
        client_a = anthropic.AsyncAnthropic(
            api_key=API_KEY, base_url=server.base_url, max_retries=0
        )
        async with client_a:
            await client_a.messages.create(model="claude-test", max_tokens=64, **arguments)


@pytest.mark.parametrize("shape", ["openai", "anthropic"])
async def test_an_agent_session_is_accepted_by_the_sdk(server: LLMTestServer, shape: str) -> None:
    request = await context_of(agent_session(), shape)
    await send(server, shape, request)
    (sent,) = server.requests
    body = json.loads(sent.body) if isinstance(sent.body, str | bytes) else sent.body
    text = json.dumps(body)
    assert "card_expired" in text and "ending 4242" in text and "premium plan" in text


@pytest.mark.parametrize("shape", ["openai", "anthropic"])
async def test_a_provisionally_fitted_context_is_accepted_by_the_sdk(
    server: LLMTestServer, shape: str
) -> None:
    long = [*agent_session()[:5]] * 1
    history = [
        m.model_copy(update={"id": f"{m.id}-{round_}", "content": m.content * 40 or m.content})
        for round_ in range(12)
        for m in long
    ]
    for n, m in enumerate(history):  # the calls' ids unique per round
        if m.tool_calls:
            calls = tuple(c.model_copy(update={"id": f"{c.id}-{n}"}) for c in m.tool_calls)
            history[n] = m.model_copy(update={"tool_calls": calls})
        if m.tool_call_id:
            owner = next(k for k in range(n, -1, -1) if history[k].tool_calls)
            history[n] = m.model_copy(update={"tool_call_id": f"{m.tool_call_id}-{owner}"})
    request = await context_of(history, shape, limit=500)
    assert "[Provisional summary of" in json.dumps(request)
    await send(server, shape, request)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(history=conversations(max_units=20))
async def test_any_stored_history_is_accepted_by_both_sdks(
    server: LLMTestServer, history: list[ConversationMessage]
) -> None:
    history = [m.model_copy(update={"conversation_id": KEY}) for m in history]
    if not any(m.role in ("user", "assistant") and m.content.strip() for m in history):
        return  # nothing a model could be asked with: the platform adds its turn
    for shape in ("openai", "anthropic"):
        await send(server, shape, await context_of(history, shape))


async def test_the_test_server_refuses_what_the_apis_refuse(server: LLMTestServer) -> None:
    """So the tests above cannot pass by a lenient server."""
    orphan = [
        {"role": "user", "content": "x"},
        {"role": "tool", "tool_call_id": "z", "content": "r"},
    ]
    with pytest.raises(openai.BadRequestError):
        await send(server, "openai", {"messages": orphan})
    unanswered = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}],
        },
        {"role": "user", "content": "no result"},
    ]
    same_role = [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]
    for messages in (unanswered, same_role):
        with pytest.raises(anthropic.BadRequestError):
            await send(server, "anthropic", {"messages": messages})
