"""Scenario: a rolling upgrade from the previous release while a replay flows.

The previous release is the second entry of CHANGELOG.md; its commit is
checked out as a git worktree (``git worktree add --detach``) and its workers
run from that tree with this checkout's ``.venv``. The upgrade goes as
docs/operations.md ("Upgrading") tells an operator:

1. a database migrated by the previous release, two of its workers;
2. this release's migrations applied while they run (``migrate``, the
   runner behind ``compactor migrate``);
3. the workers replaced one at a time (SIGTERM, then a worker of this
   release), with one old worker SIGKILLed in between, as a pod of the old
   release may crash mid-rollout: it restarts as the old release and takes
   back partitions whose table entries a new worker wrote.

The producer keeps sending throughout. Invariants as every chaos scenario
(0 lost, 0 duplicated, budgets met, tallies equal PostgreSQL), plus: both
releases compacted (old rows have no summariser, new ones do), the BM25
figures that 0011's triggers keep for the old workers' turns equal a rebuild,
and, with one worker of each release in the group: reads forwarded both ways,
an erase, and a recompact and a restore by each release of compactions the
previous release made (``tests/chaos/upgrade_redo.py``).

A missing commit (a shallow clone) fails the test with what to do; it never
skips: an upgrade that was not tried is not known to work.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from core.adapters.postgres.migrate import load_migrations, migrate
from streams.events import EraseRequest
from tests.chaos.harness import (
    SCALE,
    ChaosStack,
    ChaosWorker,
    MakeStack,
    wait_until,
)
from tests.chaos.upgrade_redo import (
    compact_with_the_previous_release,
    knows_redo,
    partition_of,
    redo_across_releases,
)
from tests.chaos.workload import build_conversations, interleave
from tests.support.chaos_llm import ChaosLLMServer
from tests.support.releases import Release, previous_release
from tests.support.worker import REPO_ROOT

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(SCALE.timeout)]

# Config keys this release added that the previous release rejects (a config
# file follows its image; docs/operations.md, "Upgrading").
NEW_CONFIG_KEYS = {"kafka": ["min_insync_replicas"], "summarization": ["min_chunk_tokens"]}

# The migrations the previous release ends with; the ones after it are this
# release's, applied while the old workers run.
_MIGRATE_SCRIPT = """\
import asyncio, sys
from core.adapters.postgres.migrate import migrate
print(" ".join(asyncio.run(migrate(sys.argv[1]))))
"""


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False
    )


@contextmanager
def release_tree(release: Release, parent: Path) -> Iterator[Path]:
    """The release's commit checked out (detached) in a worktree under ``parent``."""
    assert release.commit is not None
    if _git("cat-file", "-e", f"{release.commit}^{{commit}}").returncode != 0:
        raise AssertionError(
            f"release {release.version}'s commit {release.commit} (CHANGELOG.md) is not in "
            f"this clone's history; the upgrade test needs it: `git fetch --unshallow` "
            f"(or a full `git clone`)"
        )
    path = parent / f"release-{release.version}"
    added = _git("worktree", "add", "--detach", str(path), release.commit)
    if added.returncode != 0:
        raise AssertionError(f"git worktree add {path} {release.commit}: {added.stderr}")
    try:
        yield path
    finally:
        _git("worktree", "remove", "--force", str(path))
        _git("worktree", "prune")


def migrate_with(code_root: Path, dsn: str) -> list[str]:
    """Migrate ``dsn`` with the migrations of the release at ``code_root``."""
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    done = subprocess.run(
        [sys.executable, "-c", _MIGRATE_SCRIPT, dsn],
        cwd=code_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"migrate with {code_root}: {done.stderr[-2000:]}")
    return done.stdout.split()


async def compactions_by_release(db: asyncpg.Pool) -> tuple[int, int]:
    """(by the previous release, by this one): only this one records its summariser."""
    row = await db.fetchrow(
        "SELECT count(*) FILTER (WHERE summarizer IS NULL) AS old,"
        "       count(*) FILTER (WHERE summarizer IS NOT NULL) AS new FROM compactions"
    )
    assert row is not None
    return int(row["old"]), int(row["new"])


async def bm25_figures_off(db: asyncpg.Pool | asyncpg.Connection) -> int:
    """Conversations whose kept BM25 figures (0011's triggers) differ from a rebuild."""
    return int(
        await db.fetchval(
            """
            WITH rebuilt AS (
                SELECT conversation_id, count(*) AS turns, sum(word_count) AS words
                  FROM archived_messages GROUP BY conversation_id
            )
            SELECT count(*) FROM rebuilt
              FULL JOIN archived_turn_stats AS kept USING (conversation_id)
             WHERE kept.turns IS DISTINCT FROM rebuilt.turns
                OR kept.words IS DISTINCT FROM rebuilt.words
            """
        )
    )


async def produced_at_least(stack: ChaosStack, replay: asyncio.Task[None], count: int) -> None:
    async def reached() -> bool:
        if replay.done():
            replay.result()  # a failed replay fails here, not at a timeout
            return True
        return len(stack.produced) >= count

    await wait_until(reached, timeout=300, what=f"{count} events produced")


async def test_rolling_upgrade_from_the_previous_release_during_replay(
    make_stack: MakeStack,
    kafka_bootstrap: str,
    pg_empty_database: str,
    chaos_llm: ChaosLLMServer,
    tmp_path: Path,
) -> None:
    release = previous_release()
    with release_tree(release, tmp_path) as old_code:
        chaos_llm.latency = (0.1, 0.4)
        previous = migrate_with(old_code, pg_empty_database)
        ours = [m.version for m in load_migrations()]
        newer = [v for v in ours if v not in previous]
        assert previous and newer, f"{release.version} applied {previous}; this release: {ours}"

        stack = await make_stack("upgrade", kafka_bootstrap, pg_empty_database)
        stack.notes["from_release"] = release.version
        old = [stack.worker(f"old{i}", code_root=old_code, omit=NEW_CONFIG_KEYS) for i in (1, 2)]
        await stack.wait_for_group()
        conversations = build_conversations(
            SCALE.conversations, prefix=f"{stack.app_id}-c", seed=41
        )
        stack.add_conversations(conversations)
        erased = await store_with_the_previous_release(stack)
        redo = await compact_with_the_previous_release(stack)
        events = interleave([c.events for c in conversations], seed=42)
        # The last seventh is held back until the restarted old worker is in the
        # group, so it has traffic to read (however slow the machine made the steps).
        step = len(events) // 7
        main, tail = events[: 6 * step], events[6 * step :]
        old_back = asyncio.Event()
        seconds = SCALE.upgrade_replay_seconds

        async def produce() -> None:
            await stack.replay(main, seconds * 6 / 7)
            await old_back.wait()
            await stack.replay(tail, seconds / 7)

        window_start = time.monotonic()
        replay = asyncio.create_task(produce())

        # 1. Old workers only, then this release's migrations under them.
        await produced_at_least(stack, replay, step)
        applied = await migrate(stack.dsn)
        stack.faults["migrations_under_old_workers"] = len(applied)
        stack.notes["migrations_applied"] = applied

        # 2. One old worker replaced. The other crashes and stays down until the new
        #    worker owns every partition and has counted messages in them, then comes
        #    back (old code) to table entries the new worker wrote, and compacts.
        await produced_at_least(stack, replay, 2 * step)
        new1 = await replace(stack, old[0], "new1")
        crossed = await reads_across_releases(stack, old[1], new1)
        stack.notes["forwarded_reads"] = crossed
        stack.notes["erased_by"] = await erase_across_releases(stack, erased, old[1], new1)
        stack.notes["redone"] = await redo_across_releases(
            stack,
            redo,
            {"previous": old[1], "this": new1},
            {"this", "previous"} if knows_redo(old_code) else {"this"},
        )
        await produced_at_least(stack, replay, 3 * step)
        old[1].expected_alive = False
        old[1].sigkill()
        stack.faults["old_worker_sigkill"] += 1
        await stack.wait_for_group(timeout=120)
        await produced_at_least(stack, replay, 4 * step)
        compacted_before, _ = await compactions_by_release(stack.db)
        old[1].expected_alive = True
        old[1].restart()
        await stack.wait_for_group(timeout=120)
        old_back.set()

        async def old_release_compacting() -> bool:
            return (await compactions_by_release(stack.db))[0] > compacted_before

        try:
            await wait_until(old_release_compacting, timeout=90, what="old worker compacting")
            old_compacted_again = True
        except AssertionError:  # the invariants below say why (dead letters, lag…)
            old_compacted_again = False
        await produced_at_least(stack, replay, 6 * step + len(tail) // 2)

        # 3. The last old worker replaced.
        await replace(stack, old[1], "new2")
        await replay
        fault_end = time.monotonic()
        by_old, by_new = await compactions_by_release(stack.db)
        stack.notes["compactions_by_release"] = {release.version: by_old, "this": by_new}
        await stack.finish(
            fault_end,
            fault_window=fault_end - window_start,
            checks=[
                (applied == newer, f"migrations applied under old workers: {applied}, {newer}"),
                (by_old > 0, f"the previous release made no compaction ({by_old})"),
                (old_compacted_again, "the restarted old worker made no compaction in 90 s"),
                (by_new > 0, f"this release made no compaction ({by_new})"),
                (
                    all(v >= 1 for v in crossed.values()),
                    f"reads forwarded across the releases: {crossed}",
                ),
                (
                    (off := await bm25_figures_off(stack.db)) == 0,
                    f"{off} conversations' BM25 figures differ from a rebuild",
                ),
            ],
        )


ERASED_TURNS = 4


async def store_with_the_previous_release(stack: ChaosStack) -> tuple[str, dict[int, int]]:
    """A conversation outside the replay (the invariants do not count it),
    stored by the previous release's workers: the one the test erases; with
    the messages topic's offsets after its messages (the erase's
    ``messages_end_offsets``, as `compactor erase` sends them)."""
    end_offsets: dict[int, int] = {}
    (conversation,) = build_conversations(
        1, prefix=f"{stack.app_id}-erased", seed=43, turns=(ERASED_TURNS, ERASED_TURNS)
    )
    for event in conversation.events[:ERASED_TURNS]:
        partition, offset = await stack.producer.send(
            stack.names.messages, json.dumps(event).encode(), key=conversation.id.encode()
        )
        end_offsets[partition] = offset + 1

    async def stored() -> bool:
        count = await stack.db.fetchval(
            "SELECT count(*) FROM messages WHERE conversation_id = $1", conversation.id
        )
        return int(count) >= ERASED_TURNS

    await wait_until(stored, timeout=90, what=f"{conversation.id} stored by the old workers")
    return conversation.id, end_offsets


async def erase_across_releases(
    stack: ChaosStack, erased: tuple[str, dict[int, int]], old: ChaosWorker, new: ChaosWorker
) -> str:
    """Erase a conversation the previous release stored, with one worker of each
    release in the group; which release's worker erased it (its partition's owner).

    Effective on both: its rows are gone, the erase mark is set, and both
    workers answer 404 for it (the one that does not own it forwards the read).
    """
    conversation_id, end_offsets = erased
    request = EraseRequest(
        messages_end_offsets=end_offsets,
        request_id=f"{stack.app_id}-upgrade-erase",
        conversation_id=conversation_id,
        requester="upgrade-test",
        reason="erase during a rolling upgrade",
        requested_at=datetime.now(UTC),
    )
    await stack.producer.send(
        stack.names.erasures, request.model_dump_json().encode(), key=conversation_id.encode()
    )

    async def gone() -> bool:
        row = await stack.db.fetchrow(
            "SELECT (SELECT count(*) FROM messages WHERE conversation_id = $1) AS messages,"
            "       (SELECT count(*) FROM compactions WHERE conversation_id = $1) AS compactions,"
            "       (SELECT count(*) FROM erasures WHERE conversation_id = $1) AS marks",
            conversation_id,
        )
        assert row is not None
        if (row["messages"], row["compactions"], row["marks"]) != (0, 0, 1):
            return False
        statuses = [(await w.get(f"/conversations/{conversation_id}"))[0] for w in (old, new)]
        return statuses == [404, 404]

    await wait_until(gone, timeout=90, what=f"{conversation_id} erased, on both releases")
    erasures_owner = (
        new
        if partition_of(conversation_id) in (await new.assigned(stack.names.messages) or set())
        else old
    )
    return "this" if erasures_owner is new else "previous"


async def replace(stack: ChaosStack, old: ChaosWorker, name: str) -> ChaosWorker:
    """A rolling update's step: SIGTERM the old worker, start one of this release."""
    old.expected_alive = False
    await old.stop_async()
    new = stack.worker(name)
    stack.faults["replaced"] += 1
    await stack.wait_for_group(timeout=120)
    return new


async def reads_across_releases(
    stack: ChaosStack, old: ChaosWorker, new: ChaosWorker
) -> dict[str, int]:
    """Conversations read from the worker of the other release than their owner's.

    The entry worker forwards the request to the owner (the table's partition),
    signing the caller's principal: a previous-release worker must accept this
    release's forwarded request and the reverse, or reads fail mid-rollout.
    Each conversation with stored messages answers 200 with its own id, from
    both workers; the counts are the reads that crossed, each way (the owner
    from the messages partition, as the table is partitioned).
    """

    async def both_ready() -> bool:  # tables recovered: what /readyz means to a balancer
        return all([(await w.get("/readyz"))[0] == 200 for w in (old, new)])

    await wait_until(both_ready, timeout=120, what="both releases' workers ready")
    topic = stack.names.messages
    owned = {p: w for w in (old, new) for p in await w.assigned(topic) or set()}
    stored = [
        str(row["conversation_id"])
        for row in await stack.db.fetch(
            "SELECT DISTINCT conversation_id FROM messages ORDER BY conversation_id LIMIT 24"
        )
    ]
    crossed = {"previous->this": 0, "this->previous": 0}
    for conversation_id in stored:
        owner = owned.get(partition_of(conversation_id))
        for entry in (old, new):
            await read_answers(entry, conversation_id, owner)
        if owner is not None:
            crossed["this->previous" if owner is old else "previous->this"] += 1
    return crossed


async def read_answers(entry: ChaosWorker, conversation_id: str, owner: ChaosWorker | None) -> None:
    """``GET /conversations/{id}`` on ``entry`` answers 200 with the conversation.

    A 404 right after a rebalance is the owner still restoring its table from
    the changelog (its audit line shows the forwarded read arrived): waited out.
    """
    seen: list[str] = []

    async def answered() -> bool:
        status, body = await entry.get(f"/conversations/{conversation_id}", timeout=20)
        seen.append(f"{status} {str(body)[:200]}")
        if status == 404:
            return False
        if status != 200 or body.get("conversation_id") != conversation_id:
            raise AssertionError(
                f"GET /conversations/{conversation_id} on {entry.name} (owner "
                f"{owner.name if owner else None}): {seen[-1]}"
            )
        return True

    where = f"{conversation_id} read on {entry.name} (owner {owner.name if owner else None})"
    try:
        await wait_until(answered, timeout=60, what=where)
    except AssertionError as error:
        raise AssertionError(f"{error}; last answer: {seen[-1:]}") from None
