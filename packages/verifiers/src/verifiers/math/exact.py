"""Constant expressions without sympy: a parse tree and exact rational values (the fast path).

`parse_constant(text)` reads a normalised expression through `latex.to_sympy_source` (the text
the worker hands to sympy) into a small tree, with sympy's meaning: Python precedence
(`-2**2` = -4, `2**3**2` = 2**9), implicit products before a name or a parenthesis (`2(3)`,
`3 pi`), postfix `!` on the preceding number or group, decimals read exactly (sympy's
`rationalize`), `e` = E. Names other than `pi`, `e`/`E` and the functions in `FUNCTIONS`
(symbols, `oo`, `I`) raise `NotConstant`.

`exact(node)` is the exact rational value of a tree made of numbers, `+ - * /`, integer powers,
factorials and binomials, or None; `exact_value(text)` does both steps
(`exact_value("\\frac{100!}{98!}") == Fraction(9900)`). `intervals.py` encloses the rest.

Bounded work on hostile input: at most `MAX_CHARS` characters and `MAX_DEPTH` nesting; no
power, factorial or binomial whose result could exceed `MAX_BITS` bits is evaluated (sympy
compares such values structurally instead: `expressions._too_big`, whose thresholds are far
above these).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from verifiers.math.latex import LatexError, to_sympy_source

MAX_CHARS = 400
MAX_DEPTH = 40
MAX_BITS = 20_000
MAX_FACTORIAL = 1_000
FUNCTIONS = frozenset(
    {"sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "log", "exp", "sqrt", "root"}
    | {"floor", "ceiling", "Abs", "factorial", "binomial"}
)
_ARITY = {"root": (2,), "log": (1, 2), "binomial": (2,)}
_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*|\.\d+)|(\*\*|[-+*/(),!])|([A-Za-z_][A-Za-z0-9_]*))")


class NotConstant(Exception):
    """The text is not a constant expression this module reads."""


@dataclass(frozen=True)
class Node:
    """A parsed constant: `kind` is "num" (args: a Fraction), "const" ("pi" or "E"), "neg",
    "+", "-", "*", "/", "**", "!" (factorial) or a function name from `FUNCTIONS`."""

    kind: str
    args: tuple


class _Parser:
    def __init__(self, src: str):
        self.tokens: list[str] = []
        i = 0
        while i < len(src):
            m = _TOKEN.match(src, i)
            if m is None or m.end() == i:
                if src[i:].strip():
                    raise NotConstant(f"unexpected {src[i : i + 10]!r}")
                break
            self.tokens.append(m.group(m.lastindex or 0))
            i = m.end()
        self.i = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise NotConstant(f"expected {expected!r}")
        self.i += 1
        return token

    def nested(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise NotConstant("nested too deeply")

    def expr(self) -> Node:
        self.nested()
        node = self.term()
        while self.peek() in ("+", "-"):
            node = Node(self.take(), (node, self.term()))
        self.depth -= 1
        return node

    def term(self) -> Node:
        node = self.unary()
        while True:
            token = self.peek()
            if token in ("*", "/"):
                node = Node(self.take(), (node, self.unary()))
            elif token is not None and (token == "(" or token[0].isalpha()):
                node = Node("*", (node, self.unary()))  # sympy's implicit multiplication
            else:
                return node

    def unary(self) -> Node:
        if self.peek() in ("+", "-"):
            self.nested()
            sign = self.take()
            node = self.unary()
            self.depth -= 1
            return Node("neg", (node,)) if sign == "-" else node
        node = self.postfix()
        if self.peek() == "**":  # right-associative; `2**-1` as in Python
            self.take()
            self.nested()
            node = Node("**", (node, self.unary()))
            self.depth -= 1
        return node

    def postfix(self) -> Node:
        node = self.primary()
        if self.peek() == "!":
            self.take()
            if self.peek() == "!":
                raise NotConstant("double factorial")
            node = Node("!", (node,))
        return node

    def primary(self) -> Node:
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            if len(token) > MAX_BITS // 4:
                raise NotConstant("literal too long")
            return Node("num", (Fraction(token[:-1] if token.endswith(".") else token),))
        if token == "(":
            node = self.expr()
            self.take(")")
            return node
        if token in ("pi", "E", "e"):
            if self.peek() == "(":
                raise NotConstant("a constant followed by a parenthesis")
            return Node("const", ("pi" if token == "pi" else "E",))
        if token in FUNCTIONS:
            self.take("(")
            args = [self.expr()]
            while self.peek() == ",":
                self.take()
                args.append(self.expr())
            self.take(")")
            if len(args) not in _ARITY.get(token, (1,)):
                raise NotConstant(f"{token} with {len(args)} arguments")
            return Node(token, tuple(args))
        raise NotConstant(f"unsupported name {token!r}")


def parse_constant(text: str) -> Node:
    """The tree of the normalised expression `text`; raises `NotConstant`."""
    if len(text) > MAX_CHARS or "%" in text:
        raise NotConstant("too long, or a percentage")
    try:
        src = to_sympy_source(text)
    except (LatexError, RecursionError) as exc:
        raise NotConstant(str(exc)) from exc
    parser = _Parser(src)
    node = parser.expr()
    if parser.peek() is not None:
        raise NotConstant("trailing text")
    return node


def _bits(x: Fraction) -> int:
    return max(abs(x.numerator).bit_length(), x.denominator.bit_length())


def _integer(x: Fraction | None, lo: int, hi: int) -> int | None:
    return x.numerator if x is not None and x.denominator == 1 and lo <= x.numerator <= hi else None


_RATIONAL_KINDS = frozenset({"neg", "+", "-", "*", "/", "**", "!", "factorial", "binomial"})


def exact(node: Node) -> Fraction | None:
    """The exact rational value of `node`, or None (not rational-only, or too large)."""
    if node.kind == "num":
        return node.args[0]
    if node.kind not in _RATIONAL_KINDS:
        return None
    values = [exact(arg) for arg in node.args]
    if any(v is None for v in values):
        return None
    result = _combine(node.kind, [v for v in values if v is not None])
    return result if result is not None and _bits(result) <= MAX_BITS else None


def _combine(kind: str, values: list[Fraction]) -> Fraction | None:
    a, b = values[0], values[-1]
    if kind == "neg":
        return -a
    if kind in ("+", "-", "*"):
        return a + b if kind == "+" else a - b if kind == "-" else a * b
    if kind == "/":
        return None if b == 0 else a / b
    if kind == "**":
        e = _integer(b, -MAX_BITS, MAX_BITS)
        if e is None or (a == 0 and e <= 0) or abs(e) * max(_bits(a), 1) > MAX_BITS:
            return None
        return a**e
    n = _integer(a, 0, MAX_FACTORIAL)
    if n is None:
        return None
    if kind in ("!", "factorial"):
        return Fraction(math.factorial(n))
    k = _integer(b, 0, n)  # binomial(n, k) with 0 <= k <= n only
    return None if k is None else Fraction(math.comb(n, k))


def exact_value(text: str) -> Fraction | None:
    """The exact rational value of the normalised expression `text`, or None (never raises)."""
    try:
        return exact(parse_constant(text))
    except (NotConstant, RecursionError):
        return None
