"""The processor: a command compacted, its events published through the outbox."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from core.domain.compaction import CompactionPlan, Failed, Planned, PlanOutcome
from core.ports.publisher import PublisherUnavailable
from streams.dead_letter_headers import DeadLetterHeaders
from streams.events import ReconcileRequest
from streams.worker.processor import Compacted, Noop, Replayed
from streams.worker.runtime import StaticRuntime
from tests.support.builders import T0
from tests.support.metrics_text import sample
from tests.support.stores import counts, round_trips
from tests.unit.worker.harness import NAMES, FailingModel, harness, over_budget, words

pytestmark = pytest.mark.unit


async def test_a_command_compacts_and_publishes_its_events_asking_applied_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = harness()
    command = await over_budget(h)
    trips = round_trips(h.store, monkeypatch)
    outcome = await h.components.processor.compact(command)
    assert isinstance(outcome, Compacted)
    # The messages up to the command's cut, less keep_recent=2; later ones are untouched.
    assert command.up_to_seq == 4
    assert outcome.plan.messages_compressed == 2
    # Four round trips, the promise: asked once (applied?, the total and the
    # history), the compactor's read of the live batches, written once, and the
    # relay sends what the transaction wrote and marks it by compaction, reading
    # nothing back.
    assert trips == [
        "history.compaction_inputs",
        "archive.live_batches",
        "compactions.apply_compaction",
        "outbox.mark_compaction_published",
    ]
    (clip,) = h.publisher.on("clip_archives")
    assert clip.key == b"c1"
    (completed,) = h.completions()
    assert completed.compaction_id == command.compaction_id
    assert completed.status == "compacted"
    assert completed.rows_removed == 2 and completed.rows_added == 1
    assert len(h.store.messages) == 8 - 2 + 1
    total, _ = await counts(h.store, "c1")
    assert h.tally().token_total - completed.tokens_removed + completed.tokens_added == total
    assert all(o.published for o in h.store.outbox_entries)


async def test_a_replayed_compaction_id_republishes_its_completion_not_its_clip_archive() -> None:
    """Its completion may not have been applied; its clip-archive, acknowledged by
    the broker, reached its consumers already (a copy is only noise for them)."""
    h = harness()
    command = await over_budget(h)
    await h.components.processor.compact(command)
    first = list(h.publisher.sent)
    outcome = await h.components.processor.compact(command)
    assert outcome == Replayed()
    republished = h.publisher.sent[len(first) :]
    assert [p.topic for p in republished] == ["control"]
    assert [p.value for p in republished] == [p.value for p in first if p.topic == "control"]
    assert sample(h.components.metrics, "compactor_compactions_noop_total", reason="replayed") == 1


async def test_a_replayed_compaction_never_published_publishes_both() -> None:
    """A crash between the commit and the relay: the redelivered command sends both."""
    h = harness()
    command = await over_budget(h)
    # The relay right after the commit fails: nothing is marked published.
    h.publisher.fail_next = PublisherUnavailable("the broker is away")
    with pytest.raises(PublisherUnavailable):
        await h.components.processor.compact(command)
    assert h.store.outbox_entries and not any(o.published for o in h.store.outbox_entries)
    sent = len(h.publisher.sent)
    outcome = await h.components.processor.compact(command)
    assert outcome == Replayed()
    assert [p.topic for p in h.publisher.sent[sent:]] == ["clip_archives", "control"]
    assert all(o.published for o in h.store.outbox_entries)


async def test_a_failed_compaction_writes_nothing_and_is_counted() -> None:
    h = harness(model=FailingModel(), command_timeout_seconds=0.1)
    command = await over_budget(h)
    before = dict(h.store.messages)
    outcome = await h.components.processor.compact(command)
    assert isinstance(outcome, Failed) and outcome.kind == "model_auth"
    assert "ModelAuthError" in outcome.detail
    assert h.store.messages == before
    assert h.store.batches == {} and h.store.applied == set() and h.store.outbox_entries == []
    assert h.publisher.on("clip_archives") == [] and h.completions() == []
    failed = sample(h.components.metrics, "compactor_compactions_failed_total", reason="model_auth")
    assert failed == 1


async def test_stored_tokens_other_than_its_completion_announces_fail_the_compaction() -> None:
    """The outbox is built before the write from the stored counts the inputs
    read; the store checks them, so the tally cannot move by other numbers."""
    h = harness()
    command = await over_budget(h)
    read = h.store.history.compaction_inputs

    async def stale(*args: Any, **kwargs: Any) -> Any:
        inputs = await read(*args, **kwargs)
        counts = {i: n + 1 for i, n in inputs.stored_tokens.items()}
        return replace(inputs, stored_tokens=counts)

    h.store.history.compaction_inputs = stale  # type: ignore[method-assign]
    before = dict(h.store.messages)
    outcome = await h.components.processor.compact(command)
    assert isinstance(outcome, Failed) and outcome.kind == "history_conflict"
    assert h.store.messages == before and h.store.applied == set() and h.store.outbox_entries == []
    assert h.completions() == [] and h.publisher.on("clip_archives") == []
    failed = sample(
        h.components.metrics, "compactor_compactions_failed_total", reason="history_conflict"
    )
    assert failed == 1


async def test_nothing_to_compress_completes_as_a_noop() -> None:
    h = harness()
    await h.message(0, "x" * 500)
    await h.message(1, "x" * 500)  # over budget, but both are within keep_recent
    (command,) = h.commands()
    outcome = await h.components.processor.compact(command)
    assert outcome == Noop("nothing_to_compress")
    (noop,) = h.completions()
    assert noop.status == "noop" and noop.compaction_id == command.compaction_id
    assert noop.tokens_removed == 0 and noop.messages_compressed == 0
    await h.control(noop)
    tally = h.tally()
    assert tally.stalled and tally.outstanding is None


async def test_a_command_for_a_conversation_back_under_budget_is_a_noop() -> None:
    h = harness()
    command = await over_budget(h)
    for key in list(h.store.messages)[:5]:
        del h.store.messages[key]
    outcome = await h.components.processor.compact(command)
    assert outcome == Noop("under_budget")


async def test_the_completion_brings_the_tally_to_the_store_s_total() -> None:
    h = harness()
    command = await over_budget(h)
    await h.components.processor.compact(command)
    (completed,) = h.completions()
    await h.control(completed)
    total, count = await counts(h.store, "c1")
    tally = h.tally()
    assert (tally.token_total, tally.message_count) == (total, count)
    assert tally.generation == 1 and tally.compactions == 1


async def test_a_duplicate_between_commit_and_completion_leaves_the_tally_exact() -> None:
    """Issue: the duplicate's resync already saw the compaction, and the completion's
    deltas then took the removed tokens off a second time (a tally below the store,
    never compacted again)."""
    h = harness()
    command = await over_budget(h)
    await h.components.processor.compact(command)
    await h.message(0, words(20, "topic0-"))  # redelivered; it was compacted
    (completed,) = h.completions()
    await h.control(completed)
    total, count = await counts(h.store, "c1")
    tally = h.tally()
    assert (tally.token_total, tally.message_count) == (total, count)


async def test_a_reconcile_request_repairs_a_drifted_entry() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 40)
    h.components.table.put(h.tally().model_copy(update={"token_total": 5}))  # drifted low
    for i in range(3, 8):
        await h.message(i, "x" * 40)  # 5 + 50 tokens in the table, 80 in the store
    assert h.commands() == []
    await h.control(ReconcileRequest(conversation_id="c1", requested_at=T0))
    total, count = await counts(h.store, "c1")
    assert (h.tally().token_total, h.tally().message_count) == (total, count)


async def test_the_intake_dead_letters_a_bad_command_and_acks_in_offset_order() -> None:
    h = harness()
    command = await over_budget(h)
    intake = h.components.intake
    good = h.record(NAMES.commands, "c1", command.model_dump_json())
    bad = h.record(NAMES.commands, "c1", b"{}")
    await intake.submit(good, "p0", 1)
    await intake.submit(bad, "p0", 2)
    await intake.scheduler.drain()
    assert h.acked == [1, 2]
    (letter,) = h.publisher.on("dead_letters")
    assert DeadLetterHeaders.from_kafka(list(letter.headers)).source_topic == NAMES.commands
    assert len(h.publisher.on("clip_archives")) == 1


async def test_the_outbox_timer_publishes_rows_a_crash_left_behind() -> None:
    h = harness()
    command = await over_budget(h)
    h.publisher.fail_next = ConnectionError("broker away")
    with pytest.raises(ConnectionError):
        await h.components.processor.compact(command)  # committed, not published
    assert [o.published for o in h.store.outbox_entries] == [False, False]
    await h.components.relay.tick()  # within the grace: the processor's to send
    assert [o.published for o in h.store.outbox_entries] == [False, False]
    h.clock.now += 60  # command_timeout_seconds: the relay's grace is over
    await h.components.relay.tick()
    assert all(o.published for o in h.store.outbox_entries)
    # A compaction's records are sent together: the one whose send did not fail
    # may be out already, and the tick sends both (delivery is at least once).
    sent = [p.topic for p in h.publisher.sent if p.topic != "commands"]
    assert sent[-2:] == ["clip_archives", "control"]


async def test_a_refitted_clip_archive_counts_as_a_compaction_not_a_noop() -> None:
    class Refitting:
        """Compresses no message, but archives one new batch: a re-fitted clip-archive."""

        def __init__(self, real: Any) -> None:
            self.real = real

        async def plan(self, history: Any, conversation_id: str, **kw: Any) -> PlanOutcome:
            outcome = await self.real.plan(history, conversation_id, **kw)
            assert isinstance(outcome, Planned)
            plan: CompactionPlan = outcome.plan
            refit = plan.model_copy(
                update={"deleted_message_ids": (), "messages_compressed": 0,
                        "new_batches": plan.new_batches[:1]}
            )  # fmt: skip
            return Planned(refit, outcome.history, over_target="over target: a test")

    h = harness()
    command = await over_budget(h)
    real = h.components.processor._runtime.compactor
    h.components.processor._runtime = StaticRuntime(h.store, Refitting(real))
    outcome = await h.components.processor.compact(command)
    assert isinstance(outcome, Compacted)
    assert sample(h.components.metrics, "compactor_compactions_over_target_total") == 1
    (completed,) = h.completions()  # its own, from its outbox: not a noop
    assert completed.status == "compacted" and completed.messages_compressed == 0


class _DownThenUp:
    """A compactor whose provider is down until ``back`` is set, then the real one."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.back = asyncio.Event()
        self.waiting = asyncio.Event()
        self.plans = 0
        self.waits = 0

    async def plan(self, history: Any, conversation_id: str, **kw: Any) -> PlanOutcome:
        self.plans += 1
        if not self.back.is_set():
            return Failed(
                "provider_unavailable",
                "ProviderUnavailableError: LLM provider open: retry in 5s",
                provider_down_at=0,
            )
        outcome: PlanOutcome = await self.real.plan(history, conversation_id, **kw)
        return outcome

    async def provider_answers(self, since: int) -> None:
        self.waits += 1
        self.waiting.set()
        await self.back.wait()


async def test_a_compaction_failed_in_an_outage_goes_again_when_the_provider_answers() -> None:
    """Issue 20: not after the command's timeout and reconciliation, but as soon
    as the guard sees the provider answer."""
    h = harness()
    command = await over_budget(h)
    down = _DownThenUp(h.components.processor._runtime.compactor)
    h.components.processor._runtime = StaticRuntime(h.store, down)
    running = asyncio.create_task(h.components.processor.compact(command))
    await asyncio.wait_for(down.waiting.wait(), 10)
    assert not running.done() and h.completions() == []  # held, not acked
    down.back.set()
    outcome = await running
    assert isinstance(outcome, Compacted) and down.plans == 2
    assert sample(h.components.metrics, "compactor_compactions_retried_after_outage_total") == 1
    assert len(h.publisher.on("clip_archives")) == 1


async def test_a_command_held_past_its_timeout_is_left_to_reconciliation() -> None:
    h = harness()
    command = await over_budget(h)
    down = _DownThenUp(h.components.processor._runtime.compactor)
    h.components.processor._runtime = StaticRuntime(h.store, down)
    h.clock.now += 61  # command_timeout_seconds is 60: reconciliation re-sends it now
    outcome = await h.components.processor.compact(command)
    assert isinstance(outcome, Failed) and outcome.provider_down_at == 0
    assert down.plans == 1 and down.waits == 0


async def test_an_outage_without_an_answer_is_held_until_the_command_times_out() -> None:
    """A rejected key is provider-wide: the command waits for an answer or the
    breaker, no longer than its timeout (then reconciliation, as before)."""
    h = harness(model=FailingModel(), command_timeout_seconds=0.2)
    command = await over_budget(h)
    outcome = await h.components.processor.compact(command)
    assert isinstance(outcome, Failed) and outcome.provider_down_at == 0
    assert sample(h.components.metrics, "compactor_compactions_retried_after_outage_total") == 0
