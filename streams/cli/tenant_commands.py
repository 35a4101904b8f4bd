"""``compactor tenants``: assign a tenant to a conversation stored before tenants existed.

Conversations stored before migration 0005 have no ``conversations`` row. A
message claiming a tenant for one is dead-lettered (``tenant_unassigned``)
instead of adopting the whole history into whatever tenant it names; an
operator, who knows whose it is, assigns it here:

    compactor tenants list-unassigned
    compactor tenants assign CONVERSATION_ID TENANT
    compactor tenants assign CONVERSATION_ID --none

An assignment is final: a conversation never changes tenant, so assigning
another tenant to one that has one fails (exit 1), and assigning the same
again changes nothing.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from core.ports.storage import TenantConflictError
from core.settings import Settings
from streams.bootstrap import open_runtime
from streams.cli.errors import CommandError
from streams.events import MAX_ID_LENGTH

# MessageEvent.tenant_id's pattern: an assigned tenant is one a message can name.
TENANT_PATTERN = re.compile(r"[A-Za-z0-9._:@-]{1,256}")


def add_tenant_commands(sub: Any) -> None:
    tenants = sub.add_parser(
        "tenants", help="assign tenants to conversations stored before tenants existed"
    )
    tenants_sub = tenants.add_subparsers(dest="tenants_command", required=True)
    assign = tenants_sub.add_parser(
        "assign", help="fix a conversation's tenant (final: a conversation never changes tenant)"
    )
    assign.add_argument("conversation_id")
    which = assign.add_mutually_exclusive_group(required=True)
    which.add_argument("tenant_id", nargs="?", default=None, help="the tenant")
    which.add_argument("--none", action="store_true", help="the conversation has no tenant")
    unassigned = tenants_sub.add_parser(
        "list-unassigned", help="conversations with stored data and no tenant assignment"
    )
    unassigned.add_argument("--limit", type=int, default=1000)


async def cmd_tenants(settings: Settings, args: argparse.Namespace) -> int:
    if args.tenants_command == "assign":
        return await _assign(settings, args.conversation_id, None if args.none else args.tenant_id)
    async with open_runtime(settings) as runtime:
        found = await runtime.store.unassigned_conversations(args.limit)
    for conversation_id in found:
        print(conversation_id)
    if len(found) == args.limit:
        print(f"(the first {args.limit}; --limit for more)")
    return 0


async def _assign(settings: Settings, conversation_id: str, tenant_id: str | None) -> int:
    if not 1 <= len(conversation_id) <= MAX_ID_LENGTH or "\x00" in conversation_id:
        raise CommandError(f"not a conversation id: {conversation_id[:80]!r}")
    if tenant_id is not None and TENANT_PATTERN.fullmatch(tenant_id) is None:
        raise CommandError(
            f"not a tenant id: {tenant_id[:80]!r} (letters, digits, ._:@-, up to 256)"
        )
    async with open_runtime(settings) as runtime:
        try:
            assigned = await runtime.store.assign_tenant(conversation_id, tenant_id)
        except TenantConflictError as error:
            raise CommandError(str(error)) from None
    shown = "no tenant" if tenant_id is None else f"tenant {tenant_id!r}"
    if assigned:
        print(f"conversation {conversation_id!r} assigned to {shown}")
    else:
        print(f"conversation {conversation_id!r} already had {shown}: nothing changed")
    return 0
