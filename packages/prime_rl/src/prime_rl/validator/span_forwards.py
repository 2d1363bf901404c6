"""The recompute of mixed-version samples: their rows from every version that wrote them.

``validator/spans.py`` plans each sample's spans and runs this over chunks of
``validator.max_batch_size`` samples (``backend_failures.in_chunks``); each version is loaded once per
chunk, in increasing order, and a chunk holds its samples' KV caches and fp32 logits until it is
judged, so memory is bounded by the chunk:

* single-turn (keep-KV, ``docs/inflight.md`` section 3): chained forwards through one growing KV
  cache, span ``k`` fed with ``v_k`` loaded over the inputs ``[P + b_k - 1, P + b_{k+1} - 1)``
  (``P`` prompt tokens; span 0 from position 0), so every key and value comes from the version that
  wrote it on the worker;
* episodes (recompute-KV, ``worker/episodes.py``): each turn's generate prefilled its whole context
  afresh, so for each version one prefill from position 0 up to the end of its last model turn, its
  turns' rows taken from it (each turn's rows depend only on its prefix). Pitfall: it must not
  continue another version's cache.

A row that cannot be computed (a version unavailable, a forward that refused the input) is the
sample's; a failure of the machine (out of memory, a device fault) raises: never the sample's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from prime_rl.api.protocol import RolloutSample
from prime_rl.api.spans import SpanPlan, Turn
from prime_rl.inference.contract import ChainedForward, GenerationBackend, GenerationError, Prefill
from prime_rl.validator.checks import Pending

__all__ = ["chained_prefills", "recompute"]

BackendFor = Callable[[int], GenerationBackend | None]


def recompute(chunk: list[Pending], *, backend_for: BackendFor) -> list[Prefill | str]:
    """Per sample of a chunk: its rows, or why they could not be computed (a version unavailable, a
    forward that refused the input); the machine's failures raise (``in_chunks``)."""
    if all(p.plan is not None and p.plan.turns is None for p in chunk):
        return chained_prefills([p.sample for p in chunk], backend_for, [p.plan for p in chunk])
    return _version_prefills(chunk, backend_for)


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
