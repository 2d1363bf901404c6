"""Simulated time: synchronous, between-lease and in-flight weight updates on long-tailed completions.

A discrete-event simulation of *our* scheduling (no model, no network, pure Python, seeded; a run
takes well under a second), built to answer issue 38's question before the workers and the
validator learn to switch versions mid-lease: how much trained-token throughput do in-flight
updates buy, at what token staleness, and why.

What is modelled, and where it comes from in the runtime:

* **Leases** (``orchestrator/leases.py``): ``prompts_per_batch`` prompts x ``group_size``
  completions. A worker holds one lease at a time and decodes its ``B`` sequences in lock step at
  its own per-sequence speed (tokens/s; spread across workers), so a lease lasts as long as its
  longest completion: the long tail holds the whole lease (``worker/process.py`` answers a whole
  lease with one ``POST /rollouts``).
* **Versions** (``orchestrator/ledger.py``): the orchestrator's step ``s`` is the committed policy
  version. A lease issued at step ``s`` needs a version ``>= s - bound`` (``TaskLease.min_policy_version``);
  between leases the worker loads the newest version it has downloaded (``reload_newest``) and
  waits for one when it holds none fresh enough (``wait_for_version``). A version reaches worker
  ``w`` a broadcast delay after its commit (shardcast download + load; lognormal per worker and
  version); each load pauses decoding ``swap_pause_s``.
* **Claims** (``orchestrator/claims.py``): the trainer at step ``s`` takes whole groups, oldest
  submission first, until it has ``samples_per_step``; groups whose rollout version is below
  ``s - bound`` are dropped and counted. Training takes ``trainer_overhead_s + tokens /
  trainer_tok_s``; then version ``s + 1`` is committed (``POST /trainer/commit``).

Modes:

* ``sync``: on-policy. Exactly ``ceil(samples_per_step / B)`` leases per step, each generated with
  version ``s`` (workers wait for it), then train, broadcast, repeat.
* ``between_lease`` (today): a lease's samples all use the version its worker held at the lease's
  start; ``bound`` is ``orchestrator.async_level``.
* ``inflight``: as between-lease, plus: once a newer version has loaded (``VERSION_READY``), the
  worker switches at its next decode-chunk boundary (``chunk_tokens``, toploc's 32) and keeps the KV
  cache (``kv="keep"``, PipelineRL style) or re-prefills every live sequence under the new weights
  (``kv="recompute"``, AReaL style: ``prefix tokens / prefill_tok_s``). Each token records its
  version. A rollout's staleness is counted from its OLDEST span's version with queue time
  included (prime-rl's ``max_off_policy_steps``); ``bound`` is that limit. At most
  ``max_versions`` versions per sample.

Metrics over the steps after ``warmup_steps``: trained tokens per simulated second, token staleness
(claim step minus the version that generated the token; p50, p90, max, histogram), dropped
rollouts, the trainer's idle share, the workers' share of time spent waiting for a version, and
the mean length of trained versus generated completions (staleness drops bias toward short ones).

Pitfall: one lease per worker and lock-step decoding is today's worker. An engine that refills
finished slots (continuous batching across leases) is a separate what-if, ``engine="continuous"``
(``inflight_sim_continuous.py``), reported in its own section of the results.

Run: ``python benchmarks/inflight_sim.py`` (about ten minutes on this loaded machine, most of it the continuous
what-if of ``inflight_sim_continuous.py``) writes
``benchmarks/results/inflight_sim.{md,json}``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

MODES = ("sync", "between_lease", "inflight")
LENGTHS = ("long_tail", "bimodal", "uniform")


@dataclass(frozen=True)
class SimParams:
    """One simulated run. Times in seconds, speeds in tokens per second."""

    mode: str = "inflight"
    """``sync``, ``between_lease`` or ``inflight``."""
    bound: int = 2
    """Staleness bound: ``async_level`` (between-lease), ``max_off_policy_steps`` (in-flight); sync uses 0."""
    workers: int = 64
    lengths: str = "long_tail"
    """``long_tail`` (lognormal, ``tail_share`` of samples ``tail_factor`` x longer), ``bimodal`` or ``uniform``."""
    median_tokens: int = 1000
    length_sigma: float = 0.5
    """Log-space spread of the lognormal completion lengths."""
    tail_share: float = 0.03
    tail_factor: float = 10.0
    max_new_tokens: int = 16384
    prompts_per_batch: int = 4
    """orchestrator.prompts_per_batch."""
    group_size: int = 8
    """sampling.group_size."""
    samples_per_step: int = 256
    """trainer.samples_per_step."""
    decode_tok_s: float = 40.0
    """Median per-sequence decode speed of a worker (its lease's sequences decode in lock step)."""
    decode_sigma: float = 0.25
    """Log-space spread of decode speed across workers."""
    broadcast_s: float = 20.0
    """Median commit -> loaded-on-worker delay (shardcast download + load)."""
    broadcast_sigma: float = 0.5
    swap_pause_s: float = 1.0
    """Decoding pause per version load (in place), in every mode."""
    kv: str = "keep"
    """In-flight only: ``keep`` the KV cache across a switch or ``recompute`` it."""
    prefill_tok_s: float = 20000.0
    """Worker prefill speed (all live sequences together), for ``kv="recompute"``."""
    chunk_tokens: int = 32
    """Switch points: toploc's decode chunk."""
    max_versions: int = 4
    """In-flight: versions per sample at most."""
    submit: str = "lease"
    """``lease``: a lease's groups are submitted together when its longest completion ends (today);
    ``group``: each group as soon as its own longest member ends (a what-if, in every mode)."""
    engine: str = "lockstep"
    """``lockstep``: a worker decodes one lease at a time (today); ``continuous``: a what-if engine that
    refills finished slots from its next lease and submits per group (``inflight_sim_continuous.py``)."""
    drain: str = "eager"
    """``engine="continuous"``, between-lease only: ``eager`` stops refilling once a newer version has
    loaded and switches when idle; ``lazy`` only once its version is too old for a new lease."""
    trainer_tok_s: float = 10000.0
    trainer_overhead_s: float = 5.0
    steps: int = 30
    warmup_steps: int = 5
    seed: int = 0


@dataclass
class _Lease:
    worker: int
    number: int
    step: int
    lengths: list[int]
    rate: float
    start: float
    spans: list[tuple[int, int]]  # (version, first token index), first index 0, strictly increasing
    anchor_t: float = 0.0  # decoding resumes at anchor_t from token anchor_pos
    anchor_pos: int = 0
    end: float = 0.0
    generation: int = 0  # with the lease number, invalidates superseded lease_done events
    pauses: list[tuple[int, float]] = field(default_factory=list)  # (switch boundary, decoding pause)
    submitted: set[int] = field(default_factory=set)  # first sample index of each submitted group

    def pos_at(self, t: float) -> float:
        return self.anchor_pos + max(0.0, t - self.anchor_t) * self.rate

    def time_at(self, tokens: int) -> float:
        """When the lease's decoding reaches ``tokens`` (given the switches so far)."""
        return self.start + tokens / self.rate + sum(pause for boundary, pause in self.pauses if boundary < tokens)


@dataclass(frozen=True)
class SimResult:
    """What one run measured (window: the steps after warm-up)."""

    params: dict[str, Any]
    trained_tokens_per_s: float
    staleness_mean: float
    staleness_p50: float
    staleness_p90: float
    staleness_max: int
    staleness_hist: dict[int, int]
    """Trained tokens per token staleness (claim step - generating version)."""
    rollout_staleness_max: int
    """Largest claim step - OLDEST span version over trained rollouts."""
    generated_samples: int
    dropped_samples: int
    trainer_idle_share: float
    worker_wait_share: float
    mean_trained_len: float
    mean_generated_len: float
    switched_token_share: float
    """Share of trained tokens generated by a newer version than their rollout's first."""
    switches: int
    live_at_switch_p50: float
    """Median over switches of the lease's samples still running at the switch (the ``n`` of the
    lease-wide switch rule in docs/inflight.md); 0 without switches."""
    sim_seconds: float
    claims: list[dict[str, Any]] = field(default_factory=list)


def _rng(seed: int, *key: object) -> random.Random:
    """A generator keyed by (seed, what it draws for), so modes share draws (common random numbers)."""
    return random.Random(":".join(map(str, (seed, *key))))


def draw_lengths(params: SimParams, lease_number: int) -> list[int]:
    """Completion lengths of lease ``lease_number`` (the same lease in every mode)."""
    rng = _rng(params.seed, "lengths", lease_number)
    count = params.prompts_per_batch * params.group_size
    out = []
    for _ in range(count):
        if params.lengths == "uniform":
            length = float(params.median_tokens)
        elif params.lengths == "bimodal":  # 85% short answers, 15% long reasoning ~8x
            centre = params.median_tokens * (8.0 if rng.random() < 0.15 else 1.0)
            length = centre * math.exp(0.25 * rng.gauss(0.0, 1.0))
        elif params.lengths == "long_tail":
            length = params.median_tokens * math.exp(params.length_sigma * rng.gauss(0.0, 1.0))
            if rng.random() < params.tail_share:
                length *= params.tail_factor
        else:
            raise ValueError(f"lengths must be one of {LENGTHS}, got {params.lengths!r}")
        out.append(max(1, min(params.max_new_tokens, round(length))))
    return out


def rollout_version(lease: _Lease) -> int:
    """The version a rollout's staleness counts from: its oldest span's (prime-rl's rule)."""
    return lease.spans[0][0]


def required_version(params: SimParams, step: int) -> int:
    """Oldest version a lease issued at ``step`` may start with."""
    return step if params.mode == "sync" else max(0, step - params.bound)


def switch_cost_s(params: SimParams, lease: _Lease, boundary: int) -> float:
    """Decoding pause of an in-flight switch at token ``boundary`` (load; re-prefill for kv=recompute)."""
    if params.kv == "keep":
        return params.swap_pause_s
    live_tokens = sum(min(boundary, n) for n in lease.lengths if n > boundary)
    return params.swap_pause_s + live_tokens / params.prefill_tok_s


class _Sim:
    def __init__(self, params: SimParams) -> None:
        if params.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {params.mode!r}")
        if params.submit not in ("lease", "group"):
            raise ValueError(f"submit must be 'lease' or 'group', got {params.submit!r}")
        if params.kv not in ("keep", "recompute"):
            raise ValueError(f"kv must be 'keep' or 'recompute', got {params.kv!r}")
        self.p = params
        self.batch = params.prompts_per_batch * params.group_size
        self.events: list[tuple[float, int, str, tuple[Any, ...]]] = []
        self.seq = 0
        self.commits = [0.0]  # commit time of each version
        self.held = [0] * params.workers
        self.lease: list[_Lease | None] = [None] * params.workers
        self.idle: set[int] = set()
        self.leases_issued = 0
        self.sync_issued: Counter[int] = Counter()
        self.buffer: list[tuple[_Lease, list[int]]] = []  # groups: (lease, sample indices)
        self.trainer_busy = False
        self.trainer_idle_since = 0.0
        self.claims: list[dict[str, Any]] = []
        self.generated: list[tuple[float, int, int]] = []  # (time, samples, tokens)
        self.dropped: list[tuple[float, int]] = []
        self.idle_spans: list[tuple[float, float]] = []
        self.waits: list[tuple[float, float]] = []
        self.switches = 0
        self.live_at_switch: Counter[int] = Counter()
        speed = _rng(params.seed, "speed")
        self.rate = [params.decode_tok_s * math.exp(params.decode_sigma * speed.gauss(0.0, 1.0)) for _ in range(params.workers)]

    @property
    def step(self) -> int:
        return len(self.commits) - 1

    def push(self, t: float, kind: str, *data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, data))

    def available(self, worker: int, version: int) -> float:
        if version == 0:
            return 0.0
        delay = self.p.broadcast_s * math.exp(self.p.broadcast_sigma * _rng(self.p.seed, "bcast", worker, version).gauss(0.0, 1.0))
        return self.commits[version] + delay

    def newest_loadable(self, worker: int, t: float) -> int:
        return max(v for v in range(self.step + 1) if self.available(worker, v) <= t)

    # ---------------------------------------------------------------- workers
    def worker_free(self, w: int, t: float) -> None:
        if self.p.mode == "sync" and self.sync_issued[self.step] >= math.ceil(self.p.samples_per_step / self.batch):
            self.idle.add(w)
            return
        need = required_version(self.p, self.step)
        newest = self.newest_loadable(w, t)
        if newest < need:
            ready = min(self.available(w, v) for v in range(need, self.step + 1))
            self.waits.append((t, ready))
            self.push(ready, "worker_free", w)
            return
        start = t
        if newest > self.held[w]:
            self.held[w] = newest
            start += self.p.swap_pause_s
        self.sync_issued[self.step] += 1
        lengths = draw_lengths(self.p, self.leases_issued)
        lease = _Lease(w, self.leases_issued, self.step, lengths, self.rate[w], start, [(newest, 0)], start, 0)
        self.leases_issued += 1
        lease.end = start + max(lengths) / lease.rate
        self.lease[w] = lease
        self.schedule(lease)

    def version_ready(self, w: int, version: int, t: float) -> None:
        lease = self.lease[w]
        if lease is None or version <= lease.spans[-1][0]:
            return  # between leases: worker_free loads it
        chunk = self.p.chunk_tokens
        boundary = math.ceil(lease.pos_at(t) / chunk) * chunk
        if boundary >= max(lease.lengths):
            return
        if lease.spans[-1][1] == boundary:  # a newer version arrived before the pending switch: take it
            lease.spans[-1] = (version, boundary)
            self.held[w] = version
            return
        if len(lease.spans) >= self.p.max_versions:
            return
        switch_t = lease.anchor_t + (boundary - lease.anchor_pos) / lease.rate
        lease.spans.append((version, boundary))
        self.held[w] = version
        self.switches += 1
        self.live_at_switch[sum(n > boundary for n in lease.lengths)] += 1
        pause = switch_cost_s(self.p, lease, boundary)
        lease.pauses.append((boundary, pause))
        lease.anchor_pos = boundary
        lease.anchor_t = max(switch_t, t) + pause
        lease.end = lease.anchor_t + (max(lease.lengths) - boundary) / lease.rate
        lease.generation += 1
        self.schedule(lease)

    def schedule(self, lease: _Lease) -> None:
        """(Re)schedule the lease's end and, with ``submit="group"``, its groups' submissions."""
        self.push(lease.end, "lease_done", lease.worker, lease.number, lease.generation)
        if self.p.submit == "group":
            g = self.p.group_size
            for first in range(0, len(lease.lengths), g):
                if first not in lease.submitted:
                    done = lease.time_at(max(lease.lengths[first : first + g]))
                    self.push(done, "group_done", lease.worker, lease.number, lease.generation, first)

    def submit_group(self, lease: _Lease, first: int) -> None:
        if first not in lease.submitted:
            lease.submitted.add(first)
            self.buffer.append((lease, list(range(first, first + self.p.group_size))))

    def group_done(self, w: int, number: int, generation: int, first: int, t: float) -> None:
        lease = self.lease[w]
        if lease is not None and (lease.number, lease.generation) == (number, generation):
            self.submit_group(lease, first)
            self.trainer_try(t)

    def lease_done(self, w: int, number: int, generation: int, t: float) -> None:
        lease = self.lease[w]
        if lease is None or (lease.number, lease.generation) != (number, generation):
            return  # superseded: a switch moved this lease's end
        self.lease[w] = None
        self.generated.append((t, len(lease.lengths), sum(lease.lengths)))
        for first in range(0, len(lease.lengths), self.p.group_size):
            self.submit_group(lease, first)
        self.worker_free(w, t)
        self.trainer_try(t)

    # ---------------------------------------------------------------- trainer
    def trainer_try(self, t: float) -> None:
        if self.trainer_busy:
            return
        step = self.step
        floor = required_version(self.p, step)
        fresh = []
        for lease, members in self.buffer:
            if rollout_version(lease) < floor:
                self.dropped.append((t, len(members)))
            else:
                fresh.append((lease, members))
        self.buffer = fresh
        if sum(len(m) for _, m in fresh) < self.p.samples_per_step:
            return
        taken, count = 0, 0
        while count < self.p.samples_per_step:
            count += len(fresh[taken][1])
            taken += 1
        chosen, self.buffer = fresh[:taken], fresh[taken:]
        hist: Counter[int] = Counter()
        oldest = 0
        tokens = switched = 0
        for lease, members in chosen:
            oldest = max(oldest, step - lease.spans[0][0])
            for i in members:
                length = lease.lengths[i]
                tokens += length
                bounds = [b for _, b in lease.spans] + [length]
                for (version, first), last in zip(lease.spans, bounds[1:], strict=False):
                    if first < length:
                        hist[step - version] += min(last, length) - first
                        switched += (min(last, length) - first) if first > 0 else 0
        self.idle_spans.append((self.trainer_idle_since, t))
        self.claims.append(
            {"step": step, "time": t, "tokens": tokens, "switched": switched, "samples": count, "hist": hist, "oldest": oldest}
        )
        self.trainer_busy = True
        self.push(t + self.p.trainer_overhead_s + tokens / self.p.trainer_tok_s, "commit")

    def commit(self, t: float) -> None:
        self.commits.append(t)
        self.trainer_busy = False
        self.trainer_idle_since = t
        if self.p.mode == "inflight":
            for w in range(self.p.workers):
                self.push(self.available(w, self.step), "version_ready", w, self.step)
        for w in sorted(self.idle):
            self.push(t, "worker_free", w)
        self.idle.clear()
        self.trainer_try(t)

    def run(self) -> SimResult:
        for w in range(self.p.workers):
            self.push(0.0, "worker_free", w)
        while self.events and self.step < self.p.steps:
            t, _, kind, data = heapq.heappop(self.events)
            if kind == "worker_free":
                self.worker_free(data[0], t)
            elif kind == "lease_done":
                self.lease_done(data[0], data[1], data[2], t)
            elif kind == "group_done":
                self.group_done(data[0], data[1], data[2], data[3], t)
            elif kind == "version_ready":
                self.version_ready(data[0], data[1], t)
            else:
                self.commit(t)
        return self.result()

    def result(self) -> SimResult:
        return summarize(self)


def summarize(sim: Any) -> SimResult:
    """The measured window of a finished simulation (``_Sim`` or the continuous engine's)."""
    p = sim.p
    if sim.step < p.steps:
        raise RuntimeError(f"the simulation stalled at step {sim.step} of {p.steps}")
    lo, hi = sim.commits[p.warmup_steps], sim.commits[p.steps]
    window = [c for c in sim.claims if p.warmup_steps <= c["step"] < p.steps]
    hist: Counter[int] = Counter()
    for claim in window:
        hist.update(claim["hist"])
    generated = [g for g in sim.generated if lo < g[0] <= hi]

    def overlap(spans: list[tuple[float, float]]) -> float:
        return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in spans)

    gen_samples = sum(g[1] for g in generated)
    trained_samples = sum(c["samples"] for c in window)
    return SimResult(
        params=asdict(p),
        trained_tokens_per_s=sum(c["tokens"] for c in window) / (hi - lo),
        staleness_mean=sum(k * v for k, v in hist.items()) / sum(hist.values()),
        staleness_p50=_quantile(hist, 0.5),
        staleness_p90=_quantile(hist, 0.9),
        staleness_max=max(hist),
        staleness_hist=dict(sorted(hist.items())),
        rollout_staleness_max=max(c["oldest"] for c in window),
        generated_samples=gen_samples,
        dropped_samples=sum(n for time, n in sim.dropped if lo < time <= hi),
        trainer_idle_share=overlap(sim.idle_spans) / (hi - lo),
        worker_wait_share=overlap(sim.waits) / ((hi - lo) * p.workers),
        mean_trained_len=sum(c["tokens"] for c in window) / trained_samples,
        mean_generated_len=sum(g[2] for g in generated) / max(1, gen_samples),
        switched_token_share=sum(c["switched"] for c in window) / sum(c["tokens"] for c in window),
        switches=sim.switches,
        live_at_switch_p50=_quantile(sim.live_at_switch, 0.5) if sim.switches else 0.0,
        sim_seconds=hi,
        claims=[{k: v for k, v in c.items() if k != "hist"} for c in sim.claims],
    )


def _quantile(hist: Counter[int], q: float) -> float:
    """The smallest staleness whose cumulative token share reaches ``q``."""
    total = sum(hist.values())
    seen = 0
    for value in sorted(hist):
        seen += hist[value]
        if seen >= q * total:
            return float(value)
    raise ValueError("empty histogram")


def simulate(params: SimParams) -> SimResult:
    """Run one simulation (deterministic for a given ``params``, seed included)."""
    if params.engine == "continuous":
        from inflight_sim_continuous import ContinuousSim

        lock_step = _Sim(replace(params, mode="between_lease", engine="lockstep"))
        return ContinuousSim(params, lock_step, sys.modules[__name__]).run()  # its rules are this module's
    if params.engine != "lockstep":
        raise ValueError(f"engine must be 'lockstep' or 'continuous', got {params.engine!r}")
    return _Sim(params).run()


# -------------------------------------------------------------------- the benchmark grid

GRID_WORKERS = (16, 64, 256)
GRID_BOUNDS = (1, 2, 4, 8)
HEADLINE_SEEDS = (0, 1, 2)
RESULTS = Path(__file__).resolve().parent / "results"


def grid(base: SimParams) -> list[SimResult]:
    """Every mode x worker count x length distribution x bound (sync once, at bound 0)."""
    runs = []
    for lengths in LENGTHS:
        for workers in GRID_WORKERS:
            runs.append(replace(base, mode="sync", bound=0, workers=workers, lengths=lengths))
            for mode in ("between_lease", "inflight"):
                runs += [replace(base, mode=mode, bound=b, workers=workers, lengths=lengths) for b in GRID_BOUNDS]
    return [simulate(p) for p in runs]


def matched(results: list[SimResult]) -> list[dict[str, Any]]:
    """Per between-lease run: the fastest in-flight run of the same setting whose median token
    staleness is equal or lower (the acceptance's comparison), and the in-flight run at the same bound."""
    rows = []
    for bl in results:
        p = bl.params
        if p["mode"] != "between_lease":
            continue
        same = [r for r in results if r.params["mode"] == "inflight" and all(
            r.params[k] == p[k] for k in ("workers", "lengths", "seed"))]
        eligible = [r for r in same if r.staleness_p50 <= bl.staleness_p50]
        best = max(eligible, key=lambda r: r.trained_tokens_per_s) if eligible else None
        twin = next(r for r in same if r.params["bound"] == p["bound"])
        rows.append({
            "workers": p["workers"], "lengths": p["lengths"], "seed": p["seed"], "bl_bound": p["bound"],
            "bl_tok_s": bl.trained_tokens_per_s, "bl_p50": bl.staleness_p50,
            "if_bound": best.params["bound"] if best else None,
            "if_tok_s": best.trained_tokens_per_s if best else None,
            "if_p50": best.staleness_p50 if best else None,
            "ratio": best.trained_tokens_per_s / bl.trained_tokens_per_s if best else None,
            "same_bound_ratio": twin.trained_tokens_per_s / bl.trained_tokens_per_s,
            "same_bound_if_p50": twin.staleness_p50,
            "submit": p["submit"], "bl_mean": bl.staleness_mean, "same_bound_if_mean": twin.staleness_mean,
        })
    return rows


def _row(r: SimResult) -> str:
    p = r.params
    bound = "-" if p["mode"] == "sync" else str(p["bound"])
    hist = " ".join(f"{k}:{v / sum(r.staleness_hist.values()):.2f}" for k, v in r.staleness_hist.items())
    return (f"| {p['lengths']} | {p['workers']} | {p['mode']} | {bound} | {r.trained_tokens_per_s:,.0f} | "
            f"{r.staleness_mean:.2f} | {r.staleness_p50:g} | {r.staleness_p90:g} | {r.staleness_max} | {hist} | "
            f"{r.dropped_samples}/{r.generated_samples} | {r.trainer_idle_share:.2f} | "
            f"{r.mean_trained_len:,.0f}/{r.mean_generated_len:,.0f} | {r.switched_token_share:.2f} | "
            f"{r.live_at_switch_p50:g} |")


def report(base: SimParams, results: list[SimResult], headline: list[dict[str, Any]]) -> str:
    lines = [
        "# In-flight weight updates, simulated (benchmarks/inflight_sim.py)",
        "",
        "Discrete-event simulation of our scheduling (leases, claims, async bound, broadcast delay); no model.",
        f"Base parameters (every run; the table varies lengths, workers, mode, bound): `{json.dumps(asdict(base))}`.",
        "",
        "Columns: trained tok/s = completion tokens the trainer consumed per simulated second over steps "
        f"{base.warmup_steps}..{base.steps - 1}; staleness = claim step - version that generated the token "
        "(token-weighted p50, p90, max and histogram share); dropped = samples dropped as stale / samples "
        "generated in the window; idle = trainer idle share; len = mean trained / generated completion "
        "length; switched = share of trained tokens generated after an in-flight switch; live at switch = "
        "median number of the lease's samples still running when it switched.",
        "",
        "| lengths | workers | mode | bound | trained tok/s | mean | p50 | p90 | max | staleness histogram | "
        "dropped/generated | idle | len trained/generated | switched | live at switch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(_row(r) for r in results),
        "",
        "## Acceptance comparison (in-flight vs between-lease at equal or lower median staleness)",
        "",
        "For each between-lease run: the fastest in-flight run of the same setting whose token-staleness "
        "p50 is equal or lower (ratio), and the in-flight run at the same bound (same-bound ratio).",
        "",
        "| lengths | workers | submit | seed | BL bound | BL tok/s | BL p50 (mean) | IF bound | IF tok/s | IF p50 | "
        "ratio | same-bound ratio | same-bound IF p50 (mean) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in headline:
        lines.append(
            f"| {m['lengths']} | {m['workers']} | {m['submit']} | {m['seed']} | {m['bl_bound']} | {m['bl_tok_s']:,.0f} | "
            f"{m['bl_p50']:g} ({m['bl_mean']:.2f}) | {m['if_bound']} | {m['if_tok_s']:,.0f} | {m['if_p50']:g} | "
            f"{m['ratio']:.2f}x | {m['same_bound_ratio']:.2f}x | {m['same_bound_if_p50']:g} ({m['same_bound_if_mean']:.2f}) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="Seed of the full grid.")
    parser.add_argument("--out", type=Path, default=RESULTS / "inflight_sim", help="Writes OUT.md and OUT.json.")
    args = parser.parse_args()
    base = SimParams(seed=args.seed)
    results = grid(base)
    rows = matched(results)
    for seed in HEADLINE_SEEDS:  # the long-tail headline, repeated over seeds
        if seed == args.seed:
            continue
        runs = [simulate(replace(base, mode=mode, bound=b, workers=64, seed=seed))
                for mode in ("between_lease", "inflight") for b in GRID_BOUNDS]
        rows += matched(runs)
    what_if = []  # group submission (each group when its longest member ends), both modes, long tail
    for workers in (16, 64):
        runs = [simulate(replace(base, mode=mode, bound=b, workers=workers, submit="group"))
                for mode in ("between_lease", "inflight") for b in GRID_BOUNDS]
        what_if += runs
        rows += matched(runs)
    recompute = [simulate(replace(base, mode="inflight", bound=b, workers=64, kv="recompute")) for b in GRID_BOUNDS]
    headline = [m for m in rows if m["lengths"] == "long_tail"]
    others = [m for m in rows if m["lengths"] != "long_tail"]
    text = report(base, results, headline + others)
    text += "\n## What-if: group submission (submit = group), long tail, seed of the grid\n\n"
    text += "Each group enters the buffer when its own longest member ends; the worker still holds the lease.\n\n"
    text += "| lengths | workers | mode | bound | trained tok/s | mean | p50 | p90 | max | staleness histogram | "
    text += "dropped/generated | idle | len trained/generated | switched | live at switch |\n"
    text += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    text += "\n".join(_row(r) for r in what_if) + "\n"
    text += (f"\n## What-if: recompute-KV (kv = recompute, prefill {base.prefill_tok_s:,.0f} tok/s), long tail, "
             "64 workers\n\nEach switch re-prefills every live sequence's prefix; compare the keep-KV in-flight rows above.\n\n")
    text += "| lengths | workers | mode | bound | trained tok/s | mean | p50 | p90 | max | staleness histogram | "
    text += "dropped/generated | idle | len trained/generated | switched | live at switch |\n"
    text += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    text += "\n".join(_row(r) for r in recompute) + "\n"
    from inflight_sim_continuous import what_if as continuous_what_if

    continuous, continuous_rows, continuous_text = continuous_what_if(base, sys.modules[__name__])
    text += "\n" + continuous_text
    args.out.with_suffix(".md").write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps({
        "base_params": asdict(base),
        "runs": [{k: v for k, v in asdict(r).items() if k != "claims"} for r in results + what_if + recompute + continuous],
        "comparisons": rows,
        "continuous_comparisons": continuous_rows,
    }, indent=1))
    for m in continuous_rows:
        print(f"continuous in-flight vs {m['baseline']} W={m['workers']} seed={m['seed']} BL@{m['bl_bound']} "
              f"{m['bl_tok_s']:.0f} p50 {m['bl_p50']:g} -> IF@{m['if_bound']} {m['if_tok_s']:.0f} p50 {m['if_p50']:g}: "
              f"{m['ratio']:.2f}x")
    for m in headline:
        print(f"long_tail {m['submit']} W={m['workers']} seed={m['seed']} BL@{m['bl_bound']} {m['bl_tok_s']:.0f} tok/s p50 {m['bl_p50']:g}"
              f" -> IF@{m['if_bound']} {m['if_tok_s']:.0f} p50 {m['if_p50']:g}: {m['ratio']:.2f}x"
              f" (same bound {m['same_bound_ratio']:.2f}x)")


if __name__ == "__main__":
    main()
