"""The caller-side fast path: decide what is exactly decidable without sympy or a worker.

`decide(g, p, opts)` runs the worker's own structural walk (`structural.values_equal`) on
the two normalised answers with leaves that answer only where the worker's sympy leaves
would provably answer the same:

- two expressions: identical text, two plain numbers (`numbers.numbers_equal`, the first
  thing `expressions.atoms_equal` does too), two multiple-choice letters, two exact
  rational constants (`exact.exact_value`; the worker compares two sympy Rationals exactly),
  or two real constants whose interval enclosures settle the worker's 60-digit test
  (`intervals.compare_constants`: `\\cos\\frac{\\pi}{3}` vs `\\frac12`);
- set expressions (`∪`, `∩`, `∖`) and relations: never (they need sympy).

Any other leaf raises `structural.Undecided` and the whole pair goes to the worker, so a
decision returned here is never one the worker would contradict. Bounded work: each side
at most `MAX_CHARS` characters, parsed by `structure.parse` (string work only).
"""

from __future__ import annotations

import re

from verifiers.math import structure as st
from verifiers.math.exact import exact_value
from verifiers.math.intervals import compare_constants
from verifiers.math.numbers import Number, numbers_equal, parse_number
from verifiers.math.structural import Options, Undecided, values_equal

MAX_CHARS = 512
_LETTER = re.compile(r"\(?([A-Za-z])\)?")


def _plain(text: str, number: Number | None) -> str:
    """`text` for the comparison of constants; a plain number as its exact `p/q` (as the worker
    reads it: `expressions._candidates`). Percentages and decimal literals are sympy's job
    (two candidate values; the inexact-decimal rule)."""
    if number is None:
        if "%" in text:
            raise Undecided(text)
        return text
    if number.percent or number.decimals is not None:
        raise Undecided(text)
    return f"{number.value.numerator}/{number.value.denominator}"


def _constants_equal(a: str, b: str) -> bool:
    """Exact rationals compare exactly; other real constants by rigorous enclosures."""
    va, vb = exact_value(a), exact_value(b)
    if va is not None and vb is not None:
        return va == vb
    decided = compare_constants(a, b)
    if decided is None:
        raise Undecided(f"{a} vs {b}")
    return decided


class ExactLeaves:
    """Leaves that decide exactly or raise `Undecided` (see the module docstring)."""

    def atoms_equal(self, a: str, b: str, opts: Options) -> bool:
        # The same order of checks as expressions.atoms_equal.
        if a == b:
            return True
        na, nb = parse_number(a), parse_number(b)
        if na is not None and nb is not None:
            return numbers_equal(na, nb, float_rounding=opts.float_rounding)
        letters = [_LETTER.fullmatch(t.strip()) for t in (a, b)]
        if letters[0] and letters[1]:
            la, lb = letters[0].group(1), letters[1].group(1)
            return la == lb or (la.isupper() and la.lower() == lb.lower() and la in "ABCDEFGHIJ")
        return _constants_equal(_plain(a, na), _plain(b, nb))

    def sets_equal(self, g: st.Value, p: st.Value) -> bool:
        raise Undecided("set expression")

    def relations_equal(self, a: st.Relation, b: st.Relation, opts: Options) -> bool:
        raise Undecided("relation")


EXACT = ExactLeaves()


def decide(g: str, p: str, opts: Options) -> bool | None:
    """The worker's decision for two normalised answers, or None where it needs sympy."""
    if len(g) > MAX_CHARS or len(p) > MAX_CHARS:
        return None
    try:
        return values_equal(st.parse(g), st.parse(p), opts, EXACT)
    except Undecided:
        return None
    except Exception:  # anything unforeseen: the worker runs the same walk with its own fallbacks
        return None
