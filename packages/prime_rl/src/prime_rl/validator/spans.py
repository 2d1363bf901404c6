"""The validator's checks of mixed-version samples (in-flight weight updates), single-turn and episodes.

Each sample's spans are read as one :class:`~prime_rl.api.spans.SpanPlan` (``api/spans.py``): its
versions from positions, where a single-turn sample's spans start at proof-chunk boundaries and an
episode's at model turns' starts. Everything model-free is the plan's; this module runs it over a
batch and recomputes the mixed-version samples, the only part that differs between the two kinds.

Model-free checks first (:func:`span_checks`), each with its own reason, the first one found is the
sample's:

* ``span_malformed``: the spans break the wire rules (the orchestrator refuses them with 422;
  re-checked on the stored batch); on an episode, a boundary that is not a model turn's first token;
* ``span_version_future``: a span's version is newer than the newest committed version;
* against the lease's switch records (``LeaseRecord.switches``: the first announcement per version,
  ``POST /leases/switch``), in span order: ``span_unannounced``, a span ``(v, b)`` with no record for
  ``v``; ``span_boundary_mismatch``, a record for ``v`` at another point than ``b``; then
  ``span_missing_mandatory``, a record inside the sample (it was still running at the switch)
  without that span. Points are tokens (a record at ``32 * chunk``) or, on episodes, model-turn
  indices (a record's chunk is the turn it switches at; the worker plays a lease's episodes turn by
  turn in lockstep, so every episode still running at turn ``t`` switches there). So every sample
  carries exactly the lease's recorded switches that fall inside it, and no other;
* ``span_not_lease_wide`` (a batch without a lease, rejected as ``not_assigned`` anyway): each
  sample's spans must be the batch's switch points that fall inside it.

Then the recompute (:func:`span_model_checks`; the forwards are ``validator/span_forwards.py``), each
version loaded once per chunk of ``validator.max_batch_size`` samples, in increasing order.

The rows then go through the same proof, sampling and log-prob checks as a one-version sample
(``checks.judge_spanned_chunk``), every proof chunk inside one span; the sampling check draws each run
with the plan's seeds (``SpanPlan.recorded_seeds``: ``span_seed`` chained through the recorded
switches' nonces, recomputed with the run's key), so a tail drawn with any other seed fails
``sampling_mismatch``. A failing proof is named by where it fails (``SpanPlan.proof_reason``):
``span_boundary_mismatch`` (the next version began before the claimed boundary, or the span's after
it), ``span_version_forged`` (every chunk or turn of a span ``k >= 1`` fails), else
``toploc_mismatch``. These are labels of where the proofs fail, not proofs of what the worker did;
either way the sample fails, and the lease with it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from prime_rl.api.protocol import LeaseRecord, PendingBatch, RolloutSample
from prime_rl.api.spans import SpanPlan, VersionSpan
from prime_rl.inference.contract import sampling_margins
from prime_rl.validator.checks import Checks, Observer, Pending, Reason, in_chunks, judge_spanned_chunk
from prime_rl.validator.span_forwards import BackendFor, recompute
from prime_rl.validator.span_forwards import chained_prefills as chained_prefills

__all__ = [
    "chained_prefills",
    "has_spans",
    "lease_switches",
    "plan_spans",
    "proof_reason",
    "record_problem",
    "span_checks",
    "span_model_checks",
    "span_sampling_margins",
    "span_seeds",
]

def has_spans(sample: RolloutSample) -> bool:
    """True for a sample of several versions (one span, or none, is a one-version sample)."""
    return sample.spans is not None and len(sample.spans) > 1


def span_checks(
    batch: PendingBatch, *, newest_version: int, max_versions: int
) -> list[tuple[str, str] | None]:
    """Per sample: ``(reason, detail)`` of its first model-free span failure (module docstring), or None."""
    return [found for found, _ in _planned(batch, newest_version, max_versions)]


def plan_spans(
    batch: PendingBatch, pending: Sequence[Pending], checks: Checks, *, newest_version: int
) -> None:
    """The model-free span checks of every sample (module docstring): a failure rejects it; a sample
    that passes keeps its plan (``Pending.plan``) for :func:`span_model_checks`, with, when it is mixed
    and the batch has a lease, the seeds its runs were drawn with (``SpanPlan.runs``)."""
    planned = _planned(batch, newest_version, checks.max_versions_per_sample)
    for p, (found, plan) in zip(pending, planned, strict=True):
        if found is not None:
            p.reject(Reason(found[0]), found[1])
            continue
        if checks.episode_env is not None and plan.turns is None:  # in an episode run: one model turn
            plan = SpanPlan.of(p.sample, plan.versions[0], episode=True)
        if plan.mixed and batch.lease is not None:
            plan = plan.drawn_with(p.sample.sampling_seed, checks.assignment_key, batch.lease)
        p.plan = plan


def _planned(
    batch: PendingBatch, newest: int, max_versions: int
) -> list[tuple[tuple[str, str] | None, SpanPlan]]:
    """Per sample: its first model-free span failure (or None) and its plan."""
    start = batch.lease.fixed_version if batch.lease is not None else batch.policy_version
    plans = [SpanPlan.of(sample, start) for sample in batch.samples]
    switches = SpanPlan.batch_switches(plans) if batch.lease is None else None
    out = []
    for sample, plan in zip(batch.samples, plans, strict=True):
        found = None
        if sample.spans is not None:
            found = plan.wire_problem(
                sample.spans, start_version=start, max_versions=max_versions, newest=newest
            )
        if found is None and batch.lease is not None:
            found = plan.record_problem(batch.lease.switches)
        elif found is None:
            found = plan.lease_wide_problem(switches, start)
        out.append((found, plan))
    return out


def span_model_checks(
    spanned: Sequence[Pending],
    backend_for: BackendFor,
    checks: Checks,
    observe: Observer | None,
    lease: LeaseRecord | None = None,
) -> None:
    """The recompute of live spanned samples (``validator/span_forwards.py``) from their plans
    (:func:`plan_spans`), then the per-sample model checks on their rows with each run's seed
    (``checks.judge_spanned_chunk``; no seeds, a batch without a lease: the sample's seeds
    throughout; it fails ``not_assigned`` before this). ``validator.max_batch_size`` samples at a
    time, each chunk's caches and logits released once it is judged; a chunk out of memory is
    halved, and a failure of the machine raises ``BackendFailure`` (``checks.in_chunks``): the batch
    is judged again later, never blamed on its worker. ``spanned``: samples no check has rejected
    yet (``validate_batch`` passes the live ones)."""
    kept = []
    for p in spanned:
        if p.plan is None:  # judged without plan_spans (a caller of before): plan it here
            p.plan = SpanPlan.of(p.sample, 0, episode=checks.episode_env is not None)
            if lease is not None:
                p.plan = p.plan.drawn_with(p.sample.sampling_seed, checks.assignment_key, lease)
        if p.plan.turns is not None and p.plan.turn_versions is None:
            p.reject(Reason.SPAN_MALFORMED, "a span boundary is not the first token of a model turn")
        else:
            kept.append(p)
    in_chunks(
        kept, checks.validator.max_batch_size, functools.partial(recompute, backend_for=backend_for),
        functools.partial(judge_spanned_chunk, checks=checks, observe=observe),
    )  # fmt: skip


# -- the names of before the span plan (deprecated: ``api.spans.SpanPlan`` holds them) -----------------


def lease_switches(samples: Sequence[RolloutSample]) -> dict[int, int] | None:
    """Deprecated: ``SpanPlan.batch_switches``."""
    return SpanPlan.batch_switches([SpanPlan.of(s, 0) for s in samples])


def record_problem(sample: RolloutSample, lease: LeaseRecord) -> tuple[str, str] | None:
    """Deprecated: ``SpanPlan.record_problem``."""
    return SpanPlan.of(sample, lease.fixed_version).record_problem(lease.switches)


def span_seeds(sample: RolloutSample, lease: LeaseRecord, key: bytes) -> list[tuple[int, int]]:
    """Deprecated: ``SpanPlan.recorded_seeds`` of a single-turn sample."""
    return SpanPlan.of(sample, lease.fixed_version).recorded_seeds(sample.sampling_seed, key, lease)


def proof_reason(failed: Sequence[bool], spans: Sequence[VersionSpan]) -> tuple[str, str]:
    """Deprecated: ``SpanPlan.proof_reason`` of a single-turn sample."""
    plan = SpanPlan(tuple(s.policy_version for s in spans), tuple(s.first_token for s in spans), num_tokens=0)
    return plan.proof_reason(failed)  # naming a failure reads the spans and the failed chunks only


def span_sampling_margins(
    logits: torch.Tensor, tokens: torch.Tensor, seeds: Sequence[tuple[int, int]], temperature: float
) -> torch.Tensor:
    """Deprecated: ``inference.contract.sampling_margins(..., runs=seeds)``."""
    return sampling_margins(logits, tokens, seeds[0][1], temperature, runs=seeds)
