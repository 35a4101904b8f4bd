"""Fitting a conversation under a token limit when it is read, without a model.

A platform reads the context at every turn, and the LLM compaction that will
bring an over-budget conversation back under its budget lands seconds later
(or, in a provider outage, much later). Meanwhile the read must neither wait
nor hand out more than the model takes. So the read itself fits the history:
the stored clip-archive (the last compaction's summary) stays, pinned messages
stay verbatim (up to half the limit, the newest first, as a compaction keeps
them), the newest turns stay verbatim as far as they fit, and everything older
becomes one
**provisional clip-archive**: an extractive digest of those turns, the most
important first (``core.domain.scoring``), built in bounded time. The LLM
compaction replaces it when it lands; nothing is written.

Bounded work, whatever the history: the digest reads at most
``FitSettings.digest_input_tokens`` of text (the most important turns, each
cut to that size), so a read of a conversation with a million-character
turn costs what a read of an ordinary one costs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from core.domain.clip_archive import format_timestamp, is_clip_archive, shortened
from core.domain.extractive import extract_summary
from core.domain.messages import PROVISIONAL_ID_PREFIX, ConversationMessage
from core.domain.scoring import DEFAULT_SCORING, ImportanceScoringConfig, score_message
from core.domain.split import kept_units, tool_safe_boundary_after
from core.domain.tokens import DEFAULT_COUNTER, TokenCounter, estimate_message_tokens
from core.ports.model import ModelMessage, ModelRequest

#: The smallest limit a provisional clip-archive is made for (its header and the
#: newest turn's head need this much); under it only the newest turns that fit stay.
MIN_LIMIT = 256
MIN_DIGEST_TOKENS = 64
SHORTENED_TURN = "[... shortened to fit the context window; in full via /history ...]"


@dataclass(frozen=True)
class Sized:
    """A stored message and its stored token count (what the tally counts)."""

    message: ConversationMessage
    tokens: int


@dataclass(frozen=True)
class FitSettings:
    digest_tokens: int = 1024  # at most this much for the provisional digest
    digest_input_tokens: int = 4096  # the most text the digest reads
    scoring: ImportanceScoringConfig = DEFAULT_SCORING
    counter: TokenCounter = DEFAULT_COUNTER


@dataclass(frozen=True)
class AsStored:
    """The history fits the limit as stored."""

    messages: tuple[Sized, ...]
    tokens: int


@dataclass(frozen=True)
class Provisional:
    """The history did not fit: ``messages`` is the stored clip-archive (if any),
    the provisional clip-archive standing for ``folded``, then the newest turns
    (the last one ``shortened`` when even it alone did not fit)."""

    messages: tuple[Sized, ...]
    tokens: int
    folded: tuple[str, ...]
    stored_tokens: int
    shortened: bool = False


FittedContext = AsStored | Provisional


def fit_context(
    history: Sequence[Sized], limit: int, settings: FitSettings | None = None
) -> FittedContext:
    """``history`` as it is when it fits ``limit`` tokens, else provisionally fitted."""
    settings = settings or FitSettings()
    total = sum(s.tokens for s in history)
    if total <= limit:
        return AsStored(tuple(history), total)
    if limit < MIN_LIMIT:
        return _newest_only(history, limit, settings.counter)
    prior, body = _prior_and_body(history, limit, settings.counter)
    prior_tokens = prior.tokens if prior is not None else 0
    allowance = min(settings.digest_tokens, max(MIN_DIGEST_TOKENS, (limit - prior_tokens) // 4))
    pins = _pins(body, (limit - prior_tokens) // 2)
    pinned_tokens = sum(body[i].tokens for i in pins)
    boundary = _newest_fitting(body, limit - prior_tokens - allowance - pinned_tokens, pins)
    kept = list(body[boundary:])
    cut = False
    if not kept:  # not even the newest turn fits whole: its head and tail do
        boundary, kept = _newest_unit(body)
        room = limit - prior_tokens - allowance - sum(body[i].tokens for i in pins if i < boundary)
        kept = _shortened_unit(kept, room, settings.counter)
        cut = True
    pinned = [body[i] for i in sorted(pins) if i < boundary]
    head = [s for i, s in enumerate(body[:boundary]) if i not in pins]
    room = limit - prior_tokens - sum(s.tokens for s in (*pinned, *kept))
    digest = (_digest(head, room, settings),) if head else ()
    messages = (*(() if prior is None else (prior,)), *digest, *pinned, *kept)
    return Provisional(
        messages=messages,
        tokens=sum(s.tokens for s in messages),
        folded=tuple(s.message.id for s in head),
        stored_tokens=total,
        shortened=cut,
    )


def _pins(body: Sequence[Sized], allowance: int) -> set[int]:
    """The positions of the pinned messages kept verbatim (each with the other half
    of its tool exchange), newest first while they fit ``allowance``; a pin that
    does not fit is folded into the digest like any other turn."""
    chosen: set[int] = set()
    left = allowance
    for unit in reversed(kept_units([s.message for s in body])):
        tokens = sum(body[i].tokens for i in unit)
        if tokens <= left:
            chosen.update(unit)
            left -= tokens
    return chosen


def _newest_only(history: Sequence[Sized], limit: int, counter: TokenCounter) -> Provisional:
    """Under a limit too small for a provisional clip-archive (a test's budget): the
    newest turns that fit, else the newest one shortened, else nothing."""
    boundary = _newest_fitting(history, limit)
    kept = list(history[boundary:])
    cut = False
    if not kept and history:
        boundary, unit = _newest_unit(history)
        kept = _shortened_unit(unit, limit, counter)
        cut = True
        if sum(s.tokens for s in kept) > limit:
            boundary, kept = len(history), []
    return Provisional(
        messages=tuple(kept),
        tokens=sum(s.tokens for s in kept),
        folded=tuple(s.message.id for s in history[:boundary]),
        stored_tokens=sum(s.tokens for s in history),
        shortened=cut,
    )


def _prior_and_body(
    history: Sequence[Sized], limit: int, counter: TokenCounter
) -> tuple[Sized | None, Sequence[Sized]]:
    """The stored clip-archive (cut to half the limit at most) and the rest."""
    if not history or not is_clip_archive(history[0].message):
        return None, history
    prior = history[0]
    if prior.tokens > limit // 2:
        chars = int(len(prior.message.content) * (limit // 2) / max(1, prior.tokens) * 0.9)
        content = shortened(prior.message.content, chars)
        message = prior.message.model_copy(update={"content": content}).as_clip_archive()
        prior = Sized(message, estimate_message_tokens(message, counter))
    return prior, history[1:]


def _newest_fitting(
    body: Sequence[Sized], room: int, reserved: AbstractSet[int] = frozenset()
) -> int:
    """Where the newest turns that fit ``room`` start, never inside a tool exchange;
    the ``reserved`` positions (pins) are paid for already."""
    used = 0
    boundary = len(body)
    while boundary > 0:
        cost = 0 if boundary - 1 in reserved else body[boundary - 1].tokens
        if used + cost > room:
            break
        boundary -= 1
        used += cost
    return tool_safe_boundary_after([s.message for s in body], boundary)


def _newest_unit(body: Sequence[Sized]) -> tuple[int, list[Sized]]:
    """The last message, with the tool call it answers when it is a result."""
    start = tool_safe_boundary_after([s.message for s in body], len(body) - 1)
    if start >= len(body):  # the last message closes an exchange: take all of it
        start = len(body) - 1
        while start > 0 and body[start].message.role == "tool":
            start -= 1
    return start, list(body[start:])


def _shortened_unit(unit: Sequence[Sized], room: int, counter: TokenCounter) -> list[Sized]:
    """``unit``'s messages cut, head and tail kept, so they share ``room`` tokens."""
    share = max(16, room // max(1, len(unit)))
    out = []
    for sized in unit:
        if sized.tokens <= share:
            out.append(sized)
            continue
        message = sized.message
        keep = max(8, int(len(message.content) * share / sized.tokens * 0.9) - len(SHORTENED_TURN))
        head, tail = message.content[: keep // 2], message.content[-(keep // 2) :]
        cut = message.model_copy(update={"content": f"{head}\n{SHORTENED_TURN}\n{tail}"})
        out.append(Sized(cut, estimate_message_tokens(cut, counter)))
    return out


def _digest(head: Sequence[Sized], room: int, settings: FitSettings) -> Sized:
    """The provisional clip-archive of ``head`` in at most ``room`` tokens."""
    first, last = head[0].message, head[-1].message
    since, until = format_timestamp(first.created_at), format_timestamp(last.created_at)
    note = (
        f"[Provisional summary of {len(head)} earlier messages, {since} to {until},"
        " not yet compacted: extracted, not written by a"
        " model; replaced when their compaction lands. In full via /history and memory_read.]"
    )
    counter = settings.counter
    space = room - counter.count(note) - 2
    text = note
    if space >= MIN_DIGEST_TOKENS // 2:
        summary, _ = extract_summary(_digest_request(head, space, settings), counter)
        text = f"{note}\n{summary}"
    digest = ConversationMessage(
        id=f"{PROVISIONAL_ID_PREFIX}{_fingerprint(head)}",
        conversation_id=first.conversation_id,
        role="system",
        content=text,
        created_at=first.created_at,
    )
    return Sized(digest, estimate_message_tokens(digest, counter))


def _digest_request(head: Sequence[Sized], space: int, settings: FitSettings) -> ModelRequest:
    """The most important turns of ``head``, each cut, within the digest's reading
    budget, in conversation order."""
    total = len(head)
    chars_left = settings.digest_input_tokens * 4
    scores = [
        score_message(_cut(s.message, chars_left), i, total, settings.scoring)
        for i, s in enumerate(head)
    ]
    chosen: list[tuple[int, ModelMessage]] = []
    for index in sorted(range(total), key=lambda i: -scores[i]):
        if chars_left <= 0:
            break
        message = head[index].message
        content = message.content[: max(0, chars_left)]
        chars_left -= len(content)
        role = "user" if message.role == "tool" else message.role
        chosen.append((index, ModelMessage(role=role, content=content)))
    chosen.sort(key=lambda pair: pair[0])
    return ModelRequest(
        model="extractive", messages=tuple(m for _, m in chosen), max_tokens=max(1, space)
    )


def _cut(message: ConversationMessage, chars: int) -> ConversationMessage:
    """``message`` with at most ``chars`` of content: scoring reads it whole."""
    if len(message.content) <= chars:
        return message
    return message.model_copy(update={"content": message.content[:chars]})


def _fingerprint(head: Sequence[Sized]) -> str:
    ids = "\n".join(s.message.id for s in head)
    return hashlib.sha256(ids.encode()).hexdigest()[:16]
