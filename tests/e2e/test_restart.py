"""A worker restarted under the same app id picks up exactly where the last one stopped.

Why: with the in-memory store nothing survives on disk; the token table must
come back from its changelog topic, committed offsets must keep old messages
from being counted again, and new messages must be accounted on top. A
table reset would, among other things, restart generations at 0 and re-use
compaction ids that are already applied, so the next compaction would be
skipped as a replay.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import KEEP_RECENT, Conversation, Stack, eventually, tokens_of
from tests.support.metrics_text import label_values, metric

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(150)]


async def test_graceful_restart_restores_the_table_from_its_changelog(stack: Stack) -> None:
    # Nothing is flushed or acked on a timer: only the graceful stop can leave the
    # changelog current and the offsets committed, which is what this checks.
    first = stack.worker("first", config={"service": {"table_flush_seconds": 3600}})
    await first.wait_ready(stack.names.messages)
    compacted = Conversation("conv-compacted", "meadow")
    small = Conversation("conv-small", "pebble")
    await stack.send_all(compacted.until_over(0))
    await stack.send_all([small.message() for _ in range(5)])
    await stack.wait_for_clip_events({compacted.id: 1}, timeout=30)
    # Sent after the compaction: had they been sent before it, a lagging worker could
    # count them in the group that crossed the budget, so the command's cut (the
    # group's newest message) would cover them and they would be compacted too.
    await stack.send_all([compacted.message() for _ in range(3)])

    # The clip-archive can be out before the last three messages are consumed
    # (a loaded machine): idle with all of them stored and counted, not just idle.
    # Whether the compaction kept those three or compressed them depends on how
    # the worker grouped what it read: a first group holding all of
    # conv-compacted's messages is counted from the store, and its command covers
    # everything counted (up_to_seq), so only "stored and counted" is fixed here.
    sent = [e["message_id"] for e in (*compacted.events, *small.events)]

    async def all_counted() -> dict[str, dict[str, Any]]:
        stored = await stack.db.fetchval(
            "SELECT (SELECT count(*) FROM messages WHERE id = ANY($1::text[])) "
            "+ (SELECT count(*) FROM archived_messages WHERE id = ANY($1::text[]))",
            sent,
        )
        assert stored == len(sent), f"{stored} of {len(sent)} sent messages stored"
        entries = await stack.wait_idle(first, [compacted.id, small.id], timeout=30)
        assert entries[compacted.id]["message_count"] in (KEEP_RECENT + 1, KEEP_RECENT + 1 + 3)
        assert entries[small.id]["message_count"] == 5, entries
        return entries

    before = await eventually(all_counted, timeout=60, what="every message sent counted")
    assert before[compacted.id]["compactions"] == 1

    assert await first.stop_async() == 0, first.log_tail()

    second = stack.worker("second")  # same app id, prefix and database; fresh memory store
    await second.wait_ready(stack.names.messages)

    # The entries come back before any new message arrives: restored from the
    # changelog (a missing entry is only rebuilt when a message needs it).
    # Polled, because /healthz reports the assignment before recovery ends.
    async def restored() -> None:
        for cid in (compacted.id, small.id):
            status, body = await second.get(f"/conversations/{cid}")
            assert (status, body) == (200, before[cid])

    await eventually(restored, timeout=20, what="table restored from the changelog")

    # New messages are accounted on top: the small one grows, the compacted one
    # crosses the budget again and gets its second compaction (generation 1).
    total, _ = await stack.pg_tally(compacted.id)
    crossing = compacted.until_over(total)
    more_small = [small.message() for _ in range(2)]
    await stack.send_all(more_small + crossing)
    await stack.wait_for_clip_events({compacted.id: 2}, timeout=30)
    after = await stack.wait_idle(second, [compacted.id, small.id], timeout=30)
    assert after[small.id]["message_count"] == 7
    assert after[small.id]["token_total"] == sum(tokens_of(e) for e in small.events)
    assert after[compacted.id]["compactions"] == 2
    assert after[compacted.id]["generation"] == 2
    events = sorted(
        (e for e in stack.clip_events().values() if e.conversation_id == compacted.id),
        key=lambda e: e.generation,
    )
    assert [e.generation for e in events] == [0, 1]
    assert len({e.compaction_id for e in events}) == 2
    assert len(await stack.pg_compactions()) == 2

    # Offsets were committed at shutdown: the second worker read only what was
    # sent after the restart, nothing twice.
    async def counted_once() -> None:
        text = await second.metrics_text()
        assert label_values(text, "compactor_events_in_total", "outcome") == {
            "new": len(more_small) + len(crossing)
        }
        assert metric(text, "compactor_compactions_succeeded_total") == 1

    await eventually(counted_once, timeout=10, what="metrics of the second worker")
