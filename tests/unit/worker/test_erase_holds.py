"""An erase that holds: redeliveries, replays and lagging messages do not bring the
conversation back, a later message starts a new one with new compaction ids,
and nothing on the control topic can erase or resurrect it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from core.domain.tally import compaction_id_for
from core.ports.storage import IncomingMessage
from core.settings import parse_settings
from streams.dead_letter_headers import DeadLetterHeaders
from streams.events import (
    CompactionCompleted,
    EraseRequest,
    MessageEvent,
)
from streams.metrics import Metrics
from streams.worker.dead_letters import DeadLetters
from streams.worker.records import InvalidRecord, Record, decode_control
from tests.support.builders import T0
from tests.support.memory_store import RecordingPublisher
from tests.support.metrics_text import sample
from tests.support.stores import saved
from tests.unit.worker.harness import NAMES, Harness, harness, over_budget, words

pytestmark = pytest.mark.unit

CUTOFF = T0 + timedelta(hours=1)  # the erase's requested_at in these tests


def message_record(h: Harness, index: int, conversation: str = "c1", *, at: timedelta) -> Record:
    event = MessageEvent(
        message_id=f"{conversation}-m{index:04d}",
        conversation_id=conversation,
        role="user",
        content=words(20, f"topic{index}-"),
        created_at=T0 + at,
    )
    return h.record(NAMES.messages, conversation, event.model_dump_json())


def erased_count(h: Harness) -> float:
    return float(sample(h.components.metrics, "compactor_events_in_total", outcome="erased"))


async def test_redelivered_messages_after_an_erase_are_not_stored() -> None:
    h = harness()  # the clock is in 1970: only the offset mark can cover these
    records = [message_record(h, i, at=timedelta(seconds=i)) for i in range(3)]
    for record in records:
        await h.components.accounting.handle(record)
    await h.erase()
    for record in records:  # a crash before the commit, a rebalance: the same offsets again
        await h.components.accounting.handle(record)
    assert h.store.message_ids() == [] and "c1" not in h.store.tenants
    assert "c1" not in h.table
    assert erased_count(h) == 3
    assert h.publisher.on("dead_letters") == []


async def test_a_message_that_lagged_behind_the_erase_and_a_replay_are_not_stored() -> None:
    h = harness()
    h.clock.now = CUTOFF.timestamp()
    await h.components.accounting.handle(message_record(h, 0, at=timedelta(0)))
    lagging = message_record(h, 1, at=timedelta(hours=2))  # on the topic, read after the erase
    await h.erase(end_offsets={0: lagging.offset + 1})
    await h.components.accounting.handle(lagging)
    replayed = message_record(h, 0, at=timedelta(0))  # `compactor replay`: a new offset
    assert replayed.offset > lagging.offset
    await h.components.accounting.handle(replayed)
    assert h.store.message_ids() == [] and "c1" not in h.table
    assert erased_count(h) == 2


async def test_a_message_after_an_erase_starts_a_new_conversation_with_new_compaction_ids() -> None:
    h = harness()
    h.clock.now = CUTOFF.timestamp()
    first = await over_budget(h)
    assert first.compaction_id == compaction_id_for("c1", 0)
    await h.erase()
    for i in range(8):  # created after the erase, published after it
        await h.components.accounting.handle(message_record(h, 100 + i, at=timedelta(hours=2)))
    assert len(h.store.message_ids("c1")) == 8
    assert h.tally().epoch == 1
    (_, second) = h.commands()
    assert second.generation == 0
    assert second.compaction_id == compaction_id_for("c1", 0, 1) != first.compaction_id
    await h.erase(request_id="req-2")  # a second erase: epoch 2, ids change again
    await h.components.accounting.handle(message_record(h, 200, at=timedelta(hours=3)))
    assert h.tally().epoch == 2


async def test_a_noop_completion_queued_before_the_erase_does_not_rebuild_the_tally() -> None:
    h = harness()
    command = await over_budget(h)
    noop = CompactionCompleted(
        compaction_id=command.compaction_id,
        conversation_id="c1",
        generation=0,
        status="noop",
        messages_compressed=0,
        rows_removed=0,
        rows_added=0,
        tokens_removed=0,
        tokens_added=0,
        completed_at=T0,
    )
    await h.erase()
    await h.control(noop)
    assert "c1" not in h.table and h.components.table.get("c1") is None
    await h.control(noop)  # and a redelivery of it
    assert "c1" not in h.table


async def test_nothing_on_the_control_topic_can_erase() -> None:
    h = harness()
    await over_budget(h)
    stored = sorted(h.store.message_ids("c1"))
    # An EraseRequest written to the control topic is not an erase: dead-lettered.
    await h.erase(topic=NAMES.control)
    assert sorted(h.store.message_ids("c1")) == stored
    (letter,) = h.publisher.on("dead_letters")
    assert DeadLetterHeaders.from_kafka(list(letter.headers)).error_type == "invalid_event"
    # A forged completion for a conversation that has no table entry (stored, but
    # the entry is lost; and one never seen): no erase, no tombstone.
    h.table.clear()
    h.components.table.forget({0})
    forged = CompactionCompleted(
        compaction_id="forged",
        conversation_id="c1",
        generation=3,
        status="compacted",
        messages_compressed=1,
        rows_removed=1,
        rows_added=1,
        tokens_removed=1,
        tokens_added=1,
        completed_at=T0,
    )
    await h.control(forged)
    await h.control(forged.model_copy(update={"conversation_id": "never-seen"}))
    assert sorted(h.store.message_ids("c1")) == stored
    assert [p for p in h.publisher.on("clip_archives") if p.value is None] == []
    assert h.store.audit == [] and h.erase_completions() == []
    assert "never-seen" not in h.table


async def test_an_erase_is_audited_once_and_its_completion_carries_the_counts() -> None:
    h = harness()
    await over_budget(h)
    await h.erase(request_id="req-1")
    await h.erase(request_id="req-1")  # redelivered
    first, again = h.erase_completions()
    assert first.request_id == again.request_id == "req-1"
    assert first.counts["messages"] == 8 and again.counts == first.counts
    assert first.epoch == again.epoch == 1
    (entry,) = h.store.audit
    assert (entry.request_id, entry.requester, entry.reason) == ("req-1", "ops", "user asked")
    assert entry.counts["messages"] == 8
    await h.erase(request_id="req-2")
    assert h.erase_completions()[-1].epoch == 2 and len(h.store.audit) == 2


async def test_a_redacted_dead_letter_has_no_content() -> None:
    """Redacted is the default (settings and component alike): after an erase, a
    conversation's rejected records keep no content for the dead letters' retention."""
    assert parse_settings({}).kafka.dead_letter_content == "redacted"
    secret = b'{"content": "my card number is 4111"}'
    record = Record(NAMES.messages, 2, 41, b"c1", secret)
    error = InvalidRecord("not a MessageEvent", "invalid_event")
    full, redacted = RecordingPublisher(), RecordingPublisher()
    await DeadLetters(full, Metrics(), content="full").send(record, error)
    await DeadLetters(redacted, Metrics()).send(record, error)
    assert full.sent[0].value == secret
    (letter,) = redacted.sent
    assert letter.value is None and letter.key == b"c1"
    assert all(b"4111" not in value for _, value in letter.headers)
    headers = DeadLetterHeaders.from_kafka(list(letter.headers))
    assert headers.redacted and headers.original_size == len(secret)
    assert (headers.source_partition, headers.source_offset) == (2, 41)
    assert headers.error_type == "invalid_event"


async def test_the_store_marks_cover_save_message_too() -> None:
    h = harness()
    h.clock.now = CUTOFF.timestamp()
    await h.components.accounting.handle(message_record(h, 0, at=timedelta(0)))
    await h.erase(end_offsets={3: 10})
    late = MessageEvent(
        message_id="late",
        conversation_id="c1",
        role="user",
        content="x",
        created_at=T0 + timedelta(hours=2),
    ).to_message()
    assert not await saved(h.store, late, 1, partition=3, offset=10 - 1)
    assert await saved(h.store, late, 1, partition=3, offset=10)
    outcome = await h.store.ingest.save_messages([IncomingMessage(late, 1, 3, 5)])
    assert [o.status for o in outcome] == ["erased"]


def test_erase_requests_are_not_control_events() -> None:
    request = EraseRequest(
        request_id="r", conversation_id="c1", requester="ops", reason="why", requested_at=T0
    )
    record = Record(NAMES.control, 0, 0, b"c1", request.model_dump_json().encode())
    with pytest.raises(InvalidRecord):
        decode_control(record)
