"""Answer extraction from model completions: last `\\boxed{}` after `</think>`, with fallbacks.

INTELLECT-2 (prime-rl @4bb0ff01f) took the content of the last `\\boxed{...}` after the first
`</think>` and gave 0 to `\\fbox{}`, `\\boxed 5` and unclosed braces. We accept all three
(an unclosed brace takes the rest of the text) and offer opt-in fallbacks.

Pitfall: the `</think>` gate is ON for `extract_answer` by default only when
`require_think_close=True`; reasoning models that never close the think block score 0 then.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

FALLBACKS = ("final_answer", "last_math", "last_number")

_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_FINAL = re.compile(r"(?i)(?:final\s+answer|the\s+answer)(?:\s+is)?\s*[:=：]?\s*([^\n]+)")
_NUMBER = re.compile(r"(?<![\w.])[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\d|[.,]\d)")
_MATH_SPANS = (
    re.compile(r"\$\$(.+?)\$\$", re.DOTALL),
    re.compile(r"\\\[(.+?)\\\]", re.DOTALL),
    re.compile(r"\\\(([^\n]+?)\\\)"),  # inline spans stay on one line
    re.compile(r"(?<![\\$])\$(?!\$)([^\n$]+?)(?<!\\)\$"),
)


# What may sit between two boxes that state one multi-part answer:
# "\\boxed{1}\\boxed{2}", "\\boxed{1}, \\boxed{2}", "\\(\\boxed{1}\\) and \\(\\boxed{2}\\)",
# "\\boxed{1} \\quad \\text{and} \\quad \\boxed{2}".
_SEP = r"(?:\s|[,;$.]|\\[()\[\]]|\\q?quad|\\[,;: ]|\\text\{\s*(?:and|or|,)?\s*\})*"
_BOX_JOINER = re.compile(rf"{_SEP}(?:(?:and|or){_SEP})?")
_SPAN_JOINER = re.compile(r"\s*(?:,|;|and|or|,\s*and|,\s*or)\s*")


def _braces(text: str, start: int) -> Iterator[tuple[int, str]]:
    """(index, `{` or `}`) of every unescaped brace from `start` on: a backslash skips the next character."""
    i = start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c in "{}":
            yield i, c
        i += 1


def match_brace(text: str, open_index: int) -> int:
    """Index of the `}` closing the `{` at `open_index` (escaped `\\{`/`\\}` ignored), or -1."""
    depth = 0
    for i, c in _braces(text, open_index):
        if c == "{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return i
    return -1


def brace_pairs(text: str) -> dict[int, int]:
    """Index of every `{` -> index of its matching `}` (-1 if unclosed), in one O(n) pass."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for i, c in _braces(text, 0):
        if c == "{":
            stack.append(i)
        elif stack:
            pairs[stack.pop()] = i
    for open_index in stack:
        pairs[open_index] = -1
    return pairs


def boxed_contents(text: str) -> list[tuple[int, int, str]]:
    """All `\\boxed`/`\\fbox` answers as (start, end, content), brace-matched, in order.

    `\\boxed 5` takes the next token; an unclosed `\\boxed{` takes the rest of the text.
    Linear time: brace pairs are computed once (`\\boxed{` x 10^4 stays fast).
    """
    found = []
    pairs: dict[int, int] | None = None
    for m in _BOX.finditer(text):
        i = m.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            if pairs is None:
                pairs = brace_pairs(text)
            close = pairs.get(i, -1)
            end = close + 1 if close >= 0 else len(text)
            content = text[i + 1 : close] if close >= 0 else text[i + 1 :]
        else:
            token = re.match(r"[^\s$]+", text[i:])
            if token is None:
                continue
            end = i + token.end()
            content = token.group(0)
        found.append((m.start(), end, content.strip()))
    return found


def last_boxed(text: str, *, merge_adjacent: bool = False) -> str | None:
    """Content of the last box; with `merge_adjacent`, `\\boxed{1}\\boxed{2}` gives "1,2"."""
    boxes = boxed_contents(text)
    if not boxes:
        return None
    if not merge_adjacent:
        return boxes[-1][2]
    group = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        if box[1] > group[0][0]:  # nested or unclosed: not a separate adjacent answer
            break
        between = text[box[1] : group[0][0]]
        if _BOX_JOINER.fullmatch(between):
            group.insert(0, box)
        else:
            break
    return ",".join(b[2] for b in group)


def last_math_span(text: str) -> str | None:
    """Content of the last `$...$`, `$$...$$`, `\\[...\\]` or `\\(...\\)` span, or None."""
    best: tuple[int, str] | None = None
    for pattern in _MATH_SPANS:
        for m in pattern.finditer(text):
            if best is None or m.start() > best[0]:
                best = (m.start(), m.group(1).strip())
    return best[1] if best else None


def final_answer_phrase(text: str) -> str | None:
    """Text after the last "final answer is"/"the answer is", up to the end of the line."""
    matches = list(_FINAL.finditer(text))
    return matches[-1].group(1).strip() if matches else None


def last_number(text: str) -> str | None:
    """The last standalone number (`AZYUK2A` contains none), commas as thousands separators."""
    matches = _NUMBER.findall(text)
    return matches[-1] if matches else None


def after_think(text: str, *, require_think_close: bool) -> str | None:
    """Text after the first `</think>` (up to a second one); None if required and absent."""
    if "</think>" not in text:
        return None if require_think_close else text
    return text.split("</think>")[1]


def extract_answer(
    completion: str,
    *,
    require_think_close: bool = False,
    fallbacks: Sequence[str] = ("final_answer",),
    max_chars: int = 50_000,
) -> str | None:
    """The answer a completion commits to, or None (fail closed).

    Order: last `\\boxed{}`/`\\fbox{}` (brace-matched) in the answer section, then each named
    fallback in turn: "final_answer" ("final answer is X"), "last_math" (last `$...$`),
    "last_number". Completions longer than `max_chars` (50,000, as `verifiers`' MathRubric)
    give None.

    Args:
        completion: generated text (for reasoning models, the text starts inside `<think>`).
        require_think_close: INTELLECT-2's gate: without `</think>` there is no answer.
        fallbacks: subset of `FALLBACKS`, tried in order when no box is present.
    """
    unknown = set(fallbacks) - set(FALLBACKS)
    if unknown:
        raise ValueError(f"unknown fallbacks {sorted(unknown)}; choose from {FALLBACKS}")
    if not isinstance(completion, str) or len(completion) > max_chars:
        return None
    section = after_think(completion, require_think_close=require_think_close)
    if section is None:
        return None
    boxed = last_boxed(section)
    if boxed is not None:
        return boxed or None
    finders = {"final_answer": final_answer_phrase, "last_math": last_math_span, "last_number": last_number}
    for name in fallbacks:
        found = finders[name](section)
        if found:
            return found
    return None


def joined_math_spans(text: str) -> str | None:
    """`$1$ and $2$ and $3$` -> "1,2,3" when the text is only math spans and connectors."""
    stripped = text.strip().rstrip(".")
    pieces = re.split(r"(?<![\\$])\$(?!\$)([^\n$]+?)(?<!\\)\$", stripped)
    spans, between = pieces[1::2], pieces[0::2]
    if len(spans) < 2 or between[0].strip() or between[-1].strip():
        return None
    if not all(_SPAN_JOINER.fullmatch(b) for b in between[1:-1]):
        return None
    return ",".join(span.strip() for span in spans)


def _final_phrase_answer(phrase: str) -> str:
    """Answer inside a "final answer" phrase: its first math span, or a trailing number."""
    phrase = re.sub(r"(?i)^the\s+final\s+answer\s+is\s*:?\s*", "", phrase).strip()
    span = last_math_span(phrase)
    if span is None:
        return re.sub(r"\.\s+I hope.*$", "", phrase).strip()
    if phrase.startswith(("$", "\\(", "\\[")):
        first = min((m for pattern in _MATH_SPANS for m in pattern.finditer(phrase)), key=lambda m: m.start())
        return first.group(1).strip()
    trailing = re.search(r"(?:is|=|:)\s*([+-]?\d[\d,]*(?:\.\d+)?)\s*\.?\s*$", phrase)
    return trailing.group(1) if trailing else span


def answer_span(text: str) -> str:
    """The answer part of a gold/prediction string given to `is_equivalent`.

    Bare answers pass through; texts are reduced to (adjacent) boxes, else a "final answer"
    phrase, else math spans joined by "and"/commas, else the last math span, else the text.
    """
    text = text.replace("\\\\boxed", "\\boxed").replace("\\\\fbox", "\\fbox")
    boxed = last_boxed(text, merge_adjacent=True)
    if boxed is not None:
        return boxed
    final = final_answer_phrase(text)
    if final is not None:
        return _final_phrase_answer(final)
    joined = joined_math_spans(text)
    if joined is not None:
        return joined
    span = last_math_span(text)
    if span is not None:
        return span
    return re.sub(r"(?<!\\)\$", "", text).strip()  # keeps a currency "\$" for normalize
