"""Identity flood against a real orchestrator process: 10,000 registrations from 321 addresses, then
a new honest worker at its own address and one at an attacker's (issue 34, item 4; acceptance:
"10,000 registrations from 321 addresses do not stop a new honest worker from joining, and it gets
its first lease within a bounded wait").

Processes: an orchestrator (``OrchestratorServer`` on loopback, shipped ``[orchestrator]`` defaults
but ``task_timeout_s`` and ``fresh_worker_ttl_s``, shortened so the attack plays out in a minute;
the bound below is in their units), ``CLIENTS`` attacker processes and this one. Linux routes all of
127/8 to lo, so each attacker address is a real source address (``127.{1 + i // 250}.{i % 250}.7``:
every one in its own /24, the attacker's best case against the per-network cap).

1. ``flood``: the attackers send ``ATTEMPTS`` registrations round-robin over ``ADDRESSES``
   addresses (31 or 32 each, as fast as answers come).
2. ``hoard``: every identity they got asks for a lease from its address, and never answers it
   (it expires, counting as abandoned). The identities of one address, ``HOARD_ADDRESS``, keep
   asking every ``HOARD_POLL_S`` (a hoarder process): they hold every lease the address may have
   and queue for the rest, so they stay busy (never retired) until abandonment bans them.
3. ``newcomers``: an honest client registers and asks for a lease, honouring every
   ``Retry-After``: ``own`` from an address of its own, ``shared`` from ``HOARD_ADDRESS``.

The bound the code gives (``identities.newcomer_wait_bound_s``; ``F`` = ``max_fresh_workers_per_network``, ``L`` =
``ban_abandoned_leases``, ``T`` = ``task_timeout_s``, ``C`` = ``max_open_leases_per_address``):

  - ``own``: no wait. Its network holds no fresh identity and its registration bucket is full;
    ``max_workers`` is not full, since fresh identities from ``N`` networks number at most
    ``N * F`` (321 * 16 = 5,136 < 10,000); its address has no open lease, so its first ask
    leases.
  - ``shared``: its network's ``F`` fresh identities are the hoarders'. One leaves when it is
    banned (its ``L``-th abandoned lease) or retires (idle past ``fresh_worker_ttl_s``). Busy ones
    hold or queue for the address's leases, of which at least one is always open to them, so at
    most ``F * (L - 1) + 1`` leases of ``T`` expire before one of them is banned; the client
    sleeps at most one more ``Retry-After`` of the network cap (``min(60 s, ttl)``): registered
    within ``(F * (L - 1) + 1) * T + min(60 s, ttl)``. Then it queues behind at most ``F - 1``
    hoarders, each taking one lease of at most ``T`` on at least one slot, and sleeps at most one
    more ``Retry-After`` of the queue (``min(10 s, T)``): leased within ``F * T + min(10 s, T)``
    more. In all ``(F * L + 1) * T + min(60 s, ttl) + min(10 s, T)`` (shipped values:
    49 * 300 + 60 + 10 s = 4.1 h), plus the expiry loop's ticks. This holds while the attacker makes no new identity on that /24 and brings none registered
    elsewhere to the address; one that does can take each freed slot first (a shared network
    shares its registrations) and lengthen the queue by one lease per identity it brings.

Run: ``.venv/bin/python benchmarks/identity_flood.py`` (2.5 minutes at load average 50). Writes
``benchmarks/results/identity_flood.{json,md}``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ATTEMPTS = 10_000
ADDRESSES = 321
CLIENTS = 4
TASK_TIMEOUT_S = 1.0
FRESH_TTL_S = 120.0
HOARD_ADDRESS = "127.1.0.7"
HOARD_POLL_S = 0.2
OWN_ADDRESS = "127.9.0.9"
ROOT = Path(__file__).resolve().parents[1]


def attacker_address(i: int) -> str:
    return f"127.{1 + i // 250}.{i % 250}.7"


class Client:
    """One keep-alive HTTP connection from one source address."""

    def __init__(self, url: str, source: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=30, source_address=(source, 0))

    def call(self, method: str, path: str, body: bytes = b"", token: str = "") -> tuple[int, dict[str, Any], float]:
        """(status, JSON answer, Retry-After seconds or 0)."""
        headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
        self.connection.request(method, path, body=body or None, headers=headers)
        response = self.connection.getresponse()
        answer = json.loads(response.read())
        return response.status, answer, float(response.headers.get("Retry-After") or 0)

    def register(self, name: str) -> tuple[int, dict[str, Any], float]:
        return self.call("POST", "/workers/register", json.dumps({"name": name}).encode())

    def lease(self, identity: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
        return self.call("GET", f"/tasks?worker_id={identity['worker_id']}", token=identity["token"])


def _serve(run_dir: Path) -> None:
    """Child: serve an empty orchestrator, print the URL, wait for stdin EOF."""
    from prime_rl.config import load_config
    from prime_rl.orchestrator.identities import newcomer_wait_bound_s

    def shared_bound(fresh_cap: int, bans_at: int, task_timeout_s: float, ttl_s: float) -> float:
        return newcomer_wait_bound_s(
            max_fresh_per_network=fresh_cap, ban_abandoned_leases=bans_at, task_timeout_s=task_timeout_s, ttl_s=ttl_s
        )
    from prime_rl.orchestrator.server import OrchestratorServer
    from prime_rl.tasks import TaskSet

    overrides = ["--orchestrator.task_timeout_s", str(TASK_TIMEOUT_S), "--orchestrator.fresh_worker_ttl_s", str(FRESH_TTL_S)]
    config = load_config(None, ["--run_dir", str(run_dir), "--orchestrator.port", "0", *overrides])
    tasks = TaskSet([{"prompt": f"{i} + {i} = ?", "answer": str(2 * i)} for i in range(64)])
    with OrchestratorServer(config, tasks) as server:
        print(server.url, flush=True)
        sys.stdin.read()


def _flood(url: str, part: int, out: Path) -> None:
    """Child: this part's addresses send their share of the registrations, then every identity
    they got (but the hoarder's address's) takes one lease it never answers."""
    addresses = [i for i in range(ADDRESSES) if i % CLIENTS == part]
    identities, refusals, started = [], {}, time.monotonic()
    for i in addresses:
        address = attacker_address(i)
        client = Client(url, address)
        for attempt in range(i, ATTEMPTS, ADDRESSES):
            status, answer, _ = client.register(f"sybil-{attempt}")
            if status == 200:
                identities.append(answer | {"address": address})
            else:
                key = f"{status} {answer.get('error')}"
                refusals[key] = refusals.get(key, 0) + 1
    flood_s = time.monotonic() - started
    leased, clients = 0, {}
    for identity in identities:
        if identity["address"] == HOARD_ADDRESS:
            continue
        client = clients.setdefault(identity["address"], Client(url, identity["address"]))
        leased += client.lease(identity)[0] == 200
    out.write_text(json.dumps({"identities": identities, "refusals": refusals, "flood_s": flood_s,
                               "leased": leased, "hoard_s": time.monotonic() - started - flood_s}))  # fmt: skip


def _hoard(url: str, identities_file: Path, seconds: float, out: Path) -> None:
    """Child: the identities at ``HOARD_ADDRESS`` ask for a lease every ``HOARD_POLL_S`` and never
    answer one, until banned or ``seconds`` pass."""
    identities = [i for i in json.loads(identities_file.read_text()) if i["address"] == HOARD_ADDRESS]
    client, leases, banned = Client(url, HOARD_ADDRESS), 0, {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(banned) < len(identities):
        for identity in identities:
            if identity["worker_id"] in banned:
                continue
            status, _, _ = client.lease(identity)
            leases += status == 200
            if status in (403, 404):
                banned[identity["worker_id"]] = status
        time.sleep(HOARD_POLL_S)
    out.write_text(json.dumps({"identities": len(identities), "leases": leases, "banned": len(banned)}))


def _newcomer(url: str, address: str, deadline_s: float) -> dict[str, Any]:
    """An honest client at ``address``: register, then ask for a lease, sleeping each Retry-After."""
    client, started = Client(url, address), time.monotonic()
    result: dict[str, Any] = {"address": address, "register_attempts": 0, "lease_attempts": 0, "refusals": {}}
    identity = None
    while time.monotonic() - started < deadline_s:
        if identity is None:
            result["register_attempts"] += 1
            status, answer, retry = client.register("honest")
            if status == 200:
                identity = answer
                result["registered_s"] = round(time.monotonic() - started, 3)
                continue
        else:
            result["lease_attempts"] += 1
            status, answer, retry = client.lease(identity)
            if status == 200:
                result["leased_s"] = round(time.monotonic() - started, 3)
                result["batch_index"] = answer["batch_index"]
                return result
        key = f"{status} {answer.get('error')}"
        result["refusals"][key] = result["refusals"].get(key, 0) + 1
        time.sleep(max(retry, 0.05))
    return result


def _totals(url: str) -> dict[str, Any]:
    _, answer, _ = Client(url, "127.0.0.1").call("GET", "/workers?limit=1")
    return answer["totals"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=Path)
    parser.add_argument("--flood", nargs=3)
    parser.add_argument("--hoard", nargs=4)
    args = parser.parse_args()
    if args.serve:
        return _serve(args.serve)
    if args.flood:
        return _flood(args.flood[0], int(args.flood[1]), Path(args.flood[2]))
    if args.hoard:
        return _hoard(args.hoard[0], Path(args.hoard[1]), float(args.hoard[2]), Path(args.hoard[3]))
    from prime_rl.config import load_config
    from prime_rl.orchestrator.identities import newcomer_wait_bound_s

    def shared_bound(fresh_cap: int, bans_at: int, task_timeout_s: float, ttl_s: float) -> float:
        return newcomer_wait_bound_s(
            max_fresh_per_network=fresh_cap, ban_abandoned_leases=bans_at, task_timeout_s=task_timeout_s, ttl_s=ttl_s
        )

    orch = load_config(None, []).orchestrator
    fresh_cap, bans_at = orch.max_fresh_workers_per_network, orch.ban_abandoned_leases
    results: dict[str, Any] = {
        "attempts": ATTEMPTS, "addresses": ADDRESSES, "clients": CLIENTS, "task_timeout_s": TASK_TIMEOUT_S,
        "fresh_worker_ttl_s": FRESH_TTL_S, "max_fresh_workers_per_network": fresh_cap,
        "ban_abandoned_leases": bans_at, "max_open_leases_per_address": orch.max_open_leases_per_address,
        "max_workers": orch.max_workers, "register_rate_per_minute": orch.register_rate_per_minute,
        "register_burst": orch.register_burst, "shipped_task_timeout_s": orch.task_timeout_s,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "load_average_before": [round(x, 1) for x in os.getloadavg()],
    }  # fmt: skip
    me = str(Path(__file__).resolve())
    deadline_s = shared_bound(fresh_cap, bans_at, TASK_TIMEOUT_S, FRESH_TTL_S) + 30
    # The store on tmpfs where there is one: its fsyncs pace the flood, not the admission rules measured.
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        work = Path(tmp)
        server = subprocess.Popen(
            [sys.executable, me, "--serve", str(work / "run")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )  # fmt: skip
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip()
            if not url.startswith("http://"):
                raise RuntimeError("the orchestrator did not start")
            outs = [work / f"flood-{part}.json" for part in range(CLIENTS)]
            flooders = [subprocess.Popen([sys.executable, me, "--flood", url, str(part), str(out)])
                        for part, out in enumerate(outs)]  # fmt: skip
            for flooder in flooders:
                flooder.wait(600)
            floods = [json.loads(out.read_text()) for out in outs]
            identities = [identity for flood in floods for identity in flood["identities"]]
            (work / "identities.json").write_text(json.dumps(identities))
            refusals: dict[str, int] = {}
            for flood in floods:
                for key, count in flood["refusals"].items():
                    refusals[key] = refusals.get(key, 0) + count
            results["flood"] = {
                "admitted": len(identities), "refusals": refusals,
                "networks": len({identity["address"].rsplit(".", 1)[0] for identity in identities}),
                "seconds": round(max(flood["flood_s"] for flood in floods), 2),
                "leased": sum(flood["leased"] for flood in floods),
                "hoard_seconds": round(max(flood["hoard_s"] for flood in floods), 2),
                "totals_after": _totals(url),
            }  # fmt: skip
            print("flood", json.dumps(results["flood"]), flush=True)
            hoard_out = work / "hoard.json"
            hoarder = subprocess.Popen([sys.executable, me, "--hoard", url, str(work / "identities.json"),
                                        str(deadline_s + 5), str(hoard_out)])  # fmt: skip
            time.sleep(2 * TASK_TIMEOUT_S)  # its identities hold the address's leases and queue for them
            results["own"] = _newcomer(url, OWN_ADDRESS, deadline_s)
            print("own", json.dumps(results["own"]), flush=True)
            results["shared"] = _newcomer(url, HOARD_ADDRESS, deadline_s)
            print("shared", json.dumps(results["shared"]), flush=True)
            hoarder.terminate()
            hoarder.wait(30)
            results["hoarder"] = json.loads(hoard_out.read_text()) if hoard_out.exists() else {}
            results["totals_end"] = _totals(url)
        finally:
            if server.stdin is not None:
                server.stdin.close()
            server.wait(30)
    results["bound_s"] = {
        "own": 0.0,
        "shared_register": (fresh_cap * (bans_at - 1) + 1) * TASK_TIMEOUT_S + min(60.0, FRESH_TTL_S),
        "shared": shared_bound(fresh_cap, bans_at, TASK_TIMEOUT_S, FRESH_TTL_S),
        "shared_shipped": shared_bound(fresh_cap, bans_at, orch.task_timeout_s, orch.fresh_worker_ttl_s),
    }
    results["load_average_after"] = [round(x, 1) for x in os.getloadavg()]
    out = ROOT / "benchmarks" / "results"
    (out / "identity_flood.json").write_text(json.dumps(results, indent=2) + "\n")
    flood, own, shared, bound = results["flood"], results["own"], results["shared"], results["bound_s"]
    lines = [
        f"# Identity flood: {ATTEMPTS:,} registrations from {ADDRESSES} addresses, then two new honest workers",
        "",
        f"Machine: {results['machine']}, load average (1, 5, 15 min) {results['load_average_before']} before, "
        f"{results['load_average_after']} after. Shipped `[orchestrator]` defaults (max_workers {orch.max_workers:,}, "
        f"max_fresh_workers_per_network {fresh_cap}, register {orch.register_burst} at once then "
        f"{orch.register_rate_per_minute:g}/min per /24, max_open_leases_per_address {orch.max_open_leases_per_address}, "
        f"ban_abandoned_leases {bans_at}) but task_timeout_s {TASK_TIMEOUT_S:g} (shipped {orch.task_timeout_s:g}) and "
        f"fresh_worker_ttl_s {FRESH_TTL_S:g} (longer than the flood: none of its identities retires before the "
        "newcomers come), the store on tmpfs. Written by `benchmarks/identity_flood.py` (bound: its docstring).",
        "",
        f"Flood: {flood['admitted']:,} identities admitted from {flood['networks']} networks in {flood['seconds']} s, "
        f"refused: {flood['refusals']}; then {flood['leased']:,} of them took a lease each and abandoned it "
        f"({flood['hoard_seconds']} s). Table after: {flood['totals_after']}.",
        f"Hoarder at {HOARD_ADDRESS}: {results['hoarder']}. Table at the end: {results['totals_end']}.",
        "",
        "| newcomer | address | registered after s | first lease after s | bound s | register tries | lease tries | refusals |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, result, limit in (("own address", own, bound["own"]), ("an attacker's address", shared, bound["shared"])):
        lines.append(
            f"| {label} | {result['address']} | {result.get('registered_s', 'never')} | {result.get('leased_s', 'never')} | "
            f"{limit:g} | {result['register_attempts']} | {result['lease_attempts']} | {result['refusals']} |"
        )
    lines += [
        "",
        f"Bound at an attacker's address (F = {fresh_cap}, L = {bans_at}, T = {TASK_TIMEOUT_S:g} s, ttl = "
        f"{FRESH_TTL_S:g} s): registered within (F(L-1)+1)T + min(60 s, ttl) = {bound['shared_register']:g} s, "
        f"leased within (FL+1)T + min(60 s, ttl) + min(10 s, T) = {bound['shared']:g} s; with the shipped "
        f"task_timeout_s {orch.task_timeout_s:g} and fresh_worker_ttl_s {orch.fresh_worker_ttl_s:g}: "
        f"{bound['shared_shipped']:,.0f} s.",
    ]
    (out / "identity_flood.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
