"""The compactor and the worker's one provider guard.

Why: the guard only protects the provider if every compaction's calls go
through the same one, and the per-conversation breaker must keep telling a
conversation's own failures from an outage that hits everyone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from core.domain.compaction import CompactionConfig, Failed
from core.domain.messages import ConversationMessage
from core.ports.model import (
    ModelError,
    ModelRequest,
    ModelResponse,
    ModelResponseError,
    ModelServerError,
    ModelUnreadableError,
)
from tests.support.builders import history
from tests.support.compaction import PlanAndApply, applying_compactor
from tests.support.llm_server import model_turn_words
from tests.support.memory_store import InMemoryStore
from tests.support.stores import saved

pytestmark = pytest.mark.unit


class GatedModel:
    """Answers once ``gate`` opens, counting how many calls run at once;
    ``fails`` decides per request whether to answer with a 5xx instead."""

    name = "gated"

    def __init__(self, fails: Callable[[ModelRequest], bool] = lambda request: False) -> None:
        self.gate = asyncio.Event()
        self.fails = fails
        self.running = 0
        self.peak = 0
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await self.gate.wait()
        finally:
            self.running -= 1
        if self.fails(request):
            raise ModelServerError("HTTP 500: boom", status=500)
        return ModelResponse(text=f"a summary of {model_turn_words(request)}")


class FirstFailsThenAfterOthers(GatedModel):
    """The failing conversation fails first; the others are answered only after
    that, and its later failures only after one of theirs: "others got answers
    while it kept failing", whatever order the planning threads finish in."""

    def __init__(self, fails: Callable[[ModelRequest], bool]) -> None:
        super().__init__(fails)
        self.failed_once = asyncio.Event()
        self.answered = asyncio.Event()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if not self.fails(request):
            await self.failed_once.wait()
            response = await super().complete(request)
            self.answered.set()
            return response
        if self.failed_once.is_set():
            await self.answered.wait()
        try:
            return await super().complete(request)
        finally:
            self.failed_once.set()


def make(store: InMemoryStore, model: GatedModel, **config: object) -> PlanAndApply:
    settings: dict[str, object] = {
        "chunk_size": 2, "min_chunk_tokens": 0, "keep_recent": 2, "max_retries": 0,
    }  # fmt: skip
    settings.update(config)

    async def no_wait(seconds: float) -> None:
        await asyncio.sleep(0)

    return applying_compactor(
        store=store,
        model=model,
        config=CompactionConfig.model_validate(settings),
        model_name="m",
        sleep=no_wait,
    )


async def seeded(
    store: InMemoryStore, conversations: int, messages: int
) -> dict[str, list[ConversationMessage]]:
    out = {}
    for c in range(conversations):
        conv = f"c{c}"
        msgs = history(messages, conversation_id=conv)
        msgs = [
            m.model_copy(update={"id": f"{conv}-{m.id}", "content": f"{conv}: {m.content}"})
            for m in msgs
        ]
        for m in msgs:
            await saved(store, m, 10)
        out[conv] = msgs
    return out


async def test_the_cap_holds_across_every_compaction_of_the_worker() -> None:
    store = InMemoryStore()
    model = GatedModel()
    compactor = make(store, model, max_concurrent_llm_calls=3)
    convs = await seeded(store, conversations=20, messages=8)
    tasks = [asyncio.create_task(compactor.compress(msgs, c)) for c, msgs in convs.items()]
    guard = compactor.provider_guard
    # Planning runs in the runtime's threads: wait until every compaction has reached
    # the guard (its queue has no event to await: the condition is polled, bounded).
    async with asyncio.timeout(10):
        while model.running + guard.waiting < 20:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
    assert (model.running, guard.in_flight, guard.waiting) == (3, 3, 17)
    model.gate.set()
    results = await asyncio.gather(*tasks)
    assert not any(r.failed for r in results)
    assert model.peak == 3
    assert model.calls == 20 * 3  # 6 messages to compress per conversation, chunks of 2


async def test_an_outage_trips_the_guard_once_and_spares_the_conversations() -> None:
    store = InMemoryStore()
    model = GatedModel(fails=lambda request: True)
    model.gate.set()
    compactor = make(store, model, provider_failure_threshold=3, max_consecutive_failures=1)
    convs = await seeded(store, conversations=10, messages=8)
    results = [await compactor.compress(msgs, c) for c, msgs in convs.items()]
    assert all(r.failed for r in results)
    assert model.calls == 3  # then every compaction was refused without a call
    assert {(r.reason or "").split(":")[0] for r in results[3:]} == {"ProviderUnavailableError"}
    assert all(compactor.breaker.state(c) == "closed" for c in convs)


async def test_a_5xx_only_one_conversation_gets_counts_against_it() -> None:
    """Others got answers while it kept failing: its request is the trouble."""
    store = InMemoryStore()
    convs = await seeded(store, conversations=2, messages=8)
    model = FirstFailsThenAfterOthers(
        fails=lambda request: any("c0: " in m.content for m in request.messages)
    )
    model.gate.set()
    compactor = make(store, model, max_retries=2, max_consecutive_failures=1)
    poisoned = asyncio.create_task(compactor.compress(convs["c0"], "c0"))
    healthy = asyncio.create_task(compactor.compress(convs["c1"], "c1"))
    first, second = await asyncio.gather(poisoned, healthy)
    assert first.failed and not second.failed
    assert compactor.breaker.state("c0") == "open"
    assert compactor.provider_guard.state() == "closed"


class Scripted:
    """Answers every request, except those of the conversations in ``errors``,
    which get their error (matched on the ``"<conversation>: "`` content prefix)."""

    name = "scripted"

    def __init__(self) -> None:
        self.errors: dict[str, ModelError] = {}
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        for conversation, error in self.errors.items():
            if any(m.content.startswith(f"{conversation}: ") for m in request.messages):
                raise error
        return ModelResponse(text=f"a summary of {model_turn_words(request)}")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def clocked(store: InMemoryStore, model: Scripted, clock: Clock, **config: object) -> PlanAndApply:
    settings: dict[str, object] = {"chunk_size": 2, "keep_recent": 2, "max_retries": 0}
    settings.update(config)
    return applying_compactor(
        store=store,
        model=model,
        config=CompactionConfig.model_validate(settings),
        model_name="m",
        sleep=clock.sleep,
        clock=clock,
    )


def server_error() -> ModelError:
    return ModelServerError("HTTP 503: down", status=503)


async def test_a_storm_of_bodies_that_are_no_response_is_the_providers() -> None:
    """Issue 29: a proxy's HTML page or a cut body, for every request, is an
    outage: the guard trips, and no conversation's breaker opens."""
    store = InMemoryStore()
    model = Scripted()
    convs = await seeded(store, conversations=6, messages=8)
    model.errors = {c: ModelUnreadableError("unreadable response body") for c in convs}
    compactor = make_scripted(store, model, provider_failure_threshold=3)
    results = [await compactor.compress(msgs, c) for c, msgs in convs.items()]
    assert all(r.failed for r in results)
    assert model.calls == 3  # then the guard refused every call
    assert compactor.provider_guard.state() == "open"
    assert all(compactor.breaker.state(c) == "closed" for c in convs)


def make_scripted(store: InMemoryStore, model: Scripted, **config: object) -> PlanAndApply:
    return clocked(store, model, Clock(), max_consecutive_failures=1, **config)


async def test_a_circuit_opened_in_an_outage_is_released_when_the_provider_answers() -> None:
    """A failure held against a conversation while the provider fails for
    everyone (here: a reply with no text to the half-open probe) opens its
    circuit only until the provider answers again, not for the 30 s cool-down;
    meanwhile its refusal waits for the provider (``provider_down_at``)."""
    store, model, clock = InMemoryStore(), Scripted(), Clock()
    convs = await seeded(store, conversations=4, messages=8)
    compactor = clocked(
        store, model, clock, provider_failure_threshold=2, provider_cooldown_seconds=5,
        provider_max_cooldown_seconds=60, max_consecutive_failures=1,
        circuit_cooldown_seconds=30,
    )  # fmt: skip
    model.errors = {"c0": server_error(), "c1": server_error(), "c2": server_error()}
    model.errors["c3"] = ModelResponseError("response has no text (finish_reason=stop)")
    for c in ("c0", "c1"):
        assert (await compactor.compress(convs[c], c)).failed
    guard = compactor.provider_guard
    assert guard.state() == "open"
    clock.now += 5  # the probe: c3's reply has no text; the guard is still tripped
    assert (await compactor.compress(convs["c3"], "c3")).failed
    assert compactor.breaker.state("c3") == "open"
    assert (await compactor.compress(convs["c2"], "c2")).failed  # the next probe: down again
    assert guard.state() == "open"

    refused = await compactor.plan(convs["c3"], "c3", compaction_id="x")
    assert isinstance(refused, Failed) and refused.kind == "circuit_open"
    assert refused.provider_down_at == guard.successes == 0  # waits for the provider

    clock.now += 10
    model.errors = {}  # the provider is back
    assert not (await compactor.compress(convs["c0"], "c0")).failed  # the probe answered
    assert clock.now < 30  # c3's own cool-down is far from over: released all the same
    assert not (await compactor.compress(convs["c3"], "c3")).failed
    assert compactor.breaker.state("c3") == "closed"


async def test_a_conversations_own_failure_keeps_its_circuit_open_for_the_cool_down() -> None:
    """The provider answering everyone else says the failure was the request's:
    its circuit stays open for the whole cool-down, and its refusal does not
    wait for the provider."""
    store, model, clock = InMemoryStore(), Scripted(), Clock()
    convs = await seeded(store, conversations=2, messages=8)
    compactor = clocked(
        store, model, clock, max_consecutive_failures=1, circuit_cooldown_seconds=30
    )
    model.errors = {"c1": ModelResponseError("response has no text (finish_reason=stop)")}
    assert (await compactor.compress(convs["c1"], "c1")).failed
    assert not (await compactor.compress(convs["c0"], "c0")).failed
    refused = await compactor.plan(convs["c1"], "c1", compaction_id="y")
    assert isinstance(refused, Failed) and refused.kind == "circuit_open"
    assert refused.provider_down_at is None
    assert compactor.breaker.state("c1") == "open"
