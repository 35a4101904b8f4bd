"""Token accounting through a real worker: provider-reported counts and redeliveries.

Why: the budget decision is only as good as the count behind it. A producer
that knows the model's real token count sends it, and the service must budget
with that number (not its own estimate), subtract exactly that number when
the message is compacted away, and not count a redelivered message twice.
"""

from __future__ import annotations

import math

import pytest

from tests.e2e.conftest import BUDGET_TOKENS, KEEP_RECENT, Conversation, Stack, eventually
from tests.support.llm_server import MESSAGE_OVERHEAD_TOKENS, stand_in_tokens
from tests.support.metrics_text import label_values
from tests.support.worker import WorkerProcess

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


class Ledger(Conversation):
    """Invoice lines: numbers and punctuation, which a tokenizer splits finer than
    characters / 4 (the stand-in counts ~0.33 tokens a character), as tool output
    and ids are: the undercount that lets a history outgrow the model's context."""

    def text(self, n: int) -> str:
        parts = [f"{self.marker} ledger {n}:"]
        i = n
        while len(" ".join(parts)) < self.chars:
            parts.append(
                f"invoice {(i * 7919) % 100000:05d} paid {(i * 104729) % 10000}.{i % 100:02d} EUR;"
            )
            i += 1
        return " ".join(parts)[: self.chars]


def relative_error(counts: list[int], truth: list[int]) -> float:
    return sum(abs(c - t) / t for c, t in zip(counts, truth, strict=True)) / len(truth)


async def test_the_calibrated_estimate_converges_on_the_providers_count(stack: Stack) -> None:
    """``[budget].token_estimate = "calibrated"`` (the default; this stack pins
    "chars"): the LLM test server counts tokens with its stand-in tokenizer, not
    characters / 4. Once a compaction's calls were measured, messages are stored
    at the measured tokens per character, nearer the server's count of them than
    the estimate was (on invoice-like turns, which characters / 4 undercounts), a restarted worker keeps the rate, and the table still
    agrees with PostgreSQL."""
    calibrated = {"budget": {"token_estimate": "calibrated"}}
    worker = stack.worker("w1", config=calibrated)
    await worker.wait_ready(stack.names.messages)
    first = Ledger("conv-calibrating", "amber")
    await stack.send_all(first.until_over(0))  # nothing measured yet: characters / 4
    await stack.wait_for_clip_events({first.id: 1}, timeout=30)
    await stack.wait_idle(worker, [first.id], timeout=30)
    saved = await stack.db.fetchrow(
        "SELECT tokens, chars, measured FROM token_calibration WHERE provider = 'openai'"
        " AND model = 'test-model'"
    )
    assert saved is not None and saved["measured"] >= 1
    rate = saved["tokens"] / saved["chars"]

    probe = Ledger("conv-probe", "birch", chars=400)
    events = [probe.message() for _ in range(4)]
    await stack.send_all(events)

    async def counted(by: WorkerProcess, expected: int) -> None:
        body = await by.get_json(f"/conversations/{probe.id}")
        assert body["message_count"] == expected, body

    await eventually(lambda: counted(worker, 4), timeout=20, what="four probe messages counted")
    entries = await stack.wait_idle(worker, [probe.id], timeout=30)
    rows = await stack.db.fetch(
        "SELECT content, token_estimate FROM messages WHERE conversation_id = $1 ORDER BY id",
        probe.id,
    )
    stored = [r["token_estimate"] for r in rows]
    assert stored == [math.ceil(len(r["content"]) * rate) for r in rows]
    provider = [stand_in_tokens(r["content"]) + MESSAGE_OVERHEAD_TOKENS for r in rows]
    estimated = [math.ceil(len(r["content"]) / 4) for r in rows]
    # characters / 4 undercounts this text; the measured rate moves every count
    # toward the server's, not past it (one compaction measured: part of the way).
    assert all(e < s <= p for e, s, p in zip(estimated, stored, provider, strict=True))
    assert relative_error(stored, provider) < 0.6 * relative_error(estimated, provider)
    assert entries[probe.id]["token_total"] == sum(stored) == (await stack.pg_tally(probe.id))[0]

    # A restarted worker counts at the saved rate from its first message on.
    assert await worker.stop_async() == 0, worker.log_tail()
    second = stack.worker("w2", config=calibrated)
    await second.wait_ready(stack.names.messages)
    late = probe.message()
    await stack.send(late)
    await eventually(lambda: counted(second, 5), timeout=30, what="the late message counted")
    entries = await stack.wait_idle(second, [probe.id], timeout=30)
    (row,) = await stack.db.fetch(
        "SELECT token_estimate FROM messages WHERE id = $1", late["message_id"]
    )
    assert row["token_estimate"] == math.ceil(len(str(late["content"])) * rate)
    assert entries[probe.id]["token_total"] == (await stack.pg_tally(probe.id))[0]
