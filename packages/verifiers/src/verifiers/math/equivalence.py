"""`is_equivalent`: cheap exact checks in the caller, everything else in a worker process.

The in-process fast path only does bounded string and exact rational work (answer span,
normalisation, exact plain-number comparison, then `fast.decide`: the worker's structural
walk with leaves that decide only what needs no sympy), so it cannot hang; everything else
runs with sympy in `pool.MathWorkerPool` under a hard, kill-enforced deadline.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from verifiers.math.numbers import numbers_equal, parse_number
from verifiers.math.pool import MathWorkerPool, default_pool
from verifiers.math.structural import Options

MAX_ANSWER_CHARS = 50_000


@dataclass(frozen=True)
class Verdict:
    """Result of `compare_answers`.

    Attributes:
        equal: the decision (False on timeout or error: fail closed).
        reason: "identical", "numbers", "exact" (decided in the caller by `fast.decide`),
            "symbolic" (decided by a worker), "different", "timeout", "error", "empty" or
            "too_long".
        detail: error text for "timeout"/"error".
        elapsed_s: wall time of the whole check.
    """

    equal: bool
    reason: str
    detail: str | None = None
    elapsed_s: float = 0.0


def _fast(gold: str, pred: str, opts: Options) -> Verdict | None:
    # Imported here so that importing verifiers.math stays cheap.
    from verifiers.math.extract import answer_span
    from verifiers.math.fast import decide
    from verifiers.math.latex import normalize

    g, p = normalize(answer_span(gold)), normalize(answer_span(pred))
    if not g or not p:
        return Verdict(False, "empty")
    if g == p:
        return Verdict(True, "identical")
    ng, np_ = parse_number(g), parse_number(p)
    if ng is not None and np_ is not None:
        equal = numbers_equal(ng, np_, float_rounding=opts.float_rounding)
        return Verdict(equal, "numbers" if equal else "different")
    decided = decide(g, p, opts)
    if decided is not None:
        return Verdict(decided, "exact" if decided else "different")
    return None


def compare_answers(
    gold: object,
    pred: object,
    *,
    timeout: float = 5.0,
    float_rounding: int = 6,
    strict: bool = True,
    allow_set_relation_comp: bool = False,
    pool: MathWorkerPool | None = None,
) -> Verdict:
    """Decide whether `pred` states the same answer as `gold`, with the reason.

    Args:
        gold: reference answer (str or number); may be a text containing `\\boxed{}`/`$...$`.
        pred: predicted answer, same forms. Direction matters only for relation-vs-set
            comparisons (see `verifiers.math.compare`).
        timeout: hard limit in seconds for the symbolic part (default 5 s, math-verify's);
            enforced by killing the worker process, so it holds in any thread.
        float_rounding: a decimal literal must state at least this many decimals to match
            an exact value it rounds/truncates to (math-verify's name, default 6).
        strict: False lets `f(y)` match `f(x)` (positional renaming of free symbols).
        allow_set_relation_comp: let a gold set match a predicted inequality.
        pool: worker pool; default the process-wide `default_pool()`.
    """
    start = time.perf_counter()
    gold_text, pred_text = str(gold), str(pred)
    if len(gold_text) > MAX_ANSWER_CHARS or len(pred_text) > MAX_ANSWER_CHARS:
        return Verdict(False, "too_long", elapsed_s=time.perf_counter() - start)
    opts = Options(float_rounding, strict, allow_set_relation_comp)
    fast = _fast(gold_text, pred_text, opts)
    if fast is not None:
        return Verdict(fast.equal, fast.reason, elapsed_s=time.perf_counter() - start)
    request = {
        "gold": gold_text,
        "pred": pred_text,
        "options": {
            "float_rounding": float_rounding,
            "strict": strict,
            "allow_set_relation_comp": allow_set_relation_comp,
        },
    }
    reply = (pool or default_pool()).ask(request, timeout)
    elapsed = time.perf_counter() - start
    if reply.status != "ok":
        return Verdict(False, reply.status, reply.error, elapsed)
    return Verdict(reply.equal, "symbolic" if reply.equal else "different", elapsed_s=elapsed)


def is_equivalent(
    gold: object,
    pred: object,
    *,
    timeout: float = 5.0,
    float_rounding: int = 6,
    strict: bool = True,
    allow_set_relation_comp: bool = False,
    pool: MathWorkerPool | None = None,
) -> bool:
    """True iff `pred` is mathematically the same answer as `gold` (see `compare_answers`).

    Never raises on arbitrary text; returns False on timeout.
    """
    return compare_answers(
        gold,
        pred,
        timeout=timeout,
        float_rounding=float_rounding,
        strict=strict,
        allow_set_relation_comp=allow_set_relation_comp,
        pool=pool,
    ).equal


async def is_equivalent_async(gold: object, pred: object, **kwargs: object) -> bool:
    """`is_equivalent` for asyncio code: runs in a thread so the loop keeps serving."""
    return await asyncio.to_thread(is_equivalent, gold, pred, **kwargs)  # type: ignore[arg-type]
