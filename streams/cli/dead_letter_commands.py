"""``compactor dead-letters list|redrive`` (see ``streams.cli.dead_letters`` and
``streams.cli.redrive``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from core.settings import Settings
from streams.cli.dead_letters import (
    LEDGER_SUFFIX,
    DeadLetter,
    LedgerEntry,
    ensure_ledger,
    plan_redrive,
    read_dead_letters,
    read_ledger,
    selected,
    since_time,
)
from streams.cli.errors import CommandError
from streams.cli.kafka_commands import kafka_checked
from streams.cli.redrive import Redriver
from streams.topics import TopicNames

_Subparsers = Any  # argparse's _SubParsersAction, private


def add_dead_letter_commands(sub: _Subparsers) -> None:
    parser = sub.add_parser(
        "dead-letters", help="list dead letters, or re-drive them to their source topic"
    )
    inner = parser.add_subparsers(dest="dead_letters_command", required=True)
    listing = inner.add_parser("list", help="the dead letters, oldest first per partition")
    redrive = inner.add_parser(
        "redrive",
        help="re-publish dead letters of the messages topic to it with their key and "
        "headers, once each (a ledger topic remembers; safe to repeat after an "
        "interruption); dead letters of any other topic are refused",
    )
    for command in (listing, redrive):
        command.add_argument(
            "--reason", help="only this error type (invalid_event, …) or reason text"
        )
        command.add_argument(
            "--since", help="only dead-lettered at or after: ISO 8601 time, or an age (6h, 2d)"
        )
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    redrive.add_argument("--dry-run", action="store_true", help="say what would be re-driven")


def ledger_topic(settings: Settings) -> str:
    return f"{settings.kafka.topic_prefix}{LEDGER_SUFFIX}"


async def cmd_dead_letters(settings: Settings, args: argparse.Namespace) -> int:
    try:
        since = None if args.since is None else since_time(args.since)
    except ValueError as error:
        raise CommandError(str(error)) from None
    bootstrap, security = await kafka_checked(settings)
    names = TopicNames.with_prefix(settings.kafka.topic_prefix)
    letters, unreadable = await read_dead_letters(bootstrap, names.dead_letters, security)
    chosen = selected(letters, args.reason, since)
    ledger = await read_ledger(bootstrap, ledger_topic(settings), security)
    if unreadable:
        print(f"({unreadable} records of {names.dead_letters} have no dlq.* headers: skipped)")
    if args.dead_letters_command == "list":
        _print_list(chosen, ledger, args.json, names.messages)
        return 0
    return await _redrive(settings, args, chosen, ledger, (bootstrap, security))


def _print_list(
    letters: Sequence[DeadLetter],
    ledger: dict[str, LedgerEntry],
    as_json: bool,
    messages_topic: str,
) -> None:
    for letter in letters:
        entry = ledger.get(letter.source)
        redriven = None if entry is None else {"state": entry.state, "at": entry.at}
        refused = letter.unsendable(messages_topic)
        if as_json:
            print(
                json.dumps({**letter.describe(), "redriven": redriven, "not_redrivable": refused})
            )
            continue
        mark = "" if entry is None else f"  [re-driven: {entry.state} {entry.at}]"
        mark += "" if refused is None else f"  [not re-drivable: {refused}]"
        print(
            f"{letter.meta.failed_at:%Y-%m-%d %H:%M:%S}  {letter.source}  "
            f"{letter.meta.error_type}  {letter.meta.reason}{mark}"
        )
    if not as_json:
        print(f"{len(letters)} dead letters")


async def _redrive(
    settings: Settings,
    args: argparse.Namespace,
    letters: Sequence[DeadLetter],
    ledger: dict[str, LedgerEntry],
    kafka: tuple[str, Any],
) -> int:
    bootstrap, security = kafka
    messages = TopicNames.with_prefix(settings.kafka.topic_prefix).messages
    plan = plan_redrive(letters, ledger, messages)
    for letter, why in plan.unsendable:
        print(f"not re-driven: {letter.source}: {why}")
    if args.dry_run:
        for letter in plan.send:
            print(f"would re-drive {letter.source} ({letter.meta.error_type})")
        for letter, _ in plan.check:
            print(f"would check {letter.source} (an interrupted re-drive), then send if needed")
        print(
            f"dry run: {len(plan.send) + len(plan.check)} to re-drive, "
            f"{len(plan.done)} re-driven before, {len(plan.unsendable)} not re-drivable"
        )
        return 0
    await ensure_ledger(bootstrap, ledger_topic(settings), settings.kafka, security)

    async def progress(step: str, chunk: Sequence[DeadLetter]) -> None:
        if step == "done":
            for letter in chunk:
                print(f"re-driven {letter.source}", flush=True)

    result = await Redriver(bootstrap, ledger_topic(settings), security, progress).run(plan)
    for letter in result.found_sent:
        print(f"re-driven {letter.source} (by an interrupted run; recorded now)")
    print(
        f"{len(result.sent)} re-driven, {len(result.found_sent)} found re-driven by an "
        f"interrupted run, {len(result.done_before)} re-driven before, "
        f"{len(result.unsendable)} not re-drivable"
    )
    return 0
