"""The read-time fit: never over the limit, the newest turn always there, every
other turn either verbatim or stood for by the provisional clip-archive, tool
exchanges never cut, and bounded work whatever the turns' size."""

from __future__ import annotations

import gc
import time
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.context_fit import (
    MIN_LIMIT,
    AsStored,
    Provisional,
    Sized,
    fit_context,
)
from core.domain.messages import ConversationMessage, ToolCall
from core.domain.tokens import estimate_message_tokens
from tests.unit.domain.conversations import START, conversations

pytestmark = pytest.mark.unit


def sized(history: list[ConversationMessage]) -> list[Sized]:
    return [Sized(m, estimate_message_tokens(m)) for m in history]


def turn(n: int, content: str, role: str = "user") -> ConversationMessage:
    return ConversationMessage(
        id=f"m{n:04d}",
        conversation_id="c",
        role=role,  # type: ignore[arg-type]
        content=content,
        created_at=START + timedelta(seconds=n),
    )


def test_a_history_that_fits_is_handed_out_as_stored() -> None:
    history = sized([turn(n, "short turn") for n in range(5)])
    assert fit_context(history, 1000) == AsStored(tuple(history), sum(s.tokens for s in history))


def test_an_over_limit_history_keeps_the_newest_turns_and_stands_for_the_rest() -> None:
    history = sized(
        [
            turn(n, f"turn {n}: the invoice #{n} failed, Alice agreed to fix it. " * 8)
            for n in range(300)
        ]
    )
    fitted = fit_context(history, 4000)
    assert isinstance(fitted, Provisional)
    assert fitted.tokens <= 4000 < fitted.stored_tokens
    digest = fitted.messages[0].message
    assert digest.role == "system" and digest.content.startswith("[Provisional summary of")
    kept = [s.message.id for s in fitted.messages[1:]]
    assert kept[-1] == "m0299" and kept == sorted(kept)
    assert set(fitted.folded) | set(kept) == {s.message.id for s in history}


def test_a_turn_larger_than_the_limit_is_shortened_head_and_tail() -> None:
    paste = "HEAD " + "x" * 400_000 + " TAIL"
    history = sized([turn(0, "hi"), turn(1, paste)])
    fitted = fit_context(history, 2000)
    assert isinstance(fitted, Provisional) and fitted.shortened
    last = fitted.messages[-1].message.content
    assert last.startswith("HEAD") and last.endswith("TAIL") and fitted.tokens <= 2000


def test_the_fit_reads_a_bounded_amount_however_large_the_turns() -> None:
    small = sized([turn(n, "the payments deploy failed again. " * 30) for n in range(60)])
    huge = sized([turn(n, "the payments deploy failed again. " * 30_000) for n in range(60)])
    cpu = []
    for history in (small, huge):
        # This process's CPU (other processes' load adds nothing), the least of
        # three with the collector off: one sample once caught a collection.
        spent = []
        gc.disable()
        try:
            for _ in range(3):
                started = time.process_time()
                fit_context(history, 4000)
                spent.append(time.process_time() - started)
        finally:
            gc.enable()
        cpu.append(min(spent))
    # Work linear in the text would make the huge one about 1,000 times dearer.
    assert cpu[1] < 5 * cpu[0] + 0.05


@settings(max_examples=100, deadline=None)
@given(conversations(max_units=30), st.integers(1, MIN_LIMIT - 1))
def test_a_tiny_limit_keeps_the_newest_that_fit_and_is_never_exceeded(
    history: list[ConversationMessage], limit: int
) -> None:
    fitted = fit_context(sized(history), limit)
    assert fitted.tokens <= limit
    if isinstance(fitted, Provisional):
        shown = tuple(s.message.id for s in fitted.messages)
        assert fitted.folded + shown == tuple(m.id for m in history)


def test_pinned_messages_stay_verbatim_with_their_tool_exchange() -> None:
    chatter = "turn {n}: the invoice failed again, Alice agreed to look at it. " * 8
    history = [turn(n, chatter.format(n=n)) for n in range(300)]
    history[3] = turn(3, "The customer's account number is 7741-22.").model_copy(
        update={"pinned": True}
    )
    call = ToolCall(id="call-9", name="lookup", arguments={"order": "8812"})
    history[9] = turn(9, "looking it up", "assistant").model_copy(
        update={"tool_calls": (call,), "pinned": True}
    )
    history[10] = turn(10, "order 8812: refunded", "tool").model_copy(
        update={"tool_call_id": "call-9"}
    )
    fitted = fit_context(sized(history), 4000)
    assert isinstance(fitted, Provisional) and fitted.tokens <= 4000
    shown = [s.message for s in fitted.messages]
    assert [m.id for m in shown[1:4]] == ["m0003", "m0009", "m0010"]  # after the digest
    assert shown[1] == history[3] and shown[3] == history[10]
    assert not {"m0003", "m0009", "m0010"} & set(fitted.folded)
    assert "m0002" in fitted.folded and shown[-1].id == "m0299"


def test_pins_over_half_the_limit_keep_the_newest_and_fold_the_rest() -> None:
    pin = "pinned rule {n}: never refund without a ticket number. " * 30  # ~400 tokens
    history = [turn(n, pin.format(n=n)).model_copy(update={"pinned": True}) for n in range(10)]
    history += [turn(n, "a short turn about the refund policy today") for n in range(10, 200)]
    fitted = fit_context(sized(history), 2000)
    assert isinstance(fitted, Provisional) and fitted.tokens <= 2000
    pinned_shown = [s.message.id for s in fitted.messages if s.message.pinned]
    assert pinned_shown and sum(s.tokens for s in fitted.messages if s.message.pinned) <= 1000
    assert pinned_shown == [f"m{n:04d}" for n in range(10 - len(pinned_shown), 10)]
    assert "m0000" in fitted.folded


@settings(max_examples=200, deadline=None)
@given(conversations(max_units=40, pins=True), st.integers(MIN_LIMIT, 3000))
def test_never_over_the_limit_and_nothing_silently_dropped(
    history: list[ConversationMessage], limit: int
) -> None:
    stored = sized(history)
    fitted = fit_context(stored, limit)
    assert fitted.tokens <= limit
    assert fitted.tokens == sum(s.tokens for s in fitted.messages)
    if isinstance(fitted, AsStored):
        return
    shown = [s.message.id for s in fitted.messages]
    if history:
        assert history[-1].id in shown
    body = [m.id for m in history if not m.stored_clip_archive]
    kept = [i for i in shown if i in body]
    assert kept == sorted(kept) and not set(kept) & set(fitted.folded)
    assert sorted(fitted.folded + tuple(kept)) == body
    pinned = {m.id: s for m, s in zip(history, stored, strict=True) if m.pinned}
    prior = fitted.messages[0].tokens if history[0].stored_clip_archive else 0
    paired = sum(s.tokens for s in stored if s.message.role == "tool")  # their results, at most
    if sum(s.tokens for s in pinned.values()) + paired <= (limit - prior) // 2:
        assert set(pinned) <= set(kept), "a pinned message folded though the pins fit"
    calls = {c.id: m.id for m in history for c in m.tool_calls or ()}
    for message in history:
        if message.id in kept and message.tool_call_id in calls:
            assert calls[message.tool_call_id] in kept, "a kept result lost its call"
