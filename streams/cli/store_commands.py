"""The PostgreSQL commands: ``migrate``, ``compact``, ``history``, ``memory-read``, ``expand``.

None of them needs Kafka: ``compact`` runs the worker's components in this
process (``streams.cli.offline``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from core.domain.clip_archive import is_clip_archive, parse_clip_archive
from core.domain.messages import ConversationMessage
from core.domain.tenancy import ConversationRef, conversation_key
from core.domain.tokens import estimate_history_tokens
from core.ports.storage import MatchReason, MemorySearchResult, MessageStore
from core.settings import Settings
from streams.bootstrap import open_runtime
from streams.cli.errors import CommandError
from streams.cli.offline import OfflineCompactionError, OfflineRun, conversations_in
from streams.cli.replay import read_events
from streams.worker.processor import CompactionOutcome


def render_history(history: list[ConversationMessage]) -> str:
    out = []
    for message in history:
        if is_clip_archive(message):
            out.append(f"--- clip-archive ({message.id}) ---\n{message.content}\n--- end ---")
            continue
        text = message.content
        for call in message.tool_calls or ():
            text += f"\n  ↳ tool call {call.name}({json.dumps(call.arguments)})"
        out.append(f"[{message.created_at:%H:%M:%S}] {message.role}: {text}")
    return "\n".join(out)


async def cmd_migrate(settings: Settings, _: argparse.Namespace) -> int:
    async with open_runtime(settings) as runtime:
        print(f"schema up to date on {runtime.dsn.split('@')[-1]}")
    return 0


async def cmd_compact(settings: Settings, args: argparse.Namespace) -> int:
    """Load a transcript into PostgreSQL and compact every conversation over budget.

    The transcript goes through the streaming worker's own accounting and
    processor (``streams.cli.offline``), message by message, so a conversation is
    compacted exactly when the worker would compact it.
    """
    transcript = read_events(Path(args.file))
    if transcript.bad:
        raise CommandError("\n".join(str(bad) for bad in transcript.bad[:20]))
    budget = settings.budget
    async with open_runtime(settings) as runtime:
        print(
            f"summariser: {runtime.resolved_model.kind} ({runtime.resolved_model.reason}); "
            f"budget {budget.budget_tokens} tokens "
            f"({budget.context_budget} x {budget.model_max_tokens})"
        )
        counts: dict[str, int] = defaultdict(int)

        def report(conversation_id: str, outcome: CompactionOutcome) -> None:
            counts[conversation_id] += 1
            print(
                f"compaction {counts[conversation_id]} of {conversation_id}: "
                f"{outcome.messages_compressed} messages → {outcome.batches_created} batches, "
                f"{outcome.tokens_before} → {outcome.tokens_after} tokens"
            )

        run = OfflineRun(settings, runtime.store, runtime.compactor, on_compaction=report)
        for conversation_id, events in conversations_in(transcript.events).items():
            try:
                await run.replay(events)
            except OfflineCompactionError as error:
                print(str(error), file=sys.stderr)
                return 1
            await _print_compacted(runtime.store, conversation_id)
    return 0


async def _print_compacted(store: MessageStore, conversation_id: str) -> None:
    history = await store.load_history(conversation_id)
    print(f"\n=== {conversation_id}: history now ({estimate_history_tokens(history)} tokens) ===")
    print(render_history(history))
    if history and is_clip_archive(history[0]):
        parsed = parse_clip_archive(history[0].content)
        print(
            f"\nclip-archive: {parsed.messages_compressed} messages in "
            f"{parsed.total_batches} batches over {parsed.cycles} cycles"
        )


def addressed_key(args: argparse.Namespace) -> str:
    """The conversation key a command's ``conversation_id`` and ``--tenant-id`` name."""
    try:
        return conversation_key(args.tenant_id, args.conversation_id)
    except ValueError as error:
        raise CommandError(f"--tenant-id: {error}") from None


def described(key: str) -> str:
    ref = ConversationRef.of_key(key)
    where = "" if ref.tenant_id is None else f" of tenant {ref.tenant_id!r}"
    return f"{ref.conversation_id!r}{where}"


async def cmd_history(settings: Settings, args: argparse.Namespace) -> int:
    key = addressed_key(args)
    async with open_runtime(settings) as runtime:
        history = await runtime.store.load_history(key)
    if not history:
        print(f"no messages for conversation {described(key)}", file=sys.stderr)
        return 1
    print(render_history(history))
    return 0


async def cmd_memory_read(settings: Settings, args: argparse.Namespace) -> int:
    # The HTTP view's rule: a search is scoped, and a search of everything says so.
    scoped = args.conversation_id is not None or args.tenant_id is not None
    if scoped == args.all:
        print(
            "compactor: memory-read searches --conversation-id C, --tenant-id T (or both), "
            "or --all conversations; give "
            + ("one scope, not --all as well" if scoped else "one of them"),
            file=sys.stderr,
        )
        return 2
    key = None if args.conversation_id is None else addressed_key(args)
    async with open_runtime(settings) as runtime:
        result = await runtime.store.memory_read(
            args.query,
            conversation_id=key,
            limit=args.limit,
            sources=args.sources,
            mode=args.mode,
            tenant_id=args.tenant_id,
        )
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    print(render_search(result))
    return 0


def _why(matches: tuple[MatchReason, ...]) -> str:
    """``raw_text #1 (7.21: dentist, appointment); raw_vector #4 (0.412)``."""
    parts = []
    for match in matches:
        terms = f": {', '.join(match.terms)}" if match.terms else ""
        parts.append(f"{match.via} #{match.rank} ({match.score:.3g}{terms})")
    return "; ".join(parts) or "its turns"


def render_search(result: MemorySearchResult) -> str:
    """The best raw turns of the scope, then the batches, each with why it matched."""
    lines = []
    if result.mode == "full_text":
        lines.append("(full-text search only: no embedder configured)")
    if result.turns:
        lines.append("\nbest turns:")
    for turn in result.turns:
        copies = f", {turn.duplicates} more with the same text" if turn.duplicates else ""
        lines.append(
            f"  [{turn.created_at:%Y-%m-%d %H:%M}] {turn.role} "
            f"{described(turn.conversation_id or '')} "
            f"{turn.message_id} (batch {turn.batch_id}{copies})"
        )
        lines.append(f"    {turn.text}")
        lines.append(f"    why: {_why(turn.matches)}")
    for hit in result.hits:
        lines.append(
            f"\n{described(hit.conversation_id)}  "
            f"{hit.batch_id}  {hit.label}  score={hit.score:.4f}  depth={hit.depth}  "
            f"messages={hit.message_count}  {hit.start_time:%Y-%m-%d %H:%M} → "
            f"{hit.end_time:%Y-%m-%d %H:%M}"
        )
        lines.append(f"why: {_why(hit.matches)}")
        lines.append(hit.content)
        for turn in hit.turns:
            lines.append(f"  > [{turn.created_at:%Y-%m-%d %H:%M}] {turn.role} {turn.message_id}:")
            lines.append(f"    {turn.text}")
    if not result.hits:
        lines.append("no matches")
    return "\n".join(lines)


async def cmd_expand(settings: Settings, args: argparse.Namespace) -> int:
    key = addressed_key(args)
    async with open_runtime(settings) as runtime:
        expanded = await runtime.store.expand_batch(key, args.batch_id)
    if expanded is None:
        print(f"no batch {args.batch_id!r} in {described(key)}", file=sys.stderr)
        return 1
    batch = expanded.batch.batch
    print(
        f"{expanded.batch.id}  depth={batch.depth}  {batch.start_time:%Y-%m-%d %H:%M} → "
        f"{batch.end_time:%Y-%m-%d %H:%M}  {batch.message_count} messages"
    )
    print(batch.content)
    print()
    print(render_history(list(expanded.turns)))
    if expanded.turns_missing:
        print(f"({expanded.turns_missing} raw turns no longer archived: retention)")
    return 0
