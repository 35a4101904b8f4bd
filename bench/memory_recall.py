"""Retrieval benchmark for memory_read: does it find the turn that answers a question?

Generated long multi-session chats (no third-party data) with planted facts:
names, dates, amounts, preferences and changes of mind, among filler (small
talk, photo captions, chatter that mentions the same subjects). Each question's
answer is one known turn (for a change of mind, the later turn). The chats are
replayed through the worker's own accounting and processor in-process on
PostgreSQL (``streams.cli.offline.OfflineRun``, what ``compactor compact`` runs; no
Kafka), so they are compacted many times, then every question whose answering
turn was compacted is asked.

recall@5 per system:
* memory_read (both / summaries / raw): the answering turn is among the raw
  turns returned with the top 5 batches, or the planted answer is in one of
  their summaries (the only way for "summaries").
* BM25 over raw turns: Okapi BM25 (k1 1.2, b 0.75) in Python over the
  conversation's archived raw turns; the answering turn in the top 5.
* random batches: 5 random depth-0 batches; the answering turn among their turns.

Summarisers: the extractive one, and the LLM test server
(tests/support/llm_server.py) replaying fixed summaries (``gist_responder``:
the first six words of each turn, without the fence markers the gate refuses;
with the default responder every LLM summary was refused and the extractive
fallback wrote it) through the OpenAI SDK.

    .venv/bin/python -m bench.memory_recall [--conversations 4 --sessions 12] [--embedder local]

``--embedder local`` runs the same with all-MiniLM-L6-v2 vectors (hybrid
search); the paraphrased columns ask every question with its subject in other
words (``PARAPHRASES``), where keyword search has nothing to go on.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.harness import Infra, print_header, quiet_clients
from core.adapters.llm.extractive import ExtractiveProvider
from core.adapters.llm.openai_compat import OpenAICompatProvider
from core.adapters.postgres.store import PostgresStore
from core.compaction.factory import create_compactor
from core.ports.embedding import Embedder
from core.ports.model import ModelProvider
from core.settings import Settings, parse_settings
from streams.cli.offline import OfflineRun
from streams.events import MessageEvent
from tests.support.llm_server import LLMTestServer, gist_responder

SUBJECTS = (
    "dentist appointment|gym membership|car insurance|garden shed|piano lesson|"
    "tax return|kitchen renovation|wedding venue|team offsite|school trip|book club|"
    "laptop repair|passport renewal|birthday dinner|bike service|flat viewing|"
    "conference talk|vet visit|yoga class|boat rental|choir concert|climbing course|"
    "photo exhibition|roof inspection|language course|camping trip|server migration|"
    "podcast episode|charity run|family reunion"
).split("|")
# The same subjects in other words (no content word shared with any subject):
# questions asked this way are where keyword search has nothing to go on.
PARAPHRASES = {
    "dentist appointment": "checkup for my teeth",
    "gym membership": "fitness centre subscription",
    "car insurance": "policy covering my vehicle",
    "garden shed": "little hut in the backyard",
    "piano lesson": "music tuition at the keyboard",
    "tax return": "annual filing with the revenue office",
    "kitchen renovation": "remodelling of the cooking area",
    "wedding venue": "place where we get married",
    "team offsite": "away day with colleagues",
    "school trip": "excursion with the pupils",
    "book club": "reading circle",
    "laptop repair": "fixing my notebook computer",
    "passport renewal": "getting a new travel document",
    "birthday dinner": "evening meal for my special day",
    "bike service": "bicycle maintenance",
    "flat viewing": "look round the apartment",
    "conference talk": "presentation at the summit",
    "vet visit": "checkup at the animal doctor",
    "yoga class": "stretching and breathing session",
    "boat rental": "hiring a vessel",
    "choir concert": "singing performance",
    "climbing course": "bouldering training",
    "photo exhibition": "picture show at the gallery",
    "roof inspection": "survey of the top of the house",
    "language course": "lessons in a foreign tongue",
    "camping trip": "holiday in a tent",
    "server migration": "moving the machines to the new data centre",
    "podcast episode": "audio show recording",
    "charity run": "fundraising race",
    "family reunion": "gathering with relatives",
}
NAMES = "Margarethe Oskar Ingrid Tobias Leontine Ferdinand Anouk Casimir Rosalind Evander".split()
CITIES = "Lisbon Porto Bergen Utrecht Ghent Trieste Lyon Krakow Tallinn Seville".split()
OPTIONS = "mornings|weekends|the window seat|vegetarian food|email reminders|the blue one".split(
    "|"
)
FILLER = [
    "[photo] a photo of the beach at sunset, photo {n}",
    "[photo] photo of the garden, another photo {n}",
    "haha that's great, thanks!",
    "ok sounds good to me",
    "I keep thinking about the {subject} lately.",
    "Did I mention the {subject}? Still not sure about it.",
    "The weather was lovely today, we went for a long walk.",
    "Let me check my calendar and get back to you.",
    "Can you remind me what we said about the {subject}?",
    "Sure, I noted that down for you.",
]
_TOKEN = re.compile(r"[a-z0-9]+")
_STOP = set(
    "a an the is are was of to in on for my i me what when where who how do does did".split()
)


@dataclass
class Question:
    conversation_id: str
    text: str
    answer_id: str
    answer_value: str

    @property
    def paraphrased(self) -> str:
        """The question with its subject in other words (``PARAPHRASES``)."""
        for subject, other in PARAPHRASES.items():
            if subject in self.text:
                return self.text.replace(subject, other)
        return self.text


@dataclass
class Chat:
    events: list[MessageEvent] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)


def _fact(rng: random.Random, subject: str) -> list[tuple[str, str, str]]:
    """(statement, question, value) turns; two statements for a change of mind."""
    kind = rng.choice(["date", "amount", "name", "preference", "change"])
    if kind == "date":
        value = f"{rng.randint(1, 28)} {rng.choice(['March', 'June', 'October'])}"
        return [(f"The {subject} is booked for {value}.", f"When is the {subject}?", value)]
    if kind == "amount":
        value = f"{rng.randint(20, 990)} euros"
        return [(f"The {subject} costs {value} in total.", f"How much is the {subject}?", value)]
    if kind == "name":
        value = rng.choice(NAMES)
        return [
            (f"{value} is organising the {subject} for us.", f"Who organises the {subject}?", value)
        ]
    if kind == "preference":
        value = rng.choice(OPTIONS)
        return [
            (
                f"For the {subject} I'd rather have {value}.",
                f"What did I want for the {subject}?",
                value,
            )
        ]
    first, later = rng.sample(CITIES, 2)
    return [
        (f"The {subject} will take place in {first}.", "", first),
        (
            f"Change of plan: the {subject} moves to {later}, not {first}.",
            f"Where is the {subject} now?",
            later,
        ),
    ]


def generate(conversation_id: str, sessions: int, turns: int, rng: random.Random) -> Chat:
    chat = Chat()
    subjects = rng.sample(SUBJECTS, len(SUBJECTS))
    start = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)
    pending: list[tuple[str, str, str]] = []
    index = 0
    for session in range(sessions):
        moment = start + timedelta(days=9 * session)
        for turn in range(turns):
            role = "user" if turn % 2 == 0 else "assistant"
            if role == "user" and not pending and rng.random() < 0.25 and subjects:
                pending = _fact(rng, subjects.pop())
                if len(pending) == 2 and rng.random() < 0.5:
                    subjects.append("")  # leave a gap before the change of mind
            if role == "user" and pending and pending[0][0] and rng.random() < 0.6:
                text, question, value = pending.pop(0)
            else:
                text, question, value = (
                    rng.choice(FILLER).format(n=rng.randint(1, 400), subject=rng.choice(SUBJECTS)),
                    "",
                    "",
                )
            subjects = [s for s in subjects if s]
            message_id = f"{conversation_id}-{index:05d}"
            chat.events.append(
                MessageEvent(
                    message_id=message_id,
                    conversation_id=conversation_id,
                    role=role,
                    content=text,
                    created_at=moment + timedelta(minutes=2 * turn),
                )
            )
            if question:
                chat.questions.append(Question(conversation_id, question, message_id, value))
            index += 1
    return chat


def bm25_top(turns: list[tuple[str, str]], query: str, k: int = 5) -> list[str]:
    docs = [(i, [w for w in _TOKEN.findall(t.lower()) if w not in _STOP]) for i, t in turns]
    terms = [w for w in _TOKEN.findall(query.lower()) if w not in _STOP]
    n = len(docs) or 1
    avg = sum(len(d) for _, d in docs) / n or 1
    df = Counter(w for _, d in docs for w in set(d))
    scored = []
    for message_id, words in docs:
        tf = Counter(words)
        score = sum(
            math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            * tf[t]
            * 2.2
            / (tf[t] + 1.2 * (0.25 + 0.75 * len(words) / avg))
            for t in terms
            if tf[t]
        )
        if score > 0:
            scored.append((score, message_id))
    return [m for _, m in sorted(scored, reverse=True)[:k]]


ABLATION = (
    "lexemes, length = distinct lexemes",
    "lexemes, length = words",
    "lexemes, length = words, copies collapsed",
    "Python tokens, copies collapsed",
)
"""Why raw-turn search trailed plain BM25: BM25 in Python over the archived
turns' own tsvectors (English stems, stop words out), with the document
length the old SQL used (distinct lexemes) or the words (``word_count``),
and with turns of the same text counted once (the best-ranked kept)."""


def bm25_ranked(
    docs: list[tuple[str, Counter[str], int]], terms: list[str], texts: dict[str, str] | None
) -> list[str]:
    """Message ids by BM25 over (id, term frequencies, length); ``texts``: collapse copies."""
    n = len(docs) or 1
    avg = sum(length for _, _, length in docs) / n or 1
    df = Counter(t for _, tf, _ in docs for t in tf)
    scored = []
    for message_id, tf, length in docs:
        score = sum(
            math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            * tf[t]
            * 2.2
            / (tf[t] + 1.2 * (0.25 + 0.75 * length / avg))
            for t in terms
            if tf[t]
        )
        if score > 0:
            scored.append((score, message_id))
    ranked = [m for _, m in sorted(scored, reverse=True)]
    if texts is None:
        return ranked
    seen: set[str] = set()
    kept = []
    for message_id in ranked:
        text = " ".join(texts[message_id].lower().split())
        if text not in seen:
            seen.add(text)
            kept.append(message_id)
    return kept


async def ablation(pool: Any, conversation: str, rows: Any, q: Question) -> dict[str, bool]:
    lexemes = await pool.fetch(
        "SELECT a.id, u.lexeme, cardinality(u.positions) AS tf FROM archived_messages AS a, "
        "unnest(a.content_tsv) AS u WHERE a.conversation_id = $1",
        conversation,
    )
    terms = [
        r["lexeme"]
        for r in await pool.fetch("SELECT lexeme FROM unnest(to_tsvector('english', $1))", q.text)
    ]
    tf: dict[str, Counter[str]] = {r["id"]: Counter() for r in rows}
    for r in lexemes:
        tf[r["id"]][r["lexeme"]] = r["tf"]
    texts = {r["id"]: r["content"] for r in rows}
    words = {r["id"]: len(re.findall(r"\w+", r["content"])) for r in rows}
    distinct = [(i, tf[i], len(tf[i])) for i in tf]
    by_words = [(i, tf[i], words[i]) for i in tf]
    counted = {
        i: Counter(w for w in _TOKEN.findall(t.lower()) if w not in _STOP) for i, t in texts.items()
    }
    python = [(i, c, sum(c.values())) for i, c in counted.items()]
    query = [w for w in _TOKEN.findall(q.text.lower()) if w not in _STOP]
    found = {
        ABLATION[0]: bm25_ranked(distinct, terms, None),
        ABLATION[1]: bm25_ranked(by_words, terms, None),
        ABLATION[2]: bm25_ranked(by_words, terms, texts),
        ABLATION[3]: bm25_ranked(python, query, texts),
    }
    return {name: q.answer_id in ranked[:5] for name, ranked in found.items()}


def _settings(chunk_order: str) -> Settings:
    return parse_settings(
        {
            "budget": {"model_max_tokens": 1200, "context_budget": 0.5},
            "summarization": {
                "keep_recent": 6,
                "chunk_size": 10,
                "max_summary_tokens": 160,
                "chunk_order": chunk_order,
                "clip_first": 2,
                "clip_last": 2,
                "resummarize_buffer": 2,
            },
        }
    )


class CachedEmbedder:
    """The runs archive the same turns: each distinct text is embedded once."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.model = inner.model
        self._vectors: dict[str, list[float]] = {}

    async def embed(self, texts: list[str]) -> list[list[float]]:
        todo = sorted({t for t in texts if t not in self._vectors})
        for text, vector in zip(todo, await self.inner.embed(todo), strict=True):
            self._vectors[text] = vector
        return [self._vectors[t] for t in texts]


async def replay(
    dsn: str,
    model: ModelProvider,
    chats: list[Chat],
    chunk_order: str,
    embedder: Embedder | None = None,
) -> PostgresStore:
    settings = _settings(chunk_order)
    store = await PostgresStore.connect(dsn, run_migrations=False, embedder=embedder)
    compactor = create_compactor(
        model=model,
        memory=store.archive,
        config=settings.summarization.compaction(),
        model_name="bench",
        budget=settings.budget,
    )
    run = OfflineRun(settings, store, compactor)
    for chat in chats:
        await run.replay(chat.events)
    return store


SYSTEMS = (
    "memory_read both",
    "memory_read summaries",
    "memory_read raw",
    "BM25 raw turns",
    "random batches",
)
STRICT = (
    "turn: memory_read",
    "turn: memory_read raw",
    "turn: BM25",
    "batch: memory_read",
    "batch: BM25",
    "paraphrased turn: memory_read",
    "paraphrased turn: BM25",
    "paraphrased batch: memory_read",
)
"""Strict recall@5: the answering turn among the first 5 raw turns returned
(``MemorySearchResult.turns``), or its depth-0 batch among the first 5 hits;
BM25 over the raw turns, and over the same batches (a batch's document is the
text of its archived turns)."""


@dataclass
class Score:
    found: Counter[str] = field(default_factory=Counter)
    asked: int = 0
    empty: int = 0
    turns: int = 0
    batches: int = 0
    compactions: int = 0


@dataclass
class Found:
    lenient: bool  # answering turn among the hits' turns, or the answer in a summary
    turn: bool  # answering turn among the first 5 raw turns returned
    batch: bool  # its batch among the first 5 hits
    empty: bool


async def _memory_found(
    store: PostgresStore, q: Question, sources: Any, batch_of: dict[str, str]
) -> Found:
    result = await store.memory.memory_read(
        q.text, conversation_id=q.conversation_id, limit=5, sources=sources
    )
    turns = {t.message_id for hit in result.hits for t in hit.turns}
    in_summary = any(q.answer_value.lower() in hit.content.lower() for hit in result.hits)
    first_turns = [t.message_id for t in getattr(result, "turns", ())]
    if not first_turns:  # a result without its own turn list: the hits' turns in order
        first_turns = [t.message_id for hit in result.hits for t in hit.turns]
    return Found(
        lenient=q.answer_id in turns or in_summary,
        turn=q.answer_id in first_turns[:5],
        batch=batch_of.get(q.answer_id) in {hit.batch_id for hit in result.hits},
        empty=not result.hits,
    )


async def evaluate(store: PostgresStore, chats: list[Chat], rng: random.Random) -> Score:
    score = Score()
    pool = store.pool
    score.compactions = int(await pool.fetchval("SELECT count(*) FROM compactions"))
    score.batches = int(await pool.fetchval("SELECT count(*) FROM archival_memory"))
    score.turns = int(await pool.fetchval("SELECT count(*) FROM archived_messages"))
    for chat in chats:
        if not chat.questions:
            continue
        conversation = chat.questions[0].conversation_id
        rows = await pool.fetch(
            "SELECT id, content, batch_id FROM archived_messages WHERE conversation_id = $1",
            conversation,
        )
        turns = [(r["id"], r["content"]) for r in rows]
        archived = {i for i, _ in turns}
        batch_of = {r["id"]: r["batch_id"] for r in rows}
        batch_text: dict[str, list[str]] = {}
        for r in rows:
            batch_text.setdefault(r["batch_id"], []).append(r["content"])
        batch_docs = [(b, " ".join(texts)) for b, texts in batch_text.items()]
        depth0 = await pool.fetch(
            "SELECT source_message_ids FROM archival_memory WHERE conversation_id = $1 AND depth = 0",
            conversation,
        )
        for q in chat.questions:
            if q.answer_id not in archived:
                continue  # still in the live history: nothing to retrieve
            score.asked += 1
            for system, sources in (("both", "both"), ("summaries", "summaries"), ("raw", "raw")):
                found = await _memory_found(store, q, sources, batch_of)
                score.found[f"memory_read {system}"] += found.lenient
                if system == "both":
                    score.empty += found.empty
                    score.found["turn: memory_read"] += found.turn
                    score.found["batch: memory_read"] += found.batch
                if system == "raw":
                    score.found["turn: memory_read raw"] += found.turn
            other = Question(q.conversation_id, q.paraphrased, q.answer_id, q.answer_value)
            found = await _memory_found(store, other, "both", batch_of)
            score.found["paraphrased turn: memory_read"] += found.turn
            score.found["paraphrased batch: memory_read"] += found.batch
            score.found["paraphrased turn: BM25"] += q.answer_id in bm25_top(turns, other.text)
            for name, hit in (await ablation(pool, conversation, rows, q)).items():
                score.found[name] += hit
            in_bm25 = q.answer_id in bm25_top(turns, q.text)
            score.found["BM25 raw turns"] += in_bm25
            score.found["turn: BM25"] += in_bm25
            score.found["batch: BM25"] += batch_of[q.answer_id] in bm25_top(batch_docs, q.text)
            picked = rng.sample(list(depth0), min(5, len(depth0)))
            score.found["random batches"] += any(
                q.answer_id in r["source_message_ids"] for r in picked
            )
    return score


async def run_one(
    infra: Infra,
    model: ModelProvider,
    chats: list[Chat],
    order: str,
    embedder: Embedder | None = None,
) -> Score:
    store = await replay(await infra.new_database(), model, chats, order, embedder)
    try:
        return await evaluate(store, chats, random.Random(7))
    finally:
        await store.close()


async def main_async(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    chats = [
        generate(f"chat-{i}", args.sessions, args.turns, rng) for i in range(args.conversations)
    ]
    print(
        f"{len(chats)} conversations x {args.sessions} sessions x {args.turns} turns, "
        f"{sum(len(c.questions) for c in chats)} questions planted"
    )
    results: list[tuple[str, Score]] = []
    with Infra(kafka=False) as infra:
        async with LLMTestServer(responder=gist_responder) as server:
            llm = OpenAICompatProvider("bench", base_url=server.openai_base_url)
            runs = [
                ("extractive, importance", ExtractiveProvider(), "importance"),
                ("extractive, chronological", ExtractiveProvider(), "chronological"),
                ("LLM test server, importance", llm, "importance"),
                ("LLM test server, chronological", llm, "chronological"),
            ]
            embedder = None
            if args.embedder == "local":
                from core.adapters.embedding.minilm import MiniLMEmbedder

                embedder = CachedEmbedder(MiniLMEmbedder())
            for label, model, order in runs:
                results.append((label, await run_one(infra, model, chats, order, embedder)))
    print(f"\nembedder: {embedder.model if embedder else 'none (full text only)'}")
    header = (
        "| summariser, chunk_order | questions | "
        + " | ".join(SYSTEMS)
        + " | both / BM25 | empty (both) |"
    )
    print("\n" + header)
    print("|" + " --- |" * (len(SYSTEMS) + 4))
    for label, score in results:
        n = max(score.asked, 1)
        cells = [f"{score.found[s] / n:.2f}" for s in SYSTEMS]
        ratio = score.found["memory_read both"] / max(score.found["BM25 raw turns"], 1)
        print(
            f"| {label} | {score.asked} | "
            + " | ".join(cells)
            + f" | {ratio:.2f} | {score.empty} |"
        )
    print("\n| summariser, chunk_order | " + " | ".join(STRICT) + " | turn ratio | batch ratio |")
    print("|" + " --- |" * (len(STRICT) + 3))
    for label, score in results:
        n = max(score.asked, 1)
        cells = [f"{score.found[s] / n:.3f}" for s in STRICT]
        turn = score.found["turn: memory_read"] / max(score.found["turn: BM25"], 1)
        batch = score.found["batch: memory_read"] / max(score.found["batch: BM25"], 1)
        print(f"| {label} | " + " | ".join(cells) + f" | {turn:.2f} | {batch:.2f} |")
    print("\n| summariser, chunk_order | BM25 (Python) | " + " | ".join(ABLATION) + " |")
    print("|" + " --- |" * (len(ABLATION) + 2))
    for label, score in results:
        n = max(score.asked, 1)
        cells = [f"{score.found[s] / n:.3f}" for s in ("turn: BM25", *ABLATION)]
        print(f"| {label} | " + " | ".join(cells) + " |")
    for label, score in results:
        print(
            f"{label}: {score.compactions} compactions, {score.batches} batches, "
            f"{score.turns} archived raw turns"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--seed", type=int, default=20260301)
    parser.add_argument(
        "--embedder",
        choices=("none", "local"),
        default="none",
        help="local: all-MiniLM-L6-v2 with numpy (hybrid search), embedded once per text",
    )
    args = parser.parse_args()
    quiet_clients()
    print_header("memory_read recall@5", "bench.memory_recall")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
