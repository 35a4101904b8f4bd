"""The specifics ledger: the exact facts a summary must not lose.

Summaries keep decisions and drop the particulars: a public measurement of
one coding agent's summaries found numbers kept 1.9% of the time, file paths
9.8%. So after the model (or the extractive summariser) has written a batch,
the specifics of its source turns are extracted here, deterministically, by
pattern: amounts (numbers with units or currency), dates and times, URLs,
e-mail addresses, file paths, identifiers (tickets, orders, commits,
versions), code symbols, quoted strings and proper names. Those the summary
dropped are ranked (who stated it, how often, whether it answers a question,
how important its turn was) and the most important are appended to the batch
as a compact "Specifics" section, each under its source message id so that
``expand`` can fetch the turn, within a token allowance. Re-summarising
carries the most important specifics of its sources forward the same way.

Pure: the same turns, summary and allowance always give the same ledger.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from core.domain.long_text import head_and_tail
from core.domain.messages import ConversationMessage
from core.domain.spans import ClaimedSpans

SpecificKind = Literal[
    "url", "email", "path", "datetime", "identifier", "amount", "symbol", "quote", "name"
]

SECTION_HEADING = "Specifics (by source message; `expand` shows the turn):"
"""The first line of a batch's ledger section; ``split_section`` finds it again."""

MAX_KEPT = 64
"""How many specifics a batch remembers (ranked) for the re-summaries to come."""

MAX_CANDIDATES = 4 * MAX_KEPT
"""How many of the ranked specifics the summary is checked against for its ledger:
a section holds far fewer, and a log pasted into a turn can state thousands."""

_ITEM_SEPARATOR = "; "

#: How much each kind weighs when ranked: what is exact and unguessable first.
KIND_WEIGHT: Mapping[SpecificKind, float] = {
    "identifier": 1.6,
    "url": 1.5,
    "email": 1.5,
    "path": 1.5,
    "amount": 1.4,
    "datetime": 1.3,
    "symbol": 1.2,
    "quote": 1.0,
    "name": 0.9,
}
#: Who stated it: a user's figures and constraints matter most, a tool's output
#: is the ground truth the assistant then paraphrases.
ROLE_WEIGHT: Mapping[str, float] = {"user": 1.5, "tool": 1.2, "assistant": 1.0, "system": 1.0}
QUESTION_ANSWER_BONUS = 1.3


class Specific(BaseModel):
    """One specific, under the message that first stated it (the most important
    occurrence: the one ranking chose)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: SpecificKind
    text: str = Field(min_length=1)
    message_id: str
    score: float = Field(default=0.0, ge=0)


# -- extraction --------------------------------------------------------------------

_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
    r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_UNITS = (
    r"%|percent|ms|msec|s|sec|secs|seconds?|mins?|minutes?|h|hrs?|hours?|days?|weeks?|"
    r"months?|years?|[kmgtp]i?b|bytes?|kb/s|mb/s|gb/s|kbps|mbps|gbps|rps|qps|req/s|rpm|"
    r"k|m|bn|million|billion|thousand|x|kg|g|mg|lbs?|km|cm|mm|mi|ft|miles?|°c|°f|"
    r"tokens?|users?|requests?|rows?|records?|items?|nodes?|pods?|cores?|vcpus?|replicas?|"
    r"usd|eur|gbp|jpy|chf|dollars?|euros?|pounds?"
)
_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"

# (kind, pattern), in the order spans are claimed: a URL holds a path, an e-mail
# holds a name, a date holds numbers; the first to claim a span keeps it.
_PATTERNS: tuple[tuple[SpecificKind, re.Pattern[str]], ...] = (
    ("url", re.compile(r"\b(?:https?|ftp|s3|gs)://[^\s<>\"'`]+", re.IGNORECASE)),
    ("email", re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")),
    ("quote", re.compile(r"\"([^\"\n]{2,80})\"|“([^”\n]{2,80})”")),
    ("symbol", re.compile(r"`([^`\n]{1,80})`")),
    (
        "datetime",
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2})?(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)?"
            r"|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
            rf"|\b{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?(?:,? \d{{4}})?\b"
            rf"|\b\d{{1,2}}(?:st|nd|rd|th)? {_MONTH}\b(?:,? \d{{4}})?"
            r"|\b\d{1,2}:\d{2}(?::\d{2})?(?: ?[ap]\.?m\.?)?(?: ?(?:UTC|GMT|[A-Z]{2}T))?(?![\w:])"
            r"|\b\d{1,2} ?[ap]\.?m\.?(?![\w])(?: ?(?:UTC|GMT|[A-Z]{2}T))?",
            re.IGNORECASE,
        ),
    ),
    (
        "path",
        re.compile(
            r"(?<![\w/.@-])(?:~/|\.{1,2}/|/)?(?:[\w.@-]+/)+[\w.@-]*[\w@-]"
            r"|[A-Za-z]:\\(?:[\w .-]+\\)*[\w.-]+"
            r"|\b[\w-]+\.(?:py|pyi|js|ts|tsx|jsx|go|rs|java|kt|rb|php|c|h|cc|cpp|hpp|cs|sh|"
            r"sql|toml|ya?ml|json|jsonl|md|txt|ini|cfg|conf|env|lock|csv|log|html|css|xml|"
            r"proto|tf|dockerfile)\b"
        ),
    ),
    (
        "identifier",
        re.compile(
            r"\b[A-Z][A-Z0-9]{1,9}-\d+[A-Z0-9-]*\b"  # JIRA-123, ORD-88123, INV-2024-001
            r"|(?<![\w#])#\d{2,}\b"  # #4512
            r"|\bv\d+(?:\.\d+)+(?:[-+][\w.]+)?\b"  # v2.3.1, v1.0-rc1
            r"|\b\d+\.\d+\.\d+(?:[-+][\w.]+)?\b"  # 2.3.1
            r"|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"  # a commit
            r"|\b(?=[A-Za-z0-9_]*\d)(?=[A-Za-z0-9_]*[A-Za-z])[A-Za-z][A-Za-z0-9_]*\d[A-Za-z0-9_]*"
            r"(?:-[A-Za-z0-9]+)+\b"  # ab12-cd34 style
            r"|\b(?=[A-Z0-9]*\d)[A-Z][A-Z0-9]{5,}\b"  # AB12CD34
        ),
    ),
    (
        "amount",
        re.compile(
            rf"[$€£¥]\s?(?:{_NUMBER})(?:\s?(?:k|m|bn|million|billion)\b)?"
            rf"|(?<![\w.,])(?:{_NUMBER})\s?(?:{_UNITS})(?![\w])"
            rf"|(?<![\w.,/-])(?:\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|\d+\.\d+|\d{{3,}})(?![\w.,]?\d)",
            re.IGNORECASE,
        ),
    ),
    (
        "symbol",
        re.compile(
            r"\b[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*\(\)"  # call()
            r"|\b[a-z][a-z0-9]*_[a-z0-9_]*[a-z0-9]\b"  # snake_case
            r"|\b[a-z]+[A-Z][A-Za-z0-9]*\b"  # camelCase
            r"|\b[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*\b"  # PascalCase with two humps
            r"|\b[a-z_]\w*(?:\.[a-z_]\w*){1,4}\b(?!\.\w)"  # module.attribute
            r"|--[a-z][a-z0-9-]+"  # --flag
        ),
    ),
    (
        "name",
        re.compile(
            r"(?<=[a-z0-9,;:)] )(?:[A-Z][a-z]+|[A-Z]{2,}[a-z]*)(?: (?:[A-Z][a-z]+|[A-Z]{2,}))*"
            r"|^(?:[A-Z][a-z]+)(?: [A-Z][a-z]+)+"
        ),
    ),
)

#: Capitalised words that are not names (days, months and the words that start
#: a clause inside a sentence).
_NOT_NAMES = frozenset(
    """i i'm i've i'll i'd ok okay yes no the a an and but or so if then thanks thank please
    hi hello hey sure great good also however this that these those it we you they he she
    monday tuesday wednesday thursday friday saturday sunday january february march april
    may june july august september october november december today tomorrow yesterday
    user assistant tool system earlier summary json http https api url id""".split()
)
_TRAILING = ".,;:!?)]}'\""


@dataclass(frozen=True)
class Mention:
    """One occurrence of a specific in one turn."""

    kind: SpecificKind
    text: str
    message_id: str
    position: int  # the turn's place among the batch's sources (first = 0)


def _clean(kind: SpecificKind, match: re.Match[str]) -> str | None:
    if kind in ("quote", "symbol") and match.lastindex:
        text = next((g for g in match.groups() if g), "")
        return text.strip() or None
    text = match.group(0)
    if kind in ("url", "path", "email", "identifier"):
        text = text.rstrip(_TRAILING)
    text = text.strip()
    if kind == "name":
        if text.lower() in _NOT_NAMES or len(text) < 3:
            return None
        words = text.split(" ")
        while words and words[0].lower() in _NOT_NAMES:
            words.pop(0)
        text = " ".join(words)
        if not text or text.lower() in _NOT_NAMES:
            return None
    if kind == "path" and "/" not in text and "\\" not in text and "." not in text:
        return None
    dotted = kind == "symbol" and "." in text and not text.endswith("()")
    if dotted and any(part.isdigit() for part in text.split(".")):
        return None  # a module.attribute, not a number's parts
    return text or None


def mentions_in(text: str, message_id: str, position: int = 0) -> list[Mention]:
    """Every specific in ``text``, each span claimed once, in text order."""
    spans = _remembered_spans(text) if len(text) <= REMEMBERED_TEXT_CHARS else _spans(text)
    return [Mention(kind, cleaned, message_id, position) for kind, cleaned in spans]


# A compaction's turns are read when it is planned and again by the store's gate,
# seconds apart: the spans of the last 2,048 chat-sized texts are kept (<= ~8 MB).
REMEMBERED_TEXT_CHARS = 4_000
_remembered_spans = functools.lru_cache(maxsize=2_048)(lambda text: _spans(text))


def _spans(text: str) -> tuple[tuple[SpecificKind, str], ...]:
    claimed = ClaimedSpans()
    found: list[tuple[int, SpecificKind, str]] = []
    for kind, pattern in _PATTERNS:
        for match in pattern.finditer(text):
            start, end = match.span()
            if start == end or claimed.overlaps(start, end):
                continue
            cleaned = _clean(kind, match)
            if cleaned is None:
                continue
            claimed.add(start, end)
            found.append((start, kind, cleaned))
    return tuple((kind, cleaned) for _, kind, cleaned in sorted(found, key=lambda item: item[0]))


def turn_text(message: ConversationMessage) -> str:
    """What a turn says, its tool calls' names and arguments included."""
    parts = [message.content]
    for call in message.tool_calls or ():
        parts.append(f"{call.name}({' '.join(f'{k}={v}' for k, v in call.arguments.items())})")
    return "\n".join(part for part in parts if part)


def normalized(text: str) -> str:
    """The form two mentions of one specific share (case and spacing aside)."""
    return " ".join(text.casefold().split())


def _answers_question(sources: Sequence[ConversationMessage], index: int) -> bool:
    """A turn that is a question, or that answers one (the turn before it, from
    another speaker, asked)."""
    if "?" in sources[index].content:
        return True
    return (
        index > 0
        and "?" in sources[index - 1].content
        and sources[index - 1].role != sources[index].role
    )


def rank_specifics(
    sources: Sequence[ConversationMessage],
    importance: Mapping[str, float] | None = None,
) -> list[Specific]:
    """The specifics of ``sources`` (in conversation order), most important first.

    A specific's score is its kind's weight × the best of its mentions (who
    stated it × the turn's importance × a bonus in a question or its answer)
    × (1 + log of how many turns mention it). Ties keep first-mention order.
    A long turn is read in part: its head and tail (``core.domain.long_text``).
    """
    importance = importance or {}
    best: dict[tuple[str, str], tuple[float, Mention]] = {}
    turns: dict[tuple[str, str], set[str]] = {}
    order: dict[tuple[str, str], int] = {}
    for index, message in enumerate(sources):
        weight = ROLE_WEIGHT.get(message.role, 1.0) * max(importance.get(message.id, 1.0), 0.05)
        if _answers_question(sources, index):
            weight *= QUESTION_ANSWER_BONUS
        for mention in mentions_in(head_and_tail(turn_text(message)), message.id, index):
            key = (mention.kind, normalized(mention.text))
            order.setdefault(key, len(order))
            turns.setdefault(key, set()).add(message.id)
            if key not in best or weight > best[key][0]:
                best[key] = (weight, mention)
    ranked = [
        Specific(
            kind=mention.kind,
            text=mention.text,
            message_id=mention.message_id,
            score=round(KIND_WEIGHT[mention.kind] * weight * (1 + math.log(len(turns[key]))), 6),
        )
        for key, (weight, mention) in best.items()
    ]
    return sorted(ranked, key=lambda s: (-s.score, order[(s.kind, normalized(s.text))]))


def merge_ranked(lists: Iterable[Sequence[Specific]]) -> list[Specific]:
    """Several batches' ranked specifics as one ranking (re-summarisation): a
    specific in several keeps its best score, raised by how many carry it."""
    best: dict[tuple[str, str], Specific] = {}
    seen: dict[tuple[str, str], int] = {}
    order: dict[tuple[str, str], int] = {}
    for specifics in lists:
        for specific in specifics:
            key = (specific.kind, normalized(specific.text))
            order.setdefault(key, len(order))
            seen[key] = seen.get(key, 0) + 1
            if key not in best or specific.score > best[key].score:
                best[key] = specific
    merged = [
        s.model_copy(update={"score": round(s.score * (1 + math.log(seen[k])), 6)})
        for k, s in best.items()
    ]
    return sorted(merged, key=lambda s: (-s.score, order[(s.kind, normalized(s.text))]))


# -- what the summary dropped, and the section -------------------------------------


def present_in(specific: Specific, text: str) -> bool:
    """Whether ``text`` states ``specific`` (case and spacing aside)."""
    return normalized(specific.text) in normalized(text)


def dropped_by(summary: str, ranked: Sequence[Specific]) -> list[Specific]:
    """The specifics the summary does not state, in rank order."""
    folded = normalized(summary)
    return [s for s in ranked if normalized(s.text) not in folded]


def render_section(ledger: Sequence[Specific]) -> str:
    """The section: one line per source message, messages in the order of their
    best specific, so an id (often a long one) is written once."""
    if not ledger:
        return ""
    groups: dict[str, list[str]] = {}
    for specific in ledger:
        groups.setdefault(specific.message_id, []).append(specific.text)
    lines = [f"- {mid}: {_ITEM_SEPARATOR.join(texts)}" for mid, texts in groups.items()]
    return "\n".join([SECTION_HEADING, *lines])


def choose_ledger(
    dropped: Sequence[Specific], allowance: int, count: Callable[[str], int]
) -> tuple[Specific, ...]:
    """The longest rank-order run of ``dropped`` whose section (with the blank
    line that separates it from the summary) fits ``allowance`` tokens; a
    specific that does not fit is skipped, a smaller one after it may."""
    chosen: list[Specific] = []
    for specific in dropped:
        trial = [*chosen, specific]
        if count("\n\n" + render_section(trial)) <= allowance:
            chosen = trial
    return tuple(chosen)


def with_section(summary: str, ledger: Sequence[Specific]) -> str:
    """The batch's content: the summary, then its ledger section (if any)."""
    section = render_section(ledger)
    return f"{summary}\n\n{section}" if section else summary


def split_section(content: str) -> tuple[str, str]:
    """(summary, section) of a batch's content; the section is "" when it has none."""
    head, found, tail = content.rpartition("\n\n" + SECTION_HEADING)
    if not found:
        return content, ""
    return head, SECTION_HEADING + tail


@dataclass(frozen=True)
class Ledger:
    """What the ledger did to one batch: its content, the specifics shown in its
    section, and the ranked specifics the batch remembers for re-summaries."""

    content: str
    shown: tuple[Specific, ...]
    remembered: tuple[Specific, ...]


def apply_ledger(
    summary: str,
    ranked: Sequence[Specific],
    allowance: int,
    count: Callable[[str], int],
) -> Ledger:
    """``summary`` with the most important of ``ranked`` it dropped appended,
    within ``allowance`` tokens (0: none appended, the ranking still remembered).
    Only the first ``MAX_CANDIDATES`` are considered."""
    candidates = ranked[:MAX_CANDIDATES]
    shown = (
        choose_ledger(dropped_by(summary, candidates), allowance, count) if allowance > 0 else ()
    )
    return Ledger(with_section(summary, shown), shown, tuple(ranked[:MAX_KEPT]))
