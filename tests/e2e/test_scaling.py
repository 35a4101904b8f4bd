"""Two workers in one consumer group share the conversations, without duplicates.

Why: the service scales by adding workers. That only works if Kafka's
partitioning really gives each conversation (its messages, its table entry,
its commands) to exactly one worker, and the views answer for any
conversation whichever worker is asked.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.e2e.conftest import MARKERS, PARTITIONS, Conversation, Stack, eventually, interleave
from tests.support.metrics_text import label_values, metric
from tests.support.worker import WorkerProcess, wait_for_split

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(180)]

CONVERSATIONS = 12


async def test_two_workers_split_the_partitions_and_compact_every_conversation_once(
    stack: Stack,
) -> None:
    w1 = stack.worker("w1")
    await w1.wait_ready(stack.names.messages)
    w2 = stack.worker("w2")
    owned = await wait_for_split([w1, w2], stack.names.messages, PARTITIONS)
    # Each worker owns a conversation's whole pipeline: its messages, control
    # records, table changelog and commands are all co-partitioned.
    for worker, partitions in zip((w1, w2), owned, strict=True):
        health = await worker.get_json("/healthz")
        for topic in (
            stack.names.control,
            stack.names.commands,
            f"{stack.app_id}-conversations-changelog",
        ):
            assert {
                int(e.rpartition(":")[2])
                for e in health["assigned_partitions"]
                if e.rpartition(":")[0] == topic
            } == partitions, topic

    conversations = [
        Conversation(f"conv-{i:02d}-{marker}", marker)
        for i, marker in enumerate(MARKERS[:CONVERSATIONS])
    ]
    assert len(conversations) == CONVERSATIONS
    await stack.send_all(interleave(*(conv.until_over(0) for conv in conversations)))
    partition_of = {}
    for sent in stack.sent:
        assert sent.key is not None
        partition_of.setdefault(sent.key.decode(), set()).add(sent.partition)
    assert all(len(p) == 1 for p in partition_of.values()), "one partition per conversation"
    partition = {cid: next(iter(p)) for cid, p in partition_of.items()}
    on_w1 = [cid for cid, p in partition.items() if p in owned[0]]
    on_w2 = [cid for cid, p in partition.items() if p in owned[1]]
    assert on_w1 and on_w2, f"12 conversations should land on both workers: {partition}"

    await stack.wait_for_clip_events({conv.id: 1 for conv in conversations}, timeout=90)
    ids = [conv.id for conv in conversations]
    # Either worker answers for every conversation (table_route forwards to the owner).
    entries_via_w1 = await stack.wait_idle(w1, ids, timeout=30)
    entries_via_w2 = await stack.wait_idle(w2, ids, timeout=30)
    assert entries_via_w1 == entries_via_w2

    events = stack.clip_events()
    assert Counter(e.conversation_id for e in events.values()) == dict.fromkeys(ids, 1)
    compactions = await stack.pg_compactions()
    assert sorted(r["compaction_id"] for r in compactions) == sorted(events)
    assert Counter(r["conversation_id"] for r in compactions) == dict.fromkeys(ids, 1)

    batches = await stack.pg_batches()
    assert len({r["id"] for r in batches}) == len(batches)
    assert {r["compaction_id"] for r in batches} == set(events)
    sources = [i for r in batches if r["depth"] == 0 for i in r["source_message_ids"]]
    assert len(sources) == len(set(sources)), "a message was compressed more than once"
    for conv in conversations:
        (event,) = (e for e in events.values() if e.conversation_id == conv.id)
        live = [r["id"] for r in await stack.pg_history(conv.id)]
        assert live == [event.clip_archive.id, *event.kept_message_ids]
        assert sorted(live[1:] + list(event.compressed_message_ids)) == sorted(conv.ids)
        assert entries_via_w1[conv.id]["compactions"] == 1

    # Each worker did exactly the work of the partitions it owns.
    for worker, mine in ((w1, on_w1), (w2, on_w2)):
        sent_here = sum(len(c.events) for c in conversations if c.id in mine)

        async def did_its_share(
            worker: WorkerProcess = worker, mine: list[str] = mine, sent_here: int = sent_here
        ) -> None:
            text = await worker.metrics_text()
            assert metric(text, "compactor_compactions_succeeded_total") == len(mine)
            assert label_values(text, "compactor_events_in_total", "outcome") == {"new": sent_here}

        await eventually(did_its_share, timeout=10, what=f"metrics of {worker.name}")
    assert w1.alive and w2.alive
