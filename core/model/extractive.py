"""A summariser that needs no network: it extracts instead of generating.

Without an API key the service still has to keep conversations inside their
budget. This provider ranks sentences by how central their words are to the
whole request (a SumBasic-style frequency score, with bonuses for the signals
importance scoring also values: questions, decisions, errors) and keeps the
best ones, in their original order, within ``max_tokens``. It reads the same
structured request the LLM adapters get, so the pipeline is identical.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

from core.model.port import ModelRequest, ModelResponse, ModelUsage
from core.prompts import (
    DEFAULT_DIRECTIVE,
    PREVIOUS_SUMMARY_PREFIX,
    SUMMARY_BATCH_PREFIX,
    SYSTEM_NOTE_PREFIX,
    TOOL_RESULT_PREFIX,
)
from core.scoring import DEFAULT_IMPORTANT_KEYWORDS
from core.tokens import DEFAULT_COUNTER, TokenCounter

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
            return speaker, content[len(prefix) :]
    return role.capitalize(), content


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
        speaker, text = _speaker_and_text(message.role, message.content)
        target = context if speaker == _CONTEXT else content
        for piece in _SENTENCE_END.split(text):
            piece = " ".join(piece.split())
            words = frozenset(w for w in _WORD.findall(piece.lower()) if w not in _STOP_WORDS)
            if len(words) >= 2 or (words and "?" in piece):
                target.append(_Sentence(len(target), speaker, piece, words))
    return content, context


def _score(sentence: _Sentence, frequency: Counter[str], total_words: int) -> float:
    centrality = sum(frequency[w] for w in sentence.words) / total_words
    # Favour dense sentences over long ones without zeroing short decisive ones.
    score = centrality / math.sqrt(len(sentence.words))
    lowered = sentence.text.lower()
    if "?" in sentence.text:
        score *= 1.3
    if any(keyword in lowered for keyword in DEFAULT_IMPORTANT_KEYWORDS):
        score *= 1.5
    if any(ch.isdigit() for ch in sentence.text):
        score *= 1.1  # numbers are usually facts: versions, amounts, dates
    return score


def _near_duplicate(words: frozenset[str], chosen: list[_Sentence]) -> bool:
    return any(len(words & c.words) / len(words | c.words) >= 0.6 for c in chosen)


def extract_summary(
    request: ModelRequest, counter: TokenCounter = DEFAULT_COUNTER
) -> tuple[str, int]:
    """The summary text and its estimated size in tokens."""
    sentences, context = _sentences(request)
    if not sentences:
        return _EMPTY_SUMMARY, counter.count(_EMPTY_SUMMARY)
    frequency: Counter[str] = Counter(w for s in sentences for w in s.words)
    total_words = sum(frequency.values())
    ranked = sorted(sentences, key=lambda s: (-_score(s, frequency, total_words), s.order))

    source_tokens = sum(counter.count(s.text) for s in sentences)
    budget = min(request.max_tokens, max(_MIN_TARGET_TOKENS, int(source_tokens * _TARGET_RATIO)))
    chosen: list[_Sentence] = []
    used = 0
    for sentence in ranked:
        line_cost = counter.count(f"{sentence.speaker}: {sentence.text} ")
        if used + line_cost > budget or _near_duplicate(sentence.words, [*context, *chosen]):
            continue
        chosen.append(sentence)
        used += line_cost
    if not chosen:  # even the best sentence is over budget: keep its head
        best = ranked[0]
        budget_chars = max(1, request.max_tokens * 4 - len(best.speaker) - 3)
        chosen = [_Sentence(best.order, best.speaker, best.text[:budget_chars], best.words)]

    lines: list[str] = []
    for sentence in sorted(chosen, key=lambda s: s.order):
        lines.append(f"{sentence.speaker}: {sentence.text}")
    text = "\n".join(lines)
    return text, counter.count(text)


class ExtractiveProvider:
    """The offline default when no API key is configured."""

    name = "extractive"

    def __init__(self, counter: TokenCounter = DEFAULT_COUNTER) -> None:
        self._counter = counter

    async def complete(self, request: ModelRequest) -> ModelResponse:
        text, output_tokens = extract_summary(request, self._counter)
        input_tokens = sum(self._counter.count(m.content) for m in request.messages)
        return ModelResponse(
            text=text,
            usage=ModelUsage(input_tokens=input_tokens, output_tokens=output_tokens),
            model="extractive",
            stop_reason="end_turn",
        )
