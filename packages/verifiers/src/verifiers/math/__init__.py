"""Math answers: extraction from completions and equivalence checking with hard timeouts.

>>> from verifiers.math import extract_answer, is_equivalent
>>> extract_answer("<think>...</think> so $\\\\boxed{\\\\frac{1}{2}}$")
'\\\\frac{1}{2}'
>>> is_equivalent("0.5", "\\\\frac{1}{2}")
True
"""

from __future__ import annotations

from verifiers.math.equivalence import Verdict, compare_answers, is_equivalent, is_equivalent_async
from verifiers.math.extract import FALLBACKS, extract_answer
from verifiers.math.pool import MathWorkerPool, configure_default_pool, default_pool

__all__ = [
    "FALLBACKS",
    "MathWorkerPool",
    "Verdict",
    "compare_answers",
    "configure_default_pool",
    "default_pool",
    "extract_answer",
    "is_equivalent",
    "is_equivalent_async",
]
