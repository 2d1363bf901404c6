"""Multi-turn tool environments: a Python sandbox and an exact calculator, both deterministic.

`ToolEnv` answers each model turn: every `<tool_call>` in it is run and its output comes back as
a `tool` message; a turn without tool calls is the final answer and ends the episode, which is
then scored like a single-turn task (`verifiers.verify` on that last turn, weight 1), with the
number of tool calls and of malformed calls logged as weight-0 metrics.

Determinism (a re-run of the same calls gives the same outputs, so a validator can re-derive
every tool message): the calculator is exact rational arithmetic; the Python tool runs the code
in the existing sandbox (`verifiers.code`) in a fresh interpreter with PYTHONHASHSEED=0 (set
and dict-of-str order fixed) and `random` seeded with 0. Pitfall: code that reads the clock,
`os.urandom` or the process id still varies; such tools would have to be declared non-replayable.
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Callable
from fractions import Fraction

from verifiers.code.sandbox import Limits, run_in_sandbox
from verifiers.envs.core import Environment, EnvTurn, Message, RewardFunc, Rubric, parse_tool_calls
from verifiers.envs.single_turn import verify_reward
from verifiers.task import Task

MAX_TOOL_OUTPUT = 4000  # characters of a tool's output shown to the model

Tool = Callable[[dict], str]

# ------------------------------------------------------------------ python

# The sandbox's runner starts Python with -I (which ignores PYTHONHASHSEED), so the tool program
# re-executes itself in a fresh interpreter of the same sandbox with a fixed hash seed; the
# rlimits of the test process carry over through exec.
_PYTHON_LAUNCHER = """import os, sys
os.execve(sys.executable, [sys.executable, "-s", "-S", "-c", {script!r}],
          {{"PYTHONHASHSEED": "0", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}})
"""
# In the fresh interpreter: seed `random`, then run the code as __main__ (tracebacks say "<code>").
_SCRIPT = (
    "import random\nrandom.seed(0)\nexec(compile({code!r}, '<code>', 'exec'), {{'__name__': '__main__'}})\n"
)


def python_tool(arguments: dict, *, timeout_s: float = 5.0, memory_mb: int = 512) -> str:
    """Run `arguments["code"]` in the sandbox; its stdout, plus stderr's tail when it failed."""
    code = arguments.get("code")
    if not isinstance(code, str):
        return 'error: the python tool needs {"code": "<python source>"}'
    raw = run_in_sandbox(
        _PYTHON_LAUNCHER.format(script=_SCRIPT.format(code=code)),
        "stdio",
        [""],
        limits=Limits(timeout_s=timeout_s, memory_mb=memory_mb),
    )
    if not raw.tests:
        return f"error: the sandbox did not run the code ({raw.runner_error})"
    report = raw.tests[0]
    out = report["stdout"]
    if report["status"] != "ok":
        out += f"\n[{report['status']}]\n{report['stderr_tail']}"
    return out[:MAX_TOOL_OUTPUT]


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

    `replayable` declares that every tool is a pure function of its arguments (the shipped ones
    are); pass False for a tool that reads the clock or the network. With `feedback`, a final
    answer the verifier rejects is answered with a user message (:data:`FEEDBACK`) and the episode
    goes on until an answer passes or the turns run out (self-correction episodes)."""

    def __init__(
        self,
        tools: dict[str, Tool],
        *,
        max_turns: int = 6,
        system_prompt: str = "",
        replayable: bool = True,
        feedback: bool = False,
    ):
        self.tools = dict(tools)
        self.max_turns = max_turns
        self.system_prompt = system_prompt
        self.replayable = replayable
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
        tool = self.tools.get(name)
        if tool is None:
            return f"error: unknown tool {name!r}; available: {sorted(self.tools)}"
        return tool(arguments)

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

    def __init__(self, *, max_turns: int = 6, feedback: bool = False):
        super().__init__(
            {"calculator": calculator_tool},
            max_turns=max_turns,
            system_prompt=_system_prompt("calculator", "expression", "47 * 30"),
            feedback=feedback,
        )
