"""The model port and its adapters (Anthropic, OpenAI-compatible, extractive)."""

from core.model.port import (
    ModelAuthError,
    ModelError,
    ModelMessage,
    ModelProvider,
    ModelRateLimitError,
    ModelRequest,
    ModelResponse,
    ModelResponseError,
    ModelServerError,
    ModelTimeoutError,
    ModelUsage,
)

__all__ = [
    "ModelAuthError",
    "ModelError",
    "ModelMessage",
    "ModelProvider",
    "ModelRateLimitError",
    "ModelRequest",
    "ModelResponse",
    "ModelResponseError",
    "ModelServerError",
    "ModelTimeoutError",
    "ModelUsage",
]
