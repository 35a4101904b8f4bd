"""``history``, ``memory-read`` and ``expand``: from PostgreSQL, or from a worker.

With ``--url`` the command asks a running worker through ``streams.client``
(the token from ``$COMPACTOR_TOKEN``), so it reads what a consumer reads and
needs no database access; without it, it reads PostgreSQL directly, the
operator's path. ``--json`` prints the HTTP API's bodies (docs/openapi.json)
either way: a history or a batch with every page read, ``next_cursor`` null.
"""

from __future__ import annotations

import argparse
import os
import sys

from core.domain.messages import ConversationMessage
from core.ports.storage import MatchReason, MemorySearchResult
from core.settings import Settings
from streams.bootstrap import open_runtime
from streams.cli.errors import CommandError
from streams.cli.store_commands import addressed_key, described, render_history
from streams.client import ApiError, CompactorClient
from streams.http.bodies import BatchPage, HistoryPage, SearchResult

TOKEN_ENV = "COMPACTOR_TOKEN"


def add_remote_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help=f"ask this running worker (e.g. http://127.0.0.1:6066; token from ${TOKEN_ENV}) "
        "instead of reading PostgreSQL",
    )
    parser.add_argument("--json", action="store_true", help="print the HTTP API's JSON body")


def client_for(args: argparse.Namespace) -> CompactorClient:
    return CompactorClient(args.url, os.environ.get(TOKEN_ENV) or None)


def _print_json(body: HistoryPage | BatchPage | SearchResult) -> None:
    print(body.model_dump_json(indent=2))


async def _history_from_worker(args: argparse.Namespace) -> HistoryPage | None:
    try:
        async with client_for(args) as client:
            pages = [
                p
                async for p in client.history_pages(args.conversation_id, tenant_id=args.tenant_id)
            ]
    except ApiError as error:
        if error.status == 404:
            return None
        raise CommandError(str(error)) from None
    first = pages[0]
    messages = [m for page in pages for m in page.messages]
    return first.model_copy(update={"messages": messages, "next_cursor": None})


async def cmd_history(settings: Settings, args: argparse.Namespace) -> int:
    key = addressed_key(args)
    if args.url:
        page = await _history_from_worker(args)
    else:
        async with open_runtime(settings) as runtime:
            history = await runtime.history.load_history(key)
        page = HistoryPage.of(key, history, None) if history else None
    if page is None:
        print(f"no messages for conversation {described(key)}", file=sys.stderr)
        return 1
    if args.json:
        _print_json(page)
    else:
        print(render_history(_marked(page)))
    return 0


def _marked(page: HistoryPage) -> list[ConversationMessage]:
    """The page's messages, its clip-archive (the first, when the page has one) marked
    as such, so it renders as the clip-archive."""
    messages: list[ConversationMessage] = list(page.messages)
    if page.clip_archive is not None and messages:
        messages[0] = messages[0].as_clip_archive()
    return messages


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
    if args.url:
        try:
            async with client_for(args) as client:
                result: MemorySearchResult = await client.search(
                    args.query,
                    conversation_id=args.conversation_id,
                    tenant_id=args.tenant_id,
                    limit=args.limit,
                    sources=args.sources,
                    mode=args.mode,
                )
        except ApiError as error:
            raise CommandError(str(error)) from None
    else:
        key = None if args.conversation_id is None else addressed_key(args)
        async with open_runtime(settings) as runtime:
            result = await runtime.memory.memory_read(
                args.query,
                conversation_id=key,
                limit=args.limit,
                sources=args.sources,
                mode=args.mode,
                tenant_id=args.tenant_id,
            )
    served = result if isinstance(result, SearchResult) else SearchResult.of(result)
    if args.json:
        _print_json(served)
        return 0
    print(render_search(served))
    return 0


def _why(matches: tuple[MatchReason, ...]) -> str:
    """``raw_text #1 (7.21: dentist, appointment); raw_vector #4 (0.412)``."""
    parts = []
    for match in matches:
        terms = f": {', '.join(match.terms)}" if match.terms else ""
        parts.append(f"{match.via} #{match.rank} ({match.score:.3g}{terms})")
    return "; ".join(parts) or "its turns"


def _where(conversation_id: str | None, tenant_id: str | None) -> str:
    if conversation_id is None:
        return ""
    return f"{conversation_id!r}" + ("" if tenant_id is None else f" of tenant {tenant_id!r}")


def render_search(result: SearchResult) -> str:
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
            f"{_where(turn.conversation_id, turn.tenant_id)} "
            f"{turn.message_id} (batch {turn.batch_id}{copies})"
        )
        lines.append(f"    {turn.text}")
        lines.append(f"    why: {_why(turn.matches)}")
    for hit in result.hits:
        lines.append(
            f"\n{_where(hit.conversation_id, hit.tenant_id)}  "
            f"{hit.batch_id}  {hit.label}  score={hit.score:.4f}  depth={hit.depth}  "
            f"messages={hit.message_count}  {hit.start_time:%Y-%m-%d %H:%M} → "
            f"{hit.end_time:%Y-%m-%d %H:%M}"
        )
        lines.append(f"why: {_why(hit.matches)}")
        lines.append(hit.content)
        for inner in hit.turns:
            lines.append(
                f"  > [{inner.created_at:%Y-%m-%d %H:%M}] {inner.role} {inner.message_id}:"
            )
            lines.append(f"    {inner.text}")
    if not result.hits:
        lines.append("no matches")
    return "\n".join(lines)


async def _batch_from_worker(args: argparse.Namespace) -> BatchPage | None:
    try:
        async with client_for(args) as client:
            return await client.batch(args.conversation_id, args.batch_id, tenant_id=args.tenant_id)
    except ApiError as error:
        if error.status == 404:
            return None
        raise CommandError(str(error)) from None


async def cmd_expand(settings: Settings, args: argparse.Namespace) -> int:
    key = addressed_key(args)
    if args.url:
        batch = await _batch_from_worker(args)
    else:
        async with open_runtime(settings) as runtime:
            expanded = await runtime.archive.expand_batch(key, args.batch_id)
        batch = None if expanded is None else BatchPage.of(expanded, None)
    if batch is None:
        print(f"no batch {args.batch_id!r} in {described(key)}", file=sys.stderr)
        return 1
    if args.json:
        _print_json(batch)
        return 0
    print(
        f"{batch.batch_id}  depth={batch.depth}  {batch.start_time:%Y-%m-%d %H:%M} → "
        f"{batch.end_time:%Y-%m-%d %H:%M}  {batch.message_count} messages"
    )
    print(batch.summary)
    print()
    print(render_history(list(batch.turns)))
    if batch.turns_missing:
        print(f"({batch.turns_missing} raw turns no longer archived: retention)")
    return 0
