"""LaTeX answer normalisation and conversion of LaTeX expressions to sympy source text.

`normalize` is a pure string -> string cleanup (delimiters, spacing, font commands, units,
`\\le` -> `<=`, ...). `to_sympy_source` converts one *expression* (no commas, relations or
sets; `structure.py` splits those first) into Python/sympy syntax built only from an
allow-list of names, so the result is safe to hand to `sympy.parse_expr`.

Pitfall: `\\\\le` (a LaTeX line break glued to a command, common in escaped JSON) is read as
`\\le`; matrices keep `\\\\` as their row separator because it is followed by a space/digit.
"""

from __future__ import annotations

import re

from verifiers.math.extract import match_brace


class LatexError(ValueError):
    """The text is not an expression this converter understands."""


_FONT = re.compile(
    r"\\(?:text|textnormal|textrm|textbf|textit|mathrm|mathbf|mathit|mathsf|mathtt|mbox|"
    r"operatorname\*?|boldsymbol|bm|mathbb|mathcal|hbox)\s*\{"
)
_SPACING = re.compile(
    r"(?<!\\)\\(?:[,;:!> ]|(?:quad|qquad|displaystyle|textstyle|scriptstyle|hfill|nonumber)(?![a-zA-Z]))"
)
_SIZING = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)[lr]?(?![a-zA-Z])\s*\.?")
_RELATIONS = (
    (r"\\(?:leqslant|leq|le)(?![a-zA-Z])", "<="),
    (r"\\(?:geqslant|geq|ge)(?![a-zA-Z])", ">="),
    (r"\\(?:neq|ne)(?![a-zA-Z])", "!="),
    (r"\\lt(?![a-zA-Z])", "<"),
    (r"\\gt(?![a-zA-Z])", ">"),
    (r"≤", "<="),
    (r"≥", ">="),
    (r"≠", "!="),
)


_DEGREES = re.compile(r"(\d+(?:\.\d+)?)\s*(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![a-zA-Z]))")
_TRIG = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc)(?![a-zA-Z])")
_OPERATOR_NAME = re.compile(
    r"\\operatorname\*?\s*\{\s*(arcsin|arccos|arctan|sin|cos|tan|cot|sec|csc|sinh|cosh|tanh|ln|log|exp)\s*\}"
)


def _unwrap_font_commands(s: str) -> str:
    while True:
        m = _FONT.search(s)
        if m is None:
            return s
        close = match_brace(s, m.end() - 1)
        if close < 0:
            return s[: m.start()] + s[m.end() :]
        s = s[: m.start()] + s[m.end() : close] + s[close + 1 :]


def normalize(text: str) -> str:
    """Canonical spelling of an answer string (no parsing; idempotent on its output)."""
    s = text.strip()
    s = re.sub(r"\\\\(?=[a-zA-Z])", r"\\", s)  # "\\le" written with an escaped backslash
    s = s.replace("\\$", "")  # currency first: "\$1,000" is 1,000, not "\1,000"
    s = s.replace("$", "").replace("**", "")
    s = re.sub(r",\\!\s*(?=\d{3})", "", s)  # 32,\!349
    s = re.sub(r"(?<!\\)\{\s*,\s*\}\s*", "", s)  # 32{,}349 and 14 {, }916
    s = re.sub(r"\\mathbb\s*\{?\s*R\s*\}?", r"(-\\infty, \\infty)", s)
    s = re.sub(r"\\(?:emptyset|varnothing)(?![a-zA-Z])|∅", r"\\{\\}", s)
    s = _OPERATOR_NAME.sub(lambda m: "\\" + m.group(1), s)  # \operatorname{arcsin} -> \arcsin
    s = _unwrap_font_commands(s)
    s = _SIZING.sub("", s)
    s = re.sub(r"\\q?quad", " ", s)  # also "\quadx" (seen in datasets)
    s = _SPACING.sub(" ", s).replace("~", " ")
    s = re.sub(r"\\[dtc]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\[dt]binom(?![a-zA-Z])", r"\\binom", s)
    if _TRIG.search(s):  # \sin 30^\circ is sin(pi/6); elsewhere "30^\circ" just states 30
        s = _DEGREES.sub(lambda m: f"{{\\frac{{{m.group(1)}\\pi}}{{180}}}}", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![a-zA-Z])", "", s)
    s = re.sub(r"\\%|％", "%", s)
    s = re.sub(r"\s*(?:percent|pct)\b", "%", s)
    s = s.replace("\\$", "")
    # "x = 1/3 \approx 0.33": the approximation is commentary; a lone "x \approx 11" states x = 11
    s = re.sub(r"\\approx(?![a-zA-Z])|≈", "≈", s)
    s = re.sub(r"(=[^≈]*)≈.*$", r"\1", s) if re.search(r"=[^≈]*≈", s) else s.replace("≈", "=")
    for pattern, repl in _RELATIONS:
        s = re.sub(pattern, repl, s)
    s = re.sub(r"\\(?:pm)(?![a-zA-Z])|±", "±", s)
    s = re.sub(r"\\mp(?![a-zA-Z])|∓", "∓", s)
    s = re.sub(r"\\cup(?![a-zA-Z])|∪", " ∪ ", s)
    s = re.sub(r"\\cap(?![a-zA-Z])|∩", " ∩ ", s)
    s = re.sub(r"\\(?:setminus|backslash)(?![a-zA-Z])|∖", " ∖ ", s)
    s = re.sub(r"\\in(?![a-zA-Z])|∈", " ∈ ", s)
    s = re.sub(r"\\(?:infty|infinity)(?![a-zA-Z])|∞", "\\\\infty", s)
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"[\s.,;:]+$", "", s)
    s = re.sub(r"^\\?\s*(?:therefore|thus|so|hence)\b[,:]?\s*", "", s, flags=re.I)
    return s.strip()


_UNIT = re.compile(
    r"^([^a-zA-Z\\]*\d)\s*((?:[a-zA-Z]{2,}|[a-zA-Z][²³23])[²³23]?(?:(?:\s+|\s*[/.]\s*)[a-zA-Z]+[²³23]?)*)$"
)


_TRAILING_WORDS = re.compile(r"^(.*[\d}])\s+((?:[a-zA-Z]{2,}\s*)+)$")
_NOT_UNITS = {"and", "or", "sin", "cos", "tan", "log", "ln", "exp", "pi"}


# Units a bare letter may stand for after a space ("9.8 m/s^2"); any other single letter is a
# variable ("3 x^2" stays 3x^2).
_UNIT_NAMES = (
    "m|s|g|h|L|N|J|W|K|V|A|cm|mm|km|nm|dm|kg|mg|ms|min|hr|mL|ml|kJ|kW|kPa|Pa|Hz|mol|ft|in|yd|mi|"
    "lb|lbs|oz|mph|kmh|cc|cal|kcal|sq"
)
_POWER = r"(?:\^\s*\{?\s*-?\d\s*\}?|[²³])"
_KNOWN_UNIT = rf"(?:{_UNIT_NAMES}){_POWER}?"
_UNIT_TAIL = re.compile(rf"^(.*?(?:[\d}}]|\\pi))\s+({_KNOWN_UNIT}(?:\s*(?:/|\\cdot|\s)\s*{_KNOWN_UNIT})*)$")


_GLUED_UNIT = re.compile(rf"(?:{_UNIT_NAMES}|[a-zA-Z]{{3,}})(?![a-zA-Z])")


def strip_units(s: str) -> str:
    """`125 miles` -> `125`, `1,000.99m²` -> `1,000.99`, `\\frac{1}{3} meters` -> `\\frac{1}{3}`,
    `9.8 m/s^2` -> `9.8`, `25\\pi cm^2` -> `25\\pi`; `5x`, `3 x^2` and `2\\pi` are left alone."""
    m = _UNIT_TAIL.match(s)
    if m:
        return m.group(1).strip()
    m = _UNIT.match(s)
    glued = m is not None and not s[len(m.group(1)) :][:1].isspace()
    if glued and not _GLUED_UNIT.match(s[len(m.group(1)) :]):  # type: ignore[union-attr]
        m = None  # "5xy" is a product; "5cm", "1,000.99m²" and "125miles" state units
    if m and not re.search(r"[a-zA-Z\\]", m.group(1)):
        return m.group(1).strip()
    m = _TRAILING_WORDS.match(s)
    if m and not set(m.group(2).lower().split()) & _NOT_UNITS:
        return m.group(1).strip()
    return s


# ---------------------------------------------------------------- LaTeX -> sympy source

FUNCTIONS = {
    "sin": "sin", "cos": "cos", "tan": "tan", "cot": "cot", "sec": "sec", "csc": "csc",
    "arcsin": "asin", "arccos": "acos", "arctan": "atan", "sinh": "sinh", "cosh": "cosh",
    "tanh": "tanh", "ln": "log", "log": "log", "exp": "exp", "lg": "log10",
}  # fmt: skip
GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta",
    "vartheta", "iota", "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau",
    "upsilon", "phi", "varphi", "chi", "psi", "omega", "Gamma", "Delta", "Theta", "Lambda",
    "Xi", "Sigma", "Phi", "Psi", "Omega",
}  # fmt: skip
SAFE_NAMES = {
    "sqrt", "root", "Abs", "factorial", "binomial", "pi", "oo", "E", "I", "log10",
    "floor", "ceiling", "asinh", "acosh", "atanh", *FUNCTIONS.values(),
}  # fmt: skip
_INVERSE = {"sin": "asin", "cos": "acos", "tan": "atan", "sinh": "asinh", "cosh": "acosh", "tanh": "atanh"}
_BRACKETS = {"lfloor": " floor(", "rfloor": ")", "lceil": " ceiling(", "rceil": ")"}
_OPERATORS = {"cdot": "*", "times": "*", "div": "/", "ast": "*", "pi": " pi ", "infty": " oo "}


class _Converter:
    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def arg(self) -> str:
        """One macro argument: a {group}, a \\command or a single character."""
        s = self.s
        while self.i < len(s) and s[self.i] == " ":
            self.i += 1
        if self.i >= len(s):
            raise LatexError("missing argument")
        c = s[self.i]
        if c == "{":
            close = match_brace(s, self.i)
            if close < 0:
                raise LatexError("unbalanced brace")
            inner = s[self.i + 1 : close]
            self.i = close + 1
            return convert(inner)
        if c == "\\":
            m = re.match(r"\\([a-zA-Z]+)", s[self.i :])
            if m is None:
                raise LatexError("bad command")
            self.i += m.end()
            return convert(m.group(0))
        self.i += 1
        return convert(c)

    def function_argument(self) -> str:
        s = self.s
        while self.i < len(s) and s[self.i] == " ":
            self.i += 1
        if self.i < len(s) and s[self.i] == "(":
            depth, j = 0, self.i
            while j < len(s):
                depth += {"(": 1, ")": -1}.get(s[j], 0)
                if depth == 0:
                    break
                j += 1
            inner, self.i = s[self.i + 1 : j], j + 1
            return convert(inner)
        if self.i < len(s) and s[self.i] == "{":
            return self.arg()
        # No brackets: the argument is the run of juxtaposed factors that follows, with their
        # powers (`\sin 2x` = sin(2x), `\ln e^2` = ln(e^2), `\cos\frac{\pi}{4}`); it ends at an
        # operator, a closing bracket or the next function (`2\sin x\cos x`).
        factors: list[str] = []
        while True:
            while self.i < len(s) and s[self.i] == " ":
                self.i += 1
            factor = self._factor()
            if factor is None:
                break
            if self.s.startswith("^", self.i):
                self.i += 1
                factor = f"({factor})**({self.arg()})"
            factors.append(factor)
        if not factors:
            raise LatexError("function without argument")
        return "*".join(factors)

    def _factor(self) -> str | None:
        """One factor of an unbracketed function argument, or None where the argument ends."""
        s = self.s
        if self.i >= len(s):
            return None
        if s[self.i] == "{":
            return "(" + self.arg() + ")"
        if s[self.i] == "\\":
            m = re.match(r"\\([a-zA-Z]+)", s[self.i :])
            if m is None or not (m.group(1) in ("frac", "sqrt", "binom", "pi") or m.group(1) in GREEK):
                return None
            self.i += m.end()
            return "(" + self.command(m.group(1)) + ")"
        m = re.match(r"\d+(?:\.\d+)?|[A-Za-z]", s[self.i :])
        if m is None:
            return None
        self.i += m.end()
        return m.group(0)

    def run(self) -> str:
        out: list[str] = []
        s = self.s
        abs_open = False
        while self.i < len(s):
            c = s[self.i]
            if c == "\\":
                m = re.match(r"\\([a-zA-Z]+)", s[self.i :])
                if m is None:
                    if s.startswith("\\{", self.i) or s.startswith("\\}", self.i):
                        raise LatexError("set braces inside an expression")
                    raise LatexError(f"bad escape at {self.i}")
                self.i += m.end()
                out.append(self.command(m.group(1)))
            elif c == "{":
                out.append("(" + self.arg() + ")")
            elif c == "^":
                self.i += 1
                out.append("**(" + self.arg() + ")")
            elif c == "_":
                self.i += 1
                sub = re.sub(r"\W", "", self.arg())
                if not out or not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", out[-1].strip()) or not sub:
                    raise LatexError("subscript without a name")
                out[-1] = f"{out[-1].strip()}_{sub}"
            elif c == "|":
                self.i += 1
                out.append(")" if abs_open else " Abs(")
                abs_open = not abs_open
            elif c in "[]":
                self.i += 1
                out.append("(" if c == "[" else ")")
            else:
                self.i += 1
                out.append(c)
        if abs_open:
            raise LatexError("unbalanced |")
        return "".join(out)

    def command(self, name: str) -> str:
        if name == "frac":
            num, den = self.arg(), self.arg()
            return f"(({num})/({den}))"
        if name == "binom":
            n, k = self.arg(), self.arg()
            return f"binomial({n},{k})"
        if name == "sqrt":
            index = None
            if self.s.startswith("[", self.i):
                close = self.s.find("]", self.i)
                if close < 0:
                    raise LatexError("unbalanced [")
                index, self.i = convert(self.s[self.i + 1 : close]), close + 1
            body = self.function_argument() if self.s.startswith("(", self.i) else self.arg()
            return f"sqrt({body})" if index is None else f"root({body},{index})"
        if name in FUNCTIONS:
            power = ""
            if self.s.startswith("^", self.i):
                self.i += 1
                power = self.arg()
            base = None
            if name == "log" and self.s.startswith("_", self.i):
                self.i += 1
                base = self.arg()
            argument = self.function_argument()
            function = FUNCTIONS[name]
            if power.replace(" ", "") in ("-1", "(-1)") and function in _INVERSE:
                function, power = _INVERSE[function], ""  # \sin^{-1} x is arcsin x
            call = f" {function}({argument})" if base is None else f" log({argument},{base})"  # "y sin"
            return f"({call}**({power}))" if power else call
        if name in _BRACKETS:
            return _BRACKETS[name]
        if name in _OPERATORS:
            return _OPERATORS[name]
        if name in GREEK:
            return f" {name} "
        if name in ("mathrm", "text", "operatorname"):  # already unwrapped by normalize
            return self.arg()
        raise LatexError(f"unsupported command \\{name}")


def convert(text: str) -> str:
    """Raw conversion of a LaTeX expression to sympy syntax (not yet validated)."""
    return _Converter(text).run()


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ALLOWED_CHARS = re.compile(r"^[A-Za-z0-9_+\-*/().,!\s]*$")


def to_sympy_source(expr: str) -> str:
    """Convert a normalised LaTeX/plain expression to sympy source, or raise `LatexError`.

    Multi-letter words that are not known functions are split into letters (`abc` -> `a*b*c`,
    math-verify's convention); single letters, `x_1`-style names and Greek names stay symbols.
    """
    src = convert(expr.replace("×", "*").replace("÷", "/").replace("−", "-").replace("·", "*"))
    if not _ALLOWED_CHARS.match(src) or "__" in src:
        raise LatexError(f"unexpected characters in {expr!r}")

    def check(m: re.Match[str]) -> str:
        name = m.group(0)
        if name in SAFE_NAMES or name in GREEK or re.fullmatch(r"[A-Za-z](?:_[A-Za-z0-9]+)?", name):
            return name
        if re.fullmatch(r"[A-Za-z]+", name) and len(name) <= 4:
            return "*".join(name)
        raise LatexError(f"unknown word {name!r}")

    src = _IDENT.sub(check, src)
    if "." in re.sub(r"\d\.\d*|\.\d+|\d\.", "", src):
        raise LatexError("attribute access in an expression")
    return src
