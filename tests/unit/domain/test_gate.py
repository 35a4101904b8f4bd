"""The gate a compaction passes before it takes effect (core/domain/gate.py)."""

from __future__ import annotations

import pytest

from core.domain.compaction import CompactionPlan
from core.domain.gate import GateInput, Passed, Rejected, check_compaction, gate_applies
from core.domain.messages import ConversationMessage, ToolCall
from core.domain.prompts import DEFAULT_DIRECTIVE, instructions
from core.domain.usage import LlmUsage
from tests.support.plans import make_plan, msg, stored

pytestmark = pytest.mark.unit

TURNS = [
    msg(0, "The customer wants the blue plan renewed before the end of the month."),
    msg(1, "We agreed the invoice goes to the finance address, not the support one.", role="assistant"),
]  # fmt: skip
GOOD = "The customer wants the blue plan renewed; invoices go to finance."


def plan_of(
    summary: str, turns: list[ConversationMessage] = TURNS, **update: object
) -> CompactionPlan:
    batch = stored("c1", 0, summary, turns, specifics=())  # what the summary says only
    plan = make_plan("c1", [batch], [m.id for m in turns])
    return plan.model_copy(update={"usage": LlmUsage(summarizer="anthropic"), **update})


def verdict(
    plan: CompactionPlan,
    turns: list[ConversationMessage] = TURNS,
    kept: list[ConversationMessage] | None = None,
) -> Passed | Rejected:
    return check_compaction(GateInput(plan, turns, kept or []))


def reason(
    plan: CompactionPlan,
    turns: list[ConversationMessage] = TURNS,
    kept: list[ConversationMessage] | None = None,
) -> str | None:
    found = verdict(plan, turns, kept)
    return found.reason if isinstance(found, Rejected) else None


def test_a_real_summary_passes() -> None:
    assert verdict(plan_of(GOOD)) == Passed()


@pytest.mark.parametrize("summary", ["", "   \n "])
def test_an_empty_summary_is_rejected(summary: str) -> None:
    assert reason(plan_of(summary)) == "empty_summary"


def test_a_copy_of_the_directive_is_rejected() -> None:
    assert reason(plan_of(DEFAULT_DIRECTIVE)) == "directive_copy"
    assert reason(plan_of(DEFAULT_DIRECTIVE.splitlines()[1])) == "directive_copy"


CONFIGURED = (
    "You write the handover notes of a support desk: who asked what, what was "
    "promised, and what is still open, in the customer's own words."
)


def test_a_copy_of_the_configured_prompt_is_rejected() -> None:
    """The plan names the instructions its summaries were asked with (the
    deployment's prompt): a summary copying them is refused, not only a copy of
    the default directive."""
    copied = plan_of(CONFIGURED, instructions=instructions(CONFIGURED))
    assert reason(copied) == "directive_copy"
    assert reason(plan_of(CONFIGURED.split(":")[0], instructions=(CONFIGURED,))) == (
        "directive_copy"
    )
    assert verdict(plan_of(GOOD, instructions=instructions(CONFIGURED))) == Passed()


def test_an_echo_with_fence_markers_is_rejected() -> None:
    echo = '<conversation-data id="abcdef12">\nThe customer wants it.\n</conversation-data id="abcdef12">'
    assert reason(plan_of(echo)) == "echo"


def test_an_echo_of_most_of_the_compressed_text_is_rejected_but_not_an_extractive_digest() -> None:
    echo = "\n".join(m.content for m in TURNS)
    assert reason(plan_of(echo)) == "echo"
    extractive = plan_of(echo, usage=LlmUsage(summarizer="extractive"))
    assert verdict(extractive) == Passed()


def test_a_tool_call_compressed_without_its_result_is_rejected() -> None:
    call = msg(2, "", role="assistant", tool_calls=[ToolCall(id="t1", name="search")])
    result = msg(3, "done", role="tool", tool_call_id="t1")
    turns = [*TURNS, call]
    assert reason(plan_of(GOOD, turns), turns, kept=[result]) == "tool_pair_split"
    both = [*TURNS, call, result]
    assert verdict(plan_of(GOOD + " Ran search() once.", both), both) == Passed()
    # The result compressed, its call kept live.
    assert (
        reason(plan_of(GOOD, [*TURNS, result]), [*TURNS, result], kept=[call]) == "tool_pair_split"
    )


def test_a_specific_neither_in_the_summary_nor_in_the_ledger_is_rejected() -> None:
    turns = [msg(0, "Order ORD-48213 ships to 221B Baker Street on 2026-03-04.")]
    assert reason(plan_of("An order ships soon.", turns), turns) == "specific_lost"
    said = "Shipping of ORD-48213 to 221B Baker Street is set for 2026-03-04, the user says."
    assert verdict(plan_of(said, turns), turns) == Passed()


def test_a_history_after_over_the_target_is_rejected() -> None:
    over = plan_of(GOOD, tokens_estimate_after=500, target_tokens=400)
    assert reason(over) == "over_target"
    assert verdict(plan_of(GOOD, tokens_estimate_after=400, target_tokens=400)) == Passed()
    # No target (none configured, or the compactor said it stays over): not checked.
    assert verdict(plan_of(GOOD, tokens_estimate_after=500)) == Passed()


def test_a_restore_or_a_rebuilt_clip_archive_alone_is_not_gated() -> None:
    assert gate_applies(plan_of(GOOD))
    assert not gate_applies(plan_of("", restored_message_ids=("x",)))
    assert not gate_applies(plan_of(GOOD).model_copy(update={"new_batches": ()}))


def test_a_summary_cut_at_max_tokens_is_rejected_however_good_its_start() -> None:
    assert reason(plan_of(GOOD, summaries_cut=1)) == "cut_off"
    found = verdict(plan_of(GOOD, summaries_cut=2))
    assert isinstance(found, Rejected) and found.detail == "2 summaries cut at max_tokens"
