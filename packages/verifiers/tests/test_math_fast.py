"""The caller-side fast path: exact values and decisions that never contradict the sympy worker.

`fast.decide` and `exact.exact_value` run in the caller without sympy; whenever they answer,
the answer must be the one the worker's sympy path (`compare.equivalent`, run here
in-process) gives. Checked on generated pairs (hypothesis), on every row of the labelled form
file, and with hand-computed values.
"""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verifiers.math import compare_answers
from verifiers.math.compare import equivalent, prepare
from verifiers.math.exact import exact_value
from verifiers.math.expressions import to_sympy
from verifiers.math.fast import MAX_CHARS, decide
from verifiers.math.structural import Options

FORMS = Path(__file__).parent / "data" / "math_equiv_forms.jsonl"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("\\frac{100!}{98!}", Fraction(9900)),
        ("2^{64}", Fraction(18446744073709551616)),
        ("1/2^{100}", Fraction(1, 2**100)),
        ("\\frac{1}{2^{100}}", Fraction(1, 2**100)),
        ("2^{-100}", Fraction(1, 2**100)),
        ("\\binom{50}{25}", Fraction(126410606437752)),
        ("-2^2", Fraction(-4)),  # Python/sympy precedence: -(2^2)
        ("2^{3^2}", Fraction(512)),  # right-associative
        ("\\frac3{3}", Fraction(1)),
        ("10^{-20}", Fraction(1, 10**20)),
        ("3 \\times 4 - 6 \\div 4", Fraction(21, 2)),
        ("(1+2)\\cdot(3+4)", Fraction(21)),
        ("2(3)", Fraction(6)),  # sympy's implicit multiplication
        ("0.5+1", Fraction(3, 2)),  # decimals inside an expression are exact (sympy's rationalize)
        ("2^3!", Fraction(64)),  # `!` binds to the 3: 2**factorial(3)
    ],
)
def test_exact_values_by_hand(text, value):
    assert exact_value(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "1/0",
        "0^{-1}",
        "2^{100000}",  # too large to evaluate here
        "(10^{8})!",
        "\\frac{1}{2006!}",  # factorial beyond the fast path's bound
        "2^{1/2}",
        "\\sqrt{4}",
        "x+1",
        "\\pi",
        "5!!",
        "50\\%",
        "((((((((((((((((((((((((((((((((((((((((((1))))))))))))))))))))))))))))))))))))))))))",
        "-" * 300 + "1",
        "{" * 5000,
    ],
)
def test_exact_value_declines(text):
    assert exact_value(text) is None


_INT = st.one_of(st.integers(0, 60).map(str), st.sampled_from(["0.5", "1.25", ".5", "2."]))


def _arithmetic(children: st.SearchStrategy[str], *, slash: bool) -> list[st.SearchStrategy[str]]:
    """Two children joined by +, -, \\cdot, / (when ``slash``) and \\frac: the grammars' binary operators."""
    pair = st.tuples(children, children)
    joined = [
        pair.map(lambda ab: f"{ab[0]}+{ab[1]}"),
        pair.map(lambda ab: f"{ab[0]}-{ab[1]}"),
        pair.map(lambda ab: f"{ab[0]}\\cdot {ab[1]}"),
    ]
    if slash:
        joined.append(pair.map(lambda ab: f"{ab[0]}/{ab[1]}"))
    return [*joined, pair.map(lambda ab: f"\\frac{{{ab[0]}}}{{{ab[1]}}}")]


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        *_arithmetic(children, slash=True),
        st.tuples(children, st.integers(-4, 6)).map(lambda ak: f"({ak[0]})^{{{ak[1]}}}"),
        st.tuples(children, st.integers(0, 3)).map(lambda ak: f"{ak[0]}^{ak[1]}"),
        children.map(lambda a: f"({a})"),
        children.map(lambda a: f"-{a}"),
        st.integers(0, 12).map(lambda n: f"{n}!"),
        st.tuples(st.integers(0, 20), st.integers(0, 20)).map(lambda nk: f"\\binom{{{nk[0]}}}{{{nk[1]}}}"),
    )


EXPRESSIONS = st.recursive(_INT, _combine, max_leaves=6)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EXPRESSIONS)
def test_exact_value_is_sympys_value(text):
    value = exact_value(text)
    if value is None:
        return
    expr, too_big = to_sympy(text)
    assert not too_big
    assert expr.is_Rational and expr == sympy.Rational(value.numerator, value.denominator), (
        text,
        expr,
        value,
    )


_WRAPS = ["@", "@\\text{ cm}^2", "\\$@", "x = @", "@\\%"]


def _value_forms() -> st.SearchStrategy[str]:
    small = st.one_of(
        st.integers(-6, 12).map(str),
        st.sampled_from(
            ["\\frac{1}{2}", "0.5", "1/2", "\\frac{6}{8}", "3/4", "0.75", "1.5e3", "1500", "2^{2}"]
        ),
        EXPRESSIONS,
        st.sampled_from(["\\sqrt{2}", "\\pi", "x", "2x", "\\infty", "-\\infty", "A", "(B)"]),
    )
    atom = st.tuples(st.sampled_from(_WRAPS), small).map(lambda ws: ws[0].replace("@", ws[1]))
    pair = st.tuples(small, small)
    return st.one_of(
        atom,
        pair.map(lambda ab: f"({ab[0]}, {ab[1]})"),
        pair.map(lambda ab: f"[{ab[0]}, {ab[1]})"),
        pair.map(lambda ab: f"\\{{{ab[0]}, {ab[1]}\\}}"),
        pair.map(lambda ab: f"{ab[0]}, {ab[1]}"),
        pair.map(lambda ab: f"x = {ab[0]}, y = {ab[1]}"),
        pair.map(lambda ab: f"{ab[0]} \\text{{ and }} {ab[1]}"),
        pair.map(lambda ab: f"\\begin{{pmatrix}}{ab[0]} & {ab[1]}\\end{{pmatrix}}"),
        pair.map(lambda ab: f"[{ab[0]}, {ab[1]}] \\cup \\{{7\\}}"),
        pair.map(lambda ab: f"[{ab[0]}, {ab[1]}] \\cup [{ab[1]}, 5]"),
        pair.map(lambda ab: f"[0, {ab[0]}] \\cap [{ab[1]}, 9]"),
        pair.map(lambda ab: f"\\{{{ab[0]}\\}} \\cup \\{{{ab[1]}\\}}"),
        small.map(lambda a: f"[{a}, 5]"),
        small.map(lambda a: f"x \\in [0, {a}]"),
        small.map(lambda a: f"x \\le {a}"),
        small.map(lambda a: f"\\pm {a}"),
    )


OPTIONS = st.builds(Options, st.sampled_from([2, 6]), st.booleans(), st.booleans())


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_value_forms(), _value_forms(), OPTIONS)
def test_fast_decision_never_contradicts_the_sympy_path(gold, pred, opts):
    fast = decide(prepare(gold), prepare(pred), opts)
    if fast is not None:
        assert fast == equivalent(gold, pred, opts), (gold, pred, opts)


def test_fast_path_agrees_on_every_labelled_row():
    rows = [json.loads(line) for line in FORMS.read_text().splitlines() if line.strip()]
    decided = 0
    for row in rows:
        opts = Options(row["float_rounding"], row["strict"], row["allow_set_relation_comp"])
        fast = decide(prepare(row["gold"]), prepare(row["pred"]), opts)
        if fast is not None:
            decided += 1
            assert fast == bool(row["expected"]) == equivalent(row["gold"], row["pred"], opts), row
    assert decided >= 200  # 243 of 338: numbers, units, tuples, intervals, constants skip the worker


def test_compare_answers_reports_the_fast_path():
    assert compare_answers("\\frac{100!}{98!}", "9900").reason == "exact"
    assert compare_answers("(1, \\frac{1}{2})", "(1, 0.5)").reason == "exact"
    assert compare_answers("9.8\\text{ m/s}^2", "9.8").reason == "exact"
    verdict = compare_answers("1/2^{100}", "1/2^{99}")
    assert (verdict.equal, verdict.reason) == (False, "different")


@pytest.mark.parametrize(
    "hostile",
    [
        "(" * 400 + "1" + ")" * 400,
        "\\{" * 200 + "1" + "\\}" * 200,
        "1," * 250,
        "\\frac{" * 100 + "1" + "}{2}" * 100,
        "x<" * 200 + "1",
        "2^{" * 150 + "2" + "}" * 150,
        "1" * MAX_CHARS + "+1",
        "\\pm" * 200,
    ],
)
def test_hostile_inputs_are_bounded_and_never_raise(hostile):
    limit = sys.getrecursionlimit()
    assert decide(hostile, "1", Options()) in (None, False, True)
    assert decide("(1, 2)", hostile, Options()) in (None, False, True)
    assert sys.getrecursionlimit() == limit


_CONSTANT_LEAVES = st.one_of(
    st.integers(1, 12).map(str),
    st.sampled_from(["\\pi", "e", "\\frac{\\pi}{3}", "0.5", "\\frac{1}{2}", "\\sqrt{2}", "\\sqrt{9}"]),
    st.tuples(st.integers(-4, 8), st.integers(1, 12)).map(lambda mn: f"\\frac{{{mn[0]}\\pi}}{{{mn[1]}}}"),
)


def _constant_combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(st.sampled_from(["\\sin", "\\cos", "\\tan", "\\sec", "\\cot"]), children).map(
            lambda fa: f"{fa[0]}\\left({fa[1]}\\right)"
        ),
        st.tuples(
            st.sampled_from(["\\arcsin", "\\arccos", "\\arctan", "\\ln", "\\sqrt", "\\sqrt[3]"]), children
        ).map(lambda fa: f"{fa[0]}{{{fa[1]}}}" if fa[0].startswith("\\sqrt") else f"{fa[0]}({fa[1]})"),
        st.tuples(st.integers(2, 10), children).map(lambda ba: f"\\log_{{{ba[0]}}} {{{ba[1]}}}"),
        st.tuples(st.integers(2, 5), st.integers(0, 6)).map(lambda bk: f"\\log_{{{bk[0]}}} {bk[0] ** bk[1]}"),
        children.map(lambda a: f"\\lfloor {a} \\rfloor"),
        children.map(lambda a: f"\\lceil {a} \\rceil"),
        children.map(lambda a: f"|{a}|"),
        *_arithmetic(children, slash=False),
        st.tuples(children, st.integers(-3, 4)).map(lambda ak: f"\\left({ak[0]}\\right)^{{{ak[1]}}}"),
        st.tuples(st.integers(1, 9), children).map(lambda ka: f"{ka[0]}{ka[1]}"),  # implicit product
        st.tuples(children, st.sampled_from(["\\frac12", "\\frac{3}{2}"])).map(
            lambda ak: f"({ak[0]})^{{{ak[1]}}}"
        ),
    )


CONSTANTS = st.recursive(_CONSTANT_LEAVES, _constant_combine, max_leaves=4)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONSTANTS, st.one_of(CONSTANTS, st.integers(-3, 12).map(str)))  # small integers: floors, logs
def test_constant_decisions_are_the_workers(a, b):
    from verifiers.math.expressions import atoms_equal
    from verifiers.math.intervals import compare_constants

    decided = compare_constants(a, b)
    if decided is not None:
        assert decided == atoms_equal(a, b, Options()), (a, b, decided)
    fast = decide(prepare(a), prepare(b), Options())
    if fast is not None:
        assert fast == equivalent(a, b, Options()), (a, b, fast)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("\\cos\\frac{\\pi}{3}", "\\frac12", True),
        ("\\log_2 8", "3", True),
        ("\\sin\\frac{\\pi}{12}", "\\frac{\\sqrt{6}-\\sqrt{2}}{4}", True),
        ("\\sin\\frac{\\pi}{12}", "\\frac{\\sqrt{6}+\\sqrt{2}}{4}", False),
        ("\\arcsin\\frac12", "\\frac{\\pi}{6}", True),
        ("\\lfloor \\pi \\rfloor", "3", True),
        ("\\lceil \\pi \\rceil", "4", True),
        ("\\lceil -\\pi \\rceil", "-3", True),
        ("\\lceil \\pi \\rceil", "3", False),
        ("\\sqrt{2}+\\sqrt{3}", "\\sqrt{5+2\\sqrt6}", True),
        ("\\frac{22}{7}", "\\pi", False),
        ("\\frac{1}{2004!}", "\\frac{1}{2006!}", None),  # factorials: exact path or sympy
        ("\\sin \\pi", "0", None),  # zero: the worker's relative test decides
        ("\\lfloor 3 \\rfloor", "3", None),  # the enclosure touches an integer
        ("\\sqrt{-1}", "i", None),  # complex
        ("\\sqrt{4}", "2+10^{-200}", None),  # two rationals closer than the enclosures: sympy
        ("\\pi", "\\pi+10^{-45}", None),  # within the worker's tolerance band: sympy
        ("x", "x", None),
        # hostile magnitudes: declined before any expensive step
        ("e^{e^{e^{e^{10}}}}", "3", None),
        ("\\sin(10^{300})", "0.5", None),
        ("((e^{10})^{64})^{64}", "3", None),
        ("\\lfloor e^{2000} \\rfloor", "3", None),
        ("\\sqrt{" * 25 + "2" + "}" * 25, "1", None),
    ],
)
def test_constant_decisions_by_hand(a, b, expected):
    from verifiers.math.intervals import compare_constants

    assert compare_constants(a, b) is expected


_LATEXISH = st.lists(
    st.sampled_from(
        [*"0123456789+-*/^_{}()[]|!.,=<> abcdefilnopqrstxyz", "\\pi", "\\frac", "\\sin", "\\sqrt"]
    ),
    max_size=40,
).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_LATEXISH, _LATEXISH)
def test_fast_path_never_raises_on_arbitrary_text(a, b):
    from verifiers.math.intervals import compare_constants

    assert compare_constants(a, b) in (None, True, False)
    assert exact_value(a) is None or isinstance(exact_value(a), Fraction)
    assert decide(a, b, Options()) in (None, True, False)
