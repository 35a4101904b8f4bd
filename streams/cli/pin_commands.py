"""``compactor pin`` / ``unpin``: an operator keeps a stored message verbatim (or
stops keeping it) without re-sending it (docs/memory.md, "Pinned messages").

Written to PostgreSQL under the conversation's lock, so it survives restarts and
takes effect at the next compaction; a compaction planned before the pin that
would compress the message is refused by the gate (``core.domain.gate``).
"""

from __future__ import annotations

import argparse
from typing import Any

from core.domain.tenancy import conversation_key
from core.settings import Settings
from streams.bootstrap import open_runtime
from streams.cli.errors import CommandError


def add_pin_commands(sub: Any) -> None:
    for name, says in (("pin", "keep a stored message verbatim in every compaction"),
                       ("unpin", "let compactions compress a pinned message again")):  # fmt: skip
        parser = sub.add_parser(name, help=says)
        parser.add_argument("conversation_id")
        parser.add_argument("message_id")
        parser.add_argument("--tenant-id", default=None, help="the conversation's tenant")


async def cmd_pin(settings: Settings, args: argparse.Namespace) -> int:
    pinned = args.command == "pin"
    key = conversation_key(args.tenant_id, args.conversation_id)
    async with open_runtime(settings) as runtime:
        compactions = runtime.store.compactions
        if not await compactions.set_pinned(key, args.message_id, pinned):
            raise CommandError(
                f"conversation {key} has no live message {args.message_id} "
                "(compacted, erased, or never stored)"
            )
        tokens = await compactions.pinned_tokens(key)
    budget = settings.budget.budget_tokens
    print(f"{args.command}ned {args.message_id} in {key}; pinned now {tokens} tokens "
          f"of a {budget}-token budget")  # fmt: skip
    if tokens > budget:
        print("warning: the pinned messages alone exceed the budget; compactions cannot fit it")
    return 0
