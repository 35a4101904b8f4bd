"""When an erase covers a message: the rule every store applies inside its ingest.

An erase of a conversation leaves a mark: for each partition of the messages
topic, the highest offset it covers (the end of the partition when the erase
was requested, or what the worker had consumed when it applied it, whichever
is later), and a cutoff time (the request's). A message is covered, and not
stored, when it was read at or below its partition's mark (a redelivery, a
consumer group starting from the earliest offset, a message that lagged
behind the erase on another topic) or when it was created at or before the
cutoff (a ``compactor replay`` of the erased conversation's transcript
re-publishes old messages at new offsets). Anything else is a message
published after the erase: it starts a new conversation under the same id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class EraseMark:
    cutoff: datetime
    offsets: Mapping[int, int] = field(default_factory=dict)  # partition → highest erased
    epoch: int = 1  # erases of the conversation id so far

    def covers(self, partition: int | None, offset: int | None, created_at: datetime) -> bool:
        if partition is not None and offset is not None:
            return offset <= self.offsets.get(partition, -1) or created_at <= self.cutoff
        return created_at <= self.cutoff


def merged_offsets(*marks: Mapping[int, int]) -> dict[int, int]:
    """The highest offset per partition of several marks (a later erase never
    lowers an earlier one's)."""
    merged: dict[int, int] = {}
    for mark in marks:
        for partition, offset in mark.items():
            merged[int(partition)] = max(merged.get(int(partition), -1), int(offset))
    return merged
