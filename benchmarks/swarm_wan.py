"""An emulated WAN for the swarm rehearsal (benchmarks/swarm.py): sites in Linux network namespaces.

Layout (root only; everything else falls back to loopback and says why):
- one Linux bridge in the root namespace holding `server_host` = 10.X.0.1/16, X a /16 that no
  route or address of this machine uses; servers in the root namespace bind it;
- one namespace per site k, joined to the bridge by a veth pair, its end `wan0` addressed
  10.X.k.2/16 (so sites fall in different /24s), lo up and no default route: the only route is the
  connected /16, so a site reaches the root address and other sites (the bridge is L2, no
  forwarding or sysctl is touched) and nothing else;
- bandwidth: `tc tbf` at the site's rate on both veth ends (upload and download);
- round-trip time and loss: this kernel has no `netem`, so a user-space proxy per site
  (benchmarks/swarm_wan_proxy.py) runs inside the namespace; `url()` points a site's process at it.
  A path from site i to a server in site j carries both access links: RTT_i + RTT_j and both losses.
- flaky links: `cut()` takes a site's bridge port down for some seconds (packets are dropped,
  connections stall and resume as over a real outage).

Link parameters are drawn from a seed: RTT uniform in `rtt_ms`, bandwidth log-uniform in `mbit`
(as many slow links as fast ones per octave), one loss rate for all, round(flaky_share * sites)
sites flaky.

Every name carries this process's pid (namespaces `swan-<pid>-<token>-<site>`; links have the alias
`swarm_wan pid=<pid>`), so `cleanup_stale()` removes the leftovers of dead processes and never
anything of a live one or anything this module did not create. `close()` runs at exit and on
SIGINT/SIGTERM (then the previous handler runs).

`python benchmarks/swarm_wan_probe.py --selftest` (or the same arguments to this file) measures each site's RTT and bandwidth against its
configuration (results: benchmarks/results/swarm_wan_selftest.md).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import json
import math
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

PROXY = Path(__file__).with_name("swarm_wan_proxy.py")
NAMESPACE = re.compile(r"^swan-(\d+)-([0-9a-f]+)-(\d+)$")
ALIAS = "swarm_wan pid="
LOCK = Path("/run/swarm_wan.lock")  # serialises the choice of a free /16 between parallel runs
PROXY_START_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class SiteLink:
    """One site's access link: namespace, address, and what its link was drawn to be."""

    site: int
    namespace: str
    address: str  # the site's own address (10.X.k.2); "127.0.0.1" on loopback
    rtt_ms: float  # round trip to the root namespace
    mbit: float  # tbf rate, each direction
    loss: float  # per ~MSS segment, each direction
    flaky: bool  # the harness cuts flaky links


class SwarmNetwork(Protocol):
    emulated: bool
    description: str
    server_host: str
    links: tuple[SiteLink, ...]

    def sites(self) -> int: ...
    def command(self, site: int, argv: list[str]) -> list[str]: ...
    def url(self, site: int, url: str) -> str: ...
    def site_host(self, site: int) -> str: ...
    def cut(self, site: int, seconds: float) -> None: ...
    def close(self) -> None: ...


def draw_links(
    sites: int,
    seed: int,
    *,
    rtt_ms: tuple[float, float],
    mbit: tuple[float, float],
    loss: float,
    flaky_share: float,
) -> list[tuple[float, float, float, bool]]:
    """(rtt_ms, mbit, loss, flaky) per site, a pure function of the seed."""
    rng = random.Random(seed)
    drawn = [
        (
            round(rng.uniform(*rtt_ms), 1),
            round(math.exp(rng.uniform(math.log(mbit[0]), math.log(mbit[1]))), 1),
        )
        for _ in range(sites)
    ]
    flaky = set(rng.sample(range(sites), round(flaky_share * sites)))
    return [(rtt, rate, loss, k in flaky) for k, (rtt, rate) in enumerate(drawn)]


class LoopbackNetwork:
    """Every site on this machine's loopback, unshaped: the fallback where namespaces cannot be made."""

    emulated = False
    server_host = "127.0.0.1"

    def __init__(self, links: list[SiteLink], why: str) -> None:
        self.links = tuple(links)
        self.description = f"loopback ({why}): no latency, bandwidth, loss or cuts"

    def sites(self) -> int:
        return len(self.links)

    def command(self, site: int, argv: list[str]) -> list[str]:
        return list(argv)

    def url(self, site: int, url: str) -> str:
        return url

    def site_host(self, site: int) -> str:
        return "127.0.0.1"

    def cut(self, site: int, seconds: float) -> None:
        """Nothing to cut on loopback (`emulated` is False: the harness reports that no link was cut)."""

    def close(self) -> None:
        pass


def run_ip(*argv: str, stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetworkSetupError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


class NetworkSetupError(RuntimeError):
    """An `ip`/`tc` command failed while building or tearing down the emulated WAN."""


def _used_prefixes() -> set[int]:
    """Second octets of the 10/8 /16s that a route or address of the root namespace touches."""
    used: set[int] = set()
    for line in (
        run_ip("ip", "-4", "route", "show", "table", "all").splitlines()
        + run_ip("ip", "-4", "-o", "addr").splitlines()
    ):
        for token in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", line):
            net = ipaddress.ip_network(token, strict=False)
            if net.overlaps(ipaddress.ip_network("10.0.0.0/8")):
                used.update(
                    range(256) if net.prefixlen < 16 else [int(str(net.network_address).split(".")[1])]
                )
    return used


class NamespaceNetwork:
    """Sites in namespaces behind one bridge, shaped by tbf, delayed and lossy through per-site proxies."""

    emulated = True

    def __init__(self, draws: list[tuple[float, float, float, bool]], seed: int) -> None:
        self._token = os.urandom(3).hex()
        self._bridge = f"swb{self._token}"
        self._closed = False
        self._lock = threading.RLock()  # re-entrant: a signal handler may close() while url() holds it
        self._proxies: list[subprocess.Popen[str]] = []
        self._routes: list[dict[tuple[str, int], int]] = []
        self._cut_until: dict[int, float] = {}
        self._timers: list[threading.Timer] = []
        self._namespaces: list[str] = []
        _LIVE.append(self)
        try:
            self._build(draws, seed)
        except BaseException:
            self.close()
            raise

    def _build(self, draws: list[tuple[float, float, float, bool]], seed: int) -> None:
        alias = f"{ALIAS}{os.getpid()}"
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        with LOCK.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            free = [x for x in range(200, 255) if x not in _used_prefixes()]
            if not free:
                raise NetworkSetupError("no free 10.X.0.0/16 among 10.200-254 for the bridge")
            self._octet = free[0]
            run_ip(
                "ip",
                "link",
                "add",
                self._bridge,
                "address",
                mac(self._octet, 0),
                "type",
                "bridge",
                "stp_state",
                "0",
            )
            run_ip("ip", "link", "set", self._bridge, "alias", alias)
            run_ip("ip", "addr", "add", f"10.{self._octet}.0.1/16", "dev", self._bridge)
            run_ip("ip", "link", "set", self._bridge, "up")
        self.server_host = f"10.{self._octet}.0.1"
        links = []
        for site, (rtt, rate, loss, flaky) in enumerate(draws):
            namespace = f"swan-{os.getpid()}-{self._token}-{site}"
            address = f"10.{self._octet}.{site + 1}.2"
            port = self._port(site)
            run_ip("ip", "netns", "add", namespace)
            self._namespaces.append(namespace)
            peer = ["name", "wan0", "address", mac(self._octet, site + 1), "netns", namespace]
            run_ip("ip", "link", "add", port, "type", "veth", "peer", *peer)
            run_ip("ip", "link", "set", port, "alias", alias)
            run_ip("ip", "link", "set", port, "master", self._bridge, "up")
            run_ip("ip", "-n", namespace, "addr", "add", f"{address}/16", "dev", "wan0")
            run_ip("ip", "-n", namespace, "link", "set", "wan0", "up")
            run_ip("ip", "-n", namespace, "link", "set", "lo", "up")
            for where in (
                ["-n", namespace, "qdisc", "replace", "dev", "wan0"],
                ["qdisc", "replace", "dev", port],
            ):
                run_ip("tc", *where, "root", "tbf", *tbf_args(rate))
            links.append(SiteLink(site, namespace, address, rtt, rate, loss, flaky))
        self.links = tuple(links)
        self._pin_neighbours()
        for link in self.links:
            self._proxies.append(self._start_proxy(link, seed))
            self._routes.append({})
        flaky_sites = [link.site for link in self.links if link.flaky]
        self.description = (
            f"emulated: {len(self.links)} namespaces on bridge 10.{self._octet}.0.0/16, "
            f"RTT {min(x.rtt_ms for x in self.links):.0f}-{max(x.rtt_ms for x in self.links):.0f} ms, "
            f"{min(x.mbit for x in self.links):.0f}-{max(x.mbit for x in self.links):.0f} Mbit/s (tbf), "
            f"loss {self.links[0].loss:.2%}/segment (proxy), flaky sites {flaky_sites}"
        )

    def _pin_neighbours(self) -> None:
        """Permanent ARP entries between every pair of addresses on the bridge.

        Without them a cut is not a WAN outage: ARP fails during it, and the kernel then fails
        connects at once with EHOSTUNREACH, also for a moment after the link is back. Pinned, a
        cut only drops packets and TCP retransmits through it, as over a real outage.
        """
        hosts = [(f"10.{self._octet}.0.1", mac(self._octet, 0))]
        hosts += [(link.address, mac(self._octet, link.site + 1)) for link in self.links]

        def batch(device: str, own: str) -> str:
            return "".join(
                f"neigh replace {address} lladdr {lladdr} dev {device} nud permanent\n"
                for address, lladdr in hosts
                if address != own
            )

        run_ip("ip", "-batch", "-", stdin=batch(self._bridge, self.server_host))
        for link in self.links:
            run_ip("ip", "-n", link.namespace, "-batch", "-", stdin=batch("wan0", link.address))

    def _port(self, site: int) -> str:
        return f"sw{self._token}h{site}"  # root end of the site's veth; at most 15 characters up to 999 sites

    def _start_proxy(self, link: SiteLink, seed: int) -> subprocess.Popen[str]:
        argv = self.command(
            link.site, [sys.executable, "-I", str(PROXY), "--seed", str(seed * 100_003 + link.site)]
        )
        proxy = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        if _read_reply(proxy, PROXY_START_TIMEOUT_S) != {"ready": True}:
            raise NetworkSetupError(f"proxy of site {link.site} did not start")
        return proxy

    def sites(self) -> int:
        return len(self.links)

    def command(self, site: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.links[site].namespace, *argv]

    def site_host(self, site: int) -> str:
        return self.links[site].address

    def url(self, site: int, url: str) -> str:
        """The URL through `site`'s proxy: its RTT and loss (plus the server's site's, for a site server)."""
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or 80
        link = self.links[site]
        if host == link.address:
            return url  # a server in the same site: no WAN in between
        rtt, loss = link.rtt_ms, link.loss
        for other in self.links:
            if other.address == host:
                rtt, loss = rtt + other.rtt_ms, 1 - (1 - loss) * (1 - other.loss)
        with self._lock:
            if self._closed:
                raise NetworkSetupError("the network is closed")
            routes = self._routes[site]
            if (host, port) not in routes:
                proxy = self._proxies[site]
                assert proxy.stdin is not None
                proxy.stdin.write(
                    json.dumps({"host": host, "port": port, "rtt_ms": rtt, "loss": loss}) + "\n"
                )
                routes[(host, port)] = _read_reply(proxy, PROXY_START_TIMEOUT_S)["port"]
            local = routes[(host, port)]
        return urlunsplit(parts._replace(netloc=f"127.0.0.1:{local}"))

    def cut(self, site: int, seconds: float) -> None:
        """Take `site`'s link down now and back up after `seconds` (overlapping cuts: the later end wins)."""
        with self._lock:
            if self._closed:
                return
            until = max(self._cut_until.get(site, 0.0), time.monotonic() + seconds)
            self._cut_until[site] = until
            run_ip("ip", "link", "set", self._port(site), "down")
            timer = threading.Timer(until - time.monotonic(), self._restore, args=(site,))
            timer.daemon = True
            self._timers.append(timer)
            timer.start()

    def _restore(self, site: int) -> None:
        with self._lock:
            if self._closed or time.monotonic() < self._cut_until.get(site, 0.0) - 0.01:
                return  # a later cut of this site restores it
            with contextlib.suppress(NetworkSetupError):
                run_ip("ip", "link", "set", self._port(site), "up")

    def close(self) -> None:
        """Stop the proxies and delete the namespaces, veths and bridge; safe to call twice or from a handler."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for timer in self._timers:
                timer.cancel()
        for proxy in self._proxies:
            with contextlib.suppress(OSError):
                assert proxy.stdin is not None
                proxy.stdin.close()  # EOF: the proxy stops on its own
        for proxy in self._proxies:
            try:
                proxy.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proxy.kill()
                proxy.wait(timeout=3)
        for site, namespace in enumerate(self._namespaces):
            # The veth first: a deleted namespace frees its devices later, in a kernel work queue.
            with contextlib.suppress(NetworkSetupError):
                run_ip("ip", "link", "del", self._port(site))
            _delete_namespace(namespace)
        with contextlib.suppress(NetworkSetupError):
            run_ip("ip", "link", "del", self._bridge)
        if self in _LIVE:
            _LIVE.remove(self)


def mac(octet: int, host: int) -> str:
    """A locally administered MAC, unique per bridge (its /16) and host on it; fixed so it can be pinned."""
    return f"02:5a:{octet:02x}:{host >> 8:02x}:{host & 0xFF:02x}:01"


def tbf_args(mbit: float) -> list[str]:
    """tbf at `mbit`: burst >= one 64 KiB GSO packet (smaller drops them) and 4 ms at rate; queue 50 ms."""
    rate_bytes = mbit * 1e6 / 8
    burst = max(65536 + 1514, int(rate_bytes * 0.004))
    limit = max(2 * burst, int(rate_bytes * 0.05))
    return ["rate", f"{mbit}mbit", "burst", str(burst), "limit", str(limit)]


def _read_reply(proxy: subprocess.Popen[str], timeout_s: float) -> dict:
    assert proxy.stdout is not None
    ready, _, _ = select.select([proxy.stdout], [], [], timeout_s)
    line = proxy.stdout.readline() if ready else ""
    if not line:
        raise NetworkSetupError(f"site proxy gave no answer within {timeout_s} s (exit code {proxy.poll()})")
    return json.loads(line)


def _delete_namespace(namespace: str) -> None:
    """Kill what still runs in `namespace` (only processes inside it), then delete it."""
    with contextlib.suppress(NetworkSetupError, subprocess.TimeoutExpired):
        for pid in run_ip("ip", "netns", "pids", namespace).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        run_ip("ip", "netns", "del", namespace)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> list[str]:
    """Remove namespaces and links left by dead processes of this module; returns what was removed."""
    removed = []
    # Links first: a deleted namespace frees its veths later, in a kernel work queue.
    for link in json.loads(run_ip("ip", "-j", "link", "show") or "[]"):
        alias = link.get("ifalias", "")
        if alias.startswith(ALIAS) and not _alive(int(alias[len(ALIAS) :])):
            with contextlib.suppress(NetworkSetupError):
                run_ip("ip", "link", "del", link["ifname"])
                removed.append(link["ifname"])
    for line in run_ip("ip", "netns", "list").splitlines():
        match = NAMESPACE.match(line.split()[0]) if line.strip() else None
        if match and not _alive(int(match.group(1))):
            _delete_namespace(match.group(0))
            removed.append(match.group(0))
    return removed


_LIVE: list[NamespaceNetwork] = []
_HANDLERS_INSTALLED = False


def _close_all() -> None:
    for network in list(_LIVE):
        network.close()


def _install_handlers() -> None:
    """close() every live network at exit and on SIGINT/SIGTERM, then let the previous handler act."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(_close_all)
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; atexit still runs

    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)

        def handler(signum: int, frame: object, previous: object = previous) -> None:
            _close_all()
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(signum, handler)


def why_not_emulated() -> str | None:
    """Why namespaces cannot be used here, or None when they can be tried."""
    if os.geteuid() != 0:
        return "not root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    return f"no {' or '.join(missing)} command" if missing else None


def open_network(
    sites: int,
    seed: int,
    *,
    rtt_ms: tuple[float, float] = (50, 300),
    mbit: tuple[float, float] = (50, 600),
    loss: float = 0.005,
    flaky_share: float = 0.1,
    emulate: bool = True,
) -> SwarmNetwork:
    """`sites` sites over an emulated WAN when this machine allows it, else on loopback (description says why).

    Defaults are issue 33's ranges (50-300 ms RTT, 50-600 Mbit/s, 0.5% loss, 10% flaky links).
    `emulate=False` asks for loopback. Pitfall: url() must be called in the process that opened the
    network (it talks to the site proxies), then handed to the site's process.
    """
    if not 1 <= sites <= 254:
        raise ValueError(f"sites must be 1..254 (one /24 each in a /16), got {sites}")
    draws = draw_links(sites, seed, rtt_ms=rtt_ms, mbit=mbit, loss=loss, flaky_share=flaky_share)
    why = "emulation off" if not emulate else why_not_emulated()
    if why is None:
        cleanup_stale()
        _install_handlers()
        try:
            return NamespaceNetwork(draws, seed)
        except NetworkSetupError as error:
            why = f"namespace setup failed: {error}"
    links = [
        SiteLink(k, "", "127.0.0.1", rtt, rate, loss_, flaky)
        for k, (rtt, rate, loss_, flaky) in enumerate(draws)
    ]
    return LoopbackNetwork(links, why)


if __name__ == "__main__":
    # The self-test is swarm_wan_probe's (which imports this module, never the other way round):
    # the old command runs it as a process.
    probe_script = str(Path(__file__).with_name("swarm_wan_probe.py"))
    os.execv(sys.executable, [sys.executable, probe_script, *sys.argv[1:]])
