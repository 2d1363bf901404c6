"""Split a normalised answer into its structure: lists, sets, tuples, intervals, unions,
relations, memberships, matrices, expressions and free text (pure string work, no sympy).

Grammar, outermost first: `;` and "and"/"or" separate answers; `\\pm` expands to two
answers; top-level commas make a list (unless the whole string is one number such as
`7,425,000`); `\\cup` makes a union, `\\cap`/`\\setminus` a `SetOp`, `\\in` a membership, `= < <= > >= !=` a relation chain;
`(a, b)` is a tuple that may stand for an open interval, `[a, b)` an interval, `\\{a, b\\}` a
set, `\\begin{pmatrix}` a matrix; what is left is an expression (`Atom`) or `Text`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from verifiers.math.latex import LatexError, strip_units, to_sympy_source
from verifiers.math.numbers import parse_number


@dataclass(frozen=True)
class Atom:
    """One expression, as normalised LaTeX."""

    text: str


@dataclass(frozen=True)
class Text:
    """Free text that is not mathematics (compared as a case-folded string)."""

    text: str


@dataclass(frozen=True)
class Seq:
    """`kind` is "multi" (bare list, unordered), "set" (`\\{..\\}`), "tuple" (`(..)`, ordered)
    or "assign" (`p=5, q=2`: items are the assignments, compared by name or in order)."""

    kind: str
    items: tuple[Value, ...]


@dataclass(frozen=True)
class Interval:
    lo: Value
    hi: Value
    left_open: bool
    right_open: bool


@dataclass(frozen=True)
class Union:
    parts: tuple[Value, ...]


@dataclass(frozen=True)
class SetOp:
    """`left ∩ right` (op "∩") or `left ∖ right` (op "∖"), left-associative."""

    op: str
    left: Value
    right: Value


@dataclass(frozen=True)
class Relation:
    """A chain `terms[0] ops[0] terms[1] ...`; ops are `= != < <= > >=`."""

    terms: tuple[Value, ...]
    ops: tuple[str, ...]


@dataclass(frozen=True)
class Member:
    """`var \\in value`."""

    var: str
    value: Value


@dataclass(frozen=True)
class Matrix:
    rows: tuple[tuple[Value, ...], ...]


Value = Atom | Text | Seq | Interval | Union | SetOp | Relation | Member | Matrix

_OPEN = "([{"
_CLOSE = ")]}"
_CONNECTOR = re.compile(r"(?<![A-Za-z\\])(?:and|or)(?![a-z])|\\(?:text\s*)?quad")
_RELATION = re.compile(r"<=|>=|!=|<|>|=")
_VARIABLE = re.compile(r"^\s*(?:\\?[A-Za-z]+(?:_\{?[A-Za-z0-9]+\}?)?'*(?:\s*\([^()]*\))?)\s*$")
_MATRIX = re.compile(
    r"^\\begin\{(?P<env>[pbvBV]?matrix|array|smallmatrix)\}(?:\{[^}]*\})?(?P<body>.*)\\end\{(?P=env)\}$",
    re.DOTALL,
)
MAX_ITEMS = 64
MAX_PARSE_CHARS = 4000  # longer "answers" are compared as text (bounds the quadratic splits)
MAX_DEPTH = 40
MAX_PLUS_MINUS = 4  # each \pm doubles the candidates


def _depths(s: str) -> list[int]:
    """Bracket depth before each character; `\\{`, `\\}` count, `\\left(` was removed earlier."""
    depths, depth, i = [], 0, 0
    while i < len(s):
        depths.append(depth)
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            depths.append(depth)
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        i += 1
    return depths


def split_top(s: str, pattern: re.Pattern[str] | str) -> list[str]:
    """Split `s` at matches of `pattern` that sit at bracket depth 0."""
    regex = re.compile(re.escape(pattern)) if isinstance(pattern, str) else pattern
    depths = _depths(s)
    parts, start = [], 0
    for m in regex.finditer(s):
        if m.start() < len(depths) and depths[m.start()] == 0 and m.end() > m.start():
            parts.append(s[start : m.start()])
            start = m.end()
    parts.append(s[start:])
    return parts


def _split_relations(s: str) -> tuple[list[str], list[str]]:
    depths = _depths(s)
    terms, ops, start = [], [], 0
    for m in _RELATION.finditer(s):
        if depths[m.start()] == 0:
            terms.append(s[start : m.start()])
            ops.append(m.group(0))
            start = m.end()
    terms.append(s[start:])
    return terms, ops


def _enclosed(s: str, opener: int = 1) -> bool:
    """True when the bracket opened by s[:opener] closes at the last character."""
    depths = _depths(s)
    return len(s) > opener and all(d > 0 for d in depths[opener:])


def is_variable(text: str) -> bool:
    """A name that can be assigned (lhs of `x = 3`): `x`, `F_n`, `f(x)`, `\\alpha`, `(p, q)`,
    `|AB|`, `A:B`, `\\frac{NO}{BO}`. Anything with digits or `+`/`-` outside subscripts
    (`7`, `2x + z`, `x^2`) is an expression, so `7 = 11a+c` stays an equation."""
    if _VARIABLE.match(text) and not re.search(r"\d", text.split("(")[0].split("_")[0]):
        return True
    bare = re.sub(r"_\{[^{}]*\}|_[A-Za-z0-9]", "", text)
    bare = re.sub(r"\\(?:frac|text|mathrm|alpha|beta|gamma|theta|phi|angle)", "", bare)
    return bool(re.search(r"[A-Za-z]", bare)) and not re.search(r"[\d+\-^=<>]", bare)


def _items(inner: str) -> list[Value]:
    parts = split_top(inner, ",")
    if len(parts) == 1:
        parts = split_top(inner, ";")  # (0;-2;6): semicolon as the coordinate separator
    return [parse(part) for part in parts]


_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_NOT_PROSE = {"and", "or", "sqrt", "frac", "sin", "cos", "tan", "log", "ln", "exp", "pi"}


def is_prose(s: str) -> bool:
    """Two or more plain words (not commands, not "and"/"or"): a sentence, not an answer."""
    s = re.sub(r"\\(?:begin|end)\{[^}]*\}(?:\{[^}]*\})?", " ", s)
    # all-capital words are point/segment names (AB, CD), not prose
    words = [w for w in _WORD.findall(s) if w.lower() not in _NOT_PROSE and not w.isupper()]
    return len(words) >= 2


def parse(s: str) -> Value:
    """Structure of one normalised answer string (never raises on any input)."""
    s = s.strip()
    if not s or len(s) > MAX_PARSE_CHARS or is_prose(s):
        return Text(s)
    depths = _depths(s)
    if max(depths, default=0) > MAX_DEPTH or min(depths, default=0) < 0:
        return Text(s)
    parts = [p for p in split_top(s, ";") if p.strip()]
    if len(parts) > 1:
        return Seq("multi", tuple(parse(p) for p in parts[:MAX_ITEMS]))
    parts = [p for p in split_top(s, _CONNECTOR) if p.strip()]
    if len(parts) > 1:
        return Seq("multi", tuple(parse(p) for p in parts[:MAX_ITEMS]))
    pm = [i for i, c in enumerate(s) if c in "±∓" and depths[i] == 0]
    if len(pm) > MAX_PLUS_MINUS:
        return Text(s)
    if pm:
        i = pm[0]
        plus, minus = s[:i] + "+" + s[i + 1 :], s[:i] + "-" + s[i + 1 :]
        return Seq("multi", (parse(plus), parse(minus)))
    if parse_number(s) is not None:
        return Atom(s)
    parts = split_top(s, ",")
    if len(parts) > 1:
        values = [parse(p) for p in parts[:MAX_ITEMS]]
        assignments = [v for v in values if isinstance(v, Relation) and _is_assignment(v)]
        if len(assignments) == len(values):
            return Seq("assign", tuple(assignments))
        if assignments and values[0] is assignments[0] and len(assignments) == 1:
            first = assignments[0]
            rhs = Seq("multi", (first.terms[-1], *values[1:]))
            return Relation((first.terms[0], rhs), ("=",))
        return Seq("multi", tuple(values))
    parts = split_top(s, "∪")
    if len(parts) > 1:
        return Union(tuple(parse(p) for p in parts[:MAX_ITEMS]))
    operators = [m for m in re.finditer("[∩∖]", s) if depths[m.start()] == 0]
    if len(operators) > MAX_ITEMS:
        return Text(s)
    if operators:  # left-associative: A ∩ B ∖ C = (A ∩ B) ∖ C
        last = operators[-1]
        left, right = s[: last.start()].strip(), s[last.end() :].strip()
        if left and right:
            return SetOp(last.group(0), parse(left), parse(right))
    parts = split_top(s, "∈")
    if len(parts) == 2 and parts[0].strip():
        return Member(parts[0].strip(), parse(parts[1]))
    terms, ops = _split_relations(s)
    if ops and all(t.strip() for t in terms):
        if len(ops) > 1 and all(op == "=" for op in ops):
            terms, ops = [terms[0], terms[-1]], ["="]  # x = 5+5+1 = 11 states x = 11
        return Relation(tuple(parse(t) for t in terms[:MAX_ITEMS]), tuple(ops[: MAX_ITEMS - 1]))
    matrix = _MATRIX.match(s)
    if matrix:
        body = matrix.group("body").strip().rstrip("\\").strip()
        rows = [r for r in re.split(r"\\\\", body) if r.strip()]
        return Matrix(tuple(tuple(parse(c) for c in row.split("&")) for row in rows[:MAX_ITEMS]))
    if s.startswith("\\{") and s.endswith("\\}") and _enclosed(s, 2):
        return Seq("set", tuple(_items(s[2:-2]))) if s[2:-2].strip() else Seq("set", ())
    if s[0] in "([" and s[-1] in ")]" and _enclosed(s):
        inner = s[1:-1]
        items = _items(inner)
        if len(items) == 1:
            return items[0]
        if len(items) == 2 and not (s[0] == "(" and s[-1] == ")"):
            return Interval(items[0], items[1], s[0] == "(", s[-1] == ")")
        return Seq("tuple", tuple(items))
    if s[0] == "{" and s[-1] == "}" and _enclosed(s):
        items = _items(s[1:-1])
        return Seq("set", tuple(items)) if len(items) > 1 else items[0]
    return _leaf(s)


def _is_name(value: Value) -> bool:
    if isinstance(value, Atom | Text):
        return is_variable(value.text)
    return isinstance(value, Seq) and value.kind == "tuple" and all(_is_name(v) for v in value.items)


def _is_assignment(rel: Relation) -> bool:
    return rel.ops == ("=",) and _is_name(rel.terms[0])


def is_assignment(value: Value) -> bool:
    """A single `name = value` relation."""
    return isinstance(value, Relation) and _is_assignment(value)


def _leaf(s: str) -> Value:
    if re.fullmatch(r"[A-Za-z]{2,}", s):  # a word ("yes", "east") is text, not a product
        return Text(s)
    unitless = strip_units(s)
    try:
        to_sympy_source(unitless.replace("%", ""))
    except LatexError:
        return Text(s)
    except RecursionError:
        return Text(s)
    return Atom(unitless)
