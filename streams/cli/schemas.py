"""JSON Schema of every wire event, generated from the pydantic models.

Why generated and committed: producers in other languages need a schema,
and a hand-written one drifts. ``tests/unit/test_event_schemas.py`` fails
when the committed files differ from what the models say today.

Events the service *accepts* (``MessageEvent``) are described as validated
(fields with defaults are optional); events it *writes* are described as
serialised (every field is always present), which is what their consumers see.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from streams.dead_letter_headers import DeadLetterHeaders
from streams.events import (
    ClipArchiveEvent,
    CompactionCommand,
    CompactionCompleted,
    CompactionRejected,
    EraseCompleted,
    EraseRequest,
    MessageEvent,
    RecompactRequest,
    ReconcileRequest,
    RestoreRequest,
)

DEFAULT_OUT = Path("docs/events")

#: name -> (model, mode): the input event in validation mode, the rest as written.
WIRE_EVENTS: dict[str, tuple[type[BaseModel], Literal["validation", "serialization"]]] = {
    "MessageEvent": (MessageEvent, "validation"),
    "CompactionCommand": (CompactionCommand, "serialization"),
    "CompactionCompleted": (CompactionCompleted, "serialization"),
    "ReconcileRequest": (ReconcileRequest, "serialization"),
    "RecompactRequest": (RecompactRequest, "serialization"),
    "RestoreRequest": (RestoreRequest, "serialization"),
    "EraseRequest": (EraseRequest, "serialization"),
    "EraseCompleted": (EraseCompleted, "serialization"),
    "ClipArchiveEvent": (ClipArchiveEvent, "serialization"),
    "CompactionRejected": (CompactionRejected, "serialization"),
    "DeadLetterHeaders": (DeadLetterHeaders, "serialization"),
}


def event_schema(name: str) -> dict[str, Any]:
    model, mode = WIRE_EVENTS[name]
    schema = model.model_json_schema(by_alias=True, mode=mode)
    if mode == "serialization":
        _require_every_property(schema)
    _open_every_object(schema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def _require_every_property(schema: dict[str, Any]) -> None:
    """The service dumps every field, defaults and nulls included (``model_dump_json``
    without exclusions), so a consumer may rely on each one being present; pydantic
    would still list fields with defaults as optional."""
    for node in [schema, *schema.get("$defs", {}).values()]:
        if "properties" in node:
            node["required"] = list(node["properties"])


def _open_every_object(schema: dict[str, Any]) -> None:
    """Say what every reader does (``streams.events.EVENT_CONFIG``): a property this
    schema does not list is allowed and ignored, at every level, so producers may
    add fields within a ``schema_version`` (docs/events/README.md, "Schema evolution")."""
    for node in [schema, *schema.get("$defs", {}).values()]:
        if "properties" in node:
            node["additionalProperties"] = True


def render(schema: dict[str, Any]) -> str:
    """Stable text (sorted keys, trailing newline) so that diffs show real changes only."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def generated_files() -> dict[str, str]:
    """File name -> content, for every wire event."""
    return {f"{name}.json": render(event_schema(name)) for name in WIRE_EVENTS}


def write_schemas(out: Path) -> list[Path]:
    """Write every schema into ``out``; only files whose content changed are rewritten."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, text in generated_files().items():
        path = out / filename
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def stale_files(out: Path) -> list[str]:
    """Schema files in ``out`` that differ from the models, are missing, or name no event."""
    expected = generated_files()
    problems = []
    for filename, text in expected.items():
        path = out / filename
        if not path.exists():
            problems.append(f"{path} is missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path} differs from the model")
    for path in sorted(out.glob("*.json")):
        if path.name not in expected:
            problems.append(f"{path} names no wire event")
    return problems
