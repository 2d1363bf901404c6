"""What the orchestrator's client raises, and a failed connection in a few words.

``ClientRequestError``: a 4xx answer, the caller's fault, raised at once. ``OrchestratorUnavailable``:
no good answer after the client's retries; ``OrchestratorBusy`` when the last answer was a 429.
``prime_rl.api.client`` re-exports all of them.
"""

from __future__ import annotations

from urllib.parse import urlparse

import requests

__all__ = ["ApiError", "ClientRequestError", "OrchestratorBusy", "OrchestratorUnavailable", "describe_connection_error"]


class ApiError(RuntimeError):
    """Base of the client's errors."""


class ClientRequestError(ApiError):
    """The orchestrator answered 4xx: the request is wrong and retrying will not help.

    ``status`` is the HTTP status, ``error`` the server's error code, ``message`` its explanation.
    """

    def __init__(self, status: int, error: str, message: str, path: str) -> None:
        super().__init__(f"{path}: HTTP {status} {error}: {message}")
        self.status = status
        self.error = error
        self.message = message


class OrchestratorUnavailable(ApiError):
    """No usable answer after every retry (connection refused, timeouts, 5xx, unparsable body).

    ``problem`` is the last failure in a few words (``connection refused``, ``HTTP 503: ...``).
    """

    def __init__(self, message: str, *, problem: str = "") -> None:
        super().__init__(message)
        self.problem = problem or message


class OrchestratorBusy(OrchestratorUnavailable):
    """The orchestrator kept answering 429 (``busy``: lease backpressure; ``rate_limited``: too many
    registrations from this address): sleep ``retry_after_s`` (its last ``Retry-After``, 0 if none)
    and ask again."""

    def __init__(self, message: str, *, problem: str = "", retry_after_s: float = 0.0) -> None:
        super().__init__(message, problem=problem)
        self.retry_after_s = retry_after_s


def describe_connection_error(error: requests.RequestException) -> str:
    """A failed request in a few words: ``connection refused``, ``cannot resolve host 'x'``, ...

    requests wraps the socket error three levels deep (``ConnectionError(MaxRetryError(reason=...))``);
    the innermost reason is what a person needs.
    """
    if isinstance(error, requests.exceptions.ConnectTimeout):
        return "connection timed out"
    if isinstance(error, requests.exceptions.ReadTimeout):
        return "no answer within the request timeout"
    text = str(error)
    host = getattr(getattr(error, "request", None), "url", "") or ""
    if "NameResolutionError" in text or "Name or service not known" in text or "nodename nor servname" in text:
        hostname = urlparse(host).hostname if host else None
        return f"cannot resolve host {hostname!r}" if hostname else "cannot resolve the host name"
    if "Connection refused" in text:
        return "connection refused: nothing listens on that port"
    if "Connection reset" in text or "RemoteDisconnected" in text:
        return "connection closed by the server"
    return f"{type(error).__name__}: {text[:200]}"
