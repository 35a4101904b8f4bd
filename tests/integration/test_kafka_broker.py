"""The local KRaft broker really is a Kafka broker, as aiokafka (and so Faust) sees it.

Why: every streaming test builds on ``devtools.localstack``; if keyed
partitioning, consumer groups or isolation between brokers broke there, the
failures would surface far away as flaky pipeline tests.

Set ``KAFKA_BOOTSTRAP_SERVERS`` to run against an already running broker
(e.g. the one CI starts); the tests that need a broker of their own still
start one.
"""

from __future__ import annotations

import os
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from devtools.localstack import (
    KafkaBroker,
    LocalStackError,
    MissingToolError,
    ensure_kafka_jars,
    free_port,
    start_kafka,
    stop_process,
)
from streams.kafka.probe import is_reachable
from streams.stack_state import StackState, read_state, write_state

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _jars_or_skip() -> Path:
    try:
        return ensure_kafka_jars()
    except MissingToolError as exc:
        pytest.skip(f"no local Kafka: {exc}")


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    _jars_or_skip()
    with start_kafka(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(scope="module")
def bootstrap(request: pytest.FixtureRequest) -> str:
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        return external
    broker: KafkaBroker = request.getfixturevalue("own_broker")
    return broker.bootstrap_servers


async def _create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


async def _topics(bootstrap: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return list(await admin.list_topics())
    finally:
        await admin.close()


async def test_keyed_messages_round_trip_through_a_consumer_group(bootstrap: str) -> None:
    topic = f"roundtrip-{uuid.uuid4().hex[:8]}"
    await _create_topic(bootstrap, topic, 4)
    keys = [f"conversation-{i}" for i in range(16)]
    sent: dict[str, set[int]] = defaultdict(set)

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(200):
            key = keys[i % len(keys)]
            meta = await producer.send_and_wait(topic, f"{key}:{i}".encode(), key=key.encode())
            sent[key].add(meta.partition)
        assert await producer.partitions_for(topic) == {0, 1, 2, 3}
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"group-{topic}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    received: dict[str, set[int]] = defaultdict(set)
    values: list[bytes] = []
    try:
        while len(values) < 200:
            batches = await consumer.getmany(timeout_ms=10_000)
            assert batches, f"no messages within 10s, got {len(values)} of 200"
            for tp, messages in batches.items():
                for message in messages:
                    assert message.key is not None and message.value is not None
                    received[message.key.decode()].add(tp.partition)
                    values.append(message.value)
        await consumer.commit()
    finally:
        await consumer.stop()

    assert sorted(values) == sorted(f"{keys[i % 16]}:{i}".encode() for i in range(200))
    assert all(len(partitions) == 1 for partitions in sent.values()), sent
    assert received == sent
    assert len({p for ps in sent.values() for p in ps}) > 1, "keys should spread out"


async def test_second_broker_is_isolated_and_stoppable_by_pid(
    own_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Detached, as `dev up` starts it; `dev down` only has the pid.
    other = start_kafka(tmp_path_factory.mktemp("kafka-second"), die_with_parent=False)
    try:
        assert {other.port, other.controller_port}.isdisjoint(
            {own_broker.port, own_broker.controller_port}
        )
        assert other.data_dir != own_broker.data_dir
        topic = f"only-on-first-{uuid.uuid4().hex[:8]}"
        await _create_topic(own_broker.bootstrap_servers, topic, 2)
        assert topic in await _topics(own_broker.bootstrap_servers)
        assert topic not in await _topics(other.bootstrap_servers)
        assert other.pid is not None
        assert stop_process(other.pid)
        assert not other.is_running()
        assert not is_reachable(other.bootstrap_servers, timeout=0.5)
        assert is_reachable(own_broker.bootstrap_servers)
    finally:
        other.stop()


def test_same_data_dir_cannot_host_two_brokers(own_broker: KafkaBroker) -> None:
    with pytest.raises(LocalStackError, match="already runs"):
        KafkaBroker(own_broker.data_dir).start()
    assert own_broker.is_running()


def test_reachability_probe(own_broker: KafkaBroker) -> None:
    assert is_reachable(own_broker.bootstrap_servers)
    assert is_reachable(f"127.0.0.1:{free_port()},{own_broker.bootstrap_servers}")
    assert not is_reachable(f"127.0.0.1:{free_port()}", timeout=0.5)


def test_state_file_round_trips(tmp_path: Path) -> None:
    assert read_state(tmp_path) is None
    state = StackState(
        kafka_bootstrap="127.0.0.1:9092",
        postgres_dsn="postgresql://u@127.0.0.1:5432/db",
        pids={"kafka": os.getpid()},
        data_dirs={"kafka": str(tmp_path / "kafka")},
    )
    write_state(tmp_path, state)
    loaded = read_state(tmp_path)
    assert loaded == state
    assert loaded is not None and loaded.alive_pids() == {"kafka": os.getpid()}
