"""Choosing and running the embedded PostgreSQL (with no DSN, only when asked for:
``[postgres].embedded = true``)."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from core.adapters.postgres.embedded import POSTGRES_DSN_ENV, resolve_dsn
from core.adapters.postgres.migrate import migrate


def test_configured_dsn_wins_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(POSTGRES_DSN_ENV, "postgresql://env@db/envdb")
    assert resolve_dsn("postgresql://cfg@db/cfg", tmp_path) == ("postgresql://cfg@db/cfg", None)
    assert resolve_dsn(None, tmp_path, embedded=True) == ("postgresql://env@db/envdb", None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
@pytest.mark.slow
async def test_embedded_server_keeps_its_data_across_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(POSTGRES_DSN_ENV, raising=False)
    dsn, handle = resolve_dsn(None, tmp_path, embedded=True)
    assert handle is not None
    try:
        assert await migrate(dsn) != []
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                "INSERT INTO compactions (compaction_id, conversation_id, messages_compressed,"
                " batches_created, tokens_before, tokens_after) VALUES ('c', 'v', 0, 0, 0, 0)"
            )
        finally:
            await conn.close()
    finally:
        handle.stop()

    dsn, handle = resolve_dsn(None, tmp_path, embedded=True)
    assert handle is not None
    try:
        assert await migrate(dsn) == []
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SELECT count(*) FROM compactions") == 1
        finally:
            await conn.close()
    finally:
        handle.stop()
