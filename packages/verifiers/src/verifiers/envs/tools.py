"""Multi-turn tool environments: a Python sandbox and an exact calculator, deterministic where cheap.

`ToolEnv` answers each model turn: every `<tool_call>` in it is run and its output comes back as
a `tool` message; a turn without tool calls is the final answer and ends the episode, which is
then scored like a single-turn task (`verifiers.verify` on that last turn, weight 1), with the
number of tool calls and of malformed calls logged as weight-0 metrics. A tool that raises is
answered like a malformed call: `error: <tool> raised <Type>: <message>` goes back to the model,
the episode goes on, and the rubric decides what it costs (`bad_tool_calls` counts it).

Determinism (a re-run of the same calls gives the same outputs, so a validator can re-derive
every tool message): the calculator is exact rational arithmetic; the Python tool runs the code
in the existing sandbox (`verifiers.code`) in a fresh interpreter with the same environment on
every machine (`TOOL_ENVIRONMENT`: PYTHONHASHSEED=0, so set and dict-of-str order is fixed;
TZ=UTC; LANG, PATH) and `random` seeded with 0. What cannot be made equal is reported instead:
code that prints the clock or `id(object())` varies between two runs, and a program near the time
limit may finish on one machine and not on another. Such a run is reported through
`verifiers.machine_limits()` (`tool_timeout`, `tool_output_limit`, `tool_memory`, `tool_runner`)
and its output carries one of `LIMIT_MARKERS`, so a validator that re-runs the call can tell
"the machine may have cut this short" from a forged output (prime_rl's `tool_unverifiable`).
"""

from __future__ import annotations

import ast
import functools
import json
import operator
import re
from collections.abc import Callable
from fractions import Fraction

from verifiers import machine
from verifiers.code.sandbox import Limits, run_in_sandbox
from verifiers.envs.core import Environment, EnvTurn, Message, RewardFunc, Rubric, parse_tool_calls
from verifiers.envs.single_turn import verify_reward
from verifiers.task import Task

MAX_TOOL_OUTPUT = 4000  # characters of a tool's output shown to the model

Tool = Callable[[dict], str]

# ------------------------------------------------------------------ python

TOOL_ENVIRONMENT = {"PYTHONHASHSEED": "0", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC"}
"""The whole environment of a Python tool program, identical on a worker and a validator."""

# The sandbox's runner starts Python with -I (which ignores PYTHONHASHSEED), so the tool program
# re-executes itself in a fresh interpreter of the same sandbox with TOOL_ENVIRONMENT; the rlimits
# of the test process carry over through exec.
_PYTHON_LAUNCHER = """import os, sys
os.execve(sys.executable, [sys.executable, "-s", "-S", "-c", {script!r}], {environment!r})
"""
# In the fresh interpreter: seed `random`, then run the code as __main__ (tracebacks say "<code>").
_SCRIPT = (
    "import random\nrandom.seed(0)\nexec(compile({code!r}, '<code>', 'exec'), {{'__name__': '__main__'}})\n"
)


_LIMITED_STATUS = {
    "timeout": "tool_timeout",
    "killed": "tool_timeout",  # SIGKILL from the runner's wall deadline or the kernel
    "output_limit": "tool_output_limit",
    "memory": "tool_memory",
}
"""Sandbox statuses a machine can cause, and the `verifiers.machine` cause each is reported as."""

RUNNER_FAILED = "error: the sandbox did not run the code"
LIMIT_MARKERS = (*(f"\n[{status}]\n" for status in _LIMITED_STATUS), RUNNER_FAILED)
"""Texts in a Python tool output where (and only where) the machine may have cut the run short;
everything before the first one is what the program printed until then."""


def python_tool(arguments: dict, *, timeout_s: float = 5.0, memory_mb: int = 512) -> str:
    """Run `arguments["code"]` in the sandbox; its stdout, plus stderr's tail when it failed.

    A run the machine may have limited (`_LIMITED_STATUS`, or a runner that failed) is reported to
    `verifiers.machine_limits()` and its output holds one of `LIMIT_MARKERS`.
    """
    code = arguments.get("code")
    if not isinstance(code, str):
        return 'error: the python tool needs {"code": "<python source>"}'
    raw = run_in_sandbox(
        _PYTHON_LAUNCHER.format(script=_SCRIPT.format(code=code), environment=TOOL_ENVIRONMENT),
        "stdio",
        [""],
        limits=Limits(timeout_s=timeout_s, memory_mb=memory_mb),
    )
    if not raw.tests:
        machine.report("tool_runner", wall_clock=True)
        return f"{RUNNER_FAILED} ({raw.runner_error})"
    report = raw.tests[0]
    out = report["stdout"]
    cause = _LIMITED_STATUS.get(report["status"])
    if cause is None and raw.machine_limit is not None:
        cause = "tool_runner"
    machine.report(cause, wall_clock=True)
    if report["status"] == "ok":
        return out[:MAX_TOOL_OUTPUT]
    # the status line survives the cut, so a limited run's output always shows its marker
    status = (f"\n[{report['status']}]\n{report['stderr_tail']}")[: MAX_TOOL_OUTPUT // 2]
    return out[: MAX_TOOL_OUTPUT - len(status)] + status


class ToolPythonMismatch(RuntimeError):
    """This machine's Python tool runs another interpreter version than the run pins (:func:`tool_python_problem`)."""


@functools.cache
def tool_python() -> str:
    """``"major.minor"`` of the interpreter the Python tool runs programs in on this machine ("" if the
    sandbox cannot run one). Probed through the sandbox itself, not read from ``sys.version_info``: run
    as root without bubblewrap the sandbox may start another interpreter than the caller's
    (``verifiers.code.privileges.fallback_python``)."""
    out = python_tool({"code": "import sys\nprint('%d.%d' % sys.version_info[:2])"})
    return out.strip() if re.fullmatch(r"3\.\d{1,2}\n", out) else ""


def tool_python_problem(pinned: str | None) -> str | None:
    """Why this machine must not play or replay a run's Python tool calls, or None.

    A tool's output is its interpreter's: tracebacks and error texts change between minor versions
    (3.12 adds "Did you forget to import ...?"), and so does behaviour (a function new in 3.12
    raises on 3.11). Normalising the texts could not make two versions agree, so a run pins one
    version (``pinned``, from the orchestrator's ``GET /status``; None or "": no pin) and a worker
    or validator on another refuses to start rather than be judged, or judge, by another's output.
    """
    if not pinned:
        return None
    own = tool_python()
    if own == pinned:
        return None
    return (
        f"this run pins the Python tool interpreter to {pinned} (GET /status tool_python; tasks.environment.tool_python), "
        f"but this machine's Python tool runs {own or 'no interpreter (the sandbox failed)'}: its tool outputs "
        f"(tracebacks, error texts, library behaviour) would differ from the validator's replays. Run this role "
        f"with Python {pinned} (the interpreter the sandbox starts: sys.executable, or as root without bubblewrap "
        "the first usable system python3)"
    )


# ------------------------------------------------------------------ calculator

_BINARY: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Mod: operator.mod,
    ast.FloorDiv: operator.floordiv,
}
MAX_EXPONENT = 10_000
MAX_CALC_CHARS = 500


class CalculatorError(ValueError):
    """The expression is not plain arithmetic the calculator accepts."""


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exponent = _evaluate(node.left), _evaluate(node.right)
        if exponent.denominator != 1 or abs(exponent) > MAX_EXPONENT:
            raise CalculatorError(f"exponents must be integers of at most {MAX_EXPONENT}")
        return base ** int(exponent)
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def calculate(expression: str) -> str:
    """Exact value of `+ - * / // % **` arithmetic on integers and decimals: an integer or a
    fraction `p/q` (`calculate("1/3 + 0.5")` -> "5/6"); raises `CalculatorError`."""
    if len(expression) > MAX_CALC_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CALC_CHARS} characters")
    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
        value = _evaluate(tree)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except (SyntaxError, RecursionError) as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc}") from None
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def calculator_tool(arguments: dict) -> str:
    expression = arguments.get("expression")
    if not isinstance(expression, str):
        return 'error: the calculator needs {"expression": "<arithmetic>"}'
    try:
        return calculate(expression)
    except CalculatorError as exc:
        return f"error: {exc}"


# ------------------------------------------------------------------ environments


def _tool_calls(task: Task, messages: tuple[Message, ...]) -> float:
    return float(sum(1 for m in messages if m.role == "tool"))


def _bad_tool_calls(task: Task, messages: tuple[Message, ...]) -> float:
    return float(sum(1 for m in messages if m.role == "tool" and m.content.startswith("error: ")))


FEEDBACK = "That is not the right answer yet. Try again."
"""The `feedback` reply to a final answer the task's verifier rejects."""


class ToolEnv(Environment):
    """A multi-turn environment over named tools; the final answer is the first turn without a
    tool call, scored by the task type's verifier. `max_turns` bounds the model turns.

    `replayable` (default: the class's, False for `ToolEnv` itself) declares that every tool is a
    pure function of its arguments, so a validator may re-run the calls and compare; the shipped
    `PythonToolEnv` and `CalculatorEnv` declare it on the class. Leave it False for a tool that
    reads the clock or the network. `limit_markers`: texts a tool writes where the machine cut a
    run short (:data:`LIMIT_MARKERS` for the Python tool; none for a pure function). With
    `feedback`, a final answer the verifier rejects is answered with a user message
    (:data:`FEEDBACK`) and the episode goes on until an answer passes or the turns run out
    (self-correction episodes)."""

    def __init__(
        self,
        tools: dict[str, Tool],
        *,
        max_turns: int = 6,
        system_prompt: str = "",
        replayable: bool | None = None,
        feedback: bool = False,
    ):
        self.tools = dict(tools)
        self.max_turns = max_turns
        self.system_prompt = system_prompt
        if replayable is not None and replayable != type(self).replayable:
            self.replayable = replayable  # an explicit choice for this instance of a generic class
        self.feedback = feedback
        self.rubric = Rubric(
            (
                RewardFunc("verify", verify_reward, 1.0),
                RewardFunc("tool_calls", _tool_calls, 0.0),
                RewardFunc("bad_tool_calls", _bad_tool_calls, 0.0),
            )
        )

    def initial_messages(self, task: Task) -> tuple[Message, ...]:
        user = Message("user", task.prompt)
        return (Message("system", self.system_prompt), user) if self.system_prompt else (user,)

    def run_tool(self, name: str, arguments: dict) -> str:
        """The tool's output; an unknown tool, a tool that raises or one that returns no string is
        answered with an `error: ...` message (never an exception: the episode goes on)."""
        tool = self.tools.get(name)
        if tool is None:
            return f"error: unknown tool {name!r}; available: {sorted(self.tools)}"
        try:
            output = tool(arguments)
        except Exception as exc:  # the tool's bug or the model's bad arguments: the model is told
            return f"error: {name} raised {type(exc).__name__}: {exc}"[:MAX_TOOL_OUTPUT]
        if not isinstance(output, str):
            return f"error: {name} returned {type(output).__name__}, not text"
        return output

    def respond(self, task: Task, messages: tuple[Message, ...]) -> EnvTurn:
        calls = parse_tool_calls(messages[-1].content)
        if not calls:
            if self.feedback and verify_reward(task, messages) < 1.0:
                return EnvTurn((Message("user", FEEDBACK),), done=False)
            return EnvTurn((), done=True)
        replies = tuple(
            Message(
                "tool", f"error: {call.error}" if call.error else self.run_tool(call.name, call.arguments)
            )
            for call in calls
        )
        return EnvTurn(replies, done=False)


def _system_prompt(name: str, argument: str, example: str) -> str:
    call = json.dumps({"name": name, "arguments": {argument: example}})
    return (
        f"You may call the {name} tool by writing <tool_call>{call}</tool_call>; its output comes "
        "back in the next message. When you know the answer, reply without a tool call and put the "
        "final answer in \\boxed{}."
    )


class PythonToolEnv(ToolEnv):
    """Math (or any verifier's) tasks solved with a sandboxed Python tool named "python"."""

    replayable = True  # same code, same TOOL_ENVIRONMENT, same seed; the rest is a machine limit
    limit_markers = LIMIT_MARKERS

    def __init__(
        self, *, max_turns: int = 6, timeout_s: float = 5.0, memory_mb: int = 512, feedback: bool = False
    ):
        def python(arguments: dict) -> str:
            return python_tool(arguments, timeout_s=timeout_s, memory_mb=memory_mb)

        super().__init__(
            {"python": python},
            max_turns=max_turns,
            system_prompt=_system_prompt("python", "code", "print(2 ** 10)"),
            feedback=feedback,
        )


class CalculatorEnv(ToolEnv):
    """Arithmetic tasks solved with an exact calculator tool named "calculator"."""

    replayable = True  # exact rational arithmetic, no clock, no limits

    def __init__(self, *, max_turns: int = 6, feedback: bool = False):
        super().__init__(
            {"calculator": calculator_tool},
            max_turns=max_turns,
            system_prompt=_system_prompt("calculator", "expression", "47 * 30"),
            feedback=feedback,
        )
