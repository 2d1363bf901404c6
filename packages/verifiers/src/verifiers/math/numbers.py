"""Exact parsing and comparison of plain numeric answers (no sympy; the fast path).

A *plain number* is an integer, decimal, scientific-notation literal, integer fraction
(`a/b`, `\\frac{a}{b}`), mixed number (`3\\frac{1}{2}`) or percentage of one, written with
optional thousands separators (`7,425,000`, `32{,}349`) or a decimal comma (`1000,99`).
Values are `fractions.Fraction`, so `1/2^{100}` never equals `1/2^{99}` by rounding.

Pitfall: a decimal literal is *inexact*: `0.0833333333333333` stands for 1/12 rounded.
`decimal_matches` accepts it iff it is the exact value correctly rounded or truncated to the
literal's own number of decimals, and it states at least `float_rounding` decimals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

# Bounds that keep this module O(len(text)) on hostile input ("1e1000000000").
MAX_DIGITS = 400
MAX_EXPONENT = 400

_SIGN = r"[+-]?"
_THOUSANDS = r"(?:[1-9]\d{0,2}|0)(?:,\d{3})+(?:\.\d+)?"
_DECIMAL = r"(?:\d+\.?\d*|\.\d+)"
_INT = re.compile(r"^[+-]?\d+$")
_SCI = re.compile(
    rf"^({_SIGN}{_DECIMAL})\s*(?:[eE]\s*([+-]?\d+)|(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{{?\s*([+-]?\d+)\s*\}}?)$"
)
_FRAC = re.compile(r"^([+-]?)\\frac\s*\{\s*([+-]?\d+)\s*\}\s*\{\s*([+-]?\d+)\s*\}$")
_SLASH = re.compile(r"^([+-]?\d+)\s*/\s*([+-]?\d+)$")
_MIXED = re.compile(r"^([+-]?)(\d+)\s*\\frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}$")


@dataclass(frozen=True)
class Number:
    """An exact numeric value parsed from text.

    Attributes:
        value: the exact rational value (percent NOT applied: `28%` has value 28).
        decimals: digits after the decimal point as written (None for integers/fractions);
            scientific notation adds the negated exponent (`1.5e-3` -> 4).
        percent: the literal carried `%` / "percent".
    """

    value: Fraction
    decimals: int | None = None
    percent: bool = False


def _clean(text: str) -> tuple[str, bool]:
    s = text.strip()
    s = re.sub(r"\\!\s*", "", s).replace("{,}", ",").replace("\\,", "").replace("\\ ", " ")
    s = re.sub(r"^\\?\$\s*", "", s)  # currency sign
    s = s.strip().rstrip(".").strip()
    percent = False
    m = re.match(r"^(.*?)\s*(?:\\?%|percent|pct)$", s)
    if m:
        s, percent = m.group(1).strip(), True
    if re.search(r",\s", s):  # "32, 349" is a list of two numbers, never 32349
        return "", percent
    return s.replace(" ", ""), percent


def _decimal(s: str) -> tuple[Fraction, int | None] | None:
    if len(s) > MAX_DIGITS:
        return None
    if re.fullmatch(rf"{_SIGN}{_THOUSANDS}", s) and not re.match(r"[+-]?0,", s):
        s = s.replace(",", "")
    m = re.fullmatch(r"([+-]?)(\d+),(\d+)", s)
    if m and (
        m.group(2) == "0" or ((m.group(2).startswith("0") or len(m.group(2)) >= 4) and len(m.group(3)) != 3)
    ):
        s = f"{m.group(1)}{m.group(2)}.{m.group(3)}"  # decimal comma: 1000,99
    if not re.fullmatch(rf"{_SIGN}{_DECIMAL}", s):
        return None
    decimals = len(s.split(".", 1)[1]) if "." in s else None
    return Fraction(s if not s.endswith(".") else s[:-1]), decimals


def parse_number(text: str) -> Number | None:
    """Parse `text` as a plain number, or return None (never raises, bounded work).

    >>> parse_number("7,425,000").value
    Fraction(7425000, 1)
    >>> parse_number("\\\\frac{1}{3}").value
    Fraction(1, 3)
    """
    if len(text) > 2 * MAX_DIGITS:
        return None
    s, percent = _clean(text)
    if not s:
        return None
    parsed = _decimal(s)
    if parsed is not None:
        return Number(parsed[0], parsed[1], percent)
    m = _SCI.match(s)
    if m:
        mantissa = _decimal(m.group(1))
        exponent = int(m.group(2) or m.group(3))
        if mantissa is None or abs(exponent) > MAX_EXPONENT:
            return None
        decimals = (mantissa[1] or 0) - exponent
        return Number(mantissa[0] * Fraction(10) ** exponent, decimals if mantissa[1] else None, percent)
    for pattern in (_FRAC, _SLASH):
        m = pattern.match(s)
        if m:
            groups = m.groups()
            sign = -1 if len(groups) == 3 and groups[0] == "-" else 1
            num, den = int(groups[-2]), int(groups[-1])
            if den == 0:
                return None
            return Number(sign * Fraction(num, den), None, percent)
    m = _MIXED.match(s)
    if m:
        whole, num, den = int(m.group(2)), int(m.group(3)), int(m.group(4))
        if den == 0 or num >= den:
            return None
        value = whole + Fraction(num, den)
        return Number(-value if m.group(1) == "-" else value, None, percent)
    return None


def _round_half_up(x: Fraction) -> int:
    return int((x + Fraction(1, 2)) // 1) if x >= 0 else -int((-x + Fraction(1, 2)) // 1)


def decimal_matches(literal: Number, value: Fraction, float_rounding: int) -> bool:
    """True iff the inexact decimal `literal` is `value` rounded or truncated to its own decimals.

    Requires `literal.decimals >= float_rounding` (math-verify's default 6), so `0.333` does
    not match 1/3 but `0.333333` does. Exact: `value` is a Fraction, no float arithmetic.
    """
    d = literal.decimals
    if d is None or d < float_rounding:
        return False
    scale = Fraction(10) ** d
    target = literal.value * scale
    if target.denominator != 1:
        return False
    scaled = value * scale
    truncated = int(scaled)  # toward zero
    return target == _round_half_up(scaled) or target == truncated


def values_with_percent(number: Number) -> list[Fraction]:
    """Candidate values of a literal: `28%` may mean 28 or 0.28 (math-verify accepts both)."""
    return [number.value, number.value / 100] if number.percent else [number.value]


def numbers_equal(a: Number, b: Number, *, float_rounding: int = 6) -> bool:
    """Exact equality of two plain numbers, with percent and inexact-decimal rules (symmetric)."""
    for va in values_with_percent(a):
        for vb in values_with_percent(b):
            if va == vb:
                return True
            if decimal_matches(Number(va, a.decimals), vb, float_rounding) or decimal_matches(
                Number(vb, b.decimals), va, float_rounding
            ):
                return True
    return False
