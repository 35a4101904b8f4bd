"""Tenants and erasure in the accounting component, against the in-memory ports."""

from __future__ import annotations

from datetime import timedelta

import pytest

from streams.events import DeadLetterHeaders, MessageEvent
from tests.support.builders import T0
from tests.unit.worker.harness import NAMES, Harness, harness, over_budget

pytestmark = pytest.mark.unit


async def tenant_message(
    h: Harness, index: int, tenant: str | None, conversation: str = "c1"
) -> None:
    event = MessageEvent(
        message_id=f"{conversation}-m{index:04d}",
        conversation_id=conversation,
        role="user",
        content=f"hello {index}",
        created_at=T0 + timedelta(seconds=index),
        tenant_id=tenant,
    )
    await h.components.accounting.handle(
        h.record(NAMES.messages, conversation, event.model_dump_json())
    )


_requests = iter(range(10**6))


async def erase(h: Harness, conversation: str = "c1") -> None:
    await h.erase(conversation, request_id=f"req-{next(_requests)}")


def dead_letter_types(h: Harness) -> list[str]:
    return [
        DeadLetterHeaders.from_kafka(list(p.headers)).error_type
        for p in h.publisher.on("dead_letters")
    ]


async def test_the_first_message_fixes_the_tenant_and_another_claim_is_dead_lettered() -> None:
    h = harness()
    await tenant_message(h, 0, "acme")
    await tenant_message(h, 1, "acme")
    await tenant_message(h, 2, "globex")
    await tenant_message(h, 3, None)
    await tenant_message(h, 4, None, conversation="c2")
    await tenant_message(h, 5, "acme", conversation="c2")
    assert dead_letter_types(h) == ["tenant_mismatch"] * 3
    assert sorted(h.store.message_ids()) == ["c1-m0000", "c1-m0001", "c2-m0004"]
    assert h.store.tenants == {"c1": "acme", "c2": None}
    assert h.tally("c1").message_count == 2
    (letter, *_) = h.publisher.on("dead_letters")
    assert "acme" not in DeadLetterHeaders.from_kafka(list(letter.headers)).reason


async def test_erase_removes_everything_tombstones_and_is_idempotent() -> None:
    h = harness()
    command = await over_budget(h)
    await h.components.processor.compact(command)
    await tenant_message(h, 0, None, conversation="other")
    assert h.store.batches and h.store.archived and h.store.outbox
    await erase(h)
    await erase(h)  # again: nothing left, one more tombstone
    store = h.store
    assert [r.message.conversation_id for r in store.messages.values()] == ["other"]
    assert store.batches == {} and store.archived == {} and store.outbox == []
    assert store.compactions == set() and "c1" not in store.tenants
    assert "c1" not in h.table and "other" in h.table
    tombstones = [p for p in h.publisher.on("clip_archives") if p.value is None]
    assert [(p.key, p.value) for p in tombstones] == [(b"c1", None), (b"c1", None)]
    assert h.components.metrics.erasures._value.get() == 2


async def test_a_message_after_an_erase_starts_a_new_conversation_of_any_tenant() -> None:
    h = harness()
    await tenant_message(h, 0, "acme")
    await erase(h)
    await tenant_message(h, 1, "globex")
    assert h.store.tenants == {"c1": "globex"}
    assert (h.tally().message_count, h.tally().generation) == (1, 0)
    assert dead_letter_types(h) == []


async def test_a_completion_after_an_erase_sends_the_tombstone_again_and_no_entry() -> None:
    h = harness()
    command = await over_budget(h)
    await h.components.processor.compact(command)
    (completed,) = h.completions()
    await erase(h)
    await h.control(completed)  # relayed after the erase's tombstone
    assert "c1" not in h.table
    clips = h.publisher.on("clip_archives")
    assert [p.value is None for p in clips] == [False, True, True]
