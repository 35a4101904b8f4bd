"""The PostgreSQL commands: ``migrate`` and ``compact`` (the reads ``history``,
``memory-read`` and ``expand`` are in ``streams.cli.read_commands``).

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
from core.ports.storage import HistoryReader
from core.settings import Settings
from streams.bootstrap import open_runtime
from streams.cli.errors import CommandError
from streams.cli.offline import OfflineCompactionError, OfflineRun, conversations_in
from streams.cli.replay import read_events
from streams.worker.processor import Compacted


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

        def report(conversation_id: str, compacted: Compacted) -> None:
            counts[conversation_id] += 1
            plan = compacted.plan
            print(
                f"compaction {counts[conversation_id]} of {conversation_id}: "
                f"{plan.messages_compressed} messages → {len(plan.new_batches)} batches, "
                f"{plan.tokens_estimate_before} → {plan.tokens_estimate_after} tokens"
            )

        run = OfflineRun(settings, runtime.store, runtime.compactor, on_compaction=report)
        for conversation_id, events in conversations_in(transcript.events).items():
            try:
                await run.replay(events)
            except OfflineCompactionError as error:
                print(str(error), file=sys.stderr)
                return 1
            await _print_compacted(runtime.history, conversation_id)
    return 0


async def _print_compacted(reader: HistoryReader, conversation_id: str) -> None:
    history = await reader.load_history(conversation_id)
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
