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
