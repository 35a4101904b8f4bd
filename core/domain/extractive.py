"""Extractive summaries: the sentences that carry the facts, no model needed.

Without an API key the service still has to keep conversations inside their
budget. This provider ranks sentences by the facts they carry: how informative
their words are (a word in every sentence, like a caption's repeated "photo",
says little; inverse sentence frequency), with bonuses for names, numbers,
dates, decisions and answers, and a penalty for boilerplate (sentences made
of words nearly every sentence has). It keeps the best ones, no two near
duplicates, in their original order, within ``max_tokens`` (the output never
goes over it). Re-summarising keeps each line's own speaker ("User: …"), so
prefixes never stack ("Earlier: Earlier: …"). It reads the same structured
request the LLM adapters get, so the pipeline is identical. A long message is
read in part, its head and its tail (``core.domain.long_text``): a summary's
cost is bounded per message.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

from core.domain.long_text import head_and_tail
from core.domain.prompts import (
    DEFAULT_DIRECTIVE,
    PREVIOUS_SUMMARY_PREFIX,
    SUMMARY_BATCH_PREFIX,
    SYSTEM_NOTE_PREFIX,
    TOOL_RESULT_PREFIX,
    unfenced,
)
from core.domain.scoring import DEFAULT_IMPORTANT_KEYWORDS
from core.domain.tokens import DEFAULT_COUNTER, TokenCounter
from core.ports.model import ModelRequest

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"[a-z0-9][a-z0-9_'-]*")
_STOP_WORDS = frozenset(
    """a an and are as at be been but by can could did do does for from had has have he her
    him his how i if in into is it its just me my no not of on or our she so than that the
    their them then there these they this to up us was we were what when where which who
    will with would you your yes ok okay sure thanks thank please hi hello hey let lets i'm
    it's that's great good nice cool awesome glad happy help hope well sounds perfect""".split()
)
_EMPTY_SUMMARY = "No substantive content to summarize."
_SPEAKERS = ("User", "Assistant", "Tool", "System", "Earlier")
_LABEL = re.compile(r"^(?:(?:" + "|".join(_SPEAKERS) + r"): )+")
# A capitalised word inside a sentence: a name of a person, place or product.
_NAME = re.compile(r"(?<=[a-z0-9,;:] )[A-Z][a-z]+")
_DATE = re.compile(
    r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\s+\d|\b\d{1,2}(?:st|nd|rd|th)?"
    r"\s+(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)|\b(?:monday|tuesday|wednesday|"
    r"thursday|friday|saturday|sunday|tomorrow|yesterday|today)\b|\b\d{4}-\d{2}-\d{2}\b",
    re.IGNORECASE,
)
_FACT_VERBS = re.compile(
    r"\b(?:is|are|was|were|called|named|lives?|moved?|prefers?|likes?|hates?|bought|"
    r"changed|switched|decided|agreed|chose|costs?|born|works?|starts?|ends?|will)\b",
    re.IGNORECASE,
)
_DIGIT = re.compile(r"\d")
_KEYWORD = re.compile("|".join(re.escape(k) for k in DEFAULT_IMPORTANT_KEYWORDS))
_CONTEXT = "(context)"
# A summary must be clearly smaller than what it replaces, or compaction frees
# nothing and the conversation is over budget again at the next message.
_TARGET_RATIO = 0.3
_MIN_TARGET_TOKENS = 64


@dataclass(frozen=True)
class _Sentence:
    order: int
    speaker: str
    text: str
    words: frozenset[str]


def _speaker_and_text(role: str, content: str) -> tuple[str, str]:
    for prefix, speaker in (
        (PREVIOUS_SUMMARY_PREFIX, _CONTEXT),
        (SUMMARY_BATCH_PREFIX, "Earlier"),
        (TOOL_RESULT_PREFIX, "Tool"),
        (SYSTEM_NOTE_PREFIX, "System"),
    ):
        if content.startswith(prefix):
            return speaker, unfenced(content[len(prefix) :])
    return role.capitalize(), unfenced(content)


def _labelled_lines(speaker: str, text: str) -> list[tuple[str, str]]:
    """(speaker, line) pairs; a summary's lines keep the speaker they already name.

    A summary batch is made of ``Speaker: sentence`` lines: re-summarising it
    must not put another label in front (``Earlier: User: …``, then
    ``Earlier: Earlier: …`` one level deeper).
    """
    if speaker not in ("Earlier", _CONTEXT):
        return [(speaker, text)]
    out = []
    for line in text.splitlines():
        label = _LABEL.match(line)
        if label is None:
            out.append((speaker, line))
            continue
        names = [n for n in label.group(0).split(": ") if n]
        own = next((n for n in reversed(names) if n != "Earlier"), "Earlier")
        out.append((speaker if speaker == _CONTEXT else own, line[label.end() :]))
    return out


def _sentences(request: ModelRequest) -> tuple[list[_Sentence], list[_Sentence]]:
    """(content sentences, context sentences).

    The running summary of a fold-in request is context: it is already
    archived in an earlier batch, so it only serves to avoid repeating itself.
    """
    content: list[_Sentence] = []
    context: list[_Sentence] = []
    for message in request.messages:
        if message.content == DEFAULT_DIRECTIVE:
            continue
        speaker, text = _speaker_and_text(message.role, head_and_tail(message.content))
        target = context if speaker == _CONTEXT else content
        for line_speaker, line in _labelled_lines(speaker, text):
            for piece in _SENTENCE_END.split(line):
                piece = " ".join(piece.split())
                words = frozenset(w for w in _WORD.findall(piece.lower()) if w not in _STOP_WORDS)
                if len(words) >= 2 or (words and "?" in piece):
                    target.append(_Sentence(len(target), line_speaker, piece, words))
    return content, context


def _score(sentence: _Sentence, spread: Counter[str], count: int) -> float:
    """How many facts the sentence likely carries.

    ``spread`` counts the sentences each word occurs in: informativeness is
    the mean inverse sentence frequency of the sentence's words (a word most
    sentences share is boilerplate), times bonuses for what facts look like.
    """
    informativeness = sum(math.log(1 + count / spread[w]) for w in sentence.words)
    # Longer sentences carry more, but not linearly more.
    score = informativeness / math.sqrt(len(sentence.words))
    text = sentence.text
    common = sum(1 for w in sentence.words if spread[w] >= max(3, count / 4))
    if count >= 6 and common * 2 > len(sentence.words):
        score *= 0.3  # mostly words nearly every sentence has: captions, templates
    if _NAME.search(text):
        score *= 1.4  # names of people, places, products
    if _DIGIT.search(text):
        score *= 1.4  # amounts, versions, times
    if _DATE.search(text):
        score *= 1.3
    if _FACT_VERBS.search(text):
        score *= 1.2  # "X is Y", "moved to", "prefers", "changed"
    if _KEYWORD.search(text.lower()):
        score *= 1.5  # decisions, errors
    if "?" in text:
        score *= 0.9  # the answer carries the fact, the question less so
    return score


def _near_duplicate(words: frozenset[str], chosen: list[_Sentence]) -> bool:
    return any(len(words & c.words) / len(words | c.words) >= 0.5 for c in chosen)


def extract_summary(
    request: ModelRequest, counter: TokenCounter = DEFAULT_COUNTER
) -> tuple[str, int]:
    """The summary text and its estimated size in tokens (at most ``max_tokens``)."""
    sentences, context = _sentences(request)
    if not sentences:
        return _fit(_EMPTY_SUMMARY, request.max_tokens, counter)
    spread: Counter[str] = Counter(w for s in sentences for w in s.words)
    ranked = sorted(sentences, key=lambda s: (-_score(s, spread, len(sentences)), s.order))

    source_tokens = sum(counter.count(s.text) for s in sentences)
    budget = min(request.max_tokens, max(_MIN_TARGET_TOKENS, int(source_tokens * _TARGET_RATIO)))
    chosen: list[_Sentence] = []
    used = 0
    for sentence in ranked:
        line_cost = counter.count(f"{sentence.speaker}: {sentence.text}\n")
        if used + line_cost > budget or _near_duplicate(sentence.words, [*context, *chosen]):
            continue
        chosen.append(sentence)
        used += line_cost
    if not chosen:  # even the best sentence is over budget: keep its head
        chosen = [ranked[0]]
    return _render(chosen, request.max_tokens, counter)


def _render(chosen: list[_Sentence], max_tokens: int, counter: TokenCounter) -> tuple[str, int]:
    """Lines in conversation order; the least valuable dropped (the last one cut)
    until the text fits ``max_tokens``."""
    kept = list(chosen)  # best first
    while True:
        lines = [f"{s.speaker}: {s.text}" for s in sorted(kept, key=lambda s: s.order)]
        text = "\n".join(lines)
        if counter.count(text) <= max_tokens or len(kept) == 1:
            return _fit(text, max_tokens, counter)
        kept.pop()


def _fit(text: str, max_tokens: int, counter: TokenCounter) -> tuple[str, int]:
    """``text`` cut to its longest prefix of at most ``max_tokens`` tokens."""
    tokens = counter.count(text)
    if tokens <= max_tokens:
        return text, tokens
    low, high = 1, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (
            (middle, high) if counter.count(text[:middle]) <= max_tokens else (low, middle - 1)
        )
    cut = text[:low].rstrip() or text[:1]
    return cut, counter.count(cut)
