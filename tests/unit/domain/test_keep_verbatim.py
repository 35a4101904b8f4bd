"""Pinned messages and a tenant's must-survive rules are kept verbatim, in order,
tool pairs whole (core/domain/keep_rules.py, core/domain/split.py)."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from core.domain.keep_rules import MAX_PATTERN_CHARS, KeepVerbatim, keep_test, pinned_tokens
from core.domain.messages import ToolCall
from core.domain.split import split_history
from tests.support.plans import msg

pytestmark = pytest.mark.unit


def history(n: int = 10) -> list:
    return [msg(i, f"turn {i} with some words") for i in range(n)]


def test_a_pinned_message_is_kept_in_place_and_counted_as_kept() -> None:
    turns = history()
    turns[2] = turns[2].model_copy(update={"pinned": True})
    turns[5] = turns[5].model_copy(update={"pinned": True})
    split = split_history(turns, keep_recent=3)
    assert [m.id for m in split.to_keep] == [turns[i].id for i in (2, 5, 7, 8, 9)]
    assert {m.id for m in split.to_compress} == {turns[i].id for i in (0, 1, 3, 4, 6)}
    assert pinned_tokens({m.id: 7 for m in turns}, turns) == 14


def test_a_pinned_tool_result_keeps_its_call() -> None:
    turns = history()
    turns[3] = msg(3, "", role="assistant", tool_calls=[ToolCall(id="t", name="lookup")])
    turns[4] = msg(4, "the answer", role="tool", tool_call_id="t", seconds=4)
    turns[4] = turns[4].model_copy(update={"pinned": True})
    split = split_history(turns, keep_recent=2)
    assert [m.id for m in split.to_keep][:2] == [turns[3].id, turns[4].id]


def test_tenant_rules_keep_by_role_tool_and_pattern() -> None:
    turns = history()
    turns[1] = msg(1, "system rule", role="system")
    turns[2] = msg(2, "", role="assistant", tool_calls=[ToolCall(id="c", name="contract")])
    turns[3] = msg(3, "signed", role="tool", tool_call_id="c")
    turns[4] = msg(4, "my ticket is TICKET-123 keep it")
    rules = KeepVerbatim(roles=("system",), tools=("contract",), patterns=(r"TICKET-\d+",))
    split = split_history(turns, keep_recent=2, keep=keep_test(turns, rules))
    assert [m.id for m in split.to_keep] == [turns[i].id for i in (1, 2, 3, 4, 8, 9)]


def test_patterns_are_bounded_and_must_compile() -> None:
    with pytest.raises(ValidationError):
        KeepVerbatim(patterns=("x" * (MAX_PATTERN_CHARS + 1),))
    with pytest.raises(ValidationError):
        KeepVerbatim(patterns=("(unclosed",))
    with pytest.raises(ValidationError):
        KeepVerbatim(patterns=tuple(f"p{i}" for i in range(21)))
    for unbounded in (r"(a|aa)+b", r"(\w+\s?)*$", r"a*a*b", r"(x)\1"):
        with pytest.raises(ValidationError, match="backtrack"):
            KeepVerbatim(patterns=(unbounded,))
    KeepVerbatim(patterns=(r"TICKET-\d+", r"\b[A-Z]{2,5}-\d+\b", r"(?i)do not (forget|drop)"))


def test_the_worst_accepted_pattern_on_a_long_turn_is_fast() -> None:
    """One unbounded repeat, a 1 MB turn: only the window is read."""
    turns = [msg(0, "a" * 1_000_000 + "!")]
    rules = KeepVerbatim(patterns=(r"a{0,15}a*b",))
    test = keep_test(turns, rules)
    started = time.perf_counter()
    assert not test(turns[0])
    assert time.perf_counter() - started < 1.0
