"""``compactor compact``: a transcript through the worker's own components, on PostgreSQL.

Why: the offline command used to compact on its own arithmetic (a history
estimate after every message, ignoring provider token counts), so it could
compact where the worker would not. Now it must trigger on the same counts.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from streams import cli
from streams.events import MessageEvent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)


def events(conversation: str, n: int, token_count: int | None) -> list[MessageEvent]:
    return [
        MessageEvent(
            message_id=f"{conversation}-{i:03d}",
            conversation_id=conversation,
            role="assistant" if i % 2 else "user",
            content=f"Message {i}: the deploy of service {i} failed at step {i * 3}.",
            created_at=T0 + timedelta(minutes=i),
            token_count=token_count,
        )
        for i in range(n)
    ]


def write(tmp_path: Path, dsn: str, all_events: list[MessageEvent]) -> tuple[Path, Path]:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[postgres]\ndsn = "{dsn}"\n'
        "[budget]\ncontext_budget = 0.5\nmodel_max_tokens = 400\n"  # 200 tokens
        "[summarization]\nkeep_recent = 2\nchunk_size = 4\nmin_chunk_tokens = 0\n"
    )
    transcript = tmp_path / "t.jsonl"
    transcript.write_text("".join(e.model_dump_json() + "\n" for e in all_events))
    return config, transcript


async def test_compact_uses_the_worker_s_trigger_and_token_counts(
    tmp_path: Path,
    pg_database: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in ("POSTGRES_DSN", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    # "counted": 6 short messages the provider says cost 50 tokens each: over budget
    # at the 5th (250 > 200), although their text estimates at ~16 tokens each; the
    # command covers those 5, less keep_recent=2.
    # "small": the same text with no token count: 6 x ~16 tokens, never over budget.
    config, transcript = write(
        tmp_path, pg_database, events("counted", 6, 50) + events("small", 6, None)
    )
    code = await asyncio.to_thread(cli.main, ["--config", str(config), "compact", str(transcript)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "compaction 1 of counted: 3 messages" in out
    assert "of small:" not in out
    conn = await asyncpg.connect(pg_database)
    try:
        rows = await conn.fetch(
            "SELECT conversation_id, count(*) AS n, sum(token_estimate) AS tokens, "
            "count(*) FILTER (WHERE kind = 'clip_archive') AS clips FROM messages GROUP BY 1"
        )
        compactions = await conn.fetchval("SELECT count(*) FROM compactions")
        unpublished = await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL")
    finally:
        await conn.close()
    by_conversation = {r["conversation_id"]: r for r in rows}
    assert by_conversation["small"]["n"] == 6 and by_conversation["small"]["clips"] == 0
    counted = by_conversation["counted"]
    assert counted["clips"] == 1
    assert counted["tokens"] <= 200  # under budget again, by the stored counts
    assert compactions >= 1
    assert unpublished == 0  # the outbox went through the same relay as the worker's
