"""The cheap strategies with a real worker (issue 28): an agent conversation's
old tool results are cleared and a chat's oversized paste is offloaded, each
compaction published and applied with no call to the LLM stand-in, the full
content archived where ``memory_read`` finds it."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Conversation, Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def agent_events() -> list[dict[str, object]]:
    """Six tool calls, each answered by a 167-token result: 944 tokens before the
    last result, 1,111 with it, so the conversation goes over the 1,000-token
    budget with its last event whatever groups ingest makes (with 200-token
    results the fifth crossed it, and the sixth sometimes came after the
    compaction); under the 800-token target once all but the last are cleared."""
    chat = Conversation("agent-1", "agent")
    events = [chat.message(role="user", content="review the repository please")]
    for i in range(6):
        call = {"id": f"call-{i}", "name": "read_file", "arguments": {"path": f"f{i}.py"}}
        events.append(chat.message(role="assistant", content="", tool_calls=[call]))
        body = f"needle{i} " + "source line " * 55
        events.append(chat.message(role="tool", content=body, tool_call_id=f"call-{i}"))
    return events


def paste_events() -> list[dict[str, object]]:
    chat = Conversation("paste-1", "paste")
    paste = "pasted log start " + "log entry here " * 320 + " pasteneedle end"
    return [chat.message(role="user", content="look at this"), chat.message(content=paste)]


async def test_clearing_and_offload_take_effect_without_an_llm_call(stack: Stack) -> None:
    worker = stack.worker(
        "strategies",
        config={"compaction": {"max_message_tokens": 300}},
        env={"COMPACTOR_COMPACTION__CLEAR_TOOL_RESULTS": '{"keep_last": 1}'},
    )
    await worker.wait_ready(stack.names.messages)
    await stack.send_all([*agent_events(), *paste_events()])
    published = await stack.wait_for_clip_events({"agent-1": 1, "paste-1": 1}, timeout=60)
    events = {e.conversation_id: e for e in published.values()}  # one compaction each
    assert stack.llm.requests == []  # no LLM call
    agent = events["agent-1"]
    assert [s.strategy for s in agent.strategies] == ["clear_tool_results"]
    assert agent.usage is not None and agent.usage.calls == 0
    assert len(agent.replaced_messages) == 5 and agent.tokens_after <= 800
    paste = events["paste-1"]
    assert [s.strategy for s in paste.strategies] == ["offload_oversized"]
    live = await stack.pg_history("agent-1")
    cleared = [r for r in live if r["content"].startswith("[tool result cleared:")]
    assert len(cleared) == 5 and "read_file" in cleared[0]["content"]
    rows = await stack.db.fetch(
        "SELECT id, content FROM archived_messages WHERE conversation_id = ANY($1::text[])",
        ["agent-1", "paste-1"],
    )
    archived = {r["id"]: r["content"] for r in rows}
    assert "needle0" in archived["agent-1-m0002"] and "pasteneedle" in archived["paste-1-m0001"]
    asked = {"q": "pasteneedle", "sources": "raw", "conversation_id": "paste-1"}
    status, found = await worker.get("/memory/search", asked)
    assert status == 200 and "paste-1-m0001" in str(found)
