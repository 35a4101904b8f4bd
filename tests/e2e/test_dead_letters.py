"""Records the service cannot use go to the dead-letter topic, untouched.

Why: one malformed record from one producer must neither stop the worker
nor hold up everyone else's conversations, and the record must be kept
exactly as it came (original bytes, key, and where it came from) so it can
be fixed and sent again.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from core.domain.tally import compaction_id_for
from streams.dead_letter_headers import DeadLetterHeaders
from tests.e2e.conftest import KEEP_RECENT, Conversation, Stack, eventually
from tests.support.kafka_io import Sent
from tests.support.metrics_text import label_values

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

MAX_CONTENT = 500  # valid messages carry 160 characters


async def test_bad_records_are_dead_lettered_with_their_bytes_while_good_traffic_flows(
    stack: Stack,
) -> None:
    worker = stack.worker("w1", config={"service": {"max_content_chars": MAX_CONTENT}})
    await worker.wait_ready(stack.names.messages)
    good = Conversation("conv-good", "harbor")
    valid = good.until_over(0)
    squatter = f"clip-archive-{compaction_id_for(good.id, 0)}"

    def event(**fields: object) -> dict[str, object]:
        base: dict[str, object] = {
            "schema_version": 1,
            "message_id": "bad-1",
            "conversation_id": "conv-bad",
            "role": "user",
            "content": "hello",
            "created_at": "2026-05-01T09:00:00+00:00",
        }
        base.update(fields)
        return {k: v for k, v in base.items() if v is not None}

    # (key, value, expected error type, words the reason must contain)
    bad: list[tuple[bytes | None, bytes, str, tuple[str, ...]]] = [
        (b"conv-bad", b'{"message_id": "bad-json", "conversation_id": ', "invalid_json", ("json",)),
        (
            b"conv-bad",
            json.dumps(event(message_id="bad-role", role="wizard")).encode(),
            "invalid_event",
            ("role",),
        ),
        (
            b"conv-bad",
            json.dumps(event(message_id="bad-missing", content=None, created_at=None)).encode(),
            "invalid_event",
            ("content", "created_at", "required"),
        ),
        (
            b"conv-someone-else",
            json.dumps(event(message_id="bad-key")).encode(),
            "key_mismatch",
            ("conv-someone-else", "conv-bad"),
        ),
        (None, json.dumps(event(message_id="bad-no-key")).encode(), "missing_key", ("key",)),
        (
            b"conv-bad",
            json.dumps(event(message_id="bad-size", content="x" * (MAX_CONTENT + 1))).encode(),
            "oversized",
            (str(MAX_CONTENT + 1), str(MAX_CONTENT), "max_content_chars"),
        ),
        # The id of the good conversation's first clip-archive: stored, it would
        # fail every apply of that compaction on the unique key (issue 29).
        (
            good.id.encode(),
            json.dumps(event(message_id=squatter, conversation_id=good.id, content="x")).encode(),
            "reserved_id",
            ("clip-archive-", "reserves"),
        ),
    ]

    # Bad records interleaved with the good conversation, the last good message
    # (the one that crosses the budget) after all of them.
    sent_bad: list[tuple[Sent, str, tuple[str, ...]]] = []
    step = len(valid) // (len(bad) + 1)
    for i, (key, value, error_type, words) in enumerate(bad):
        await stack.send_all(valid[i * step : (i + 1) * step])
        sent_bad.append((await stack.send_raw(value, key), error_type, words))
    await stack.send_all(valid[len(bad) * step :])

    records = await stack.dead_letters.wait_for(
        lambda records: len(records) >= len(bad), timeout=30, what="dead letters"
    )
    assert len(records) == len(bad)
    by_origin = {
        (r.header("dlq.source_partition"), r.header("dlq.source_offset")): r for r in records
    }
    for sent, error_type, words in sent_bad:
        record = by_origin[(str(sent.partition), str(sent.offset))]
        assert record.value == sent.value, "the original bytes, untouched"
        assert record.key == sent.key
        headers = DeadLetterHeaders.from_kafka(list(record.headers))
        assert headers.error_type == error_type
        assert headers.source_topic == stack.names.messages
        assert (headers.source_partition, headers.source_offset) == (sent.partition, sent.offset)
        assert isinstance(headers.failed_at, datetime)
        reason = headers.reason.lower()
        assert all(word.lower() in reason for word in words), (error_type, headers.reason)

    # The good conversation was compacted as if nothing had happened.
    await stack.wait_for_clip_events({good.id: 1}, timeout=30)
    entries = await stack.wait_idle(worker, [good.id], timeout=20)
    assert entries[good.id]["message_count"] == KEEP_RECENT + 1
    assert entries[good.id]["compactions"] == 1
    # Nothing of the bad records was stored or counted anywhere.
    stored = await stack.db.fetchval(
        "SELECT count(*) FROM messages WHERE id LIKE 'bad-%' OR conversation_id <> $1", good.id
    )
    assert stored == 0
    status, _ = await worker.get("/conversations/conv-bad")
    assert status == 404

    async def counted() -> None:
        text = await worker.metrics_text()
        assert label_values(text, "compactor_events_in_total", "outcome") == {
            "new": len(valid),
            "dead_lettered": len(bad),
        }
        assert label_values(text, "compactor_dead_lettered_total", "error_type") == {
            "invalid_json": 1,
            "invalid_event": 2,
            "key_mismatch": 1,
            "missing_key": 1,
            "oversized": 1,
            "reserved_id": 1,
        }

    await eventually(counted, timeout=10, what="dead letters counted")
    assert worker.alive
    health = await worker.health()
    assert health is not None and health["status"] == "ok"
