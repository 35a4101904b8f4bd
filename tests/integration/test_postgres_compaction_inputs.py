"""``PostgresHistory.compaction_inputs`` answers exactly what the three reads it
replaces answer, with each message's stored token count.

Why: the processor asks it before every compaction instead of
``compaction_applied``, ``conversation_token_total`` and ``load_history``
(one round trip instead of three); a difference in any of the three (a
message past the command's cut, the clip-archive's place, an empty
conversation) would change what gets compacted.
"""

from __future__ import annotations

import pytest

from core.adapters.postgres.store import PostgresStore
from core.ports.storage import CompactionInputs
from tests.support.builders import history
from tests.support.builders import message as make_message
from tests.support.stores import saved, totals

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def separately(
    store: PostgresStore, compaction_id: str, conversation_id: str, up_to_seq: int | None
) -> CompactionInputs:
    found = list(await store.history.load_history(conversation_id, up_to_seq=up_to_seq))
    counts = await store.pool.fetch(
        "SELECT id, token_estimate FROM messages WHERE conversation_id = $1",
        conversation_id,
    )
    stored = {r["id"]: r["token_estimate"] for r in counts}
    return CompactionInputs(
        applied=await store.compactions.compaction_applied(compaction_id),
        total=(await totals(store, conversation_id)).tokens,
        history=found,
        stored_tokens={m.id: stored[m.id] for m in found},
    )


async def test_an_unknown_conversation_has_nothing(pg_store: PostgresStore) -> None:
    nothing = CompactionInputs(applied=False, total=0, history=[])
    assert await pg_store.history.compaction_inputs("cmp-x", "nobody", up_to_seq=None) == nothing
    assert await pg_store.history.compaction_inputs("cmp-x", "nobody", up_to_seq=3) == nothing


async def test_the_same_answers_as_the_three_reads(pg_store: PostgresStore) -> None:
    messages = history(6)
    other = history(2, conversation_id="conv-2")
    for i, message in enumerate([*messages, *other]):
        await saved(pg_store, message, 10 + i)
    seqs = await pg_store.pool.fetch(
        "SELECT id, seq FROM messages WHERE conversation_id = 'conv-1' ORDER BY seq"
    )
    cut = int(seqs[3]["seq"])  # the command counted the first four messages
    for up_to_seq in (None, cut):
        got = await pg_store.history.compaction_inputs("cmp-1", "conv-1", up_to_seq=up_to_seq)
        assert got == await separately(pg_store, "cmp-1", "conv-1", up_to_seq)
    inputs = await pg_store.history.compaction_inputs("cmp-1", "conv-1", up_to_seq=cut)
    assert (inputs.applied, inputs.total) == (False, sum(range(10, 16)))  # every stored row counts
    assert [m.id for m in inputs.history] == [m.id for m in messages[:4]]  # only up to the cut
    assert inputs.stored_tokens == {m.id: 10 + i for i, m in enumerate(messages[:4])}


async def test_after_a_compaction_the_clip_archive_leads_and_it_is_applied(
    pg_store: PostgresStore,
) -> None:
    """A real compaction through the compactor's plan shape: the clip-archive
    first whatever its time, later messages after it, and the id applied."""
    from tests.integration.test_postgres_pool import plan_over

    messages = history(4)
    for message in messages:
        await saved(pg_store, message, 10)
    await pg_store.compactions.apply_compaction(plan_over(messages[:2]))
    newer = make_message(9)
    await saved(pg_store, newer, 10)
    for up_to_seq in (None, 1):  # the clip-archive is kept whatever the cut
        got = await pg_store.history.compaction_inputs("cmp-1", "conv-1", up_to_seq=up_to_seq)
        assert got == await separately(pg_store, "cmp-1", "conv-1", up_to_seq)
    inputs = await pg_store.history.compaction_inputs("cmp-1", "conv-1", up_to_seq=None)
    assert inputs.applied is True
    assert [m.id for m in inputs.history] == ["clip-archive-cmp-1", "m00002", "m00003", "m00009"]


async def test_marking_a_compaction_published_touches_its_rows_only(
    pg_store: PostgresStore,
) -> None:
    await pg_store.pool.executemany(
        "INSERT INTO outbox (compaction_id, topic, key, payload, conversation_id) "
        "VALUES ($1, $2, $3, $4, $5)",
        [
            ("cmp-a", "clip_archives", "conv-a", "a1", "conv-a"),
            ("cmp-a", "control", "conv-a", "a2", "conv-a"),
            ("cmp-b", "control", "conv-b", "b1", "conv-b"),
        ],
    )
    first = await pg_store.pool.fetchval("SELECT now()")
    await pg_store.outbox.mark_compaction_published("cmp-a")
    assert [r.payload for r in await pg_store.outbox.pending_outbox()] == ["b1"]
    stamped = await pg_store.pool.fetch(
        "SELECT published_at FROM outbox WHERE compaction_id = 'cmp-a'"
    )
    await pg_store.outbox.mark_compaction_published("cmp-a")  # again: the first time stays
    again = await pg_store.pool.fetch(
        "SELECT published_at FROM outbox WHERE compaction_id = 'cmp-a'"
    )
    assert stamped == again and all(r["published_at"] >= first for r in stamped)
