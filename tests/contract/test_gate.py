"""The gate inside ``apply_compaction``'s transaction (core/domain/gate.py): a plan
it refuses writes nothing, in PostgreSQL as in memory, and its refusal is
recorded once; the same history then takes a plan that passes."""

from __future__ import annotations

from typing import Any

from core.domain.gate import Rejected
from core.domain.messages import ToolCall
from core.domain.usage import LlmUsage
from core.ports.storage import AlreadyApplied, Applied
from tests.contract.backends import Backend
from tests.contract.test_compactions import outbox_of
from tests.support.plans import CONV, make_plan, msg, save_all, stored

TURNS = [
    msg(0, "Please renew the blue plan before the end of the month for the whole team."),
    msg(1, "Done: the blue plan is renewed and the invoice goes to the finance address.", role="assistant"),
    msg(2, "thanks"),
]  # fmt: skip


async def test_a_refused_plan_writes_nothing_and_is_recorded_once(
    store: Any, backend: Backend
) -> None:
    await save_all(store, TURNS)
    before = await store.history.load_history(CONV)
    rows_before = await backend.rows()
    echo = "\n".join(m.content for m in TURNS[:2])
    plan = make_plan(
        "cmp-echo", [stored("cmp-echo", 0, echo, TURNS[:2])], [m.id for m in TURNS[:2]]
    )
    plan = plan.model_copy(update={"usage": LlmUsage(summarizer="anthropic")})
    outbox = await outbox_of(store, plan)
    verdict = await store.compactions.apply_compaction(plan, outbox)
    assert isinstance(verdict, Rejected) and verdict.reason == "echo"
    assert await store.history.load_history(CONV) == before
    after = await backend.rows()
    assert {t: n for t, n in after.items() if t != "compaction_rejections"} == {
        t: n for t, n in rows_before.items() if t != "compaction_rejections"
    }
    assert await store.compactions.compaction_applied("cmp-echo") is False
    # Redelivered: refused again, recorded once.
    assert isinstance(await store.compactions.apply_compaction(plan, outbox), Rejected)
    (recorded,) = await store.compactions.rejections(CONV)
    assert (recorded.compaction_id, recorded.summarizer, recorded.reason) == (
        "cmp-echo", "anthropic", "echo",
    )  # fmt: skip
    good = make_plan(
        "cmp-echo", [stored("cmp-echo", 0, "The blue plan was renewed.", TURNS[:2])],
        [m.id for m in TURNS[:2]],
    )  # fmt: skip
    assert await store.compactions.apply_compaction(good, await outbox_of(store, good)) == Applied()
    assert await store.compactions.apply_compaction(good) == AlreadyApplied()


async def test_a_summary_copying_the_configured_prompt_is_refused(store: Any) -> None:
    """The plan names the prompt its summaries were asked with (issue 28): the store's
    gate compares with it, not only with the default directive."""
    prompt = "Write the renewal desk's handover: what each customer asked and was promised."
    await save_all(store, TURNS)
    before = await store.history.load_history(CONV)
    plan = make_plan(
        "cmp-prompt", [stored("cmp-prompt", 0, prompt, TURNS[:2])], [m.id for m in TURNS[:2]]
    ).model_copy(update={"usage": LlmUsage(summarizer="anthropic"), "instructions": (prompt,)})
    verdict = await store.compactions.apply_compaction(plan, await outbox_of(store, plan))
    assert isinstance(verdict, Rejected) and verdict.reason == "directive_copy"
    assert await store.history.load_history(CONV) == before


async def test_a_plan_that_cuts_a_tool_call_from_its_live_result_is_refused(store: Any) -> None:
    call = msg(3, "", role="assistant", tool_calls=[ToolCall(id="t1", name="renew")])
    result = msg(4, "ok", role="tool", tool_call_id="t1")
    await save_all(store, [*TURNS, call, result])
    before = await store.history.load_history(CONV)
    cut = [*TURNS[:2], call]
    plan = make_plan(
        "cmp-cut", [stored("cmp-cut", 0, "The blue plan was renewed with renew().", cut)],
        [m.id for m in cut],
    )  # fmt: skip
    verdict = await store.compactions.apply_compaction(plan, await outbox_of(store, plan))
    assert isinstance(verdict, Rejected) and verdict.reason == "tool_pair_split"
    assert await store.history.load_history(CONV) == before


async def test_a_pinned_message_is_stored_pinned_and_a_plan_that_compresses_it_is_refused(
    store: Any,
) -> None:
    """Pinned at ingest (``MessageEvent.pinned``) or by an operator after a plan was
    made: the gate refuses the stale plan."""
    pinned = TURNS[0].model_copy(update={"pinned": True})
    await save_all(store, [pinned, *TURNS[1:]])
    assert [m.pinned for m in await store.history.load_history(CONV)] == [True, False, False]
    assert await store.compactions.set_pinned(CONV, TURNS[0].id, True)  # idempotent
    plan = make_plan(
        "cmp-pin", [stored("cmp-pin", 0, "The blue plan was renewed.", TURNS[:2])],
        [m.id for m in TURNS[:2]],
    )  # fmt: skip
    verdict = await store.compactions.apply_compaction(plan, await outbox_of(store, plan))
    assert isinstance(verdict, Rejected) and verdict.reason == "pinned_compressed"
    assert await store.compactions.set_pinned(CONV, TURNS[0].id, False)
    assert await store.compactions.set_pinned(CONV, "no-such-id", True) is False
    assert await store.compactions.apply_compaction(plan, await outbox_of(store, plan)) == Applied()


async def test_a_summary_copying_the_previous_clip_archive_is_refused(store: Any) -> None:
    """A small model handed the running summary answered with it, word for word
    (docs/memory.md, "A real small model, by hand"): the store's gate reads the
    previous clip-archive among the rows the apply removes."""
    earlier, later = TURNS[:2], [
        msg(3, "The invoice went to the old finance address, please send it to the new one."),
        msg(4, "Sent again to billing at the new office on Harbour Street, reference 7781.",
            role="assistant"),
        msg(5, "Also add Priya and Tomasz as admins of the workspace."),
    ]  # fmt: skip
    await save_all(store, [*TURNS, *later])
    previous = "The blue plan was renewed for the whole team; the invoice goes to finance."
    first = make_plan("cmp-1", [stored("cmp-1", 0, previous, earlier)], [m.id for m in earlier])
    first = first.model_copy(
        update={
            "usage": LlmUsage(summarizer="anthropic"),
            "clip_archive": first.clip_archive.model_copy(
                update={"content": f"[Context Summary]\n{previous}"}
            ).as_clip_archive(),
        }
    )
    assert (
        await store.compactions.apply_compaction(first, await outbox_of(store, first)) == Applied()
    )

    def second(summary: str) -> Any:
        removed = ["clip-archive-cmp-1", *(m.id for m in later)]
        plan = make_plan("cmp-2", [stored("cmp-2", 0, summary, later)], removed)
        return plan.model_copy(update={"usage": LlmUsage(summarizer="anthropic")})

    copied = second(previous)
    verdict = await store.compactions.apply_compaction(copied, await outbox_of(store, copied))
    assert isinstance(verdict, Rejected) and verdict.reason == "echo", verdict
    updated = second(
        f"{previous} The invoice was re-sent to the new office on Harbour Street "
        "(reference 7781); Priya and Tomasz are to be workspace admins."
    )
    assert (
        await store.compactions.apply_compaction(updated, await outbox_of(store, updated))
        == Applied()
    )
