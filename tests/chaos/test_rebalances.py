"""Scenario 4: workers joining and leaving, one rebalance after another, while events flow.

Joins start a new worker process; leaves stop a random member gracefully
(SIGTERM: Faust leaves the group and commits). Every membership change is a
rebalance that moves partitions, and with them table entries, which the new
owner restores from the changelog. After each change the group must settle
(every partition owned by exactly one member) before the next.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from tests.chaos.harness import SCALE, MakeStack, wait_until
from tests.chaos.workload import build_conversations, interleave
from tests.support.chaos_llm import ChaosLLMServer

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(SCALE.timeout)]

SECONDS_PER_REBALANCE = 12.0


async def test_workers_join_and_leave_while_events_flow(
    make_stack: MakeStack, kafka_bootstrap: str, pg_database: str, chaos_llm: ChaosLLMServer
) -> None:
    chaos_llm.latency = (0.1, 0.4)
    stack = await make_stack("rebalances", kafka_bootstrap, pg_database)
    stack.notes["llm_latency_ms"] = "100-400"
    stack.worker("w1")
    stack.worker("w2")
    await stack.wait_for_group()
    conversations = build_conversations(SCALE.conversations, prefix=f"{stack.app_id}-c", seed=31)
    stack.add_conversations(conversations)
    events = interleave([c.events for c in conversations], seed=32)
    rebalances = SCALE.rebalances
    rng = random.Random(33)
    window_start = time.monotonic()
    replay = asyncio.create_task(stack.replay(events, rebalances * SECONDS_PER_REBALANCE))
    settle_times: list[float] = []
    unsettled: list[str] = []
    next_name = 3
    for i in range(rebalances):
        target = len(events) * (i + 1) // (rebalances + 1)

        async def progressed(n: int = target) -> bool:
            if replay.done():
                replay.result()
            return len(stack.produced) >= n

        await wait_until(progressed, timeout=180, what=f"{target} events produced")
        changed_at = time.monotonic()
        if i % 2 == 0:
            stack.worker(f"w{next_name}")
            next_name += 1
            stack.faults["join"] += 1
        else:
            leaving = rng.choice(stack.expected)
            leaving.expected_alive = False
            await leaving.stop_async()
            stack.faults["leave"] += 1
        try:
            await stack.wait_for_group(timeout=90)
        except AssertionError as error:
            unsettled.append(f"rebalance {i + 1}: {error}"[:2000])
        settle_times.append(round(time.monotonic() - changed_at, 1))
    await replay
    fault_end = time.monotonic()
    stack.notes["settle_seconds"] = settle_times
    changes = stack.faults["join"] + stack.faults["leave"]
    await stack.finish(
        fault_end,
        fault_window=fault_end - window_start,
        checks=[
            (changes >= rebalances, f"{changes} membership changes, wanted {rebalances}"),
            (not unsettled, "the group did not settle after:\n" + "\n".join(unsettled)),
        ],
    )
