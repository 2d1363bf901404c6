"""The one exception the orchestrator's state raises for a request the API refuses.

The HTTP layer (orchestrator.py) turns ``ApiFailure(status, error, message)`` into the JSON
error answer ``{"error": error, "message": message}`` of API.md; ``retry_after_s`` (optional)
becomes the ``Retry-After`` header of a 429/503 answer.
"""

from __future__ import annotations

__all__ = ["ApiFailure"]


class ApiFailure(Exception):
    """A refused request: HTTP ``status``, short ``error`` code and a human ``message``.

    ``retry_after_s``: seconds the client should wait before retrying (429/503 only; None = the
    HTTP layer's default of 1 s).
    """

    def __init__(self, status: int, error: str, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message
        self.retry_after_s = retry_after_s
