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


async def test_an_empty_summary_is_refused_and_nothing_of_it_is_written(stack: Stack) -> None:
    """A provider that answers nothing (openclaw #120663: 47 % of one session's
    compactions): refused, recorded, and the extractive summary applies instead."""
    stack.llm.enqueue(Reply(text=""), path=OPENAI_CHAT_PATH)
    worker = stack.worker("w1")
    await worker.wait_ready(stack.names.messages)
    conv = Conversation("conv-empty", "basalt")
    await stack.send_all(conv.until_over(0))

    async def compacted() -> None:
        assert len(stack.clip_events()) >= 1

    await eventually(compacted, timeout=60, what="the fallback's compaction")
    (applied,) = stack.clip_events().values()
    row = await stack.db.fetchrow(
        "SELECT reason, summarizer FROM compaction_rejections WHERE compaction_id = $1",
        applied.compaction_id,
    )
    assert row is not None and tuple(row) == ("empty_summary", "openai")
    assert applied.usage is not None and applied.usage.summarizer == "extractive"
    assert await stack.db.fetchval("SELECT count(*) FROM compactions") == 1
    contents = [r["content"] for r in await stack.db.fetch("SELECT content FROM archival_memory")]
    assert contents and all(c.strip() for c in contents)


SPECIFICS = ("INV-20931", "$4,210.55", "https://billing.example.com/inv/20931")


async def test_a_summary_that_drops_a_specific_leaves_it_in_the_ledger(stack: Stack) -> None:
    """A summary that says none of its turns' specifics is applied only because
    the ledger keeps each of them under its source message (what the gate checks:
    in the summary or in the ledger); the clip-archive the platform reads shows them."""
    stack.llm.enqueue(Reply(text="They went over the basalt notes."), path=OPENAI_CHAT_PATH)
    worker = stack.worker("w1")
    await worker.wait_ready(stack.names.messages)
    conv = Conversation("conv-specific", "basalt")
    first = conv.message(
        content=f"Invoice {SPECIFICS[0]} for {SPECIFICS[1]} is due; see {SPECIFICS[2]} for it."
    )
    await stack.send_all([first, *conv.until_over(0)])

    async def compacted() -> None:
        assert len(stack.clip_events()) >= 1

    await eventually(compacted, timeout=60, what="a compaction")
    (applied,) = stack.clip_events().values()
    assert applied.usage is not None and applied.usage.summarizer == "openai"
    assert first["message_id"] in applied.compressed_message_ids
    assert applied.clip_archive is not None
    text = applied.clip_archive.content
    assert "They went over the basalt notes." in text
    assert all(specific in text for specific in SPECIFICS), text
    assert await stack.db.fetchval("SELECT count(*) FROM compaction_rejections") == 0
