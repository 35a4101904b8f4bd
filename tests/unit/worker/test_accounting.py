"""The accounting component: messages stored and tallied, commands issued, completions applied."""

from __future__ import annotations

import pytest

from core.domain.tally import compaction_id_for
from streams.dead_letter_headers import DeadLetterHeaders
from streams.events import MessageEvent, ReconcileRequest
from tests.support.builders import T0
from tests.support.metrics_text import sample
from tests.unit.worker.harness import NAMES, compacted, harness

pytestmark = pytest.mark.unit


async def test_a_new_conversation_is_stored_and_tallied_without_a_command() -> None:
    h = harness()
    await h.message(0, "hello there")
    tally = h.tally()
    assert (tally.token_total, tally.message_count) == (3, 1)
    assert tally.outstanding is None
    assert h.store.message_ids() == ["c1-m0000"]
    assert h.publisher.sent == []
    assert h.table["c1"]["token_total"] == 3  # the table holds plain dicts (its changelog is JSON)


async def test_a_redelivered_message_is_stored_and_counted_once() -> None:
    h = harness()
    await h.message(0, "hello there")
    await h.message(1, "how are you")
    await h.message(0, "hello there")
    tally = h.tally()
    assert (tally.token_total, tally.message_count) == (6, 2)
    assert len(h.store.messages) == 2
    duplicates = sample(h.components.metrics, "compactor_events_in_total", outcome="duplicate")
    assert duplicates == 1


async def test_two_conversations_may_use_the_same_message_id() -> None:
    """Ids are unique within a conversation (the tables' keys start with it)."""
    h = harness()
    for conversation in ("c1", "c2", "c1"):
        event = MessageEvent(
            message_id="m1",
            conversation_id=conversation,
            role="user",
            content="hello there",
            created_at=T0,
        )
        await h.components.accounting.handle(
            h.record(NAMES.messages, conversation, event.model_dump_json())
        )
    assert h.store.message_ids("c1") == h.store.message_ids("c2") == ["m1"]
    assert h.tally("c1").message_count == h.tally("c2").message_count == 1


async def test_crossing_the_budget_issues_exactly_one_command() -> None:
    h = harness()
    for i in range(8):  # 8 x ~100 tokens: over the 200-token budget from the third on
        await h.message(i, "x" * 400)
    commands = h.commands()
    assert len(commands) == 1
    command = commands[0]
    assert command.compaction_id == compaction_id_for("c1", 0)
    assert command.conversation_id == "c1" and command.generation == 0
    assert command.up_to_seq == 3  # the arrival number of the message that crossed
    assert h.publisher.on("commands")[0].key == b"c1"
    assert h.tally().outstanding == command.compaction_id


async def test_a_completion_is_applied_once() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)
    outstanding = h.tally().outstanding
    assert outstanding is not None
    completed = compacted(outstanding, generation=0)
    del h.store.messages["c1", "c1-m0000"], h.store.messages["c1", "c1-m0001"]  # compacted
    await h.control(completed)
    after = h.tally()
    assert (after.token_total, after.message_count) == (100, 1)  # the store's counts
    assert (after.generation, after.compactions, after.outstanding) == (1, 1, None)
    await h.control(completed)  # redelivered
    assert h.tally() == after
    assert len(h.commands()) == 1


async def test_a_stale_completion_is_ignored() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)
    before = h.tally()
    stale = compacted(compaction_id_for("c1", 7), generation=7)
    await h.control(stale)
    assert h.tally() == before


async def test_reconcile_reissues_the_same_command_id_after_the_timeout() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)
    request = ReconcileRequest(conversation_id="c1", requested_at=T0)
    await h.control(request)  # within the timeout: nothing
    assert len(h.commands()) == 1
    h.clock.now += 61
    await h.control(request)
    first, again = h.commands()
    assert again.compaction_id == first.compaction_id
    assert again.reason == "reconcile"
    assert sample(h.components.metrics, "compactor_commands_issued_total", reason="reconcile") == 1


@pytest.mark.parametrize(
    ("key", "value", "error_type", "reason"),
    [
        (b"c1", b"{not json", "invalid_json", "Invalid JSON"),
        (b"c1", b'{"message_id": "m1"}', "invalid_event", "conversation_id: Field required"),
        (None, b"{}", "missing_key", "record has no key"),
        (b"\xff\xfe", b"{}", "bad_key", "not UTF-8"),
        (b"c2", None, "key_mismatch", "is not its conversation_id"),
    ],
)
async def test_a_malformed_record_is_dead_lettered_with_its_reason(
    key: bytes | None, value: bytes | None, error_type: str, reason: str
) -> None:
    h = harness()
    if value is None:
        value = (
            MessageEvent(
                message_id="m1", conversation_id="c1", role="user", content="hi", created_at=T0
            )
            .model_dump_json()
            .encode()
        )
    record = h.record(NAMES.messages, key, value)
    await h.components.accounting.handle(record)
    (letter,) = h.publisher.sent
    assert letter.topic == "dead_letters"
    assert (letter.key, letter.value) == (key, value)  # the original bytes, untouched
    headers = DeadLetterHeaders.from_kafka(list(letter.headers))
    assert headers.error_type == error_type
    assert reason in headers.reason
    assert (headers.source_topic, headers.source_offset) == (NAMES.messages, record.offset)
    assert h.store.messages == {} and h.table == {}
    assert sample(h.components.metrics, "compactor_events_in_total", outcome="dead_lettered") == 1


async def test_an_oversized_message_is_dead_lettered_naming_the_setting() -> None:
    h = harness(max_content_chars=10)
    await h.message(0, "x" * 11)
    (letter,) = h.publisher.sent
    headers = DeadLetterHeaders.from_kafka(list(letter.headers))
    assert headers.error_type == "oversized"
    assert "[service].max_content_chars" in headers.reason
