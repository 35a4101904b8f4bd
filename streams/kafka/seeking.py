"""Seeking partitions so that Faust delivers their records again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from faust.types import TP


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
