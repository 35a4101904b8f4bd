"""Accounting a group of message records at once, and the cached token table.

The messages agent hands ``Accounting.handle_batch`` whatever is waiting; the
group must come out exactly as if each record had been accounted alone, with
one store call for the messages and table writes coalesced per conversation.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from core.domain.tally import ConversationTally
from streams.events import CompactionCommand, MessageEvent
from streams.worker.records import Record
from streams.worker.tally_table import MAX_STRETCH_SECONDS, TallyTable
from tests.support.builders import T0, message
from tests.support.metrics_text import sample
from tests.support.stores import round_trips, saved
from tests.unit.worker.harness import NAMES, Harness, backed_off, harness

pytestmark = pytest.mark.unit


def message_record(h: Harness, index: int, conversation: str, tokens: int, **extra: Any) -> Record:
    event = MessageEvent(
        message_id=f"{conversation}-m{index:04d}",
        conversation_id=conversation,
        role="user",
        content=f"message {index}",
        created_at=T0,
        token_count=tokens,
        **extra,
    )
    record = h.record(NAMES.messages, conversation, event.model_dump_json())
    return Record(record.topic, partition_of(conversation), record.offset, record.key, record.value)


def partition_of(conversation: str) -> int:
    return sum(conversation.encode()) % 4


def commands(h: Harness) -> list[CompactionCommand]:
    return h.commands()


async def test_a_group_is_stored_with_one_call_and_counted_per_conversation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = harness()
    group = [message_record(h, i, f"c{i % 3}", 30) for i in range(12)]  # 4 x 30 per conversation
    trips = round_trips(h.store, monkeypatch)
    await h.components.accounting.handle_batch(group)
    # The promise is the round trips: one for the group, one for the counts of
    # the three conversations (new to this worker), whatever the group's size.
    assert trips == ["ingest.save_free", "tallies.totals_of"]
    for conversation in ("c0", "c1", "c2"):
        tally = h.tally(conversation)
        assert (tally.token_total, tally.message_count) == (120, 4)
    assert h.table == {}  # not flushed yet: table_flush_seconds has not passed
    h.clock.now += 0  # the flush clock is the table's own (monotonic)
    assert h.components.table.flush(force=True) == 3  # one write per conversation
    assert sample(h.components.metrics, "compactor_table_writes_total") == 3
    # c0 is synced: counted by adding, not re-read. A row the store has and this
    # worker never counted (planted behind its back) stays out of the tally.
    await saved(h.store, message(99, conversation_id="c0"), 1000)
    trips.clear()
    await h.components.accounting.handle_batch([message_record(h, 20, "c0", 30)])
    assert h.tally("c0").token_total == 150
    assert trips == ["ingest.save_free"]


async def test_a_group_issues_one_command_per_conversation_that_crosses_its_budget() -> None:
    h = harness()  # budget 200 tokens
    group = [message_record(h, i, "big", 90) for i in range(5)]  # crosses at the 3rd
    group += [message_record(h, i, "small", 10) for i in range(5)]
    await h.components.accounting.handle_batch(group)
    (command,) = commands(h)
    assert command.conversation_id == "big"
    assert command.up_to_seq == max(
        row.seq for row in h.store.messages.values() if row.message.conversation_id == "big"
    )
    assert h.tally("big").outstanding == command.compaction_id


async def test_a_crossing_in_a_later_group_uses_the_groups_newest_arrival() -> None:
    h = harness()
    await h.components.accounting.handle_batch([message_record(h, 0, "c", 150)])
    assert commands(h) == []
    await h.components.accounting.handle_batch(
        [message_record(h, 1, "c", 30), message_record(h, 2, "c", 30), message_record(h, 3, "x", 1)]
    )
    (command,) = commands(h)
    assert command.up_to_seq == h.store.messages["c", "c-m0002"].seq


async def test_a_redelivered_message_in_a_group_resyncs_from_the_store() -> None:
    h = harness()
    first = [message_record(h, i, "c", 40) for i in range(3)]
    await h.components.accounting.handle_batch(first)
    again = [message_record(h, 1, "c", 40), message_record(h, 3, "c", 40)]
    await h.components.accounting.handle_batch(again)
    tally = h.tally("c")
    assert (tally.token_total, tally.message_count) == (160, 4)
    assert sample(h.components.metrics, "compactor_events_in_total", outcome="duplicate") == 1


async def test_bad_records_in_a_group_are_dead_lettered_and_the_rest_accounted() -> None:
    h = harness()
    await h.components.accounting.handle_batch([message_record(h, 0, "c", 5, tenant_id="t1")])
    group = [
        message_record(h, 1, "c", 5, tenant_id="t2"),  # another tenant's conversation "c"
        h.record(NAMES.messages, "c", b"{not json"),
        message_record(h, 2, "c", 5, tenant_id="t1"),
    ]
    await h.components.accounting.handle_batch(group)
    reasons = sorted(
        dict(p.headers)["dlq.error_type"].decode() for p in h.publisher.on("dead_letters")
    )
    assert reasons == ["invalid_json"]
    assert sorted(h.store.message_ids("t1/c")) == ["c-m0000", "c-m0002"]
    assert h.store.message_ids("t2/c") == ["c-m0001"]
    assert (h.tally("t1/c").token_total, h.tally("t2/c").token_total) == (10, 5)


async def test_an_outage_holds_the_group_until_it_is_durable() -> None:
    h = harness()
    h.store.fail_times("save_free", 3)
    group = [message_record(h, i, "c", 5) for i in range(4)]
    await h.components.accounting.handle_batch(group)
    assert len(h.store.messages) == 4 and len(h.slept) == 3 and backed_off(h.slept)


async def test_a_group_that_keeps_failing_is_retried_record_by_record() -> None:
    h = harness()
    original = h.store.ingest.save_free

    async def poisoned(batch: Any) -> Any:
        if any(incoming.message.id == "c-m0001" for incoming in batch):
            raise ValueError("this one breaks an assumption")
        return await original(batch)

    h.store.ingest.save_free = poisoned  # type: ignore[method-assign]
    await h.components.accounting.handle_batch([message_record(h, i, "c", 5) for i in range(3)])
    assert sorted(h.store.message_ids()) == ["c-m0000", "c-m0002"]
    (letter,) = h.publisher.on("dead_letters")
    assert dict(letter.headers)["dlq.error_type"] == b"processing_error"


async def test_a_revoked_partition_drops_its_cached_entries_and_the_next_owner_resyncs() -> None:
    h = harness()
    await h.components.accounting.handle_batch([message_record(h, 0, "c", 50)])
    table = h.components.table
    assert table.synced("c")
    assert table.forget({partition_of("c")}) == 1
    assert not table.synced("c") and h.table == {}  # never flushed: gone with the cache
    # A row this worker never counted: only a count read from the store has it.
    await saved(h.store, message(99, conversation_id="c"), 25)
    await h.components.accounting.handle_batch([message_record(h, 1, "c", 50)])
    assert h.tally("c").token_total == 50 + 25 + 50  # read from the store again


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 9), st.integers(0, 120)),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 12),
)
async def test_groups_account_exactly_as_records_one_at_a_time(
    events: list[tuple[str, int, int]], group_size: int
) -> None:
    """Any split into groups, redeliveries included: same tallies, same commands."""
    one, grouped = harness(), harness()
    for conversation, index, tokens in events:
        await one.components.accounting.handle(message_record(one, index, conversation, tokens))
    records = [message_record(grouped, i, c, t) for c, i, t in events]
    for start in range(0, len(records), group_size):
        await grouped.components.accounting.handle_batch(records[start : start + group_size])
    for conversation in {c for c, _, _ in events}:
        alone, together = one.tally(conversation), grouped.tally(conversation)
        assert (alone.token_total, alone.message_count, alone.outstanding) == (
            together.token_total,
            together.message_count,
            together.outstanding,
        )
    issued = sorted((c.conversation_id, c.compaction_id) for c in commands(one))
    assert issued == sorted((c.conversation_id, c.compaction_id) for c in commands(grouped))


# -- the cached table ------------------------------------------------------------


def test_flushes_coalesce_writes_and_wait_for_their_interval() -> None:
    now = [0.0]
    raw: dict[str, Any] = {}
    written: list[int] = []
    table = TallyTable(raw, flush_seconds=1.0, clock=lambda: now[0], on_write=written.append)
    for total in range(100):
        table.put(ConversationTally(conversation_id="c", token_total=total), partition=0)
    assert table.flush() == 0 and raw == {}  # the interval has not passed
    now[0] = 1.0
    assert table.flush() == 1 and raw["c"]["token_total"] == 99
    assert table.flush(force=True) == 0  # nothing dirty
    assert sum(written) == 1


def test_a_large_flush_stretches_the_next_interval_to_the_write_rate() -> None:
    """2,000 entries at 500 writes/s: the next flush waits 4 s, not 1 s; a small
    flush brings the interval back; the stretch never exceeds its cap."""
    now = [0.0]
    raw: dict[str, Any] = {}

    def touch(count: int) -> None:
        for i in range(count):
            table.put(
                ConversationTally(conversation_id=f"c{i}", token_total=int(now[0])), partition=0
            )

    intervals: list[float] = []
    table = TallyTable(
        raw,
        flush_seconds=1.0,
        writes_per_second=500,
        clock=lambda: now[0],
        on_interval=intervals.append,  # the compactor_table_flush_interval_seconds gauge
    )
    touch(2_000)
    now[0] = 1.0
    assert table.flush() == 2_000
    assert intervals == [1.0, 4.0]
    touch(2_000)
    now[0] = 4.9
    assert not table.flush_due() and table.flush() == 0
    now[0] = 5.0
    assert table.flush_due() and table.flush() == 2_000
    touch(100)  # a quiet spell: back to flush_seconds
    now[0] = 9.0
    assert table.flush() == 100
    touch(100)
    now[0] = 10.0
    assert table.flush() == 100
    touch(100_000)
    now[0] = 11.0
    assert table.flush() == 100_000
    touch(1)
    now[0] = 11.0 + MAX_STRETCH_SECONDS
    assert table.flush() == 1  # capped: 100,000 ÷ 500 would be 200 s


def test_without_a_write_rate_the_interval_never_stretches() -> None:
    now = [0.0]
    table = TallyTable({}, flush_seconds=1.0, clock=lambda: now[0])
    for i in range(5_000):
        table.put(ConversationTally(conversation_id=f"c{i}"), partition=0)
    now[0] = 1.0
    assert table.flush() == 5_000
    table.put(ConversationTally(conversation_id="c0", token_total=1), partition=0)
    now[0] = 2.0
    assert table.flush() == 1


def test_an_entry_of_an_unseen_partition_waits_for_a_later_flush() -> None:
    raw: dict[str, Any] = {}
    seen: set[int] = set()

    def context(partition: int | None) -> Any:
        from contextlib import nullcontext

        if partition not in seen:
            raise LookupError(partition)
        return nullcontext()

    table = TallyTable(raw, write_context=context)
    table.put(ConversationTally(conversation_id="c"), partition=3)
    assert table.flush(force=True) == 0 and table.dirty == 1
    seen.add(3)
    assert table.flush(force=True) == 1 and "c" in raw


def test_clean_entries_beyond_the_cache_size_are_dropped_dirty_ones_kept() -> None:
    raw: dict[str, Any] = {}
    table = TallyTable(raw, max_cached=100)
    for i in range(150):
        table.put(ConversationTally(conversation_id=f"c{i}"), partition=0)
    assert table.cached == 150  # all dirty
    table.flush(force=True)
    assert table.cached == 100 and len(raw) == 150
    assert table.get("c0") == ConversationTally(conversation_id="c0")  # from the table


async def test_the_reconciliation_index_holds_only_what_it_may_act_on() -> None:
    raw: dict[str, Any] = {
        f"c{i}": ConversationTally(conversation_id=f"c{i}").model_dump() for i in range(5000)
    }
    raw["c7"] = ConversationTally(conversation_id="c7", outstanding="x").model_dump()
    table = TallyTable(raw)
    assert not table.index_valid and table.candidates() == []
    assert await table.rebuild_index(yield_every=100) == 1
    assert table.candidates() == ["c7"] and table.index_valid
    table.put(ConversationTally(conversation_id="c8", outstanding="y"))
    table.put(ConversationTally(conversation_id="c7"))  # completed: no longer a candidate
    assert table.candidates() == ["c8"]
    table.delete("c8")
    assert table.candidates() == []


async def test_a_reconciliation_pass_visits_the_index_not_the_table() -> None:
    h = harness()
    for i in range(2000):
        h.table[f"quiet{i}"] = ConversationTally(conversation_id=f"quiet{i}").model_dump()
    h.table["lost"] = ConversationTally(
        conversation_id="lost", outstanding="x", outstanding_since=0.0, token_total=500
    ).model_dump()
    looked: list[str] = []
    original = h.components.table.get

    def counting(conversation_id: str) -> ConversationTally | None:
        looked.append(conversation_id)
        return original(conversation_id)

    h.components.table.get = counting  # type: ignore[method-assign]
    h.components.reconciler._resources = None  # the store check is tested elsewhere
    assert await h.components.reconciler.tick() == 1  # the first pass rebuilds the index
    looked.clear()
    h.clock.now += 3600
    assert await h.components.reconciler.tick() == 1
    assert looked == ["lost"]
    assert sample(h.components.metrics, "compactor_reconcile_candidates") == 1


async def test_a_group_in_flight_when_its_partition_is_revoked_keeps_nothing_and_says_so() -> None:
    h = harness()
    await h.components.accounting.handle_batch([message_record(h, 0, "c", 50)])
    table = h.components.table
    original = h.store.ingest.save_free

    async def revoked_meanwhile(batch: Any) -> Any:
        table.flush_partitions({partition_of("c")})  # what on_revoked does, mid-group
        table.forget({partition_of("c")})
        return await original(batch)

    h.store.ingest.save_free = revoked_meanwhile  # type: ignore[method-assign]
    revoked = await h.components.accounting.handle_batch([message_record(h, 1, "c", 50)])
    assert revoked == {partition_of("c")}  # not acked: re-read by the next owner
    assert not table.synced("c") and table.cached == 0
    assert h.table["c"]["token_total"] == 50  # flushed before the revocation, then left alone
    h.store.ingest.save_free = original  # type: ignore[method-assign]
    await h.components.accounting.handle_batch([message_record(h, 1, "c", 50)])  # redelivered
    assert h.tally("c").token_total == 100  # a duplicate: resynced from the store


async def test_a_group_decoded_before_its_partition_was_revoked_keeps_nothing_and_says_so() -> None:
    """Decoded ahead (``streams.worker.overlap``), the group waits for the one before
    it; a revocation in that wait counts as one during the group: its epochs are
    the ones it was taken under."""
    h = harness()
    await h.components.accounting.handle_batch([message_record(h, 0, "c", 50)])
    table = h.components.table
    records = [message_record(h, 1, "c", 50)]
    ahead = await h.components.accounting.decode(records)
    table.flush_partitions({partition_of("c")})  # what on_revoked does, while it waited
    table.forget({partition_of("c")})
    revoked = await h.components.accounting.handle_batch(records, ahead)
    assert revoked == {partition_of("c")}  # not acked: re-read by the next owner
    assert not table.synced("c") and table.cached == 0
    assert h.table["c"]["token_total"] == 50
