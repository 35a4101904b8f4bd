"""Scenario 5: an LLM storm: every summarisation call fails, for a while, in every way.

429 with and without retry-after, 500, 503, replies slower than the client's
timeout and broken bodies (bad JSON, an HTML error page, valid JSON of the
wrong shape), picked at random per request while traffic flows; then the
provider is healthy again. Nothing may be written by a failed compaction,
and reconciliation must bring every conversation back under budget.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.chaos.harness import SCALE, MakeStack, wait_until
from tests.chaos.workload import build_conversations, interleave
from tests.support.chaos_llm import ChaosLLMServer, storm_actions

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(SCALE.timeout)]

LLM_TIMEOUT = 2.0  # [summarization].timeout_seconds


async def test_llm_storm_then_healthy(
    make_stack: MakeStack, kafka_bootstrap: str, pg_database: str, chaos_llm: ChaosLLMServer
) -> None:
    chaos_llm.latency = (0.05, 0.2)
    stack = await make_stack("llm_storm", kafka_bootstrap, pg_database)
    stack.configure(
        {
            "summarization": {
                "timeout_seconds": LLM_TIMEOUT,
                "max_retries": 2,
                "retry_backoff_seconds": 0.2,
                "max_consecutive_failures": 5,
                "circuit_cooldown_seconds": 3.0,
            }
        }
    )
    stack.notes["storm_seconds"] = SCALE.storm_seconds
    stack.worker("w1")
    stack.worker("w2")
    await stack.wait_for_group()
    conversations = build_conversations(SCALE.conversations, prefix=f"{stack.app_id}-c", seed=41)
    stack.add_conversations(conversations)
    events = interleave([c.events for c in conversations], seed=42)
    window_start = time.monotonic()
    # Traffic starts a little before the storm and ends with it.
    replay = asyncio.create_task(stack.replay(events, SCALE.storm_seconds + 5.0))

    async def warmed_up() -> bool:
        return len(stack.produced) >= len(events) // 20

    await wait_until(warmed_up, timeout=60, what="traffic flowing")
    before = sum(chaos_llm.served.values())
    chaos_llm.start_storm(storm_actions(LLM_TIMEOUT), SCALE.storm_seconds)
    await asyncio.sleep(SCALE.storm_seconds)  # the storm itself
    chaos_llm.end_storm()
    await replay
    fault_end = time.monotonic()
    served = dict(chaos_llm.served)
    stack.faults.update({f"llm_{kind}": n for kind, n in served.items() if kind != "Reply"})
    stack.notes["llm_requests_before_storm"] = before
    kinds = {kind for kind in served if kind != "Reply"}
    await stack.finish(
        fault_end,
        fault_window=fault_end - window_start,
        checks=[(len(kinds) >= 6, f"the storm served only {sorted(kinds)}")],
    )
