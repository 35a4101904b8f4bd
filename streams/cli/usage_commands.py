"""``compactor usage``: what compactions cost, by tenant and UTC day (no Kafka).

Reads the compactions table (migration 0012) as ``GET /tenants/{tenant}/usage``
does, through a ``ReadScope`` (every tenant's, or the one ``--tenant`` names).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from datetime import date
from typing import Any

from core.domain.tenancy import is_tenant_id
from core.domain.usage import UsageDay
from core.ports.storage import ReadScope
from core.settings import Settings
from streams.bootstrap import open_runtime
from streams.cli.errors import CommandError
from streams.cli.read_commands import TOKEN_ENV
from streams.client import ApiError, CompactorClient
from streams.http.usage import parse_since, usage_body, usage_totals

_COLUMNS = (
    ("day", 10),
    ("tenant", 16),
    ("compactions", 11),
    ("calls", 6),
    ("input", 10),
    ("output", 9),
    ("cache read", 10),
    ("cache write", 11),
    ("fallback", 8),
    ("cost USD", 11),
)


def add_usage_command(sub: Any) -> None:
    usage = sub.add_parser(
        "usage", help="LLM calls, tokens and estimated cost of compactions, by tenant and day"
    )
    usage.add_argument("--tenant", default=None, help="one tenant's compactions only")
    usage.add_argument("--since", default=None, help="from this UTC day on (YYYY-MM-DD)")
    usage.add_argument("--json", action="store_true", help="one JSON object")
    usage.add_argument(
        "--url",
        help="ask this running worker (token from $COMPACTOR_TOKEN; needs --tenant) "
        "instead of reading PostgreSQL",
    )


def _line(values: Sequence[object]) -> str:
    return "  ".join(f"{v!s:>{width}}" for v, (_, width) in zip(values, _COLUMNS, strict=True))


def usage_table(days: Sequence[UsageDay]) -> str:
    lines = [_line([name for name, _ in _COLUMNS])]
    for d in days:
        lines.append(
            _line(
                [
                    d.day.isoformat(),
                    d.tenant_id or "(none)",
                    d.compactions,
                    d.llm_calls,
                    d.input_tokens,
                    d.output_tokens,
                    d.cache_read_tokens,
                    d.cache_write_tokens,
                    d.fallback_compactions,
                    f"{d.cost_usd:.4f}",
                ]
            )
        )
    t = usage_totals(days)
    lines.append(
        _line(
            [
                "total",
                "",
                t["compactions"],
                t["llm_calls"],
                t["input_tokens"],
                t["output_tokens"],
                t["cache_read_tokens"],
                t["cache_write_tokens"],
                t["fallback_compactions"],
                f"{t['cost_usd']:.4f}",
            ]
        )
    )
    return "\n".join(lines)


async def _from_worker(args: argparse.Namespace, since: date | None) -> list[UsageDay]:
    """``GET /tenants/{tenant}/usage`` through ``streams.client`` (one tenant a call)."""
    if args.tenant is None:
        raise CommandError("usage --url needs --tenant (the view reads one tenant)")
    try:
        async with CompactorClient(args.url, os.environ.get(TOKEN_ENV) or None) as client:
            report = await client.usage(args.tenant, since=since)
    except ApiError as error:
        raise CommandError(str(error)) from None
    return report.days


async def cmd_usage(settings: Settings, args: argparse.Namespace) -> int:
    if args.tenant is not None and not is_tenant_id(args.tenant):
        raise CommandError(f"--tenant {args.tenant[:80]!r} is not a tenant id")
    try:
        since = parse_since(args.since)
    except ValueError as error:
        raise CommandError(f"--since: {error}") from None
    if getattr(args, "url", None):
        days = await _from_worker(args, since)
    else:
        scope = ReadScope.everything() if args.tenant is None else ReadScope.of_tenant(args.tenant)
        async with open_runtime(settings) as runtime:
            days = await runtime.usage.usage_by_day(scope=scope, tenant_id=args.tenant, since=since)
    if args.json:
        print(json.dumps(usage_body(args.tenant, since, days), indent=2))
    else:
        print(usage_table(days))
    return 0
