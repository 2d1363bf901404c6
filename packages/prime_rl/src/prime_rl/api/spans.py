"""In-flight weight updates on the wire: which policy version sampled which completion tokens.

A worker that loads a newer committed version while it decodes switches to it at a proof-chunk
boundary and keeps decoding (keep-KV: the prefix's keys and values stay those the older version
wrote; ``docs/inflight.md`` section 3). ``RolloutSample.spans`` records it: a list of
:class:`VersionSpan` ``(policy_version, first_token)`` in completion order, span ``k`` covering
completion tokens ``[first_token_k, first_token_{k+1})``. ``None`` (the default) is one span, the
batch's version from token 0: exactly the samples of before.

Rules checked on every submission (:func:`spans_problem`, a 422 ``bad_spans`` each with its own
message) and again by the validator (``span_malformed``, ``span_version_future``):

* ``spans[0] == (start version, 0)``: the lease's version from the first token;
* ``first_token`` strictly increasing, each a multiple of :data:`SPAN_ALIGN` (the proof chunk, so
  every toploc proof covers tokens of one version) and ``< len(completion_tokens)``;
* versions strictly increasing (a worker only ever moves to a newer version);
* at most ``max_versions`` spans (``orchestrator.max_versions_per_sample``);
* on a multi-turn episode (``segments``), every boundary is the first token of a model turn
  (``segments.turn_starts``) instead of a multiple of the proof chunk: the HF episode loop prefills
  each turn's whole context afresh, so a version switched in at a turn's start generates that turn
  over a prefix whose keys and values it recomputed itself (recompute-KV, ``docs/inflight.md``
  section 0). A boundary inside a model turn or in an environment segment is refused;
* every version committed when the batch arrives (:func:`future_span`): a worker can only have
  switched to a version it could have held, and a version committed after its submission it could
  not.

Pitfall: the token at ``first_token`` is sampled from the forward whose *input* is token
``first_token - 1``, so that forward (and the key/value it writes) already belongs to the new span.

One structure for both kinds of sample, :class:`SpanPlan` (``SpanPlan.of(sample, start_version)``):
the spans as positions (completion indices of first tokens) and the positions a span may start at.
A single-turn sample's come from the proof chunks (every multiple of :data:`SPAN_ALIGN`), an
episode's from its model turns' starts; a lease's switch record names one of those positions by
index (its ``chunk``: chunk ``c`` is token ``32 c``, or model turn ``c``). Everything else is the
same for both: the wire rules, the lease's records, the seeds after a switch (the run's seed, or the
turn's, reseeded by every switch at or before it: ``seeds.reseeded``), the versions' token ranges
and the naming of a failing proof. The validator judges with it (``validator/spans.py``); the
worker, its in-flight backends and the red team write the spans it reads (:func:`as_spans`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from prime_rl.api.assignment import recorded_switch_nonce
from prime_rl.api.segments import turn_seed
from prime_rl.seeds import reseeded

__all__ = [
    "MAX_SPANS",
    "SPAN_ALIGN",
    "SpanPlan",
    "Turn",
    "VersionSpan",
    "as_spans",
    "future_span",
    "lease_digest",
    "reseeded",
    "span_bounds",
    "spans_problem",
]

SPAN_ALIGN = 32
"""Span boundaries fall on multiples of this many completion tokens: ``inference.contract.PROOF_CHUNK``
(a test holds the two equal; this module stays free of torch)."""

MAX_SPANS = 64
"""Wire cap on the list (the run's own cap, ``orchestrator.max_versions_per_sample``, is smaller)."""


class VersionSpan(BaseModel):
    """From ``first_token`` on (until the next span), the completion was sampled by ``policy_version``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    policy_version: Annotated[int, Field(ge=0)] = Field(
        description="The version that sampled the span's tokens."
    )
    first_token: Annotated[int, Field(ge=0, le=1 << 24)] = Field(
        description="Completion index of the span's first token (a multiple of 32)."
    )


def spans_problem(
    spans: Sequence[VersionSpan],
    num_tokens: int,
    *,
    start_version: int,
    max_versions: int,
    turn_starts: Sequence[int] | None = None,
) -> str | None:
    """None if ``spans`` follow the rules of the module docstring for a completion of ``num_tokens``
    tokens whose lease fixed ``start_version``, else what is wrong (one message per rule).
    ``turn_starts``: an episode's model-turn starts (``segments.turn_starts``); None: single-turn."""
    if not spans:
        return "spans is empty; send null for a sample of one version"
    if len(spans) > max_versions:
        return f"{len(spans)} spans; at most {max_versions} versions per sample (orchestrator.max_versions_per_sample)"
    first = spans[0]
    if first.first_token != 0 or first.policy_version != start_version:
        return (
            f"spans[0] is (version {first.policy_version}, token {first.first_token}); it must be the lease's "
            f"version from token 0: ({start_version}, 0)"
        )
    for k in range(1, len(spans)):
        before, span = spans[k - 1], spans[k]
        if span.first_token <= before.first_token:
            return f"spans[{k}].first_token {span.first_token} is not after spans[{k - 1}]'s {before.first_token}"
        if turn_starts is not None and span.first_token not in turn_starts:
            return (
                f"spans[{k}].first_token {span.first_token} is not the first token of a model turn "
                f"(turns start at {list(turn_starts)[:16]}); an episode switches versions only at a model turn's start"
            )
        if turn_starts is None and span.first_token % SPAN_ALIGN:
            return (
                f"spans[{k}].first_token {span.first_token} is not a multiple of the proof chunk {SPAN_ALIGN}"
            )
        if span.first_token >= num_tokens:
            return f"spans[{k}].first_token {span.first_token} is not inside the completion ({num_tokens} tokens)"
        if span.policy_version <= before.policy_version:
            return (
                f"spans[{k}].policy_version {span.policy_version} is not newer than spans[{k - 1}]'s "
                f"{before.policy_version}; versions only increase"
            )
    return None


def future_span(spans: Sequence[VersionSpan], newest_committed: int) -> VersionSpan | None:
    """The first span whose version was not committed (``> newest_committed``), else None."""
    return next((s for s in spans if s.policy_version > newest_committed), None)


def span_bounds(spans: Sequence[VersionSpan] | None, num_tokens: int) -> list[tuple[int, int, int]]:
    """``(policy_version, first_token, end_token)`` per span; ``[]`` for ``None`` (one version)."""
    if not spans:
        return []
    ends = [s.first_token for s in spans[1:]] + [num_tokens]
    return [(s.policy_version, s.first_token, end) for s, end in zip(spans, ends, strict=True)]


def lease_digest(samples: Sequence[Any]) -> str:
    """SHA-256 hex of what a worker declares fixed with ``POST /leases/done``: per sample (in
    ``(task_id, group_index)`` order) its task, group index, completion tokens, proofs (hex) and
    spans, as compact JSON ``[[task_id, group_index, [tokens...], "proofs hex", [[version,
    first_token]...] or null], ...]``. ``samples``: ``RolloutSample`` objects (duck-typed: this module
    stays free of the protocol)."""
    rows = list(
        (
            int(s.task_id), int(s.group_index), [int(t) for t in s.completion_tokens], bytes(s.proofs).hex(),
            None if s.spans is None else [[int(x.policy_version), int(x.first_token)] for x in s.spans],
        )
        for s in samples
    )  # fmt: skip
    rows.sort(key=lambda row: (row[0], row[1]))
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def as_spans(points: Iterable[tuple[int, int]]) -> list[VersionSpan]:
    """The wire spans of ``(policy_version, first_token)`` pairs (what a decode records), in order."""
    return [VersionSpan(policy_version=v, first_token=b) for v, b in points]


@dataclass(frozen=True)
class Turn:
    """One model turn of an episode: completion positions ``start .. start + length - 1``, turn ``turn``."""

    start: int
    length: int
    turn: int


Problem = tuple[str, str]
"""``(verdict reason code, detail)``."""


@dataclass(frozen=True)
class SpanPlan:
    """A sample's version spans as positions (module docstring): span ``k`` is ``versions[k]`` from
    completion token ``starts[k]`` to the next span's start (or ``num_tokens``). ``turns``: an
    episode's model turns, whose starts are the only positions a span may start at; None: a
    single-turn sample, whose spans start at proof-chunk boundaries. Pure data, no torch."""

    versions: tuple[int, ...]
    starts: tuple[int, ...]
    num_tokens: int
    turns: tuple[Turn, ...] | None = None
    claimed: bool = True
    """False: the sample sent no spans (``None``): one span of the start version, from token 0."""
    runs: tuple[tuple[int, int], ...] | None = None
    """The seeds the lease's records give: ``(first_token, seed)`` per run of one seed (:meth:`drawn_with`);
    None: not computed (a batch without a lease draws with the sample's seeds)."""
    bounds: tuple[tuple[int, int, int], ...] = field(init=False)
    """``(policy_version, first_token, end_token)`` per span: the tokens each version sampled."""
    turn_versions: tuple[int, ...] | None = field(init=False)
    """An episode's version per model turn (the last span starting at or before it); None if a span
    after the first does not start a model turn. ``()`` for a single-turn sample (it has no turns)."""

    def __post_init__(self) -> None:
        # Built before the wire rules are checked (a worker's spans may be empty, or not start at 0):
        # never raises; what is malformed is :meth:`wire_problem`'s to say.
        ends = [*self.starts[1:], self.num_tokens][: len(self.starts)]
        object.__setattr__(self, "bounds", tuple(zip(self.versions, self.starts, ends, strict=True)))
        turns = self.turns or ()
        versions: tuple[int, ...] | None = None if self.turns is not None else ()
        if self.turns is not None and all(b in {t.start for t in turns} for b in self.starts[1:]):
            spans = list(zip(self.starts, self.versions, strict=True))
            found = [max(((b, v) for b, v in spans if b <= t.start), default=None) for t in turns]
            if all(f is not None for f in found):
                versions = tuple(f[1] for f in found if f is not None)
        object.__setattr__(self, "turn_versions", versions)

    @classmethod
    def of(cls, sample: Any, start_version: int, *, episode: bool | None = None) -> SpanPlan:
        """The plan of ``sample`` (a ``RolloutSample``, duck-typed: ``spans``, ``segments``,
        ``completion_tokens``) whose lease fixed ``start_version``. ``episode``: whether the run
        plays episodes (True: a sample without segments is one model turn); None: as the sample says."""
        turns: tuple[Turn, ...] | None = None
        if episode and sample.segments is None:
            turns = (Turn(0, len(sample.completion_tokens), 0),)
        elif sample.segments is not None and episode is not False:
            found, start = [], 0
            for s in sample.segments:
                if s.kind == "model":
                    found.append(Turn(start, s.length, s.turn))
                start += s.length
            turns = tuple(found)
        if sample.spans is None:
            return cls((start_version,), (0,), len(sample.completion_tokens), turns, claimed=False)
        spans = sample.spans
        return cls(
            tuple(s.policy_version for s in spans),
            tuple(s.first_token for s in spans),
            len(sample.completion_tokens),
            turns,
        )

    # -- positions ---------------------------------------------------------------------------
    @property
    def mixed(self) -> bool:
        """Several versions sampled the completion (a chained recompute, not one prefill)."""
        return len(self.versions) > 1

    @property
    def unit(self) -> str:
        return "token" if self.turns is None else "model turn"

    @property
    def limit(self) -> int:
        """How far the points reach: the completion's tokens, or the episode's model turns."""
        return self.num_tokens if self.turns is None else len(self.turns)

    def point(self, position: int) -> int:
        """Where a span starting at ``position`` is compared with the lease: the position itself, or
        the index of the model turn it starts (``-1 - position`` where it starts none: malformed)."""
        if self.turns is None:
            return position
        return next((k for k, t in enumerate(self.turns) if t.start == position), -1 - position)

    def points(self) -> list[tuple[int, int]]:
        """``(point, policy_version)`` per span (:meth:`point`)."""
        return [(self.point(b), v) for b, v in zip(self.starts, self.versions, strict=True)]

    def record_point(self, chunk: int) -> int:
        """The point of a lease's switch record at ``chunk`` (``LeaseSwitch.chunk``): token ``32 * chunk``,
        or model turn ``chunk``."""
        return SPAN_ALIGN * chunk if self.turns is None else chunk

    # -- model-free rules --------------------------------------------------------------------
    def wire_problem(
        self, spans: Sequence[VersionSpan], *, start_version: int, max_versions: int, newest: int
    ) -> Problem | None:
        """``span_malformed`` (:func:`spans_problem`) or ``span_version_future`` (:func:`future_span`)."""
        starts = None if self.turns is None else [t.start for t in self.turns]
        problem = spans_problem(
            spans, self.num_tokens, start_version=start_version, max_versions=max_versions, turn_starts=starts
        )
        if problem is not None:
            return "span_malformed", problem
        future = future_span(spans, newest)
        if future is not None:
            return (
                "span_version_future",
                f"span from token {future.first_token} claims version {future.policy_version}, "
                f"newer than the newest committed version {newest}",
            )
        return None

    def record_problem(self, switches: Sequence[Any]) -> Problem | None:
        """Where the spans differ from the lease's switch records (``LeaseRecord.switches``, duck-typed:
        ``policy_version``, ``chunk``), in span order: ``span_unannounced``, ``span_boundary_mismatch``,
        then ``span_missing_mandatory`` for a record inside the sample without its span."""
        recorded = {s.policy_version: self.record_point(s.chunk) for s in switches}
        unit, whole = self.unit, "sample" if self.turns is None else "episode"
        shown = ", ".join(f"v{v} at {unit} {point}" for v, point in recorded.items()) or "none"
        claimed = self.points()[1:] if self.claimed else []
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
        for version, point in recorded.items():
            if point < self.limit and (point, version) not in claimed:
                return (
                    "span_missing_mandatory",
                    f"the lease switched to v{version} at {unit} {point}, but this {whole} of {self.limit} {unit}s "
                    "has no span there",
                )
        return None

    def lease_wide_problem(self, switches: dict[int, int] | None, start_version: int) -> Problem | None:
        """A batch without a lease: ``span_not_lease_wide`` unless the spans are the batch's switch
        points ``{point: version}`` (:meth:`batch_switches`; None: two samples disagree) inside it."""
        expected = [
            (0, start_version),
            *sorted((b, v) for b, v in (switches or {}).items() if b < self.limit),
        ]
        claimed = self.points()
        if switches is not None and claimed == expected:
            return None
        shown = "[" + ", ".join(f"v{v} from {b}" for b, v in claimed) + "]"
        want = "[" + ", ".join(f"v{v} from {b}" for b, v in expected) + "]"
        return (
            "span_not_lease_wide",
            f"spans {shown} differ from the lease's switch points inside this "
            f"{'sample' if self.turns is None else 'episode (points are model turns)'} "
            f"{want if switches is not None else '(two samples put different versions at one point)'}",
        )

    @staticmethod
    def batch_switches(plans: Sequence[SpanPlan]) -> dict[int, int] | None:
        """The batch's switch points ``{point: policy_version}`` (every span after the first of every
        sample); None if two samples put different versions at one point."""
        switches: dict[int, int] = {}
        for plan in plans:
            for point, version in plan.points()[1:] if plan.claimed else []:
                if point >= 0 and switches.setdefault(point, version) != version:
                    return None
        return switches

    # -- seeds -------------------------------------------------------------------------------
    def seeds(self, seed: int, nonces: Iterable[int]) -> list[tuple[int, int]]:
        """``(first_token, seed)`` per run of one seed: per span of a single-turn sample, per model turn
        of an episode; ``nonces``: the switch nonce of each span after the first. A run's seed is the
        sample's (an episode turn's ``turn_seed``) reseeded by every switch at or before it."""
        runs = (
            [(b, 0) for b in self.starts] if self.turns is None else [(t.start, t.turn) for t in self.turns]
        )
        switched = list(zip(self.starts[1:], nonces, strict=True))
        return [
            (first, reseeded(turn_seed(seed, turn), [n for b, n in switched if b <= first]))
            for first, turn in runs
        ]

    def recorded_seeds(self, seed: int, key: bytes, lease: Any) -> list[tuple[int, int]]:
        """:meth:`seeds` with the nonces of the lease's records (``recorded_switch_nonce`` under the
        run's key), as the validator recomputes them for spans that passed :meth:`record_problem`."""
        return self.seeds(seed, map(functools.partial(recorded_switch_nonce, key, lease), self.versions[1:]))

    def drawn_with(self, seed: int, key: bytes, lease: Any) -> SpanPlan:
        """This plan with its :attr:`runs`: :meth:`recorded_seeds`."""
        return replace(self, runs=tuple(self.recorded_seeds(seed, key, lease)))

    # -- naming a failing proof --------------------------------------------------------------
    def proof_reason(self, failed: Sequence[bool]) -> Problem:
        """``(reason, detail)`` of a mixed-version sample whose proof chunks ``failed[j]`` (``validator/spans.py``)."""
        if self.turns is not None:
            return self._turn_proof_reason(failed)
        chunk_starts = [b // SPAN_ALIGN for b in self.starts] + [len(failed)]
        first = next(j for j, bad in enumerate(failed) if bad)
        k = max(i for i in range(len(self.starts)) if chunk_starts[i] <= first)
        own = failed[chunk_starts[k] : chunk_starts[k + 1]]
        where = f"{sum(failed)}/{len(failed)} proof chunks fail, first chunk {first} in span {k} (v{self.versions[k]}"
        where += f", chunks {chunk_starts[k]}-{chunk_starts[k + 1] - 1})"
        if first > chunk_starts[k] and k + 1 < len(self.starts):
            return (
                "span_boundary_mismatch",
                f"{where}: the next version began before the claimed boundary {self.starts[k + 1]}",
            )
        if k >= 1 and all(own):
            return "span_version_forged", f"{where}: no chunk of the span matches its claimed version"
        if k >= 1 and first == chunk_starts[k]:
            return (
                "span_boundary_mismatch",
                f"{where}: the span's version began after its claimed boundary {self.starts[k]}",
            )
        return "toploc_mismatch", where

    def _turn_proof_reason(self, failed: Sequence[bool]) -> Problem:
        turns, versions = self.turns or (), self.turn_versions or ()
        chunk_turn = [t for t, turn in enumerate(turns) for _ in range(math.ceil(turn.length / SPAN_ALIGN))]
        turn_failed = [
            all(f for f, u in zip(failed, chunk_turn, strict=True) if u == t) for t in range(len(turns))
        ]
        first = chunk_turn[next(j for j, bad in enumerate(failed) if bad)]
        version = versions[first]
        k = self.versions.index(version)
        own = [t for t, v in enumerate(versions) if v == version]
        where = f"{sum(failed)}/{len(failed)} proof chunks fail, first in model turn {first} (span {k}, v{version})"
        if k >= 1 and all(turn_failed[t] for t in own):
            return "span_version_forged", f"{where}: no turn of the span matches its claimed version"
        if turn_failed[first] and k >= 1 and first == own[0]:
            return "span_boundary_mismatch", f"{where}: the span's version began after its claimed turn"
        if (
            turn_failed[first]
            and k + 1 < len(self.versions)
            and all(turn_failed[t] for t in own if t >= first)
        ):
            return "span_boundary_mismatch", f"{where}: the next version began before its claimed turn"
        return "toploc_mismatch", where
