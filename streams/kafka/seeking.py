"""Seeking partitions so that Faust delivers their records again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from faust.types import TP

#: Marks a patched method, so that applying a patch twice is a no-op.
_MARK = "_compactor_seek_patch"


async def seek_to_reread(consumer: Any, offsets: Mapping[TP, int]) -> None:
    """Seek ``offsets`` and make Faust deliver the records from there again.

    ``seek_wait`` moves aiokafka's position but leaves Faust's read offset where
    it was, and Faust's fetch loop drops every record below that offset: the
    records between the target and the old read offset were never delivered
    again. ``Consumer.seek`` resets the read offset the same way (0 as ``None``);
    Faust keeps it privately, there is no public setter.
    """
    await consumer.seek_wait(dict(offsets))
    read_offsets = consumer._read_offset
    for tp, offset in offsets.items():
        read_offsets[tp] = offset or None


async def seek_to_committed_or_start(consumer: Any) -> dict[Any, int | None]:
    """Seek every assigned partition to its committed offset, and a partition
    with none to its first record; return the committed offsets (``None``: none).

    Faust recovers from every record it fetched and then dropped (records
    waiting in a stream's queue when a rebalance clears it, a fetch cut short
    by a new generation or a stopped flow) by seeking to the committed offsets
    (``Consumer.perform_seek``). aiokafka's ``seek_to_committed`` seeks only a
    partition whose committed offset is above 0: one that has never been
    committed kept its position, past the dropped records, and they were never
    read (the head of a fresh partition was lost in about 1 of 4 chaos runs
    where a worker joined as records arrived; issue 29). A committed 0 is
    sought too. Called on aiokafka's thread, as Faust calls the original.
    """
    committed: dict[Any, int | None] = await consumer.seek_to_committed()
    for tp, offset in committed.items():
        if offset == 0:
            consumer.seek(tp, 0)
    never = [tp for tp, offset in committed.items() if offset is None]
    if never:
        await consumer.seek_to_beginning(*never)
    return committed


def seek_uncommitted_partitions_to_start() -> bool:
    """Make Faust's seek to the committed offsets cover never-committed partitions.

    Patches ``faust.transport.drivers.aiokafka.AIOKafkaConsumerThread.seek_to_committed``
    (see ``seek_to_committed_or_start``) when the app's reset policy is
    ``earliest``, the worker's: under ``latest`` Faust's behaviour is kept.
    Upstream issue: none known (faust-streaming's PR #256 added the seek to
    the committed offsets without this case). ``True`` when in place.
    """
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    original = AIOKafkaConsumerThread.seek_to_committed
    if getattr(original, _MARK, False):
        return True

    async def seek_to_committed(self: Any) -> Any:
        if self.app.conf.consumer_auto_offset_reset != "earliest":
            return await original(self)
        return await self.call_thread(seek_to_committed_or_start, self._ensure_consumer())

    setattr(seek_to_committed, _MARK, True)
    seek_to_committed.__wrapped__ = original  # type: ignore[attr-defined]
    AIOKafkaConsumerThread.seek_to_committed = seek_to_committed  # type: ignore[method-assign]
    return True


def seek_before_resuming_streams() -> bool:
    """Resume the stream partitions after table recovery only once they are sought
    and the stream queues cleared.

    Faust ends recovery (``Recovery.on_recovery_completed``, and
    ``_resume_streams`` when there is nothing to restore) by resuming the
    stream partitions, awaiting the seek to their committed offsets, and then
    resuming the app's flow control, which clears every stream queue. The
    fetch loop runs all along: records fetched from the resumed partitions
    before the seek were delivered, and read again after it; records the seek
    brought back in the loop turn before flow control resumed were delivered,
    cleared from the queues unprocessed, and never read again (the fetch loop
    had moved its read offset past them). A traced rebalance chaos run lost
    messages:0@175-177 and messages:1@196-197 so, the last records delivered
    before "Worker ready"; the first deliveries, also cleared, stayed unacked
    and held the partition's commits. Now the stream partitions stay paused
    through the seek and the clear, and are resumed with the consumer's flow:
    each record is fetched once, from the committed offset, into queues that
    are no longer cleared. Upstream issue: none known. ``True`` when in place.
    """
    from faust.tables.recovery import Recovery
    from faust.transport.consumer import Consumer

    if getattr(Consumer.resume_partitions, _MARK, False):
        return True
    resume_partitions, resume_flow = Consumer.resume_partitions, Consumer.resume_flow
    for name in ("on_recovery_completed", "_resume_streams"):
        setattr(Recovery, name, _deferring_resumes(getattr(Recovery, name), resume_partitions))
    for name, patched in _deferring_consumer(resume_partitions, resume_flow).items():
        setattr(patched, _MARK, True)
        setattr(patched, "__wrapped__", getattr(Consumer, name))  # noqa: B010
        setattr(Consumer, name, patched)
    return True


#: While set on the consumer (the end of recovery): the partitions to resume with the flow.
_DEFERRED = "_compactor_deferred_resume"


def _deferring_consumer(resume_partitions: Any, resume_flow: Any) -> dict[str, Any]:
    """``Consumer.resume_partitions`` deferring while ``_DEFERRED`` is set, and
    ``Consumer.resume_flow`` resuming what was deferred."""

    def deferring_resume_partitions(self: Any, tps: Any) -> None:
        deferred: set[Any] | None = getattr(self, _DEFERRED, None)
        if deferred is None:
            resume_partitions(self, tps)
        else:
            deferred.update(tps)

    def resuming_flow(self: Any) -> None:
        resume_flow(self)
        deferred: set[Any] | None = getattr(self, _DEFERRED, None)
        if deferred:
            resume_partitions(self, set(deferred))
            deferred.clear()

    return {"resume_partitions": deferring_resume_partitions, "resume_flow": resuming_flow}


def _deferring_resumes(ending: Any, resume_partitions: Any) -> Any:
    """``ending`` (a ``Recovery`` method) with the consumer's partition resumes
    deferred until it resumes the consumer's flow."""

    async def end_recovery(self: Any, *args: Any, **kwargs: Any) -> Any:
        consumer = self.app.consumer
        setattr(consumer, _DEFERRED, set())
        try:
            return await ending(self, *args, **kwargs)
        finally:
            deferred = getattr(consumer, _DEFERRED)
            setattr(consumer, _DEFERRED, None)
            if deferred:  # ended before resuming the flow (an error): as Faust would
                resume_partitions(consumer, deferred)

    setattr(end_recovery, _MARK, True)
    end_recovery.__wrapped__ = ending  # type: ignore[attr-defined]
    return end_recovery
