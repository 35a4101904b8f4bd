"""Small HTTP helpers shared by the SDK adapters.

Both SDKs are told not to retry (the compactor owns retry policy), so the
server's own back-off hint has to be lifted out of the 429 response here and
carried on ``ModelRateLimitError.retry_after``.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait, or ``None`` when it gave no usable hint.

    Honours, in order, the non-standard ``retry-after-ms`` (OpenAI and several
    gateways send it and it is the more precise), ``retry-after`` as seconds
    (fractions allowed, as both SDKs accept), and ``retry-after`` as an
    HTTP-date. Negative waits clamp to zero; garbage yields ``None`` rather
    than an error, because a missing hint must never turn a rate limit into a
    different failure.
    """
    millis = _finite_float(headers.get("retry-after-ms"))
    if millis is not None:
        return max(millis / 1000.0, 0.0)

    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _finite_float(raw)
    if seconds is not None:
        return max(seconds, 0.0)

    try:
        moment = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    current = time.time() if now is None else now
    return max(moment.timestamp() - current, 0.0)


def _finite_float(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None
