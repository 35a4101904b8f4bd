"""What a compaction keeps verbatim: pinned messages, and a tenant's must-survive rules.

A message is kept when it is pinned (``ConversationMessage.pinned``: sent so, or
pinned by an operator) or when its tenant's ``[[tenants]].keep_verbatim`` rules
match it: by role, by the name of a tool it calls or answers, or by a regular
expression found in its text. Kept messages stay in place, in order, and
count against the budget; a tool call and its results are kept together.

A tenant's pattern runs on the compaction's path, and Python's ``re`` has no
timeout, so a pattern is bounded before it is accepted (when the settings
load, where it is compiled once): at most ``MAX_PATTERN_CHARS`` characters and
``MAX_PATTERNS`` of them; a repeat only of one character (a literal, a class,
``.``, ``\\d``: no repeated group, so no ``(a|aa)+``), no backreference, and the
product of its repeats' ranges (an unbounded one counted as the window) at
most ``MAX_BACKTRACKING``; it is matched against the first ``MATCH_WINDOW_CHARS``
characters of a turn. So a search costs at most window × ``MAX_BACKTRACKING``
steps, whatever the pattern and the message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from re import _parser as re_parser  # type: ignore[attr-defined]
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from core.domain.messages import ConversationMessage, Role

MAX_PATTERN_CHARS = 200
MAX_PATTERNS = 20
MATCH_WINDOW_CHARS = 1_024
MAX_BACKTRACKING = 16 * MATCH_WINDOW_CHARS
"""The most match attempts a pattern may make per start position (the product of
its repeats' ranges, an unbounded one counted as the window)."""
_SINGLE = frozenset({"LITERAL", "NOT_LITERAL", "ANY", "IN", "CATEGORY"})

KeepTest = Callable[[ConversationMessage], bool]


class KeepVerbatim(BaseModel):
    """One tenant's must-survive rules (``[[tenants]].keep_verbatim``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    roles: tuple[Role, ...] = ()
    tools: tuple[str, ...] = Field(default=(), max_length=100)
    patterns: tuple[str, ...] = Field(default=(), max_length=MAX_PATTERNS)

    @field_validator("patterns")
    @classmethod
    def _bounded_and_valid(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            if len(pattern) > MAX_PATTERN_CHARS:
                raise ValueError(f"a pattern is at most {MAX_PATTERN_CHARS} characters")
            try:
                parsed = re_parser.parse(pattern)
            except re.error as error:
                raise ValueError(f"pattern {pattern!r} does not compile: {error}") from error
            if _backtracking(parsed) > MAX_BACKTRACKING:
                raise ValueError(
                    f"pattern {pattern!r} may backtrack without bound: repeat single "
                    "characters only, with at most one unbounded repeat"
                )
        return patterns

    @cached_property
    def _compiled(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(p) for p in self.patterns)

    def matches(self, message: ConversationMessage, tool_names: Mapping[str, str]) -> bool:
        """Whether the rules keep ``message``; ``tool_names``: call id → tool name, for
        a result (which names its call, not its tool)."""
        if message.role in self.roles:
            return True
        if self.tools:
            called = {c.name for c in message.tool_calls or ()}
            if message.tool_call_id is not None and message.tool_call_id in tool_names:
                called.add(tool_names[message.tool_call_id])
            if called & set(self.tools):
                return True
        window = message.content[:MATCH_WINDOW_CHARS]
        return any(p.search(window) for p in self._compiled)


def _backtracking(items: Any) -> int:
    """An upper bound of the match attempts per start position (``MAX_BACKTRACKING``);
    more than it for a construct with no bound (a repeated group, a backreference)."""
    bound = 1
    for op, arg in items:
        name = str(op)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            _low, high, body = arg
            if len(body) != 1 or str(body[0][0]) not in _SINGLE:
                return MAX_BACKTRACKING + 1
            over = high == re_parser.MAXREPEAT or high > MATCH_WINDOW_CHARS
            bound *= MATCH_WINDOW_CHARS if over else high + 1
        elif name == "SUBPATTERN":
            bound *= _backtracking(arg[-1])
        elif name == "BRANCH":
            bound *= sum(_backtracking(branch) for branch in arg[1])
        elif name in ("ASSERT", "ASSERT_NOT"):
            bound *= _backtracking(arg[1])
        elif name in ("GROUPREF", "GROUPREF_EXISTS", "ATOMIC_GROUP"):
            return MAX_BACKTRACKING + 1
        if bound > MAX_BACKTRACKING:
            return bound
    return bound


def keep_test(history: Sequence[ConversationMessage], rules: KeepVerbatim | None) -> KeepTest:
    """The test ``split_history`` keeps by: pinned, or matched by ``rules``."""
    if rules is None or not (rules.roles or rules.tools or rules.patterns):
        return is_pinned
    names = {c.id: c.name for m in history for c in m.tool_calls or ()}
    return lambda message: message.pinned or rules.matches(message, names)


def is_pinned(message: ConversationMessage) -> bool:
    return message.pinned


def pinned_tokens(stored: Mapping[str, int], history: Sequence[ConversationMessage]) -> int:
    """The stored tokens of the pinned messages of ``history``."""
    return sum(stored.get(m.id, 0) for m in history if m.pinned)
