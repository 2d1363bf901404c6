"""Environments: tasks as (multi-turn) episodes with tools, scored by a rubric of weighted rewards.

>>> from verifiers import Task
>>> from verifiers.envs import CalculatorEnv, run_episode
>>> script = iter(['<tool_call>{"name": "calculator", "arguments": {"expression": "47 * 30"}}</tool_call>',
...                "So the answer is $\\\\boxed{1410}$."])
>>> episode = run_episode(CalculatorEnv(), Task("47 * 30?", "verifiable_math", {"ground_truth": "1410"}),
...                       lambda messages: next(script))
>>> [m.content for m in episode.messages if m.role == "tool"], episode.score.reward
(['1410'], 1.0)
"""

from __future__ import annotations

from verifiers.envs.checks import check_environment, defined_at
from verifiers.envs.core import (
    Environment,
    EnvTurn,
    Episode,
    Message,
    RewardFunc,
    Rubric,
    RubricScore,
    ToolCall,
    last_assistant,
    parse_tool_calls,
    reward_value,
    run_episode,
)
from verifiers.envs.single_turn import CodeEnv, MathEnv, SingleTurnEnv
from verifiers.envs.tools import (
    FEEDBACK,
    CalculatorEnv,
    CalculatorError,
    PythonToolEnv,
    ToolEnv,
    ToolPythonMismatch,
    calculate,
    calculator_tool,
    python_tool,
    tool_python,
    tool_python_problem,
)

__all__ = [
    "FEEDBACK",
    "CalculatorEnv",
    "CalculatorError",
    "CodeEnv",
    "EnvTurn",
    "Environment",
    "Episode",
    "MathEnv",
    "Message",
    "PythonToolEnv",
    "RewardFunc",
    "Rubric",
    "RubricScore",
    "SingleTurnEnv",
    "ToolCall",
    "ToolEnv",
    "ToolPythonMismatch",
    "calculate",
    "calculator_tool",
    "check_environment",
    "defined_at",
    "last_assistant",
    "parse_tool_calls",
    "python_tool",
    "reward_value",
    "run_episode",
    "tool_python",
    "tool_python_problem",
]
