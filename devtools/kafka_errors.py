"""What can go wrong preparing or starting the local Kafka (``devtools.localstack``)."""

from __future__ import annotations


class LocalStackError(RuntimeError):
    """Raised when the local stack cannot be prepared or started."""


class MissingToolError(LocalStackError):
    """``java`` or ``mvn`` is absent or too old: nothing here can fix that."""


class BrokerStartError(LocalStackError):
    """The broker process exited or never answered; the message has its log tail."""


class KafkaPomNotFoundError(LocalStackError):
    """No pom to resolve the broker's jars from; the message lists every place looked at."""
