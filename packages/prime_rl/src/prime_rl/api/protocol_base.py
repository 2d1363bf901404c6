"""The base of every wire model and the error body (``protocol.py`` lists the whole API).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ApiModel(BaseModel):
    """Base of every wire model: strict types, unknown keys rejected, finite floats only."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class ErrorResponse(ApiModel):
    """Body of every 4xx/5xx answer."""

    error: str = Field(description="Short machine-readable code, e.g. 'bad_request', 'not_found'.")
    message: str = Field(description="What was wrong and what to do.")
