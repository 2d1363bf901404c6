"""Per-client token buckets: how often one address may do something (here: register a worker).

Each key (a client address) has a bucket of at most ``burst`` tokens that refills at
``rate_per_minute / 60`` tokens per second; an action spends one token and is refused while
fewer than one is left, with the time until the next token as its ``retry_after_s``:

    tokens(t) = min(burst, tokens(t0) + (t - t0) * rate_per_minute / 60)
    retry_after_s = (1 - tokens(t)) * 60 / rate_per_minute        (when tokens(t) < 1)

So a client may act ``burst`` times at once and then ``rate_per_minute`` times per minute.
``rate_per_minute == 0`` turns the limit off. The clock is injectable (tests drive it by hand).

Registrations are bucketed by network (``network_key``: IPv4 /24, IPv6 /64), since one host
usually owns a whole /64 and one operator often a whole /24, and could otherwise take a fresh
bucket per address. (``client_key``, the per-address key of the lease caps, keeps IPv4 addresses
whole.) At most ``max_keys`` buckets are kept; the
least recently used is dropped beyond that (with the defaults it has long refilled, so dropping
it changes nothing).

Pitfall: behind a reverse proxy every client has the proxy's address and shares one bucket;
forwarded-for headers are not trusted because any client can forge them.
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Admission", "TokenBuckets", "client_key", "network_key"]


@dataclass(frozen=True)
class Admission:
    """Whether one action was admitted; if not, seconds until it would be (``retry_after_s > 0``)."""

    allowed: bool
    retry_after_s: float = 0.0


def client_key(address: str | None) -> str:
    """The bucket key of a peer address: the IPv4 address, the IPv6 /64 network, or the raw text."""
    if not address:
        return "<unknown>"
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def network_key(address: str | None) -> str:
    """The network of a peer address that admission bounds: its IPv4 /24 or IPv6 /64 (raw text if
    it is no IP address). Pitfall: a /24 may hold several operators (a campus NAT pool); they share
    the network's registration rate and its cap on fresh identities (``max_fresh_workers_per_network``)."""
    key = client_key(address)
    try:
        ip = ipaddress.ip_address(key)
    except ValueError:
        return key  # an IPv6 /64 already, or no IP address
    return str(ipaddress.IPv4Network((ip, 24), strict=False))


class TokenBuckets:
    """One token bucket per key (see module docstring). Not thread-safe: call from one thread.

    Args:
        rate_per_minute: sustained admissions per key per minute (0 = no limit).
        burst: admissions a key with a full bucket may make at once (>= 1).
        clock: seconds, monotonic (default ``time.monotonic``).
        max_keys: buckets kept at most (least recently used dropped first).
    """

    def __init__(
        self,
        rate_per_minute: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 65536,
    ) -> None:
        if rate_per_minute < 0 or burst < 1 or max_keys < 1:
            raise ValueError(
                f"need rate_per_minute >= 0, burst >= 1, max_keys >= 1; got {rate_per_minute}, {burst}, {max_keys}"
            )
        self.rate_per_s = rate_per_minute / 60.0
        self.burst = float(burst)
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)

    def __len__(self) -> int:
        return len(self._buckets)

    def admit(self, key: str) -> Admission:
        """Spend one of ``key``'s tokens if it has one."""
        if self.rate_per_s == 0:
            return Admission(True)
        now = self.clock()
        tokens, at = self._buckets.pop(key, (self.burst, now))
        # max(0, ...): a clock that steps back must not drain the bucket.
        tokens = min(self.burst, tokens + max(0.0, now - at) * self.rate_per_s)
        admitted = tokens >= 1.0
        if admitted:
            tokens -= 1.0
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        if admitted:
            return Admission(True)
        return Admission(False, (1.0 - tokens) / self.rate_per_s)
