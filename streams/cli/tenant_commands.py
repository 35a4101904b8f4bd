"""``compactor tenants assign``: move a conversation without a tenant into one.

A conversation is its tenant and its id (``core.domain.tenancy``): a message
naming a tenant belongs to that tenant's conversation, never to one of the
same id without a tenant, so no message can adopt a history. Conversations
stored before tenants existed are conversations without a tenant (migration
0010). When their producers start naming a tenant, an operator moves each
history into it, so the next message continues it:

    compactor tenants assign CONVERSATION_ID TENANT

The move re-keys every row in one transaction; it is refused when the tenant
has a conversation of that id already (two histories are never merged), and
changes nothing when it was moved before. The owning worker is then asked
(a reconcile request per key on the control topic) to drop the old key's
table entry and count the moved conversation from the store.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from core.domain.tenancy import is_tenant_id
from core.ports.storage import TenantConflictError
from core.settings import ConfigError, Settings
from streams.bootstrap import open_runtime
from streams.cli.errors import CommandError
from streams.cli.kafka_commands import kafka_checked
from streams.events import MAX_ID_LENGTH, ReconcileRequest
from streams.kafka.producers import producer_config
from streams.topics import TopicNames


def add_tenant_commands(sub: Any) -> None:
    tenants = sub.add_parser(
        "tenants", help="move conversations stored without a tenant into their tenant"
    )
    tenants_sub = tenants.add_subparsers(dest="tenants_command", required=True)
    assign = tenants_sub.add_parser(
        "assign",
        help="move a conversation without a tenant into TENANT (its rows, re-keyed, "
        "in one transaction)",
    )
    assign.add_argument("conversation_id")
    assign.add_argument("tenant_id", help="the tenant")


async def cmd_tenants(settings: Settings, args: argparse.Namespace) -> int:
    conversation_id, tenant_id = args.conversation_id, args.tenant_id
    if not 1 <= len(conversation_id) <= MAX_ID_LENGTH or "\x00" in conversation_id:
        raise CommandError(f"not a conversation id: {conversation_id[:80]!r}")
    if not is_tenant_id(tenant_id):
        raise CommandError(
            f"not a tenant id: {tenant_id[:80]!r} (letters, digits, ._:@-, up to 256)"
        )
    async with open_runtime(settings) as runtime:
        try:
            moved = await runtime.privacy.move_to_tenant(conversation_id, tenant_id)
        except TenantConflictError as error:
            raise CommandError(str(error)) from None
    if not moved:
        print(f"conversation {conversation_id!r} is in tenant {tenant_id!r} already")
        return 0
    print(f"conversation {conversation_id!r} moved into tenant {tenant_id!r}")
    await _nudge_worker(settings, conversation_id, tenant_id)
    return 0


async def _nudge_worker(settings: Settings, conversation_id: str, tenant_id: str) -> None:
    """Ask the owning worker to look again at both keys (best effort: without it,
    the old key's table entry lingers until it is reconciled, and the moved
    conversation is counted from the store at its next message)."""
    try:
        bootstrap, security = await kafka_checked(settings)
    except (ConfigError, CommandError) as error:
        print(f"(the workers were not told: {error})")
        return
    topic = TopicNames.with_prefix(settings.kafka.topic_prefix).control
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **producer_config(security.client_kwargs(), client_id="compactor-tenants"),
    )
    try:
        await producer.start()
        for tenant in (None, tenant_id):
            request = ReconcileRequest(
                conversation_id=conversation_id,
                tenant_id=tenant,
                requested_at=datetime.now(UTC),
            )
            await producer.send_and_wait(
                topic, request.model_dump_json().encode(), key=conversation_id.encode()
            )
    except KafkaError as error:
        print(f"(the workers were not told: {error})")
    finally:
        await producer.stop()
