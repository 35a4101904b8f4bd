"""Redo and undo through Kafka with real workers, killed in the middle (issue 18, part 2).

`compactor recompact` re-summarises a compacted conversation from its raw
turns; `POST /conversations/{id}/restore` brings a batch's turns back. Each is
a request on the control topic that the owning worker turns into one
compaction. A worker SIGKILLed in the middle (the recompact's LLM call in
flight; the restore queued behind a compaction whose LLM call is in flight)
leaves the work to its successor, which does each exactly once: one row in
``compactions`` under the request's compaction id, its clip-archive event,
the budget met and the table equal to PostgreSQL.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from core.domain.tally import request_compaction_id
from streams.events import ClipArchiveEvent
from tests.e2e.conftest import BUDGET_TOKENS, Conversation, Stack, eventually
from tests.e2e.test_erase import compactor
from tests.support.llm_server import OPENAI_CHAT_PATH, Delay, Reply
from tests.support.worker import WorkerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

HELD = 4.0  # seconds an LLM call is held (under [summarization].timeout_seconds, 5)
# The killed worker's partitions move once its session times out: 6 s, not 30.
FAST = {"kafka": {"session_timeout_seconds": 6.0, "heartbeat_interval_seconds": 1.0}}


class Gate:
    """Chat requests are held (then answered) while ``closed``."""

    def __init__(self) -> None:
        self.closed = False

    def __call__(self, path: str) -> Any:
        return Delay(HELD) if self.closed and path == OPENAI_CHAT_PATH else Reply()


async def _compacted(stack: Stack, worker: WorkerProcess, conversation: Conversation) -> None:
    await stack.send_all(conversation.until_over(0))
    await stack.wait_for_clip_events({conversation.id: 1}, timeout=60)
    await stack.wait_idle(worker, [conversation.id], timeout=60)


async def _held_call(stack: Stack, before: int) -> None:
    async def arrived() -> None:
        assert len(stack.llm.requests_to(OPENAI_CHAT_PATH)) > before

    await eventually(arrived, timeout=60, what="an LLM call held in flight", interval=0.05)


def _events_of(stack: Stack, request_id: str) -> list[ClipArchiveEvent]:
    return [e for e in stack.clip_events().values() if e.request_id == request_id]


async def _applied_once(stack: Stack, conversation_id: str, request_id: str) -> ClipArchiveEvent:
    compaction_id = request_compaction_id(conversation_id, request_id)

    async def published() -> ClipArchiveEvent:
        events = _events_of(stack, request_id)
        assert len(events) == 1, events
        return events[0]

    event = await eventually(published, timeout=90, what=f"the clip-archive of {request_id}")
    assert event.compaction_id == compaction_id
    rows = [r for r in await stack.pg_compactions() if r["compaction_id"] == compaction_id]
    assert len(rows) == 1
    total, _ = await stack.pg_tally(conversation_id)
    assert total <= BUDGET_TOKENS
    return event


async def test_recompact_with_its_worker_killed_during_the_llm_call(stack: Stack) -> None:
    gate = Gate()
    stack.llm.default_action = gate
    first = stack.worker("first", config=FAST)
    await first.wait_ready(stack.names.messages)
    conversation = Conversation("redo-1", "lantern")
    await _compacted(stack, first, conversation)
    old = {r["id"] for r in await stack.pg_batches()}

    gate.closed = True
    calls = len(stack.llm.requests_to(OPENAI_CHAT_PATH))
    code, out, err = await compactor(stack, "recompact", conversation.id, "--request-id", "r-1")
    assert code == 0, err
    assert "request r-1" in out
    await _held_call(stack, calls)
    first.kill()
    gate.closed = False

    second = stack.worker("second", config=FAST)  # same app id: the command comes again
    await second.wait_ready(stack.names.messages)
    event = await _applied_once(stack, conversation.id, "r-1")
    assert event.action == "recompact"
    batches = await stack.pg_batches()
    live = [b for b in batches if b["superseded_by"] is None]
    assert live and all(b["compaction_id"] == event.compaction_id for b in live)
    assert all(b["superseded_by"] for b in batches if b["id"] in old)
    await stack.wait_idle(second, [conversation.id], timeout=60)

    # The same request again (an operator's retry) is the same compaction: replayed.
    code, out, err = await compactor(
        stack, "recompact", conversation.id, "--request-id", "r-1", "--wait", "--timeout", "60"
    )
    assert code == 0, err
    assert f"applied as compaction {event.compaction_id} before" in out
    assert [r["compaction_id"] for r in await stack.pg_compactions()].count(
        event.compaction_id
    ) == 1


async def test_restore_queued_behind_a_compaction_when_its_worker_is_killed(
    stack: Stack,
) -> None:
    gate = Gate()
    stack.llm.default_action = gate
    first = stack.worker("first", config=FAST)
    await first.wait_ready(stack.names.messages)
    conversation = Conversation("undo-1", "harbour")
    await _compacted(stack, first, conversation)

    # Over the budget again, the next compaction's LLM call held: the restore waits
    # its turn behind it (one command at a time per conversation), then the kill.
    gate.closed = True
    calls = len(stack.llm.requests_to(OPENAI_CHAT_PATH))
    total, _ = await stack.pg_tally(conversation.id)
    await stack.send_all(conversation.until_over(total))
    await _held_call(stack, calls)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{first.url}/conversations/{conversation.id}/restore",
            params={"request_id": "u-1"},  # the newest live batch when it runs
        ) as response,
    ):
        assert response.status == 202, await response.text()
        assert (await response.json())["request_id"] == "u-1"

    async def queued() -> None:
        status, body = await first.get(f"/conversations/{conversation.id}")
        assert status == 200 and body["compaction_outstanding"] is not None, body
        assert _events_of(stack, "u-1") == []

    await eventually(queued, timeout=20, what="the restore request taken in")
    await asyncio.sleep(0.5)  # the control event's table write (at once) reaches the changelog
    first.kill()
    gate.closed = False

    second = stack.worker("second", config=FAST)
    await second.wait_ready(stack.names.messages)
    await stack.wait_for_clip_events({conversation.id: 3}, timeout=90)  # compaction, restore
    event = await _applied_once(stack, conversation.id, "u-1")
    assert event.action == "restore" and event.restored_message_ids
    live = {r["id"] for r in await stack.pg_history(conversation.id)}
    assert set(event.restored_message_ids) <= live
    await stack.wait_idle(second, [conversation.id], timeout=60)
