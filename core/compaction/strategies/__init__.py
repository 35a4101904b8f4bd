"""The cheap strategies, run in the configured order before ``summarize`` (the
LLM pipeline, ``core.compaction.pipeline``), each one module: a new strategy is
a module here, a name in ``core.domain.strategies.StrategyName`` and a case in
``_run_one``. ``run_strategies`` stops once the history is at or under the
target. Pure and text-sized: the pipeline runs it in a planning thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.compaction.strategies.clear_tool_results import clear_tool_results
from core.compaction.strategies.offload_oversized import offload_oversized
from core.compaction.strategies.replacing import Replacing
from core.domain.messages import ConversationMessage
from core.domain.strategies import ReplacedMessage, StrategyConfig, StrategyFreed, StrategyName
from core.domain.tokens import TokenCounter, estimate_message_tokens

History = tuple[ConversationMessage, ...]


@dataclass(frozen=True)
class StrategyPass:
    """The history after the cheap strategies, what they replaced, what each freed,
    and whether the history is now at or under the target (no summary needed)."""

    history: History
    replaced: tuple[ReplacedMessage, ...]
    freed: tuple[StrategyFreed, ...]
    at_target: bool


def run_strategies(
    history: History,
    names: tuple[StrategyName, ...],
    config: StrategyConfig,
    counter: TokenCounter,
    target: int | None,
) -> StrategyPass:
    """``names`` in order (``summarize`` is not run here), stopping at ``target``."""
    replaced: list[ReplacedMessage] = []
    freed: list[StrategyFreed] = []
    for name in names:
        tokens = {m.id: estimate_message_tokens(m, counter) for m in history}
        if target is not None and sum(tokens.values()) <= target:
            return StrategyPass(history, tuple(replaced), tuple(freed), True)
        if name == "summarize":
            break
        replacing = Replacing(counter, tokens)
        found = _run_one(name, history, config, replacing)
        if found:
            replaced.extend(found)
            freed.append(StrategyFreed(
                strategy=name, messages=len(found),
                tokens_freed=sum(replacing.freed(r) for r in found),
            ))  # fmt: skip
            history = with_replacements(history, found)
    total = sum(estimate_message_tokens(m, counter) for m in history)
    at_target = target is not None and total <= target
    return StrategyPass(history, tuple(replaced), tuple(freed), at_target)


def _run_one(
    name: StrategyName, history: History, config: StrategyConfig, replacing: Replacing
) -> tuple[ReplacedMessage, ...]:
    match name:
        case "clear_tool_results":
            return clear_tool_results(history, config.clear_tool_results, replacing)
        case "offload_oversized":
            return offload_oversized(history, config.max_message_tokens, replacing)
        case "summarize":
            return ()


def with_replacements(history: History, replaced: tuple[ReplacedMessage, ...]) -> History:
    """``history`` with the replaced messages' new content (same ids, same places)."""
    new = {r.id: r.content for r in replaced}
    return tuple(m.model_copy(update={"content": new[m.id]}) if m.id in new else m for m in history)
