"""``clear_tool_results``: tool results older than the last ``keep_last`` replaced
by a short placeholder naming the tool, its call and the archived turn. No LLM
call. The tool message keeps its id, place and ``tool_call_id``, so every call
still has its result (a provider refuses a call without one); the full result is
archived as a raw turn by the apply, where ``memory_read`` and ``expand`` find it.
"""

from __future__ import annotations

from core.compaction.strategies.replacing import Replacing
from core.domain.messages import ConversationMessage
from core.domain.strategies import CLEARED_PREFIX, ClearToolResultsConfig, ReplacedMessage

History = tuple[ConversationMessage, ...]


def placeholder(message: ConversationMessage, tool: str) -> str:
    return (
        f"{CLEARED_PREFIX} tool {tool}, call {message.tool_call_id}; "
        f"the full result is archived as turn {message.id} (memory_read finds it)]"
    )


def tool_names(history: History) -> dict[str, str]:
    """Tool call id → the name of the tool called."""
    return {call.id: call.name for m in history for call in m.tool_calls or ()}


def clear_tool_results(
    history: History, config: ClearToolResultsConfig, replacing: Replacing
) -> tuple[ReplacedMessage, ...]:
    """The tool results to clear, or none when they would free under
    ``min_tokens_freed``. Placeholders already there are left alone."""
    results = [m for m in history if m.role == "tool" and m.tool_call_id]
    older = results[: max(len(results) - config.keep_last, 0)]
    names = tool_names(history)
    replaced: list[ReplacedMessage] = []
    for message in older:
        tool = names.get(message.tool_call_id or "", "unknown")
        if tool in config.exclude_tools or message.content.startswith(CLEARED_PREFIX):
            continue
        found = replacing.replaced(message, placeholder(message, tool), "clear_tool_results")
        if found is not None:
            replaced.append(found)
    freed = sum(replacing.freed(r) for r in replaced)
    if freed < max(config.min_tokens_freed, 1):
        return ()
    return tuple(replaced)
