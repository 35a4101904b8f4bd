"""Token accounting through a real worker: provider-reported counts and redeliveries.

Why: the budget decision is only as good as the count behind it. A producer
that knows the model's real token count sends it, and the service must budget
with that number (not its own estimate), subtract exactly that number when
the message is compacted away, and not count a redelivered message twice.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import BUDGET_TOKENS, KEEP_RECENT, Conversation, Stack, eventually
from tests.support.metrics_text import label_values

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

REPORTED = 95  # far above the ~4-token estimate of the short content below


async def test_provider_token_counts_drive_the_budget_and_the_table(stack: Stack) -> None:
    worker = stack.worker("w1")
    await worker.wait_ready(stack.names.messages)
    conv = Conversation("conv-reported", "quartz")

    # Eleven messages: 10 * 95 reported + ~10 estimated = ~960 tokens, under the
    # budget of 1000 (by the estimate alone: ~50). One of them has no count and
    # is estimated.
    for n in range(10):
        conv.message(content=f"quartz short {n}", token_count=REPORTED)
    estimated = conv.message(content="quartz estimated by the service itself")
    await stack.send_all(conv.events)

    async def counted() -> dict[str, object]:
        status, body = await worker.get(f"/conversations/{conv.id}")
        assert status == 200, body
        assert body["message_count"] == 11, body
        return body

    entry = await eventually(counted, timeout=20, what="eleven messages accounted")
    expected = 10 * REPORTED + len(str(estimated["content"])) // 4 + 1
    rows = await stack.db.fetch(
        "SELECT id, token_estimate FROM messages WHERE conversation_id = $1 ORDER BY id", conv.id
    )
    assert [r["token_estimate"] for r in rows] == [REPORTED] * 10 + [expected - 10 * REPORTED]
    assert entry["token_total"] == expected == (await stack.pg_tally(conv.id))[0]
    assert entry["over_budget"] is False
    assert entry["compaction_outstanding"] is None

    # A redelivered message (same id, even with another count) changes nothing.
    duplicate = dict(conv.events[0], token_count=500)
    await stack.send(duplicate)

    async def resynced() -> None:
        text = await worker.metrics_text()
        assert label_values(text, "compactor_events_in_total", "outcome").get("duplicate") == 1
        body = await worker.get_json(f"/conversations/{conv.id}")
        assert (body["token_total"], body["message_count"]) == (expected, 11), body

    await eventually(resynced, timeout=20, what="redelivery seen and ignored")

    # One more reported message crosses the budget: only the reported counts
    # can get there (the estimates sum to well under 100 tokens).
    crossing = conv.message(content="quartz crossing", token_count=REPORTED)
    await stack.send(crossing)
    assert expected + REPORTED > BUDGET_TOKENS
    await stack.wait_for_clip_events({conv.id: 1}, timeout=30)
    entries = await stack.wait_idle(worker, [conv.id], timeout=30)

    # The compaction subtracted the stored (reported) counts of what it removed:
    # the table still agrees with PostgreSQL to the token.
    (event,) = stack.clip_events().values()
    assert len(event.kept_message_ids) == KEEP_RECENT
    assert duplicate["message_id"] in event.compressed_message_ids
    live = await stack.pg_history(conv.id)
    count_of = {
        e["message_id"]: REPORTED if e.get("token_count") is not None else expected - 10 * REPORTED
        for e in conv.events
    }
    assert [r["token_estimate"] for r in live[1:]] == [count_of[i] for i in event.kept_message_ids]
    total, count = await stack.pg_tally(conv.id)
    assert entries[conv.id]["token_total"] == total
    assert entries[conv.id]["message_count"] == count == KEEP_RECENT + 1
    assert entries[conv.id]["compactions"] == 1

    # Redelivered after it was compacted away (a producer retry, a replayed
    # transcript, offsets lost in a crash): the message must not come back
    # next to the summary that already covers it.
    await stack.send(duplicate)

    async def second_redelivery_seen() -> None:
        text = await worker.metrics_text()
        assert label_values(text, "compactor_events_in_total", "outcome") == {
            "new": len(conv.events),
            "duplicate": 2,
        }

    await eventually(second_redelivery_seen, timeout=20, what="second redelivery consumed")
    entries = await stack.wait_idle(worker, [conv.id], timeout=20)
    assert [r["id"] for r in await stack.pg_history(conv.id)] == [
        event.clip_archive.id,
        *event.kept_message_ids,
    ]
    assert entries[conv.id]["token_total"] == total
    assert entries[conv.id]["message_count"] == KEEP_RECENT + 1
