"""The turn-time context over the in-memory store: within the limit whatever is
stored, read-your-writes by message id or record position (woken by ingest,
never an older context), answered from memory while the history is unchanged."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from core.domain.budget import BudgetConfig
from core.ports.storage import ContextLook, ContextSnapshot, IncomingMessage, ReadScope
from streams.metrics import Metrics
from streams.worker import turn_context
from streams.worker.ingest_notices import IngestNotices
from streams.worker.runtime import StaticRuntime
from streams.worker.turn_context import ContextRequest, NotYet, Served, TurnContexts, Unknown
from tests.contract.test_privacy import erasure
from tests.support.memory_store import InMemoryStore
from tests.support.metrics_text import sample
from tests.support.plans import msg

pytestmark = pytest.mark.unit

KEY = "acme/support-1"
BUDGET = BudgetConfig(context_budget=0.5, model_max_tokens=2000)  # 1,000 tokens
SCOPE = ReadScope.of_tenant("acme")
TURN = "the refund for order 8812 failed twice because the card expired. " * 4  # ~66 tokens


class WatchedNotices(IngestNotices):
    """Says when a reader starts waiting, so a test stores the message after that."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting_started = asyncio.Event()
        self.waits: list[float] = []  # each wait's ``within``

    async def wait(self, conversation_key: str, within: float, **seen: Any) -> bool:
        self.waits.append(within)
        self.waiting_started.set()
        return await super().wait(conversation_key, within, **seen)


class Setup:
    def __init__(self, *, poll_seconds: float = 0.025, noticed_poll_seconds: float = 0.25) -> None:
        self.store = InMemoryStore()
        self.notices = WatchedNotices()
        self.metrics = Metrics()
        self.contexts = TurnContexts(
            StaticRuntime(self.store, compactor=None),  # type: ignore[arg-type]
            BUDGET,
            self.notices,
            self.metrics,
            pending=lambda key: "cmp-7" if key == KEY else None,
            poll_seconds=poll_seconds,
            noticed_poll_seconds=noticed_poll_seconds,
        )
        self.offset = 0

    async def publish(self, count: int, content: str = TURN) -> list[str]:
        """``count`` messages stored as ingest stores them, then noticed."""
        group = []
        for _ in range(count):
            message = msg(self.offset, content, conversation_id=KEY)
            group.append(IncomingMessage(message, len(content) // 4, 3, 1000 + self.offset))
            self.offset += 1
        await self.store.ingest.save_messages(group)
        self.notices.stored({KEY})
        return [item.message.id for item in group]

    async def read(self, **asked: Any) -> Any:
        answer = await self.contexts.answer(ContextRequest(KEY, SCOPE, **asked))
        return answer


def body(answer: Any) -> dict[str, Any]:
    assert isinstance(answer, Served), answer
    parsed: dict[str, Any] = json.loads(answer.body)
    return parsed


async def test_a_history_under_the_budget_is_served_as_stored() -> None:
    setup = Setup()
    ids = await setup.publish(5)
    found = body(await setup.read(shape="openai"))
    assert found["provisional"] is False and found["folded_messages"] == 0
    assert [m["content"] for m in found["request"]["messages"]] == [TURN] * 5
    assert found["token_estimate"] == found["stored_tokens"] == 5 * (len(TURN) // 4)
    assert found["budget"] == 1000 and found["model_max_tokens"] == 2000
    assert found["pending_compaction"] == "cmp-7"
    assert found["watermark"] == {"message_id": ids[-1], "partition": 3, "offset": 1004, "seq": 5}
    assert found["conversation_id"] == "support-1" and found["tenant_id"] == "acme"


@pytest.mark.parametrize("shape", ["messages", "openai", "anthropic"])
async def test_over_the_budget_the_context_is_fitted_and_says_so(shape: str) -> None:
    setup = Setup()
    ids = await setup.publish(60)  # ~4,000 tokens stored against 1,000
    found = body(await setup.read(shape=shape))
    assert found["provisional"] is True and found["stored_tokens"] > 3 * found["budget"]
    assert found["token_estimate"] <= found["budget"] and found["folded_messages"] > 40
    text = json.dumps(found["request"])
    assert ("[Provisional summary of" in text and ids[-1] in text) or TURN[:20] in text
    window = body(await setup.read(shape=shape, fit="window"))
    assert window["limit"] == 2000 and window["token_estimate"] <= 2000
    stored = body(await setup.read(shape=shape, fit="none"))
    assert stored["provisional"] is False and stored["token_estimate"] == stored["stored_tokens"]
    assert sample(setup.metrics, "compactor_context_provisional_total") == 2


async def test_a_fit_runs_on_the_loop_only_while_its_text_is_small(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A few milliseconds inline; above ``INLINE_FIT_CHARS`` in a thread, so no
    history can hold the event loop for long."""
    threaded: list[object] = []
    real = asyncio.to_thread

    async def counted(func: Any, /, *args: Any) -> Any:
        threaded.append(func)
        return await real(func, *args)

    monkeypatch.setattr(turn_context.asyncio, "to_thread", counted)
    setup = Setup()
    await setup.publish(60)  # ~4,000 tokens, ~16,000 characters
    assert body(await setup.read())["provisional"] is True and threaded == []
    monkeypatch.setattr(turn_context, "INLINE_FIT_CHARS", 10_000)
    await setup.publish(1)
    assert body(await setup.read())["provisional"] is True and len(threaded) == 1


async def test_an_unchanged_history_is_answered_from_memory() -> None:
    setup = Setup()
    await setup.publish(3)
    first = await setup.read()
    again = await setup.read()
    assert isinstance(first, Served) and isinstance(again, Served) and first.etag == again.etag
    reads = "compactor_context_reads_total"
    assert sample(setup.metrics, reads, format="messages", outcome="read") == 1
    assert sample(setup.metrics, reads, format="messages", outcome="cached") == 1
    await setup.publish(1)
    changed = await setup.read()
    assert isinstance(changed, Served) and changed.etag != first.etag
    assert len(body(changed)["request"]["messages"]) == 4


class CountedLooks:
    """The store's reader, each look recorded as what came back: "version" or "history"."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self.looks: list[str] = []

    async def context_look(self, *args: Any, **kwargs: Any) -> ContextLook:
        look = await self._reader.context_look(*args, **kwargs)
        self.looks.append("history" if isinstance(look, ContextSnapshot) else "version")
        return look


async def test_a_read_is_one_look_and_the_history_comes_only_when_it_moved() -> None:
    setup = Setup()
    counted = setup.store.context = CountedLooks(setup.store.context)
    await setup.publish(3)
    await setup.read()
    await setup.read()
    assert counted.looks == ["history", "version"]  # the second answered from memory
    counted.looks.clear()
    through = msg(3, conversation_id=KEY).id
    waiting = asyncio.create_task(setup.read(through=through, wait_seconds=30))
    await setup.notices.waiting_started.wait()
    await setup.publish(1)
    assert len(body(await asyncio.wait_for(waiting, 5))["request"]["messages"]) == 4
    assert counted.looks == ["version", "history"]  # not in yet: no history read for it


async def test_an_erased_conversations_rendered_context_is_dropped_at_its_next_read() -> None:
    setup = Setup()
    await setup.publish(3)
    for shape in ("messages", "openai"):
        assert isinstance(await setup.read(shape=shape), Served)
    assert len(setup.contexts._cache) == 2
    await setup.store.privacy.erase_conversation(KEY, erasure(p3=1002))
    assert isinstance(await setup.read(), Unknown)
    assert len(setup.contexts._cache) == 0, "the erased text stayed in the worker's memory"


async def test_through_waits_for_the_message_and_is_woken_by_its_ingest() -> None:
    setup = Setup(poll_seconds=60.0)  # no poll in time: only the notice can wake it
    await setup.publish(2)
    waiting = asyncio.create_task(
        setup.read(through=msg(2, conversation_id=KEY).id, wait_seconds=30)
    )
    await setup.notices.waiting_started.wait()
    assert not waiting.done()
    await setup.publish(1)
    found = body(await asyncio.wait_for(waiting, 5))
    assert [m["id"] for m in found["request"]["messages"]][-1] == msg(2, conversation_id=KEY).id


async def test_a_reader_polls_the_store_rarely_when_this_worker_ingests_the_conversation() -> None:
    """Stored here lately: the notice wakes the reader, the poll is only a safety
    net; stored by no one here: the reader polls, as another worker's notice
    never comes."""
    setup = Setup(poll_seconds=0.025, noticed_poll_seconds=30.0)
    other = "acme/elsewhere"  # never stored by this worker
    late = asyncio.create_task(
        setup.contexts.answer(ContextRequest(other, SCOPE, through="x", wait_seconds=0.2))
    )
    assert isinstance(await asyncio.wait_for(late, 5), NotYet)
    assert setup.notices.waits and max(setup.notices.waits) <= 0.025
    await setup.publish(2)
    setup.notices.waits.clear()
    setup.notices.waiting_started.clear()
    through = msg(2, conversation_id=KEY).id
    waiting = asyncio.create_task(setup.read(through=through, wait_seconds=20))
    await setup.notices.waiting_started.wait()
    await setup.publish(1)
    assert isinstance(await asyncio.wait_for(waiting, 5), Served)
    assert setup.notices.waits[0] > 19  # the notice's wait, not a 25 ms poll


async def test_after_waits_for_the_record_position() -> None:
    setup = Setup()
    await setup.publish(2)  # offsets 1000, 1001
    assert isinstance(await setup.read(after=(3, 1001)), Served)
    waiting = asyncio.create_task(setup.read(after=(3, 1002), wait_seconds=30))
    await setup.notices.waiting_started.wait()
    await setup.publish(1)
    assert body(await asyncio.wait_for(waiting, 5))["watermark"]["offset"] == 1002
    assert isinstance(await setup.read(after=(4, 1), wait_seconds=0.01), NotYet)


async def test_a_message_not_stored_within_the_wait_is_not_yet_never_an_older_context() -> None:
    setup = Setup()
    await setup.publish(2)
    answer = await setup.read(through="never-published", wait_seconds=0.05)
    assert isinstance(answer, NotYet) and answer.version.watermark.offset == 1001
    reads = "compactor_context_reads_total"
    assert sample(setup.metrics, reads, format="messages", outcome="not_yet") == 1


async def test_unknown_and_other_tenants_conversations_are_unknown() -> None:
    setup = Setup()
    await setup.publish(2)
    assert isinstance(await setup.contexts.answer(ContextRequest("acme/nope", SCOPE)), Unknown)
    other = ContextRequest(KEY, ReadScope.of_tenant("globex"))
    assert isinstance(await setup.contexts.answer(other), Unknown)
