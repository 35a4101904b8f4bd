"""docs/events must stay true: the committed schemas are what the models say today,
and every bundled sample is a valid MessageEvent (samples are what users copy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from streams.cli.schemas import (
    WIRE_EVENTS,
    event_schema,
    generated_files,
    stale_files,
    write_schemas,
)
from streams.events import MessageEvent

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
EVENTS_DOCS = ROOT / "docs" / "events"
SAMPLES = sorted((ROOT / "samples").glob("*.jsonl"))


def test_committed_schemas_equal_freshly_generated_ones() -> None:
    problems = stale_files(EVENTS_DOCS)
    assert problems == [], "run `compactor schemas` and commit docs/events: " + "; ".join(problems)


def test_every_wire_event_has_a_schema_and_a_section_in_the_readme() -> None:
    assert set(generated_files()) == {f"{name}.json" for name in WIRE_EVENTS}
    assert set(WIRE_EVENTS) == {
        "MessageEvent",
        "CompactionCommand",
        "CompactionCompleted",
        "ReconcileRequest",
        "RecompactRequest",
        "RestoreRequest",
        "EraseRequest",
        "EraseCompleted",
        "ClipArchiveEvent",
        "CompactionRejected",
        "DeadLetterHeaders",
    }
    readme = (EVENTS_DOCS / "README.md").read_text()
    for name in WIRE_EVENTS:
        assert f"({name}.json)" in readme, f"docs/events/README.md does not link {name}.json"
    for topic in ("messages", "compaction-commands", "accounting-control", "clip-archives"):
        assert f"`{{prefix}}{topic}`" in readme
    assert "`{prefix}dead-letters`" in readme
    assert "`{prefix}erase-requests`" in readme
    assert "`{prefix}erase-completions`" in readme


def test_dead_letter_headers_are_described_by_their_kafka_names() -> None:
    properties = event_schema("DeadLetterHeaders")["properties"]
    assert set(properties) == {
        "dlq.reason",
        "dlq.error_type",
        "dlq.source_topic",
        "dlq.source_partition",
        "dlq.source_offset",
        "dlq.failed_at",
        "dlq.original_size",
        "dlq.truncated",
        "dlq.redacted",
    }


def test_input_schema_leaves_defaults_optional_and_output_schemas_require_everything() -> None:
    accepted = event_schema("MessageEvent")
    assert "schema_version" not in accepted["required"]
    assert "tool_calls" not in accepted["required"]
    written = event_schema("ClipArchiveEvent")
    assert set(written["required"]) == set(written["properties"])


def test_write_schemas_rewrites_only_what_changed(tmp_path: Path) -> None:
    assert len(write_schemas(tmp_path)) == len(WIRE_EVENTS)
    assert write_schemas(tmp_path) == []
    (tmp_path / "MessageEvent.json").write_text("{}\n")
    (tmp_path / "Retired.json").write_text("{}\n")
    assert sorted(stale_files(tmp_path)) == sorted(
        [
            f"{tmp_path / 'MessageEvent.json'} differs from the model",
            f"{tmp_path / 'Retired.json'} names no wire event",
        ]
    )
    assert write_schemas(tmp_path) == [tmp_path / "MessageEvent.json"]


def test_schema_files_are_valid_json() -> None:
    for name in WIRE_EVENTS:
        data = json.loads((EVENTS_DOCS / f"{name}.json").read_text())
        assert data["title"] == name


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_every_sample_line_is_a_message_event(sample: Path) -> None:
    lines = [line for line in sample.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert lines, f"{sample} is empty"
    for number, line in enumerate(lines, start=1):
        try:
            MessageEvent.model_validate_json(line)
        except ValidationError as error:  # pragma: no cover - the failure message
            pytest.fail(f"{sample.name}:{number}: {error}")


def test_there_are_samples() -> None:
    assert SAMPLES


# -- schema evolution (docs/events/README.md, "Schema evolution") -------------------


def _object_nodes(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (name, node)
        for name, node in [("", schema), *schema.get("$defs", {}).items()]
        if "properties" in node
    ]


def test_every_schema_allows_fields_it_does_not_list_at_every_level() -> None:
    """What every reader does (streams.events.EVENT_CONFIG), said by the schemas."""
    for name in WIRE_EVENTS:
        committed = json.loads((EVENTS_DOCS / f"{name}.json").read_text())
        for where, node in _object_nodes(committed):
            assert node.get("additionalProperties") is True, f"{name} {where or 'top'}"


def test_every_event_names_its_version_as_a_constant() -> None:
    for name in set(WIRE_EVENTS) - {"DeadLetterHeaders"}:  # headers: no version
        version = event_schema(name)["properties"]["schema_version"]
        assert version["type"] == "integer" and isinstance(version["const"], int), name


def test_a_producer_adding_fields_is_read_the_same_at_every_level() -> None:
    base = {
        "message_id": "m1",
        "conversation_id": "c1",
        "role": "assistant",
        "content": "hi",
        "created_at": "2026-01-01T00:00:00Z",
        "tool_calls": [{"id": "t1", "name": "lookup", "arguments": {"q": 1}}],
    }
    newer = {
        **base,
        "sentiment": "calm",  # a field a later v1 producer adds
        "tool_calls": [{**base["tool_calls"][0], "latency_ms": 12}],
    }
    assert MessageEvent.model_validate(newer) == MessageEvent.model_validate(base)
    for model, _ in WIRE_EVENTS.values():
        assert model.model_config.get("extra") == "ignore", model.__name__


def test_an_unknown_version_is_still_refused() -> None:
    with pytest.raises(ValidationError, match="schema_version"):
        MessageEvent.model_validate(
            {
                "schema_version": 2,
                "message_id": "m1",
                "conversation_id": "c1",
                "role": "user",
                "content": "hi",
                "created_at": "2026-01-01T00:00:00Z",
            }
        )


def test_the_readme_states_the_evolution_policy() -> None:
    readme = (EVENTS_DOCS / "README.md").read_text()
    assert "## Schema evolution" in readme
    for rule in ("additionalProperties", "schema_version", "consumers first", "v2"):
        assert rule.lower() in readme.lower(), rule
