"""Tenants and erasure in the accounting component, against the in-memory ports."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from streams.dead_letter_headers import DeadLetterHeaders
from streams.events import MessageEvent
from tests.support.builders import T0
from tests.support.metrics_text import sample
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


async def erase(h: Harness, conversation: str = "c1", tenant: str | None = None) -> None:
    await h.erase(conversation, request_id=f"req-{next(_requests)}", tenant=tenant)


def dead_letter_types(h: Harness) -> list[str]:
    return [
        DeadLetterHeaders.from_kafka(list(p.headers)).error_type
        for p in h.publisher.on("dead_letters")
    ]


async def test_each_tenant_has_its_own_conversation_of_an_id() -> None:
    """A conversation is (tenant, id): whoever writes first, nobody claims the id,
    and no message lands in another tenant's conversation."""
    h = harness()
    await tenant_message(h, 0, "globex")  # first: claims nothing
    await tenant_message(h, 1, "acme")
    await tenant_message(h, 2, "acme")
    await tenant_message(h, 3, None)
    assert dead_letter_types(h) == []
    assert h.store.tenants == {"globex/c1": "globex", "acme/c1": "acme", "c1": None}
    assert sorted(h.store.message_ids("acme/c1")) == ["c1-m0001", "c1-m0002"]
    assert h.store.message_ids("globex/c1") == ["c1-m0000"]
    assert h.store.message_ids("c1") == ["c1-m0003"]
    assert (h.tally("acme/c1").message_count, h.tally("globex/c1").message_count) == (2, 1)


async def test_erase_removes_everything_tombstones_and_is_idempotent() -> None:
    h = harness()
    command = await over_budget(h)
    await h.components.processor.compact(command)
    await tenant_message(h, 0, None, conversation="other")
    assert h.store.batches and h.store.archived and h.store.outbox_entries
    await erase(h)
    await erase(h)  # again: nothing left, one more tombstone
    store = h.store
    assert [r.message.conversation_id for r in store.messages.values()] == ["other"]
    assert store.batches == {} and store.archived == {} and store.outbox_entries == []
    assert store.applied == set() and "c1" not in store.tenants
    assert "c1" not in h.table and "other" in h.table
    tombstones = [p for p in h.publisher.on("clip_archives") if p.value is None]
    assert [(p.key, p.value) for p in tombstones] == [(b"c1", None), (b"c1", None)]
    assert sample(h.components.metrics, "compactor_erasures_total") == 2


async def test_an_erase_is_of_one_tenants_conversation_and_a_later_message_starts_anew() -> None:
    h = harness()
    await tenant_message(h, 0, "acme")
    await tenant_message(h, 1, "globex")
    await erase(h, tenant="acme")
    assert h.store.message_ids("acme/c1") == [] and "acme/c1" not in h.table
    assert h.store.message_ids("globex/c1") == ["c1-m0001"] and "globex/c1" in h.table
    (tombstone,) = [p for p in h.publisher.on("clip_archives") if p.value is None]
    assert tombstone.key == b"acme/c1"  # the log-compacted topic's key: (tenant, id)
    await tenant_message(h, 2, "acme")  # after the erase: a new conversation
    assert h.store.tenants == {"acme/c1": "acme", "globex/c1": "globex"}
    assert (h.tally("acme/c1").message_count, h.tally("acme/c1").generation) == (1, 0)
    assert h.tally("acme/c1").epoch == 1
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


async def test_a_completion_after_an_erase_and_a_new_message_still_sends_the_tombstone() -> None:
    """Issue 29: a new message restarted the conversation before the old
    compaction's completion came; the tombstone used to be sent again only when
    nothing was stored, so the erased summary stayed the key's latest value."""
    h = harness()
    command = await over_budget(h)
    await h.components.processor.compact(command)
    (completed,) = h.completions()
    await erase(h)
    await h.message(100, "a new start")  # the conversation again, epoch 1
    assert h.tally().epoch == 1
    await h.control(completed)
    clips = h.publisher.on("clip_archives")
    assert [p.value is None for p in clips] == [False, True, True]
    assert h.tally().message_count == 1  # the old completion changed nothing else
    await h.control(completed)  # redelivered: one more tombstone at most, never a summary
    assert all(p.value is None for p in h.publisher.on("clip_archives")[1:])


async def test_a_clip_archive_is_acknowledged_before_its_completion_is_sent() -> None:
    """Whatever the broker's timing: a completion that lands first makes an erased
    conversation's worker send its tombstone, and the clip-archive after it would
    have been the key's latest value."""
    h = harness()
    command = await over_budget(h)
    release = asyncio.Event()
    publish = h.publisher.publish
    order: list[str] = []

    async def slow_clip_archives(topic: str, key: Any, value: Any, headers: Any = None) -> Any:
        if topic == "clip_archives":
            await release.wait()  # the broker takes its time with this one
        order.append(topic)
        return await publish(topic, key, value, headers)

    h.publisher.publish = slow_clip_archives  # type: ignore[method-assign]
    running = asyncio.create_task(h.components.processor.compact(command))
    for _ in range(20):
        await asyncio.sleep(0)
    assert order == []  # the completion waits for the clip-archive's acknowledgement
    release.set()
    await running
    assert order == ["clip_archives", "control"]
