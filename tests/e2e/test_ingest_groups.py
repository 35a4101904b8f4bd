"""A backlog reaches accounting in large groups, not a loop turn per event.

Why: Faust's fetch loop handed each record over in tasks of its own (two or
three event-loop turns a record) and its stream iterator spent a turn before
every event, so the accounting agent's groups were ~11 events even with
hundreds waiting, and each group's fixed cost (one PostgreSQL transaction,
the table writes) was paid per handful: publish-to-readable was ~1.5 s at
200 events/s (docs/performance.md section 10). With the delivery inline and
the agent taking its whole queue (``streams.kafka.faust_patches.
deliver_without_tasks``, ``streams.kafka.stream_take``), a backlog is accounted
in groups of hundreds (2 000 events published while the worker runs: 7 groups,
none of 50 or fewer, against 61 groups, 49 of them of 50 or fewer, without).
Counted from the worker's group-size histogram, not a clock, so a loaded
machine does not change the verdict.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.conftest import Conversation, Stack, eventually
from tests.support.metrics_text import parse_samples

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CONVERSATIONS = 100
PER_CONVERSATION = 20  # 20 short messages stay far under the budget: no compactions
EVENTS = CONVERSATIONS * PER_CONVERSATION
HISTOGRAM = "compactor_accounting_batch_events"


def group_sizes(text: str) -> tuple[float, float, dict[float, float]]:
    """(groups, events, {bucket bound: groups at most that large}) of the histogram."""
    buckets: dict[float, float] = {}
    count = total = 0.0
    for name, labels, value in parse_samples(text):
        if name == f"{HISTOGRAM}_bucket":
            buckets[float(labels["le"])] = value
        elif name == f"{HISTOGRAM}_count":
            count = value
        elif name == f"{HISTOGRAM}_sum":
            total = value
    return count, total, buckets


async def test_a_backlog_is_accounted_in_groups_of_hundreds(stack: Stack) -> None:
    conversations = [
        Conversation(f"conv-{n:03d}", "quartz", chars=40) for n in range(CONVERSATIONS)
    ]
    for conversation in conversations:
        for _ in range(PER_CONVERSATION):
            conversation.message()

    worker = stack.worker("w1")
    await worker.wait_ready(stack.names.messages)
    first = Conversation("conv-first", "orchid", chars=40)
    await stack.send(first.message())  # the runtime is open once it is accounted

    async def accounted(n: int) -> tuple[float, float, dict[float, float]]:
        sizes = group_sizes(await worker.metrics_text())
        assert sizes[1] == n, sizes[:2]
        return sizes

    await eventually(lambda: accounted(1), timeout=60, what="the first message accounted")

    async def publish(conversation: Conversation) -> None:
        await stack.send_all(conversation.events)  # in order within the conversation

    # Published while the worker runs (a backlog published before it starts
    # waits in the queue while the runtime opens, and comes in full groups anyway).
    await asyncio.gather(*(publish(c) for c in conversations))

    groups, events, buckets = await eventually(
        lambda: accounted(EVENTS + 1), timeout=90, what="the backlog accounted"
    )
    groups, events = groups - 1, events - 1  # the first message's group of one
    buckets = {bound: n - 1 for bound, n in buckets.items()}
    small = buckets[50.0]  # groups of at most 50 events
    assert small < groups / 2, f"{groups:.0f} groups, {small:.0f} of them <= 50 events: {buckets}"
    assert events / groups >= 100, f"{events / groups:.0f} events a group: {buckets}"
