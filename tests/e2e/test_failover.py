"""Workers coming and going: a crash mid-compaction, a worker joining mid-stream.

Why: Kafka redelivers whatever a dead or departing worker had not committed,
and the survivor must finish its work from there: with nothing lost (every
message stored or archived), nothing done twice (one compaction per
conversation, each message in one batch) and the token table still equal to
PostgreSQL. These are the properties the at-least-once design promises.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest

from tests.e2e.conftest import MARKERS, PARTITIONS, Conversation, Stack, eventually, interleave
from tests.support.worker import wait_for_split

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(180)]

# A killed worker is noticed when its session times out: 6 s instead of
# Faust's 60 s default (the broker allows down to 1 s), heartbeats every second.
FAST_FAILURE_DETECTION = {"BROKER_SESSION_TIMEOUT": "6", "BROKER_HEARTBEAT_INTERVAL": "1"}


async def assert_nothing_lost_or_duplicated(
    stack: Stack, conversations: list[Conversation]
) -> None:
    ids = [c.id for c in conversations]
    events = stack.clip_events()
    assert Counter(e.conversation_id for e in events.values()) == dict.fromkeys(ids, 1)
    compactions = await stack.pg_compactions()
    assert sorted(r["compaction_id"] for r in compactions) == sorted(events)
    assert Counter(r["conversation_id"] for r in compactions) == dict.fromkeys(ids, 1)
    batches = await stack.pg_batches()
    assert len({r["id"] for r in batches}) == len(batches), "duplicate archival ids"
    assert {r["compaction_id"] for r in batches} == set(events)
    sources = [i for r in batches if r["depth"] == 0 for i in r["source_message_ids"]]
    assert len(sources) == len(set(sources)), "a message was archived twice"
    for conv in conversations:
        (event,) = (e for e in events.values() if e.conversation_id == conv.id)
        live = [r["id"] for r in await stack.pg_history(conv.id)]
        archived = [
            i
            for r in batches
            if r["compaction_id"] == event.compaction_id and r["depth"] == 0
            for i in r["source_message_ids"]
        ]
        # Every message is either still live or in this compaction's batches, never both.
        assert set(live[1:]).isdisjoint(archived), conv.id
        assert sorted(live[1:] + archived) == sorted(conv.ids), f"{conv.id}: messages lost"
        assert live == [event.clip_archive.id, *event.kept_message_ids]
        assert sorted(archived) == sorted(event.compressed_message_ids)


async def test_sigkill_mid_compaction_survivor_finishes_without_loss_or_duplicates(
    stack: Stack,
) -> None:
    # Every LLM call takes 1.5 s and a compaction makes two of them (20
    # messages in chunks of 10), at most two compactions at a time per worker:
    # the victim is killed with some compactions committed and others in flight.
    stack.llm.latency_seconds = 1.5
    config = {
        "summarization": {"chunk_size": 10},
        "service": {"max_concurrent_compactions": 2, "command_timeout_seconds": 8.0},
    }
    w1 = stack.worker("w1", config=config, env=FAST_FAILURE_DETECTION)
    await w1.wait_ready(stack.names.messages)
    w2 = stack.worker("w2", config=config, env=FAST_FAILURE_DETECTION)
    owned = await wait_for_split([w1, w2], stack.names.messages, PARTITIONS)

    conversations = [Conversation(f"conv-{i:02d}-{m}", m) for i, m in enumerate(MARKERS[:8])]
    await stack.send_all(interleave(*(conv.until_over(0) for conv in conversations)))
    partition = {s.key.decode(): s.partition for s in stack.sent if s.key is not None}
    # The victim is the worker with more conversations: it has compactions
    # waiting for a slot when its first ones commit.
    (victim, victim_conversations), (survivor, _) = sorted(
        (
            (worker, {cid for cid, p in partition.items() if p in mine})
            for worker, mine in zip((w1, w2), owned, strict=True)
        ),
        key=lambda pair: -len(pair[1]),
    )
    assert len(victim_conversations) > 2, f"conversations by partition: {partition}"

    async def victim_has_committed_some_but_not_all() -> None:
        done = {r["conversation_id"] for r in await stack.pg_compactions()}
        assert done & victim_conversations, "the victim has committed nothing yet"
        assert victim_conversations - done, "the victim has committed everything"

    await eventually(
        victim_has_committed_some_but_not_all, timeout=60, what="victim mid-way", interval=0.1
    )
    victim.kill()
    killed_at = time.monotonic()
    # A COMMIT the victim sent just before dying is still applied: let it land.
    await asyncio.sleep(0.5)
    done_at_kill = {r["conversation_id"] for r in await stack.pg_compactions()}
    assert victim_conversations - done_at_kill, "nothing left for the survivor to take over"

    # The survivor is given the victim's partitions once its session expires...
    async def survivor_owns_everything() -> None:
        assert await survivor.assigned(stack.names.messages) == set(range(PARTITIONS))

    await eventually(survivor_owns_everything, timeout=40, what="survivor owns all partitions")
    # ...and finishes every conversation, the victim's included.
    await stack.wait_for_clip_events({c.id: 1 for c in conversations}, timeout=90)
    await stack.wait_idle(survivor, [c.id for c in conversations], timeout=40)
    await assert_nothing_lost_or_duplicated(stack, conversations)
    assert survivor.alive and not victim.alive
    # What the victim committed before it died is not summarised again (the
    # survivor finds those compaction ids applied); what it had in flight is.
    marker_of = {c.id: c.marker for c in conversations}
    summarised_after_kill = {
        m
        for r in stack.llm.requests
        if r.received_at > killed_at
        for m in marker_of.values()
        if m in json.dumps(r.body)
    }
    assert summarised_after_kill.isdisjoint(
        marker_of[c] for c in done_at_kill & victim_conversations
    )
    assert {marker_of[c] for c in victim_conversations - done_at_kill} <= summarised_after_kill


async def test_worker_joining_mid_stream_loses_no_message(stack: Stack) -> None:
    """Records a rebalance catches in flight are read again by their new owner,
    also on partitions that had nothing committed yet."""
    w1 = stack.worker("w1")
    await w1.wait_ready(stack.names.messages)
    conversations = [Conversation(f"conv-{i:02d}-{m}", m) for i, m in enumerate(MARKERS[:8])]
    traffic = interleave(*(conv.until_over(0) for conv in conversations))
    w2 = stack.worker("w2")
    # Trickle the traffic over the seconds the second worker needs to join,
    # so that the rebalance happens while records are arriving.
    pause = 6.0 / len(traffic)
    for event in traffic:
        await stack.send(event)
        await asyncio.sleep(pause)
    await wait_for_split([w1, w2], stack.names.messages, PARTITIONS)
    await stack.wait_for_clip_events({c.id: 1 for c in conversations}, timeout=60)
    entries = await stack.wait_idle(w1, [c.id for c in conversations], timeout=30)
    await assert_nothing_lost_or_duplicated(stack, conversations)
    assert all(e["compactions"] == 1 for e in entries.values())
    stored = await stack.db.fetchval("SELECT count(*) FROM messages WHERE kind = 'message'")
    archived = await stack.db.fetchval(
        "SELECT count(*) FROM archival_memory, unnest(source_message_ids) WHERE depth = 0"
    )
    assert (
        stored + archived
        == len(traffic)
        == len({json.loads(s.value)["message_id"] for s in stack.sent})
    )
