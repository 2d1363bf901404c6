"""Structural equivalence of two parsed answers, with the leaf decisions passed in.

`values_equal` walks two `structure.Value` trees (sets, tuples, intervals, assignments,
membership, matrices, text) and hands each leaf to a `Leaves` implementation: two
expressions (`atoms_equal`), two set expressions (`sets_equal`), two relations
(`relations_equal`). The worker's leaves use sympy (`compare.py`); the caller's fast path
(`fast.py`) uses leaves that decide only what they can decide exactly without sympy and raise
`Undecided` otherwise. Both run this same control flow, so whenever the fast path returns a
decision it is the decision the worker would have reached (each leaf it consulted answered as
the sympy leaf would). This module imports no sympy.

Direction matters (math-verify's convention): a *gold* inequality is compared with a
predicted interval/set, but a gold set is compared with a predicted inequality only when
`allow_set_relation_comp=True`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from verifiers.math import structure as st
from verifiers.math.extract import last_number


@dataclass(frozen=True)
class Options:
    """Comparison settings (math-verify's names and defaults)."""

    float_rounding: int = 6
    strict: bool = True
    allow_set_relation_comp: bool = False


class Undecided(Exception):
    """A leaf cannot be decided without sympy (raised only by the fast path's leaves)."""


class Leaves(Protocol):
    """The leaf decisions `values_equal` delegates (gold first, prediction second)."""

    def atoms_equal(self, a: str, b: str, opts: Options) -> bool: ...

    def sets_equal(self, g: st.Value, p: st.Value) -> bool: ...

    def relations_equal(self, a: st.Relation, b: st.Relation, opts: Options) -> bool: ...


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


def _same_elements(a: tuple, b: tuple, opts: Options, leaves: Leaves) -> bool:
    """Set semantics: every item of each side equals some item of the other (duplicates and
    order do not matter; a strict subset does not match)."""
    if not a or not b:
        return len(a) == len(b)
    return all(any(values_equal(x, y, opts, leaves) for y in b) for x in a) and all(
        any(values_equal(x, y, opts, leaves) for x in a) for y in b
    )


def _name_key(value: st.Value) -> str:
    text = value.text if isinstance(value, st.Atom | st.Text) else repr(value)
    return re.sub(r"[\s{}]", "", text)


def _assignments_equal(g: st.Seq, p: st.Seq, opts: Options, leaves: Leaves) -> bool:
    """`a_3 = 2, a_{37} = 19` vs `a_{37} = 19, a_3 = 2` by name; else the values in order."""
    if g.kind == "assign" and p.kind == "assign":
        by_name_g = {_name_key(r.terms[0]): r.terms[-1] for r in g.items}  # type: ignore[union-attr]
        by_name_p = {_name_key(r.terms[0]): r.terms[-1] for r in p.items}  # type: ignore[union-attr]
        if len(by_name_g) == len(g.items) and by_name_g.keys() == by_name_p.keys():
            return all(values_equal(by_name_g[k], by_name_p[k], opts, leaves) for k in by_name_g)
    other_kind = p.kind if g.kind == "assign" else g.kind
    kind = "tuple" if other_kind == "assign" else other_kind
    values_g = st.Seq(kind, tuple(r.terms[-1] for r in g.items) if g.kind == "assign" else g.items)  # type: ignore[union-attr]
    values_p = st.Seq(kind, tuple(r.terms[-1] for r in p.items) if p.kind == "assign" else p.items)  # type: ignore[union-attr]
    return values_equal(values_g, values_p, opts, leaves)


def as_interval(v: st.Value) -> st.Interval | None:
    """An interval, or a 2-tuple read as an open interval; else None."""
    if isinstance(v, st.Interval):
        return v
    if isinstance(v, st.Seq) and v.kind == "tuple" and len(v.items) == 2:
        return st.Interval(v.items[0], v.items[1], True, True)
    return None


def _set_like(v: st.Value) -> bool:
    return isinstance(v, st.Interval | st.Union) or (isinstance(v, st.Seq) and v.kind == "set")


def _merged(value: st.Value) -> st.Value:
    """A union of finite sets as one set (`\\{x, 1\\} ∪ \\{2\\}` = `\\{x, 1, 2\\}`, symbols allowed)."""
    if isinstance(value, st.Union) and all(isinstance(v, st.Seq) and v.kind == "set" for v in value.parts):
        return st.Seq("set", tuple(item for part in value.parts for item in part.items))  # type: ignore[union-attr]
    return value


def values_equal(g: st.Value, p: st.Value, opts: Options, leaves: Leaves) -> bool:
    """Gold-first structural equivalence (see module docstring for the direction rules)."""
    if g == p:
        return True
    if isinstance(g, st.Union | st.SetOp) or isinstance(p, st.Union | st.SetOp):
        if leaves.sets_equal(g, p):
            return True
        if isinstance(g, st.SetOp) or isinstance(p, st.SetOp):
            return False
        g, p = _merged(g), _merged(p)
    if isinstance(g, st.Seq) and len(g.items) == 1 and g.kind != "tuple":
        return values_equal(g.items[0], p, opts, leaves)
    if isinstance(p, st.Seq) and len(p.items) == 1 and p.kind != "tuple":
        return values_equal(g, p.items[0], opts, leaves)
    if st.is_assignment(g) and not isinstance(p, st.Relation):
        return values_equal(g.terms[-1], p, opts, leaves)  # type: ignore[union-attr]
    if st.is_assignment(p) and not isinstance(g, st.Relation):
        return values_equal(g, p.terms[-1], opts, leaves)  # type: ignore[union-attr]
    if isinstance(g, st.Relation) and isinstance(p, st.Relation):
        if (
            st.is_assignment(g)
            and st.is_assignment(p)
            and values_equal(g.terms[-1], p.terms[-1], opts, leaves)
        ):
            return True
        return leaves.relations_equal(g, p, opts)
    if isinstance(g, st.Member) and isinstance(p, st.Member):
        return values_equal(g.value, p.value, opts, leaves)
    if isinstance(p, st.Member) and (_set_like(g) or isinstance(g, st.Relation)):
        return values_equal(g, p.value, opts, leaves)
    if isinstance(g, st.Member):
        if isinstance(p, st.Relation):
            if not opts.allow_set_relation_comp:
                return False
            interval = relation_as_interval(p)
            return interval is not None and values_equal(g.value, interval, opts, leaves)
        return values_equal(g.value, p, opts, leaves)
    if isinstance(g, st.Relation) and len(g.ops) >= 1 and "=" not in g.ops:
        if _set_like(p) or isinstance(p, st.Seq):
            interval = relation_as_interval(g)
            return interval is not None and values_equal(interval, p, opts, leaves)
        return False
    if isinstance(g, st.Relation) or isinstance(p, st.Relation):
        return False
    if isinstance(g, st.Seq) and isinstance(p, st.Seq):
        if "assign" in (g.kind, p.kind):
            return _assignments_equal(g, p, opts, leaves)
        if g.kind == "tuple" and p.kind == "tuple":
            return len(g.items) == len(p.items) and all(
                values_equal(x, y, opts, leaves) for x, y in zip(g.items, p.items, strict=True)
            )
        if "tuple" in (g.kind, p.kind):  # (1, 3) vs {1, 3}: in the written order
            return len(g.items) == len(p.items) == 2 and all(
                values_equal(x, y, opts, leaves) for x, y in zip(g.items, p.items, strict=True)
            )
        return _same_elements(g.items, p.items, opts, leaves)
    if isinstance(g, st.Interval) or isinstance(p, st.Interval):
        ig, ip = as_interval(g), as_interval(p)
        if ig is None or ip is None:
            return False
        return (
            ig.left_open == ip.left_open
            and ig.right_open == ip.right_open
            and values_equal(ig.lo, ip.lo, opts, leaves)
            and values_equal(ig.hi, ip.hi, opts, leaves)
        )
    if isinstance(g, st.Union) and isinstance(p, st.Union):
        return _same_elements(g.parts, p.parts, opts, leaves)
    if isinstance(g, st.Matrix) and isinstance(p, st.Matrix):
        if [len(r) for r in g.rows] != [len(r) for r in p.rows]:
            return False
        return all(
            values_equal(x, y, opts, leaves)
            for rg, rp in zip(g.rows, p.rows, strict=True)
            for x, y in zip(rg, rp, strict=True)
        )
    if isinstance(g, st.Atom) and isinstance(p, st.Atom):
        return leaves.atoms_equal(g.text, p.text, opts)
    if isinstance(g, st.Text) or isinstance(p, st.Text):
        return _text_equal(g, p, opts, leaves)
    return False


def text_key(s: str) -> str:
    """Loose text identity: no spaces, backslashes, braces or parentheses, lower case."""
    return re.sub(r"[\s\\{}()]", "", s).lower()


def _text_equal(g: st.Value, p: st.Value, opts: Options, leaves: Leaves) -> bool:
    if (
        isinstance(g, st.Text | st.Atom)
        and isinstance(p, st.Text | st.Atom)
        and text_key(g.text) == text_key(p.text)
    ):
        return True
    # A sentence that states a number ("so it is 1,000.99 m²") matches that number.
    if isinstance(g, st.Atom) and isinstance(p, st.Text) and st.is_prose(p.text):
        number = last_number(p.text)
        return number is not None and values_equal(g, st.Atom(number), opts, leaves)
    if isinstance(p, st.Atom) and isinstance(g, st.Text) and st.is_prose(g.text):
        number = last_number(g.text)
        return number is not None and values_equal(st.Atom(number), p, opts, leaves)
    return False
