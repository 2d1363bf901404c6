"""Server choice from real transfers: throughput and success per server, dead-server backoff.

Each server keeps

- ``throughput_bps``: EMA (α = 0.3) of bytes/s measured on whole shard downloads;
- ``success_rate``: EMA (α = 0.3) of 1 (good shard) / 0 (failure), floored at 0.05 so the
  weights never collapse to zero (reference bug: ``random.choices`` raising on all-zero);
- ``dead_until``: connection failures back off exponentially, 0.5·2^k s capped at 30 s;
  a server that served :data:`MAX_BAD_SHARDS` corrupt shards is dropped for good.

:meth:`ServerPool.choose` takes the best alive server by
``score = throughput · success_rate / (1 + in_flight)`` (untried servers get the best known
throughput, so each one is tried early). Dividing by the number of in-flight requests
spreads shards over servers in proportion to their speed instead of piling onto one.
Unlike the reference there is no probe file: throughput comes from real shard transfers.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

EMA_ALPHA = 0.3
MIN_SUCCESS_RATE = 0.05
MAX_BACKOFF_S = 30.0
MAX_BAD_SHARDS = 3
UNKNOWN_THROUGHPUT_BPS = 1e9


@dataclass
class ServerState:
    """Mutable per-server statistics (owned by one :class:`ServerPool`)."""

    url: str
    throughput_bps: float | None = None
    success_rate: float = 1.0
    consecutive_failures: int = 0
    dead_until: float = 0.0
    in_flight: int = 0
    bad_shards: int = 0
    bytes_served: int = 0
    last_error: str = ""

    def alive(self, now: float) -> bool:
        return self.dead_until <= now

    @property
    def dropped(self) -> bool:
        return math.isinf(self.dead_until)


@dataclass(frozen=True)
class ServerReport:
    """Final statistics of one server after a fetch."""

    url: str
    bytes_served: int
    throughput_bps: float | None
    success_rate: float
    bad_shards: int
    dropped: bool
    last_error: str


@dataclass
class ServerPool:
    """Statistics and choice over a fixed list of server base URLs."""

    urls: list[str]
    max_in_flight: int = 4
    states: dict[str, ServerState] = field(init=False)

    def __post_init__(self) -> None:
        self.states = {url: ServerState(url) for url in self.urls}

    def choose(
        self, allowed: set[str] | None = None, exclude: set[str] | frozenset[str] = frozenset()
    ) -> ServerState | None:
        """Best alive server with spare capacity, or ``None`` if there is none right now."""
        now = time.monotonic()
        known = [s.throughput_bps for s in self.states.values() if s.throughput_bps]
        optimistic = max(known) if known else UNKNOWN_THROUGHPUT_BPS
        best, best_score = None, -1.0
        for state in self.states.values():
            if state.url in exclude or (allowed is not None and state.url not in allowed):
                continue
            if not state.alive(now) or state.in_flight >= self.max_in_flight:
                continue
            speed = state.throughput_bps if state.throughput_bps else optimistic
            score = speed * state.success_rate / (1 + state.in_flight)
            if score > best_score:
                best, best_score = state, score
        return best

    def usable(self) -> list[str]:
        """Servers not permanently dropped."""
        return [s.url for s in self.states.values() if not s.dropped]

    def record_success(self, url: str, nbytes: int, seconds: float) -> None:
        state = self.states[url]
        state.bytes_served += nbytes
        state.consecutive_failures = 0
        state.success_rate = EMA_ALPHA + (1 - EMA_ALPHA) * state.success_rate
        if nbytes >= 64 * 1024 and seconds > 0:
            sample = nbytes / seconds
            state.throughput_bps = (
                sample
                if state.throughput_bps is None
                else (EMA_ALPHA * sample + (1 - EMA_ALPHA) * state.throughput_bps)
            )

    def record_failure(self, url: str, reason: str, *, unreachable: bool = False) -> None:
        """A failed request: lowers the success rate; ``unreachable`` also backs off exponentially."""
        state = self.states[url]
        state.last_error = reason
        state.consecutive_failures += 1
        state.success_rate = max(MIN_SUCCESS_RATE, (1 - EMA_ALPHA) * state.success_rate)
        if unreachable and not state.dropped:
            backoff = min(MAX_BACKOFF_S, 0.5 * 2 ** (state.consecutive_failures - 1))
            state.dead_until = time.monotonic() + backoff

    def record_bad_shard(self, url: str, reason: str) -> None:
        """A shard from ``url`` failed verification: heavy penalty, dropped after MAX_BAD_SHARDS."""
        state = self.states[url]
        state.bad_shards += 1
        state.last_error = reason
        state.success_rate = MIN_SUCCESS_RATE
        if state.bad_shards >= MAX_BAD_SHARDS:
            self.drop(url, f"{state.bad_shards} corrupt shards")

    def drop(self, url: str, reason: str) -> None:
        state = self.states[url]
        state.dead_until = math.inf
        state.last_error = reason

    def reports(self) -> list[ServerReport]:
        return [
            ServerReport(
                s.url, s.bytes_served, s.throughput_bps, s.success_rate, s.bad_shards, s.dropped, s.last_error
            )
            for s in self.states.values()
        ]
