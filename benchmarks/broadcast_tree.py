"""Policy broadcast through a shardcast relay tree over the emulated WAN: time-to-all by depth and N.

Issue 33 asks for time-to-all (publish -> last worker holds the version) that grows with the
depth of the relay tree, not with the number of workers N, on a payload of realistic size with
real bf16 weight deltas between RL steps. One run:

- payload (benchmarks/broadcast_tree_payload.py): K consecutive bf16 checkpoints of a
  Qwen2-shaped model (about 64 MB), one real AdamW step apart, each published with
  `shardcast.publish_file(..., delta=True)` into the origin's data directory;
- tree (`plan_tree`): `depth` tiers of relays with fan-out at most `fanout` (origin included):
  ceil(N / fanout) leaf relays, each tier above ceil(tier below / fanout) relays, the top tier
  under the origin; so for a fixed depth a larger N means more relays, not a longer path;
- processes: the origin (`shardcast origin`) and every relay (`shardcast relay`) are real
  processes, each in its own site; the N clients are `shardcast.Follower` loops, `per_host` of
  them per worker-host process (benchmarks/broadcast_tree_clients.py), each host in its own site,
  each client following its leaf relay (delta base: its previous version);
- network (benchmarks/swarm_wan.py): one namespace per site on a bridge, `tc tbf` both ways at the
  site's rate, RTT and loss added by the site's proxy. A path between two sites crosses both
  access links, so each access link gets half the issue's RTT (25-150 ms, paths 50-300 ms) and
  half its loss (0.25%, paths ~0.5%); rates 50-600 Mbit/s log-uniform; all seeded. Where
  namespaces cannot be made it runs on loopback and says so;
- cadence: version k+1 is published once every client holds version k and every relay has
  mirrored it completely (or `version_timeout_s` passed), so each version is timed alone.

Measured per version: publish seconds; time-to-all p50 / max over clients; when the last relay
finished mirroring; bytes per client; relay egress (payload bytes its children pulled, from the
children's own counts) and, emulated, bytes sent on each relay's link (interface counters).
`python benchmarks/broadcast_tree.py --grid 1:16,2:16,3:16,2:64,3:64` writes
benchmarks/results/broadcast_tree.{md,json} (broadcast_tree_report.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import broadcast_tree_payload as payloads
from shardcast_procs import free_port
from swarm_wan import SwarmNetwork, open_network, run_ip

from prime_rl.launch.groups import stop_groups
from shardcast import publish_file

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


@dataclass
class VersionRow:
    version: int
    file_bytes: int
    delta_bytes: int | None
    publish_s: float
    clients_done: int
    time_to_all_p50_s: float | None
    time_to_all_max_s: float | None
    relays_done_max_s: float | None  # publish -> the last relay holds every shard (full and delta)
    relay_start_by_tier: dict[int, float | None]  # publish -> the last relay of the tier started mirroring
    fetch_s_p50: float | None  # the clients' own fetch time (listing it -> file placed), median
    bytes_per_client_mean: float | None
    clients_used_delta: int
    digests_ok: int  # clients whose file digest equals the published one
    egress_origin: int  # payload bytes the origin's children pulled for this version
    egress_relay_by_tier: dict[int, list[int]] = field(default_factory=dict)  # tier -> each relay's


@dataclass
class RunResult:
    depth: int
    fanout: int
    clients: int
    relays: int
    per_host: int
    emulated: bool
    network: str
    seed: int
    payload_bytes: int
    shard_size: int
    lr: float
    versions: list[VersionRow]
    wire_tx_bytes_by_tier: dict[int, list[int]]  # emulated: bytes sent on each relay's link, whole run
    wall_s: float
    setup_s: float
    cpu_s: float  # user + system of every child process (relays, clients, proxies, origin)
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    ok: bool


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _tx_bytes(network: SwarmNetwork, site: int) -> int:
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


def run_tree(
    plan: TreePlan,
    payload: payloads.Payload,
    workdir: Path,
    *,
    seed: int = 0,
    per_host: int = 4,
    shard_size: int = 4_000_000,
    poll_s: float = 1.0,
    rtt_ms: tuple[float, float] = (25, 150),
    mbit: tuple[float, float] = (50, 600),
    loss: float = 0.0025,
    emulate: bool = True,
    rehash: bool = False,
    version_timeout_s: float = 120.0,
) -> RunResult:
    """Broadcast every version of `payload` through `plan` and measure it; everything started is stopped."""
    started = time.monotonic()
    load_before = os.getloadavg()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    hosts = math.ceil(plan.clients / per_host)
    network = open_network(
        1 + plan.relays + hosts, seed, rtt_ms=rtt_ms, mbit=mbit, loss=loss, flaky_share=0.0, emulate=emulate
    )
    tree = None
    rows: list[VersionRow] = []
    tx_before: dict[int, int] = {}
    tx_tiers: dict[int, list[int]] = {}
    try:
        relay_sites = range(1, 1 + plan.relays)
        if network.emulated:
            tx_before = {site: _tx_bytes(network, site) for site in relay_sites}
        tree = Tree(
            plan,
            network,
            workdir,
            per_host=per_host,
            poll_s=poll_s,
            rehash=rehash,
            max_seconds=version_timeout_s * len(payload.paths) + 60,
        )
        setup_s = time.monotonic() - started
        for number, path in enumerate(payload.paths, start=1):
            publish_started = time.time()
            manifest = publish_file(
                tree.origin_dir,
                path,
                delta=True,
                shard_size=shard_size,
                keep=3,
                grace_s=30,
                file_name=payloads.FILE_NAME,
            )
            published = time.time()
            deadline = time.monotonic() + version_timeout_s
            while time.monotonic() < deadline:
                events = [e for e in tree.client_events() if e["version"] == number]
                relays = tree.relay_log()
                if len(events) == plan.clients and all(
                    relays.get(r, {}).get(number, RelayVersion()).finished for r in range(plan.relays)
                ):
                    break
                time.sleep(0.25)
            rows.append(
                _version_row(
                    plan,
                    number,
                    manifest,
                    payload.sha256[number - 1],
                    published - publish_started,
                    published,
                    tree,
                )
            )
        if network.emulated:
            for site in relay_sites:
                tx_tiers.setdefault(plan.relay_tier[site - 1], []).append(
                    _tx_bytes(network, site) - tx_before[site]
                )
    finally:
        if tree is not None:
            tree.close()
        network.close()
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ok = all(row.clients_done == plan.clients and row.digests_ok == plan.clients for row in rows)
    return RunResult(
        plan.depth,
        plan.fanout,
        plan.clients,
        plan.relays,
        per_host,
        network.emulated,
        network.description,
        seed,
        payload.size,
        shard_size,
        payload.spec.lr,
        rows,
        tx_tiers,
        time.monotonic() - started,
        setup_s,
        (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime),
        load_before,
        os.getloadavg(),
        ok and len(rows) == len(payload.paths),
    )


def _version_row(
    plan: TreePlan, number: int, manifest: object, sha256: str, publish_s: float, published: float, tree: Tree
) -> VersionRow:
    events = {e["client"]: e for e in tree.client_events() if e["version"] == number}
    relays = {r: tree.relay_log().get(r, {}).get(number, RelayVersion()) for r in range(plan.relays)}
    waits = [e["t"] - published for e in events.values()]
    relay_times = [v.finished - published for v in relays.values() if v.finished is not None]
    started_by_tier: dict[int, float | None] = {}
    for relay, tier in enumerate(plan.relay_tier):
        start = relays[relay].started
        previous = started_by_tier.get(tier, 0.0)
        started_by_tier[tier] = (
            None if start is None or previous is None else max(previous, start - published)
        )
    pulled_by_relay = {r: v.pulled for r, v in relays.items()}
    egress = [0] * plan.relays
    egress_origin = 0
    for relay, parent in enumerate(plan.relay_parent):
        if parent < 0:
            egress_origin += pulled_by_relay[relay]
        else:
            egress[parent] += pulled_by_relay[relay]
    for client, event in events.items():
        egress[plan.client_parent[client]] += event["bytes"]
    by_tier: dict[int, list[int]] = {}
    for relay, tier in enumerate(plan.relay_tier):
        by_tier.setdefault(tier, []).append(egress[relay])
    delta = getattr(manifest, "delta", None)
    digest = getattr(manifest, "file_digest", "")
    good = sum(1 for e in events.values() if e["file_digest"] == digest and e.get("sha256", sha256) == sha256)
    return VersionRow(
        number,
        getattr(manifest, "file_size", 0),
        None if delta is None else sum(d.stored_size for d in delta.shards),
        publish_s,
        len(events),
        _percentile(waits, 0.5) if waits else None,
        max(waits) if waits else None,
        max(relay_times) if len(relay_times) == plan.relays else None,
        started_by_tier,
        _percentile([e["seconds"] for e in events.values()], 0.5) if events else None,
        sum(e["bytes"] for e in events.values()) / len(events) if events else None,
        sum(1 for e in events.values() if e["used_delta"]),
        good,
        egress_origin,
        by_tier,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--grid", default="1:16,2:16,3:16,2:64,3:64", help="depth:clients pairs, comma-separated"
    )
    parser.add_argument("--fanout", type=int, default=4, help="children per origin/relay at most")
    parser.add_argument("--per-host", type=int, default=4, help="clients per worker-host process (one site)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration (min/median reported)")
    parser.add_argument("--versions", type=int, default=4, help="versions published (1 full + deltas)")
    parser.add_argument("--lr", type=float, default=3e-7, help="AdamW lr between versions")
    parser.add_argument(
        "--sensitivity-lr",
        type=float,
        nargs="*",
        default=[1e-6, 1e-4],
        help="lrs whose delta sizes are reported too",
    )
    parser.add_argument("--shard-size", type=int, default=4_000_000, help="bytes per shard")
    parser.add_argument("--seed", type=int, default=0, help="seed of the links")
    parser.add_argument("--loopback", action="store_true", help="do not emulate the WAN")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/broadcast_tree_cache"), help="payload cache")
    parser.add_argument(
        "--workdir", type=Path, default=Path("/tmp/broadcast_tree_runs"), help="run directories"
    )
    parser.add_argument("--keep-workdir", action="store_true", help="keep each run's logs and files")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "broadcast_tree")
    args = parser.parse_args(argv)
    from broadcast_tree_report import write_report

    payload = payloads.build(payloads.PayloadSpec(lr=args.lr, versions=args.versions), args.cache)
    sizes = {args.lr: payloads.delta_sizes(payload, args.shard_size)}
    for lr in args.sensitivity_lr:
        other = payloads.build(payloads.PayloadSpec(lr=lr, versions=args.versions), args.cache)
        sizes[lr] = payloads.delta_sizes(other, args.shard_size)
    runs = []
    for item in args.grid.split(","):
        depth, clients = (int(x) for x in item.split(":"))
        plan = plan_tree(depth, args.fanout, clients)
        for attempt in range(args.repeat):
            workdir = args.workdir / f"d{depth}-n{clients}-{attempt}-{os.getpid()}"
            workdir.mkdir(parents=True)
            result = run_tree(
                plan,
                payload,
                workdir,
                seed=args.seed,
                per_host=args.per_host,
                shard_size=args.shard_size,
                emulate=not args.loopback,
            )
            print(
                json.dumps(
                    {
                        "depth": depth,
                        "clients": clients,
                        "ok": result.ok,
                        "wall_s": round(result.wall_s, 1),
                        "time_to_all_max_s": [r.time_to_all_max_s for r in result.versions],
                    }
                ),
                flush=True,
            )
            runs.append(result)
            if not args.keep_workdir:
                shutil.rmtree(workdir, ignore_errors=True)
    write_report(args, payload, sizes, [asdict(r) for r in runs], args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
