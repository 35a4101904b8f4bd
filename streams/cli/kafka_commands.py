"""The Kafka commands: ``topics``, ``replay``, ``tail``, ``erase`` and ``worker``.

Each one checks the broker first (``_kafka``), so a wrong address or a failed
TLS handshake or SASL login is one line, not aiokafka's retries.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from core.settings import ConfigError, Settings
from streams.addresses import configured_bootstrap
from streams.cli.errors import CommandError
from streams.cli.replay import Progress, publish, read_events
from streams.cli.tail import tail
from streams.kafka.admin import ensure_topics
from streams.kafka.probe import broker_problem
from streams.kafka.security import KafkaSecurity, kafka_security
from streams.topics import TopicNames

#: How many invalid lines ``replay`` shows before it only counts them.
SHOWN_BAD_LINES = 20


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    """Synchronous on purpose: Faust runs its own event loop and must own the process."""
    from streams.cli.worker import run_worker  # Faust is heavy; only the worker needs it

    return run_worker(settings, loglevel=args.loglevel)


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
    if transcript.bad and not args.skip_invalid:
        for bad in transcript.bad[:SHOWN_BAD_LINES]:
            print(bad, file=sys.stderr)
        if len(transcript.bad) > SHOWN_BAD_LINES:
            print(f"... and {len(transcript.bad) - SHOWN_BAD_LINES} more", file=sys.stderr)
        raise CommandError(
            f"{path}: {len(transcript.bad)} invalid line(s), nothing published "
            "(--skip-invalid publishes the valid ones)"
        )
    for bad in transcript.bad[:SHOWN_BAD_LINES]:
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
