"""A record with text no store can hold is dead-lettered at once, and its partition flows.

Why: a NUL in a message's content passed validation, PostgreSQL refused it,
and the worker retried it as an unknown error (five times for its group, five
alone): about 12 s of a stalled partition per such record. Now it is refused
at validation (``invalid_text``) and the next record of the same partition,
in the same conversation, is stored within a few seconds, with no retry.
A record that passes validation but breaks a rule of the schema (a CHECK,
NOT NULL) is refused by PostgreSQL as ``StoreRejected`` and dead-lettered at
once the same way, with the database's reason.
"""

from __future__ import annotations

import json
import time

import pytest

from streams.dead_letter_headers import DeadLetterHeaders
from tests.e2e.conftest import Stack, eventually
from tests.support.metrics_text import label_values

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def event(message_id: str, content: str, **fields: object) -> dict[str, object]:
    return {
        "schema_version": 1,
        "message_id": message_id,
        "conversation_id": "conv-text",
        "role": "user",
        "content": content,
        "created_at": "2026-05-01T09:00:00+00:00",
        **fields,
    }


async def test_a_nul_record_is_dead_lettered_at_once_and_the_next_one_is_stored(
    stack: Stack,
) -> None:
    worker = stack.worker("w1", config={"service": {"max_content_chars": 500}})
    await worker.wait_ready(stack.names.messages)
    warm = await stack.send(event("warm-up", "hello"))  # the pipeline is open end to end
    await eventually(lambda: _stored(stack, ["warm-up"]), timeout=30, what="the warm-up")

    key = b"conv-text"
    surrogate = json.dumps(event("bad-surrogate", "x")).replace('"x"', '"x\\ud800"').encode()
    arguments = {"id": "t1", "name": "run", "arguments": {"blob": "y" * 600}}
    bad = [
        (
            await stack.send_raw(json.dumps(event("bad-nul", "a\u0000b")).encode(), key),
            "invalid_text",
        ),
        (await stack.send_raw(surrogate, key), "invalid_text"),
        (
            await stack.send_raw(
                json.dumps(
                    event("bad-args", "", role="assistant", tool_calls=[arguments])
                ).encode(),
                key,
            ),
            "oversized_arguments",
        ),
    ]
    started = time.monotonic()
    good = await stack.send(event("good-after", "the valid one behind them"))
    assert good.partition == warm.partition == bad[0][0].partition

    await eventually(lambda: _stored(stack, ["warm-up", "good-after"]), timeout=10, what="stored")
    assert time.monotonic() - started < 5, "the valid record waited behind the bad ones"

    records = await stack.dead_letters.wait_for(
        lambda records: len(records) >= len(bad), timeout=10, what="dead letters"
    )
    by_offset = {int(r.header("dlq.source_offset")): r for r in records}
    for sent, error_type in bad:
        record = by_offset[sent.offset]
        assert record.value == sent.value
        assert DeadLetterHeaders.from_kafka(list(record.headers)).error_type == error_type

    text = await worker.metrics_text()
    assert label_values(text, "compactor_dead_lettered_total", "error_type") == {
        "invalid_text": 2,
        "oversized_arguments": 1,
    }
    assert label_values(text, "compactor_accounting_retries_total", "error_type") == {}  # no retry
    stored = await stack.db.fetchval("SELECT count(*) FROM messages WHERE id LIKE 'bad-%'")
    assert stored == 0


async def _stored(stack: Stack, ids: list[str]) -> None:
    found = await stack.db.fetch(
        "SELECT id FROM messages WHERE conversation_id = 'conv-text' ORDER BY id"
    )
    assert sorted(ids) == [row["id"] for row in found]


async def test_a_record_a_constraint_refuses_is_dead_lettered_at_once_with_the_reason(
    stack: Stack,
) -> None:
    """Past validation, PostgreSQL refuses the row (a CHECK added here, as a
    deployment or a later migration might): the record is dead-lettered at once as
    ``store_rejected`` with the database's reason, and the next record of its
    partition is stored within seconds; nothing is waited out as an outage."""
    await stack.db.execute(
        "ALTER TABLE messages ADD CONSTRAINT no_forbidden_words "
        "CHECK (content NOT LIKE '%forbidden%')"
    )
    worker = stack.worker("w1")
    await worker.wait_ready(stack.names.messages)
    warm = await stack.send(event("warm-up", "hello"))
    await eventually(lambda: _stored(stack, ["warm-up"]), timeout=30, what="the warm-up")

    started = time.monotonic()
    bad = await stack.send(event("bad-check", "a forbidden word"))
    good = await stack.send(event("good-after", "the valid one behind it"))
    assert good.partition == bad.partition == warm.partition

    await eventually(lambda: _stored(stack, ["warm-up", "good-after"]), timeout=10, what="stored")
    assert time.monotonic() - started < 5, "the valid record waited behind the refused one"
    (record,) = await stack.dead_letters.wait_for(
        lambda records: len(records) >= 1, timeout=10, what="the dead letter"
    )
    headers = DeadLetterHeaders.from_kafka(list(record.headers))
    assert (headers.source_offset, record.value) == (bad.offset, bad.value)
    assert headers.error_type == "store_rejected"
    assert "CheckViolationError" in headers.reason and "no_forbidden_words" in headers.reason
    text = await worker.metrics_text()
    assert label_values(text, "compactor_accounting_retries_total", "error_type") == {}
