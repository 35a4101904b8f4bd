"""``offload_oversized``: one message over ``max_message_tokens`` (a tool result,
a user's paste) archived whole and replaced by a preview: its head and tail, the
specifics the ledger finds in it (names, figures, paths: what a summary must
not lose), and a pointer to the archived turn. No LLM call. Done at the next
compaction, not at ingest: the archive is written in the compaction's one
transaction, like every other archived turn.
"""

from __future__ import annotations

from core.compaction.strategies.replacing import Replacing
from core.domain.clip_archive import is_clip_archive
from core.domain.long_text import head_and_tail
from core.domain.messages import ConversationMessage
from core.domain.specifics import mentions_in
from core.domain.strategies import CLEARED_PREFIX, OFFLOADED_PREFIX, ReplacedMessage

History = tuple[ConversationMessage, ...]

PREVIEW_CHARS = 600  # of the head, and of the tail
PREVIEW_SPECIFICS = 20


def preview(message: ConversationMessage) -> str:
    """The specifics come from the turn's head and tail (``head_and_tail``), as the
    ledger's do: a scan of a whole 1,000,000-character log held the GIL up to 65 ms
    per pattern and stalled the worker's event loop (``/livez`` 0.28 s)."""
    content = message.content
    seen: dict[str, None] = {}
    for mention in mentions_in(head_and_tail(content), message.id):
        seen.setdefault(mention.text, None)
        if len(seen) >= PREVIEW_SPECIFICS:
            break
    specifics = "; ".join(seen) or "none found"
    return (
        f"{OFFLOADED_PREFIX} {len(content)} characters archived as turn {message.id} "
        f"(memory_read finds it)]\n"
        f"Head: {content[:PREVIEW_CHARS]}\n…\n"
        f"Tail: {content[-PREVIEW_CHARS:]}\n"
        f"Specifics: {specifics}"
    )


def offload_oversized(
    history: History, max_message_tokens: int, replacing: Replacing
) -> tuple[ReplacedMessage, ...]:
    """Every message over ``max_message_tokens`` but the service's clip-archive and
    the placeholders of earlier compactions."""
    replaced: list[ReplacedMessage] = []
    for message in history:
        if replacing.before[message.id] <= max_message_tokens or is_clip_archive(message):
            continue
        if message.content.startswith((OFFLOADED_PREFIX, CLEARED_PREFIX)):
            continue
        found = replacing.replaced(message, preview(message), "offload_oversized")
        if found is not None:
            replaced.append(found)
    return tuple(replaced)
