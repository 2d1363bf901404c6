"""Exact plain-number parsing and the inexact-decimal rule (oracles and properties)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifiers.math.numbers import Number, decimal_matches, numbers_equal, parse_number


@pytest.mark.parametrize(
    ("text", "value", "decimals", "percent"),
    [
        ("7,425,000", Fraction(7425000), None, False),
        ("1000,99", Fraction(100099, 100), 2, False),  # decimal comma (4+ digits before it)
        (".4", Fraction(2, 5), 1, False),
        ("-0.75", Fraction(-3, 4), 2, False),
        ("\\frac{10}{9}", Fraction(10, 9), None, False),
        ("-\\frac{3}{4}", Fraction(-3, 4), None, False),
        ("10/9", Fraction(10, 9), None, False),
        ("3\\frac{1}{2}", Fraction(7, 2), None, False),  # mixed number
        ("28\\%", Fraction(28), None, True),
        ("28 pct", Fraction(28), None, True),
        ("1.5e-3", Fraction(3, 2000), 4, False),  # 1 decimal + exponent 3
        ("2.5\\times10^{3}", Fraction(2500), None, False),
        ("32{,}349", Fraction(32349), None, False),
        ("32,\\! 349", Fraction(32349), None, False),
        ("\\$1,000", Fraction(1000), None, False),
    ],
)
def test_parse_number_oracles(text, value, decimals, percent):
    number = parse_number(text)
    assert number is not None
    assert number.value == value
    assert number.percent is percent
    if decimals is not None:
        assert number.decimals == decimals


@pytest.mark.parametrize("text", ["32, 349", "1,2", "x", "", "1e1000000000", "2^{10}", "AZYUK2A", "1/0"])
def test_parse_number_rejects(text):
    assert parse_number(text) is None


def test_decimal_rule_matches_math_verify_defaults():
    third = Fraction(1, 3)
    assert decimal_matches(Number(Fraction("0.333333"), 6), third, 6)  # truncated
    assert not decimal_matches(Number(Fraction("0.333"), 3), third, 6)  # too few decimals
    assert decimal_matches(Number(Fraction("0.666667"), 6), Fraction(2, 3), 6)  # rounded
    assert decimal_matches(Number(Fraction("0.666666"), 6), Fraction(2, 3), 6)  # truncated
    assert not decimal_matches(Number(Fraction("0.666668"), 6), Fraction(2, 3), 6)
    # tiny values never round to equality: 1e-7 is not 1/2^30 (9.3e-10) at 7 decimals
    assert not decimal_matches(Number(Fraction("0.0000001"), 7), Fraction(1, 2**30), 6)


def test_percent_means_value_or_hundredth():
    half = parse_number("50\\%")
    assert numbers_equal(half, parse_number("0.5"))
    assert numbers_equal(half, parse_number("50"))
    assert not numbers_equal(half, parse_number("5"))


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None)
def test_parse_number_never_raises(text):
    parse_number(text)


@given(st.integers(min_value=-(10**15), max_value=10**15))
def test_thousands_separators_round_trip(n):
    assert parse_number(f"{n:,}").value == n
    assert parse_number(f"{n:,}".replace(",", "{,}")).value == n


@given(st.fractions(max_denominator=10**6))
def test_fraction_spellings_agree(x):
    a = parse_number(f"\\frac{{{x.numerator}}}{{{x.denominator}}}")
    b = parse_number(f"{x.numerator}/{x.denominator}")
    assert a is not None and b is not None and a.value == b.value == x
    assert numbers_equal(a, b) and numbers_equal(b, a)
