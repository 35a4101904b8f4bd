"""The Kafka commands: ``topics``, ``replay``, ``tail``, ``erase``, ``recompact``,
``restore`` and ``worker``.

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
from streams.cli.replay import Progress, Transcript, publish, read_events
from streams.cli.startup import config_file
from streams.cli.tail import tail
from streams.events import RecompactRequest, RestoreRequest
from streams.kafka.admin import PreparedTopics, prepare_topics
from streams.kafka.probe import broker_problem
from streams.kafka.security import KafkaSecurity, kafka_security
from streams.kafka.topic_drift import topic_drift
from streams.topics import TopicNames

#: How many invalid lines ``replay`` shows before it only counts them.
SHOWN_BAD_LINES = 20


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    """Synchronous on purpose: Faust runs its own event loop and must own the process."""
    from streams.cli.worker import run_worker  # Faust is heavy; only the worker needs it

    return run_worker(settings, loglevel=args.loglevel, config_path=config_file(args.config))


async def kafka_checked(settings: Settings) -> tuple[str, KafkaSecurity]:
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
) -> PreparedTopics:
    return await prepare_topics(bootstrap, settings.kafka, security=security)


async def cmd_topics(settings: Settings, args: argparse.Namespace) -> int:
    """Create missing topics; report (or with --apply-configs, fix) existing topics
    whose cleanup policy, retention, min.insync.replicas or dead-letter size differ
    from the settings, and report a replication factor that differs."""
    bootstrap, security = await kafka_checked(settings)
    prepared = await _ensure_topics(settings, bootstrap, security)
    names = TopicNames.with_prefix(settings.kafka.topic_prefix)
    roles = names.described()
    width = max(len(name) for name in roles)
    for name, role in roles.items():
        print(f"{name:<{width}}  {prepared.counts.get(name, 0)} partitions  {role}")
    replication = prepared.replication
    print(
        f"all co-partitioned on Kafka at {bootstrap}; {replication.factor} replica(s), "
        f"min.insync.replicas {replication.min_insync}"
    )
    apply = bool(getattr(args, "apply_configs", False))
    drift = await topic_drift(bootstrap, settings.kafka, prepared, security=security, apply=apply)
    for topic, keys in drift.configs.items():
        for key, (current, wanted) in keys.items():
            verb = "set" if apply else "differs:"
            print(f"{topic}: {key} {verb} {current} -> {wanted}")
    for topic, (current_replicas, wanted_replicas) in drift.replicas.items():
        print(
            f"{topic}: replication factor differs: {current_replicas} -> {wanted_replicas} "
            "(a partition reassignment, kafka-reassign-partitions; --apply-configs does not "
            "change it)"
        )
    if drift.configs and not apply:
        print("run `compactor topics --apply-configs` to apply the settings", file=sys.stderr)
        return 1
    return 1 if drift.replicas else 0


async def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    """Validate the whole file first, then publish: a bad line publishes nothing."""
    path = Path(args.file)
    if args.rate is not None and args.rate <= 0:
        raise ConfigError(f"--rate must be positive, got {args.rate}")
    transcript = await _valid_events(path, skip_invalid=args.skip_invalid)
    topics = TopicNames.with_prefix(settings.kafka.topic_prefix)
    bootstrap, security = await kafka_checked(settings)
    await _ensure_topics(settings, bootstrap, security)
    progress = Progress(len(transcript.events), sys.stderr)
    result = await publish(
        transcript.events,
        bootstrap=bootstrap,
        topic=topics.messages,
        rate=args.rate,
        progress=progress,
        security=security,
        signing_keys={
            tenant: keys[0].get_secret_value().encode()
            for tenant, keys in settings.tenancy.signing_keys.items()
        },
    )
    skipped = f", skipped {len(transcript.bad)} invalid line(s)" if transcript.bad else ""
    print(
        f"published {result.published} message events to {topics.messages} "
        f"({result.conversations} conversations){skipped}"
    )
    return 0


async def _valid_events(path: Path, *, skip_invalid: bool) -> Transcript:
    """The file's message events; its invalid lines named on stderr, and refused unless
    ``skip_invalid`` (a CommandError: nothing is published)."""
    try:
        transcript = await asyncio.to_thread(read_events, path)
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise CommandError(f"{path}: cannot read: {error}") from None
    if transcript.bad and not skip_invalid:
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
    if not transcript.events:
        raise CommandError(f"{path}: no valid message events, nothing published")
    return transcript


async def cmd_tail(settings: Settings, args: argparse.Namespace) -> int:
    if args.max is not None and args.max < 1:
        raise ConfigError(f"--max must be at least 1, got {args.max}")
    bootstrap, security = await kafka_checked(settings)
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
    """Publish an EraseRequest on the erase-requests topic; with --wait, print its
    completion's counts (exit 3 when none arrives within --timeout)."""
    from streams.cli.erase import EXIT_TIMEOUT, EraseTimeout, send_erase

    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be positive, got {args.timeout}")
    bootstrap, security = await kafka_checked(settings)
    # Never let the broker auto-create the erase topic with another partition count:
    # the request would reach a worker that does not own the conversation.
    await _ensure_topics(settings, bootstrap, security)
    names = TopicNames.with_prefix(settings.kafka.topic_prefix)
    try:
        request, completed = await send_erase(
            args.conversation_id,
            tenant_id=args.tenant_id,
            bootstrap=bootstrap,
            topic=names.erasures,
            messages_topic=names.messages,
            completions_topic=names.erase_completions,
            reason=args.reason,
            requester=args.requester,
            wait=args.wait,
            wait_seconds=args.timeout,
            client_kwargs=security.client_kwargs(),
        )
    except EraseTimeout as error:
        print(f"compactor: {error}; the request stays queued for the worker", file=sys.stderr)
        return EXIT_TIMEOUT
    tenant = "" if args.tenant_id is None else f" of tenant {args.tenant_id!r}"
    print(
        f"erase of {args.conversation_id!r}{tenant} requested on {names.erasures} "
        f"(request {request.request_id}, by {request.requester})"
    )
    if completed is not None:
        counts = ", ".join(f"{table} {count}" for table, count in completed.counts.items())
        print(f"erased at {completed.erased_at.isoformat()} (epoch {completed.epoch}): {counts}")
    return 0


async def cmd_redo(settings: Settings, args: argparse.Namespace) -> int:
    """``recompact`` / ``restore``: a request on the control topic for the owning worker;
    with --wait, what it did (exit 3 when nothing came within --timeout)."""
    from streams.cli.redo import EXIT_TIMEOUT, RequestTimeout, describe, send_request

    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be positive, got {args.timeout}")
    request = _redo_request(args)
    bootstrap, security = await kafka_checked(settings)
    await _ensure_topics(settings, bootstrap, security)  # never auto-created elsewise
    names = TopicNames.with_prefix(settings.kafka.topic_prefix)
    try:
        answer = await send_request(
            request,
            bootstrap=bootstrap,
            control_topic=names.control,
            clip_archives_topic=names.clip_archives,
            wait=args.wait,
            wait_seconds=args.timeout,
            client_kwargs=security.client_kwargs(),
        )
    except RequestTimeout as error:
        print(f"compactor: {error}; the request stays queued for the worker", file=sys.stderr)
        return EXIT_TIMEOUT
    tenant = "" if args.tenant_id is None else f" of tenant {args.tenant_id!r}"
    print(
        f"{args.command} of {args.conversation_id!r}{tenant} requested on {names.control} "
        f"(request {request.request_id}, by {request.requester})"
    )
    if answer is not None:
        print(describe(answer))
    return 0


def _redo_request(args: argparse.Namespace) -> RecompactRequest | RestoreRequest:
    """The recompact or restore request the command line asks for."""
    from streams.cli.erase import default_requester
    from streams.cli.redo import build_request

    return build_request(
        args.command,
        args.conversation_id,
        tenant_id=args.tenant_id,
        requester=args.requester or default_requester(),
        request_id=args.request_id,
        batch_id=getattr(args, "batch", None),
    )
