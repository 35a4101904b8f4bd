"""``TallySource``: the store's counts, which the worker's table caches."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from core.ports.storage import Erasure, IncomingMessage, StoreTotals
from tests.support.plans import CONV, T0, msg
from tests.support.stores import saved


async def test_totals_of_many_conversations_in_one_answer(store: Any) -> None:
    outcomes = await store.ingest.save_messages(
        [IncomingMessage(msg(i), 10 + i) for i in range(3)]
        + [IncomingMessage(msg(0, conversation_id="other"), 5)]
    )
    found = await store.tallies.totals_of([CONV, "other", "nobody", CONV])
    assert set(found) == {CONV, "other", "nobody"}  # every id asked for, once
    assert found[CONV] == StoreTotals(tokens=33, rows=3, last_seq=outcomes[2].seq, epoch=0)
    assert (found["other"].tokens, found["other"].rows) == (5, 1)
    assert found["nobody"] == StoreTotals()  # unknown: zeros
    assert await store.tallies.totals_of([]) == {}


async def test_totals_carry_the_erase_epoch(store: Any) -> None:
    erasure = Erasure(
        request_id="r1",
        requester="ops",
        reason="asked",
        requested_at=T0 - timedelta(days=1),
        erased_at=T0,
    )
    await saved(store, msg(0, conversation_id="doomed"), 5)
    await store.privacy.erase_conversation("doomed", erasure)
    assert (await store.tallies.totals_of(["doomed"]))["doomed"] == StoreTotals(epoch=1)


async def test_last_seq_is_the_newest_arrival(store: Any) -> None:
    assert await store.tallies.last_seq(CONV) is None
    outcomes = await store.ingest.save_messages([IncomingMessage(msg(i), 1) for i in range(3)])
    assert await store.tallies.last_seq(CONV) == outcomes[-1].seq


async def test_conversations_over_a_threshold_largest_first(store: Any) -> None:
    await saved(store, msg(1, conversation_id="big"), 600)
    await saved(store, msg(2, conversation_id="big"), 500)
    await saved(store, msg(1, conversation_id="edge"), 1000)
    await saved(store, msg(1, conversation_id="small"), 10)
    await saved(store, msg(1, conversation_id="also-1000"), 1000)
    # Strictly over, as core.domain.budget.over_budget decides; ties by id.
    assert await store.tallies.conversations_over(1000) == [("big", 1100)]
    assert await store.tallies.conversations_over(5) == [
        ("big", 1100),
        ("also-1000", 1000),
        ("edge", 1000),
        ("small", 10),
    ]
