"""What every replacing strategy shares: a message's new content counted as it
will be stored, kept only when it is smaller than the message."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from core.domain.messages import ConversationMessage
from core.domain.strategies import ReplacedMessage, StrategyName
from core.domain.tokens import TokenCounter, estimate_message_tokens


@dataclass(frozen=True)
class Replacing:
    counter: TokenCounter
    before: Mapping[str, int]  # message id → its token estimate now

    def replaced(
        self, message: ConversationMessage, content: str, strategy: StrategyName
    ) -> ReplacedMessage | None:
        """``message`` with ``content`` instead, or None when that is no smaller."""
        shorter = message.model_copy(update={"content": content})
        tokens = estimate_message_tokens(shorter, self.counter)
        if tokens >= self.before[message.id]:
            return None
        return ReplacedMessage(id=message.id, content=content, tokens=tokens, strategy=strategy)

    def freed(self, replaced: ReplacedMessage) -> int:
        return self.before[replaced.id] - replaced.tokens
