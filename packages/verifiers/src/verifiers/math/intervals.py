"""Rigorous interval enclosures of real constant expressions, without sympy (the fast path).

`compare_constants(a, b)` decides two constant answers (`\\cos\\frac{\\pi}{3}` vs `\\frac12`,
`\\log_2 8` vs `3`) the way the worker's `expressions._constants_equal` would, or returns None:

- the worker calls two constants equal iff their 60-digit values agree to 1e-45 (relative),
  or both are the same sympy Rational. Here each side is enclosed in an interval
  (mpmath's interval arithmetic, outward rounding, in a private context) at a precision of
  at least `height(a) + height(b) + 256` bits, where `height` bounds the size of any rational
  the expression could equal (so two *different* rationals can never fall in one enclosure).
  Overlapping enclosures narrower than that, away from zero, mean equal; enclosures apart by
  more than 1e-40 (relative) mean different; anything else, or a value near zero (where the
  worker's relative test is unreliable), is None.
- the expression is read from `latex.to_sympy_source` (the text sympy would parse), with
  sympy's meaning: Python precedence, implicit products before names and parentheses,
  `e` = E, `log(x, b)` = log(x)/log(b), principal real branches only (`exact.parse_constant`;
  exact rational subtrees come from `exact.exact`). Complex results, symbols, `oo` and
  factorials of non-rationals give None.

Bounded work: `exact.parse_constant`'s limits, at most `MAX_PREC` bits of precision, and every
intermediate enclosure within 2**+-`MAX_MAGNITUDE`.
"""

from __future__ import annotations

import math
import threading
from fractions import Fraction
from typing import Any

from mpmath.libmp import finf, fnan, fninf, to_rational

from verifiers.math.exact import Node, NotConstant, exact, parse_constant

MAX_PREC = 2_000
MAX_EXPONENT = 64
MAX_MAGNITUDE = 4096  # bits: every intermediate enclosure lies within 2**+-4096 (or is 0)
_local = threading.local()


class _Decline(Exception):
    """Outside what this module encloses rigorously."""


def _ctx() -> Any:
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        from mpmath.ctx_iv import MPIntervalContext

        ctx = _local.ctx = MPIntervalContext()
    return ctx


def _height(node: Node) -> int:
    """Bits that bound numerator and denominator of any rational value of `node`."""
    value = exact(node)
    if value is not None:
        return value.numerator.bit_length() + value.denominator.bit_length() + 1
    if node.kind == "const":
        return 2
    if node.kind in ("!", "factorial", "binomial"):
        return MAX_PREC  # not evaluated here
    if node.kind == "**":
        exponent = exact(node.args[1])
        scale = abs(exponent.numerator) + 1 if exponent is not None else MAX_PREC
        return scale * _height(node.args[0]) + _height(node.args[1])
    if node.kind in ("*", "/", "neg"):
        return sum(_height(arg) for arg in node.args)
    return 2 * sum(_height(arg) for arg in node.args) + 4  # a sum: p/q + r/s = (ps + rq)/(qs)


def _positive(ctx: Any, x: Any) -> bool:
    return _bounds(x)[0] > 0


def _enclose(ctx: Any, node: Node) -> Any:
    """An enclosure of `node`'s value; declines magnitudes beyond 2**+-MAX_MAGNITUDE, so that
    later steps (argument reduction of sin, exp, exact endpoints) stay cheap."""
    value = _enclose_unchecked(ctx, node)
    for _sign, mantissa, exponent, bits in value._mpi_:
        if mantissa and not -MAX_MAGNITUDE <= exponent + bits <= MAX_MAGNITUDE:
            raise _Decline("magnitude")
        if not isinstance(mantissa, int) or not isinstance(exponent, int):
            raise _Decline("special value")
    return value


def _enclose_unchecked(ctx: Any, node: Node) -> Any:
    value = exact(node)
    if value is not None:
        return ctx.mpf(value.numerator) / ctx.mpf(value.denominator)
    kind, args = node.kind, node.args
    if kind == "const":
        return ctx.pi if args[0] == "pi" else ctx.e
    if kind == "neg":
        return -_enclose(ctx, args[0])
    if kind in ("+", "-", "*", "/"):
        a, b = _enclose(ctx, args[0]), _enclose(ctx, args[1])
        if kind == "/":
            if 0 in b:
                raise _Decline("division by an interval around zero")
            return a / b
        return a + b if kind == "+" else a - b if kind == "-" else a * b
    if kind == "**":
        base, exponent = _enclose(ctx, args[0]), exact(args[1])
        if exponent is not None and exponent.denominator == 1 and abs(exponent) <= MAX_EXPONENT:
            if exponent < 0 and 0 in base:
                raise _Decline("negative power of zero")
            return base ** int(exponent)
        if not _positive(ctx, base):
            raise _Decline("non-integer power of a possibly non-positive base")
        power = _enclose(ctx, args[1]) * ctx.log(base)
        if max(abs(v) for v in _bounds(power)) > MAX_MAGNITUDE // 2:
            raise _Decline("power overflow")
        return ctx.exp(power)
    values = [_enclose(ctx, arg) for arg in args]
    x = values[0]
    if kind == "exp" and max(abs(v) for v in _bounds(x)) > MAX_MAGNITUDE // 2:
        raise _Decline("exp overflow")
    if kind in ("sin", "cos", "exp"):
        return getattr(ctx, kind)(x)
    if kind in ("tan", "cot", "sec", "csc"):
        denominator = ctx.cos(x) if kind in ("tan", "sec") else ctx.sin(x)
        if 0 in denominator:
            raise _Decline("pole")
        numerator = {"tan": ctx.sin(x), "cot": ctx.cos(x)}.get(kind, ctx.mpf(1))
        return numerator / denominator
    if kind in ("asin", "acos"):
        lo, hi = _bounds(x)
        if not (lo > -1 and hi < 1):
            raise _Decline("inverse sine/cosine at or beyond +-1")
        other = ctx.sqrt(1 - x * x)
        return ctx.atan2(x, other) if kind == "asin" else ctx.atan2(other, x)
    if kind == "atan":
        return ctx.atan2(x, ctx.mpf(1))
    if kind == "log":
        if not _positive(ctx, x) or (len(values) == 2 and not _positive(ctx, values[1])):
            raise _Decline("logarithm of a possibly non-positive value")
        if len(values) == 1:
            return ctx.log(x)
        base = ctx.log(values[1])
        if 0 in base:
            raise _Decline("logarithm to base 1")
        return ctx.log(x) / base
    if kind in ("sqrt", "root"):
        n = 2 if kind == "sqrt" else exact(args[1])
        if n is None or n != int(n) or not 1 <= n <= MAX_EXPONENT:
            raise _Decline("root index")
        if not _positive(ctx, x):
            raise _Decline("root of a possibly non-positive value")
        return ctx.sqrt(x) if n == 2 else ctx.exp(ctx.log(x) / int(n))
    if kind == "Abs":
        if 0 in x:
            raise _Decline("absolute value around zero")
        return x if _positive(ctx, x) else -x
    # floor / ceiling: decided only when the enclosure sits strictly between two integers
    lo, hi = _bounds(x)
    whole = math.floor(lo)
    if lo == whole or math.floor(hi) != whole:
        raise _Decline("floor/ceiling near an integer")
    return ctx.mpf(whole if kind == "floor" else whole + 1)


def _bounds(x: Any) -> tuple[Fraction, Fraction]:
    """The exact rational endpoints of an interval."""
    lo, hi = x._mpi_
    if lo in (fnan, fninf, finf) or hi in (fnan, fninf, finf):
        raise _Decline("unbounded enclosure")
    return Fraction(*to_rational(lo)), Fraction(*to_rational(hi))


def compare_constants(a: str, b: str) -> bool | None:
    """The worker's decision for two real constant expressions, or None (never raises)."""
    try:
        na, nb = parse_constant(a), parse_constant(b)
        prec = _height(na) + _height(nb) + 256
        if prec > MAX_PREC:
            return None
        ctx = _ctx()
        ctx.prec = prec
        (a_lo, a_hi), (b_lo, b_hi) = _bounds(_enclose(ctx, na)), _bounds(_enclose(ctx, nb))
    except (NotConstant, _Decline, ZeroDivisionError, ValueError, ArithmeticError, RecursionError):
        return None
    if a_lo <= 0 <= a_hi or b_lo <= 0 <= b_hi:
        return None  # near zero the worker's relative test is not reliable
    scale = max(abs(a_lo), abs(a_hi), abs(b_lo), abs(b_hi))
    if a_hi < b_lo or b_hi < a_lo:  # disjoint: the gap decides
        gap = b_lo - a_hi if a_hi < b_lo else a_lo - b_hi
        return False if gap > scale * Fraction(1, 10**40) else None
    spread = max(a_hi, b_hi) - min(a_lo, b_lo)  # bounds |a - b| from above
    tight = Fraction(1, 2 ** (_height(na) + _height(nb) + 64))
    return True if spread < tight and spread < min(abs(a_lo), abs(b_lo)) * Fraction(1, 10**50) else None
