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

Then the recompute (:func:`span_model_checks`), each version loaded once per chunk of
``validator.max_batch_size`` samples (once per batch when it fits), in increasing order; a chunk holds
its samples' KV caches and fp32 logits until it is judged, so memory is bounded by the chunk:

* single-turn (keep-KV, ``docs/inflight.md`` section 3): chained forwards through one growing KV
  cache, span ``k`` fed with ``v_k`` loaded over the inputs ``[P + b_k - 1, P + b_{k+1} - 1)``
  (``P`` prompt tokens; span 0 from position 0), so every key and value comes from the version that
  wrote it on the worker;
* episodes (recompute-KV, ``worker/episodes.py``): each turn's generate prefilled its whole context
  afresh, so for each version one prefill from position 0 up to the end of its last model turn, its
  turns' rows taken from it (each turn's rows depend only on its prefix). Pitfall: it must not
  continue another version's cache.

The rows then go through the same proof, sampling and log-prob checks as a one-version sample
(``checks.judge_prefill``), every proof chunk inside one span; the sampling check draws each run
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
from collections.abc import Callable, Sequence
from typing import Any

import torch

import toploc
from prime_rl.api.protocol import LeaseRecord, PendingBatch, RolloutSample
from prime_rl.api.spans import SpanPlan, Turn, VersionSpan
from prime_rl.inference.contract import (
    SAMPLER_SEED,
    ChainedForward,
    GenerationBackend,
    GenerationError,
    Prefill,
)
from prime_rl.validator.checks import Checks, Observer, Pending, Reason, in_chunks, judge_prefill

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

BackendFor = Callable[[int], GenerationBackend | None]


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
    """The recompute of the live spanned samples (module docstring) from their plans (:func:`plan_spans`),
    then the per-sample model checks on their rows with each run's seed (no seeds, a batch without a
    lease: the sample's seeds throughout; it fails ``not_assigned`` before this). ``validator.max_batch_size``
    samples at a time, each chunk's caches and logits released once it is judged; a chunk out of memory
    is halved, and a failure of the machine raises ``BackendFailure`` (``checks.in_chunks``): the batch
    is judged again later, never blamed on its worker."""
    live = [p for p in spanned if p.alive]
    for p in live:
        if p.plan is None:  # judged without plan_spans (a caller of before): plan it here
            p.plan = SpanPlan.of(p.sample, 0, episode=checks.episode_env is not None)
            if lease is not None:
                p.plan = p.plan.drawn_with(p.sample.sampling_seed, checks.assignment_key, lease)
        if p.plan.turns is not None and p.plan.turn_versions is None:
            p.reject(Reason.SPAN_MALFORMED, "a span boundary is not the first token of a model turn")
    in_chunks(
        [p for p in live if p.alive], checks.validator.max_batch_size,
        functools.partial(_recompute, backend_for=backend_for), functools.partial(_judge, checks=checks, observe=observe),
    )  # fmt: skip


def _recompute(chunk: list[Pending], *, backend_for: BackendFor) -> list[Prefill | str]:
    """Per sample of a chunk: its rows, or why they could not be computed (a version unavailable, a
    forward that refused the input); the machine's failures raise (``in_chunks``)."""
    if all(p.plan is not None and p.plan.turns is None for p in chunk):
        return chained_prefills([p.sample for p in chunk], backend_for, [p.plan for p in chunk])
    return _version_prefills(chunk, backend_for)


def _judge(
    chunk: list[Pending], rows: list[Prefill | str], *, checks: Checks, observe: Observer | None
) -> None:
    for p, pre in zip(chunk, rows, strict=True):
        if isinstance(pre, str):
            p.reject(Reason.UNKNOWN_POLICY if "not available" in pre else Reason.MALFORMED, pre)
            continue
        plan = p.plan
        assert plan is not None
        runs = plan.runs
        if plan.turns is not None:  # an episode: its turns' seeds (the turns' positions restart at 0)
            judge_prefill(
                p,
                pre,
                checks,
                observe,
                plan.proof_reason,
                turn_seeds=None if runs is None else [s for _, s in runs],
            )
        elif runs is not None:
            draw = functools.partial(_draw, runs=runs)
            judge_prefill(p, pre, checks, observe, plan.proof_reason, draw=draw)
        else:
            judge_prefill(p, pre, checks, observe, plan.proof_reason)


def _draw(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, *, runs: Sequence[tuple[int, int]]
) -> torch.Tensor:
    return span_sampling_margins(logits, tokens, runs, temperature)


def span_sampling_margins(
    logits: torch.Tensor, tokens: torch.Tensor, seeds: Sequence[tuple[int, int]], temperature: float
) -> torch.Tensor:
    """:func:`~prime_rl.validator.checks.sampling_margins` where the seed changes along the completion: ``seeds`` is
    ``(first_token, seed)`` per span in order (the first at 0); the noise of token ``t`` is drawn with
    its span's seed at position ``t`` (positions stay completion indices across spans). ``[n]`` float64."""
    n = tokens.numel()
    bounds = [first for first, _ in seeds[1:]] + [n]
    parts = []
    for (first, seed), end in zip(seeds, bounds, strict=True):
        positions = torch.arange(first, end, device=logits.device)
        parts.append(
            toploc.sampling_margins(
                logits[first:end], tokens[first:end], SAMPLER_SEED, seed, positions, temperature
            )
        )
    return torch.cat(parts)


def chained_prefills(
    samples: Sequence[RolloutSample], backend_for: BackendFor, plans: Sequence[SpanPlan | None] | None = None
) -> list[Prefill | str]:
    """The prefill of each single-turn spanned sample by chained forwards (keep-KV, module docstring),
    or why it failed (a version unavailable, a backend without chained forwards, a forward that
    refused the input). Loads each version once, in increasing order, and holds every sample's KV
    cache and fp32 logits between versions: the caller passes a bounded chunk. A failure of the
    machine (out of memory, a device fault) raises (``checks.backend_failure``): never the sample's."""
    state: list[dict[str, Any]] = [
        {"cache": None, "hidden": [], "logits": [], "error": None} for _ in samples
    ]
    plans = plans or [None] * len(samples)
    bounds = [(plan or SpanPlan.of(sample, 0)).bounds for sample, plan in zip(samples, plans, strict=True)]
    for version in sorted({v for spans in bounds for v, _, _ in spans}):
        backend = backend_for(version)
        for sample, row, spans in zip(samples, state, bounds, strict=True):
            sequence = list(sample.prompt_tokens) + list(sample.completion_tokens)
            prompt = len(sample.prompt_tokens)
            for k, (span_version, first, end) in enumerate(spans):
                if span_version != version or row["error"] is not None:
                    continue
                if not isinstance(backend, ChainedForward):
                    row["error"] = f"policy version {version} is not available for chained forwards"
                    break
                start = 0 if k == 0 else prompt + first - 1
                try:
                    hidden, row["cache"] = backend.extend(sequence[start : prompt + end - 1], row["cache"])
                    if k == 0:  # completion token t is sampled from the state at position P + t - 1
                        hidden = hidden[prompt - 1 :]
                    logits = backend.head(hidden)
                except (GenerationError, ValueError, IndexError) as exc:  # the machine's failures raise
                    row["error"] = f"chained forward of span {k} failed: {exc}"
                    break
                row["hidden"].append(hidden)
                row["logits"].append(logits)
    out: list[Prefill | str] = []
    for row in state:
        if row["error"] is not None:
            out.append(row["error"])
        else:
            out.append(Prefill(hidden=torch.cat(row["hidden"]), logits=torch.cat(row["logits"])))
        row.clear()  # each sample's cache and per-span tensors go now, not with the whole list
    return out


def _version_prefills(chunk: list[Pending], backend_for: BackendFor) -> list[Prefill | str]:
    """Per episode of ``chunk``: its rows assembled from one prefill per version (recompute-KV, module
    docstring), or why not. Env rows stay zero: no proof, sampler or log-prob check reads them."""
    rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    errors: dict[int, str] = {}
    turns_of = {
        p.index: list(zip(p.plan.turns or (), p.plan.turn_versions or (), strict=True))
        for p in chunk
        if p.plan
    }
    for version in sorted({v for turns in turns_of.values() for _, v in turns}):
        group = [
            p for p in chunk if p.index not in errors and any(v == version for _, v in turns_of[p.index])
        ]
        if not group:
            continue
        backend = backend_for(version)
        if backend is None:
            errors.update((p.index, f"policy version {version} is not available") for p in group)
            continue
        own: list[list[Turn]] = [[t for t, v in turns_of[p.index] if v == version] for p in group]
        try:  # from position 0 up to the end of the version's last turn: recompute-KV, as the worker did
            prefills = backend.prefill(
                [p.sample.prompt_tokens for p in group],
                [
                    p.sample.completion_tokens[: turns[-1].start + turns[-1].length]
                    for p, turns in zip(group, own, strict=True)
                ],
            )
        except (GenerationError, ValueError, IndexError) as exc:
            errors.update((p.index, f"prefill with version {version} failed: {exc}") for p in group)
            continue
        for p, turns, pre in zip(group, own, prefills, strict=True):
            n = len(p.sample.completion_tokens)
            hidden, logits = rows.setdefault(
                p.index,
                (
                    pre.hidden.new_zeros((n, pre.hidden.shape[-1])),
                    pre.logits.new_zeros((n, pre.logits.shape[-1])),
                ),
            )
            for turn in turns:
                part = slice(turn.start, turn.start + turn.length)
                hidden[part], logits[part] = pre.hidden[part], pre.logits[part]
        del prefills
    return [errors[p.index] if p.index in errors else Prefill(*rows.pop(p.index)) for p in chunk]


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
