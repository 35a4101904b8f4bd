"""aiokafka's exceptions as the publisher port's errors: the one map at the edge.

The worker's retry policy and the dead-letter sender decide on
``core.ports.publisher`` types only, so they never import the client.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from aiokafka.errors import (
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
)

from core.ports.publisher import (
    PublishError,
    PublisherUnavailable,
    PublishRejected,
    RecordTooLarge,
)

T = TypeVar("T")

_RULES: tuple[tuple[tuple[type[BaseException], ...], type[PublishError]], ...] = (
    ((MessageSizeTooLargeError, RecordTooLargeError), RecordTooLarge),
    ((InvalidTopicError, TopicAuthorizationFailedError), PublishRejected),
    # Everything else the client raises is the broker being away or slow.
    ((KafkaError, OSError, TimeoutError), PublisherUnavailable),
)


def publish_error(error: BaseException) -> PublishError | None:
    """The port error for ``error``; None when it is not the client's (a bug stays visible)."""
    for types, port_error in _RULES:
        if isinstance(error, types):
            return port_error(f"{type(error).__name__}: {error}")
    return None


async def mapped(pending: Awaitable[T]) -> T:
    """Await ``pending``, raising a client exception as its port error (cause kept)."""
    try:
        return await pending
    except Exception as error:
        port_error = publish_error(error)
        if port_error is None:
            raise
        raise port_error from error
