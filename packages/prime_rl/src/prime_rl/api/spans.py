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
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MAX_SPANS", "SPAN_ALIGN", "VersionSpan", "future_span", "lease_digest", "span_bounds", "spans_problem"]

SPAN_ALIGN = 32
"""Span boundaries fall on multiples of this many completion tokens: ``inference.contract.PROOF_CHUNK``
(a test holds the two equal; this module stays free of torch)."""

MAX_SPANS = 64
"""Wire cap on the list (the run's own cap, ``orchestrator.max_versions_per_sample``, is smaller)."""


class VersionSpan(BaseModel):
    """From ``first_token`` on (until the next span), the completion was sampled by ``policy_version``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    policy_version: Annotated[int, Field(ge=0)] = Field(description="The version that sampled the span's tokens.")
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
            return f"spans[{k}].first_token {span.first_token} is not a multiple of the proof chunk {SPAN_ALIGN}"
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
