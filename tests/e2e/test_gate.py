"""The gate with a real worker (issue 28): a model that echoes its fenced input is
refused before its compaction takes effect, the refusal is published and counted,
the conversation falls back to the extractive summariser, and a pinned message
survives every compaction verbatim."""

from __future__ import annotations

import json

import pytest

from streams.events import CompactionRejected
from tests.e2e.conftest import Conversation, Stack, eventually
from tests.support.llm_server import OPENAI_CHAT_PATH, Reply
from tests.support.metrics_text import metric

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ECHO = '<conversation-data id="abcdef12">\nnote 0: the pinned terms\n</conversation-data id="abcdef12">'


async def test_an_echo_is_refused_the_fallback_applies_and_a_pin_survives(stack: Stack) -> None:
    stack.llm.enqueue(Reply(text=ECHO), path=OPENAI_CHAT_PATH)
    worker = stack.worker("w1")
    await worker.wait_ready(stack.names.messages)
    conv = Conversation("conv-gate", "quartz")
    first = conv.message(pinned=True)
    await stack.send_all([first, *conv.until_over(0)])

    def rejections() -> list[CompactionRejected]:
        return [
            CompactionRejected.model_validate_json(r.value or b"")
            for r in stack.clip_archives.records
            if b'"type":"compaction_rejected"' in (r.value or b"")
        ]

    async def refused_then_compacted() -> None:
        assert len(rejections()) >= 1 and len(stack.clip_events()) >= 1

    await eventually(refused_then_compacted, timeout=60, what="a rejection, then a compaction")
    (rejected,) = {r.compaction_id: r for r in rejections()}.values()
    assert (rejected.reason, rejected.fallback) == ("echo", "extractive")
    (applied,) = stack.clip_events().values()
    assert applied.compaction_id == rejected.compaction_id
    assert applied.usage is not None and applied.usage.summarizer == "extractive"
    assert first["message_id"] not in applied.compressed_message_ids
    # Nothing of the refused summary was written: one compaction, no fence in a batch.
    assert await stack.db.fetchval("SELECT count(*) FROM compactions") == 1
    contents = await stack.db.fetch("SELECT content FROM archival_memory")
    assert contents and not any("conversation-data" in r["content"] for r in contents)
    row = await stack.db.fetchrow(
        "SELECT reason, summarizer FROM compaction_rejections WHERE compaction_id = $1",
        rejected.compaction_id,
    )
    assert row is not None and tuple(row) == ("echo", "openai")
    text = await worker.metrics_text()
    assert metric(text, "compactor_compactions_rejected_total") == 1

    # Two more compactions (the stand-in's ordinary summaries): the pin holds.
    for round_ in (2, 3):
        await stack.send_all(conv.until_over(0))

        async def compacted(expected: int = round_) -> None:
            assert len(stack.clip_events()) >= expected

        await eventually(compacted, timeout=60, what=f"compaction {round_}")
    pinned = await stack.db.fetchrow(
        "SELECT content, pinned FROM messages WHERE id = $1", first["message_id"]
    )
    assert pinned is not None and pinned["pinned"] and pinned["content"] == first["content"]
    assert json.loads(json.dumps(first))["pinned"] is True
