"""Code rewards: run untrusted Python against tests in a sandbox (bubblewrap or rlimits).

>>> from verifiers.code import run_tests
>>> r = run_tests("print(int(input()) * 2)", {"inputs": ["3\\n"], "outputs": ["6\\n"]})
>>> (r.passed, r.total)
(1, 1)
"""

from __future__ import annotations

from verifiers.code.compare import outputs_match, results_match
from verifiers.code.extract import extract_code
from verifiers.code.run import CodeResult, TestOutcome, run_tests, sandbox_runs
from verifiers.code.sandbox import Limits, bwrap_available, default_sandbox
from verifiers.code.testcases import TestCase, parse_tests

__all__ = [
    "CodeResult",
    "Limits",
    "TestCase",
    "TestOutcome",
    "bwrap_available",
    "default_sandbox",
    "extract_code",
    "outputs_match",
    "parse_tests",
    "results_match",
    "run_tests",
    "sandbox_runs",
]
