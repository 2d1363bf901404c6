"""Test-case formats: INTELLECT-2 `{inputs, outputs, fn_name?}` and GENESYS lists.

INTELLECT-2 rows store `verification_info = {"test_cases": "<JSON string>"}` whose inner
object is `{"inputs": [...], "outputs": [...], "fn_name"?: str}`: without `fn_name` each
input/output is a full stdin/stdout text; with it each input is newline-separated JSON
arguments and each output a JSON value (or its JSON text).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from verifiers.errors import TaskFormatError


@dataclass(frozen=True)
class TestCase:
    """One test. `fn_name` None: stdin -> stdout (`input`/`output` are texts). Otherwise the
    program's function `fn_name` is called with `input` (a list of arguments) and must return
    `output` (a JSON value)."""

    __test__ = False  # not a pytest class

    input: object
    output: object
    fn_name: str | None = None


def _call_arguments(raw: object) -> list:
    if isinstance(raw, list):
        return raw
    if not isinstance(raw, str):
        return [raw]
    args = []
    for line in raw.split("\n"):
        if line.strip():
            try:
                args.append(json.loads(line))
            except ValueError as exc:
                raise TaskFormatError(f"call-mode input line is not JSON: {line[:80]!r}") from exc
    return args


def _call_output(raw: object) -> object:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def parse_tests(tests: object) -> list[TestCase]:
    """Normalise any supported test description into a list of `TestCase`.

    Accepts: a list of `TestCase`; an INTELLECT-2 mapping `{inputs, outputs, fn_name?}` (or
    its JSON text, or `{"test_cases": <either>}`); a GENESYS list of `{input, output, fn_name?}`.
    """
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except ValueError as exc:
            raise TaskFormatError(f"test cases are not valid JSON: {exc}") from exc
    if isinstance(tests, Mapping) and "test_cases" in tests:
        return parse_tests(tests["test_cases"])
    if isinstance(tests, Mapping):
        if "inputs" not in tests or "outputs" not in tests:
            raise TaskFormatError("test mapping needs 'inputs' and 'outputs'")
        inputs, outputs = list(tests["inputs"]), list(tests["outputs"])
        if len(inputs) != len(outputs):
            raise TaskFormatError(f"{len(inputs)} inputs but {len(outputs)} outputs")
        fn_name = tests.get("fn_name") or None
        if fn_name:
            return [
                TestCase(_call_arguments(i), _call_output(o), fn_name)
                for i, o in zip(inputs, outputs, strict=True)
            ]
        return [TestCase(str(i), str(o)) for i, o in zip(inputs, outputs, strict=True)]
    if isinstance(tests, Iterable):
        cases = []
        for item in tests:
            if isinstance(item, TestCase):
                cases.append(item)
            elif isinstance(item, Mapping) and "input" in item and "output" in item:
                fn_name = item.get("fn_name") or None
                if fn_name:
                    cases.append(
                        TestCase(_call_arguments(item["input"]), _call_output(item["output"]), fn_name)
                    )
                else:
                    cases.append(TestCase(str(item["input"]), str(item["output"])))
            else:
                raise TaskFormatError(f"unsupported test case {str(item)[:80]!r}")
        return cases
    raise TaskFormatError(f"unsupported test description of type {type(tests).__name__}")
