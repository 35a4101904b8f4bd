"""The headers of a dead-letter record: why it was set aside and where it came from."""

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, Field

from streams.events import EVENT_CONFIG


class DeadLetterHeaders(BaseModel):
    """Headers of a dead-letter record; its value is the original bytes, untouched,
    so the record can be fixed and re-driven (unless ``dlq.truncated``: a record
    larger than a producer request keeps its first bytes and its size)."""

    model_config = EVENT_CONFIG

    reason: str = Field(alias="dlq.reason")
    error_type: str = Field(alias="dlq.error_type")
    source_topic: str = Field(alias="dlq.source_topic")
    source_partition: int = Field(alias="dlq.source_partition")
    source_offset: int = Field(alias="dlq.source_offset")
    failed_at: AwareDatetime = Field(alias="dlq.failed_at")
    original_size: int = Field(default=0, ge=0, alias="dlq.original_size")  # bytes of the value
    # The value is the original's first bytes only: the whole did not fit a request.
    truncated: bool = Field(default=False, alias="dlq.truncated")
    # The value was dropped ([kafka].dead_letter_content = "redacted"): no content.
    redacted: bool = Field(default=False, alias="dlq.redacted")

    def to_kafka(self) -> list[tuple[str, bytes]]:
        return [
            (name, str(value).encode())
            for name, value in self.model_dump(by_alias=True, mode="json").items()
        ]

    @classmethod
    def from_kafka(cls, headers: list[tuple[str, bytes]] | None) -> DeadLetterHeaders:
        return cls.model_validate({k: v.decode() for k, v in headers or () if k.startswith("dlq.")})
