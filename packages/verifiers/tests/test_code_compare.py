"""Output comparison and test-case parsing (pure functions, no sandbox)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verifiers.code import TestCase, outputs_match, parse_tests, results_match
from verifiers.code.extract import extract_code
from verifiers.errors import TaskFormatError


@pytest.mark.parametrize(
    ("actual", "expected", "ok"),
    [
        ("1 2 3\n", "1 2 3", True),
        ("1 2 3   \n\n\n", "1 2 3\n", True),  # trailing whitespace and blank lines
        ("0.3333333\n", "0.33333333", True),  # float formatting within rel 1e-5
        ("0.334\n", "0.333", False),
        ("YES", "yes", False),  # case matters
        ("1\n2", "1 2", True),  # same tokens, different line breaks
        ("1 2", "1 2 3", False),
        ("nan", "nan", True),
        ("inf", "1e308", False),
    ],
)
def test_outputs_match(actual, expected, ok):
    assert outputs_match(actual, expected) is ok


def test_order_insensitive_option():
    assert not outputs_match("b\na", "a\nb")
    assert outputs_match("b\na", "a\nb", order_insensitive=True)


def test_results_match_json_values():
    assert results_match("[1, 2]", [1, 2])
    assert results_match("(1, 2)", [1, 2])  # tuples come back as lists
    assert results_match("3", [3])  # INTELLECT-2 wraps call outputs in a list
    assert results_match("0.30000000000000004", 0.3)
    assert not results_match("True", 1)  # bool is not int
    assert not results_match("__import__('os')", 1)  # parsed, never evaluated
    assert not results_match(None, 1)
    assert not results_match("not a literal", 1)


@given(st.lists(st.integers(), max_size=20))
def test_outputs_match_is_reflexive_under_whitespace(values):
    text = " ".join(map(str, values))
    assert outputs_match(text + "  \n\n", text)


def test_parse_intellect2_formats():
    stdio = parse_tests(json.dumps({"inputs": ["1\n"], "outputs": ["2\n"]}))
    assert stdio == [TestCase("1\n", "2\n")]
    call = parse_tests(
        {"test_cases": json.dumps({"inputs": ["1\n[2, 3]"], "outputs": ["[5]"], "fn_name": "f"})}
    )
    assert call == [TestCase([1, [2, 3]], [5], "f")]
    genesys = parse_tests([{"type": "stdin_stdout", "input": "x", "output": "y"}])
    assert genesys == [TestCase("x", "y")]


@pytest.mark.parametrize(
    "bad",
    [
        "{not json",
        {"inputs": [1]},
        {"inputs": [1], "outputs": []},
        [{"foo": 1}],
        3,
        {"inputs": ["{"], "outputs": [1], "fn_name": "f"},
    ],
)
def test_parse_tests_rejects_malformed(bad):
    with pytest.raises(TaskFormatError):
        parse_tests(bad)


def test_extract_code_takes_last_python_block():
    text = "```python\nprint(1)\n```\ntext\n```py\nprint(2)\n```\n```bash\nls\n```"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("no code") is None
    assert extract_code("<think>```python\nx\n```", require_think_close=True) is None
