"""Topic creation: every topic with the same partition count (co-partitioned).

Relying on broker auto-creation would give whatever ``num.partitions`` the
broker has, and a messages topic with a different partition count than the
table's changelog would send a conversation's events to a worker that does
not own its tally.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.kafka.security import PLAINTEXT, KafkaSecurity
from streams.topics import TopicNames

log = logging.getLogger("compactor.admin")


class TopicMismatchError(RuntimeError):
    pass


TOPIC_ALREADY_EXISTS = 36  # Kafka protocol error code


async def ensure_topics(
    bootstrap: str,
    names: TopicNames,
    *,
    partitions: int,
    replication_factor: int,
    settle_seconds: float = 15.0,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[str, int]:
    """Create missing topics; fail if an existing one has another partition count.

    Returns each topic's partition count. A topic just created can briefly be
    described with no partitions while its metadata propagates, so the
    description is retried until every topic shows some (or ``settle_seconds``).
    """
    wanted = names.all()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in wanted if name not in existing]
        if missing:
            response = await admin.create_topics(
                [NewTopic(name, partitions, replication_factor) for name in missing]
            )
            errors = [
                (topic, code, message)
                for topic, code, message, *_ in response.topic_errors
                if code not in (0, TOPIC_ALREADY_EXISTS)  # another worker may race us
            ]
            if errors:
                raise TopicMismatchError(f"could not create topics: {errors}")
            log.info("created topics %s (%d partitions)", ", ".join(missing), partitions)
        deadline = asyncio.get_running_loop().time() + settle_seconds
        while True:
            described = await admin.describe_topics(wanted)
            counts = {d["topic"]: len(d["partitions"]) for d in described}
            settled = len(counts) == len(wanted) and all(counts.values())
            if settled or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
    wrong = {topic: n for topic, n in counts.items() if n != partitions}
    if wrong:
        raise TopicMismatchError(
            f"topics must all have {partitions} partitions ([kafka].partitions) to stay "
            f"co-partitioned, but {wrong} differ; recreate them or change the setting"
        )
    return counts
