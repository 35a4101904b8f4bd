"""The worker's components against in-memory ports: no Kafka, no PostgreSQL.

Each test drives a component the way its Faust agent does (one ``Record`` at
a time) and checks what it stored, what the table holds and what it sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from core.adapters.llm.extractive import ExtractiveProvider
from core.compactor import create_compactor
from core.domain.accounting import ConversationTally, compaction_id_for
from core.ports.model import ModelAuthError, ModelRequest, ModelResponse
from core.settings import Settings, parse_settings
from streams.events import (
    CompactionCommand,
    CompactionCompleted,
    DeadLetterHeaders,
    MessageEvent,
    ReconcileRequest,
)
from streams.topics import TopicNames
from streams.worker import Components, assemble
from streams.worker.records import Record
from streams.worker.resources import Opened
from streams.worker.tally_table import TallyTable
from tests.support.builders import T0
from tests.support.memory_store import InMemoryStore, RecordingPublisher

pytestmark = pytest.mark.unit

BUDGET_TOKENS = 200  # 0.5 x 400
NAMES = TopicNames.with_prefix("t.")


def settings(**service: Any) -> Settings:
    return parse_settings(
        {
            "budget": {"context_budget": 0.5, "model_max_tokens": 400},
            "kafka": {"topic_prefix": "t."},
            "summarization": {"keep_recent": 2, "chunk_size": 4, "retry_backoff_seconds": 0},
            "service": {"command_timeout_seconds": 60, "reconcile_interval_seconds": 10, **service},
        }
    )


class FailingModel:
    name = "failing"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise ModelAuthError("bad key", provider=self.name)


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    store: InMemoryStore
    publisher: RecordingPublisher
    table: dict[str, Any]
    clock: Clock
    components: Components[int]
    acked: list[int] = field(default_factory=list)
    slept: list[float] = field(default_factory=list)
    assigned: bool = True
    offsets: Iterator[int] = field(default_factory=lambda: iter(range(10**9)))

    def record(self, topic: str, key: str | bytes | None, value: bytes | str) -> Record:
        raw_key = key.encode() if isinstance(key, str) else key
        raw_value = value.encode() if isinstance(value, str) else value
        return Record(topic, 0, next(self.offsets), raw_key, raw_value)

    async def message(self, index: int, content: str, conversation: str = "c1") -> None:
        event = MessageEvent(
            message_id=f"{conversation}-m{index:04d}",
            conversation_id=conversation,
            role="user" if index % 2 == 0 else "assistant",
            content=content,
            created_at=T0 + timedelta(seconds=index),
        )
        await self.components.accounting.handle(
            self.record(NAMES.messages, conversation, event.model_dump_json())
        )

    async def control(self, event: CompactionCompleted | ReconcileRequest) -> None:
        await self.components.accounting.handle(
            self.record(NAMES.control, event.conversation_id, event.model_dump_json())
        )

    def tally(self, conversation: str = "c1") -> ConversationTally:
        tally = self.components.table.get(conversation)
        assert tally is not None
        return tally

    def commands(self) -> list[CompactionCommand]:
        return [
            CompactionCommand.model_validate_json(p.value or b"")
            for p in self.publisher.on("commands")
        ]

    def completions(self) -> list[CompactionCompleted]:
        return [
            CompactionCompleted.model_validate_json(p.value or b"")
            for p in self.publisher.on("control")
            if b'"completed"' in (p.value or b"")
        ]


def harness(model: Any = None, **service: Any) -> Harness:
    config = settings(**service)
    store = InMemoryStore()
    compactor = create_compactor(
        model=model or ExtractiveProvider(),
        messages_store=store,
        memory_store=store,
        config=config.summarization.compaction(),
        model_name="test",
    )
    publisher = RecordingPublisher()
    table: dict[str, Any] = {}
    clock = Clock()
    acked: list[int] = []

    async def ack(token: int) -> None:
        acked.append(token)

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds

    harness: Harness

    components: Components[int] = assemble(
        config,
        table=table,
        publisher=publisher,
        resources=Opened(store, compactor),
        ack=ack,
        clock=clock,
        sleep=sleep,
        still_assigned=lambda _: harness.assigned,
    )
    harness = Harness(store, publisher, table, clock, components, acked, slept)
    return harness


def compacted(compaction_id: str, generation: int) -> CompactionCompleted:
    """Two messages of 100 tokens replaced by a 20-token clip-archive."""
    return CompactionCompleted(
        compaction_id=compaction_id,
        conversation_id="c1",
        generation=generation,
        status="compacted",
        messages_compressed=2,
        rows_removed=2,
        rows_added=1,
        tokens_removed=200,
        tokens_added=20,
        completed_at=T0,
    )


def words(n: int, seed: str = "word") -> str:
    return " ".join(f"{seed}{i}." for i in range(n))


# -- accounting ------------------------------------------------------------------


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
    duplicates = h.components.metrics.events_in.labels("duplicate")._value.get()
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
    assert h.components.metrics.commands_issued.labels("reconcile")._value.get() == 1


async def test_the_reconcile_timer_asks_only_for_due_conversations() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)
    await h.message(0, "small", conversation="c2")
    assert await h.components.reconciler.tick() == 0  # c1's command is fresh, c2 is fine
    h.clock.now += 61
    assert await h.components.reconciler.tick() == 1
    (request,) = [p for p in h.publisher.on("control")]
    assert request.key == b"c1"
    assert ReconcileRequest.model_validate_json(request.value or b"").conversation_id == "c1"
    assert await h.components.reconciler.tick() == 0  # asked within the interval already


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
    assert h.components.metrics.events_in.labels("dead_lettered")._value.get() == 1


async def test_an_oversized_message_is_dead_lettered_naming_the_setting() -> None:
    h = harness(max_content_chars=10)
    await h.message(0, "x" * 11)
    (letter,) = h.publisher.sent
    headers = DeadLetterHeaders.from_kafka(list(letter.headers))
    assert headers.error_type == "oversized"
    assert "[service].max_content_chars" in headers.reason


# -- processor -------------------------------------------------------------------


async def over_budget(h: Harness, n: int = 8) -> CompactionCommand:
    for i in range(n):
        await h.message(i, words(20, f"topic{i}-"))
    (command,) = h.commands()
    return command


async def test_a_command_compacts_and_publishes_its_events_asking_applied_once() -> None:
    h = harness()
    command = await over_budget(h)
    outcome = await h.components.processor.compact(command)
    assert outcome.status == "compacted"
    # The messages up to the command's cut, less keep_recent=2; later ones are untouched.
    assert command.up_to_seq == 4
    assert outcome.messages_compressed == 2
    assert h.store.calls.count("compaction_applied") == 1
    (clip,) = h.publisher.on("clip_archives")
    assert clip.key == b"c1"
    (completed,) = h.completions()
    assert completed.compaction_id == command.compaction_id
    assert completed.status == "compacted"
    assert completed.rows_removed == 2 and completed.rows_added == 1
    assert len(h.store.messages) == 8 - 2 + 1
    total, _ = await h.store.conversation_totals("c1")
    assert h.tally().token_total - completed.tokens_removed + completed.tokens_added == total
    assert all(o.published for o in h.store.outbox)


async def test_a_replayed_compaction_id_republishes_its_events() -> None:
    h = harness()
    command = await over_budget(h)
    await h.components.processor.compact(command)
    first = list(h.publisher.sent)
    outcome = await h.components.processor.compact(command)
    assert outcome.status == "replayed"
    republished = h.publisher.sent[len(first) :]
    assert [p.topic for p in republished] == ["clip_archives", "control"]
    assert [p.value for p in republished] == [
        p.value for p in first if p.topic in ("clip_archives", "control")
    ]
    assert h.components.metrics.compactions_noop.labels("replayed")._value.get() == 1


async def test_a_failed_compaction_writes_nothing_and_is_counted() -> None:
    h = harness(model=FailingModel())
    command = await over_budget(h)
    before = dict(h.store.messages)
    outcome = await h.components.processor.compact(command)
    assert outcome.status == "failed"
    assert "ModelAuthError" in outcome.reason
    assert h.store.messages == before
    assert h.store.batches == {} and h.store.compactions == set() and h.store.outbox == []
    assert h.publisher.on("clip_archives") == [] and h.completions() == []
    failed = h.components.metrics.compactions_failed.labels("ModelAuthError")._value.get()
    assert failed == 1


async def test_nothing_to_compress_completes_as_a_noop() -> None:
    h = harness()
    await h.message(0, "x" * 500)
    await h.message(1, "x" * 500)  # over budget, but both are within keep_recent
    (command,) = h.commands()
    outcome = await h.components.processor.compact(command)
    assert (outcome.status, outcome.reason) == ("noop", "nothing_to_compress")
    (noop,) = h.completions()
    assert noop.status == "noop" and noop.compaction_id == command.compaction_id
    assert noop.tokens_removed == 0 and noop.messages_compressed == 0
    await h.control(noop)
    tally = h.tally()
    assert tally.stalled and tally.outstanding is None


async def test_a_command_for_a_conversation_back_under_budget_is_a_noop() -> None:
    h = harness()
    command = await over_budget(h)
    for key in list(h.store.messages)[:5]:
        del h.store.messages[key]
    outcome = await h.components.processor.compact(command)
    assert (outcome.status, outcome.reason) == ("noop", "under_budget")


async def test_the_completion_brings_the_tally_to_the_store_s_total() -> None:
    h = harness()
    command = await over_budget(h)
    await h.components.processor.compact(command)
    (completed,) = h.completions()
    await h.control(completed)
    total, count = await h.store.conversation_totals("c1")
    tally = h.tally()
    assert (tally.token_total, tally.message_count) == (total, count)
    assert tally.generation == 1 and tally.compactions == 1


async def test_a_duplicate_between_commit_and_completion_leaves_the_tally_exact() -> None:
    """Issue: the duplicate's resync already saw the compaction, and the completion's
    deltas then took the removed tokens off a second time (a tally below the store,
    never compacted again)."""
    h = harness()
    command = await over_budget(h)
    await h.components.processor.compact(command)
    await h.message(0, words(20, "topic0-"))  # redelivered; it was compacted
    (completed,) = h.completions()
    await h.control(completed)
    total, count = await h.store.conversation_totals("c1")
    tally = h.tally()
    assert (tally.token_total, tally.message_count) == (total, count)


async def test_a_reconcile_request_repairs_a_drifted_entry() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 40)
    h.components.table.put(h.tally().model_copy(update={"token_total": 5}))  # drifted low
    for i in range(3, 8):
        await h.message(i, "x" * 40)  # 5 + 50 tokens in the table, 80 in the store
    assert h.commands() == []
    await h.control(ReconcileRequest(conversation_id="c1", requested_at=T0))
    total, count = await h.store.conversation_totals("c1")
    assert (h.tally().token_total, h.tally().message_count) == (total, count)


async def test_the_intake_dead_letters_a_bad_command_and_acks_in_offset_order() -> None:
    h = harness()
    command = await over_budget(h)
    intake = h.components.intake
    good = h.record(NAMES.commands, "c1", command.model_dump_json())
    bad = h.record(NAMES.commands, "c1", b"{}")
    await intake.submit(good, "p0", 1)
    await intake.submit(bad, "p0", 2)
    await intake.scheduler.drain()
    assert h.acked == [1, 2]
    (letter,) = h.publisher.on("dead_letters")
    assert DeadLetterHeaders.from_kafka(list(letter.headers)).source_topic == NAMES.commands
    assert len(h.publisher.on("clip_archives")) == 1


async def test_the_outbox_timer_publishes_rows_a_crash_left_behind() -> None:
    h = harness()
    command = await over_budget(h)
    h.publisher.fail_next = ConnectionError("broker away")
    with pytest.raises(ConnectionError):
        await h.components.processor.compact(command)  # committed, not published
    assert [o.published for o in h.store.outbox] == [False, False]
    await h.components.relay.tick()
    assert all(o.published for o in h.store.outbox)
    # A compaction's records are sent together: the one whose send did not fail
    # may be out already, and the tick sends both (delivery is at least once).
    sent = [p.topic for p in h.publisher.sent if p.topic != "commands"]
    assert sent[-2:] == ["clip_archives", "control"]


# -- the table wrapper -------------------------------------------------------------


def test_the_tally_table_converts_both_ways_and_skips_empty_entries() -> None:
    raw: dict[str, Any] = {"gone": None}
    table = TallyTable(raw)
    tally = ConversationTally(conversation_id="c1", token_total=5, message_count=1)
    table.put(tally)
    assert "c1" not in raw  # cached until a flush
    assert table.flush(force=True) == 1
    assert raw["c1"] == tally.model_dump()
    assert table.get("c1") == tally
    assert table.get("gone") is None and table.get("never") is None
    assert list(table.items()) == [("c1", tally)]
    table.delete("c1")
    table.delete("c1")  # deleting twice is fine: reconciliation and erasure may race
    assert "c1" not in raw


# -- never acknowledging a record whose write failed ------------------------------------


async def test_a_database_outage_is_waited_out_on_the_same_record() -> None:
    h = harness()
    h.store.fail_times("save_messages", 6)
    await h.message(0, "hello there")
    assert h.store.message_ids() == ["c1-m0000"]
    assert h.tally().token_total == 3
    assert h.slept == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4]  # backoff, never a give-up
    metrics = h.components.metrics
    assert metrics.accounting_retries.labels("ConnectionResetError")._value.get() == 6
    assert metrics.accounting_waiting._value.get() == 0
    assert h.components.health.ok
    assert h.publisher.on("dead_letters") == []


async def test_health_reports_the_outage_while_it_lasts() -> None:
    h = harness()
    seen: list[list[dict[str, object]]] = []

    async def sleep(seconds: float) -> None:
        seen.append(h.components.health.describe())

    h.components.accounting._sleep = sleep
    h.store.fail_times("totals_of", 1)
    await h.message(0, "hello there")
    (problems,) = seen
    (problem,) = problems
    assert problem["component"] == "accounting"
    assert "outage" in str(problem["detail"]) and "ConnectionResetError" in str(problem["detail"])
    assert h.components.health.ok


async def test_a_record_that_keeps_failing_for_another_reason_is_dead_lettered() -> None:
    h = harness()
    original = h.store._call

    def failing(name: str) -> None:
        if name == "save_messages":
            raise ValueError("boom")  # not an outage: a bug, or a record breaking an assumption
        original(name)

    h.store._call = failing  # type: ignore[method-assign]
    await h.message(0, "hello there")
    (letter,) = h.publisher.on("dead_letters")
    headers = DeadLetterHeaders.from_kafka(list(letter.headers))
    assert headers.error_type == "processing_error"
    assert "after 5 attempts: ValueError: boom" in headers.reason
    assert len(h.slept) == 5


async def test_a_revoked_partition_stops_the_wait() -> None:
    h = harness()
    h.store.fail_times("save_messages", 1000)
    h.assigned = False
    await h.message(0, "hello there")  # returns: the new owner redoes it
    assert h.store.messages == {} and h.table == {}


async def test_a_failed_dead_letter_send_is_retried_not_dropped() -> None:
    h = harness()
    h.publisher.fail_next = ConnectionResetError("broker away")
    await h.components.accounting.handle(h.record(NAMES.messages, "c1", b"{not json"))
    (letter,) = h.publisher.on("dead_letters")
    assert letter.value == b"{not json"
    assert h.components.metrics.events_in.labels("dead_lettered")._value.get() == 1


# -- oversized records -------------------------------------------------------------------


async def test_a_record_larger_than_a_request_is_dead_lettered_truncated_with_its_size() -> None:
    h = harness(max_content_chars=10)
    h.components.dead_letters._max_value = 50_000
    big = b'{"x": "' + b"y" * 2_000_000 + b'"}'
    await h.components.accounting.handle(h.record(NAMES.messages, "c1", big))
    (letter,) = h.publisher.on("dead_letters")
    headers = DeadLetterHeaders.from_kafka(list(letter.headers))
    assert headers.truncated and headers.original_size == len(big)
    assert letter.value == big[:50_000]
    assert headers.error_type == "invalid_event"


async def test_a_dead_letter_the_broker_refuses_as_too_large_is_sent_shorter() -> None:
    from aiokafka.errors import MessageSizeTooLargeError

    h = harness()
    h.publisher.fail_next = MessageSizeTooLargeError()
    big = b"\xff" * 100_000
    await h.components.accounting.handle(h.record(NAMES.messages, "c1", big))
    (letter,) = h.publisher.on("dead_letters")
    headers = DeadLetterHeaders.from_kafka(list(letter.headers))
    assert headers.truncated and headers.original_size == 100_000
    assert letter.value == big[:8192]


async def test_small_dead_letters_are_copied_whole() -> None:
    h = harness()
    await h.components.accounting.handle(h.record(NAMES.messages, "c1", b"{not json"))
    headers = DeadLetterHeaders.from_kafka(list(h.publisher.sent[0].headers))
    assert not headers.truncated and headers.original_size == 9


# -- one conversation at a time across the two accounting agents ----------------------------


async def test_the_keyed_lock_serialises_one_key_and_forgets_idle_keys() -> None:
    import asyncio

    from streams.worker.keyed_lock import KeyedLock

    locks = KeyedLock()
    order: list[str] = []
    release = asyncio.Event()

    async def hold(key: str, name: str) -> None:
        async with locks.hold(key):
            order.append(f"{name} in")
            if name == "first":
                await release.wait()
            order.append(f"{name} out")

    first = asyncio.create_task(hold("a", "first"))
    await asyncio.sleep(0)
    second = asyncio.create_task(hold("a", "second"))
    other = asyncio.create_task(hold("b", "other"))
    await other
    await asyncio.sleep(0)
    assert order == ["first in", "other in", "other out"]
    release.set()
    await asyncio.gather(first, second)
    assert order[3:] == ["first out", "second in", "second out"]
    assert len(locks) == 0


# -- reconciliation compares with the store ------------------------------------------------


async def test_reconciliation_repairs_an_entry_the_store_has_over_budget() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)  # 300 tokens: over budget, a command goes out
    h.components.table.put(
        ConversationTally(conversation_id="c1", token_total=10, message_count=3)
    )  # drifted low, nothing outstanding: the table alone would never act again
    assert await h.components.reconciler.tick() == 1  # the first pass asks the store
    (request,) = [p for p in h.publisher.on("control")]
    await h.control(ReconcileRequest.model_validate_json(request.value or b""))
    assert h.tally().token_total == 300
    assert len(h.commands()) == 2  # asked again, with the store's counts


async def test_reconciliation_leaves_other_workers_conversations_alone() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)
    h.table.clear()  # not in this worker's table ...
    h.components.reconciler._owns = lambda _: False  # ... and not its partition
    assert await h.components.reconciler.tick() == 0


async def test_a_refitted_clip_archive_counts_as_a_compaction_not_a_noop() -> None:
    from core.domain.compaction import CompactionResult

    class Refitting:
        async def compress(self, history: Any, conversation_id: str, **_: Any) -> CompactionResult:
            return CompactionResult(
                history=tuple(history),
                batches_created=1,
                messages_compressed=0,
                over_target=True,
                compaction_id=_["compaction_id"],
            )

    h = harness()
    command = await over_budget(h)
    h.components.processor._resources = Opened(h.store, Refitting())
    outcome = await h.components.processor.compact(command)
    assert outcome.status == "compacted"
    assert h.components.metrics.compactions_over_target._value.get() == 1
    assert h.completions() == []  # its events come from its own outbox, not a noop
