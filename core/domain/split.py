"""Dividing a history into what is kept verbatim and what is compressed.

The last ``keep_recent`` messages always stay. Older messages are returned in
importance order, lowest first (compaction-v2.AC3.4), because the compactor
summarises in that order and fold-in gives later chunks the most context.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from core.domain.clip_archive import is_clip_archive
from core.domain.keep_rules import KeepTest, is_pinned
from core.domain.messages import ConversationMessage
from core.domain.scoring import DEFAULT_SCORING, ImportanceScoringConfig, score_message


class HistorySplit(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    to_compress: tuple[ConversationMessage, ...]
    to_keep: tuple[ConversationMessage, ...]
    prior_summary: ConversationMessage | None = None


def _tool_pair_spans(body: Sequence[ConversationMessage]) -> list[tuple[int, int]]:
    """(first, last) positions of every assistant tool call and its results.

    A result without ``tool_call_id`` is tied to the message just before it,
    which is how such transcripts are written.
    """
    call_position: dict[str, int] = {}
    for position, message in enumerate(body):
        for call in message.tool_calls or ():
            call_position.setdefault(call.id, position)
    spans: list[tuple[int, int]] = []
    for position, message in enumerate(body):
        if message.role != "tool":
            continue
        if message.tool_call_id is not None and message.tool_call_id in call_position:
            owner = call_position[message.tool_call_id]
            spans.append((min(owner, position), max(owner, position)))
        elif message.tool_call_id is None and position > 0:
            spans.append((position - 1, position))
    return spans


def tool_safe_boundary(body: Sequence[ConversationMessage], boundary: int) -> int:
    """Move ``boundary`` earlier until no tool call is cut from its results.

    Keeping a little more is always safe; a result whose call was summarised
    away would be an orphan no provider accepts.
    """
    spans = _tool_pair_spans(body)
    while True:
        straddling = [first for first, last in spans if first < boundary <= last]
        if not straddling:
            return boundary
        boundary = min(straddling)


def tool_safe_boundary_after(body: Sequence[ConversationMessage], boundary: int) -> int:
    """Move ``boundary`` later until no tool call is cut from its results: what is
    kept after it may only shrink (a read that must fit a limit)."""
    spans = _tool_pair_spans(body)
    while True:
        straddling = [last for first, last in spans if first < boundary <= last]
        if not straddling:
            return boundary
        boundary = max(straddling) + 1


def kept_verbatim(body: Sequence[ConversationMessage], boundary: int, keep: KeepTest) -> set[int]:
    """Positions before ``boundary`` that ``keep`` keeps, with the other half of each
    tool pair they belong to (a kept call keeps its results, and the reverse)."""
    kept = {i for i in range(boundary) if keep(body[i])}
    if not kept:
        return kept
    for first, last in _tool_pair_spans(body):
        if first < boundary and (first in kept or last in kept):
            kept.update(range(first, min(last + 1, boundary)))
    return kept


def kept_units(
    body: Sequence[ConversationMessage], keep: KeepTest = is_pinned
) -> list[tuple[int, ...]]:
    """``kept_verbatim``'s positions (over the whole of ``body``) as units in order:
    each kept message with the tool exchange it belongs to, so a unit is kept or
    dropped whole."""
    kept = {i for i, message in enumerate(body) if keep(message)}
    if not kept:
        return []
    intervals = sorted(
        [(i, i) for i in kept]
        + [(f, last) for f, last in _tool_pair_spans(body) if f in kept or last in kept]
    )
    units: list[list[int]] = []
    for first, last in intervals:
        if units and first <= units[-1][1]:
            units[-1][1] = max(units[-1][1], last)
        else:
            units.append([first, last])
    return [tuple(range(first, last + 1)) for first, last in units]


def split_history(
    history: Sequence[ConversationMessage],
    keep_recent: int,
    scoring: ImportanceScoringConfig = DEFAULT_SCORING,
    keep: KeepTest = is_pinned,
) -> HistorySplit:
    """``keep``: messages older than the last ``keep_recent`` that stay verbatim
    (pinned ones, a tenant's must-survive rules: ``core.domain.keep_rules``);
    they stay in ``to_keep`` in history order, before the recent ones."""
    if keep_recent < 0:
        raise ValueError("keep_recent must be >= 0")
    prior_summary = history[0] if history and is_clip_archive(history[0]) else None
    body = history[1:] if prior_summary is not None else history
    boundary = tool_safe_boundary(body, max(0, len(body) - keep_recent))
    pinned = kept_verbatim(body, boundary, keep)
    older = [m for i, m in enumerate(body[:boundary]) if i not in pinned]
    total = len(older)
    scores = [score_message(message, i, total, scoring) for i, message in enumerate(older)]
    # sorted() is stable: equal scores keep chronological order (compaction-v2.AC3.6).
    order = sorted(range(total), key=scores.__getitem__)
    return HistorySplit(
        to_compress=tuple(older[i] for i in order),
        to_keep=(*(body[i] for i in sorted(pinned)), *body[boundary:]),
        prior_summary=prior_summary,
    )
