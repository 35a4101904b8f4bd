"""The gate a compaction passes before it takes effect.

A store runs ``check_compaction`` inside the transaction that applies a plan,
on the rows the plan really removes and keeps, so a summary that is empty, a
copy of the directive, an echo of its input, one that splits a tool call from
its result, loses a specific or leaves the history over the target is never
applied: the transaction rolls back and the history stays exactly as it was.

Every check is bounded: the echo check compares at most ``MAX_SHINGLES`` word
shingles of each side, specifics are read from each turn's head and tail
(``rank_specifics``); ``gate_cost`` tells a store when the check is big enough to
run off the event loop.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from core.domain.compaction import CompactionPlan
from core.domain.messages import ConversationMessage
from core.domain.prompts import DATA_TAG, DEFAULT_DIRECTIVE
from core.domain.specifics import MAX_KEPT, normalized, rank_specifics, split_section

RejectionReason = Literal[
    "empty_summary", "directive_copy", "echo", "tool_pair_split", "specific_lost", "over_target",
    "pinned_compressed", "repetition", "unrelated", "cut_off",
]  # fmt: skip
REJECTION_REASONS: tuple[RejectionReason, ...] = (
    "empty_summary", "directive_copy", "echo", "tool_pair_split", "specific_lost", "over_target",
    "pinned_compressed", "repetition", "unrelated", "cut_off",
)  # fmt: skip

EXTRACTIVE = "extractive"
"""``LlmUsage.summarizer`` of the extractive summariser: the fallback after a refusal."""
SHINGLE_WORDS = 8
MAX_SHINGLES = 20_000
ECHO_SHARE = 0.5
"""A summary repeating more than half of the compressed text's shingles is an echo."""
LOOP_SHARE = 0.5
"""A model's summary whose word shingles are more than half repeats of its own
earlier ones, not found in its turns, is a loop (a small model run to
``max_tokens``: docs/memory.md, "A real small model, by hand")."""
MIN_LOOP_SHINGLES = 16
IDEOGRAPHIC = (
    "\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f"  # kana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"  # Han
)
"""Unspaced scripts whose characters carry meaning: read in pairs."""
ABUGIDA = "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff"  # Thai, Lao, Myanmar, Khmer
"""Unspaced scripts written in letters and vowel signs: read four code points at a time."""
UNSPACED = IDEOGRAPHIC + ABUGIDA
CONTENT_WORD = re.compile(rf"[{UNSPACED}]{{2,}}|(?:(?![{UNSPACED}])[^\W_]){{4,}}")
"""A word of four letters or more, or a run of an unspaced script: scripts
written without spaces have clauses, not words, between punctuation."""
IDEOGRAPHIC_START = re.compile(f"[{IDEOGRAPHIC}]")
ABUGIDA_START = re.compile(f"[{ABUGIDA}]")
HIRAGANA_ONLY = re.compile("[\u3040-\u309f]+")
MIN_UNRELATED_WORDS = 8
"""Turns with fewer distinct content words (a run of tool calls) are not checked."""
COMMON_WORDS = frozenset(
    "that this with what your have from they them then there their were will would could "
    "should about which when where while been being into only also just some more most "
    "very here does done like want need sure okay please thanks thank".split()
)
"""Words too common to show that a summary speaks of its turns."""
COMMON_BIGRAMS = frozenset(
    "我们 你们 他们 可以 需要 什么 这个 那个 一个 没有 就是 不是 因为 所以 如果 但是 已经 "
    "还是 请问 谢谢 好的 知道 告诉 帮助 帮你 问题 现在 怎么 应该 然后 我的 你的".split()
)
"""Chinese pairs too common to show that a summary speaks of its turns (pairs
of hiragana alone, Japanese grammar, are skipped too)."""
MIN_COPY_CHARS = 40
"""A shorter summary found in the previous clip-archive may be a coincidence."""
OFF_LOOP_CHARS = 8_000
"""Above this many characters (summaries and compressed turns), run the gate off the
loop: the specifics alone take ~1.2 ms per 1,000 characters on the 2-core machine
(``docs/performance.md`` section 3), so a compaction's gate stays within ~10 ms
of the loop that also answers the platforms' reads."""


@dataclass(frozen=True)
class Passed:
    """The plan may take effect."""


@dataclass(frozen=True)
class Rejected:
    """The plan must not take effect: ``reason`` (one of ``REJECTION_REASONS``), and
    what was found (for the log and the ``CompactionRejected`` event)."""

    reason: RejectionReason
    detail: str


GateVerdict = Passed | Rejected


@dataclass(frozen=True)
class GateInput:
    """What the store knows inside the apply: the plan, the turns it removes
    (read from the rows it deletes) and the tool turns that stay live. A summary
    copying ``directive``, ``extra_directives`` or the instructions the plan's
    summaries were asked with (``plan.instructions``: the configured prompt) is
    refused."""

    plan: CompactionPlan
    compressed: Sequence[ConversationMessage]
    kept_tool_turns: Sequence[ConversationMessage] = ()
    directive: str = DEFAULT_DIRECTIVE
    extra_directives: tuple[str, ...] = field(default=())


def gate_applies(plan: CompactionPlan) -> bool:
    """Only a plan that writes new summaries of raw turns has something to check: a
    restore, or a rebuilt clip-archive alone, writes no new summary text."""
    return bool(plan.new_batches) and not plan.restored_message_ids


def gate_cost(plan: CompactionPlan, compressed: Sequence[ConversationMessage]) -> int:
    """Characters the gate reads (to decide whether to run it off the loop)."""
    summaries = sum(len(b.batch.content) for b in plan.new_batches)
    return summaries + sum(len(m.content) for m in compressed)


def check_compaction(given: GateInput) -> GateVerdict:
    """The first check the plan fails, or ``Passed``."""
    raw = [m for m in given.compressed if not m.stored_clip_archive]
    summaries = [split_section(b.batch.content)[0] for b in given.plan.new_batches]
    pinned = [m.id for m in raw if m.pinned]
    if pinned:  # pinned after the plan was made: the plan is stale
        return Rejected("pinned_compressed", f"pinned message(s) compressed: {pinned[:5]}")
    model = given.plan.usage.summarizer != EXTRACTIVE
    if given.plan.summaries_cut:
        cut = given.plan.summaries_cut
        return Rejected("cut_off", f"{cut} summar{'y' if cut == 1 else 'ies'} cut at max_tokens")
    for verdict in (
        _summary_text(
            summaries, (given.directive, *given.extra_directives, *given.plan.instructions)
        ),
        _echo(summaries, raw, verbatim_ok=not model),
        _repetition(summaries, raw) if model else Passed(),
        _unrelated(given.plan, raw) if model else Passed(),
        _copy_of_previous(given.plan, given.compressed) if model else Passed(),
        _tool_pairs(raw, given.kept_tool_turns),
        _specifics(given.plan, raw),
        _target(given.plan),
    ):
        if isinstance(verdict, Rejected):
            return verdict
    return Passed()


def _summary_text(summaries: Sequence[str], directives: Sequence[str]) -> GateVerdict:
    for text in summaries:
        if not text.strip():
            return Rejected("empty_summary", "a new summary batch is empty")
        folded = normalized(text)
        for directive in directives:
            wanted = normalized(directive)
            if wanted and (folded == wanted or (len(folded) > 40 and folded in wanted)):
                return Rejected("directive_copy", "a new summary repeats the directive")
    return Passed()


def _echo(
    summaries: Sequence[str], raw: Sequence[ConversationMessage], *, verbatim_ok: bool
) -> GateVerdict:
    """Fence markers, or (for a model's summary: an extractive one is made of the
    turns' own sentences) more than ``ECHO_SHARE`` of the compressed shingles."""
    for text in summaries:
        if f"<{DATA_TAG}" in text or f"</{DATA_TAG}" in text:
            return Rejected("echo", f"a new summary contains the {DATA_TAG} fence markers")
    source = _shingles(m.content for m in raw)
    if not source or verbatim_ok:
        return Passed()
    said = _shingles(summaries)
    repeated = len(source & said) / len(source)
    if repeated > ECHO_SHARE:
        return Rejected("echo", f"the summaries repeat {repeated:.0%} of the compressed text")
    return Passed()


def _repetition(summaries: Sequence[str], raw: Sequence[ConversationMessage]) -> GateVerdict:
    """More than ``LOOP_SHARE`` of a summary's shingles repeat one of its own, with
    words its turns never had together (repeating the turns' own repeats is not a loop)."""
    source = _word_shingles(m.content for m in raw)
    for text in summaries:
        shingles = _word_sequence(text)
        if len(shingles) < MIN_LOOP_SHINGLES:
            continue
        seen: set[tuple[str, ...]] = set()
        looped = 0
        for shingle in shingles:
            looped += shingle in seen and shingle not in source
            seen.add(shingle)
        if looped / len(shingles) > LOOP_SHARE:
            return Rejected("repetition", f"a new summary repeats itself ({looped} shingles)")
    return Passed()


def _unrelated(plan: CompactionPlan, raw: Sequence[ConversationMessage]) -> GateVerdict:
    """A summary sharing no content word with its turns (an assistant's reply, a
    refusal) summarises nothing, even when its ledger remembers their specifics."""
    by_id = {m.id: m for m in raw}
    for stored in plan.new_batches:
        sources = [by_id[i] for i in stored.batch.source_message_ids if i in by_id]
        if stored.batch.depth != 0 or not sources:
            continue
        theirs = set().union(*(_content_words(_text_of(m)) for m in sources))
        said = _content_words(split_section(stored.batch.content)[0])
        if len(theirs) >= MIN_UNRELATED_WORDS and not said & theirs:
            return Rejected("unrelated", f"batch {stored.id} shares no word with its turns")
    return Passed()


def _copy_of_previous(
    plan: CompactionPlan, compressed: Sequence[ConversationMessage]
) -> GateVerdict:
    """A summary found word for word in the previous clip-archive, while its turns
    added words that summary lacks: a small model handed the running summary
    answers with it (docs/memory.md, "A real small model, by hand"). Only a
    verbatim copy: the previous summary with a line saying nothing new happened
    is an honest answer to small talk, and the gate cannot see the earlier turns
    to tell small talk from news."""
    previous = [normalized(m.content) for m in compressed if m.stored_clip_archive]
    if not previous:
        return Passed()
    known = set().union(*(_content_words(text) for text in previous))
    by_id = {m.id: m for m in compressed if not m.stored_clip_archive}
    for stored in plan.new_batches:
        sources = [by_id[i] for i in stored.batch.source_message_ids if i in by_id]
        if stored.batch.depth != 0 or not sources:
            continue
        summary = normalized(split_section(stored.batch.content)[0])
        if len(summary) < MIN_COPY_CHARS or not any(summary in text for text in previous):
            continue
        added = set().union(*(_content_words(_text_of(m)) for m in sources)) - known
        if len(added) >= MIN_UNRELATED_WORDS:
            return Rejected("echo", f"batch {stored.id} repeats the previous summary")
    return Passed()


def _text_of(message: ConversationMessage) -> str:
    """A turn's content with its tool calls' names and arguments."""
    calls = " ".join(f"{c.name} {c.arguments}" for c in message.tool_calls or ())
    return f"{message.content} {calls}" if calls else message.content


def _content_words(text: str) -> set[str]:
    """Words of four letters or more, but the commonest, of the text's first
    ``MAX_SHINGLES`` words (bounded like the shingles). A run of an unspaced
    script gives its character bigrams: a paraphrase in Chinese or Japanese
    shares words with its turns, never whole clauses."""
    found: set[str] = set()
    for word in CONTENT_WORD.findall(text.casefold(), 0, MAX_SHINGLES * 16)[:MAX_SHINGLES]:
        if word.isascii():  # neither script below: the common case, without two matches
            if word not in COMMON_WORDS:
                found.add(word)
        elif IDEOGRAPHIC_START.match(word):
            found.update(
                gram
                for gram in _grams(word, 2)
                if gram not in COMMON_BIGRAMS and not HIRAGANA_ONLY.fullmatch(gram)
            )
        elif ABUGIDA_START.match(word):
            found.update(_grams(word, 4))
        elif word not in COMMON_WORDS:
            found.add(word)
    return found


def _grams(run: str, size: int) -> list[str]:
    return [run[i : i + size] for i in range(len(run) - size + 1)]


def _word_sequence(text: str) -> list[tuple[str, ...]]:
    """The text's word shingles in order (``\\w+`` words), at most ``MAX_SHINGLES``."""
    words = re.findall(r"\w+", text[: MAX_SHINGLES * 16].casefold())[: MAX_SHINGLES + SHINGLE_WORDS]
    return [tuple(words[i : i + SHINGLE_WORDS]) for i in range(len(words) - SHINGLE_WORDS + 1)]


def _word_shingles(texts: Iterable[str]) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for text in texts:
        found.update(_word_sequence(text))
        if len(found) >= MAX_SHINGLES:
            break
    return found


def _shingles(texts: Iterable[str]) -> set[tuple[str, ...]]:
    """Word ``SHINGLE_WORDS``-grams of ``texts``, at most ``MAX_SHINGLES`` (a text of
    fewer words is one shingle)."""
    found: set[tuple[str, ...]] = set()
    for text in texts:
        words = text.casefold().split()
        if 0 < len(words) < SHINGLE_WORDS:
            found.add(tuple(words))
        for start in range(max(0, len(words) - SHINGLE_WORDS + 1)):
            if len(found) >= MAX_SHINGLES:
                return found
            found.add(tuple(words[start : start + SHINGLE_WORDS]))
    return found


def _tool_pairs(
    raw: Sequence[ConversationMessage], kept: Sequence[ConversationMessage]
) -> GateVerdict:
    """Every call compressed has its result compressed with it; no kept turn is
    the other half of a compressed pair."""
    calls = {c.id for m in raw for c in m.tool_calls or ()}
    results = {m.tool_call_id for m in raw if m.role == "tool" and m.tool_call_id}
    kept_calls = {c.id for m in kept for c in m.tool_calls or ()}
    kept_results = {m.tool_call_id for m in kept if m.role == "tool" and m.tool_call_id}
    split = sorted((calls - results) | (results & kept_calls) | (calls & kept_results))
    if split:
        return Rejected("tool_pair_split", f"tool call(s) cut from their result: {split[:5]}")
    return Passed()


def _specifics(plan: CompactionPlan, raw: Sequence[ConversationMessage]) -> GateVerdict:
    """Each new summary of raw turns states, or remembers in its ledger, every
    specific of its turns (the first ``MAX_KEPT`` when there are more).

    A batch that remembers its turns' ranked specifics (``specifics``: what the
    pipeline's ledger carries forward) has kept them by construction; its own
    ranking weighs the turns' importance, so it is not compared with an
    unweighted one here (that comparison refused every compaction of the README's
    sample with the extractive summariser). A batch remembering none must state
    its turns' specifics in its text."""
    by_id = {m.id: m for m in raw}
    for stored in plan.new_batches:
        batch = stored.batch
        sources = [by_id[i] for i in batch.source_message_ids if i in by_id]
        if batch.depth != 0 or not sources or batch.specifics:
            continue
        ranked = rank_specifics(sources)
        kept = {normalized(s.text) for s in (*batch.specifics, *batch.ledger)}
        said = normalized(batch.content)
        lost = [s.text for s in ranked if normalized(s.text) not in kept | {""}]
        lost = [text for text in lost if normalized(text) not in said]
        if lost and len(kept) < min(len(ranked), MAX_KEPT):
            # A count, not the specifics: the detail is stored and published.
            return Rejected("specific_lost", f"{len(lost)} specific(s) of batch {stored.id} lost")
    return Passed()


def _target(plan: CompactionPlan) -> GateVerdict:
    target = plan.target_tokens
    if target is not None and plan.tokens_estimate_after > target:
        return Rejected(
            "over_target",
            f"history after is {plan.tokens_estimate_after} tokens > target {target}",
        )
    return Passed()
