"""Comparison of program output with the expected output (host side, pure functions).

`outputs_match` (stdin/stdout tests): equal after dropping trailing whitespace on every
line and trailing blank lines; otherwise token by token, where numeric tokens may differ
by `rel_tol`/`abs_tol` (INTELLECT-2 used numpy.allclose's 1e-5/1e-8). With
`order_insensitive=True` the lines are compared as multisets.

`results_match` (function-call tests): the returned value (sent back as its Python `repr`
and read with `ast.literal_eval`, never evaluated) equals the expected JSON value, numbers
compared with the same tolerances, tuples as lists; a one-element expected list also
matches its element (INTELLECT-2 stored call outputs wrapped in a list).
"""

from __future__ import annotations

import ast
import math


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _tokens_match(a: str, b: str, rel_tol: float, abs_tol: float) -> bool:
    if a == b:
        return True
    x, y = _number(a), _number(b)
    return x is not None and y is not None and abs(x - y) <= abs_tol + rel_tol * abs(y)


def outputs_match(
    actual: str,
    expected: str,
    *,
    rel_tol: float = 1e-5,
    abs_tol: float = 1e-8,
    order_insensitive: bool = False,
) -> bool:
    """True iff a program's stdout `actual` is an acceptable rendering of `expected`."""
    got, want = _lines(actual), _lines(expected)
    if order_insensitive:
        got, want = sorted(got), sorted(want)
    if got == want:
        return True
    got_tokens = [line.split() for line in got]
    want_tokens = [line.split() for line in want]
    if [len(t) for t in got_tokens] != [len(t) for t in want_tokens]:
        flat_got = [t for line in got_tokens for t in line]
        flat_want = [t for line in want_tokens for t in line]
        if len(flat_got) != len(flat_want):
            return False
        return all(_tokens_match(a, b, rel_tol, abs_tol) for a, b in zip(flat_got, flat_want, strict=True))
    return all(
        _tokens_match(a, b, rel_tol, abs_tol)
        for line_got, line_want in zip(got_tokens, want_tokens, strict=True)
        for a, b in zip(line_got, line_want, strict=True)
    )


def _values_match(a: object, b: object, rel_tol: float, abs_tol: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(
            _values_match(x, y, rel_tol, abs_tol) for x, y in zip(a, b, strict=True)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_values_match(a[k], b[k], rel_tol, abs_tol) for k in a)
    return a == b


MAX_RESULT_CHARS = 1 << 20


def _plain(value: object) -> object:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def results_match(
    result_repr: str | None, expected: object, *, rel_tol: float = 1e-5, abs_tol: float = 1e-8
) -> bool:
    """True iff the returned value (its `repr`) equals `expected` (a decoded JSON value)."""
    if not result_repr or len(result_repr) > MAX_RESULT_CHARS:
        return False
    try:
        result = _plain(ast.literal_eval(result_repr))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    if _values_match(result, expected, rel_tol, abs_tol):
        return True
    return (
        isinstance(expected, list)
        and len(expected) == 1
        and _values_match(result, expected[0], rel_tol, abs_tol)
    )
