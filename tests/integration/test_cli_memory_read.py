"""``compactor memory-read`` follows the HTTP view's scoping rule: one
conversation, one tenant's conversations, or every conversation only when
asked for by name (``--all``). An operator tool with database access still
should not search every tenant's archive by omission. With ``--json`` the
reads from PostgreSQL print the HTTP API's bodies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from core.adapters.postgres.store import PostgresStore
from streams import cli
from streams.http.bodies import BatchPage, HistoryPage, SearchResult
from tests.integration.test_postgres_store import archive
from tests.support.plans import msg
from tests.support.stores import saved

pytestmark = pytest.mark.integration


def run_cli(*argv: str) -> int:
    return cli.main(list(argv))


async def test_memory_read_needs_a_scope_or_all(
    pg_store: PostgresStore,
    pg_database: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for conversation in ("acme/conv-acme", "globex/conv-globex"):
        assert await saved(pg_store, msg(0, conversation_id=conversation), 5)
        await archive(
            pg_store,
            f"cmp-{conversation}",
            [f"kafka rebalance in {conversation}"],
            conversation_id=conversation,
        )
    monkeypatch.setenv("POSTGRES_DSN", pg_database)
    monkeypatch.chdir(tmp_path)  # no config.toml: embedded defaults, the DSN from the env

    assert await asyncio.to_thread(run_cli, "memory-read", "kafka") == 2
    assert "--conversation-id" in capsys.readouterr().err
    assert (
        await asyncio.to_thread(run_cli, "memory-read", "kafka", "--all", "--tenant-id", "x") == 2
    )
    assert "not --all as well" in capsys.readouterr().err

    assert await asyncio.to_thread(run_cli, "memory-read", "kafka", "--tenant-id", "acme") == 0
    out = capsys.readouterr().out
    assert "conv-acme" in out and "conv-globex" not in out
    assert await asyncio.to_thread(run_cli, "memory-read", "kafka", "--all") == 0
    out = capsys.readouterr().out
    assert "conv-acme" in out and "conv-globex" in out
    assert "why: summary_text #1 (" in out and ": kafka)" in out  # list, rank, score, words

    argv = ("memory-read", "Kafka?", "--tenant-id", "acme", "--conversation-id", "conv-acme")
    argv += ("--json",)
    assert await asyncio.to_thread(run_cli, *argv) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["hits"][0]["matches"][0]["via"] == "summary_text"
    assert body["hits"][0]["matches"][0]["terms"] == ["Kafka"]  # as typed


async def test_reads_from_postgresql_print_the_http_apis_bodies_with_json(
    pg_store: PostgresStore,
    pg_database: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The operator's path (no worker) prints what the views answer: the same models."""
    conversation = "acme/conv-json"
    for i in range(3):
        assert await saved(pg_store, msg(i, conversation_id=conversation), 5)
    (batch,) = await archive(
        pg_store, "cmp-json", ["kafka rebalance notes"], conversation_id=conversation
    )
    monkeypatch.setenv("POSTGRES_DSN", pg_database)
    monkeypatch.chdir(tmp_path)

    argv = ("history", "conv-json", "--tenant-id", "acme", "--json")
    assert await asyncio.to_thread(run_cli, *argv) == 0
    page = HistoryPage.model_validate_json(capsys.readouterr().out)
    assert page.tenant_id == "acme" and page.conversation_id == "conv-json"
    assert [m.id for m in page.messages] == [
        m.id for m in await pg_store.history.load_history(conversation)
    ]
    assert page.next_cursor is None

    argv = ("memory-read", "kafka", "--tenant-id", "acme", "--json")
    assert await asyncio.to_thread(run_cli, *argv) == 0
    found = SearchResult.model_validate_json(capsys.readouterr().out)
    assert [(h.conversation_id, h.tenant_id) for h in found.hits] == [("conv-json", "acme")]

    assert found.hits[0].batch_id == batch.id
    argv = ("expand", "conv-json", batch.id, "--tenant-id", "acme", "--json")
    assert await asyncio.to_thread(run_cli, *argv) == 0
    expanded = BatchPage.model_validate_json(capsys.readouterr().out)
    assert expanded.batch_id == batch.id and expanded.summary == "kafka rebalance notes"
