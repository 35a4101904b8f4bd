"""``[service].log_format = "json"`` in a real worker: every line it writes is JSON.

Why: Faust configures logging itself when its worker starts; only a real
worker process shows that its lines, aiokafka's and the worker's own all stay
one JSON object per line through start, a compaction and shutdown.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import Conversation, Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


async def test_every_line_of_a_json_worker_is_a_json_object(stack: Stack) -> None:
    worker = stack.worker("w1", config={"service": {"log_format": "json"}})
    assert await worker.wait_ready(stack.names.messages) == {0, 1, 2, 3}
    conv = Conversation("conv-json", "json")
    await stack.send_all(conv.until_over(0))
    await stack.wait_for_clip_events({conv.id: 1}, timeout=60)
    assert await worker.stop_async() == 0

    lines = [line for line in worker.log_text().splitlines() if line.strip()]
    assert lines
    records = []
    for line in lines:
        record = json.loads(line)  # raises on a line that is not JSON
        assert isinstance(record, dict), line
        assert {"level", "logger", "message"} <= record.keys(), line
        records.append(record)
    loggers = {r["logger"] for r in records}
    assert any(name.startswith(("faust", "mode")) for name in loggers), loggers
    assert any(r.get("conversation_id") == conv.id and r.get("compaction_id") for r in records)
