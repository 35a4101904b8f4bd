"""Recompact and restore across releases, for ``test_upgrade``: an operator's redo
and undo of compactions the previous release made, sent while one worker of
each release is in the group: this release's worker re-summarises and
restores rows the previous release wrote, and the previous release's worker,
when it has these requests at all, takes this release's. A previous release
without them (0.2.0) would dead-letter them: docs/operations.md ("Upgrading")
says to send none until the rollout is done.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Literal

from aiokafka.partitioner import DefaultPartitioner

from streams.cli.redo import Answer, RequestTimeout, build_request, send_request
from tests.chaos.harness import PARTITIONS, ChaosStack, ChaosWorker, wait_until
from tests.chaos.workload import build_conversations, interleave

Action = Literal["recompact", "restore"]


def partition_of(conversation_id: str) -> int:
    """The messages partition of a conversation (keyed by its id, murmur2)."""
    every = list(range(PARTITIONS))
    return int(DefaultPartitioner()(conversation_id.encode(), every, every))


#: Conversations compacted by the previous release, on each messages partition:
#: a worker owning two partitions or more later owns two of them.
PER_PARTITION = 1


async def compact_with_the_previous_release(stack: ChaosStack) -> list[str]:
    """Conversations outside the replay (the invariants count them all the same), one on
    each partition, sent while only the previous release's workers run and
    compacted by them: what the redo requests work on later."""
    chosen, per_partition = [], Counter[int]()
    for conversation in build_conversations(
        20 * PARTITIONS, prefix=f"{stack.app_id}-redo", seed=44, turns=(30, 30)
    ):
        partition = partition_of(conversation.id)
        if per_partition[partition] < PER_PARTITION:
            chosen.append(conversation)
            per_partition[partition] += 1
    assert len(chosen) == PER_PARTITION * PARTITIONS, per_partition
    stack.add_conversations(chosen)  # counted by the invariants, as the replay's are
    await stack.send_messages(interleave([c.events for c in chosen], seed=45))
    ids = [c.id for c in chosen]

    async def compacted() -> bool:
        count = await stack.db.fetchval(
            # Only the previous release runs yet (and its schema: no summarizer column).
            "SELECT count(DISTINCT conversation_id) FROM compactions "
            "WHERE conversation_id = ANY($1::text[])",
            ids,
        )
        return int(count) == len(ids)

    await wait_until(compacted, timeout=120, what="the redo conversations compacted (old release)")
    return ids


def knows_redo(code_root: Path) -> bool:
    """Does the release in ``code_root`` take recompact and restore requests?
    (0.3.0 added them; a worker of 0.2.0 dead-letters them as events of an
    unknown type, as the compatibility rule of docs/events/README.md says.)"""
    return "class RestoreRequest" in (code_root / "streams" / "events.py").read_text("utf-8")


async def redo_across_releases(
    stack: ChaosStack,
    conversations: list[str],
    workers: dict[str, ChaosWorker],
    releases_with_redo: set[str],
) -> dict[str, str]:
    """For each release's worker (``workers``: by ``"previous"`` / ``"this"``) in
    ``releases_with_redo``, a recompact and a restore of ``conversations`` it owns
    (compacted by the previous release); what each came to, by ``"<action> by
    <release>"``. A request that got no answer in 120 s, or whose compaction is
    not in PostgreSQL exactly once, fails the test."""
    topic = stack.names.messages
    owners = {p: w for w in workers.values() for p in await w.assigned(topic) or set()}
    asked: list[tuple[str, str, Action]] = []
    for release in sorted(releases_with_redo):
        worker = workers[release]
        mine = [c for c in conversations if owners.get(partition_of(c)) is worker]
        for action, conversation_id in zip(("recompact", "restore"), mine, strict=False):
            asked.append((release, conversation_id, action))
    assert len(asked) == 2 * len(releases_with_redo), f"two redo conversations each: {asked}"
    answers = await asyncio.gather(*(_redo(stack, c, a) for _, c, a in asked))
    return {f"{a} by {r}": answer for (r, _, a), answer in zip(asked, answers, strict=True)}


async def _redo(stack: ChaosStack, conversation_id: str, action: Action) -> str:
    request_id = f"{stack.app_id}-upgrade-{action}"
    request = build_request(
        action, conversation_id, tenant_id=None, requester="upgrade-test",
        request_id=request_id, batch_id=None,
    )  # fmt: skip
    try:
        answer = await send_request(
            request,
            bootstrap=stack.bootstrap,
            control_topic=stack.names.control,
            clip_archives_topic=stack.names.clip_archives,
            wait=True,
            wait_seconds=120,
        )
    except RequestTimeout as error:
        raise AssertionError(f"{action} of {conversation_id}: {error}") from None
    return await _outcome(stack, conversation_id, request_id, action, answer)


async def _outcome(
    stack: ChaosStack, conversation_id: str, request_id: str, action: Action, answer: Answer | None
) -> str:
    """What the request came to; its compaction is in PostgreSQL once when applied.
    A restore may find nothing to bring back under the budget (``noop``); a
    recompact of a conversation with a live batch always has work."""
    assert answer is not None
    if answer.event is None:
        assert action == "restore" and answer.noop, f"{action} of {conversation_id}: {answer}"
        return "noop"
    # Its id derives from the request id (and the tally's epoch), whichever release.
    assert answer.event.request_id == request_id, answer.event
    compaction_id = answer.event.compaction_id
    rows = await stack.db.fetchval(
        "SELECT count(*) FROM compactions WHERE compaction_id = $1", compaction_id
    )
    assert rows == 1, f"{action} of {conversation_id}: {rows} compactions rows"
    return f"applied ({len(answer.event.compressed_message_ids)} compressed)"
