"""Taking a stream's waiting events at once keeps Faust's per-event bookkeeping.

Why: the accounting agent takes the rest of its queue without the loop turn
Faust's iterator spends per event (``streams.kafka.stream_take``). Each taken
event must get what the iterator gives it, or at-least-once breaks: an event
fetched before a rebalance must not be processed (its partition may be
another worker's now), and every taken message must be tracked as unacked, or
Faust could commit its offset before its effect is durable.
Run against Faust's own app, stream, queue and consumer (no broker is reached).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import faust
import pytest
from faust.events import Event
from faust.types.tuples import ConsumerMessage

from streams.kafka.stream_take import ready_events

pytestmark = pytest.mark.unit

TOPIC = "messages"


@pytest.fixture
async def app() -> AsyncIterator[faust.App]:
    app = faust.App("stream-take-test", broker="kafka://localhost:1", value_serializer="raw")
    app.topics._acking_topics.add(TOPIC)  # as subscribing an acking agent's topic does
    app.flow_control.resume()
    yield app


def event_of(app: faust.App, offset: int, generation: int | None = None) -> Any:
    generation = app.consumer_generation_id if generation is None else generation
    message = ConsumerMessage(
        TOPIC, 0, offset, 0.0, 0, None, b"k", b"v", None, generation_id=generation
    )
    message.incref()  # as the conductor does when it hands the message to one stream
    return Event(app, b"k", b"v", {}, message)


def stream_with(app: faust.App, events: list[Any]) -> Any:
    stream = app.topic(TOPIC, value_type=bytes).stream().noack()
    for event in events:
        stream.channel.queue.put_nowait(event)
    return stream


async def test_taken_events_come_in_order_each_tracked_as_unacked(app: faust.App) -> None:
    events = [event_of(app, offset) for offset in range(5)]
    stream = stream_with(app, events)
    taken = ready_events(stream, 3)
    assert taken == events[:3]
    assert stream.channel.queue.qsize() == 2  # the limit holds: the rest stays queued
    assert set(app.consumer.unacked) == {event.message for event in taken}
    assert all(event.message.tracked for event in taken)
    assert stream.events_total == 3 and stream.current_event is events[2]
    assert ready_events(stream, 10) == events[3:]


async def test_an_event_fetched_before_the_rebalance_is_dropped_untracked(app: faust.App) -> None:
    stale = event_of(app, 1, generation=app.consumer_generation_id - 1)
    fresh = [event_of(app, 0), event_of(app, 2)]
    stream = stream_with(app, [fresh[0], stale, fresh[1]])
    assert ready_events(stream, 10) == fresh
    assert stale.message not in app.consumer.unacked and not stale.message.tracked
    assert not stale.message.acked  # neither processed nor acked: re-read from the commit


async def test_nothing_is_taken_while_the_flow_is_stopped(app: faust.App) -> None:
    stream = stream_with(app, [event_of(app, 0), event_of(app, 1)])
    app.flow_control.suspend()  # a rebalance under way
    assert ready_events(stream, 10) == []
    assert not app.consumer.unacked


async def test_a_channel_error_is_left_for_the_stream_to_raise(app: faust.App) -> None:
    stream = stream_with(app, [event_of(app, 0)])
    stream.channel.queue._errors.append(RuntimeError("decode"))
    assert ready_events(stream, 10) == []
    assert stream.channel.queue.qsize() == 1


async def test_the_offset_is_released_only_by_the_agents_ack(app: faust.App) -> None:
    stream = stream_with(app, [event_of(app, 7)])
    (event,) = ready_events(stream, 10)
    assert event.message in app.consumer.unacked  # not committable yet
    await stream.ack(event)
    assert event.message.acked and event.message not in app.consumer.unacked
