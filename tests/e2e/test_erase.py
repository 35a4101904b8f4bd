"""Erase that holds, end to end: real Kafka, real worker processes, real PostgreSQL.

`compactor erase --wait` erases a compacted conversation; then the same
transcript is replayed with `compactor replay` and a worker with a new app id
(a new consumer group, reading every topic from the earliest offset) starts:
the conversation must not come back. A message published after the erase
starts a new conversation whose compaction ids are not the erased one's.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from core.adapters.postgres.privacy import ERASED_TABLES
from core.domain.tally import compaction_id_for
from streams.events import ClipArchiveEvent
from streams.kafka.admin import describe_topic_configs
from tests.e2e.conftest import (
    BUDGET_TOKENS,
    Conversation,
    Stack,
    decode_clip_events,
    eventually,
    tokens_of,
)
from tests.support.metrics_text import metric
from tests.support.worker import REPO_ROOT, WorkerProcess, render_toml

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


async def compactor(
    stack: Stack, *args: str, timeout: float = 120.0, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """The `compactor` command, as an operator runs it, against this stack's topics
    (``env``: more of its environment, e.g. ``COMPACTOR_<SECTION>__<KEY>``)."""
    config = stack.root / "cli.toml"
    if not config.exists():
        sections = {k: v for k, v in stack.config().items() if k in ("kafka",)}
        config.write_text(render_toml(sections), encoding="utf-8")
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap,
        "POSTGRES_DSN": stack.dsn,
        **(env or {}),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streams.cli",
        "--config",
        str(config),
        *args,
        cwd=REPO_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def erased_count(worker: WorkerProcess) -> float:
    return metric(await worker.metrics_text(), "compactor_events_in_total", outcome="erased")


async def rows_of(stack: Stack, conversation_id: str) -> dict[str, int]:
    return {
        table: int(
            await stack.db.fetchval(
                f"SELECT count(*) FROM {table} WHERE conversation_id = $1", conversation_id
            )
        )
        for table in ERASED_TABLES
    }


async def test_an_erased_conversation_stays_erased_through_replays_and_new_consumer_groups(
    stack: Stack, tmp_path: Path
) -> None:
    # Topics are created with the configs the settings ask for.
    configs = await describe_topic_configs(stack.bootstrap, stack.names.all())
    assert configs[stack.names.clip_archives]["cleanup.policy"] == "compact"
    assert configs[stack.names.messages]["retention.ms"] == str(168 * 3_600_000)
    assert configs[stack.names.dead_letters]["retention.ms"] == str(168 * 3_600_000)

    w1 = stack.worker("w1")
    await w1.wait_ready(stack.names.messages)
    doomed, kept = Conversation("doomed", "orchid"), Conversation("kept", "falcon")
    events: list[dict[str, Any]] = [*doomed.until_over(0), *kept.until_over(0)]
    transcript = tmp_path / "transcript.jsonl"
    transcript.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    code, out, err = await compactor(stack, "replay", str(transcript))
    assert code == 0, err
    await stack.wait_for_clip_events({"doomed": 1, "kept": 1}, timeout=90)
    await stack.wait_idle(w1, ["doomed", "kept"], timeout=60)

    code, out, err = await compactor(
        stack, "erase", "doomed", "--reason", "e2e: user asked", "--requester", "dpo",
        "--wait", "--timeout", "60",
    )  # fmt: skip
    assert code == 0, err
    assert "erased at" in out and "messages" in out, out
    assert set((await rows_of(stack, "doomed")).values()) == {0}
    audit = await stack.db.fetchrow("SELECT * FROM erase_audit WHERE conversation_id = 'doomed'")
    assert audit is not None and (audit["requester"], audit["reason"]) == (
        "dpo",
        "e2e: user asked",
    )
    assert json.loads(audit["counts"])["archival_memory"] >= 1  # the compaction was erased too

    # The same transcript again, and a worker of a new consumer group from the earliest
    # offset: originals, replayed copies, old commands and completions all re-read.
    code, out, err = await compactor(stack, "replay", str(transcript))
    assert code == 0, err
    w2 = stack.worker("w2", config={"service": {"app_id": f"{stack.app_id}-new"}})
    await w2.wait_ready(stack.names.messages)
    n = len(doomed.events)

    async def all_read() -> None:
        assert await erased_count(w1) >= n, "w1 read the replayed copies"
        assert await erased_count(w2) >= 2 * n, "w2 read the originals and the copies"

    await eventually(all_read, timeout=90, what="both workers read every erased message")
    await stack.wait_idle(w2, ["kept"], timeout=60)  # w2 is past the replay of `kept` too
    assert set((await rows_of(stack, "doomed")).values()) == {0}
    for worker in (w1, w2):
        assert (await worker.get("/conversations/doomed"))[0] == 404, worker.name
    assert (await rows_of(stack, "kept"))["messages"] > 0
    await w2.stop_async()

    # Published after the erase: a new conversation under the same id (even the
    # same message ids), compacted under ids the erased one never had.
    again = Conversation("doomed", "pebble")
    now = datetime.now(UTC)
    fresh: list[dict[str, Any]] = []
    total = 0
    while total <= BUDGET_TOKENS:
        fresh.append(again.message(created_at=(now + timedelta(seconds=len(fresh))).isoformat()))
        total += tokens_of(fresh[-1])
    await stack.send_all(fresh)
    (first,) = [e for e in clip_events(stack).values() if e.conversation_id == "doomed"]
    assert first.compaction_id == compaction_id_for("doomed", 0)

    async def recompacted() -> None:
        ids = {e.compaction_id for e in clip_events(stack).values()}
        assert compaction_id_for("doomed", 0, 1) in ids

    await eventually(recompacted, timeout=90, what="the new conversation compacted")
    entry = await eventually(
        lambda: _entry(w1, "doomed"), timeout=30, what="the new conversation answers"
    )
    assert entry["message_count"] > 0
    stored = await stack.db.fetchval(
        "SELECT count(*) FROM messages WHERE conversation_id = 'doomed' AND kind = 'message'"
    )
    assert 0 < stored <= len(fresh)


def clip_events(stack: Stack) -> dict[str, ClipArchiveEvent]:
    """Clip-archive events by compaction id, the erase's tombstones left out."""
    return decode_clip_events([r for r in stack.clip_archives.records if r.value is not None])


async def _entry(worker: WorkerProcess, conversation_id: str) -> dict[str, Any]:
    status, body = await worker.get(f"/conversations/{conversation_id}")
    assert status == 200, (status, body)
    assert isinstance(body, dict)
    return body
