"""``compactor pin`` / ``unpin``: an operator pins a stored message without re-sending
it; the pin is in PostgreSQL (it survives restarts) and idempotent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.adapters.postgres.store import PostgresStore
from streams import cli
from tests.support.plans import msg
from tests.support.stores import saved

pytestmark = pytest.mark.integration


def run_cli(*argv: str) -> int:
    return cli.main(list(argv))


async def test_pin_and_unpin_a_stored_message(
    pg_store: PostgresStore,
    pg_database: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    message = msg(0, "the contract terms", conversation_id="acme/conv-pin")
    assert await saved(pg_store, message, 7)
    monkeypatch.setenv("POSTGRES_DSN", pg_database)
    monkeypatch.chdir(tmp_path)
    argv = ("conv-pin", message.id, "--tenant-id", "acme")
    for _ in range(2):  # idempotent
        assert await asyncio.to_thread(run_cli, "pin", *argv) == 0
    assert "pinned now 7 tokens" in capsys.readouterr().out
    (stored,) = await pg_store.history.load_history("acme/conv-pin")
    assert stored.pinned
    assert await pg_store.compactions.pinned_tokens("acme/conv-pin") == 7
    assert await asyncio.to_thread(run_cli, "unpin", *argv) == 0
    (stored,) = await pg_store.history.load_history("acme/conv-pin")
    assert not stored.pinned
    assert await asyncio.to_thread(run_cli, "pin", "conv-pin", "nope", "--tenant-id", "acme") == 1
    assert "no live message nope" in capsys.readouterr().err
