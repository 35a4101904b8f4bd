from __future__ import annotations

import inspect
import io
import tokenize
from pathlib import Path

import pytest

import core
from core.compactor import create_compactor
from core.domain.messages import ToolCall
from core.domain.prompts import (
    DEFAULT_DIRECTIVE,
    DEFAULT_SYSTEM_PROMPT,
    build_resummarization_request,
    build_summarization_request,
)
from core.ports.model import ModelMessage
from tests.support.builders import message

pytestmark = pytest.mark.unit

CHAT = [
    message(0, "user", "Can we ship on Friday?"),
    message(1, "assistant", "Only if the migration is done."),
    message(2, "tool", "migration: 3 of 5 steps done"),
]


def request(system_prompt: str | None = None, previous: str | None = None):  # type: ignore[no-untyped-def]
    return build_summarization_request(
        system_prompt=system_prompt,
        previous_summary=previous,
        messages=CHAT,
        model_name="claude-test",
        max_tokens=321,
    )


def test_system_field_and_structured_messages__compaction_v2_AC1_1() -> None:
    built = request()
    assert built.system == DEFAULT_SYSTEM_PROMPT
    assert [m.role for m in built.messages] == ["user", "assistant", "user", "user"]
    assert built.model == "claude-test"
    assert built.max_tokens == 321
    assert built.temperature == 0


def test_previous_summary_is_a_system_role_message__compaction_v2_AC1_2() -> None:
    built = request(previous="They agreed on Friday.")
    assert built.messages[0] == ModelMessage(
        role="system", content="Previous summary of conversation:\nThey agreed on Friday."
    )
    assert sum(m.role == "system" for m in built.messages) == 1


def test_original_roles_preserved_and_tool_output_labelled__compaction_v2_AC1_3() -> None:
    built = request()
    assert built.messages[0] == ModelMessage(role="user", content="Can we ship on Friday?")
    assert built.messages[1] == ModelMessage(
        role="assistant", content="Only if the migration is done."
    )
    assert built.messages[2] == ModelMessage(
        role="user", content="[Tool result]: migration: 3 of 5 steps done"
    )


def test_directive_is_final_user_message__compaction_v2_AC1_4() -> None:
    last = request(previous="x").messages[-1]
    assert last == ModelMessage(role="user", content=DEFAULT_DIRECTIVE)
    for word in ("PRESERVE", "CONDENSE", "PRIORITIZE", "REMOVE"):
        assert word in DEFAULT_DIRECTIVE


@pytest.mark.parametrize("previous", [None, ""])
def test_no_previous_summary_means_no_system_message__compaction_v2_AC1_5(
    previous: str | None,
) -> None:
    assert all(m.role != "system" for m in request(previous=previous).messages)


def test_resummarization_uses_same_structure__compaction_v2_AC1_6() -> None:
    built = build_resummarization_request(
        system_prompt="Be terse.", batch_contents=["first", "second"], model_name="m", max_tokens=99
    )
    assert built.system == "Be terse."
    assert built.messages[:2] == (
        ModelMessage(role="system", content="Summary batch:\nfirst"),
        ModelMessage(role="system", content="Summary batch:\nsecond"),
    )
    assert built.messages[-1] == ModelMessage(role="user", content=DEFAULT_DIRECTIVE)
    assert built.temperature == 0 and built.max_tokens == 99


def test_custom_prompt_used_as_is__compaction_v2_AC4_3() -> None:
    prompt = "  You are Lasa's archivist. {persona} stays literal.\n"
    assert request(system_prompt=prompt).system == prompt


def test_absent_prompt_falls_back_to_default__compaction_v2_AC4_4() -> None:
    assert request(system_prompt=None).system == DEFAULT_SYSTEM_PROMPT


def test_no_code_path_injects_persona__compaction_v2_AC4_1() -> None:
    identifiers = {
        token.string.lower()
        for path in Path(core.__file__).parent.rglob("*.py")
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if token.type == tokenize.NAME
    }
    assert not [name for name in identifiers if "persona" in name]
    # Behaviourally: every message of the request comes from the caller's inputs.
    built = request(system_prompt="P", previous="S")
    expected = [
        "Previous summary of conversation:\nS",
        "Can we ship on Friday?",
        "Only if the migration is done.",
        "[Tool result]: migration: 3 of 5 steps done",
        DEFAULT_DIRECTIVE,
    ]
    assert built.system == "P"
    assert [m.content for m in built.messages] == expected


def test_get_persona_removed_from_compactor_options__compaction_v2_AC4_2() -> None:
    parameters = inspect.signature(create_compactor).parameters
    assert not any("persona" in name.lower() for name in parameters)


def test_assistant_tool_calls_are_rendered_and_empty_turns_dropped() -> None:
    call = ToolCall(id="c1", name="run_tests", arguments={"path": "tests/"})
    built = build_summarization_request(
        system_prompt=None,
        previous_summary=None,
        messages=[message(0, "assistant", "", tool_calls=[call]), message(1, "user", "  ")],
        model_name="m",
        max_tokens=10,
    )
    assert built.messages[0] == ModelMessage(
        role="assistant", content='[Tool call] run_tests({"path":"tests/"})'
    )
    assert len(built.messages) == 2  # the blank user turn is gone, the directive remains


def test_genuine_system_messages_are_kept_but_clip_archives_are_not() -> None:
    built = build_summarization_request(
        system_prompt=None,
        previous_summary=None,
        messages=[
            message(0, "system", "Policy: no deploys on Friday."),
            message(
                1, "system", "[Context Summary — 1 messages compressed across 1 compaction cycles]"
            ),
        ],
        model_name="m",
        max_tokens=10,
    )
    assert built.messages[0] == ModelMessage(
        role="user", content="[System message]: Policy: no deploys on Friday."
    )
    assert len(built.messages) == 2
