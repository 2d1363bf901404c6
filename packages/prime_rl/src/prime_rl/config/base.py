"""The ground floor of every config section: immutable pydantic models whose unknown keys are errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ConfigError", "Section"]


class ConfigError(ValueError):
    """A config file or override is unreadable, has an unknown key, or a value of the wrong type."""


class Section(BaseModel):
    """Base of every config section: immutable, unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
