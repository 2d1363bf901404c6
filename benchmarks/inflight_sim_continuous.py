"""What-if for ``benchmarks/inflight_sim.py``: a worker engine with continuous batching (``engine="continuous"``).

Not our runtime. Today a worker decodes one lease in lock step and answers it whole, so a lease lasts
as long as its longest completion and the other slots idle meanwhile (``inflight_sim.py``). This is
the step docs/inflight.md section 8 names next: the worker's engine keeps ``B`` = lease-size slots
busy, **refilling each finished slot with a sequence of its next lease**, and **submits each group
as soon as its own last member ends** (``submit="group"`` is implied). Each slot decodes at the
worker's per-sequence speed (decode is memory-bound: a slot's speed does not depend on how many are
busy). Everything else (versions, broadcast delays, claims, the trainer, the drop rule: staleness
from the oldest span, queue time included) is ``inflight_sim``'s.

How versions change with a refilling engine:

* ``inflight``: the engine loads each newer version as it arrives (a ``swap_pause_s`` pause of every
  slot); each live sequence switches at its next ``chunk_tokens`` boundary (per sequence, not
  lease-wide: the lease-wide rule of docs/inflight.md section 0 has no meaning once a lease's
  sequences start at different times); a sequence that starts after a switch starts under the
  engine's version, so its first span may be newer than its lease's version (**a wire relaxation**:
  today ``spans[0]`` must be the lease's version). ``max_versions`` is not enforced (one engine holds
  one set of weights).
* ``between_lease``: versions change only with no sequence live. ``drain="eager"``: once a newer
  version has loaded the worker stops refilling, lets its live sequences finish, then switches
  (today's "load the newest between leases"); ``drain="lazy"``: it keeps refilling with its version
  until that version is too old for a new lease (``< step - bound``), then drains and switches.

Pitfall: the engine takes a new lease only when a slot is free and no sequence of its current
leases waits to start, so it holds at most two leases' worth of work: one decoding, one refilling.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

SimParams = Any  # inflight_sim.SimParams: this module never imports inflight_sim, which imports it
SimResult = Any  # inflight_sim.SimResult


@dataclass
class _Seq:
    lease: int
    index: int
    length: int
    start_e: float  # engine time (wall time minus the worker's pauses) when it started
    spans: list[tuple[int, int]]  # (version, first token)


@dataclass
class _Group:
    remaining: int
    samples: list[tuple[int, dict[int, int], int]] = field(default_factory=list)  # (rollout version, tokens by version, length)


class _Worker:
    def __init__(self, rate: float, slots: int) -> None:
        self.rate = rate
        self.slots: list[_Seq | None] = [None] * slots
        self.queue: list[_Seq] = []
        self.held = 0
        self.offset = 0.0  # wall - engine time: sum of pauses so far
        self.generation = 0
        self.draining = False
        self.waiting = False  # for a version fresh enough for a new lease


class ContinuousSim:
    """The continuous-batching engine (module docstring); same result type as ``inflight_sim``."""

    def __init__(self, params: SimParams, sim: Any, model: ModuleType) -> None:
        """``sim``: the lock-step simulation (its broadcast delays and worker speeds); ``model``: the
        ``inflight_sim`` module (its rules: required versions, lengths, the result summary)."""
        if params.mode not in ("between_lease", "inflight"):
            raise ValueError(f"engine='continuous' models between_lease and inflight, not {params.mode!r}")
        if params.drain not in ("eager", "lazy"):
            raise ValueError(f"drain must be 'eager' or 'lazy', got {params.drain!r}")
        self.m = model
        self.p = params
        self.sim = sim  # the lock-step simulation's helpers: broadcast delays and worker speeds
        self.batch = params.prompts_per_batch * params.group_size
        self.events: list[tuple[float, int, str, tuple[Any, ...]]] = []
        self.seq = 0
        self.commits = [0.0]
        self.workers = [_Worker(rate, self.batch) for rate in sim.rate]
        self.leases: dict[int, tuple[int, int]] = {}  # lease number -> (issuing step, lease version)
        self.groups: dict[tuple[int, int], _Group] = {}
        self.leases_issued = 0
        self.buffer: list[list[tuple[int, dict[int, int], int]]] = []
        self.trainer_busy = False
        self.trainer_idle_since = 0.0
        self.claims: list[dict[str, Any]] = []
        self.generated: list[tuple[float, int, int]] = []
        self.dropped: list[tuple[float, int]] = []
        self.idle_spans: list[tuple[float, float]] = []
        self.waits: list[tuple[float, float]] = []
        self.switches = 0
        self.live_at_switch: Counter[int] = Counter()
        self.sim.commits = self.commits  # broadcast delays read the commit times

    @property
    def step(self) -> int:
        return len(self.commits) - 1

    def push(self, t: float, kind: str, *data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, data))

    # ---------------------------------------------------------------- the engine
    def end_time(self, w: _Worker, s: _Seq) -> float:
        return s.start_e + s.length / w.rate + w.offset

    def pos(self, w: _Worker, s: _Seq, t: float) -> float:
        return min(float(s.length), max(0.0, (t - w.offset - s.start_e) * w.rate))

    def start(self, wi: int, slot: int, s: _Seq, t: float) -> None:
        w = self.workers[wi]
        s.start_e = t - w.offset
        s.spans = [(w.held, 0)]
        w.slots[slot] = s
        self.push(self.end_time(w, s), "seq_done", wi, slot, w.generation, s.lease, s.index)

    def take_lease(self, wi: int, t: float) -> bool:
        """Queue a new lease's sequences if the worker may take one now."""
        w = self.workers[wi]
        need = self.m.required_version(self.p, self.step)
        if w.held < need:
            newest = self.sim.newest_loadable(wi, t)
            if newest >= need and not any(w.slots):
                self.load(wi, newest, t)  # idle engine: load between leases (every mode)
                return False
            if self.p.mode == "between_lease" and any(w.slots):
                w.draining = True
            elif not any(w.slots) and not w.waiting:
                w.waiting = True
                ready = min(self.sim.available(wi, v) for v in range(need, self.step + 1))
                self.waits.append((t, ready))
                self.push(ready, "wake", wi)
            return False
        number = self.leases_issued
        self.leases_issued += 1
        lengths = self.m.draw_lengths(self.p, number)
        self.leases[number] = (self.step, w.held)
        for first in range(0, len(lengths), self.p.group_size):
            self.groups[(number, first // self.p.group_size)] = _Group(remaining=self.p.group_size)
        w.queue.extend(_Seq(number, i, n, 0.0, []) for i, n in enumerate(lengths))
        return True

    def fill(self, wi: int, t: float) -> None:
        w = self.workers[wi]
        if w.draining:
            return
        for slot, live in enumerate(w.slots):
            if live is not None:
                continue
            if not w.queue and not self.take_lease(wi, t):
                return
            if w.draining:
                return
            self.start(wi, slot, w.queue.pop(0), t)

    def load(self, wi: int, version: int, t: float) -> None:
        """Load ``version``: pause every slot ``swap_pause_s``; in-flight, live sequences switch."""
        w = self.workers[wi]
        live = [s for s in w.slots if s is not None]
        chunk = self.p.chunk_tokens
        switched = 0
        for s in live:
            boundary = math.ceil(self.pos(w, s, t) / chunk) * chunk
            if boundary < s.length:
                if s.spans[-1][1] == boundary:
                    s.spans[-1] = (version, boundary)
                else:
                    s.spans.append((version, boundary))
                    switched += 1
        if switched:
            self.switches += 1
            self.live_at_switch[switched] += 1
        w.held = version
        w.offset += self.p.swap_pause_s
        w.generation += 1
        for slot, s in enumerate(w.slots):
            if s is not None:
                self.push(self.end_time(w, s), "seq_done", wi, slot, w.generation, s.lease, s.index)
        w.draining = False
        w.waiting = False
        self.push(t + self.p.swap_pause_s, "wake", wi)

    def version_ready(self, wi: int, version: int, t: float) -> None:
        w = self.workers[wi]
        if version <= w.held:
            return
        if self.p.mode == "inflight" or not any(w.slots):
            self.load(wi, version, t)
        elif self.p.drain == "eager":
            w.draining = True

    def seq_done(self, wi: int, slot: int, generation: int, lease: int, index: int, t: float) -> None:
        w = self.workers[wi]
        s = w.slots[slot]
        if s is None or generation != w.generation or (s.lease, s.index) != (lease, index):
            return  # superseded by a pause
        w.slots[slot] = None
        by_version: Counter[int] = Counter()
        bounds = [b for _, b in s.spans[1:]] + [s.length]
        for (version, first), last in zip(s.spans, bounds, strict=True):
            by_version[version] += last - first
        self.generated.append((t, 1, s.length))
        group = self.groups[(s.lease, s.index // self.p.group_size)]
        group.samples.append((s.spans[0][0], dict(by_version), s.length))
        group.remaining -= 1
        if not group.remaining:
            self.buffer.append(group.samples)
            self.trainer_try(t)
        if w.draining and not any(w.slots):
            newest = self.sim.newest_loadable(wi, t)
            if newest > w.held:
                self.load(wi, newest, t)
                return
            w.draining = False
        self.fill(wi, t)

    def wake(self, wi: int, t: float) -> None:
        w = self.workers[wi]
        w.waiting = False
        newest = self.sim.newest_loadable(wi, t)
        if newest > w.held and (self.p.mode == "inflight" or not any(w.slots)):
            self.load(wi, newest, t)
            return
        self.fill(wi, t)

    # ---------------------------------------------------------------- trainer
    def trainer_try(self, t: float) -> None:
        if self.trainer_busy:
            return
        step = self.step
        floor = self.m.required_version(self.p, step)
        fresh = []
        for group in self.buffer:
            if min(v for v, _, _ in group) < floor:
                self.dropped.append((t, len(group)))
            else:
                fresh.append(group)
        self.buffer = fresh
        if sum(len(g) for g in fresh) < self.p.samples_per_step:
            return
        taken = count = 0
        while count < self.p.samples_per_step:
            count += len(fresh[taken])
            taken += 1
        chosen, self.buffer = fresh[:taken], fresh[taken:]
        hist: Counter[int] = Counter()
        tokens = switched = oldest = 0
        for group in chosen:
            for rollout_version, by_version, length in group:
                oldest = max(oldest, step - rollout_version)
                tokens += length
                for version, n in by_version.items():
                    hist[step - version] += n
                    switched += n if version != rollout_version else 0
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
        for wi in range(self.p.workers):
            self.push(self.sim.available(wi, self.step), "version_ready", wi, self.step)
        self.trainer_try(t)

    def run(self) -> SimResult:
        for wi in range(self.p.workers):
            self.push(0.0, "wake", wi)
        while self.events and self.step < self.p.steps:
            t, _, kind, data = heapq.heappop(self.events)
            if kind == "seq_done":
                self.seq_done(*data, t)
            elif kind == "wake":
                self.wake(data[0], t)
            elif kind == "version_ready":
                self.version_ready(data[0], data[1], t)
            else:
                self.commit(t)
        return self.m.summarize(self)


# -------------------------------------------------------------------- the what-if grid

BASELINES = (
    ("today: lock step, lease submission", {"engine": "lockstep", "submit": "lease"}),
    ("lock step, group submission", {"engine": "lockstep", "submit": "group"}),
    ("continuous, eager drain", {"engine": "continuous", "submit": "group", "drain": "eager"}),
    ("continuous, lazy drain", {"engine": "continuous", "submit": "group", "drain": "lazy"}),
)
"""The between-lease systems the continuous in-flight engine is compared with."""


def what_if(base: SimParams, m: ModuleType) -> tuple[list[SimResult], list[dict[str, Any]], str]:
    """Continuous in-flight vs each between-lease baseline of :data:`BASELINES`, long tail: 16 and 64
    workers (64 with seeds 0, 1, 2), plus 256 workers against today's system only (trainer-bound).
    Returns the runs, the matched comparisons (``inflight_sim.matched``) and the markdown section;
    ``m`` is the ``inflight_sim`` module (its simulation, grid and table rows)."""
    from dataclasses import replace

    settings = [(16, 0), (64, 0), (64, 1), (64, 2), (256, 0)]
    runs: list[SimResult] = []
    rows: list[dict[str, Any]] = []
    for workers, seed in settings:
        setting = replace(base, workers=workers, seed=seed, lengths="long_tail")
        ours = [m.simulate(replace(setting, mode="inflight", bound=b, engine="continuous", submit="group"))
                for b in m.GRID_BOUNDS]  # fmt: skip
        runs += ours
        for label, fields in BASELINES if workers != 256 else BASELINES[:1]:
            theirs = [m.simulate(replace(setting, mode="between_lease", bound=b, **fields)) for b in m.GRID_BOUNDS]
            if fields["engine"] == "continuous" or fields["submit"] == "group":
                runs += theirs  # (today's lock-step rows are in the main table)
            rows += [{**row, "baseline": label} for row in m.matched(theirs + ours)]
    text = [
        "## What-if: continuous batching with in-flight updates (engine = continuous; not our runtime)",
        "",
        "`benchmarks/inflight_sim_continuous.py`: each worker keeps its 32 slots busy, refilling a finished "
        "slot from its next lease, and submits each group when its last member ends. In-flight: the engine "
        "loads each version as it arrives and every live sequence switches at its next 32-token boundary; "
        "a sequence that starts after a switch starts under the new version (a wire relaxation: today "
        "spans[0] must be the lease's version), and staleness counts from each sample's oldest span. "
        "Between-lease with a refilling engine: eager drain stops refilling once a newer version has loaded "
        "and switches when no sequence is live; lazy drain refills with its version until it is too old "
        "for a new lease. Long tail, base parameters of the main table otherwise.",
        "",
        "| lengths | workers | mode | bound | trained tok/s | mean | p50 | p90 | max | staleness histogram | "
        "dropped/generated | idle | len trained/generated | switched | live at switch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        p = r.params
        label = "inflight continuous" if p["mode"] == "inflight" else f"between_lease {p['engine']} {p['submit']}"
        label += f" {p['drain']} drain" if p["mode"] == "between_lease" and p["engine"] == "continuous" else ""
        text.append(m._row(r).replace(f"| {p['mode']} |", f"| {label} (seed {p['seed']}) |", 1))
    text += [
        "",
        "Matched: for each between-lease run of a baseline, the fastest continuous in-flight run of the same "
        "setting (workers, seed) whose token-staleness p50 is equal or lower (ratio), and the one at the same bound.",
        "",
        "| baseline (between-lease) | workers | seed | BL bound | BL tok/s | BL p50 (mean) | IF bound | IF tok/s | "
        "IF p50 (mean) | ratio | same-bound ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_key = {(r.params["workers"], r.params["seed"], r.params["bound"]): r for r in runs if r.params["mode"] == "inflight"}
    for row in rows:
        best = by_key.get((row["workers"], row["seed"], row["if_bound"]))
        if best is None:  # no in-flight run at equal or lower median staleness
            text.append(f"| {row['baseline']} | {row['workers']} | {row['seed']} | {row['bl_bound']} | "
                        f"{row['bl_tok_s']:,.0f} | {row['bl_p50']:g} ({row['bl_mean']:.2f}) | - | - | - | - | "
                        f"{row['same_bound_ratio']:.2f}x |")
            continue
        text.append(
            f"| {row['baseline']} | {row['workers']} | {row['seed']} | {row['bl_bound']} | {row['bl_tok_s']:,.0f} | "
            f"{row['bl_p50']:g} ({row['bl_mean']:.2f}) | {row['if_bound']} | {row['if_tok_s']:,.0f} | "
            f"{row['if_p50']:g} ({best.staleness_mean:.2f}) | {row['ratio']:.2f}x | "
            f"{row['same_bound_ratio']:.2f}x |"
        )
    return runs, rows, "\n".join(text) + "\n"

