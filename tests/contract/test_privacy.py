"""``PrivacyStore``: an erase removes every row of a conversation, records its mark
and its audit (kept after the erase), once per request id; a conversation
without a tenant moves into one whole, never onto another history."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from core.domain.compaction import StoredTokens
from core.ports.storage import (
    Applied,
    CompactionOutbox,
    Erasure,
    IncomingMessage,
    OutboxRecord,
    TenantConflictError,
)
from tests.contract.backends import Backend
from tests.support.plans import T0, make_plan, msg, save_all, stored
from tests.support.stores import counts

# What both stores count (PostgreSQL also counts the rows of its BM25 figures).
COUNTED = ("outbox", "compactions", "archived_messages", "archival_memory", "messages")


def erasure(request_id: str = "req-1", **offsets: int) -> Erasure:
    """Asked before the test messages were created: only offsets cover them."""
    return Erasure(
        request_id=request_id,
        requester="ops@example",
        reason="subject access request #42",
        requested_at=T0 - timedelta(days=1),
        erased_at=T0 + timedelta(days=1),
        offsets={int(p.removeprefix("p")): o for p, o in offsets.items()},
    )


async def compacted(store: Any, conversation_id: str) -> None:
    """A compacted conversation: messages, an archived batch and turns, an outbox row."""
    history = [msg(i, conversation_id=conversation_id) for i in range(4)]
    await save_all(store, history)
    compaction_id = f"cmp-{conversation_id}"
    batch = stored(compaction_id, 0, "s", history[:2], conversation_id=conversation_id)
    plan = make_plan(
        compaction_id, [batch], [m.id for m in history[:2]], conversation_id=conversation_id
    )
    inputs = await store.history.compaction_inputs(compaction_id, conversation_id, up_to_seq=None)
    record = OutboxRecord(topic="clip_archives", key=conversation_id, payload="{}")
    outbox = CompactionOutbox((record,), StoredTokens.of(plan, inputs.stored_tokens))
    assert await store.compactions.apply_compaction(plan, outbox) == Applied()


async def test_an_erase_removes_every_row_and_is_audited_once(store: Any, backend: Backend) -> None:
    await compacted(store, "doomed")
    await compacted(store, "acme/doomed")  # acme's, the same id: another conversation
    kept = await backend.rows()
    first = await store.privacy.erase_conversation("doomed", erasure(p0=9))
    assert {t: first.removed[t] for t in COUNTED} == {
        "outbox": 1, "compactions": 1, "archived_messages": 2, "archival_memory": 1,
        "messages": 3,
    }  # fmt: skip
    assert first.removed["conversations"] == 1 and first.epoch == 1 and not first.repeated
    left = await backend.rows()
    assert all(left[t] == kept[t] - first.removed[t] for t in COUNTED)
    assert await store.history.load_history("acme/doomed")  # untouched
    assert await store.compactions.compaction_applied("cmp-doomed") is False
    # Redelivered: deleted again, answered with the first counts, audited once.
    repeated = await store.privacy.erase_conversation("doomed", erasure(p0=4))
    assert repeated.repeated and repeated.removed == first.removed and repeated.epoch == 1
    assert await backend.audit("doomed") == [
        ("req-1", "ops@example", "subject access request #42", 1, first.removed)
    ]
    later = await store.privacy.erase_conversation("doomed", erasure("req-2", p0=2, p1=7))
    assert later.epoch == 2 and not later.repeated
    assert {t: later.removed[t] for t in COUNTED} == dict.fromkeys(COUNTED, 0)
    assert [entry[0] for entry in await backend.audit("doomed")] == ["req-1", "req-2"]


async def test_a_later_erase_never_lowers_the_mark(store: Any) -> None:
    await store.privacy.erase_conversation("doomed", erasure(p0=9))
    await store.privacy.erase_conversation("doomed", erasure("req-2", p0=2, p1=7))

    async def status(i: int, partition: int, offset: int) -> str:
        message = msg(i, conversation_id="doomed")
        (outcome,) = await store.ingest.save_messages(
            [IncomingMessage(message, 5, partition, offset)]
        )
        return str(outcome.status)

    assert [await status(0, 0, 9), await status(1, 1, 7)] == ["erased", "erased"]
    assert [await status(2, 0, 10), await status(3, 1, 8)] == ["inserted", "inserted"]


async def test_a_message_after_an_erase_starts_a_new_conversation(
    store: Any, backend: Backend
) -> None:
    await compacted(store, "doomed")
    await store.privacy.erase_conversation("doomed", erasure(p0=9))
    assert await backend.tenant("doomed") == (False, None)
    await save_all(store, [msg(0, conversation_id="doomed")])  # at no offset: after the cutoff
    assert await backend.tenant("doomed") == (True, None)
    assert (await counts(store, "doomed"))[1] == 1


async def test_a_conversation_without_a_tenant_moves_into_one_whole(
    store: Any, backend: Backend
) -> None:
    await compacted(store, "legacy-1")
    assert await store.privacy.move_to_tenant("legacy-1", "acme") is True
    assert await store.privacy.move_to_tenant("legacy-1", "acme") is False  # moved before
    assert await store.history.load_history("legacy-1") == []
    moved = await store.history.load_history("acme/legacy-1")
    assert len(moved) == 3 and {m.conversation_id for m in moved} == {"acme/legacy-1"}
    assert await store.archive.live_batches("acme/legacy-1")
    assert await store.compactions.compaction_applied("cmp-legacy-1")
    assert await backend.tenant("acme/legacy-1") == (True, "acme")
    assert [r.key for r in await store.outbox.outbox_rows("cmp-legacy-1")] == ["acme/legacy-1"]


async def test_two_histories_are_never_merged(store: Any) -> None:
    await save_all(store, [msg(0, conversation_id="c1"), msg(0, conversation_id="acme/c1")])
    with pytest.raises(TenantConflictError):
        await store.privacy.move_to_tenant("c1", "acme")
    with pytest.raises(TenantConflictError):
        await store.privacy.move_to_tenant("nobody", "acme")  # nothing to move
    assert len(await store.history.load_history("c1")) == 1


async def test_a_moved_conversation_keeps_its_erases_and_the_tenants(
    store: Any, backend: Backend
) -> None:
    """Both keys erased before: one mark covering what either covered, counting both's
    erases (so its compaction ids repeat neither's), and both audits."""
    await store.privacy.erase_conversation("c1", erasure("r-bare", p0=9))
    await store.privacy.erase_conversation("acme/c1", erasure("r-acme", p1=4))
    await store.ingest.save_messages(
        [IncomingMessage(msg(0, conversation_id="c1"), 5, 0, 10)]  # after its mark
    )
    assert await store.privacy.move_to_tenant("c1", "acme") is True
    assert (await store.tallies.totals_of(["acme/c1"]))["acme/c1"].epoch == 2
    assert sorted(e[0] for e in await backend.audit("acme/c1")) == ["r-acme", "r-bare"]
    late = [IncomingMessage(msg(i, conversation_id="acme/c1"), 5, p, o) for i, p, o in
            ((1, 0, 9), (2, 1, 4), (3, 1, 5))]  # fmt: skip
    outcomes = await store.ingest.save_messages(late)
    assert [o.status for o in outcomes] == ["erased", "erased", "inserted"]
