"""Take the events already waiting in a Faust stream's queue, without a loop turn each.

Faust's stream iterator awaits ``asyncio.sleep(0)`` before every event, so an
agent that groups what is waiting (``streams.worker.batching.in_groups``)
collected a group one event-loop turn per event, and every turn ran whatever
else was ready: a 500-event group took seconds to collect on a loaded
machine, and the accounting groups stayed small (docs/performance.md section
10). ``ready_events`` takes the rest of the queue at once, doing for each
event what the iterator does for it (faust-streaming 0.15.3, the Cython
``StreamIterator.next``/``_prepare_event``, the one the worker runs, and its
pure-Python twin ``Stream._py_aiter``):

* a raised channel error is left for the iterator to raise;
* an event fetched before the latest rebalance (its ``generation_id`` is not
  the app's), or taken while the flow is stopped (a rebalance is under way), is
  dropped: neither processed nor acked, as the Cython iterator drops it (its
  partition is re-read from the committed offset);
* a message of an acking topic is tracked as unacked once (``tracked``, the
  consumer's unacked set, the ``on_message_in`` sensor), so no commit passes
  its offset before the agent acks it;
* the ``on_stream_event_in`` sensor, the stream's current event and its
  ``events_total``.

It takes nothing from a stream with processors or a combined stream (their
values are not the events), nor once the stream is stopping. The caller acks
the events it took as it acks those the iterator gave it (a ``noack`` stream:
``Stream.ack``). Private names of faust-streaming 0.15.3 (pinned, see
``streams.kafka.faust_patches``); tests/unit/kafka/test_stream_take.py runs it
against Faust's own stream and consumer bookkeeping.
"""

from __future__ import annotations

from typing import Any

from faust.types import EventT


def ready_events(stream: Any, limit: int) -> list[Any]:
    """Up to ``limit`` events waiting in ``stream``'s queue, in order, ready to handle."""
    queue = getattr(stream.channel, "queue", None)
    if queue is None or stream._processors or stream.combined:
        return []
    app = stream.app
    acking_topics = app.topics.acking_topics
    taken: list[Any] = []
    while len(taken) < limit and not queue.empty() and not queue._errors:
        if stream.should_stop:
            break
        event = queue.get_nowait()
        if not isinstance(event, EventT):
            raise TypeError(f"a topic's queue held {type(event).__name__}, not an event")
        message = event.message
        if not app.flow_control.is_active() or message.generation_id != app.consumer_generation_id:
            continue  # fetched before a rebalance: re-read from the committed offset
        tp, offset = message.tp, message.offset
        if message.topic in acking_topics and not message.tracked:
            message.tracked = True
            app.consumer.unacked.add(message)
            stream._on_message_in(tp, offset, message)
        stream._on_stream_event_in(tp, offset, stream, event)
        stream._set_current_event(event)
        stream.events_total += 1
        taken.append(event)
    return taken
