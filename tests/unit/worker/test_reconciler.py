"""The reconciler: the timer asks for due conversations and compares with the store."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from core.domain.tally import ConversationTally
from core.ports.publisher import RecordPosition
from streams.events import ReconcileRequest
from streams.worker.issued_commands import IssuedCommand
from tests.support.metrics_text import sample
from tests.unit.worker.harness import harness

pytestmark = pytest.mark.unit


async def test_the_reconcile_timer_asks_only_for_due_conversations() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)
    await h.message(0, "small", conversation="c2")
    assert await h.components.reconciler.tick() == 0  # c1's command is fresh, c2 is fine
    h.clock.now += 61
    assert await h.components.reconciler.tick() == 1
    (request,) = [p for p in h.publisher.on("control")]
    assert request.key == b"c1"
    assert ReconcileRequest.model_validate_json(request.value or b"").conversation_id == "c1"
    assert await h.components.reconciler.tick() == 0  # asked within the interval already


async def test_reconciliation_repairs_an_entry_the_store_has_over_budget() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)  # 300 tokens: over budget, a command goes out
    h.components.table.put(
        ConversationTally(conversation_id="c1", token_total=10, message_count=3)
    )  # drifted low, nothing outstanding: the table alone would never act again
    assert await h.components.reconciler.tick() == 1  # the first pass asks the store
    (request,) = [p for p in h.publisher.on("control")]
    await h.control(ReconcileRequest.model_validate_json(request.value or b""))
    assert h.tally().token_total == 300
    assert len(h.commands()) == 2  # asked again, with the store's counts


async def test_reconciliation_leaves_other_workers_conversations_alone() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)
    h.table.clear()  # not in this worker's table ...
    h.components.reconciler._owns = lambda _: False  # ... and not its partition
    assert await h.components.reconciler.tick() == 0


class Backlog:
    """A ``CommandBacklog``: which commands the processors have not finished."""

    def __init__(self, queued: set[str], error: Exception | None = None) -> None:
        self.queued = queued
        self.error = error
        self.asked: list[dict[str, float]] = []
        self.read_below = 0  # accounting has read the control topic up to here

    async def requests_unread(self, sent: Mapping[str, RecordPosition]) -> set[str]:
        if self.error is not None:
            raise self.error
        return {key for key, position in sent.items() if position.offset >= self.read_below}

    async def still_queued(self, issued: Mapping[str, IssuedCommand]) -> set[str]:
        self.asked.append({key: command.at for key, command in issued.items()})
        if self.error is not None:
            raise self.error
        return self.queued & set(issued)

    async def close(self) -> None:
        pass


async def test_a_late_command_still_queued_is_not_sent_again() -> None:
    """Under a backlog a command older than its timeout is late, not lost: a copy
    would only lengthen the backlog and run as a no-op."""
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)  # c1 over budget: its command goes out
    issued_at = h.tally().outstanding_since
    backlog = Backlog(queued={"c1"})
    h.components.reconciler._backlog = backlog
    h.clock.now += 61
    assert await h.components.reconciler.tick() == 0
    assert backlog.asked == [{"c1": issued_at}]
    assert sample(h.components.metrics, "compactor_reconcile_resends_held_total") == 1

    backlog.queued = set()  # the group went past it without a completion: lost
    h.clock.now += 61
    assert await h.components.reconciler.tick() == 1
    (request,) = h.publisher.on("control")
    await h.control(ReconcileRequest.model_validate_json(request.value or b""))
    assert len(h.commands()) == 2  # sent again, under the same compaction id
    assert h.commands()[0].compaction_id == h.commands()[1].compaction_id


async def test_without_an_answer_from_the_backlog_a_late_command_is_sent_again() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)
    h.components.reconciler._backlog = Backlog(queued={"c1"}, error=OSError("broker away"))
    h.clock.now += 61
    assert await h.components.reconciler.tick() == 1


async def test_the_backlog_is_asked_only_about_outstanding_commands() -> None:
    """A conversation due a first command has nothing queued: it is never held."""
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)
    h.components.table.put(
        h.tally().model_copy(update={"outstanding": None, "outstanding_since": None})
    )  # its completion arrived, and it is still over budget
    backlog = Backlog(queued={"c1"})
    h.components.reconciler._backlog = backlog
    assert await h.components.reconciler.tick() == 1
    assert backlog.asked == []


async def test_no_second_request_while_accounting_has_not_read_the_first() -> None:
    """Behind a backlog on the control topic, a request per pass piled up there
    (90,000 deep in the hour soak) and delayed the completions queued behind it."""
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)
    backlog = Backlog(queued=set())  # the command is lost: a request is due
    h.components.reconciler._backlog = backlog
    h.clock.now += 61
    assert await h.components.reconciler.tick() == 1
    for _ in range(3):  # passes while accounting has not read it
        h.clock.now += 61
        assert await h.components.reconciler.tick() == 0
    assert len(h.publisher.on("control")) == 1
    assert sample(h.components.metrics, "compactor_reconcile_requests_held_total") == 3

    backlog.read_below = len(h.publisher.on("control"))  # read, and still due
    h.clock.now += 61
    assert await h.components.reconciler.tick() == 1
    assert len(h.publisher.on("control")) == 2


async def test_the_backlog_is_asked_where_accounting_sent_the_command() -> None:
    """Accounting and reconciliation share one record of where each command went:
    with it the backlog compares offsets, without it only times (a search that
    may find a command already read when another of its second was)."""
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)
    positions: list[RecordPosition | None] = []

    class Recording(Backlog):
        async def still_queued(self, issued: Mapping[str, IssuedCommand]) -> set[str]:
            positions.extend(command.position for command in issued.values())
            return await super().still_queued(issued)

    h.components.reconciler._backlog = Recording(queued={"c1"})
    h.clock.now += 61
    assert await h.components.reconciler.tick() == 0
    assert len(positions) == 1 and positions[0] is not None
