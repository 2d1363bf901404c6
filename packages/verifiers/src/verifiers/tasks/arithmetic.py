"""Seeded procedural arithmetic problems with exact integer answers (no hub needed).

Difficulty knobs: `digits` (operand digit range, inclusive), `terms` (operand count) and
`ops`. Evaluation follows the usual precedence on Python ints, so answers are exact; `/`
only appears as exact integer division (operands are constructed to divide evenly).
Same (n, seed, knobs) -> same tasks, on any machine.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from fractions import Fraction

from verifiers.task import Task

OPS = ("+", "-", "*", "/")
_WORDS = {"+": "plus", "-": "minus", "*": "times", "/": "divided by"}


def _operand(rng: random.Random, digits: tuple[int, int]) -> int:
    width = rng.randint(digits[0], digits[1])
    return rng.randint(0 if width == 1 else 10 ** (width - 1), 10**width - 1)


def _problem(rng: random.Random, ops: Sequence[str], digits: tuple[int, int], terms: int) -> tuple[str, int]:
    values = [_operand(rng, digits)]
    chosen: list[str] = []
    for _ in range(terms - 1):
        op = rng.choice(list(ops))
        value = _operand(rng, digits)
        if op == "/":
            if chosen and chosen[-1] == "/":
                op = "*" if "*" in ops else "+"
            else:
                # make the running term a multiple of the divisor: scale its last operand
                value = max(1, value)
                values[-1] *= value
        chosen.append(op)
        values.append(value)
    expression = " ".join([str(values[0])] + [f"{op} {v}" for op, v in zip(chosen, values[1:], strict=True)])
    return expression, _evaluate(values, chosen)


def _evaluate(values: list[int], ops: list[str]) -> int:
    """Exact value with the usual precedence (* and / before + and -)."""
    terms: list[Fraction] = [Fraction(values[0])]
    signs: list[str] = []
    for op, v in zip(ops, values[1:], strict=True):
        if op == "*":
            terms[-1] *= v
        elif op == "/":
            terms[-1] /= v
        else:
            signs.append(op)
            terms.append(Fraction(v))
    total = terms[0]
    for sign, term in zip(signs, terms[1:], strict=True):
        total = total + term if sign == "+" else total - term
    if total.denominator != 1:  # cannot happen by construction; guards the invariant
        raise AssertionError(f"non-integer answer {total} for {values} {ops}")
    return int(total)


def arithmetic_tasks(
    n: int,
    seed: int = 0,
    *,
    ops: Sequence[str] = ("+",),
    digits: tuple[int, int] = (1, 2),
    terms: int = 2,
    words: bool = False,
    match: str = "first_integer",
    template: str | None = None,
    task_type: str = "arithmetic_exact",
) -> list[Task]:
    """`n` seeded problems with exact integer answers, as tasks of one of three verifiers.

    `task_type` picks how a completion is scored (the problems are the same for every type):
      - "arithmetic_exact": the integer `match` finds equals the answer (verification_info
        `answer`, `match`, `expression`); default template "What is {expression}? Answer with
        the number only.";
      - "verifiable_math": the math verifier: the last `\\boxed{}` answer, symbolically equivalent
        to the answer (`ground_truth`; `fallbacks` = [] so only a boxed answer counts, as in
        INTELLECT-2); default template "What is {expression}?";
      - "prime_rl_code": the code verifier: the last fenced Python block is run in the sandbox
        and must print the answer (one stdin/stdout test, 2 s); default template "Use Python to
        compute {expression}.".

    Args:
        n: number of tasks; seed: RNG seed (tasks are a pure function of all arguments).
        ops: operators to draw from (subset of + - * /); digits: (min, max) operand digits;
        terms: operands per problem (>= 2).
        words: spell operators out ("3 plus 4") instead of symbols.
        match: how the verifier reads the completion: "first_integer" (default: the demo's
            models answer immediately), "last_integer" or "boxed".
        template: prompt with an `{expression}` field (None: the task type's default above).
        task_type: "arithmetic_exact", "verifiable_math" or "prime_rl_code".

    >>> t = arithmetic_tasks(1, seed=0)[0]
    >>> t.task_type, sorted(t.verification_info)
    ('arithmetic_exact', ['answer', 'expression', 'match'])
    """
    bad = set(ops) - set(OPS)
    if bad or not ops:
        raise ValueError(f"ops must be a non-empty subset of {OPS}, got {tuple(ops)}")
    if not (1 <= digits[0] <= digits[1] <= 18):
        raise ValueError(f"digits must satisfy 1 <= min <= max <= 18, got {digits}")
    if terms < 2:
        raise ValueError(f"terms must be >= 2, got {terms}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if task_type not in _TEMPLATES:
        raise ValueError(f"task_type must be one of {sorted(_TEMPLATES)}, got {task_type!r}")
    template = _TEMPLATES[task_type] if template is None else template
    rng = random.Random(f"arithmetic:{seed}:{tuple(ops)}:{digits}:{terms}")
    tasks = []
    for i in range(n):
        expression, answer = _problem(rng, ops, digits, terms)
        shown = expression
        if words:
            shown = " ".join(_WORDS.get(tok, tok) for tok in expression.split(" "))
        tasks.append(
            Task(
                prompt=template.format(expression=shown),
                task_type=task_type,
                verification_info=_verification_info(task_type, expression, answer, match),
                problem_id=f"arith-{seed}-{i}",
                source="verifiers.arithmetic",
            )
        )
    return tasks


_TEMPLATES = {
    "arithmetic_exact": "What is {expression}? Answer with the number only.",
    "verifiable_math": "What is {expression}?",
    "prime_rl_code": "Use Python to compute {expression}.",
}


def _verification_info(task_type: str, expression: str, answer: int, match: str) -> dict[str, object]:
    if task_type == "verifiable_math":
        return {"ground_truth": str(answer), "fallbacks": [], "expression": expression}
    if task_type == "prime_rl_code":
        tests = {"inputs": [""], "outputs": [str(answer)]}
        return {"test_cases": tests, "timeout_per_test": 2.0, "expression": expression}
    return {"answer": answer, "match": match, "expression": expression}
