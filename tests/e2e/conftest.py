"""End-to-end harness: real worker processes on a real broker and PostgreSQL.

One broker (session fixture) serves every test; each test gets its own topic
prefix, app id (consumer group and changelog topic), database and LLM test
server, so tests cannot see each other's records, offsets or rows. The LLM
server runs in the test's event loop; workers reach it over loopback.

``stack`` is the per-test handle: start workers, produce events, read the
clip-archive and dead-letter topics, query PostgreSQL. A failing test gets
the tail of every worker's log appended to its report.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from core.domain.tenancy import ConversationRef
from core.domain.tokens import estimate_message_tokens
from streams.events import ClipArchiveEvent, MessageEvent
from streams.kafka.admin import ensure_topics
from streams.topics import TopicNames
from tests.support.kafka_io import Producer, Record, Sent, TopicCollector
from tests.support.llm_server import ChatRequest, LLMTestServer, turn_words
from tests.support.worker import WorkerProcess, terminate_all

T = TypeVar("T")

PARTITIONS = 4
# [budget] below: context_budget 0.5 * model_max_tokens 2000.
BUDGET_TOKENS = 1000
KEEP_RECENT = 6

# Words the summariser echoes back: a summary names the markers of the
# messages it summarised, so memory search can be checked per conversation.
MARKERS = (
    "orchid",
    "falcon",
    "glacier",
    "harbor",
    "lantern",
    "meadow",
    "quartz",
    "saffron",
    "tundra",
    "violet",
    "walnut",
    "cobalt",
    "ember",
    "juniper",
    "nectar",
    "pebble",
)
_FILLER = (
    "the deploy pipeline stalled while we were checking logs again after the rollback "
    "on the staging cluster and metrics looked normal until traffic rose"
).split()
T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)

_WORKERS: list[WorkerProcess] = []
_STACK_KEY = pytest.StashKey["Stack"]()


def marker_responder(request: ChatRequest) -> str:
    """A short deterministic summary naming the markers it saw (keeps clip-archives
    small), or a few of its turns' words when they carry no marker: the gate
    refuses a summary sharing no word with its turns (``unrelated``)."""
    words = set(re.findall(r"[a-z]+", " ".join(c for _, c in request.messages).lower()))
    found = sorted(words & set(MARKERS))
    return f"Summary: discussed {' '.join(found) or turn_words(request, 3)}."


async def ready_worker(stack: Stack, config: Mapping[str, Any] | None = None) -> Any:
    """A worker whose partitions are assigned and whose runtime is open (/readyz)."""
    worker = stack.worker("w0", config=dict(config or {}))
    await worker.wait_ready(stack.names.messages)

    async def ready() -> None:
        status, body = await worker.get("/readyz")
        assert status == 200, body

    await eventually(ready, timeout=60, what="/readyz 200")
    return worker


def tokens_of(event: Mapping[str, Any]) -> int:
    """What the service should count for ``event``: its token_count, else the estimate."""
    if event.get("token_count") is not None:
        return int(event["token_count"])
    return estimate_message_tokens(MessageEvent.model_validate(event).to_message())


class Conversation:
    """Builds the message events of one conversation (ids, roles, times, content)."""

    def __init__(self, conversation_id: str, marker: str, chars: int = 160) -> None:
        self.id = conversation_id
        self.marker = marker
        self.chars = chars
        self.events: list[dict[str, Any]] = []

    def text(self, n: int) -> str:
        words = [f"{self.marker} note {n}:"]
        i = n
        while len(" ".join(words)) < self.chars:
            words.append(_FILLER[i % len(_FILLER)])
            i += 7
        return " ".join(words)[: self.chars]

    def message(self, **fields: Any) -> dict[str, Any]:
        n = len(self.events)
        event: dict[str, Any] = {
            "schema_version": 1,
            "message_id": f"{self.id}-m{n:04d}",
            "conversation_id": self.id,
            "role": "user" if n % 2 == 0 else "assistant",
            "content": self.text(n),
            "created_at": (T0 + timedelta(seconds=30 * n)).isoformat(),
        }
        event.update(fields)
        self.events.append(event)
        return event

    def until_over(self, current_total: int, budget: int = BUDGET_TOKENS) -> list[dict[str, Any]]:
        """Messages that take ``current_total`` over ``budget`` with the last one, exactly."""
        batch = []
        total = current_total
        while total <= budget:
            event = self.message()
            batch.append(event)
            total += tokens_of(event)
        return batch

    @property
    def ids(self) -> list[str]:
        return [e["message_id"] for e in self.events]


def interleave(*groups: Iterable[T]) -> list[T]:
    """Round-robin over the groups, so conversations arrive mixed as in production."""
    lists = [list(g) for g in groups]
    out: list[T] = []
    for i in range(max((len(g) for g in lists), default=0)):
        out.extend(g[i] for g in lists if i < len(g))
    return out


async def eventually(
    check: Callable[[], Awaitable[T]], *, timeout: float, what: str, interval: float = 0.25
) -> T:
    """``check()`` until it stops raising AssertionError; its last error on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await check()
        except AssertionError as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not true within {timeout:.0f}s: {error}") from None
        await asyncio.sleep(interval)


def decode_clip_events(records: list[Record]) -> dict[str, ClipArchiveEvent]:
    """Clip-archive events by compaction id. Delivery is at least once, so a
    compaction may appear more than once, but every copy must be identical."""
    by_id: dict[str, bytes] = {}
    for record in records:
        assert record.value is not None
        if b'"type":"compaction_rejected"' in record.value:  # the gate's, not a clip-archive
            continue
        event = ClipArchiveEvent.model_validate_json(record.value)
        assert record.key == event.conversation_key.encode(), "clip-archive keyed by conversation"
        previous = by_id.setdefault(event.compaction_id, record.value)
        assert previous == record.value, f"copies of {event.compaction_id} differ"
    return {cid: ClipArchiveEvent.model_validate_json(raw) for cid, raw in by_id.items()}


class Stack:
    """One test's slice of the system: prefix, app id, database, LLM server, workers."""

    def __init__(self, *, bootstrap: str, dsn: str, llm: LLMTestServer, root: Path) -> None:
        tag = uuid.uuid4().hex[:10]
        self.tag = tag
        self.bootstrap = bootstrap
        self.dsn = dsn
        self.llm = llm
        self.root = root
        self.prefix = f"e2e.{tag}."
        self.app_id = f"e2e-{tag}"
        self.names = TopicNames.with_prefix(self.prefix)
        self.workers: list[WorkerProcess] = []
        self.producer = Producer(bootstrap)
        self.clip_archives = TopicCollector(bootstrap, self.names.clip_archives, PARTITIONS)
        self.dead_letters = TopicCollector(bootstrap, self.names.dead_letters, PARTITIONS)
        self.pool: asyncpg.Pool | None = None
        self.sent: list[Sent] = []

    def config(self) -> dict[str, dict[str, Any]]:
        return {
            "summarization": {
                "provider": "openai",
                "base_url": self.llm.openai_base_url,
                "model": "test-model",
                "chunk_size": 5,
                "min_chunk_tokens": 0,  # chunks of chunk_size turns, however short
                "keep_recent": KEEP_RECENT,
                "max_summary_tokens": 200,
                "timeout_seconds": 5.0,
                "max_retries": 1,
                "retry_backoff_seconds": 0.1,
                "max_consecutive_failures": 10,
                "circuit_cooldown_seconds": 1.0,
            },
            # Characters / 4, which the tests' arithmetic (``tokens_of``, ``until_over``)
            # assumes; the default, "calibrated", moves to the LLM test server's count
            # once a compaction was measured (tests/e2e/test_accounting.py tests it).
            "budget": {"context_budget": 0.5, "model_max_tokens": 2000, "token_estimate": "chars"},
            "postgres": {"pool_min_size": 1, "pool_max_size": 4},
            "kafka": {
                "topic_prefix": self.prefix,
                "partitions": PARTITIONS,
                "replication_factor": 1,
                # The tests compare dead letters with the bytes sent (the default,
                # "redacted", keeps none: tests/unit/worker/test_erase_holds.py).
                "dead_letter_content": "full",
            },
            "service": {
                "app_id": self.app_id,
                "store": "memory://",
                "max_concurrent_compactions": 4,
                "command_timeout_seconds": 4.0,
                "reconcile_interval_seconds": 1.0,
                "outbox_relay_interval_seconds": 1.0,
            },
        }

    async def open(self, messages_configs: Mapping[str, str] | None = None) -> None:
        """``messages_configs``: the messages topic is created first, with these."""
        # Created up front, as a deployment would, so readers can attach at once.
        if messages_configs:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
            await admin.start()
            try:
                await admin.create_topics(
                    [
                        NewTopic(
                            self.names.messages, PARTITIONS, 1, topic_configs=dict(messages_configs)
                        )
                    ]
                )
            finally:
                await admin.close()
        await ensure_topics(self.bootstrap, self.names, partitions=PARTITIONS, replication_factor=1)
        await self.producer.start()
        await self.clip_archives.start()
        await self.dead_letters.start()
        self.pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=3)

    async def close(self) -> None:
        await asyncio.to_thread(terminate_all, self.workers)
        await self.clip_archives.stop()
        await self.dead_letters.stop()
        await self.producer.stop()
        if self.pool is not None:
            await self.pool.close()

    # -- workers ------------------------------------------------------------

    def worker(
        self,
        name: str,
        *,
        config: Mapping[str, Mapping[str, Any]] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> WorkerProcess:
        """Start a worker of this stack (same group unless ``config`` says otherwise)."""
        sections = self.config()
        for section, values in (config or {}).items():
            sections.setdefault(section, {}).update(values)
        worker = WorkerProcess(
            self.root, name, bootstrap=self.bootstrap, dsn=self.dsn, config=sections, env=env
        )
        self.workers.append(worker)
        _WORKERS.append(worker)
        return worker.start()

    # -- Kafka --------------------------------------------------------------

    async def send(self, event: Mapping[str, Any]) -> Sent:
        """A valid message event, keyed by its conversation id."""
        sent = await self.producer.send(
            self.names.messages,
            json.dumps(event).encode(),
            key=str(event["conversation_id"]).encode(),
        )
        self.sent.append(sent)
        return sent

    async def send_all(self, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            await self.send(event)

    async def send_raw(
        self, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]] | None = None
    ) -> Sent:
        sent = await self.producer.send(self.names.messages, value, key=key, headers=headers)
        self.sent.append(sent)
        return sent

    def clip_events(self) -> dict[str, ClipArchiveEvent]:
        return decode_clip_events(list(self.clip_archives.records))

    async def wait_for_clip_events(
        self, expected: Mapping[str, int], timeout: float
    ) -> dict[str, ClipArchiveEvent]:
        """Until each conversation has ``expected[key]`` distinct compactions published
        (``key``: its conversation key, the id for a conversation without a tenant)."""

        def counts(records: list[Record]) -> dict[str, int]:
            found: dict[str, int] = {}
            for event in decode_clip_events(records).values():  # by (tenant, id)
                found[event.conversation_key] = found.get(event.conversation_key, 0) + 1
            return found

        def done(records: list[Record]) -> bool:
            found = counts(records)
            return all(found.get(cid, 0) >= n for cid, n in expected.items())

        try:
            await self.clip_archives.wait_for(
                done,
                timeout,
                what=f"clip-archive events {dict(expected)}",
                describe=lambda records: f"got {counts(records)}",
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\n{await self.diagnose()}") from None
        return self.clip_events()

    async def diagnose(self) -> str:
        """What PostgreSQL and the topics hold, for a failure message."""
        compactions = await self.db.fetch(
            "SELECT conversation_id, compaction_id FROM compactions ORDER BY created_at"
        )
        outbox = await self.db.fetch(
            "SELECT id, compaction_id, topic, key, published_at IS NOT NULL AS published "
            "FROM outbox ORDER BY id"
        )
        reread = TopicCollector(self.bootstrap, self.names.clip_archives, PARTITIONS)
        await reread.start()
        await asyncio.sleep(2.0)
        await reread.stop()
        on_topic = sorted(
            {
                (r.partition, ClipArchiveEvent.model_validate_json(r.value or b"").conversation_id)
                for r in reread.records
            }
        )
        collected = sorted({(r.partition, r.offset) for r in self.clip_archives.records})
        sent = sorted({(r.partition, r.key) for r in self.sent})
        stored = await self.db.fetch(
            "SELECT conversation_id, count(*) AS n, sum(token_estimate) AS total "
            "FROM messages GROUP BY conversation_id ORDER BY conversation_id"
        )
        live_ids = {r["id"] for r in await self.db.fetch("SELECT id FROM messages")}
        archived_ids = {
            i
            for r in await self.db.fetch("SELECT source_message_ids FROM archival_memory")
            for i in r["source_message_ids"]
        }
        missing = []
        for record in self.sent:
            try:
                message_id = json.loads(record.value)["message_id"]
            except (ValueError, KeyError, TypeError):
                continue
            if message_id not in live_ids and message_id not in archived_ids:
                missing.append((message_id, record.partition, record.offset))
        lines = [
            f"sent but neither stored nor archived (id, partition, offset): {missing}",
            f"compactions in PostgreSQL: {[tuple(r) for r in compactions]}",
            f"outbox: {[tuple(r) for r in outbox]}",
            f"messages in PostgreSQL: {[tuple(r) for r in stored]}",
            f"sent (partition, key): {sent}",
            f"clip-archives re-read from the start: {on_topic}",
            f"collected (partition, offset): {collected}",
        ]
        alive = [w for w in self.workers if w.alive]
        if alive:
            for row in stored:
                ref = ConversationRef.of_key(row["conversation_id"])
                path = f"/conversations/{ref.conversation_id}"
                if ref.tenant_id is not None:
                    path += f"?tenant_id={ref.tenant_id}"
                try:
                    status, body = await alive[0].get(path)
                except Exception as error:  # diagnostics must not hide the failure
                    status, body = 0, repr(error)
                lines.append(f"table entry of {row['conversation_id']}: {status} {body}")
        for worker in self.workers:
            worker.dump_stacks()  # into its log, for the report
        for worker in self.workers:
            if not worker.alive:
                lines.append(f"{worker.name}: not running")
                continue
            try:
                health = await worker.health()
                text = await worker.metrics_text()
            except Exception as error:  # diagnostics must not hide the failure
                lines.append(f"{worker.name}: {error!r}")
                continue
            interesting = [
                line
                for line in text.splitlines()
                if line.startswith(
                    (
                        "compactor_events_in_total",
                        "compactor_consumer_lag",
                        "compactor_commands_issued_total",
                        "compactor_compactions_",
                    )
                )
            ]
            lines.append(f"{worker.name} healthz: {health}")
            lines.extend(f"{worker.name} {line}" for line in interesting)
        return "\n".join(lines)

    # -- PostgreSQL ---------------------------------------------------------

    @property
    def db(self) -> asyncpg.Pool:
        assert self.pool is not None
        return self.pool

    async def pg_tally(self, conversation_id: str) -> tuple[int, int]:
        """(sum of token_estimate, row count) of a conversation's live messages."""
        row = await self.db.fetchrow(
            "SELECT coalesce(sum(token_estimate), 0) AS total, count(*) AS n "
            "FROM messages WHERE conversation_id = $1",
            conversation_id,
        )
        return int(row["total"]), int(row["n"])

    async def pg_history(self, conversation_id: str) -> list[asyncpg.Record]:
        """Live rows in history order: the clip-archive first, then by time."""
        return list(
            await self.db.fetch(
                "SELECT id, role, content, kind, compaction_id, token_estimate FROM messages "
                "WHERE conversation_id = $1 "
                "ORDER BY (kind = 'clip_archive') DESC, created_at, id",
                conversation_id,
            )
        )

    async def pg_compactions(self) -> list[asyncpg.Record]:
        return list(
            await self.db.fetch(
                "SELECT compaction_id, conversation_id, messages_compressed, batches_created "
                "FROM compactions ORDER BY created_at"
            )
        )

    async def pg_batches(self) -> list[asyncpg.Record]:
        return list(
            await self.db.fetch(
                "SELECT id, conversation_id, compaction_id, depth, message_count, "
                "source_message_ids, superseded_by, content FROM archival_memory ORDER BY seq"
            )
        )

    # -- the worker's view ----------------------------------------------------

    async def wait_idle(
        self, worker: WorkerProcess, conversation_ids: Iterable[str], timeout: float
    ) -> dict[str, dict[str, Any]]:
        """Until every conversation's table entry has nothing outstanding and agrees
        with PostgreSQL (token total and message count); the entries."""
        ids = list(conversation_ids)

        async def check() -> dict[str, dict[str, Any]]:
            entries = {}
            for cid in ids:
                status, body = await worker.get(f"/conversations/{cid}")
                assert status == 200, f"{cid}: {status} {body}"
                total, count = await self.pg_tally(cid)
                assert body["compaction_outstanding"] is None, f"{cid}: {body}"
                assert (body["token_total"], body["message_count"]) == (total, count), (
                    f"{cid}: table {body} vs PostgreSQL total={total} count={count}"
                )
                entries[cid] = body
            return entries

        return await eventually(check, timeout=timeout, what="stream idle and table == PostgreSQL")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        stack = item.stash.get(_STACK_KEY, None)
        if stack is not None:
            for worker in stack.workers:
                report.sections.append(
                    (f"worker {worker.name} log tail ({worker.log_path})", worker.log_tail(80))
                )
    return report


@pytest.fixture
async def llm() -> AsyncIterator[LLMTestServer]:
    async with LLMTestServer(responder=marker_responder) as server:
        yield server


@pytest.fixture
async def stack(
    request: pytest.FixtureRequest,
    kafka_bootstrap: str,
    pg_database: str,
    llm: LLMTestServer,
    tmp_path: Path,
) -> AsyncIterator[Stack]:
    handle = Stack(bootstrap=kafka_bootstrap, dsn=pg_database, llm=llm, root=tmp_path)
    request.node.stash[_STACK_KEY] = handle
    await handle.open()
    try:
        yield handle
    finally:
        await handle.close()
        leftovers = [w.name for w in handle.workers if w.alive]
        assert not leftovers, f"workers still running after teardown: {leftovers}"


@pytest.fixture(scope="session", autouse=True)
def _no_worker_outlives_the_session() -> Any:
    yield
    terminate_all(_WORKERS)
    alive = [w.pid for w in _WORKERS if w.alive]
    assert not alive, f"worker processes left running: {alive}"
