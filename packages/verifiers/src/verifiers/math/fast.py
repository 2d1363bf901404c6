"""The caller-side fast path: decide what is exactly decidable without sympy or a worker.

`decide(g, p, opts)` runs the worker's own structural walk (`structural.values_equal`) on
the two normalised answers with leaves that answer only where the worker's sympy leaves
would provably answer the same:

- two expressions: identical text, two plain numbers (`numbers.numbers_equal`, the first
  thing `expressions.atoms_equal` does too), two multiple-choice letters, or two exact
  rational constants (`exact.exact_value`; the worker compares two sympy Rationals exactly);
- set expressions (`∪`, `∩`, `∖`) and relations: never (they need sympy).

Any other leaf raises `structural.Undecided` and the whole pair goes to the worker, so a
decision returned here is never one the worker would contradict. Bounded work: each side
at most `MAX_CHARS` characters, parsed by `structure.parse` (string work only).
"""

from __future__ import annotations

import re

from verifiers.math import structure as st
from verifiers.math.exact import exact_value
from verifiers.math.numbers import Number, numbers_equal, parse_number
from verifiers.math.structural import Options, Undecided, values_equal

MAX_CHARS = 512
_LETTER = re.compile(r"\(?([A-Za-z])\)?")


def _exact(text: str, number: Number | None) -> object:
    """An exact value comparable with `==`, mirroring `expressions._candidates`."""
    if number is not None:
        if number.percent or number.decimals is not None:
            raise Undecided(text)  # two candidates / the inexact-decimal rule: sympy's job
        return number.value
    value = exact_value(text)
    if value is None:
        raise Undecided(text)
    return value


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
        return _exact(a, na) == _exact(b, nb)

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
    except (RecursionError, ValueError):  # the worker decides these (and falls back to text)
        return None
