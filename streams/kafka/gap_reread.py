"""Read a gap again before committing over it.

Faust's fetch loop calls a *gap* the offsets between the last record it handed
to the streams (its read offset) and the next one it is handed: offsets it
never delivered. It commits over a gap as if every offset in it were acked,
because some offsets are no record at all (a transaction's markers, records
compacted away). But records that were fetched and then dropped upstream of the
fetch loop look the same, and committing over them loses them for good: the
upgrade chaos test lost ``messages:0@95`` that way (the worker logged offsets
94..95 as a gap 0.3 s after a rebalance, the group committed past them, and
nothing had stored offset 95), and its next run logged nine gaps of 3 to 15
offsets. Which step drops them is not found (issue 29).

So a gap of more than one offset is not taken at its word. The record past
it is not delivered (nor the rest of its batch on that partition: records are
processed in offset order, or a conversation would be compacted before its
first turns are stored), the partition's commits are held, and before the
fetch loop asks for its next batch (nothing of the current one is still being
handed over, so no record read before the seek can move the read offset past
the gap again) the partition is sought back to the gap's first offset. The
records that exist in it are delivered and acked like any other; a gap seen
again within the range on that second read is real, and Faust commits over it
as before. A single offset (one transaction's
commit marker per transaction of a transactional producer) keeps Faust's
behaviour: a second read of every transaction would cost more than it saves.
A pending re-read ends when the fetch loop delivers a record at or past the
gap's end again, when a rebalance seeks every partition anyway, or after
``GIVE_UP_SECONDS`` (then Faust's behaviour, logged).

Upstream issue: none known.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from streams.kafka.seeking import seek_to_reread

log = logging.getLogger("compactor.worker")

_MARK = "_compactor_gap_patch"
#: A re-read not over after this long lets Faust commit over the gap.
GIVE_UP_SECONDS = 30.0


@dataclass
class Reread:
    """A gap of one partition read again: offsets ``start`` to ``end``, excluded."""

    start: int
    end: int
    since: float
    sought: bool = False


def _rereads(consumer: Any) -> dict[Any, Reread]:
    found: dict[Any, Reread] | None = getattr(consumer, "_compactor_rereads", None)
    if found is None:
        found = {}
        consumer._compactor_rereads = found
    return found


def _pending(consumer: Any, tp: Any) -> Reread | None:
    """The partition's re-read, unless it is over: the fetch loop has delivered a
    record at or past the gap's end since the seek (Faust's read offset, which
    the seek set back to the gap's start), or it has taken too long (logged)."""
    rereads = _rereads(consumer)
    reread = rereads.get(tp)
    if reread is None:
        return None
    read = consumer._read_offset.get(tp)
    if reread.sought and read is not None and read >= reread.end:
        del rereads[tp]
        return None
    if time.monotonic() - reread.since > GIVE_UP_SECONDS:
        del rereads[tp]
        log.warning(
            "offsets %d..%d of %s:%d were not delivered again within %.0f s: "
            "Faust commits over them as a gap",
            reread.start, reread.end - 1, tp.topic, tp.partition, GIVE_UP_SECONDS,
        )  # fmt: skip
        return None
    return reread


def _on_gap(consumer: Any, tp: Any, offset_from: int, offset_to: int) -> bool:
    """Should Faust record this gap now? No while the range is to be read again."""
    reread = _pending(consumer, tp)
    if reread is not None and reread.sought and reread.start <= offset_from < reread.end:
        log.info(
            "offsets %d..%d of %s:%d are no records (not delivered on a second read either)",
            offset_from, offset_to - 1, tp.topic, tp.partition,
        )  # fmt: skip
        return True
    if offset_to - offset_from <= 1:
        return True  # one offset: a transaction's commit marker, Faust's way
    if reread is None:
        _rereads(consumer)[tp] = Reread(offset_from, offset_to, time.monotonic())
    else:
        reread.start, reread.end = min(reread.start, offset_from), max(reread.end, offset_to)
        reread.sought = False
    log.warning(
        "offsets %d..%d of %s:%d were never delivered: reading them again before "
        "committing over them",
        offset_from, offset_to - 1, tp.topic, tp.partition,
    )  # fmt: skip
    return False


def delivered_unacked_below(consumer: Any, tp: Any, committed: int | None, head: int) -> bool:
    """Is a record of ``tp`` from ``committed`` (if any) up to ``head``, excluded,
    delivered and not acked yet? Records below ``committed`` are left out: Faust
    never acks them (``ack`` ignores offsets under the committed one)."""
    floor = -1 if committed is None else committed
    return any(
        message.tp == tp and floor <= message.offset < head and not message.acked
        for message in list(consumer._unacked_messages)
    )


def expect_heads(consumer: Any, earliest: dict[Any, int]) -> None:
    """Partitions with no committed offset, and their first offsets: the first
    commit of each must start there. The fetch loop sees no gap before the first
    record it delivers, so a head dropped upstream (a chaos test lost offsets 0
    to 7 of a fresh partition so, with no rebalance after them) would be
    committed over without a word; held and read again instead, once."""
    heads: dict[Any, int] = getattr(consumer, "_compactor_heads", {})
    heads.clear()
    heads.update(earliest)
    consumer._compactor_heads = heads
    consumer._compactor_starts = dict(earliest)  # kept for the generation (``first_offset``)


def first_offset(consumer: Any, tp: Any) -> int | None:
    """Where ``tp``'s records start in this generation, as far as is known: its
    committed offset, or the first offset of a never-committed partition."""
    committed: int | None = consumer._committed_offset.get(tp)
    if committed is not None:
        return committed
    starts: dict[Any, int] = getattr(consumer, "_compactor_starts", {})
    return starts.get(tp)


def reread(consumer: Any, tp: Any, start: int, end: int) -> None:
    """Read ``start`` to ``end`` (excluded) of ``tp`` again, found missing past
    the fetch loop: it delivers nothing more of ``tp`` until it has sought back
    there (before its next batch), and no commit passes ``start`` meanwhile."""
    found = _pending(consumer, tp)
    if found is None:
        _rereads(consumer)[tp] = Reread(start, end, time.monotonic())
    else:
        found.start, found.end = min(found.start, start), max(found.end, end)
        found.sought = False


def reread_pending(consumer: Any, tp: Any) -> bool:
    """Is a re-read of ``tp`` still to be sought, or not yet past its end?"""
    return _pending(consumer, tp) is not None


def _head_missing(consumer: Any, tp: Any) -> bool:
    """Is the first acked record of a never-committed partition past its first
    offset? Then (once per assignment) its head is read again first."""
    heads: dict[Any, int] = getattr(consumer, "_compactor_heads", {})
    head = heads.get(tp)
    if head is None:
        return False
    acked = consumer._acked.get(tp)
    if consumer._committed_offset.get(tp) is not None or not acked:
        return False
    first = min(acked)
    if first > head and delivered_unacked_below(consumer, tp, None, first):
        return False  # still being processed, not missing (the other guard holds it)
    del heads[tp]  # one re-read at most: a head of markers is committed over after it
    if first <= head:
        return False
    _rereads(consumer)[tp] = Reread(head, first, time.monotonic())
    log.warning(
        "offsets %d..%d at the head of %s:%d were never delivered: reading them again "
        "before committing over them",
        head, first - 1, tp.topic, tp.partition,
    )  # fmt: skip
    return True


def _held_back(consumer: Any, tp: Any, offset: int) -> bool:
    """Should the fetch loop not be handed this record yet? Yes when records
    below it were never delivered: it would be processed before them (a
    compaction planned over a conversation whose first turns are not stored yet
    archived a tool result without its call, issue 29). It is fetched again after
    the seek back; a gap already read once is let through (Faust records it)."""
    reread = _pending(consumer, tp)
    if reread is not None and not reread.sought:
        return True  # the seek back is pending: the rest of this batch comes again
    read = consumer._read_offset.get(tp)
    if read is None:
        heads: dict[Any, int] = getattr(consumer, "_compactor_heads", {})
        head = heads.get(tp)
        if head is None or offset <= head or reread is not None:
            return False
        del heads[tp]  # once: a head of markers is let through on the second read
        start = head
    else:
        if offset - read - 1 <= 1:
            return False  # nothing, or one offset (a marker): as Faust does
        start = read + 1
        if reread is not None and reread.start <= start < reread.end:
            return False  # the second read: no records there (``_on_gap`` records it)
    _rereads(consumer)[tp] = Reread(start, offset, time.monotonic())
    log.warning(
        "offsets %d..%d of %s:%d were never delivered: reading them again before "
        "delivering offset %d",
        start, offset - 1, tp.topic, tp.partition, offset,
    )  # fmt: skip
    return True


async def in_offset_order(consumer: Any, fetched: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """``fetched`` (Faust's ``(tp, message)`` pairs) without the records held back.
    Only topics with acks, as Faust's own gaps: a compacted changelog's gaps are
    records compacted away, and reading each one again would stall recovery."""
    acks_enabled_for = consumer.app.topics.acks_enabled_for
    async for tp, message in fetched:
        if acks_enabled_for(tp.topic) and _held_back(consumer, tp, message.offset):
            continue
        yield tp, message


async def _seek_back(consumer: Any) -> None:
    """Seek each partition with a re-read not started yet back to its start
    (between fetch batches: nothing of the last one is still being handed over)."""
    for tp, reread in list(_rereads(consumer).items()):
        if reread.sought:
            continue
        try:
            await seek_to_reread(consumer, {tp: reread.start})
        except Exception as error:  # the fetch loop must not die of it: next batch
            log.warning("could not seek %s:%d back: %s", tp.topic, tp.partition, error)
        else:
            reread.sought = True


def reread_gaps() -> bool:
    """Patch Faust's consumer so that a gap of records is read again (module doc).

    ``True`` when the patch is (now or already) in place.
    """
    from faust.transport.consumer import Consumer

    if getattr(Consumer._add_gap, _MARK, False):
        return True
    add_gap, new_offset = Consumer._add_gap, Consumer._new_offset
    getmany, perform_seek = Consumer.getmany, Consumer.perform_seek

    async def _add_gap(self: Any, tp: Any, offset_from: int, offset_to: int) -> None:
        if not _on_gap(self, tp, offset_from, offset_to):
            return
        await add_gap(self, tp, offset_from, offset_to)

    def _new_offset(self: Any, tp: Any) -> int | None:
        if _head_missing(self, tp) or _pending(self, tp) is not None:
            return None  # the gap is being read again: no commit over it
        result: int | None = new_offset(self, tp)
        return result

    async def _getmany(self: Any, timeout: float) -> AsyncIterator[Any]:  # noqa: ASYNC109
        await _seek_back(self)
        async for item in in_offset_order(self, getmany(self, timeout)):
            yield item

    async def _perform_seek(self: Any) -> None:
        _rereads(self).clear()  # every partition goes back to its committed offset
        await perform_seek(self)

    for name, patched in (
        ("_add_gap", _add_gap),
        ("_new_offset", _new_offset),
        ("getmany", _getmany),
        ("perform_seek", _perform_seek),
    ):
        setattr(patched, _MARK, True)
        setattr(patched, "__wrapped__", getattr(Consumer, name))  # noqa: B010
        setattr(Consumer, name, patched)
    return True
