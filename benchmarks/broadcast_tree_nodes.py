"""The processes of benchmarks/broadcast_tree.py: the tree's plan, and its origin, relays and
worker hosts started in their sites of the emulated WAN (or on loopback), stopped by PID.

Each server logs to `<workdir>/<name>.err`; `Tree.relay_log()` reads when each relay started and
finished mirroring each version from those logs, `Tree.client_events()` what each client fetched
from the worker hosts' stdout (benchmarks/broadcast_tree_clients.py).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from shardcast_procs import free_port
from swarm_wan import SwarmNetwork, run_ip

from prime_rl.launch.groups import stop_groups

CLIENTS = Path(__file__).with_name("broadcast_tree_clients.py")
# the relay's log lines (shardcast.cli's format: local time with milliseconds first)
RELAY_LOG = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*?(mirroring|mirrored) v(\d+)(?: in [\d.]+s: (\d+) bytes)?",
    re.M,
)
SERVER_PORT = 8000  # every site has its own address, so every server can take the same port


@dataclass(frozen=True)
class TreePlan:
    """Who pulls from whom. Relays are numbered tier by tier from the top; parent -1 is the origin."""

    depth: int
    fanout: int
    clients: int
    relay_parent: tuple[int, ...]
    relay_tier: tuple[int, ...]  # 1 (under the origin) .. depth (leaves)
    client_parent: tuple[int, ...]  # the leaf relay of each client

    @property
    def relays(self) -> int:
        return len(self.relay_parent)


def plan_tree(depth: int, fanout: int, clients: int) -> TreePlan:
    """The tree of `depth` relay tiers with fan-out at most `fanout` everywhere (origin included).

    Tier sizes from the leaves up: ceil(clients / fanout), then ceil(tier below / fanout) each;
    child i of a tier hangs under node i // fanout of the tier above. Raises ValueError when the
    top tier would exceed `fanout` (the tree needs more depth for that many clients).
    """
    if depth < 1 or fanout < 1 or clients < 1:
        raise ValueError(f"depth, fanout and clients must be >= 1, got {depth}, {fanout}, {clients}")
    sizes = [math.ceil(clients / fanout)]
    for _ in range(depth - 1):
        sizes.insert(0, math.ceil(sizes[0] / fanout))
    if sizes[0] > fanout:
        raise ValueError(
            f"{clients} clients with fan-out {fanout} need more than {depth} tiers "
            f"(the origin would feed {sizes[0]} relays)"
        )
    parent: list[int] = []
    tier: list[int] = []
    first = [0]  # index of each tier's first relay
    for level, size in enumerate(sizes, start=1):
        parent += [-1 if level == 1 else first[-2] + i // fanout for i in range(size)]
        tier += [level] * size
        first.append(first[-1] + size)
    leaves = first[-2]
    return TreePlan(
        depth,
        fanout,
        clients,
        tuple(parent),
        tuple(tier),
        tuple(leaves + c // fanout for c in range(clients)),
    )


@dataclass
class RelayVersion:
    """One relay's log about one version: wall-clock start and end of its mirroring, payload bytes pulled."""

    started: float | None = None
    finished: float | None = None
    pulled: int = 0


def tx_bytes(network: SwarmNetwork, site: int) -> int:
    link = network.links[site]
    shown = json.loads(run_ip("ip", "-n", link.namespace, "-s", "-j", "link", "show", "wan0"))
    return int(shown[0]["stats64"]["tx"]["bytes"])


class Tree:
    """The running processes of one plan on one network; `close()` stops them (by PID) and the network."""

    def __init__(
        self,
        plan: TreePlan,
        network: SwarmNetwork,
        workdir: Path,
        *,
        per_host: int,
        poll_s: float,
        rehash: bool,
        max_seconds: float,
    ) -> None:
        self.plan, self.network, self.workdir = plan, network, workdir
        self.processes: list[subprocess.Popen[bytes]] = []
        self.hosts = math.ceil(plan.clients / per_host)
        self.origin_dir = workdir / "origin"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        address = [self._address(site) for site in range(1 + plan.relays)]
        retention = ["--keep", "3", "--grace", "30"]
        self._spawn(
            0,
            [
                "origin",
                "--data-dir",
                str(self.origin_dir),
                "--host",
                address[0][0],
                "--port",
                str(address[0][1]),
                *retention,
            ],
            "origin",
            env,
        )
        for relay, parent in enumerate(plan.relay_parent):
            site = 1 + relay
            upstream = network.url(site, "http://{}:{}".format(*address[parent + 1]))
            argv = [
                "relay",
                "--upstream",
                upstream,
                "--data-dir",
                str(workdir / f"relay{relay}"),
                "--host",
                address[site][0],
                "--port",
                str(address[site][1]),
                "--poll-interval",
                str(poll_s),
                *retention,
            ]
            self._spawn(site, argv, f"relay{relay}", env)
        self._wait_serving(1 + plan.relays, 30.0)
        for host in range(self.hosts):
            site = 1 + plan.relays + host
            members = range(host * per_host, min(plan.clients, (host + 1) * per_host))
            spec = {
                "clients": [
                    {
                        "id": c,
                        "server": network.url(
                            site, "http://{}:{}".format(*address[1 + plan.client_parent[c]])
                        ),
                    }
                    for c in members
                ],
                "output_dir": str(workdir / f"host{host}"),
                "poll_s": poll_s,
                "rehash": rehash,
                "max_seconds": max_seconds,
            }
            argv = network.command(site, [sys.executable, str(CLIENTS), json.dumps(spec)])
            with (
                open(workdir / f"host{host}.out", "wb") as out,
                open(workdir / f"host{host}.err", "wb") as err,
            ):
                self.processes.append(
                    subprocess.Popen(
                        argv, stdin=subprocess.PIPE, stdout=out, stderr=err, env=env, start_new_session=True
                    )
                )

    def _address(self, site: int) -> tuple[str, int]:
        if self.network.emulated:
            return self.network.site_host(site), SERVER_PORT
        return "127.0.0.1", free_port()

    def _spawn(self, site: int, argv: list[str], name: str, env: dict[str, str]) -> None:
        command = self.network.command(site, [sys.executable, "-m", "shardcast.cli", *argv])
        with open(self.workdir / f"{name}.out", "wb") as out, open(self.workdir / f"{name}.err", "wb") as err:
            self.processes.append(
                subprocess.Popen(command, stdout=out, stderr=err, env=env, start_new_session=True)
            )

    def _wait_serving(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        names = ["origin"] + [f"relay{r}" for r in range(self.plan.relays)]
        while time.monotonic() < deadline:
            if all("serving" in (self.workdir / f"{n}.out").read_text() for n in names[:count]):
                return
            dead = [p.args for p in self.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a server exited at start: {dead[0]} (see {self.workdir})")
            time.sleep(0.2)
        raise RuntimeError(f"servers not serving within {timeout_s} s (see {self.workdir})")

    def client_events(self) -> list[dict]:
        events = []
        for host in range(self.hosts):
            text = (self.workdir / f"host{host}.out").read_text()
            events += [json.loads(line) for line in text.splitlines() if line.endswith("}")]
        return events

    def relay_log(self) -> dict[int, dict[int, RelayVersion]]:
        """relay -> version -> when it started and finished mirroring it and the bytes it pulled (its log)."""
        seen: dict[int, dict[int, RelayVersion]] = {}
        for relay in range(self.plan.relays):
            for match in RELAY_LOG.finditer((self.workdir / f"relay{relay}.err").read_text()):
                logged = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S"))
                logged += int(match.group(2)) / 1000
                version = int(match.group(4))
                entry = seen.setdefault(relay, {}).setdefault(version, RelayVersion())
                if match.group(3) == "mirroring":
                    entry.started = logged
                else:
                    entry.finished, entry.pulled = logged, int(match.group(5))
        return seen

    def close(self) -> None:
        for process in self.processes:
            if process.stdin is not None:
                process.stdin.close()  # the client hosts stop at EOF
        stop_groups(self.processes, grace_s=10.0, reap_s=5.0)
