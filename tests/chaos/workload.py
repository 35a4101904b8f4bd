"""Synthetic conversations for fault injection: many, mixed, with tool calls.

Each conversation is a seeded random walk of user and assistant turns of
~300 characters, some assistant turns calling a tool whose result follows at
once (a call/result pair the compactor must never split). Lengths vary so
that conversations cross the token budget zero, one or two times.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

T = TypeVar("T")

T0 = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)

_WORDS = (
    "deploy pipeline stalled while checking logs after rollback staging cluster metrics "
    "normal until traffic rose database replica lagged cache warmed queue drained retry "
    "budget exceeded alert fired pager owner acknowledged incident timeline customer "
    "report invoice export failed schema migration index rebuilt vacuum latency p99"
).split()
_TOOLS = ("search_logs", "get_metrics", "run_query", "open_ticket")


@dataclass
class Conversation:
    id: str
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ids(self) -> list[str]:
        return [e["message_id"] for e in self.events]

    def _text(self, rng: random.Random, chars: int) -> str:
        words = [f"{self.id} turn {len(self.events)}:"]
        while len(" ".join(words)) < chars:
            words.append(rng.choice(_WORDS))
        return " ".join(words)[:chars]

    def _add(self, rng: random.Random, **fields: Any) -> dict[str, Any]:
        n = len(self.events)
        event: dict[str, Any] = {
            "schema_version": 1,
            "message_id": f"{self.id}-m{n:03d}",
            "conversation_id": self.id,
            "created_at": (T0 + timedelta(seconds=20 * n)).isoformat(),
        }
        event.update(fields)
        self.events.append(event)
        return event

    def grow(self, rng: random.Random, turns: int, chars: int = 300) -> None:
        """Append ``turns`` messages (a tool pair counts as two)."""
        target = len(self.events) + turns
        while len(self.events) < target:
            last_role = self.events[-1]["role"] if self.events else "assistant"
            if last_role in ("assistant", "tool") or not self.events:
                self._add(rng, role="user", content=self._text(rng, chars))
            elif target - len(self.events) >= 2 and rng.random() < 0.3:
                call_id = f"call-{self.id}-{len(self.events)}"
                self._add(
                    rng,
                    role="assistant",
                    content=self._text(rng, chars // 3),
                    tool_calls=[
                        {
                            "id": call_id,
                            "name": rng.choice(_TOOLS),
                            "arguments": {"q": rng.choice(_WORDS)},
                        }
                    ],
                )
                self._add(rng, role="tool", content=self._text(rng, chars), tool_call_id=call_id)
            else:
                self._add(rng, role="assistant", content=self._text(rng, chars))


def build_conversations(
    count: int, *, prefix: str, seed: int, turns: tuple[int, int] = (12, 32)
) -> list[Conversation]:
    rng = random.Random(seed)
    conversations = []
    for i in range(count):
        conversation = Conversation(f"{prefix}{i:04d}")
        conversation.grow(rng, rng.randint(*turns))
        conversations.append(conversation)
    return conversations


def interleave(groups: Sequence[Iterable[T]], seed: int = 0) -> list[T]:
    """All items, each group's in order, groups mixed at random (as production traffic is)."""
    rng = random.Random(seed)
    queues = [list(g) for g in groups]
    positions = [0] * len(queues)
    live = [i for i, q in enumerate(queues) if q]
    out: list[T] = []
    while live:
        slot = rng.randrange(len(live))
        index = live[slot]
        out.append(queues[index][positions[index]])
        positions[index] += 1
        if positions[index] == len(queues[index]):
            live[slot] = live[-1]
            live.pop()
    return out


def tool_pairs(events: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(call message id, result message id) of every tool call and result in one
    conversation, by the rule of ``core.domain.split``: a result names its call's id, or,
    naming none, belongs to the message just before it."""
    owner: dict[str, str] = {}
    for event in events:
        for call in event.get("tool_calls") or ():
            owner.setdefault(str(call["id"]), str(event["message_id"]))
    pairs = []
    for position, event in enumerate(events):
        if event.get("role") != "tool":
            continue
        call_id = event.get("tool_call_id")
        if call_id is not None and call_id in owner:
            pairs.append((owner[call_id], str(event["message_id"])))
        elif call_id is None and position > 0:
            pairs.append((str(events[position - 1]["message_id"]), str(event["message_id"])))
    return pairs
