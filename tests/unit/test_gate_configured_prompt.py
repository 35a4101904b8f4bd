"""The gate's "copy of the directive" check compares with the prompt the deployment
configured, not only with the default one (issue 28).

Why: a model that answers with its instructions wrote a "summary" the gate let
through whenever the deployment had its own ``[summarization].prompt``: the
check knew only the default directive.
"""

from __future__ import annotations

import pytest

from core.domain.compaction import CompactionConfig
from core.domain.prompts import DEFAULT_DIRECTIVE
from core.ports.model import ModelRequest, ModelResponse
from tests.support.builders import history
from tests.support.compaction import applying_compactor
from tests.support.memory_store import InMemoryStore
from tests.support.stores import saved

pytestmark = pytest.mark.unit

PROMPT = (
    "You write the handover notes of a support desk: who asked what, what was "
    "promised, and what is still open, in the customer's own words."
)


class InstructionsEcho:
    """Answers with the system prompt it was given, as a confused model may."""

    name = "instructions-echo"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(text=request.system or "")


async def test_a_summary_copying_the_configured_prompt_is_not_applied() -> None:
    store = InMemoryStore()
    turns = history(12)
    for turn in turns:
        await saved(store, turn, 10)
    compactor = applying_compactor(
        store=store, model=InstructionsEcho(), model_name="m",
        config=CompactionConfig(keep_recent=2, chunk_size=4, prompt=PROMPT),
    )  # fmt: skip
    result = await compactor.compress(turns, "conv-1")
    assert result.failed and result.plan is None
    assert tuple(await store.history.load_history("conv-1")) == tuple(turns)
    (refused,) = await store.compactions.rejections("conv-1")
    assert refused.reason == "directive_copy"


async def test_the_plan_names_the_configured_instructions() -> None:
    store = InMemoryStore()
    turns = history(12)
    for turn in turns:
        await saved(store, turn, 10)
    compactor = applying_compactor(
        store=store, model=InstructionsEcho(), model_name="m",
        config=CompactionConfig(keep_recent=2, chunk_size=4, prompt=PROMPT),
    )  # fmt: skip
    outcome = await compactor.compactor.plan(turns, "conv-1", compaction_id="k1")
    assert outcome.plan.instructions == (PROMPT, DEFAULT_DIRECTIVE)  # type: ignore[union-attr]
