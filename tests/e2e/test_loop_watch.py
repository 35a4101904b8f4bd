"""A real worker measures its event loop's lag and logs a stall with the stack
holding the loop (``streams.worker.loop_watch``, wired by ``streams.bootstrap``).

Why: the watch runs as a Faust task and a thread of the worker process, and
its figures reach operators only through ``/metrics`` and the log; unit tests
of the class cannot show that the worker starts it. A threshold of 2 ms, and a
new conversation sent (accounted, then compacted) at every look, make a stall
certain: an idle worker has none to show, however long the test waits.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Conversation, Stack, eventually
from tests.support.metrics_text import metric

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


async def test_a_worker_exports_its_loop_lag_and_logs_a_stall_with_its_stack(
    stack: Stack,
) -> None:
    worker = stack.worker("w1", config={"service": {"loop_stall_seconds": 0.002}})
    assert await worker.wait_ready(stack.names.messages) == {0, 1, 2, 3}
    conv = Conversation("conv-loop", "loop")
    await stack.send_all(conv.until_over(0))
    await stack.wait_for_clip_events({conv.id: 1}, timeout=60)

    looks = 0

    async def measured() -> str:
        nonlocal looks
        looks += 1  # work for the loop until the stall is seen
        await stack.send_all(Conversation(f"conv-load-{looks}", "load").until_over(0))
        text = await worker.metrics_text()
        assert metric(text, "compactor_event_loop_lag_seconds_count") > 0
        assert metric(text, "compactor_event_loop_stalls_total") > 0
        assert "event loop held for" in worker.log_text()
        return worker.log_text()

    log = await eventually(measured, timeout=60, what="the loop's lag and a stall")
    report = log[log.index("event loop held for") :]
    assert 'File "' in report.split("\n", 2)[1]  # the held stack follows the line
