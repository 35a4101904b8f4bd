"""A compaction's plan with the strategies in it: the cheap strategies' plan alone
(they brought the history to its target, or ``summarize`` is not configured),
or the summary's plan with the replacements it did not compress away."""

from __future__ import annotations

from dataclasses import replace

from core.compaction.spend import LlmSpend
from core.compaction.strategies import StrategyPass
from core.domain.compaction import CompactionPlan, Planned
from core.domain.messages import ConversationMessage
from core.domain.strategies import StrategyFreed
from core.domain.tokens import TokenCounter, estimate_history_tokens

History = tuple[ConversationMessage, ...]


def strategies_only(
    history: History,
    passed: StrategyPass,
    ids: tuple[str, str],
    calls: LlmSpend,
    counter: TokenCounter,
) -> Planned:
    """Replacements only: no batch, no clip-archive change, no LLM call."""
    conversation_id, compaction_id = ids
    after = estimate_history_tokens(passed.history, counter)
    plan = CompactionPlan(
        compaction_id=compaction_id,
        conversation_id=conversation_id,
        new_batches=(),
        deleted_message_ids=(),
        clip_archive=None,
        messages_compressed=0,
        tokens_estimate_before=estimate_history_tokens(history, counter),
        tokens_estimate_after=after,
        usage=calls.usage(),
        replaced=passed.replaced,
        strategies=passed.freed,
    )
    over = None if passed.at_target else f"the strategies left {after} tokens, over the target"
    return Planned(plan, passed.history, over, calls.input_tokens, calls.output_tokens)


def with_strategies(
    planned: Planned, history: History, passed: StrategyPass, counter: TokenCounter
) -> Planned:
    """``planned`` (summarised from ``passed.history``) with the replacements of the
    messages it keeps live, and what each strategy freed, ``summarize`` last. A
    compressed message's replacement is dropped: the apply archives its stored,
    full content with its batch."""
    plan = planned.plan
    deleted = set(plan.deleted_message_ids)
    before = estimate_history_tokens(history, counter)
    summarised = StrategyFreed(
        strategy="summarize",
        messages=plan.messages_compressed,
        tokens_freed=max(plan.tokens_estimate_before - plan.tokens_estimate_after, 0),
    )
    plan = plan.model_copy(update={
        "replaced": tuple(r for r in passed.replaced if r.id not in deleted),
        "strategies": (*passed.freed, summarised),
        "tokens_estimate_before": before,
    })  # fmt: skip
    return replace(planned, plan=plan)
