"""Expression-level equivalence with sympy (runs inside a worker process).

Decision order for two expressions: identical text; exact plain numbers (`numbers.py`);
multiple-choice letters; sympy values: exact rationals compare exactly, other constants by
a 60-digit evaluation with relative tolerance 1e-45 (so `1/2004!` != `1/2006!`),
expressions with symbols by evaluation at fixed positive rational points (an identity
test; positive points make `\\sqrt{1/n}` == `1/\\sqrt{n}`), then `simplify` when the points
cannot be evaluated.

Pitfall: inputs whose evaluation would be astronomically large (`2^{10^9}`, `(10^8)!`) are
compared structurally, unevaluated; the worker's memory limit and kill-on-timeout backstop
anything this estimate misses.
"""

from __future__ import annotations

import builtins
import functools
import itertools
import re
import types
from fractions import Fraction

import sympy
from sympy.parsing.sympy_parser import (
    factorial_notation,
    implicit_multiplication,
    parse_expr,
    rationalize,
    standard_transformations,
)

from verifiers.math.latex import SAFE_NAMES, LatexError, to_sympy_source
from verifiers.math.numbers import Number, decimal_matches, numbers_equal, parse_number, values_with_percent
from verifiers.math.structural import Options

_TRANSFORMS = (*standard_transformations, implicit_multiplication, rationalize, factorial_notation)
POINTS = (
    sympy.Rational(1373, 1000),
    sympy.Rational(2719, 1000),
    sympy.Rational(631, 1000),
    sympy.Rational(4127, 1000),
)
MAX_BITS = 200_000


def _sympy_globals() -> dict[str, object]:
    """The namespace `parse_expr` builds when given none (`from sympy import *` plus the builtin
    functions), built once: rebuilding it on every call was most of a comparison's time."""
    names: dict[str, object] = {}
    exec("from sympy import *", names)
    names.update({k: v for k, v in vars(builtins).items() if isinstance(v, types.BuiltinFunctionType)})
    names.update(max=sympy.Max, min=sympy.Min)
    return names


_GLOBALS = _sympy_globals()


def _local_names(src: str) -> dict[str, object]:
    names: dict[str, object] = {}
    for name in set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", src)):
        if name in ("e",):
            names[name] = sympy.E
        elif name == "i":
            names[name] = sympy.I
        elif name not in SAFE_NAMES:
            names[name] = sympy.Symbol(name)
    return names


def _too_big(expr: sympy.Basic) -> bool:
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Pow):
            base, exp = node.args
            if exp.is_number and base.is_number:
                try:
                    e = abs(sympy.N(exp, 8))
                    b = abs(sympy.N(base, 8))
                    if e.is_finite and b.is_finite and b > 1 and e * sympy.log(b, 2) > MAX_BITS:
                        return True
                except (TypeError, ValueError, ZeroDivisionError):
                    return True
        elif isinstance(node, sympy.factorial | sympy.binomial):
            arg = node.args[0]
            if arg.is_number and abs(sympy.N(arg, 8)) > 20_000:
                return True
    return False


@functools.lru_cache(maxsize=4096)
def to_sympy(text: str) -> tuple[sympy.Basic, bool]:
    """(expression, too_big) for a normalised expression; raises LatexError if unparseable."""
    src = to_sympy_source(text.replace("%", ""))
    names = _local_names(src)
    try:
        if re.search(r"\*\*|!|factorial|binomial", src):  # only powers and factorials can explode
            lazy = parse_expr(
                src, local_dict=names, global_dict=dict(_GLOBALS), transformations=_TRANSFORMS, evaluate=False
            )
            if _too_big(lazy):
                return lazy, True
        expr = parse_expr(src, local_dict=names, global_dict=dict(_GLOBALS), transformations=_TRANSFORMS)
    except MemoryError:
        raise
    except Exception as exc:  # sympy's parser raises TokenError, IndexError, ... on junk
        raise LatexError(f"sympy could not parse {text[:200]!r}: {type(exc).__name__}") from exc
    if not isinstance(expr, sympy.Basic):
        raise LatexError(f"{text!r} is not an expression")
    return expr, False


def rename(pred: sympy.Basic, gold: sympy.Basic) -> sympy.Basic:
    gold_syms = sorted(gold.free_symbols, key=str)
    pred_syms = sorted(pred.free_symbols, key=str)
    if len(gold_syms) != len(pred_syms) or gold_syms == pred_syms:
        return pred
    return pred.xreplace(dict(zip(pred_syms, gold_syms, strict=True)))


def evaluate(expr: sympy.Basic, point: dict, digits: int = 40) -> sympy.Basic | None:
    value = sympy.N(expr.xreplace(point), digits)
    if not value.is_number or value.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        return None
    return value


def close(a: sympy.Basic, b: sympy.Basic, tol: float) -> bool:
    return bool(abs(a - b) <= tol * max(1, abs(a), abs(b)))


def _constants_equal(a: sympy.Basic, b: sympy.Basic) -> bool:
    if a == b:
        return True
    if a.is_Rational and b.is_Rational:
        return False
    if a.has(sympy.oo, -sympy.oo, sympy.zoo) or b.has(sympy.oo, -sympy.oo, sympy.zoo):
        return bool(sympy.simplify(a - b) == 0) if a.is_finite == b.is_finite else False
    va, vb = sympy.N(a, 60), sympy.N(b, 60)
    if not (va.is_number and vb.is_number):
        return bool(sympy.simplify(a - b) == 0)
    scale = max(abs(va), abs(vb))
    return bool(abs(va - vb) <= sympy.Float("1e-45", 60) * scale) or bool(va == vb == 0)


def _identity(a: sympy.Basic, b: sympy.Basic) -> bool:
    """a == b as functions of their symbols (random-point identity test, then simplify)."""
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    checked = 0
    for shift in range(len(POINTS)):
        point = {s: POINTS[(k + shift) % len(POINTS)] + k for k, s in enumerate(symbols)}
        va, vb = evaluate(a, point), evaluate(b, point)
        if va is None or vb is None:
            continue
        if not close(va, vb, 1e-25):
            return False
        checked += 1
    if checked >= 2:
        return True
    return bool(sympy.simplify(a - b) == 0)


def _decimal_vs_expression(literal: Number, expr: sympy.Basic, opts: Options) -> bool:
    if literal.decimals is None or expr.free_symbols:
        return False
    value = sympy.N(expr, literal.decimals + 30)
    if not value.is_real:
        return False
    exact = Fraction(str(sympy.Float(value, literal.decimals + 30)))
    return decimal_matches(literal, exact, opts.float_rounding)


def _candidates(text: str, number: Number | None) -> tuple[list[sympy.Basic], bool]:
    """Values `text` may stand for (`28%`: 28 and 0.28), and whether it is too big to evaluate.
    A plain number is taken exactly as `numbers.py` reads it (`1.5e3`, `33\\frac{1}{3}%`)."""
    if number is not None:
        return [sympy.Rational(v.numerator, v.denominator) for v in values_with_percent(number)], False
    expr, too_big = to_sympy(text)
    return ([expr, expr / 100] if "%" in text else [expr]), too_big


def atoms_equal(a: str, b: str, opts: Options) -> bool:
    """Equivalence of two expression strings (gold `a`, prediction `b`)."""
    if a == b:
        return True
    na, nb = parse_number(a), parse_number(b)
    if na is not None and nb is not None:
        return numbers_equal(na, nb, float_rounding=opts.float_rounding)
    letters = [re.fullmatch(r"\(?([A-Za-z])\)?", t.strip()) for t in (a, b)]
    if letters[0] and letters[1]:
        la, lb = letters[0].group(1), letters[1].group(1)
        return la == lb or (la.isupper() and la.lower() == lb.lower() and la in "ABCDEFGHIJ")
    candidates_a, big_a = _candidates(a, na)
    candidates_b, big_b = _candidates(b, nb)
    ea, eb = candidates_a[0], candidates_b[0]
    if big_a or big_b:
        return sympy.srepr(ea) == sympy.srepr(eb)
    if not opts.strict:
        candidates_b = [rename(y, ea) for y in candidates_b]
        eb = candidates_b[0]
    for literal, other in ((na, eb), (nb, ea)):
        if literal is not None and _decimal_vs_expression(literal, other, opts):
            return True
    for x, y in itertools.product(candidates_a, candidates_b):
        if not x.free_symbols and not y.free_symbols:
            if _constants_equal(x, y):
                return True
        elif _identity(x, y):
            return True
    return False
