"""The validator's checks of mixed-version multi-turn episodes (in-flight updates at model-turn starts).

An episode switches policy versions only at the start of a model turn (``api/spans.py``). The
worker's episode loop (``worker/episodes.py``) prefills each turn's whole context afresh with the
weights loaded then, so model turn ``t`` is generated entirely by one version ``v_t``, over a prefix
whose keys and values ``v_t`` recomputed itself (recompute-KV; no key or value of an older version
is ever attended to). The validator recomputes exactly that, with at most one prefill per version:
for each version ``v`` of the sample, one prefill of the episode from the start up to the end of
``v``'s last model turn with ``v`` loaded; ``v``'s turns' rows are taken from it (each turn's rows
depend only on its prefix, so the longer prefill gives the same rows as the worker's prefill of the
turn's own context). The assembled rows then pass the unchanged per-turn proof, sampling and
log-prob checks of ``validator/episodes.py`` (:func:`~prime_rl.validator.checks.judge_prefill`).
Versions are handled in increasing order, each loaded once per batch and prefilled for every
episode that has it, as ``validator/spans.py`` does for single-turn samples.

Model-free rules (``validator/spans.py``, :func:`switch_points`): every boundary is a model turn's
first token (else ``span_malformed``). Then, against the lease's switch records (``POST
/leases/switch``; in a multi-turn run a record's ``chunk`` is the model turn ``t`` it switches at),
by model-turn index (``validator.spans.record_problem``): a span of a version with no record is
``span_unannounced``; one at another turn than its record ``span_boundary_mismatch``; an episode
that plays turn ``t`` of a record without that span ``span_missing_mandatory``. The worker plays a
lease's episodes turn by turn in lockstep, so every episode still running at turn ``t`` switches
there. A batch without a lease is compared lease-wide among its episodes instead
(``span_not_lease_wide``). The per-turn sampling check then draws each turn with
``switched_turn_seed(seed, turn, nonces)`` (:func:`episode_turn_seeds`), the nonces recomputed from
the records with the run's key, so turns drawn with the plain turn seeds after a recorded switch
fail ``sampling_mismatch``.

A failing proof is named by the turns that fail (:func:`episode_proof_reason`): every turn of a
span ``k >= 1`` fails against its claimed version: ``span_version_forged``; the span's first turn
fails whole while a later turn of it passes, or span ``k``'s last turns fail whole while a span
follows: ``span_boundary_mismatch``; else ``toploc_mismatch``. Labels of where proofs fail, as in
``validator/spans.py``, not proofs of intent.

Pitfall: turn ``t``'s completion positions restart at 0 for the sampler (``turn_seed``), and its
rows are the states at absolute positions ``P + start_t - 1 ...``: the per-version prefill must run
from position 0 of the prompt, not continue a cache from another version.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch

from prime_rl.api.assignment import recorded_switch_nonce
from prime_rl.api.protocol import LeaseRecord, RolloutSample
from prime_rl.api.segments import switched_turn_seed, turn_starts
from prime_rl.api.spans import VersionSpan
from prime_rl.inference.contract import PROOF_CHUNK, GenerationBackend, GenerationError, Prefill
from prime_rl.validator.checks import Checks, Observer, Pending, Reason, in_chunks, judge_prefill
from prime_rl.validator.episodes import ModelSpan, model_spans, segments_of

__all__ = [
    "episode_proof_reason", "episode_span_model_checks", "episode_turn_seeds",
    "switch_points", "turn_versions",
]


def switch_points(sample: RolloutSample) -> list[tuple[int, int]]:
    """``(point, policy_version)`` per span, where the lease-wide rule compares them: the completion
    index of the span's first token for a single-turn sample, the model turn it starts for an episode
    (a boundary that starts no model turn gets ``-1 - first_token``: malformed, refused before)."""
    spans = sample.spans or []
    if sample.segments is None:
        return [(s.first_token, s.policy_version) for s in spans]
    turn_of = {start: turn for turn, start in enumerate(turn_starts(sample.segments))}
    return [(turn_of.get(s.first_token, -1 - s.first_token), s.policy_version) for s in spans]


def episode_turn_seeds(sample: RolloutSample, lease: LeaseRecord, key: bytes) -> list[int]:
    """The seed of each model turn of an episode whose spans passed ``validator.spans.record_problem``:
    ``switched_turn_seed(seed, turn, nonces)`` with the nonces of its spans starting at or before the
    turn (recomputed from the records: ``recorded_switch_nonce``), as the worker's
    episode loop draws them (``worker/episodes.py``)."""
    nonces = [(turn, recorded_switch_nonce(key, lease, version)) for turn, version in switch_points(sample)[1:]]
    return [
        switched_turn_seed(sample.sampling_seed, t.turn, [n for start, n in nonces if start <= t.turn])
        for t in model_spans(segments_of(sample))
    ]


def point_limit(sample: RolloutSample) -> int:
    """How far a sample's switch points can reach: its completion tokens, or an episode's model turns."""
    return len(sample.completion_tokens) if sample.segments is None else len(turn_starts(sample.segments))


def turn_versions(sample: RolloutSample) -> list[int] | None:
    """The version of each model turn (that of the last span starting at or before it), or None if a
    span boundary is not the first token of a model turn."""
    spans, turns = sample.spans or [], model_spans(segments_of(sample))
    starts = {t.start for t in turns}
    if any(s.first_token not in starts for s in spans[1:]):
        return None
    return [
        max((s for s in spans if s.first_token <= t.start), key=lambda s: s.first_token).policy_version
        for t in turns
    ]


def episode_span_model_checks(
    spanned: Sequence[Pending],
    backend_for: Callable[[int], GenerationBackend | None],
    checks: Checks,
    observe: Observer | None,
    lease: LeaseRecord | None = None,
) -> None:
    """One prefill per version of the live mixed-version episodes (module docstring), each version
    loaded once, in increasing order; then the per-turn model checks on the assembled rows, with the
    turn seeds of the lease's switch records (:func:`episode_turn_seeds`; ``lease`` None: the plain
    turn seeds, a batch without a lease, which fails ``not_assigned`` anyway). ``validator.max_batch_size``
    episodes at a time, as ``validator/spans.py`` chunks single-turn samples (bounded memory; the
    machine's failures are never the worker's: ``checks.in_chunks``)."""
    alive = [p for p in spanned if p.alive]
    versions_of: dict[int, list[int]] = {}
    for p in alive:
        versions = turn_versions(p.sample)
        if versions is None:
            p.reject(Reason.SPAN_MALFORMED, "a span boundary is not the first token of a model turn")
        else:
            versions_of[p.index] = versions
    in_chunks(
        [p for p in alive if p.alive], checks.validator.max_batch_size,
        lambda chunk: _version_rows(chunk, versions_of, backend_for),
        lambda chunk, rows: _judge_rows(chunk, rows, versions_of, checks, observe, lease),
    )  # fmt: skip


Rows = tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], dict[int, str]]
"""Per episode index: its assembled (hidden, logits) rows, or why they could not be computed."""


def _version_rows(
    chunk: list[Pending], versions_of: dict[int, list[int]], backend_for: Callable[[int], GenerationBackend | None]
) -> Rows:
    """Per episode of ``chunk``: its rows assembled from one prefill per version, or why not (a
    version unavailable, a prefill that refused the input). The machine's failures raise (``in_chunks``)."""
    rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    errors: dict[int, str] = {}
    for version in sorted({v for p in chunk for v in versions_of[p.index]}):
        group = [p for p in chunk if p.index not in errors and version in versions_of[p.index]]
        if not group:
            continue
        backend = backend_for(version)
        if backend is None:
            for p in group:
                errors[p.index] = f"policy version {version} is not available"
            continue
        turns = [_own_turns(p.sample, versions_of[p.index], version) for p in group]
        try:  # from position 0 up to the end of the version's last turn: recompute-KV, as the worker did
            prefills = backend.prefill(
                [p.sample.prompt_tokens for p in group],
                [
                    p.sample.completion_tokens[: own[-1].start + own[-1].length]
                    for p, own in zip(group, turns, strict=True)
                ],
            )
        except (GenerationError, ValueError, IndexError) as exc:
            for p in group:
                errors[p.index] = f"prefill with version {version} failed: {exc}"
            continue
        for p, own, pre in zip(group, turns, prefills, strict=True):
            n = len(p.sample.completion_tokens)
            hidden, logits = rows.setdefault(
                p.index,
                (
                    pre.hidden.new_zeros((n, pre.hidden.shape[-1])),
                    pre.logits.new_zeros((n, pre.logits.shape[-1])),
                ),
            )  # env rows stay zero: no proof, sampler or log-prob check reads them (episode_values)
            for turn in own:
                hidden[turn.start : turn.start + turn.length] = pre.hidden[
                    turn.start : turn.start + turn.length
                ]
                logits[turn.start : turn.start + turn.length] = pre.logits[
                    turn.start : turn.start + turn.length
                ]
        del prefills
    return rows, errors


def _judge_rows(
    chunk: list[Pending],
    computed: Rows,
    versions_of: dict[int, list[int]],
    checks: Checks,
    observe: Observer | None,
    lease: LeaseRecord | None,
) -> None:
    rows, errors = computed
    for p in chunk:
        if p.index in errors:
            why = errors[p.index]
            p.reject(Reason.UNKNOWN_POLICY if "not available" in why else Reason.MALFORMED, why)
            continue
        name = functools.partial(_name_failure, sample=p.sample, versions=versions_of[p.index])
        seeds = episode_turn_seeds(p.sample, lease, checks.assignment_key) if lease is not None else None
        judge_prefill(p, Prefill(*rows.pop(p.index)), checks, observe, name, turn_seeds=seeds)


def _own_turns(sample: RolloutSample, versions: Sequence[int], version: int) -> list[ModelSpan]:
    return [t for t, v in zip(model_spans(segments_of(sample)), versions, strict=True) if v == version]


def episode_proof_reason(
    failed: Sequence[bool], turns: Sequence[ModelSpan], versions: Sequence[int], spans: Sequence[VersionSpan]
) -> tuple[str, str]:
    """``(reason, detail)`` of a mixed-version episode whose proof chunks ``failed[j]`` (turn after
    turn, ``ceil(length / 32)`` chunks each); ``versions[t]``: model turn ``t``'s claimed version."""
    chunk_turn = [t for t, turn in enumerate(turns) for _ in range(math.ceil(turn.length / PROOF_CHUNK))]
    turn_failed = [
        all(f for f, u in zip(failed, chunk_turn, strict=True) if u == t) for t in range(len(turns))
    ]
    first = chunk_turn[next(j for j, bad in enumerate(failed) if bad)]
    version = versions[first]
    k = next(i for i, s in enumerate(spans) if s.policy_version == version)
    own = [t for t, v in enumerate(versions) if v == version]
    where = (
        f"{sum(failed)}/{len(failed)} proof chunks fail, first in model turn {first} (span {k}, v{version})"
    )
    if k >= 1 and all(turn_failed[t] for t in own):
        return "span_version_forged", f"{where}: no turn of the span matches its claimed version"
    if turn_failed[first] and k >= 1 and first == own[0]:
        return "span_boundary_mismatch", f"{where}: the span's version began after its claimed turn"
    if turn_failed[first] and k + 1 < len(spans) and all(turn_failed[t] for t in own if t >= first):
        return "span_boundary_mismatch", f"{where}: the next version began before its claimed turn"
    return "toploc_mismatch", where


def _name_failure(failed: list[bool], *, sample: RolloutSample, versions: Sequence[int]) -> tuple[str, str]:
    return episode_proof_reason(failed, model_spans(segments_of(sample)), versions, sample.spans or [])
