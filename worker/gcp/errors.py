"""Sorting Google Cloud errors: retry, wait for capacity, or give up with the cloud's own words.

The REST clients raise google.api_core exceptions; long-running operations that fail raise the same
classes from their google.rpc.Status. Three kinds of 429 / RESOURCE_EXHAUSTED look alike and mean
different things: a request rate limit (retry soon), a zone out of a machine type (wait or try
another zone) and a project quota (no amount of waiting helps). Compute Engine's v1 API reports a
rate limit as 403 with errors[].reason rateLimitExceeded (https://cloud.google.com/compute/api-docs/rate-limits),
which the client raises as Forbidden, the same class as a permission it lacks.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

# MachineRefused is the port's error (worker/ports.py): the driver catches it without importing
# a cloud module; the cloud provisioners raise it from here.
from worker.ports import MachineRefused as MachineRefused

log = logging.getLogger("trainjobs.worker")
T = TypeVar("T")




def cloud_message(exc: BaseException) -> str:
    """The cloud's own message: the REST body's error.message, not the client's 'POST https://...:' prefix."""
    response = getattr(exc, "response", None)
    try:
        message = response.json()["error"]["message"] if response is not None else None
    except (ValueError, KeyError, TypeError, AttributeError):
        message = None
    return str(message or getattr(exc, "message", None) or exc)


def _code(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else None


# ErrorInfo.reason (google.rpc) and the legacy errors[].reason (Compute Engine v1) of a rate quota.
RATE_LIMIT_REASONS = frozenset({"RATE_LIMIT_EXCEEDED", "rateLimitExceeded", "userRateLimitExceeded"})


def is_rate_limited(exc: BaseException) -> bool:
    # Google reports request-rate limits as "Quota exceeded for quota metric '...' and limit '... per minute'".
    if _code(exc) not in (403, 429):
        return False
    legacy = getattr(exc, "errors", None) or ()
    reasons = {getattr(exc, "reason", None), *(e.get("reason") for e in legacy if isinstance(e, dict))}
    return bool(reasons & RATE_LIMIT_REASONS) or "per minute" in cloud_message(exc).lower()


def is_stockout(exc: BaseException) -> bool:
    # Cloud TPU: "There is no more capacity in the zone ..."; Compute Engine: ZONE_RESOURCE_POOL_EXHAUSTED.
    text = cloud_message(exc)
    return (_code(exc) in (429, 503) and "no more capacity" in text.lower()) or "RESOURCE_POOL_EXHAUSTED" in text \
        or getattr(exc, "reason", None) in ("ZONE_RESOURCE_POOL_EXHAUSTED", "STOCKOUT")


def is_transient(exc: BaseException) -> bool:
    """Worth the same request again shortly: rate limits, server errors, a dropped connection."""
    from google.api_core import exceptions as gexc

    if is_stockout(exc):
        return False
    # requests' ConnectionError and Timeout (what the REST transport raises) are OSErrors, as are the builtins.
    if isinstance(exc, (gexc.ServerError, OSError)):
        return True
    return isinstance(exc, (gexc.TooManyRequests, gexc.Forbidden)) and is_rate_limited(exc)


def with_backoff(call: Callable[[], T], *, what: str, attempts: int = 6, base_s: float = 0.5, max_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """call(), retried with full-jitter exponential backoff while it fails transiently."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except Exception as exc:
            if attempt == attempts or not is_transient(exc):
                raise
            delay = random.uniform(0, min(max_s, base_s * 2 ** attempt))
            log.warning("%s failed (%s); retry %d of %d in %.1fs", what, cloud_message(exc), attempt, attempts - 1, delay)
            sleep(delay)
    raise AssertionError("unreachable")
