"""Work-arounds for faust-streaming bugs, each applied once at app build.

Faust hands aiokafka its *live* set of active partitions, which aiokafka reads
on its own thread. A rebalance empties that set (Faust pauses every
partition), and to aiokafka an empty set means "all partitions": a fetch
already in flight then drains a changelog partition that recovery has just
sought to its start, and Faust throws the batch away (the flow is stopped).
Nothing seeks the changelog back (its offsets are never committed), so table
recovery waits forever: "No event received for active tp ... since recovery
start". Seen in about 1 of 20 rebalances of the end-to-end tests; with the
window widened by 0.3 s, 6 of 6, and 0 of 6 with this patch. Present in
faust-streaming 0.15.3, the newest release when this was written.

pyproject.toml pins faust-streaming to ``TESTED_WITH``: each patch replaces a
private method, so a new release must be read before the pin moves (the
checklist is in docs/operations.md, "Faust"). Each patch names the upstream
issue it works around, or says that none is known.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from importlib.metadata import version
from typing import Any

from faust.transport.consumer import ThreadDelegateConsumer

from streams.kafka.producers import DURABLE_SENDS

log = logging.getLogger("compactor.worker")

TESTED_WITH = "0.15.3"
_MARK = "_compactor_snapshot_patch"


def snapshot_active_partitions() -> bool:
    """Give aiokafka a copy of the active set, and no fetch at all when it is empty.

    Upstream issue: none known for this race. faust-streaming's tracker has
    the same symptom from other causes: #597 (open; recovery never ends when
    a changelog partition is empty) and #651 (open; with
    auto.offset.reset=latest, retention deletes changelog segments during
    recovery). Its PR #256 re-seeks to the committed offsets when a fetch
    returns while the flow is stopped, which cannot help a changelog
    partition: its offsets are never committed.

    ``True`` when the patch is (now or already) in place.
    """
    original = ThreadDelegateConsumer._getmany
    if getattr(original, _MARK, False):
        return True

    async def _getmany(self: Any, active_partitions: Any, timeout: float) -> Any:  # noqa: ASYNC109
        if active_partitions is not None:
            active_partitions = set(active_partitions)
            if not active_partitions:
                await asyncio.sleep(timeout)
                return {}
        return await original(self, active_partitions, timeout)

    setattr(_getmany, _MARK, True)
    ThreadDelegateConsumer._getmany = _getmany  # type: ignore[method-assign]
    installed = version("faust-streaming")
    if installed != TESTED_WITH:
        log.warning(
            "faust-streaming %s: the active-partition snapshot patch was written for %s; "
            "check that ThreadDelegateConsumer._getmany still hands aiokafka a live set",
            installed,
            TESTED_WITH,
        )
    return True


# aiokafka skips the next fetch from a broker while any partition it serves
# still holds records the application has not taken, for up to
# ``prefetch_backoff`` (0.1 s). With every topic on one broker, a command or a
# completion then waited ~100 ms behind a partition Faust was slow to drain
# (2 of 15 commands in a traced run of the compaction-latency benchmark).
PREFETCH_BACKOFF_SECONDS = 0.01


def shorter_prefetch_backoff() -> bool:
    """Faust builds aiokafka's consumer without this setting: lower its default.

    Upstream issue: none known. Not a bug in either project: aiokafka added the
    back-off on purpose (aiokafka PR #534, for aiokafka #496) and faust-streaming
    has no setting that passes ``prefetch_backoff`` through.
    """
    from aiokafka.consumer import fetcher

    original = fetcher.Fetcher.__init__
    if getattr(original, _MARK, False):
        return True

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prefetch_backoff", PREFETCH_BACKOFF_SECONDS)
        original(self, *args, **kwargs)

    setattr(__init__, _MARK, True)
    fetcher.Fetcher.__init__ = __init__
    return True


def durable_producer() -> bool:
    """Every producer Faust builds sends with ``DURABLE_SENDS`` (acks=all, idempotence).

    Faust has ``producer_acks`` but no setting for idempotence: it adds
    ``enable_idempotence`` only inside its own transactions (exactly-once,
    which the worker does not use), through ``Producer._settings_extra``. This
    adds the service's producer settings there, for every producer.
    Upstream issue: none known; faust-streaming exposes no such setting.
    """
    from faust.transport.drivers.aiokafka import Producer

    original = Producer._settings_extra
    if getattr(original, _MARK, False):
        return True

    def _settings_extra(self: Any) -> Mapping[str, Any]:
        return {**original(self), **DURABLE_SENDS}

    setattr(_settings_extra, _MARK, True)
    Producer._settings_extra = _settings_extra  # type: ignore[method-assign]
    return True


def apply() -> None:
    snapshot_active_partitions()
    shorter_prefetch_backoff()
    durable_producer()
