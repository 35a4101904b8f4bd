"""Latency of memory_read: one conversation and a whole tenant, alone and concurrent.

Data of the shape the issue replayed (multi-session chats of ~700 archived
turns, each question's evidence compacted): ``bench.memory_recall``'s
generator writes the turns, 10 to a depth-0 batch whose summary is the first
words of each turn (what the extractive summariser keeps). One tenant holds
``--tenant-turns`` archived turns (conversations of ~700); a second tenant
holds as many again, so the tables are twice the searched scope. Rows are
loaded with COPY, then ``memory.rebuild_statistics`` (when the code has it)
computes the BM25 statistics the archive path maintains.

Measured, full text (no embedder), client side, per ``memory_read`` call:

* one conversation: its questions, 1 and 8 searches in parallel, by size;
* tenant-wide (``tenant_id``): the same questions, 1 and 8 in parallel;
* the archive path: ``apply_compaction`` of plans that archive 10 turns
  each (a 10-turn batch), alternately with the BM25 figures kept (as shipped:
  the triggers of migration 0011) and without (the add trigger disabled), on
  the same tables in the same run: the figures' cost on the archive statement;
* the whole compaction path (``--compaction-path N``):
  ``bench.compaction_latency.compaction_cpu`` (``Processor.compact`` of N
  conversations, 16 at a time, real PostgreSQL, LLM test server at 0 ms),
  run alternately with and without the figures kept, three times each (best of 3).

    .venv/bin/python -m bench.memory_latency [--quick] [--explain] [--compaction-path N]
        [--embedding-cost]

``--quick`` loads a 20,000-turn tenant instead of 100,000 (about a minute);
``--explain`` prints EXPLAIN ANALYZE of each list's statement for one
question (``memory.explained_statements``); ``--embedding-cost`` times the
local embedder on a compaction's turns and on a query.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg

from bench.harness import Infra, note, percentile, print_header, quiet_clients, table
from bench.memory_recall import Question, generate
from core.adapters.postgres import memory as pg_memory
from core.adapters.postgres.store import PostgresStore
from core.domain.compaction import CompactionPlan, StoredBatch, SummaryBatch
from core.domain.messages import ConversationMessage
from core.ports.storage import IncomingMessage

TURNS_PER_SESSION = 30
TURNS_PER_BATCH = 10


@dataclass
class Loaded:
    questions: dict[str, list[Question]]  # conversation -> its questions
    sizes: dict[str, int]  # conversation -> archived turns
    tenant_of: dict[str, str]


def _summary(texts: list[str]) -> str:
    return " ".join(" ".join(t.split()[:8]) for t in texts)


async def load(pool: asyncpg.Pool, plan: list[tuple[str, str, int]], seed: int) -> Loaded:
    """Write every (tenant, conversation, turns) of ``plan`` as archived turns and batches."""
    rng = random.Random(seed)
    loaded = Loaded({}, {}, {})
    for tenant, conversation, turns in plan:
        sessions = max(1, turns // TURNS_PER_SESSION)
        chat = generate(conversation, sessions, TURNS_PER_SESSION, rng)
        events = chat.events
        messages: list[tuple[Any, ...]] = []
        batches: list[tuple[Any, ...]] = []
        for start in range(0, len(events), TURNS_PER_BATCH):
            group = events[start : start + TURNS_PER_BATCH]
            batch_id = f"{conversation}:b{start // TURNS_PER_BATCH}"
            compaction = f"{conversation}:c{start // TURNS_PER_BATCH}"
            batches.append(
                (
                    batch_id,
                    f"batch {start // TURNS_PER_BATCH}",
                    conversation,
                    _summary([e.content for e in group]),
                    0,
                    group[0].created_at,
                    group[-1].created_at,
                    len(group),
                    [e.message_id for e in group],
                    compaction,
                )
            )
            for offset, event in enumerate(group):
                messages.append(
                    (
                        conversation,
                        event.message_id,
                        batch_id,
                        compaction,
                        event.role,
                        event.content,
                        event.created_at,
                        max(1, len(event.content) // 4),
                        start + offset,
                        event.created_at + timedelta(days=1),
                    )
                )
        async with pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO conversations (conversation_id, tenant_id) VALUES ($1, $2)",
                conversation,
                tenant,
            )
            await conn.copy_records_to_table(
                "archival_memory",
                records=batches,
                columns=[
                    "id",
                    "label",
                    "conversation_id",
                    "content",
                    "depth",
                    "start_time",
                    "end_time",
                    "message_count",
                    "source_message_ids",
                    "compaction_id",
                ],
            )
            await conn.copy_records_to_table(
                "archived_messages",
                records=messages,
                columns=[
                    "conversation_id",
                    "id",
                    "batch_id",
                    "compaction_id",
                    "role",
                    "content",
                    "created_at",
                    "token_estimate",
                    "seq",
                    "archived_at",
                ],
            )
        loaded.questions[conversation] = chat.questions
        loaded.sizes[conversation] = len(events)
        loaded.tenant_of[conversation] = tenant
    rebuild = getattr(pg_memory, "rebuild_statistics", None)
    if rebuild is not None:
        async with pool.acquire() as conn:
            await rebuild(conn)
    async with pool.acquire() as conn:
        await conn.execute("VACUUM ANALYZE")
    return loaded


async def timed_searches(
    store: PostgresStore,
    questions: list[Question],
    *,
    parallel: int,
    tenant: str | None,
    scoped_to_conversation: bool,
    rounds: int,
    limit_questions: int = 0,
) -> list[float]:
    """Latencies (ms) of every search; ``parallel`` callers each walk the questions."""
    latencies: list[float] = []
    questions = questions[:limit_questions] if limit_questions else questions

    async def caller(offset: int) -> None:
        for i in range(rounds * len(questions)):
            q = questions[(i + offset) % len(questions)]
            began = time.perf_counter()
            await store.memory.memory_read(
                q.text,
                conversation_id=q.conversation_id if scoped_to_conversation else None,
                tenant_id=tenant,
                limit=5,
            )
            latencies.append((time.perf_counter() - began) * 1000)

    await asyncio.gather(*(caller(n * 7) for n in range(parallel)))
    return latencies


def _row(label: str, parallel: int, latencies: list[float]) -> list[Any]:
    return [
        label,
        parallel,
        len(latencies),
        f"{percentile(latencies, 50):.1f}",
        f"{percentile(latencies, 95):.1f}",
        f"{max(latencies):.1f}",
    ]


async def explain(pool: asyncpg.Pool, question: Question, tenant: str) -> None:
    statements = getattr(pg_memory, "explained_statements", None)
    if statements is None:
        print("(this code has no memory.explained_statements)")
        return
    for scope, conversation, tenant_id in (
        ("conversation", question.conversation_id, None),
        ("tenant", None, tenant),
    ):
        async with pool.acquire() as conn:
            for name, sql, args in await statements(
                conn, question.text, conversation_id=conversation, tenant_id=tenant_id
            ):
                rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, *args)
                print(f"\n--- {scope}: {name} ({question.text!r})")
                print("\n".join(r[0] for r in rows))


async def main_async(args: argparse.Namespace) -> None:
    per_conversation = args.conversation_turns
    count = max(1, args.tenant_turns // per_conversation)
    plan = [("big", f"big/conv-{i:03d}", per_conversation) for i in range(count)]
    plan += [("other", f"other/conv-{i:03d}", per_conversation) for i in range(count)]
    plan += [("small", "small/conv-100", 120), ("small", "small/conv-350", 360)]
    with Infra(kafka=False) as infra:
        dsn = await infra.new_database()
        store = await PostgresStore.connect(dsn, run_migrations=False, min_size=2, max_size=10)
        try:
            began = time.perf_counter()
            loaded = await load(store.pool, plan, args.seed)
            total = sum(loaded.sizes.values())
            note(f"loaded {total} archived turns in {time.perf_counter() - began:.0f} s")
            await _measure(store, loaded, args)
            if hasattr(pg_memory, "rebuild_statistics"):
                rows = await archive_path(store, args.archive_rounds, args.seed)
                print()
                print(table(["archive path", "compactions", "median ms"], rows))
            if args.embedding_cost:
                rows = await embedding_cost(args.seed)
                print()
                print(table(["local embedder (numpy MiniLM)", "calls", "ms per call"], rows))
            if args.compaction_path and hasattr(pg_memory, "rebuild_statistics"):
                rows = await compaction_path(infra, args.compaction_path)
                print()
                print(table(["compaction path", "compactions", "best of 3, per s"], rows))
            if args.explain:
                first = loaded.questions["big/conv-000"][0]
                await explain(store.pool, first, "big")
        finally:
            await store.close()


async def _measure(store: PostgresStore, loaded: Loaded, args: argparse.Namespace) -> None:
    rows: list[list[Any]] = []
    big = [c for c in loaded.questions if loaded.tenant_of[c] == "big"]
    tenant_turns = sum(loaded.sizes[c] for c in big)
    # warm-up: one pass of the first conversation's questions
    await timed_searches(
        store, loaded.questions[big[0]], parallel=1, tenant=None,
        scoped_to_conversation=True, rounds=1,
    )  # fmt: skip
    for conversation in ("small/conv-100", "small/conv-350", big[0]):
        questions = loaded.questions[conversation]
        for parallel in (1, 8):
            latencies = await timed_searches(
                store, questions, parallel=parallel, tenant=None,
                scoped_to_conversation=True, rounds=args.rounds,
                limit_questions=args.questions,
            )  # fmt: skip
            rows.append(
                _row(f"conversation, {loaded.sizes[conversation]} turns", parallel, latencies)
            )
    spread = [q for c in big[:8] for q in loaded.questions[c][:6]]
    for parallel in (1, 8):
        latencies = await timed_searches(
            store, spread, parallel=parallel, tenant="big",
            scoped_to_conversation=False, rounds=1, limit_questions=args.questions,
        )  # fmt: skip
        rows.append(_row(f"tenant-wide, {tenant_turns} turns", parallel, latencies))
    print()
    print(table(["scope", "parallel", "searches", "p50 ms", "p95 ms", "max ms"], rows))


def _archive_plan(conversation: str, n: int, messages: list[ConversationMessage]) -> CompactionPlan:
    batch_id = f"{conversation}:ab{n}"
    clip = ConversationMessage(
        id=f"{conversation}:clip{n}",
        conversation_id=conversation,
        role="system",
        content=f"summary {n}",
        created_at=messages[0].created_at,
    ).as_clip_archive()
    batch = SummaryBatch(
        content=_summary([m.content for m in messages]),
        depth=0,
        start_time=messages[0].created_at,
        end_time=messages[-1].created_at,
        message_count=len(messages),
        source_message_ids=tuple(m.id for m in messages),
    )
    return CompactionPlan(
        compaction_id=f"{conversation}:ac{n}",
        conversation_id=conversation,
        new_batches=(
            StoredBatch(
                id=batch_id,
                label=f"b{n}",
                conversation_id=conversation,
                batch=batch,
                compaction_id=f"{conversation}:ac{n}",
            ),
        ),
        deleted_message_ids=tuple(m.id for m in messages)
        + ((f"{conversation}:clip{n - 1}",) if n else ()),
        clip_archive=clip,
        messages_compressed=len(messages),
        tokens_estimate_before=1000,
        tokens_estimate_after=100,
    )


STATS_TRIGGER = "archived_messages_stats_add"


async def keep_figures(pool: Any, on: bool) -> None:
    """Turn the trigger that counts archived turns into the BM25 figures on or off."""
    state = "ENABLE" if on else "DISABLE"
    await pool.execute(f"ALTER TABLE archived_messages {state} TRIGGER {STATS_TRIGGER}")


async def archive_path(store: PostgresStore, rounds: int, seed: int) -> list[Any]:
    """Median ``apply_compaction`` time with and without keeping the figures (same run)."""
    rng = random.Random(seed)
    times: dict[str, list[float]] = {"figures kept": [], "figures not kept": []}
    chat = generate(
        "arch/conv", max(1, rounds * 20 // TURNS_PER_SESSION + 1), TURNS_PER_SESSION, rng
    )
    events = chat.events
    for n in range(rounds * 2):
        variant = "figures kept" if n % 2 == 0 else "figures not kept"
        group = events[n * 10 : n * 10 + 10]
        messages = [
            ConversationMessage(
                id=e.message_id, conversation_id="arch/conv", role=e.role,
                content=e.content, created_at=e.created_at,
            )
            for e in group
        ]  # fmt: skip
        await store.ingest.save_messages([IncomingMessage(m, 20) for m in messages])
        plan = _archive_plan("arch/conv", n, messages)
        await keep_figures(store.pool, variant == "figures kept")
        try:
            began = time.perf_counter()
            await store.compactions.apply_compaction(plan)
            times[variant].append((time.perf_counter() - began) * 1000)
        finally:
            await keep_figures(store.pool, True)
    kept, plain = (sorted(times[k])[len(times[k]) // 2] for k in times)
    return [
        ["apply_compaction, 10 turns, figures kept", len(times["figures kept"]), f"{kept:.2f}"],
        ["apply_compaction, 10 turns, not kept", len(times["figures not kept"]), f"{plain:.2f}"],
        ["ratio kept / not kept", "", f"{kept / plain:.2f}"],
    ]


async def compaction_path(infra: Infra, count: int) -> list[Any]:
    """Compactions per second of the worker's compaction code, with and without
    the figures kept, alternated in one run (``compaction_cpu``'s own databases)."""
    import bench.compaction_latency as latency

    shipped = latency.bench_compactor
    options = argparse.Namespace(cpu_compactions=count, cpu_concurrency=16, messages=20)
    rates: dict[str, list[float]] = {"figures kept": [], "figures not kept": []}
    for variant in ["figures kept", "figures not kept"] * 3:

        async def built(*args: Any, _kept: bool = variant == "figures kept") -> Any:
            model, store, compactor = await shipped(*args)
            await keep_figures(store.pool, _kept)
            return model, store, compactor

        latency.bench_compactor = built  # type: ignore[assignment]
        try:
            done, wall, _ = await latency.compaction_cpu(options, infra)
        finally:
            latency.bench_compactor = shipped
        rates[variant].append(done / wall)
    kept, plain = (max(rates[k]) for k in rates)
    return [
        ["Processor.compact, figures kept", count, f"{kept:.1f}"],
        ["Processor.compact, not kept", count, f"{plain:.1f}"],
        ["ratio kept / not kept (throughput)", "", f"{kept / plain:.2f}"],
    ]


async def embedding_cost(seed: int) -> list[Any]:
    """What the local embedder (all-MiniLM-L6-v2, numpy) costs: a compaction's 10
    turns at once, and one query, wall milliseconds in this process."""
    from core.adapters.embedding.minilm import MiniLMEmbedder

    embedder = MiniLMEmbedder()
    chat = generate("embed/conv", 10, TURNS_PER_SESSION, random.Random(seed))
    texts = [e.content for e in chat.events]
    await embedder.embed(texts[:1])  # load the model
    groups = [texts[i : i + 10] for i in range(0, 200, 10)]
    began = time.perf_counter()
    for group in groups:
        await embedder.embed(group)
    per_group = (time.perf_counter() - began) * 1000 / len(groups)
    questions = [q.text for q in chat.questions][:20]
    began = time.perf_counter()
    for question in questions:
        await embedder.embed([question])
    per_query = (time.perf_counter() - began) * 1000 / len(questions)
    return [
        ["10 turns (one compaction's)", len(groups), f"{per_group:.1f}"],
        ["one query", len(questions), f"{per_query:.1f}"],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 20,000-turn tenant")
    parser.add_argument("--tenant-turns", type=int, default=None)
    parser.add_argument("--conversation-turns", type=int, default=690)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--questions", type=int, default=0, help="at most N per cell")
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--archive-rounds", type=int, default=100, help="compactions per variant")
    parser.add_argument("--compaction-path", type=int, default=0, metavar="N")
    parser.add_argument("--embedding-cost", action="store_true")
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args()
    if args.tenant_turns is None:
        args.tenant_turns = 20_000 if args.quick else 100_000
    quiet_clients()
    print_header("memory_read latency", "bench.memory_latency")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
