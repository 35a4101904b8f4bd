"""The table flush sets Faust's current event itself (a private name of faust-streaming)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from faust import streams as faust_streams

from streams.kafka.table_context import TableContexts, acting_as

pytestmark = pytest.mark.unit


class Event:  # weak-referenceable, as Faust's events are
    def __init__(self, partition: int) -> None:
        self.message = SimpleNamespace(partition=partition)


def event(partition: int) -> Event:
    return Event(partition)


def test_acting_as_makes_faust_see_the_event_and_restores_it() -> None:
    seen = event(3)
    assert faust_streams.current_event() is None
    with acting_as(seen):
        assert faust_streams.current_event() is seen
    assert faust_streams.current_event() is None


def test_contexts_use_the_newest_event_of_the_partition() -> None:
    contexts = TableContexts()
    older, newer, other = event(1), event(1), event(2)
    for e in (older, other, newer):
        contexts.seen(e)
    with contexts(1):
        assert faust_streams.current_event() is newer
    contexts.forget({1})
    with pytest.raises(LookupError):
        contexts(1)
    with pytest.raises(LookupError):
        contexts(None)
