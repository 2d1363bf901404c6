"""Exception types and the hyper-parameter checks shared by every module (torch-free).

Every public function validates its inputs at the boundary and raises one of these
(all subclass :class:`ValueError`, so ``except ValueError`` keeps working). Each valid
range is written once here and used twice: by the function at call time and by
:class:`grpo.LossConfig` at construction, which must work without torch (a config loader
validates a loss on machines that never train). Tensor checks live in
:mod:`grpo.tensor_checks`.
"""

from __future__ import annotations

__all__ = ["GrpoError", "InvalidParameterError", "RecomputeError", "ShapeError"]


class GrpoError(ValueError):
    """Base class of every error raised by ``grpo``."""


class ShapeError(GrpoError):
    """Tensors whose shapes, dtypes or contents do not fit together (e.g. mask vs log-probs)."""


class InvalidParameterError(GrpoError):
    """A hyper-parameter outside its valid range (e.g. ``delta <= 1 + eps_high``)."""


class RecomputeError(GrpoError):
    """A checkpointed layer's recompute in backward would not compute what its forward did (e.g. the
    attention implementation changed in between: :mod:`grpo.activation_checkpointing`)."""


def check_finite_param(name: str, value: float) -> None:
    """Raise unless ``value`` is a finite real number."""
    if not isinstance(value, int | float) or value != value or value in (float("inf"), float("-inf")):
        raise InvalidParameterError(f"{name} must be a finite number, got {value!r}")


def check_positive(name: str, value: float) -> None:
    """Raise unless ``value`` is finite and > 0."""
    check_finite_param(name, value)
    if value <= 0:
        raise InvalidParameterError(f"{name} must be > 0, got {value!r}")


def check_nonnegative(name: str, value: float) -> None:
    """Raise unless ``value`` is finite and >= 0."""
    check_finite_param(name, value)
    if value < 0:
        raise InvalidParameterError(f"{name} must be >= 0, got {value!r}")


def check_clip(eps_low: float, eps_high: float, delta: float | None = None) -> None:
    """The PPO clip band [1 − eps_low, 1 + eps_high] and INTELLECT-2's cap δ > 1 + eps_high."""
    check_finite_param("eps_low", eps_low)
    check_finite_param("eps_high", eps_high)
    if not 0.0 <= eps_low < 1.0:
        raise InvalidParameterError(f"eps_low must be in [0, 1) (an offset below 1), got {eps_low}")
    if eps_high < 0.0:
        raise InvalidParameterError(f"eps_high must be >= 0 (an offset above 1), got {eps_high}")
    if delta is not None:
        check_finite_param("delta", delta)
        if not delta > 1.0 + eps_high:
            raise InvalidParameterError(
                f"delta must be > 1 + eps_high = {1.0 + eps_high} (it caps ratios above the clip band), got {delta}"
            )


def check_weight_band(low_name: str, low: float, high_name: str, high: float) -> None:
    """An importance-weight band ``0 <= low < high`` (CISPO's floor and cap, the MIS band)."""
    check_finite_param(low_name, low)
    check_finite_param(high_name, high)
    if not 0.0 <= low < high:
        raise InvalidParameterError(
            f"need 0 <= {low_name} < {high_name}, got {low_name}={low}, {high_name}={high}"
        )
