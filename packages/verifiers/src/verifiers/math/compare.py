"""Equivalence of two parsed answers (runs inside a worker process; imports sympy).

Decision order for two expressions: identical text; exact plain numbers (`numbers.py`);
sympy values: exact rationals compare exactly, other constants by a 60-digit evaluation
with relative tolerance 1e-45 (so `1/2004!` != `1/2006!`), expressions with symbols by
evaluation at three fixed irrational-free positive points (an identity test; positive
points mean `\\sqrt{1/n}` == `1/\\sqrt{n}`). Relations compare `lhs - rhs` up to a constant
factor (positive for inequalities). Sets/lists match as multisets, tuples in order.

Direction matters (math-verify's convention): a *gold* inequality is compared with a
predicted interval/set, but a gold set is compared with a predicted inequality only when
`allow_set_relation_comp=True`.

Pitfall: inputs whose evaluation would be astronomically large (`2^{10^9}`, `(10^8)!`) are
compared structurally, unevaluated; the worker's memory limit and kill-on-timeout backstop
anything this estimate misses.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass
from fractions import Fraction

import sympy
from sympy.parsing.sympy_parser import (
    factorial_notation,
    implicit_multiplication,
    parse_expr,
    rationalize,
    standard_transformations,
)

from verifiers.math import structure as st
from verifiers.math.extract import answer_span, last_number
from verifiers.math.latex import LatexError, normalize, to_sympy_source
from verifiers.math.numbers import Number, decimal_matches, numbers_equal, parse_number

_TRANSFORMS = (*standard_transformations, implicit_multiplication, rationalize, factorial_notation)
_POINTS = (
    sympy.Rational(1373, 1000),
    sympy.Rational(2719, 1000),
    sympy.Rational(631, 1000),
    sympy.Rational(4127, 1000),
)
MAX_BITS = 200_000


@dataclass(frozen=True)
class Options:
    """Comparison settings (math-verify's names and defaults)."""

    float_rounding: int = 6
    strict: bool = True
    allow_set_relation_comp: bool = False


def _local_names(src: str) -> dict[str, object]:
    names: dict[str, object] = {}
    for name in set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", src)):
        if name in ("e",):
            names[name] = sympy.E
        elif name == "i":
            names[name] = sympy.I
        elif name not in to_sympy_names():
            names[name] = sympy.Symbol(name)
    return names


@functools.cache
def to_sympy_names() -> frozenset[str]:
    from verifiers.math.latex import SAFE_NAMES

    return frozenset(SAFE_NAMES)


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
        lazy = parse_expr(src, local_dict=names, transformations=_TRANSFORMS, evaluate=False)
        if _too_big(lazy):
            return lazy, True
        expr = parse_expr(src, local_dict=names, transformations=_TRANSFORMS)
    except (SyntaxError, TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:
        raise LatexError(f"sympy could not parse {text!r}: {exc}") from exc
    if not isinstance(expr, sympy.Basic):
        raise LatexError(f"{text!r} is not an expression")
    return expr, False


def _rename(pred: sympy.Basic, gold: sympy.Basic) -> sympy.Basic:
    gold_syms = sorted(gold.free_symbols, key=str)
    pred_syms = sorted(pred.free_symbols, key=str)
    if len(gold_syms) != len(pred_syms) or gold_syms == pred_syms:
        return pred
    return pred.xreplace(dict(zip(pred_syms, gold_syms, strict=True)))


def _evaluate(expr: sympy.Basic, point: dict, digits: int = 40) -> sympy.Basic | None:
    value = sympy.N(expr.xreplace(point), digits)
    if not value.is_number or value.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        return None
    return value


def _close(a: sympy.Basic, b: sympy.Basic, tol: float) -> bool:
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
    for shift in range(len(_POINTS)):
        point = {s: _POINTS[(k + shift) % len(_POINTS)] + k for k, s in enumerate(symbols)}
        va, vb = _evaluate(a, point), _evaluate(b, point)
        if va is None or vb is None:
            continue
        if not _close(va, vb, 1e-25):
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
    ea, big_a = to_sympy(a)
    eb, big_b = to_sympy(b)
    if big_a or big_b:
        return sympy.srepr(ea) == sympy.srepr(eb)
    if not opts.strict:
        eb = _rename(eb, ea)
    for literal, other in ((na, eb), (nb, ea)):
        if literal is not None and _decimal_vs_expression(literal, other, opts):
            return True
    candidates_a = [ea, ea / 100] if "%" in a else [ea]
    candidates_b = [eb, eb / 100] if "%" in b else [eb]
    for x, y in itertools.product(candidates_a, candidates_b):
        if not x.free_symbols and not y.free_symbols:
            if _constants_equal(x, y):
                return True
        elif _identity(x, y):
            return True
    return False


# ------------------------------------------------------------------ relations


def _difference(rel: st.Relation, i: int) -> tuple[str, sympy.Basic] | None:
    lhs, rhs = rel.terms[i], rel.terms[i + 1]
    if not (isinstance(lhs, st.Atom) and isinstance(rhs, st.Atom)):
        return None
    el, _ = to_sympy(lhs.text)
    er, _ = to_sympy(rhs.text)
    op = rel.ops[i]
    if op in (">", ">="):
        return ("<" if op == ">" else "<="), er - el
    return op, el - er


def relations_equal(a: st.Relation, b: st.Relation, opts: Options) -> bool:
    if len(a.ops) != len(b.ops):
        return False
    if len(a.ops) > 1:
        ia, ib = relation_as_interval(a), relation_as_interval(b)
        if ia is not None and ib is not None:
            return values_equal(ia, ib, opts)
        return False
    da, db = _difference(a, 0), _difference(b, 0)
    if da is None or db is None:
        return all(values_equal(x, y, opts) for x, y in zip(a.terms, b.terms, strict=True)) and a.ops == b.ops
    (op_a, ea), (op_b, eb) = da, db
    if not opts.strict:
        eb = _rename(eb, ea)
    if op_a != op_b and {op_a, op_b} != {"<", ">"}:
        return False
    symbols = sorted(ea.free_symbols | eb.free_symbols, key=str)
    ratios = []
    for shift in range(len(_POINTS)):
        point = {s: _POINTS[(k + shift) % len(_POINTS)] + k for k, s in enumerate(symbols)}
        va, vb = _evaluate(ea, point), _evaluate(eb, point)
        if va is None or vb is None:
            continue
        if abs(vb) < 1e-30:
            if abs(va) > 1e-30:
                return False
            continue
        ratios.append(va / vb)
    if len(ratios) < 2:
        return bool(sympy.simplify(ea - eb) == 0)
    first = ratios[0]
    if abs(first) < 1e-30 or not all(_close(r, first, 1e-20) for r in ratios):
        return False
    return op_a in ("=", "!=") or bool(first > 0)


def relation_as_interval(rel: st.Relation) -> st.Value | None:
    """`a < x <= b` -> (a, b]; `x > 0` -> (0, \\infty); None if not of that shape."""
    inf = st.Atom("\\infty")
    neg_inf = st.Atom("-\\infty")
    if len(rel.ops) == 2 and all(op in ("<", "<=") for op in rel.ops):
        return st.Interval(rel.terms[0], rel.terms[2], rel.ops[0] == "<", rel.ops[1] == "<")
    if len(rel.ops) == 2 and all(op in (">", ">=") for op in rel.ops):
        return st.Interval(rel.terms[2], rel.terms[0], rel.ops[1] == ">", rel.ops[0] == ">")
    if len(rel.ops) == 1 and rel.ops[0] in ("<", "<=", ">", ">="):
        lhs, rhs = rel.terms
        op = rel.ops[0]
        if (
            isinstance(rhs, st.Atom)
            and st.is_variable(rhs.text)
            and not (isinstance(lhs, st.Atom) and st.is_variable(lhs.text))
        ):
            lhs, rhs = rhs, lhs
            op = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
        if not (isinstance(lhs, st.Atom) and st.is_variable(lhs.text)):
            return None
        if op in ("<", "<="):
            return st.Interval(neg_inf, rhs, True, op == "<")
        return st.Interval(rhs, inf, op == ">", True)
    return None


# ------------------------------------------------------------------ structure


def _multiset_equal(a: tuple, b: tuple, opts: Options) -> bool:
    if len(a) != len(b):
        return False
    unused = list(b)
    for item in a:
        for j, other in enumerate(unused):
            if values_equal(item, other, opts):
                del unused[j]
                break
        else:
            return False
    return True


def _as_interval(v: st.Value) -> st.Interval | None:
    if isinstance(v, st.Interval):
        return v
    if isinstance(v, st.Seq) and v.kind == "tuple" and len(v.items) == 2:
        return st.Interval(v.items[0], v.items[1], True, True)
    return None


def _set_like(v: st.Value) -> bool:
    return isinstance(v, st.Interval | st.Union) or (isinstance(v, st.Seq) and v.kind == "set")


def values_equal(g: st.Value, p: st.Value, opts: Options) -> bool:
    """Gold-first structural equivalence (see module docstring for the direction rules)."""
    if g == p:
        return True
    if isinstance(g, st.Seq) and len(g.items) == 1 and g.kind != "tuple":
        return values_equal(g.items[0], p, opts)
    if isinstance(p, st.Seq) and len(p.items) == 1 and p.kind != "tuple":
        return values_equal(g, p.items[0], opts)
    if st.is_assignment(g) and not isinstance(p, st.Relation):
        return values_equal(g.terms[-1], p, opts)  # type: ignore[union-attr]
    if st.is_assignment(p) and not isinstance(g, st.Relation):
        return values_equal(g, p.terms[-1], opts)  # type: ignore[union-attr]
    if isinstance(g, st.Relation) and isinstance(p, st.Relation):
        if st.is_assignment(g) and st.is_assignment(p) and values_equal(g.terms[-1], p.terms[-1], opts):
            return True
        return relations_equal(g, p, opts)
    if isinstance(g, st.Member) and isinstance(p, st.Member):
        return values_equal(g.value, p.value, opts)
    if isinstance(p, st.Member) and (_set_like(g) or isinstance(g, st.Relation)):
        return values_equal(g, p.value, opts)
    if isinstance(g, st.Member):
        if isinstance(p, st.Relation):
            if not opts.allow_set_relation_comp:
                return False
            interval = relation_as_interval(p)
            return interval is not None and values_equal(g.value, interval, opts)
        return values_equal(g.value, p, opts)
    if isinstance(g, st.Relation) and len(g.ops) >= 1 and "=" not in g.ops:
        if _set_like(p) or isinstance(p, st.Seq):
            interval = relation_as_interval(g)
            return interval is not None and values_equal(interval, p, opts)
        return False
    if isinstance(g, st.Relation) or isinstance(p, st.Relation):
        return False
    if isinstance(g, st.Seq) and isinstance(p, st.Seq):
        if g.kind == "tuple" and p.kind == "tuple":
            return len(g.items) == len(p.items) and all(
                values_equal(x, y, opts) for x, y in zip(g.items, p.items, strict=True)
            )
        if "tuple" in (g.kind, p.kind):  # (1, 3) vs {1, 3}: in the written order
            return len(g.items) == len(p.items) == 2 and all(
                values_equal(x, y, opts) for x, y in zip(g.items, p.items, strict=True)
            )
        return _multiset_equal(g.items, p.items, opts)
    if isinstance(g, st.Interval) or isinstance(p, st.Interval):
        ig, ip = _as_interval(g), _as_interval(p)
        if ig is None or ip is None:
            return False
        return (
            ig.left_open == ip.left_open
            and ig.right_open == ip.right_open
            and values_equal(ig.lo, ip.lo, opts)
            and values_equal(ig.hi, ip.hi, opts)
        )
    if isinstance(g, st.Union) and isinstance(p, st.Union):
        return _multiset_equal(g.parts, p.parts, opts)
    if isinstance(g, st.Matrix) and isinstance(p, st.Matrix):
        if [len(r) for r in g.rows] != [len(r) for r in p.rows]:
            return False
        return all(
            values_equal(x, y, opts)
            for rg, rp in zip(g.rows, p.rows, strict=True)
            for x, y in zip(rg, rp, strict=True)
        )
    if isinstance(g, st.Atom) and isinstance(p, st.Atom):
        try:
            return atoms_equal(g.text, p.text, opts)
        except LatexError:
            return _text_key(g.text) == _text_key(p.text)
    if isinstance(g, st.Text) or isinstance(p, st.Text):
        return _text_equal(g, p, opts)
    return False


def _text_key(s: str) -> str:
    return re.sub(r"[\s\\{}()]", "", s).lower()


def _text_equal(g: st.Value, p: st.Value, opts: Options) -> bool:
    if (
        isinstance(g, st.Text | st.Atom)
        and isinstance(p, st.Text | st.Atom)
        and _text_key(g.text) == _text_key(p.text)
    ):
        return True
    # A sentence that states a number ("so it is 1,000.99 m²") matches that number.
    if isinstance(g, st.Atom) and isinstance(p, st.Text) and st.is_prose(p.text):
        number = last_number(p.text)
        return number is not None and values_equal(g, st.Atom(number), opts)
    if isinstance(p, st.Atom) and isinstance(g, st.Text) and st.is_prose(g.text):
        number = last_number(g.text)
        return number is not None and values_equal(st.Atom(number), p, opts)
    return False


def prepare(text: str) -> str:
    """Answer span of `text`, normalised (what both sides go through first)."""
    return normalize(answer_span(text))


def equivalent(gold: str, pred: str, opts: Options = Options()) -> bool:
    """Full equivalence decision (may be slow on hostile input: run it under a deadline)."""
    g, p = prepare(gold), prepare(pred)
    if not g or not p:
        return False
    if g == p:
        return True
    try:
        return values_equal(st.parse(g), st.parse(p), opts)
    except (LatexError, RecursionError, TypeError, ValueError, ZeroDivisionError, AttributeError):
        return _text_key(g) == _text_key(p)
