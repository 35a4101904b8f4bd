"""``compactor context``: the context a model would be sent now, as the HTTP view gives it.

With ``--url`` it asks a running worker (``CompactorClient.context``, the token
from ``$COMPACTOR_TOKEN``); without it, it reads PostgreSQL and fits the
context the same way (``streams.worker.turn_context``), the operator's path.
It prints the view's JSON body: ``request`` is what to pass to the provider's
SDK, the rest says how it was made (provisional or not, tokens, watermark).
"""

from __future__ import annotations

import argparse
import sys

from core.ports.storage import ReadScope
from core.settings import Settings
from streams.bootstrap import open_runtime
from streams.cli.errors import CommandError
from streams.cli.read_commands import TOKEN_ENV, client_for
from streams.cli.store_commands import addressed_key, described
from streams.client import ApiError
from streams.metrics import Metrics
from streams.worker.ingest_notices import IngestNotices
from streams.worker.turn_context import (
    ContextRequest,
    NotYet,
    Served,
    TurnContexts,
    Unknown,
)


def add_context_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    context = sub.add_parser(
        "context", help="print the context to send the model now (provider shapes, fitted)"
    )
    context.add_argument("conversation_id")
    context.add_argument("--tenant-id", default=None, help="the conversation's tenant")
    context.add_argument(
        "--format", choices=("messages", "openai", "anthropic"), default="messages"
    )
    context.add_argument("--fit", choices=("budget", "window", "none"), default="budget")
    context.add_argument("--through", help="a message id the context must include")
    context.add_argument("--wait-ms", type=int, default=0, help="how long to wait for --through")
    context.add_argument(
        "--url", help=f"ask this running worker (token from ${TOKEN_ENV}) instead of PostgreSQL"
    )


async def cmd_context(settings: Settings, args: argparse.Namespace) -> int:
    key = addressed_key(args)
    if args.url:
        body = await _from_worker(args)
    else:
        body = await _from_store(settings, args, key)
    if body is None:
        print(f"no messages for conversation {described(key)}", file=sys.stderr)
        return 1
    print(body)
    return 0


async def _from_worker(args: argparse.Namespace) -> str | None:
    try:
        async with client_for(args) as client:
            found = await client.context(
                args.conversation_id,
                tenant_id=args.tenant_id,
                format=args.format,
                fit=args.fit,
                through=args.through,
                wait_ms=args.wait_ms or None,
            )
    except ApiError as error:
        if error.status == 404:
            return None
        raise CommandError(str(error)) from None
    return found.model_dump_json(indent=2)


async def _from_store(settings: Settings, args: argparse.Namespace, key: str) -> str | None:
    asked = ContextRequest(
        key,
        ReadScope.everything(),
        args.format,
        args.fit,
        args.through,
        None,
        args.wait_ms / 1000,
    )
    async with open_runtime(settings) as runtime:
        contexts = TurnContexts(runtime, settings.budget, IngestNotices(), Metrics(), cache_bytes=0)
        answer = await contexts.answer(asked)
    match answer:
        case Served(body=body):
            return body.decode()
        case NotYet():
            raise CommandError(f"{args.through} is not stored (waited {args.wait_ms} ms)")
        case Unknown():
            return None
    raise AssertionError(answer)  # pragma: no cover
