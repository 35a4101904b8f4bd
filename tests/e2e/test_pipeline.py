"""The whole service through Kafka: one worker, several conversations, every output.

Why: unit and integration tests check the pieces; only a real worker process
fed through the real broker shows that accounting, commands, the processor,
the outbox relay and the views fit together, and that what the service
publishes, stores and reports all tell the same story.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.e2e.conftest import (
    BUDGET_TOKENS,
    KEEP_RECENT,
    Conversation,
    Stack,
    eventually,
    interleave,
    tokens_of,
)
from tests.support.metrics_text import label_values, metric

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


async def test_three_conversations_end_to_end(stack: Stack) -> None:
    worker = stack.worker("w1")
    assert await worker.wait_ready(stack.names.messages) == {0, 1, 2, 3}

    a = Conversation("conv-orchid", "orchid")
    b = Conversation("conv-falcon", "falcon")
    c = Conversation("conv-glacier", "glacier")

    # Cycle 1 for all three, interleaved. B carries a tool call and its result
    # (early, so they are compressed together), and each conversation's last
    # message is the one that takes it over budget: exactly one compaction each.
    b.message(
        role="assistant",
        content="falcon: checking the rollout",
        tool_calls=[{"id": "call-1", "name": "kubectl", "arguments": {"args": "rollout status"}}],
    )
    b.message(role="tool", content="falcon: 2 of 6 pods ready", tool_call_id="call-1")
    b_first = b.events[:2] + b.until_over(sum(tokens_of(e) for e in b.events))
    cycle1 = {conv.id: conv.until_over(0) for conv in (a, c)}
    cycle1[b.id] = b_first
    await stack.send_all(interleave(*cycle1.values()))
    await stack.wait_for_clip_events({a.id: 1, b.id: 1, c.id: 1}, timeout=60)

    # Two more cycles for C, each started from what PostgreSQL now holds.
    for cycle in (2, 3):
        await stack.wait_idle(worker, [c.id], timeout=30)
        total, _ = await stack.pg_tally(c.id)
        assert total <= BUDGET_TOKENS, "a compaction must bring C back under budget"
        await stack.send_all(c.until_over(total))
        await stack.wait_for_clip_events({c.id: cycle}, timeout=60)

    entries = await stack.wait_idle(worker, [a.id, b.id, c.id], timeout=30)

    # -- clip-archive events: exactly the five compactions, one per cycle ----
    events = stack.clip_events()
    per_conversation = Counter(e.conversation_id for e in events.values())
    assert per_conversation == {a.id: 1, b.id: 1, c.id: 3}
    compactions = await stack.pg_compactions()
    assert sorted(r["compaction_id"] for r in compactions) == sorted(events)
    c_events = sorted(
        (e for e in events.values() if e.conversation_id == c.id), key=lambda e: e.generation
    )
    assert [e.generation for e in c_events] == [0, 1, 2]

    batches = await stack.pg_batches()
    for conv in (a, b, c):
        conv_events = sorted(
            (e for e in events.values() if e.conversation_id == conv.id),
            key=lambda e: e.generation,
        )
        live = await stack.pg_history(conv.id)
        live_ids = {r["id"] for r in live}
        compressed: list[str] = []
        for event in conv_events:
            # Each compaction keeps the newest KEEP_RECENT messages it saw...
            assert len(event.kept_message_ids) == KEEP_RECENT
            compressed.extend(event.compressed_message_ids)
            # ...archives exactly the batches it announces...
            archived = [r for r in batches if r["compaction_id"] == event.compaction_id]
            assert sorted(r["id"] for r in archived) == sorted(x.id for x in event.batches)
            assert all(r["conversation_id"] == conv.id for r in archived)
            depth0 = [r for r in archived if r["depth"] == 0]
            assert sorted(i for r in depth0 for i in r["source_message_ids"]) == sorted(
                event.compressed_message_ids
            )
            assert event.tokens_after < event.tokens_before
        # ...and what was compressed is gone from PostgreSQL, nothing else is.
        assert len(compressed) == len(set(compressed)), "a message was compressed twice"
        assert live_ids.isdisjoint(compressed)
        raw_live = [r["id"] for r in live if r["kind"] == "message"]
        assert sorted(raw_live + compressed) == sorted(conv.ids), "messages lost or invented"
        # The history is the latest clip-archive and the messages it kept.
        last = conv_events[-1]
        assert [r["id"] for r in live] == [last.clip_archive.id, *last.kept_message_ids]
        assert live[0]["kind"] == "clip_archive"
        assert live[0]["content"] == last.clip_archive.content
        assert live[0]["compaction_id"] == last.compaction_id

        history = await worker.get_json(f"/conversations/{conv.id}/history")
        assert [m["id"] for m in history["messages"]] == [r["id"] for r in live]
        assert [m["content"] for m in history["messages"]] == [r["content"] for r in live]
        assert history["clip_archive"]["id"] == last.clip_archive.id
        assert history["clip_archive"]["role"] == "system"
        assert history["token_estimate"] == sum(r["token_estimate"] for r in live)

        total, count = await stack.pg_tally(conv.id)
        assert entries[conv.id]["token_total"] == total
        assert entries[conv.id]["message_count"] == count == KEEP_RECENT + 1
        assert entries[conv.id]["compactions"] == len(conv_events)
        assert entries[conv.id]["generation"] == len(conv_events)
        assert entries[conv.id]["over_budget"] is False

    # B's tool call and result went through Kafka and PostgreSQL intact and were
    # compressed together (never one without the other).
    b_event = next(e for e in events.values() if e.conversation_id == b.id)
    assert {f"{b.id}-m0000", f"{b.id}-m0001"} <= set(b_event.compressed_message_ids)

    # Three cycles of C went over clip_first + clip_last + resummarize_buffer
    # live batches, so older ones were re-summarised into a deeper batch.
    c_batches = [r for r in batches if r["conversation_id"] == c.id]
    assert any(r["depth"] >= 1 for r in c_batches), [(r["id"], r["depth"]) for r in c_batches]
    assert any(r["superseded_by"] for r in c_batches)

    # -- memory search finds each conversation's archived batches -------------
    for conv in (a, b, c):
        found = await worker.get_json(
            "/memory/search", {"q": conv.marker, "conversation_id": conv.id, "limit": "20"}
        )
        hits: list[dict[str, Any]] = found["hits"]
        assert hits, f"no archived batch of {conv.id} found for {conv.marker!r}"
        assert {h["conversation_id"] for h in hits} == {conv.id}
        assert {h["batch_id"] for h in hits} <= {
            r["id"] for r in batches if r["conversation_id"] == conv.id
        }
        # Why each matched: the lists, ranks and words; the best raw turns on their own.
        reasons = [m for h in hits for m in h["matches"]]
        reasons += [m for t in found["turns"] for m in t["matches"]]
        assert reasons and all(m["via"] and m["rank"] >= 1 for m in reasons)
        assert any(m["terms"] for m in reasons)
        assert {t["conversation_id"] for t in found["turns"]} <= {conv.id}
    # A search across every conversation is refused unless the operator allows it.
    status, body = await worker.get("/memory/search", {"q": "falcon", "limit": "20"})
    assert status == 400 and "allow_global_search" in body["error"], (status, body)

    # -- metrics agree with what happened -------------------------------------
    # (Polled: a counter moves just after the effect it counts becomes visible.)
    all_events = len(a.events) + len(b.events) + len(c.events)

    async def metrics_agree() -> None:
        text = await worker.metrics_text()
        assert metric(text, "compactor_compactions_succeeded_total") == len(compactions) == 5
        assert label_values(text, "compactor_events_in_total", "outcome") == {"new": all_events}
        assert metric(text, "compactor_compactions_failed_total") == 0
        assert metric(text, "compactor_dead_lettered_total") == 0

    await eventually(metrics_agree, timeout=10, what="metrics")
    assert stack.dead_letters.records == []
    assert worker.alive
