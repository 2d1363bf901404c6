"""Math and code rewards for RL: symbolic answer checking and sandboxed test execution.

>>> from verifiers import Task, verify
>>> task = Task("What is 1/2 + 1/4?", "verifiable_math", '{"ground_truth": "3/4"}')
>>> verify(task, "So the answer is $\\\\boxed{0.75}$.").reward
1.0
"""

__version__ = "0.1.0"

from verifiers._name_clash import warn_on_name_clash as _warn_on_name_clash
from verifiers.batch import verify_batch, verify_batch_async
from verifiers.code import CodeResult, run_tests
from verifiers.completions import completion_text
from verifiers.errors import (
    EnvironmentSpecError,
    RewardError,
    SandboxError,
    TaskFormatError,
    UnknownTaskTypeError,
    VerifierError,
    WorkerError,
)
from verifiers.length import length_instruction, length_reward, sample_target_length
from verifiers.machine import MachineLimit, MachineLimits, machine_limits
from verifiers.math import extract_answer, is_equivalent
from verifiers.registry import get_verifier, register_verifier, registered_task_types, verify
from verifiers.reward_funcs import reward_func
from verifiers.rewards import register_builtin
from verifiers.task import Score, Task
from verifiers.tasks import arithmetic_tasks, humaneval_tasks, load_tasks, save_tasks

_warn_on_name_clash("verifiers", "intellect2-verifiers", others_hint="PrimeIntellect's RL-environments library `verifiers` on PyPI")

register_builtin()

__all__ = [
    "CodeResult",
    "EnvironmentSpecError",
    "MachineLimit",
    "MachineLimits",
    "RewardError",
    "SandboxError",
    "Score",
    "Task",
    "TaskFormatError",
    "UnknownTaskTypeError",
    "VerifierError",
    "WorkerError",
    "__version__",
    "arithmetic_tasks",
    "completion_text",
    "extract_answer",
    "get_verifier",
    "humaneval_tasks",
    "is_equivalent",
    "length_instruction",
    "length_reward",
    "load_tasks",
    "machine_limits",
    "register_verifier",
    "registered_task_types",
    "reward_func",
    "run_tests",
    "sample_target_length",
    "save_tasks",
    "verify",
    "verify_batch",
    "verify_batch_async",
]
