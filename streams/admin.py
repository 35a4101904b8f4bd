"""Topic creation: every topic with the same partition count (co-partitioned).

Relying on broker auto-creation would give whatever ``num.partitions`` the
broker has, and a messages topic with a different partition count than the
table's changelog would send a conversation's events to a worker that does
not own its tally.
"""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streams.topics import TopicNames

log = logging.getLogger("compactor.admin")


class TopicMismatchError(RuntimeError):
    pass


async def ensure_topics(
    bootstrap: str, names: TopicNames, *, partitions: int, replication_factor: int
) -> dict[str, int]:
    """Create missing topics; fail if an existing one has another partition count.

    Returns each topic's partition count.
    """
    wanted = [
        names.messages,
        names.commands,
        names.control,
        names.clip_archives,
        names.dead_letters,
    ]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in wanted if name not in existing]
        if missing:
            try:
                await admin.create_topics(
                    [NewTopic(name, partitions, replication_factor) for name in missing]
                )
                log.info("created topics %s (%d partitions)", ", ".join(missing), partitions)
            except TopicAlreadyExistsError:
                pass  # another worker or a replay created them first
        described = await admin.describe_topics(wanted)
    finally:
        await admin.close()
    counts = {d["topic"]: len(d["partitions"]) for d in described}
    wrong = {topic: n for topic, n in counts.items() if n != partitions}
    if wrong:
        raise TopicMismatchError(
            f"topics must all have {partitions} partitions ([kafka].partitions) to stay "
            f"co-partitioned, but {wrong} differ; recreate them or change the setting"
        )
    return counts
