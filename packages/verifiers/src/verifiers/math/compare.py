"""Structural equivalence of two parsed answers (runs inside a worker process).

Relations compare `lhs - rhs` up to a constant factor (positive for inequalities); chains
`a < x < b` become intervals. Sets and multi-answers match as multisets, tuples in order,
a 2-tuple `(a, b)` may stand for an open interval. Expressions go to `expressions.py`.

Direction matters (math-verify's convention): a *gold* inequality is compared with a
predicted interval/set, but a gold set is compared with a predicted inequality only when
`allow_set_relation_comp=True`.
"""

from __future__ import annotations

import re

import sympy

from verifiers.math import structure as st
from verifiers.math.expressions import POINTS, Options, atoms_equal, close, evaluate, rename, to_sympy
from verifiers.math.extract import answer_span, last_number
from verifiers.math.latex import LatexError, normalize

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


def _same_elements(a: tuple, b: tuple, opts: Options) -> bool:
    """Set semantics: every item of each side equals some item of the other (duplicates and
    order do not matter; a strict subset does not match)."""
    if not a or not b:
        return len(a) == len(b)
    return all(any(values_equal(x, y, opts) for y in b) for x in a) and all(
        any(values_equal(x, y, opts) for x in a) for y in b
    )


def _name_key(value: st.Value) -> str:
    text = value.text if isinstance(value, st.Atom | st.Text) else repr(value)
    return re.sub(r"[\s{}]", "", text)


def _assignments_equal(g: st.Seq, p: st.Seq, opts: Options) -> bool:
    """`a_3 = 2, a_{37} = 19` vs `a_{37} = 19, a_3 = 2` by name; else the values in order."""
    if g.kind == "assign" and p.kind == "assign":
        by_name_g = {_name_key(r.terms[0]): r.terms[-1] for r in g.items}  # type: ignore[union-attr]
        by_name_p = {_name_key(r.terms[0]): r.terms[-1] for r in p.items}  # type: ignore[union-attr]
        if len(by_name_g) == len(g.items) and by_name_g.keys() == by_name_p.keys():
            return all(values_equal(by_name_g[k], by_name_p[k], opts) for k in by_name_g)
    other_kind = p.kind if g.kind == "assign" else g.kind
    kind = "tuple" if other_kind == "assign" else other_kind
    values_g = st.Seq(kind, tuple(r.terms[-1] for r in g.items) if g.kind == "assign" else g.items)  # type: ignore[union-attr]
    values_p = st.Seq(kind, tuple(r.terms[-1] for r in p.items) if p.kind == "assign" else p.items)  # type: ignore[union-attr]
    return values_equal(values_g, values_p, opts)


def _as_interval(v: st.Value) -> st.Interval | None:
    if isinstance(v, st.Interval):
        return v
    if isinstance(v, st.Seq) and v.kind == "tuple" and len(v.items) == 2:
        return st.Interval(v.items[0], v.items[1], True, True)
    return None


def _set_like(v: st.Value) -> bool:
    return isinstance(v, st.Interval | st.Union) or (isinstance(v, st.Seq) and v.kind == "set")


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
    interval = _as_interval(value)
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


def _merged(value: st.Value) -> st.Value:
    """A union of finite sets as one set (`\\{x, 1\\} ∪ \\{2\\}` = `\\{x, 1, 2\\}`, symbols allowed)."""
    if isinstance(value, st.Union) and all(isinstance(v, st.Seq) and v.kind == "set" for v in value.parts):
        return st.Seq("set", tuple(item for part in value.parts for item in part.items))  # type: ignore[union-attr]
    return value


def values_equal(g: st.Value, p: st.Value, opts: Options) -> bool:
    """Gold-first structural equivalence (see module docstring for the direction rules)."""
    if g == p:
        return True
    if isinstance(g, st.Union | st.SetOp) or isinstance(p, st.Union | st.SetOp):
        if _sets_equal(g, p):
            return True
        if isinstance(g, st.SetOp) or isinstance(p, st.SetOp):
            return False
        g, p = _merged(g), _merged(p)
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
        if "assign" in (g.kind, p.kind):
            return _assignments_equal(g, p, opts)
        if g.kind == "tuple" and p.kind == "tuple":
            return len(g.items) == len(p.items) and all(
                values_equal(x, y, opts) for x, y in zip(g.items, p.items, strict=True)
            )
        if "tuple" in (g.kind, p.kind):  # (1, 3) vs {1, 3}: in the written order
            return len(g.items) == len(p.items) == 2 and all(
                values_equal(x, y, opts) for x, y in zip(g.items, p.items, strict=True)
            )
        return _same_elements(g.items, p.items, opts)
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
        return _same_elements(g.parts, p.parts, opts)
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
    except MemoryError:
        raise
    except Exception:  # unparseable on either side: only the same text is the same answer
        return _text_key(g) == _text_key(p)
