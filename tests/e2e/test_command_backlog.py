"""A backlog of commands longer than their timeout does not feed itself.

Why: reconciliation re-sent every command outstanding for longer than
``command_timeout_seconds``. When compactions queue up (a slow provider, a
burst of conversations over budget), those commands are late, not lost: each
copy joined the same queue, made it longer, and ran as a "replayed" no-op.
In the hour soak one worker re-sent 32,867 commands for 2,666 compactions.
Here 40 conversations go over budget at once against a provider that takes
0.5 s a call, one compaction at a time: about 20 s of work behind a 2 s
timeout. Every conversation must be compacted once, with (almost) no command
sent twice.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from tests.e2e.conftest import BUDGET_TOKENS, MARKERS, Conversation, Stack, eventually
from tests.support.llm_server import EMBEDDINGS_PATH, Action, Delay, Reply
from tests.support.metrics_text import label_values, metric

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

CONVERSATIONS = 40
CALL_SECONDS = 0.5
COMMAND_TIMEOUT = 2.0  # [service].command_timeout_seconds: a tenth of the backlog
# A command may be re-sent when the group's committed offset has just passed
# an earlier one of its partition within the same second (the lookup is by
# time, and it never guesses "queued"): a few, never one per pass.
MAX_RESENT = CONVERSATIONS // 10


def slow(path: str) -> Action:
    return Reply() if path == EMBEDDINGS_PATH else Delay(CALL_SECONDS, Reply())


async def test_late_commands_are_not_sent_again_while_they_wait(stack: Stack) -> None:
    stack.llm.default_action = slow
    worker = stack.worker(
        "w1",
        config={
            "summarization": {"max_concurrent_llm_calls": 1},
            "service": {
                "max_concurrent_compactions": 1,
                "command_timeout_seconds": COMMAND_TIMEOUT,
                "reconcile_interval_seconds": 0.5,
            },
        },
    )
    await worker.wait_ready(stack.names.messages)
    conversations = [
        Conversation(f"backlog-{i:03d}", MARKERS[i % len(MARKERS)], chars=400)
        for i in range(CONVERSATIONS)
    ]
    await asyncio.gather(*(stack.send_all(c.until_over(0)) for c in conversations))
    ids = [c.id for c in conversations]

    async def all_compacted() -> None:
        compacted = {r["conversation_id"] for r in await stack.pg_compactions()}
        assert compacted == set(ids), f"{len(compacted)} of {CONVERSATIONS} compacted"

    await eventually(all_compacted, timeout=180, what="every conversation compacted")
    await stack.wait_idle(worker, ids, timeout=60)
    rows = await stack.db.fetch(
        "SELECT conversation_id, sum(token_estimate) AS total FROM messages "
        "GROUP BY conversation_id"
    )
    assert not [r["conversation_id"] for r in rows if r["total"] > BUDGET_TOKENS]
    compacted = Counter(r["conversation_id"] for r in await stack.pg_compactions())
    assert set(compacted.values()) == {1}, compacted

    text = await worker.metrics_text()
    issued = label_values(text, "compactor_commands_issued_total", "reason")
    noops = label_values(text, "compactor_compactions_noop_total", "reason")
    held = metric(text, "compactor_reconcile_resends_held_total")
    seen = f"commands issued {issued}, no-ops {noops}, re-sends held back {held:.0f}"
    print(seen)
    assert held > 0, f"the backlog never outlasted the timeout: {seen}"
    assert issued.get("reconcile", 0) <= MAX_RESENT, seen
    assert noops.get("replayed", 0) <= MAX_RESENT, seen
