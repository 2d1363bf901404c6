"""The validator's checks of mixed-version samples (in-flight weight updates, ``api/spans.py``).

A sample with ``spans`` was sampled by several policy versions, each from a proof-chunk boundary
on, with the KV cache kept across the switch (keep-KV, ``docs/inflight.md`` section 3). The
validator recomputes it exactly that way: chained forwards through one growing KV cache, span
``k`` fed with version ``v_k`` loaded, over the inputs ``[P + b_k - 1, P + b_{k+1} - 1)`` (``P``
prompt tokens; span 0 from position 0, the prompt prefill), so every position's key and value
come from the version that wrote them on the worker. Each version is loaded once per chunk of
``validator.max_batch_size`` samples (once per batch when the batch fits): the chunk's versions in
increasing order, each forwarding the spans of that version of every sample (a sample's versions
increase, so its earlier spans are done). A chunk holds its samples' KV caches and fp32 logits
until it is judged, so memory is bounded by the chunk, as on the one-version path. The recomputed rows and
logits then go through the same proof, sampling and log-prob checks as a one-version sample;
every proof chunk lies inside one span, so chunk ``j`` is checked against the version of the span
that holds token ``32 j``.

Model-free checks first (:func:`span_checks`), each with its own reason:

* ``span_malformed``: the spans break the wire rules (the orchestrator refuses them with 422;
  re-checked on the stored batch); on an episode, a boundary that is not a model turn's first token;
* ``span_version_future``: a span's version is newer than the newest committed version;
* against the lease's switch records (``LeaseRecord.switches``: the first announcement per
  version, ``POST /leases/switch``), in span order: ``span_unannounced``, a
  span ``(v, b)`` with no record for ``v``; ``span_boundary_mismatch``, a record for ``v`` at another
  boundary than ``b``; then ``span_missing_mandatory``, a record at ``32 c`` inside the sample (the
  sample is longer than ``32 c``, so it was still running at the switch) without that span. So every
  sample carries exactly the lease's recorded switches that fall inside it, and no other. On episodes
  :func:`record_problem` compares the records by model-turn index (a record's chunk is the turn it
  switches at; ``validator/episode_spans.py`` has the turn seeds);
* ``span_not_lease_wide`` (a batch without a lease, which is rejected as ``not_assigned`` anyway):
  a lease is decoded as one batch, so every sample still running at a switch switches there: each sample's spans must be the batch's
  switch points that fall inside it. On episodes the points compared are model-turn indices
  (``validator/episode_spans.py``).

After those, every span ``k >= 1`` of a single-turn sample is a recorded switch, and its tokens must
be the seeded sampler's draws with the seed ``span_seed(seed_{k-1}, nonce_k)`` (``nonce_k =
switch_nonce(key, lease, v_k, c_k)``, recomputed here with the run's key; ``seed_0`` the sample's
seed), from its boundary on (:func:`span_seeds`); a worker that decoded a tail with any other seed
(another switch point's nonce, the lease seed kept past the switch) fails ``sampling_mismatch``.
An episode's turns after a recorded switch draw with ``switched_turn_seed`` (``api/segments.py``;
``validator/episode_spans.py``).

After the prefill, a failing proof of a spanned sample is named by where it fails
(:func:`proof_reason`), from the first failing chunk ``j`` inside span ``k``:

* ``span_boundary_mismatch``: span ``k``'s first chunks pass and a later one fails while a span
  follows (the next version began before the claimed boundary), or span ``k >= 1``'s first chunk
  fails while a later chunk of it passes (the version began after it);
* ``span_version_forged``: every chunk of span ``k >= 1`` fails against its claimed version;
* ``toploc_mismatch`` otherwise.

Pitfall: these names are labels of where the proofs fail, not proofs of what the worker did; a
boundary claimed one chunk too early fails the same chunks as a forged one-chunk span. Either way
the sample fails, and the lease with it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from prime_rl.api.assignment import recorded_switch_nonce, span_seed
from prime_rl.api.protocol import LeaseRecord, PendingBatch, RolloutSample
from prime_rl.api.segments import turn_starts
from prime_rl.api.spans import SPAN_ALIGN, VersionSpan, future_span, span_bounds, spans_problem
from prime_rl.inference.contract import ChainedForward, GenerationBackend, GenerationError, Prefill
from prime_rl.validator.checks import Checks, Observer, Pending, Reason, in_chunks, judge_prefill
from prime_rl.validator.episode_spans import (
    episode_span_model_checks,
    point_limit,
    switch_points,
)

__all__ = [
    "chained_prefills", "has_spans", "lease_switches", "proof_reason", "record_problem", "span_checks",
    "span_model_checks", "span_seeds",
]


def has_spans(sample: RolloutSample) -> bool:
    """True for a sample of several versions (one span, or none, is a one-version sample)."""
    return sample.spans is not None and len(sample.spans) > 1


def lease_switches(samples: Sequence[RolloutSample]) -> dict[int, int] | None:
    """The batch's switch points ``{point: policy_version}`` (every span after the first of every
    sample; a point is a first token, or an episode's model turn: ``episode_spans.switch_points``);
    None if two samples put different versions at one point."""
    switches: dict[int, int] = {}
    for sample in samples:
        for point, version in switch_points(sample)[1:]:
            if point >= 0 and switches.setdefault(point, version) != version:
                return None
    return switches


def span_checks(
    batch: PendingBatch, *, newest_version: int, max_versions: int
) -> list[tuple[str, str] | None]:
    """Per sample: ``(reason, detail)`` of its first model-free span failure, or None."""
    start = batch.lease.fixed_version if batch.lease is not None else batch.policy_version
    switches = lease_switches(batch.samples)
    out: list[tuple[str, str] | None] = []
    for sample in batch.samples:
        spans, n = sample.spans, len(sample.completion_tokens)
        found: tuple[str, str] | None = None
        if spans is not None:
            starts = None if sample.segments is None else turn_starts(sample.segments)
            problem = spans_problem(spans, n, start_version=start, max_versions=max_versions, turn_starts=starts)
            if problem is not None:
                found = ("span_malformed", problem)
            elif (future := future_span(spans, newest_version)) is not None:
                found = (
                    "span_version_future",
                    f"span from token {future.first_token} claims version {future.policy_version}, "
                    f"newer than the newest committed version {newest_version}",
                )
        if found is None and batch.lease is not None:
            found = record_problem(sample, batch.lease)
        elif found is None:
            # (point, policy_version) per span
            limit = point_limit(sample)
            expected = [(0, start), *sorted((b, v) for b, v in (switches or {}).items() if b < limit)]
            claimed = switch_points(sample) if spans else [(0, start)]
            if switches is None or claimed != expected:
                found = (
                    "span_not_lease_wide",
                    f"spans {_show(claimed)} differ from the lease's switch points inside this "
                    f"{'sample' if sample.segments is None else 'episode (points are model turns)'} "
                    f"{_show(expected) if switches is not None else '(two samples put different versions at one point)'}",
                )
        out.append(found)
    return out


def record_problem(sample: RolloutSample, lease: LeaseRecord) -> tuple[str, str] | None:
    """``(reason, detail)`` where a sample's spans (none: one version) differ from its lease's switch
    records (module docstring), else None. Points are completion tokens (a record at ``32 * chunk``),
    or model turns for an episode (a record's chunk is the turn; its boundaries already start model
    turns, else ``span_malformed``)."""
    episode = sample.segments is not None
    unit, whole = ("model turn", "episode") if episode else ("token", "sample")
    recorded = {s.policy_version: s.chunk if episode else SPAN_ALIGN * s.chunk for s in lease.switches}
    shown = ", ".join(f"v{v} at {unit} {point}" for v, point in recorded.items()) or "none"
    claimed = switch_points(sample)[1:] if sample.spans else []
    for point, version in claimed:
        if version not in recorded:
            return (
                "span_unannounced",
                f"span v{version} from {unit} {point}: the lease has no switch record for v{version} "
                f"(announced: {shown})",
            )
        if recorded[version] != point:
            return (
                "span_boundary_mismatch",
                f"span v{version} from {unit} {point}: the lease's switch to v{version} was announced at "
                f"{unit} {recorded[version]}",
            )
    limit = point_limit(sample)
    for version, point in recorded.items():
        if point < limit and (point, version) not in claimed:
            return (
                "span_missing_mandatory",
                f"the lease switched to v{version} at {unit} {point}, but this {whole} of {limit} {unit}s "
                "has no span there",
            )
    return None


def span_seeds(sample: RolloutSample, lease: LeaseRecord, key: bytes) -> list[tuple[int, int]]:
    """``(first_token, seed)`` per span of a sample whose spans passed :func:`record_problem`: span 0
    the sample's seed, span ``k`` ``span_seed(seed of span k - 1, nonce of its record)``, as the
    worker's decode chains them (``HFBackend._switch``)."""
    seeds = [(0, sample.sampling_seed)]
    for span in (sample.spans or [])[1:]:
        nonce = recorded_switch_nonce(key, lease, span.policy_version)
        seeds.append((span.first_token, span_seed(seeds[-1][1], nonce)))
    return seeds


def _show(points: Sequence[tuple[int, int]]) -> str:
    return "[" + ", ".join(f"v{v} from {b}" for b, v in points) + "]"


def chained_prefills(
    samples: Sequence[RolloutSample], backend_for: Callable[[int], GenerationBackend | None]
) -> list[Prefill | str]:
    """The prefill of each spanned sample by chained forwards (module docstring), or why it failed
    (a version unavailable, a backend without chained forwards, a forward that refused the input).

    Loads each version of ``samples`` once, in increasing order, and holds every sample's KV cache
    and fp32 logits between versions: the caller passes a bounded chunk (:func:`span_model_checks`).
    A failure of the machine (out of memory, a device fault) raises
    (:func:`~prime_rl.validator.checks.backend_failure`): it is never the sample's.
    """
    state: list[dict[str, Any]] = [{"cache": None, "hidden": [], "logits": [], "error": None} for _ in samples]
    versions = sorted({span.policy_version for sample in samples for span in sample.spans or []})
    for version in versions:
        backend = backend_for(version)
        for sample, row in zip(samples, state, strict=True):
            if row["error"] is not None:
                continue
            sequence = list(sample.prompt_tokens) + list(sample.completion_tokens)
            prompt = len(sample.prompt_tokens)
            for k, (span_version, first, end) in enumerate(span_bounds(sample.spans, len(sample.completion_tokens))):
                if span_version != version:
                    continue
                if not isinstance(backend, ChainedForward):
                    row["error"] = f"policy version {version} is not available for chained forwards"
                    break
                start = 0 if k == 0 else prompt + first - 1
                try:
                    hidden, row["cache"] = backend.extend(sequence[start : prompt + end - 1], row["cache"])
                    # Completion token t is sampled from the state at position P + t - 1.
                    if k == 0:
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


def proof_reason(failed: Sequence[bool], spans: Sequence[VersionSpan]) -> tuple[str, str]:
    """``(reason, detail)`` of a spanned sample whose proof chunks ``failed[j]`` (module docstring)."""
    chunk_starts = [s.first_token // SPAN_ALIGN for s in spans] + [len(failed)]
    first = next(j for j, bad in enumerate(failed) if bad)
    k = max(i for i in range(len(spans)) if chunk_starts[i] <= first)
    own = failed[chunk_starts[k] : chunk_starts[k + 1]]
    version = spans[k].policy_version
    where = f"{sum(failed)}/{len(failed)} proof chunks fail, first chunk {first} in span {k} (v{version}"
    where += f", chunks {chunk_starts[k]}-{chunk_starts[k + 1] - 1})"
    if first > chunk_starts[k] and k + 1 < len(spans):
        return "span_boundary_mismatch", f"{where}: the next version began before the claimed boundary {spans[k + 1].first_token}"
    if k >= 1 and all(own):
        return "span_version_forged", f"{where}: no chunk of the span matches its claimed version"
    if k >= 1 and first == chunk_starts[k]:
        return "span_boundary_mismatch", f"{where}: the span's version began after its claimed boundary {spans[k].first_token}"
    return "toploc_mismatch", where


def span_model_checks(
    spanned: Sequence[Pending],
    backend_for: Callable[[int], GenerationBackend | None],
    checks: Checks,
    observe: Observer | None,
    lease: LeaseRecord | None = None,
) -> None:
    """Chained prefills of the live spanned samples, then the per-sample model checks on them, the
    sampling check with each span's seed (:func:`span_seeds`; ``lease`` None: the sample's seed
    throughout, a batch without a lease, which fails ``not_assigned`` before this). Episodes: one
    prefill per version instead, with the turn seeds of the lease's records (``validator/episode_spans.py``).

    In bounded memory, as the one-version path: ``validator.max_batch_size`` samples at a time, each
    chunk's KV caches and fp32 logits released once it is judged (each version is then loaded once
    per chunk, not per batch); a chunk out of memory is halved, and a failure of the machine raises
    ``BackendFailure`` (``checks.in_chunks``): the batch is judged again later, never blamed on its worker."""
    if checks.episode_env is not None:
        episode_span_model_checks(spanned, backend_for, checks, observe, lease)
        return
    alive = [p for p in spanned if p.alive]
    in_chunks(
        alive, checks.validator.max_batch_size, lambda chunk: chained_prefills([p.sample for p in chunk], backend_for),
        lambda chunk, prefills: _judge_chunk(chunk, prefills, checks, observe, lease),
    )  # fmt: skip


def _judge_chunk(
    chunk: list[Pending], prefills: Any, checks: Checks, observe: Observer | None, lease: LeaseRecord | None
) -> None:
    for p, pre in zip(chunk, prefills, strict=True):
        if isinstance(pre, str):
            p.reject(Reason.UNKNOWN_POLICY if "not available" in pre else Reason.MALFORMED, pre)
            continue
        seeds = span_seeds(p.sample, lease, checks.assignment_key) if lease is not None else None
        judge_prefill(
            p, pre, checks, observe, functools.partial(_name_failure, spans=p.sample.spans or []), seeds=seeds
        )


def _name_failure(failed: list[bool], *, spans: Sequence[VersionSpan]) -> tuple[str, str]:
    return proof_reason(failed, spans)
