"""Which late commands are only queued: asked of a real broker.

Why: reconciliation re-sent every command outstanding longer than its timeout,
and under a backlog those were late, not lost; each copy made the backlog
longer and ran as a no-op (the hour soak: 32,867 re-sent for 2,666
compactions). ``KafkaCommandBacklog`` must say "still queued" exactly while
the worker group has not committed past the command, and never for a
command that is not on the topic (that one is lost and must be re-sent).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import GroupCoordinatorNotAvailableError
from aiokafka.structs import OffsetAndMetadata

from core.domain.tenancy import ConversationRef
from core.ports.publisher import RecordPosition
from streams.kafka.command_backlog import KafkaCommandBacklog
from streams.kafka.security import KafkaSecurity
from streams.worker.issued_commands import IssuedCommand

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PARTITIONS = 3


@pytest.fixture
async def topic(kafka_bootstrap: str) -> AsyncIterator[str]:
    name = f"commands-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, PARTITIONS, 1)])
        yield name
    finally:
        await admin.close()


def _backlog(bootstrap: str, topic: str, group: str) -> KafkaCommandBacklog:
    return KafkaCommandBacklog(
        bootstrap=bootstrap,
        security=KafkaSecurity(),
        group_id=group,
        topic=topic,
        control_topic=topic,  # a topic of its own in the worker; any topic reads alike
        partitions=PARTITIONS,
    )


async def _send(
    bootstrap: str, topic: str, keys: list[str], issued: dict[str, float] | None = None
) -> dict[str, tuple[int, int]]:
    """Each conversation's command as accounting sends it (its issue time noted
    in ``issued`` first, each in a millisecond of its own); where it landed.

    A millisecond passes after each send too: a command issued in the very
    millisecond the previous record was stamped (a fast loopback ack) is found
    at that record's offset, the time lookup's one ambiguity, which errs
    towards a re-send (the previous record finished, so this one is taken as
    done: copied, never lost); here each must be told apart."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        landed = {}
        for key in keys:
            if issued is not None:
                issued[key] = time.time()
                await asyncio.sleep(0.002)
            conversation_id = ConversationRef.of_key(key).conversation_id
            meta = await producer.send_and_wait(topic, b"{}", key=conversation_id.encode())
            landed[key] = (meta.partition, meta.offset)
            if issued is not None:
                await asyncio.sleep(0.002)
        return landed
    finally:
        await producer.stop()


async def _commit(bootstrap: str, topic: str, group: str, offsets: dict[int, int]) -> None:
    """The worker group finishing records below these offsets (as Faust commits)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in offsets])
        await consumer.commit(
            {TopicPartition(topic, p): OffsetAndMetadata(o, "") for p, o in offsets.items()}
        )
    finally:
        await consumer.stop()


def _at(times: dict[str, float]) -> dict[str, IssuedCommand]:
    """Commands known by their issue time alone (sent before a restart)."""
    return {key: IssuedCommand(at) for key, at in times.items()}


async def _first_answer(backlog: KafkaCommandBacklog, issued: dict[str, IssuedCommand]) -> set[str]:
    deadline = time.monotonic() + 60.0
    while True:
        try:
            return await backlog.still_queued(issued)
        except GroupCoordinatorNotAvailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_a_command_is_queued_until_the_group_commits_past_it(
    kafka_bootstrap: str, topic: str
) -> None:
    group = f"workers-{uuid.uuid4().hex[:8]}"
    keys = [f"conversation-{i}" for i in range(12)]
    issued = time.time()
    landed = await _send(kafka_bootstrap, topic, keys)
    backlog = _backlog(kafka_bootstrap, topic, group)
    try:
        for key, (partition, _) in landed.items():
            assert backlog.partition_of(key) == partition, "accounting's partitioner"
        # Nothing committed yet: every command is still to be read. (A fresh broker
        # creates its offsets topic on the first group lookup: until then the
        # lookup fails, and the reconciler would re-send as before.)
        assert await _first_answer(backlog, _at(dict.fromkeys(keys, issued))) == set(keys)

        # The group finishes the first command of each partition.
        first = {p: min(o for q, o in landed.values() if q == p) for p, _ in landed.values()}
        await _commit(kafka_bootstrap, topic, group, {p: o + 1 for p, o in first.items()})
        done = {k for k, (p, o) in landed.items() if o == first[p]}
        queued = await backlog.still_queued(_at(dict.fromkeys(keys, issued)))
        assert done.isdisjoint(queued), "a finished command is never reported queued"
        # Issued at one instant (a batch), known by time alone: the first offset
        # found is the partition's first command, and the others cannot be told
        # apart from it, so none is known to be queued.
        assert queued == set()
        # Known by where the broker put them, they are told apart exactly.
        exact = {
            key: IssuedCommand(issued, RecordPosition(partition, offset))
            for key, (partition, offset) in landed.items()
        }
        assert await backlog.still_queued(exact) == set(keys) - done

        # Sent again, each at a time of its own: all queued, then exactly those
        # at or after each partition's committed offset.
        times: dict[str, float] = {}
        later = await _send(kafka_bootstrap, topic, keys, times)
        assert await backlog.still_queued(_at(times)) == set(keys)
        middle = {p: sorted(o for q, o in later.values() if q == p) for p, _ in later.values()}
        halfway = {p: offsets[len(offsets) // 2] for p, offsets in middle.items()}
        await _commit(kafka_bootstrap, topic, group, halfway)
        expected = {k for k, (p, o) in later.items() if o >= halfway[p]}
        assert set(keys) > expected
        assert await backlog.still_queued(_at(times)) == expected

        # The group past everything: nothing is queued.
        ends = {p: max(o for q, o in later.values() if q == p) + 1 for p, _ in later.values()}
        await _commit(kafka_bootstrap, topic, group, ends)
        assert await backlog.still_queued(_at(times)) == set()
    finally:
        await backlog.close()


async def test_a_command_never_sent_is_not_queued(kafka_bootstrap: str, topic: str) -> None:
    """Lost between the table write and the send: nothing on the topic at or
    after its issue time, so it must be re-sent."""
    group = f"workers-{uuid.uuid4().hex[:8]}"
    await _send(kafka_bootstrap, topic, ["older"])
    backlog = _backlog(kafka_bootstrap, topic, group)
    try:
        assert await backlog.still_queued(_at({"lost": time.time() + 1.0})) == set()
    finally:
        await backlog.close()


async def test_an_unreachable_broker_raises_rather_than_guessing() -> None:
    backlog = KafkaCommandBacklog(
        bootstrap="127.0.0.1:1",
        security=KafkaSecurity(),
        group_id="workers",
        topic="commands",
        control_topic="control",
        partitions=PARTITIONS,
    )
    with pytest.raises(Exception):  # noqa: B017 - the reconciler logs any error and re-sends
        await backlog.still_queued(_at({"c": time.time()}))
    await backlog.close()


async def test_a_request_is_unread_until_the_group_commits_past_it(
    kafka_bootstrap: str, topic: str
) -> None:
    group = f"workers-{uuid.uuid4().hex[:8]}"
    keys = [f"conversation-{i}" for i in range(6)]
    landed = await _send(kafka_bootstrap, topic, keys)
    sent = {key: RecordPosition(p, o) for key, (p, o) in landed.items()}
    backlog = _backlog(kafka_bootstrap, topic, group)
    try:
        deadline = time.monotonic() + 60.0
        while True:
            try:
                assert await backlog.requests_unread(sent) == set(keys)
                break
            except GroupCoordinatorNotAvailableError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
        first = {p: min(o for q, o in landed.values() if q == p) for p, _ in landed.values()}
        await _commit(kafka_bootstrap, topic, group, {p: o + 1 for p, o in first.items()})
        read = {k for k, (p, o) in landed.items() if o == first[p]}
        assert await backlog.requests_unread(sent) == set(keys) - read
    finally:
        await backlog.close()
