"""The task row and the score: INTELLECT-2 / GENESYS compatible schema.

A task is one dataset row: `prompt`, `task_type` (selects the verifier) and
`verification_info` (verifier-specific data; the INTELLECT-2 RL dataset stores it as a JSON
string, GENESYS as a Python-literal string; both are decoded here).
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verifiers.errors import TaskFormatError
from verifiers.machine import MACHINE_LIMITS, MachineLimit


def decode_info(info: object) -> dict[str, Any]:
    """`verification_info` as a dict, from a dict, a JSON string or a Python-literal string."""
    if isinstance(info, Mapping):
        return dict(info)
    if info is None:
        return {}
    if isinstance(info, bytes | bytearray):
        info = info.decode()
    if not isinstance(info, str):
        raise TaskFormatError(f"verification_info must be a dict or a string, got {type(info).__name__}")
    try:
        value = json.loads(info)
    except ValueError:
        try:
            value = ast.literal_eval(info)
        except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
            raise TaskFormatError(f"verification_info is neither JSON nor a Python literal: {exc}") from exc
    if not isinstance(value, Mapping):
        raise TaskFormatError(f"verification_info must decode to an object, got {type(value).__name__}")
    return dict(value)


@dataclass(frozen=True)
class Task:
    """One RL task.

    Attributes:
        prompt: the problem text shown to the model.
        task_type: verifier key, e.g. "verifiable_math", "prime_rl_code", "arithmetic_exact".
        verification_info: verifier data (dict; a JSON/Python-literal string is decoded).
            math: {"ground_truth": str | number | list}; code: {"test_cases": ...}.
        problem_id, source: provenance (GENESYS / INTELLECT-2 columns).
        solve_rate: `solve_rate_qwen_r1_distill_7b` of the INTELLECT-2 dataset (difficulty).
        metadata: anything else from the row.
    """

    prompt: str
    task_type: str
    verification_info: Mapping[str, Any] = field(default_factory=dict, hash=False)
    problem_id: str | None = None
    source: str | None = None
    solve_rate: float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str):
            raise TaskFormatError(f"prompt must be a str, got {type(self.prompt).__name__}")
        if not isinstance(self.task_type, str) or not self.task_type:
            raise TaskFormatError("task_type must be a non-empty str")
        object.__setattr__(self, "verification_info", decode_info(self.verification_info))

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Task:
        """Build from an INTELLECT-2 or GENESYS row; unknown columns go to `metadata`."""
        missing = {"prompt", "task_type"} - set(row)
        if missing:
            raise TaskFormatError(f"row lacks {sorted(missing)}; has {sorted(row)[:10]}")
        known = {
            "prompt",
            "task_type",
            "verification_info",
            "problem_id",
            "source",
            "solve_rate_qwen_r1_distill_7b",
        }
        metadata = dict(row.get("metadata") or {}) if isinstance(row.get("metadata"), Mapping) else {}
        metadata.update({k: v for k, v in row.items() if k not in known and k != "metadata"})
        solve_rate = row.get("solve_rate_qwen_r1_distill_7b")
        return cls(
            prompt=row["prompt"],
            task_type=row["task_type"],
            verification_info=row.get("verification_info") or {},
            problem_id=None if row.get("problem_id") is None else str(row["problem_id"]),
            source=row.get("source"),
            solve_rate=None if solve_rate is None else float(solve_rate),
            metadata=metadata,
        )

    def to_row(self) -> dict[str, Any]:
        """INTELLECT-2 schema row (`verification_info` as a JSON string)."""
        row: dict[str, Any] = {
            "problem_id": self.problem_id,
            "task_type": self.task_type,
            "prompt": self.prompt,
            "verification_info": json.dumps(self.verification_info),
            "solve_rate_qwen_r1_distill_7b": self.solve_rate,
        }
        if self.source is not None:
            row["source"] = self.source
        return row


@dataclass(frozen=True)
class Score:
    """A verifier's verdict on one completion.

    Attributes:
        reward: in [0, 1].
        details: verifier-specific facts (extracted answer, tests passed, elapsed time ...).
        failure: None when the completion was judged on its merits, else why it scored 0:
            "no_answer", "mismatch", "timeout", "no_code", "tests_failed", "sandbox_error",
            "error", "deadline".
        machine_limit: None when the machine cannot have lowered `reward`, else the wall-clock-limited
            check that may have (`verifiers.machine.MachineLimit`: "sandbox_start", "test_timeout",
            "math_timeout", "deadline"); a re-run may score higher. Set only where it matters: a
            binary code reward whose failing tests include a program's wrong answer is not limited.
        wall_clock_checked: the verifier ran a wall-clock-limited check (a sandbox run, a symbolic
            comparison under a timeout), limited or not: a spoiled run elsewhere could score lower.
    """

    reward: float
    details: Mapping[str, Any] = field(default_factory=dict, hash=False)
    failure: str | None = None
    machine_limit: MachineLimit | None = None
    wall_clock_checked: bool = False

    def __post_init__(self) -> None:
        reward = float(self.reward)
        if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
            raise ValueError(f"reward must be in [0, 1], got {self.reward!r}")
        object.__setattr__(self, "reward", reward)
        if self.machine_limit is not None and self.machine_limit not in MACHINE_LIMITS:
            raise ValueError(f"machine_limit must be None or one of {MACHINE_LIMITS}, got {self.machine_limit!r}")
        if self.machine_limit is not None:
            object.__setattr__(self, "wall_clock_checked", True)
