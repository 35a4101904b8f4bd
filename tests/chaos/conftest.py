"""Fixtures of the fault-injection suite, and when it runs.

The suite runs only when asked for: ``pytest -m chaos`` (full size, the
figures in docs/reliability.md) or with ``CHAOS_SCALE`` set (``small``: a few
minutes, for CI; ``full``). A plain ``pytest`` skips it.

Scenarios share the session's broker and PostgreSQL (each with its own topic
prefix, app id and database) unless they crash one: the PostgreSQL scenario
gets a server of its own (``own_postgres``), the broker scenario a broker of
its own (``own_broker``). The cluster scenarios share one three-node cluster
(``kafka_cluster``), started the first time one of them runs (about 25 s)
and made whole again before and after each (``cluster``). A failing test
gets every worker's log tail, and the crashed server's, in its report; the
summary lines are printed at the end.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.localstack import KafkaBroker, KafkaCluster, start_cluster, start_kafka
from tests.chaos.harness import RESULTS, ChaosStack, MakeStack, short_summary, wait_until
from tests.chaos.kafka_tools import under_replicated
from tests.support.chaos_llm import ChaosLLMServer
from tests.support.pg_control import ControlledPostgres, own_server

CHAOS_DIR = Path(__file__).resolve().parent
_STACKS = pytest.StashKey[list[ChaosStack]]()


def _selected(config: pytest.Config) -> bool:
    return bool(os.environ.get("CHAOS_SCALE")) or "chaos" in (config.option.markexpr or "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _selected(config):
        return
    skip = pytest.mark.skip(
        reason="fault-injection suite: `pytest -m chaos` (full) or CHAOS_SCALE=small pytest"
    )
    for item in items:
        if CHAOS_DIR in Path(str(item.path)).parents:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and call.when == "call":
        for stack in item.stash.get(_STACKS, []):
            for worker in stack.workers:
                report.sections.append(
                    (f"worker {worker.name} ({worker.log_path})", _interesting(worker.log_text()))
                )
            for name, path in stack.extra_logs:
                try:
                    tail = "\n".join(path.read_text(errors="replace").splitlines()[-40:])
                except OSError:
                    tail = "(no log)"
                report.sections.append((f"{name} log tail ({path})", tail))
    return report


def _interesting(log: str, problems: int = 40, tail: int = 15) -> str:
    """The last warnings and errors of a worker log (INFO lines drown them), then its tail."""
    lines = log.splitlines()
    flagged = [
        line
        for line in lines
        if any(word in line for word in ("WARNING", "ERROR", "CRITICAL", "Traceback", "=== "))
    ]
    return (
        f"last {problems} warnings/errors/restarts:\n"
        + "\n".join(flagged[-problems:])
        + f"\n--- last {tail} lines:\n"
        + "\n".join(lines[-tail:])
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if RESULTS:
        terminalreporter.section("chaos results")
        for line in RESULTS:
            terminalreporter.write_line(line)


@pytest.fixture
async def chaos_llm() -> AsyncIterator[ChaosLLMServer]:
    async with ChaosLLMServer(responder=short_summary) as server:
        yield server


@pytest.fixture
async def make_stack(
    request: pytest.FixtureRequest, chaos_llm: ChaosLLMServer, tmp_path: Path
) -> AsyncIterator[MakeStack]:
    stacks: list[ChaosStack] = []
    request.node.stash[_STACKS] = stacks

    async def make(
        scenario: str,
        bootstrap: str,
        dsn: str,
        *,
        max_message_bytes: int | None = None,
        extra_logs: list[tuple[str, Path]] | None = None,
        replication: int = 1,
    ) -> ChaosStack:
        stack = ChaosStack(
            scenario=scenario,
            bootstrap=bootstrap,
            dsn=dsn,
            llm=chaos_llm,
            root=tmp_path,
            replication=replication,
        )
        stack.extra_logs.extend(extra_logs or [])
        stacks.append(stack)
        await stack.open(max_message_bytes=max_message_bytes)
        return stack

    yield make
    for stack in stacks:
        await stack.close()
    leftovers = [w.name for s in stacks for w in s.workers if w.alive]
    assert not leftovers, f"workers still running after teardown: {leftovers}"


@pytest.fixture
async def own_postgres() -> AsyncIterator[ControlledPostgres]:
    """A PostgreSQL only this test uses, so it may stop it."""
    async with own_server("chaos-pg-") as server:
        yield server


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    """A broker only this test uses, so it may kill it (not the session's)."""
    from tests.conftest import require_local_kafka_tools

    require_local_kafka_tools()
    broker = start_kafka(tmp_path / "kafka", num_partitions=6)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three KRaft nodes (replication factor 3, min.insync.replicas 2) for the
    cluster scenarios only; the other tests keep the session's single broker."""
    from tests.conftest import require_local_kafka_tools

    require_local_kafka_tools()
    cluster = start_cluster(tmp_path_factory.mktemp("kafka-cluster"), 3, num_partitions=6)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def cluster(kafka_cluster: KafkaCluster) -> AsyncIterator[KafkaCluster]:
    """The session's cluster with every node up and every partition fully replicated,
    before the test and after it (a failed test may leave a node down)."""
    await whole(kafka_cluster)
    try:
        yield kafka_cluster
    finally:
        await whole(kafka_cluster)


async def whole(cluster: KafkaCluster, timeout: float = 180.0) -> float:
    """Start any node that is down, then wait until no partition is under-replicated;
    the seconds that took."""
    started = time.monotonic()
    if len(cluster.running) < len(cluster.nodes):
        await asyncio.to_thread(cluster.start)
    last: list[str] = []

    async def replicated() -> bool:
        nonlocal last
        try:
            last = await under_replicated(cluster.bootstrap_servers)
        except Exception as error:
            last = [repr(error)]
        return not last

    try:
        await wait_until(replicated, timeout=timeout, what="every partition fully replicated")
    except AssertionError as error:
        raise AssertionError(f"{error}: {last[:10]}") from None
    return time.monotonic() - started
