"""The strategy pipeline against summarise-only (issue 28).

Synthetic sessions on the in-memory store, compacted by the real pipeline and
applied as the worker applies them (``tests.support.compaction``):

- agent sessions: a user's ask, then rounds of a tool call answered by a large
  tool result (~3,000 characters, a word of its own in each: ``needle<i>``),
  and short assistant notes;
- chat sessions: short user and assistant turns (~30 tokens as the LLM test
  server counts them, ~140 characters), no tools.

Each session grows in rounds; a compaction runs whenever it is over its budget.
The model stand-in answers a short summary and counts what the provider would
bill: the request's whole input (system prompt, every message, the directive)
as the LLM test server's tokenizer stand-in counts it, plus its template's
tokens a message (``tests.support.llm_server.request_tokens``). Reported per
kind and mode (``summarize`` alone, or the default ``clear_tool_results,
offload_oversized, summarize``): LLM input tokens per compacted token (tokens
the compactions took off the history), billed input per compressed token (the
same count of the turns the requests carried: the issue's ``<= 1.3`` on chat),
LLM calls per compaction, tokens freed per strategy, and ``memory_read`` recall
of the turns that left the live history or were replaced: the share whose
needle finds that very turn among the raw hits.

    .venv/bin/python -m bench.strategies --quick
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from core.domain.budget import BudgetConfig
from core.domain.compaction import CompactionConfig
from core.domain.messages import ConversationMessage, ToolCall
from core.domain.prompts import SYSTEM_NOTE_PREFIX, TOOL_RESULT_PREFIX, unfenced
from core.domain.strategies import DEFAULT_STRATEGIES, StrategyConfig, StrategyName
from core.domain.tokens import estimate_history_tokens, estimate_message_tokens
from core.ports.model import ModelRequest, ModelResponse
from tests.support.compaction import applying_compactor
from tests.support.llm_server import MESSAGE_OVERHEAD_TOKENS, model_turn_words, stand_in_tokens
from tests.support.memory_store import InMemoryStore
from tests.support.stores import saved

T0 = datetime(2026, 5, 1, tzinfo=UTC)
BUDGET = {"agent": 6000, "chat": 1500}  # tokens: the compaction trigger, and its budget
FILLER = "the service returned rows for the query and the build log shows steps "
CHAT_FILLER = FILLER + "we moved the standup to ten because the client call runs late today " * 2


class CountingModel:
    name = "counting"

    def __init__(self) -> None:
        self.calls = 0
        self.input_tokens = 0
        self.compressed_tokens = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Counts the request as the LLM test server bills it, and the turns it carries
        (the non-system data messages, without fence markers or labels)."""
        self.calls += 1
        texts = [request.system or "", *(m.content for m in request.messages)]
        self.input_tokens += stand_in_tokens(*texts) + MESSAGE_OVERHEAD_TOKENS * len(texts)
        turns = [m.content for m in request.messages if m.role != "system"]
        if request.directive is not None and turns and turns[-1] == request.directive:
            turns.pop()
        self.compressed_tokens += stand_in_tokens(*(_carried(t) for t in turns))
        # It names words of its turns: the gate refuses a summary that shares none
        # (``unrelated``) or that is the previous one word for word, and a
        # constant answer was refused at every compaction (the bench then
        # counted calls and no compaction).
        return ModelResponse(text=f"The agent read {model_turn_words(request)}; all tests passed.")


def _carried(text: str) -> str:
    text = unfenced(text)
    for label in (TOOL_RESULT_PREFIX, SYSTEM_NOTE_PREFIX):
        text = text.removeprefix(label)
    return unfenced(text)


def agent_round(conv: str, n: int) -> list[ConversationMessage]:
    call = ToolCall(id=f"{conv}-call{n}", name="read_file", arguments={"path": f"src/m{n}.py"})
    result = f"needle{conv.replace('-', '')}x{n} " + FILLER * 42
    return [
        _msg(conv, 3 * n, "assistant", "", tool_calls=(call,)),
        _msg(conv, 3 * n + 1, "tool", result, tool_call_id=call.id),
        _msg(conv, 3 * n + 2, "assistant", f"noted file {n}"),
    ]


def chat_round(conv: str, n: int) -> list[ConversationMessage]:
    needle = f"needle{conv.replace('-', '')}x{n}"
    return [
        _msg(conv, 2 * n, "user", f"{needle} " + CHAT_FILLER[:130]),
        _msg(conv, 2 * n + 1, "assistant", CHAT_FILLER[20:160]),
    ]


def _msg(conv: str, i: int, role: str, content: str, **extra: object) -> ConversationMessage:
    return ConversationMessage.model_validate({
        "id": f"{conv}-m{i:05d}", "conversation_id": conv, "role": role, "content": content,
        "created_at": T0 + timedelta(seconds=i), **extra,
    })  # fmt: skip


@dataclass
class Tally:
    llm_input: int = 0
    carried: int = 0
    calls: int = 0
    compactions: int = 0
    compacted: int = 0
    freed: Counter[str] = field(default_factory=Counter)
    found: int = 0
    asked: int = 0


async def session(
    kind: str, conv: str, rounds: int, names: tuple[StrategyName, ...], t: Tally
) -> None:
    store, model = InMemoryStore(), CountingModel()
    config = CompactionConfig(
        keep_recent=4, chunk_size=10, strategies=StrategyConfig(strategies=names)
    )
    limit = BUDGET[kind]
    budget = BudgetConfig(context_budget=1.0, model_max_tokens=limit)
    compactor = applying_compactor(
        store=store, model=model, config=config, model_name="m", budget=budget
    )
    history: list[ConversationMessage] = []
    make = agent_round if kind == "agent" else chat_round
    for n in range(rounds):
        for m in make(conv, n):
            await saved(store, m, estimate_message_tokens(m))
            history.append(m)
        if estimate_history_tokens(history) > limit:
            result = await compactor.compress(history, conv)
            if result.plan is not None:
                t.compactions += 1
                t.compacted += (
                    result.plan.tokens_estimate_before - result.plan.tokens_estimate_after
                )
                for s in result.plan.strategies:
                    t.freed[s.strategy] += s.tokens_freed
            history = list(await store.history.load_history(conv))
    t.llm_input += model.input_tokens
    t.carried += model.compressed_tokens
    t.calls += model.calls
    live = {m.id: m.content for m in history}
    for n in range(rounds):
        needle = f"needle{conv.replace('-', '')}x{n}"
        turn = next(m for m in make(conv, n) if needle in m.content)
        if needle in live.get(turn.id, ""):
            continue  # still live, as it was
        t.asked += 1
        found = await store.memory.memory_read(needle, conversation_id=conv, sources="raw")
        t.found += any(hit.message_id == turn.id for hit in found.turns)


async def run(sessions: int, rounds: int) -> None:
    modes: dict[str, tuple[StrategyName, ...]] = {
        "summarize only": ("summarize",),
        "pipeline": DEFAULT_STRATEGIES,
    }
    print(
        "| sessions | mode | LLM input tokens / compacted token | billed input / compressed "
        "token | LLM calls / compaction | tokens freed per strategy | memory_read recall |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind in ("agent", "chat"):
        for mode, names in modes.items():
            t = Tally()
            for i in range(sessions):
                await session(kind, f"{kind}-{i}", rounds, names, t)
            per = t.llm_input / max(t.compacted, 1)
            billed = f"{t.llm_input / t.carried:.3f}" if t.carried else "-"
            calls = t.calls / max(t.compactions, 1)
            freed = ", ".join(f"{k} {v}" for k, v in t.freed.items()) or "-"
            recall = f"{t.found}/{t.asked}" if t.asked else "-"
            print(f"| {kind} | {mode} | {per:.3f} | {billed} | {calls:.2f} | {freed} | {recall} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 sessions of 40 rounds")
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=120)
    args = parser.parse_args()
    sessions, rounds = (3, 40) if args.quick else (args.sessions, args.rounds)
    asyncio.run(run(sessions, rounds))


if __name__ == "__main__":
    main()
