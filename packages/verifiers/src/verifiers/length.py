"""Length reward toward a target thinking budget (INTELLECT-2 `LenRewardConfig`, pure functions).

Modes, with r the task reward, L the number of generated tokens, L* the target, α = 0.0003:
- "exact": r − α·|L − L*|  (can be negative: 1000 tokens off costs 0.3; INTELLECT-2 QwQ run)
- "max":   r · clip(α·(L* − L) + 0.5, 0, 1)  (INTELLECT-2 default; 0.5 = max_reward_delta)
- "clip":  r if L <= L* else 0

The prompt instruction is "Think for {T} tokens before giving a response." (for "clip":
"Think for maximally {T} tokens ..."). Pitfall: prime-rl @4bb0ff01f rendered
"Think for2000 tokens" (no space; fixed in 8271a7df2); we always put the space.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

LENGTH_MODES = ("exact", "max", "clip")
ALPHA = 0.0003
MAX_REWARD_DELTA = 0.5
DEFAULT_TARGETS = (500, 1000, 2000, 3000)
QWQ_TARGETS = (2000, 4000, 6000, 8000, 10000)


def length_instruction(target: int, mode: str = "exact") -> str:
    """The budget sentence, e.g. "Think for 2000 tokens before giving a response."."""
    _check_mode(mode)
    if target <= 0:
        raise ValueError(f"target must be positive, got {target}")
    word = "maximally " if mode == "clip" else ""
    return f"Think for {word}{int(target)} tokens before giving a response."


def with_length_instruction(prompt: str, target: int, mode: str = "exact") -> str:
    """`prompt` + " " + the instruction (INTELLECT-2's "instruction" placement)."""
    return f"{prompt.rstrip()} {length_instruction(target, mode)}"


def _check_mode(mode: str) -> None:
    if mode not in LENGTH_MODES:
        raise ValueError(f"mode must be one of {LENGTH_MODES}, got {mode!r}")


def length_reward(
    task_reward: float,
    num_tokens: int,
    target: int,
    mode: str = "exact",
    *,
    alpha: float = ALPHA,
    max_reward_delta: float = MAX_REWARD_DELTA,
) -> float:
    """Total reward after the length term (formulas in the module docstring)."""
    _check_mode(mode)
    if num_tokens < 0 or target <= 0:
        raise ValueError(f"need num_tokens >= 0 and target > 0, got {num_tokens}, {target}")
    if mode == "exact":
        return task_reward - alpha * abs(num_tokens - target)
    if mode == "max":
        return task_reward * min(1.0, max(0.0, alpha * (target - num_tokens) + max_reward_delta))
    return task_reward if num_tokens <= target else 0.0


def length_penalty(num_tokens: int, target: int, mode: str = "exact", **kwargs: float) -> float:
    """total − task reward for a task reward of 1 (what INTELLECT-2 logged as length_penalties)."""
    return length_reward(1.0, num_tokens, target, mode, **kwargs) - 1.0


def sample_target_length(
    seed: int,
    key: str | int,
    *,
    targets: Sequence[int] | None = DEFAULT_TARGETS,
    low: int = 1000,
    high: int = 24000,
) -> int:
    """Reproducible target for one prompt: uniform over `targets`, or over [low, high] when
    `targets` is None. A validator with (seed, key) recomputes the same value
    (INTELLECT-2 drew it unseeded)."""
    rng = random.Random(f"{seed}:{key}")
    if targets is None:
        if not 0 < low <= high:
            raise ValueError(f"need 0 < low <= high, got {low}, {high}")
        return rng.randint(low, high)
    if not targets:
        raise ValueError("targets must not be empty")
    return int(rng.choice(list(targets)))
