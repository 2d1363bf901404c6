"""Answer extraction: boxes, the think gate, fallbacks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifiers.math import extract_answer
from verifiers.math.extract import answer_span, boxed_contents, last_number


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("so $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),  # last box wins
        ("\\fbox{7}", "7"),
        ("\\boxed 5 is it", "5"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not close the box
        ("\\boxed{a^{2}+b_{1}}", "a^{2}+b_{1}"),
        ("answer: \\boxed{12", "12"),  # unclosed: rest of the text
        ("The final answer is 42.\nBye", "42."),
    ],
)
def test_extract_answer(completion, answer):
    assert extract_answer(completion) == answer


def test_think_gate():
    text = "<think>maybe \\boxed{1}</think> so \\boxed{2}"
    assert extract_answer(text, require_think_close=True) == "2"
    assert extract_answer("<think>\\boxed{1}", require_think_close=True) is None
    assert extract_answer("<think>\\boxed{1}") == "1"


def test_fallbacks_are_configurable():
    text = "We get $x = 3$ and so 17 apples"
    assert extract_answer(text) is None
    assert extract_answer(text, fallbacks=("last_math",)) == "x = 3"
    assert extract_answer(text, fallbacks=("last_number",)) == "17"
    with pytest.raises(ValueError, match="unknown fallbacks"):
        extract_answer(text, fallbacks=("guess",))


def test_overlong_completion_has_no_answer():
    assert extract_answer("x" * 50_001 + "\\boxed{1}") is None


def test_adjacent_boxes_merge_in_answer_span_only():
    assert answer_span("$\\boxed{1}\\boxed{2}$") == "1,2"
    assert answer_span("\\boxed{1} no no \\boxed{2}") == "2"


def test_last_number_needs_standalone_digits():
    assert last_number("AZYUK2A") is None
    assert last_number("is 1,000.99m²") == "1,000.99"


@given(st.text(alphabet=st.characters(blacklist_characters="{}\\"), max_size=50))
def test_boxed_content_round_trips(content):
    assert boxed_contents(f"pre \\boxed{{{content}}} post")[-1][2] == content.strip()


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_extract_never_raises(text):
    result = extract_answer(text, fallbacks=("final_answer", "last_math", "last_number"))
    assert result is None or isinstance(result, str)
    assert isinstance(answer_span(text), str)
