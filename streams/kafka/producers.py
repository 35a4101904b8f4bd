"""How every producer of the service sends: one place, so none can differ.

``acks=all`` with idempotence, for the worker's Faust producer (commands,
completions, clip-archive events, dead letters, the table's changelog),
``compactor replay`` and ``compactor erase``:

* ``acks=all``: the broker acknowledges a record once every in-sync replica
  has it, and refuses it while fewer than the topic's ``min.insync.replicas``
  are in sync (``[kafka].min_insync_replicas``, ``streams/kafka/admin.py``).
  An acknowledged record then survives the loss of any
  ``min.insync.replicas - 1`` brokers, and nothing is acknowledged that only
  the leader has.
* idempotence: the broker de-duplicates a batch the client sends again (a
  lost ack, a leader moved to another broker) by producer id and sequence
  number, so a retry neither duplicates nor reorders a partition's records.
  Consumers still de-duplicate what the application itself sends twice (a
  replayed compaction's events, docs/events.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

#: The producer settings every producer of the service is built with.
DURABLE_SENDS: Mapping[str, Any] = MappingProxyType({"acks": "all", "enable_idempotence": True})

#: Faust states acks as a number: -1 is "all".
FAUST_ACKS_ALL = -1


def producer_config(
    client_kwargs: Mapping[str, Any], *, client_id: str, **settings: Any
) -> dict[str, Any]:
    """Keyword arguments for an ``AIOKafkaProducer``: the transport security of
    ``client_kwargs`` (``KafkaSecurity.client_kwargs``), the command's ``settings``
    (``linger_ms``, ``max_request_size``, …), and ``DURABLE_SENDS``, which no
    caller can override."""
    clash = sorted(set(settings) & set(DURABLE_SENDS))
    if clash:
        raise ValueError(f"{clash} are fixed for every producer (streams/kafka/producers.py)")
    return {**client_kwargs, **settings, "client_id": client_id, **DURABLE_SENDS}


def faust_producer_settings(max_request_bytes: int) -> dict[str, Any]:
    """The ``faust.App`` producer settings. Faust has no setting for idempotence
    (it turns it on only inside its transactions); ``faust_patches.durable_producer``
    adds ``DURABLE_SENDS`` to every producer Faust builds."""
    return {"producer_acks": FAUST_ACKS_ALL, "producer_max_request_size": max_request_bytes}
