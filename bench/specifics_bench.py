"""Does the clip-archive keep the specifics? And what does prompt caching save?

Specifics retention. Generated conversations (tests/support/planted.py) plant
a specific of every kind the ledger knows (amounts, dates and times, URLs,
e-mail addresses, file paths, ticket/order/commit/version ids, code symbols,
quoted strings, names) in one turn of three, mid-sentence among filler. Each
conversation is compacted three times (a round of new turns before each), on
the in-memory store, through the compactor and ``write_plan`` the worker
uses, with ``clip_first = clip_last = 1`` and ``resummarize_buffer = 0`` so
that the batches of round 1 are re-summarised at rounds 2 and 3. Reported:
the share of round 1's planted specifics the clip-archive states right after
round 1 ("after 0") and after round 3 ("after 2 re-summarisations"), with the
ledger off (``specifics_ratio = 0``) and at several ratios; the clip-archive's
tokens (the ledger's cost is the difference to ratio 0); and whether every
compaction met its target (``target_ratio``).

Summarisers: the extractive one, and the LLM test server
(tests/support/llm_server.py) through the OpenAI SDK, whose deterministic
responder keeps the first six words of each turn, the way a summary keeps a
turn's gist and drops its particulars (``gist_responder``: the default one
quotes the fence markers, which the gate refuses).

Prompt caching. The same conversations through the Anthropic adapter against
the test server, which caches system blocks marked ``cache_control`` as the
Messages API does (a prefix of at least 1,024 tokens, warm five minutes) and
answers with its usage fields; reported: billed input tokens (cache reads at
0.1 and writes at 1.25 of an input token, Anthropic's prices) per compressed
token, with caching off and on, with the default prompt and with a long
configured prompt (1,500 words, e.g. a glossary and examples).

    .venv/bin/python -m bench.specifics_bench [--conversations 6 --turns 60]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.harness import print_header, quiet_clients
from core.adapters.llm.anthropic import AnthropicProvider
from core.adapters.llm.extractive import ExtractiveProvider
from core.adapters.llm.openai_compat import OpenAICompatProvider
from core.compaction.factory import create_compactor
from core.domain.budget import BudgetConfig
from core.domain.compaction import CompactionConfig, Planned, StoredTokens
from core.domain.specifics import normalized
from core.domain.tokens import DEFAULT_COUNTER
from core.domain.usage import LlmUsage, billed_input_tokens
from core.ports.model import ModelProvider
from core.ports.storage import Applied
from streams.worker.processor import write_plan
from tests.support.llm_server import LLMTestServer, gist_responder
from tests.support.memory_store import InMemoryStore
from tests.support.planted import Planted, planted_conversation
from tests.support.stores import saved

ROUNDS = 3
KEEP_RECENT = 5
BUDGET = BudgetConfig(model_max_tokens=12_000, context_budget=0.8, target_ratio=0.8)
LONG_PROMPT = " ".join(
    f"Rule {i}: when the conversation mentions the {w} keep its exact value and owner."
    for i, w in enumerate(("invoice ledger harbor falcon meadow quartz signal ember " * 12).split())
)


@dataclass
class Retention:
    after_first: list[float]
    after_resummaries: list[float]
    clip_tokens: list[int]
    over_target: int
    compactions: int
    usage: LlmUsage
    compressed_tokens: int


def _config(ratio: float, prompt: str | None = None) -> CompactionConfig:
    return CompactionConfig(
        chunk_size=30,
        keep_recent=KEEP_RECENT,
        clip_first=1,
        clip_last=1,
        resummarize_buffer=0,
        specifics_ratio=ratio,
        prompt=prompt,
        max_retries=0,
    )


def _share(planted: Sequence[Planted], clip: str) -> float:
    text = normalized(clip)
    return sum(normalized(p.text) in text for p in planted) / max(1, len(planted))


async def run_conversation(
    model: ModelProvider, model_name: str, ratio: float, seed: int, turns: int, prompt: str | None
) -> tuple[float, float, int, int, LlmUsage, int]:
    store = InMemoryStore()
    compactor = create_compactor(
        model=model,
        memory=store.archive,
        config=_config(ratio, prompt),
        model_name=model_name,
        budget=BUDGET,
    )
    first: list[Planted] = []
    shares: list[float] = []
    over = 0
    clip = ""
    usage = LlmUsage()
    compressed = 0
    for round_number in range(ROUNDS):
        made = planted_conversation(seed, turns, start=round_number * turns)
        for message in made.messages:
            await saved(store, message, DEFAULT_COUNTER.count(message.content))
        compaction_id = f"c{seed}-{round_number}"
        inputs = await store.history.compaction_inputs(compaction_id, "planted", up_to_seq=None)
        history = inputs.history
        planned = await compactor.plan(history, "planted", compaction_id=compaction_id)
        assert isinstance(planned, Planned), planned
        plan = planned.plan
        assert plan.clip_archive is not None
        verdict = await write_plan(store.compactions, plan)
        assert verdict == Applied(), verdict
        over += planned.over_target is not None
        clip = plan.clip_archive.content
        compressed += StoredTokens.of(plan, inputs.stored_tokens).removed
        usage = _add(usage, plan.usage)
        if round_number == 0:
            ids = {m.id for m in history if m.id in plan.deleted_message_ids}
            first = [p for p in made.planted if p.message_id in ids]
            shares.append(_share(first, clip))
    shares.append(_share(first, clip))
    return shares[0], shares[1], DEFAULT_COUNTER.count(clip), over, usage, compressed


def _add(a: LlmUsage, b: LlmUsage) -> LlmUsage:
    return a.model_copy(
        update={
            "calls": a.calls + b.calls,
            "input_tokens": a.input_tokens + b.input_tokens,
            "output_tokens": a.output_tokens + b.output_tokens,
            "cache_read_tokens": a.cache_read_tokens + b.cache_read_tokens,
            "cache_write_tokens": a.cache_write_tokens + b.cache_write_tokens,
        }
    )


async def measure(
    model: ModelProvider,
    model_name: str,
    ratio: float,
    conversations: int,
    turns: int,
    prompt: str | None = None,
) -> Retention:
    out = Retention([], [], [], 0, 0, LlmUsage(), 0)
    for seed in range(conversations):
        first, later, tokens, over, usage, compressed = await run_conversation(
            model, model_name, ratio, seed, turns, prompt
        )
        out.after_first.append(first)
        out.after_resummaries.append(later)
        out.clip_tokens.append(tokens)
        out.over_target += over
        out.compactions += ROUNDS
        out.usage = _add(out.usage, usage)
        out.compressed_tokens += compressed
    return out


def _row(name: str, ratio: float, r: Retention, baseline: Retention) -> str:
    tokens = statistics.mean(r.clip_tokens)
    base = statistics.mean(baseline.clip_tokens)
    return (
        f"| {name} | {ratio:g} | {statistics.mean(r.after_first):.2f} | "
        f"{statistics.mean(r.after_resummaries):.2f} | {tokens:.0f} | "
        f"{tokens - base:+.0f} ({(tokens - base) / base:+.0%}) | "
        f"{r.compactions - r.over_target}/{r.compactions} |"
    )


async def retention(args: argparse.Namespace, server: LLMTestServer) -> None:
    summarizers: list[tuple[str, ModelProvider, str]] = [
        ("extractive", ExtractiveProvider(), "extractive"),
        (
            "LLM test server",
            OpenAICompatProvider("test-key", base_url=f"{server.base_url}/v1"),
            "gpt-4o-mini",
        ),
    ]
    print(
        "| summariser | specifics_ratio | after compaction | after 2 re-summarisations | "
        "clip-archive tokens | ledger cost | target met |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, model, model_name in summarizers:
        baseline = await measure(model, model_name, 0.0, args.conversations, args.turns)
        print(_row(name, 0.0, baseline, baseline))
        for ratio in args.ratios:
            measured = await measure(model, model_name, ratio, args.conversations, args.turns)
            print(_row(name, ratio, measured, baseline))


async def caching(args: argparse.Namespace, server: LLMTestServer) -> None:
    print()
    print(
        "| prompt | prompt_caching | calls | input | cache reads | cache writes | "
        "billed input tokens per compressed token |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, prompt in (("default", None), ("1,500 words", LONG_PROMPT)):
        for cached in (False, True):
            server.reset()
            model = AnthropicProvider("test-key", base_url=server.base_url, prompt_caching=cached)
            r = await measure(
                model, "claude-haiku-4-5", 0.25, args.conversations, args.turns, prompt
            )
            await model.aclose()
            u = r.usage
            per = billed_input_tokens(u) / max(1, r.compressed_tokens)
            print(
                f"| {label} | {'on' if cached else 'off'} | {u.calls} | {u.input_tokens} | "
                f"{u.cache_read_tokens} | {u.cache_write_tokens} | {per:.3f} |"
            )


async def main_async(args: argparse.Namespace) -> None:
    quiet_clients()
    async with LLMTestServer(responder=gist_responder) as server:
        await retention(args, server)
        await caching(args, server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=60, help="turns per round (3 rounds)")
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.1, 0.25, 0.5])
    args = parser.parse_args()
    print_header("specifics retention and prompt caching", "bench.specifics_bench")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
