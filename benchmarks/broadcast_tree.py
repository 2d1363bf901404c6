"""Policy broadcast through a shardcast relay tree over the emulated WAN: time-to-all by depth and N.

Issue 33 asks for time-to-all (publish -> last worker holds the version) that grows with the
depth of the relay tree, not with the number of workers N, on a payload of realistic size with
real bf16 weight deltas between RL steps. One run:

- payload (benchmarks/broadcast_tree_payload.py): K consecutive bf16 checkpoints of a
  Qwen2-shaped model (about 64 MB), one real AdamW step apart, each published with
  `shardcast.publish_file(..., delta=True)` into the origin's data directory;
- tree (`plan_tree`, benchmarks/broadcast_tree_nodes.py): `depth` tiers of relays with fan-out at most `fanout` (origin included):
  ceil(N / fanout) leaf relays, each tier above ceil(tier below / fanout) relays, the top tier
  under the origin; so for a fixed depth a larger N means more relays, not a longer path;
- processes: the origin (`shardcast origin`) and every relay (`shardcast relay`) are real
  processes, each in its own site; the N clients are `shardcast.Follower` loops, `per_host` of
  them per worker-host process (benchmarks/broadcast_tree_clients.py), each host in its own site,
  each client following its leaf relay (delta base: its previous version);
- network (benchmarks/swarm_wan.py): one namespace per site on a bridge, `tc tbf` both ways at the
  site's rate, RTT and loss added by the site's proxy. A path between two sites crosses both
  access links, so each access link gets half the issue's RTT (25-150 ms, paths 50-300 ms) and
  half its loss (0.25%, paths ~0.5%); rates 50-600 Mbit/s log-uniform; drawn from a seed, site
  by site (origin, relays tier by tier, then hosts), so the same seed gives the origin and the
  first relays the same links in every configuration. Where namespaces cannot be made it runs
  on loopback and says so;
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
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import broadcast_tree_payload as payloads
from broadcast_tree_nodes import RelayVersion, Tree, TreePlan, plan_tree, tx_bytes
from swarm_wan import open_network

from shardcast import publish_file

__all__ = ["RunResult", "TreePlan", "VersionRow", "plan_tree", "run_tree"]


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
            tx_before = {site: tx_bytes(network, site) for site in relay_sites}
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
                    tx_bytes(network, site) - tx_before[site]
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


def client_delta_cost(payload: payloads.Payload, shard_size: int, *, repeats: int) -> dict:
    """One client's fetch of version 2 as a delta against version 1, from an origin in this process
    on loopback: wall seconds and CPU seconds of this process (client and server together), and the
    load average, `repeats` times. What a worker host spends to rebuild a version from a delta."""
    from shardcast import Client, Origin

    rows = []
    with tempfile.TemporaryDirectory(prefix="broadcast-cost-") as scratch:
        work = Path(scratch)
        with Origin(work / "origin", port=0, delta=True, shard_size=shard_size) as origin:
            for path in payload.paths[:2]:
                origin.publish(path, file_name=payloads.FILE_NAME)
            client = Client([origin.url])
            first = client.fetch(1, work / "base" / payloads.FILE_NAME)
            for attempt in range(repeats):
                wall, cpu = time.monotonic(), time.process_time()
                result = client.fetch(2, work / f"delta{attempt}" / payloads.FILE_NAME, base=first.path)
                assert result.used_delta
                rows.append(
                    {
                        "wall_s": time.monotonic() - wall,
                        "cpu_s": time.process_time() - cpu,
                        "bytes": result.bytes_downloaded,
                        "file_bytes": result.manifest.file_size,
                        "load_1min": os.getloadavg()[0],
                    }
                )
    return {"shard_size": shard_size, "fetches": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--grid", default="1:16,2:16,3:16,2:64,3:64", help="depth:clients pairs, comma-separated"
    )
    parser.add_argument("--fanout", type=int, default=4, help="children per origin/relay at most")
    parser.add_argument("--per-host", type=int, default=4, help="clients per worker-host process (one site)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per configuration, run k with links drawn from seed + k (min/median reported)",
    )
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
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the links of each configuration's first run"
    )
    parser.add_argument("--loopback", action="store_true", help="do not emulate the WAN")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/broadcast_tree_cache"), help="payload cache")
    parser.add_argument(
        "--workdir", type=Path, default=Path("/tmp/broadcast_tree_runs"), help="run directories"
    )
    parser.add_argument(
        "--compare", type=Path, default=None, help="an earlier run's .json, summarised under the table"
    )
    parser.add_argument("--compare-label", default="earlier", help="what the earlier run was")
    parser.add_argument(
        "--client-cost",
        action="store_true",
        help="only measure one client's delta fetch (wall and CPU s) on loopback, into <out>_client_cost.json",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="rewrite the report from this run's .json, running nothing",
    )
    parser.add_argument("--keep-workdir", action="store_true", help="keep each run's logs and files")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "broadcast_tree")
    args = parser.parse_args(argv)
    from broadcast_tree_report import write_report

    payload = payloads.build(payloads.PayloadSpec(lr=args.lr, versions=args.versions), args.cache)
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        for key in ("grid", "fanout", "per_host", "repeat", "versions", "lr"):
            setattr(args, key, type(getattr(args, key))(saved["args"][key]))
        sizes = {
            float(lr): [payloads.DeltaSize(**row) for row in rows]
            for lr, rows in saved["delta_sizes"].items()
        }
        write_report(args, payload, sizes, saved["runs"], args.out)
        return 0
    if args.client_cost:
        cost = client_delta_cost(payload, args.shard_size, repeats=args.repeat)
        args.out.with_name(args.out.name + "_client_cost.json").write_text(json.dumps(cost, indent=1))
        print(json.dumps(cost))
        return 0
    sizes = {args.lr: payloads.delta_sizes(payload, args.shard_size)}
    for lr in args.sensitivity_lr:
        other = payloads.build(payloads.PayloadSpec(lr=lr, versions=args.versions), args.cache)
        sizes[lr] = payloads.delta_sizes(other, args.shard_size)
    runs = []
    done: dict[tuple[int, int], int] = {}
    for item in args.grid.split(","):
        depth, clients = (int(x) for x in item.split(":"))
        plan = plan_tree(depth, args.fanout, clients)
        for _ in range(args.repeat):
            attempt = done.get((depth, clients), 0)  # a configuration listed twice goes on counting
            done[(depth, clients)] = attempt + 1
            workdir = args.workdir / f"d{depth}-n{clients}-{attempt}-{os.getpid()}"
            workdir.mkdir(parents=True)
            result = run_tree(
                plan,
                payload,
                workdir,
                seed=args.seed + attempt,
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
            write_report(
                args, payload, sizes, [asdict(r) for r in runs], args.out
            )  # kept if a later run fails
            if not args.keep_workdir:
                shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
