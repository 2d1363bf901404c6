"""Exact rational value of a constant arithmetic expression, without sympy (the fast path).

`exact_value("\\frac{100!}{98!}") == Fraction(9900)`. The expression is first converted by
`latex.to_sympy_source` (the same conversion the worker hands to sympy), then read with a
small recursive-descent parser that accepts only what it can evaluate exactly and exactly as
sympy's `parse_expr` would: integer literals, `+ - * /`, integer powers `**`, postfix `!`,
`factorial(n)`, `binomial(n, k)` and parentheses, with Python's precedence (`-2**2` = -4,
`2**3**2` = 2**9). Anything else (decimals, names, implicit products like `2(3)`, division by
zero, non-integer powers) gives None, and the caller asks sympy.

Work is bounded on hostile input: at most `MAX_CHARS` characters, `MAX_DEPTH` nesting, and
no power, factorial or binomial whose result could exceed `MAX_BITS` bits; those give None
too (sympy compares such values structurally instead: `expressions._too_big`, whose
thresholds are far above these).
"""

from __future__ import annotations

import re
from fractions import Fraction

from verifiers.math.latex import LatexError, to_sympy_source

MAX_CHARS = 400
MAX_DEPTH = 40
MAX_BITS = 20_000
MAX_FACTORIAL = 1_000

_TOKEN = re.compile(r"\s*(?:(\d+)|(\*\*|[-+*/(),!])|([A-Za-z_][A-Za-z0-9_]*))")


class _NotExact(Exception):
    """The expression is outside what this module evaluates."""


def _tokens(src: str) -> list[str]:
    out, i = [], 0
    while i < len(src):
        m = _TOKEN.match(src, i)
        if m is None or m.end() == i:
            if src[i:].strip():
                raise _NotExact(src[i : i + 10])
            break
        out.append(m.group(m.lastindex or 0))
        i = m.end()
    return out


def _bits(x: Fraction) -> int:
    return max(abs(x.numerator).bit_length(), x.denominator.bit_length())


def _integer(x: Fraction, lo: int, hi: int) -> int:
    if x.denominator != 1 or not lo <= x.numerator <= hi:
        raise _NotExact("argument out of range")
    return x.numerator


def _factorial(n: int) -> int:
    result = 1
    for k in range(2, n + 1):
        result *= k
    return result


class _Parser:
    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.i = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _NotExact(f"expected {expected!r}")
        self.i += 1
        return token

    def expr(self) -> Fraction:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _NotExact("too deep")
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        self.depth -= 1
        return self._checked(value)

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/"):
            if self.take() == "*":
                value *= self.unary()
            else:
                divisor = self.unary()
                if divisor == 0:
                    raise _NotExact("division by zero")
                value /= divisor
            value = self._checked(value)
        return value

    def unary(self) -> Fraction:
        if self.peek() in ("+", "-"):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _NotExact("too deep")
            sign = self.take()
            value = self.unary()
            self.depth -= 1
            return -value if sign == "-" else value
        return self.power()

    def power(self) -> Fraction:
        base = self.postfix()
        if self.peek() != "**":
            return base
        self.take()
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _NotExact("too deep")
        exponent = self.unary()  # right-associative; `2**-1` is allowed as in Python
        self.depth -= 1
        e = _integer(exponent, -MAX_BITS, MAX_BITS)
        if base == 0 and e <= 0:
            raise _NotExact("0 to a non-positive power")
        if abs(e) * max(_bits(base), 1) > MAX_BITS:
            raise _NotExact("power too large")
        return base**e

    def postfix(self) -> Fraction:
        value = self.primary()
        if self.peek() == "!":
            self.take()
            if self.peek() == "!":
                raise _NotExact("double factorial")
            value = Fraction(_factorial(_integer(value, 0, MAX_FACTORIAL)))
        return value

    def primary(self) -> Fraction:
        token = self.take()
        if token.isdigit():
            if len(token) > MAX_BITS // 4:
                raise _NotExact("literal too long")
            return Fraction(int(token))
        if token == "(":
            value = self.expr()
            self.take(")")
            return value
        if token in ("factorial", "binomial"):
            self.take("(")
            n = _integer(self.expr(), 0, MAX_FACTORIAL)
            if token == "factorial":
                self.take(")")
                return Fraction(_factorial(n))
            self.take(",")
            k = _integer(self.expr(), 0, n)
            self.take(")")
            return Fraction(_factorial(n) // (_factorial(k) * _factorial(n - k)))
        raise _NotExact(f"unsupported token {token!r}")

    def _checked(self, value: Fraction) -> Fraction:
        if _bits(value) > MAX_BITS:
            raise _NotExact("value too large")
        return value


def exact_value(text: str) -> Fraction | None:
    """The exact rational value of the normalised expression `text`, or None (never raises)."""
    if len(text) > MAX_CHARS or "%" in text:
        return None
    try:
        src = to_sympy_source(text)
    except (LatexError, RecursionError):
        return None
    if "." in src or len(src) > 4 * MAX_CHARS:
        return None
    try:
        parser = _Parser(_tokens(src))
        value = parser.expr()
        if parser.peek() is not None:
            return None
        return value
    except _NotExact:
        return None
