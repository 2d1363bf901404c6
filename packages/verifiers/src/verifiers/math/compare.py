"""Sympy leaves for `structural.values_equal`, and the full decision (runs inside a worker).

Relations compare `lhs - rhs` up to a constant factor (positive for inequalities); chains
`a < x < b` become intervals. Set expressions of real constants are evaluated with sympy's
sets. Expressions go to `expressions.py`. The structural walk itself (sets, tuples,
intervals, direction rules) is `structural.py`, shared with the caller's fast path.
"""

from __future__ import annotations

import sympy

from verifiers.math import structure as st
from verifiers.math.expressions import POINTS, atoms_equal, close, evaluate, rename, to_sympy
from verifiers.math.extract import answer_span
from verifiers.math.latex import LatexError, normalize
from verifiers.math.structural import Options, as_interval, relation_as_interval, text_key, values_equal

__all__ = ["SYMPY", "Options", "SympyLeaves", "equivalent", "prepare", "relation_as_interval"]

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
            return values_equal(ia, ib, opts, SYMPY)
        return False
    da, db = _difference(a, 0), _difference(b, 0)
    if da is None or db is None:
        return (
            all(values_equal(x, y, opts, SYMPY) for x, y in zip(a.terms, b.terms, strict=True))
            and a.ops == b.ops
        )
    (op_a, ea), (op_b, eb) = da, db
    if not opts.strict:
        eb = rename(eb, ea)
    if op_a != op_b and {op_a, op_b} != {"<", ">"}:
        return False
    symbols = sorted(ea.free_symbols | eb.free_symbols, key=str)
    ratios = []
    for shift in range(len(POINTS)):
        point = {s: POINTS[(k + shift) % len(POINTS)] + k for k, s in enumerate(symbols)}
        va, vb = evaluate(ea, point), evaluate(eb, point)
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
    if abs(first) < 1e-30 or not all(close(r, first, 1e-20) for r in ratios):
        return False
    return op_a in ("=", "!=") or bool(first > 0)


# ------------------------------------------------------------------ sets


def _constant(value: st.Value) -> sympy.Basic | None:
    """The exact value of a constant expression (`\\infty` -> oo), or None."""
    if not isinstance(value, st.Atom):
        return None
    if value.text.replace(" ", "") in ("\\infty", "+\\infty", "-\\infty"):
        return -sympy.oo if value.text.strip().startswith("-") else sympy.oo
    expr, too_big = to_sympy(value.text)
    if too_big or expr.free_symbols or not expr.is_real:
        return None
    return expr


def as_sympy_set(value: st.Value) -> sympy.Set | None:
    """A set of real constants as a sympy set (finite sets, intervals, a 2-tuple as an open
    interval, unions, `∩`, `∖`), or None when any part is not a real constant."""
    if isinstance(value, st.Seq) and value.kind == "set":
        items = [_constant(v) for v in value.items]
        return None if any(v is None for v in items) else sympy.FiniteSet(*items)
    interval = as_interval(value)
    if interval is not None:
        lo, hi = _constant(interval.lo), _constant(interval.hi)
        if lo is None or hi is None:
            return None
        return sympy.Interval(lo, hi, interval.left_open, interval.right_open)
    if isinstance(value, st.Union):
        parts = [as_sympy_set(v) for v in value.parts]
        return None if any(v is None for v in parts) else sympy.Union(*parts)
    if isinstance(value, st.SetOp):
        left, right = as_sympy_set(value.left), as_sympy_set(value.right)
        if left is None or right is None:
            return None
        return sympy.Intersection(left, right) if value.op == "∩" else sympy.Complement(left, right)
    return None


def _sets_equal(g: st.Value, p: st.Value) -> bool:
    """Both sides evaluate to the same set of reals (`\\{1,3\\} ∪ \\{2,4\\}` = `\\{1,2,3,4\\}`)."""
    try:
        a, b = as_sympy_set(g), as_sympy_set(p)
    except LatexError:
        return False
    if a is None or b is None:
        return False
    return bool(a == b) or (
        sympy.Complement(a, b) is sympy.S.EmptySet and sympy.Complement(b, a) is sympy.S.EmptySet
    )


class SympyLeaves:
    """The worker's leaves: sympy expressions, sets and relations (may be slow)."""

    def atoms_equal(self, a: str, b: str, opts: Options) -> bool:
        try:
            return atoms_equal(a, b, opts)
        except LatexError:
            return text_key(a) == text_key(b)

    def sets_equal(self, g: st.Value, p: st.Value) -> bool:
        return _sets_equal(g, p)

    def relations_equal(self, a: st.Relation, b: st.Relation, opts: Options) -> bool:
        return relations_equal(a, b, opts)


SYMPY = SympyLeaves()


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
        return values_equal(st.parse(g), st.parse(p), opts, SYMPY)
    except MemoryError:
        raise
    except Exception:  # unparseable on either side: only the same text is the same answer
        return text_key(g) == text_key(p)
