"""benchmarks/swarm_wan.py: sites in namespaces measure the RTT and bandwidth they were given, reach
nothing but the bridge, go down when cut, and leave nothing behind.

The namespace tests need root, `ip` and `tc`; they skip with the reason otherwise. The proxy and the
loopback fallback are tested everywhere.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import swarm_wan
import swarm_wan_probe

BENCHMARKS = swarm_wan.PROXY.parent

RTT_S = 0.1
MBIT = 20.0


def our_names() -> tuple[set[str], set[str]]:
    """Namespaces and links of this module that exist now (any pid)."""
    namespaces = {
        line.split()[0] for line in swarm_wan.run_ip("ip", "netns", "list").splitlines() if line.strip()
    }
    links = json.loads(swarm_wan.run_ip("ip", "-j", "link", "show"))
    aliased = {link["ifname"] for link in links if link.get("ifalias", "").startswith(swarm_wan.ALIAS)}
    return {name for name in namespaces if swarm_wan.NAMESPACE.match(name)}, aliased


@pytest.fixture(scope="module")
def wan() -> Iterator[swarm_wan.SwarmNetwork]:
    why = swarm_wan.why_not_emulated()
    if why:
        pytest.skip(f"namespaces unavailable: {why}")
    network = swarm_wan.open_network(
        2, seed=1, rtt_ms=(RTT_S * 1e3, RTT_S * 1e3), mbit=(MBIT, MBIT), loss=0.0, flaky_share=0
    )
    if not network.emulated:
        pytest.skip(network.description)
    yield network
    network.close()


@pytest.fixture(scope="module")
def root_server(wan: swarm_wan.SwarmNetwork) -> Iterator[str]:
    server = swarm_wan_probe.start_server(wan.server_host)
    yield f"http://{wan.server_host}:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def site0(wan: swarm_wan.SwarmNetwork, root_server: str) -> dict:
    # 2 s at the link's rate each way: long enough that tbf's 80 KiB burst is 3% of it
    return swarm_wan_probe.run_probe(wan, 0, root_server, bulk_bytes=int(MBIT * 1e6 / 8 * 2), bulk_s=6.0)


def run_in_site(wan: swarm_wan.SwarmNetwork, site: int, code: str, timeout_s: float = 30) -> str:
    argv = wan.command(site, [sys.executable, "-I", "-c", textwrap.dedent(code)])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_request_takes_the_configured_round_trip(site0: dict) -> None:
    # kept alive: one RTT (RTT/2 each way); fresh: the handshake's RTT more
    assert site0["rtt_min_s"] >= 0.9 * RTT_S and site0["rtt_median_s"] < RTT_S + 0.15
    assert 1.8 * RTT_S <= site0["fresh_s"] < 2 * RTT_S + 0.3


def test_bulk_transfers_are_bounded_by_the_tbf_rate(site0: dict) -> None:
    for direction in ("down_mbit", "up_mbit"):
        assert 0.5 * MBIT < site0[direction] <= 1.15 * MBIT, (direction, site0[direction])


def test_the_server_sees_the_site_address(wan: swarm_wan.SwarmNetwork, site0: dict) -> None:
    assert site0["client"] == wan.site_host(0) == wan.links[0].address
    assert wan.site_host(0).rsplit(".", 2)[1] == "1" and wan.site_host(1).rsplit(".", 2)[1] == "2"  # own /24s


def test_a_server_in_one_site_is_reached_over_both_access_links(wan: swarm_wan.SwarmNetwork) -> None:
    argv = wan.command(
        1, [sys.executable, "-I", str(BENCHMARKS / "swarm_wan_probe.py"), "serve", wan.site_host(1)]
    )
    relay = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert relay.stdout is not None
        port = json.loads(relay.stdout.readline())["port"]
        result = swarm_wan_probe.run_probe(
            wan, 0, f"http://{wan.site_host(1)}:{port}/", bulk_bytes=1 << 16, bulk_s=2.0
        )
    finally:
        relay.stdin.close()  # type: ignore[union-attr]
        relay.wait(timeout=10)
    assert result["client"] == wan.site_host(0)
    assert 0.9 * 2 * RTT_S <= result["rtt_min_s"] < 2 * RTT_S + 0.15  # site 0's RTT plus site 1's


def test_a_site_has_no_route_out(wan: swarm_wan.SwarmNetwork) -> None:
    out = run_in_site(
        wan,
        0,
        """
        import socket, time
        for host in ("1.1.1.1", "192.0.2.1", "8.8.8.8"):
            started = time.perf_counter()
            try:
                socket.create_connection((host, 80), timeout=5).close()
                print(host, "connected", flush=True)
            except OSError as error:
                print(host, error.errno, round(time.perf_counter() - started, 3), flush=True)
        """,
    )
    for line in out.splitlines():
        _host, errno, seconds = line.split()
        assert errno == "101" and float(seconds) < 0.5, line  # ENETUNREACH at once: no route, nothing sent
    routes = swarm_wan.run_ip("ip", "-n", wan.links[0].namespace, "route")
    assert "default" not in routes and routes.count("\n") == 1, routes


def test_a_cut_link_fails_requests_until_it_is_restored(
    wan: swarm_wan.SwarmNetwork, root_server: str
) -> None:
    url = wan.url(1, root_server) + "ping"
    cut_at = time.monotonic()  # CLOCK_MONOTONIC: the same clock in the site's process
    wan.cut(1, 4.0)
    out = run_in_site(
        wan,
        1,
        f"""
        import time, urllib.request
        def get(timeout):
            try:
                return urllib.request.urlopen({url!r}, timeout=timeout).status
            except OSError as error:
                return type(error).__name__
        print(round(time.monotonic() - {cut_at}, 2), get(1.0), flush=True)  # during the outage
        print(get(10.0), flush=True)         # sent during it: TCP retransmits through, as over a WAN
        time.sleep(max(0.0, {cut_at} + 4.5 - time.monotonic()))
        print([get(5.0) for _ in range(2)], flush=True)  # after it
        """,
    )
    during, through, after = out.splitlines()
    started_s, during_status = during.split()
    assert float(started_s) < 3.0, f"the site's process started too late to test the outage: {out}"
    assert during_status != "200" and through == "200", out
    assert after == "[200, 200]", out
    assert time.monotonic() - cut_at >= 4.0


def test_close_leaves_no_namespace_link_or_proxy() -> None:
    if why := swarm_wan.why_not_emulated():
        pytest.skip(f"namespaces unavailable: {why}")
    network = swarm_wan.open_network(2, seed=3)
    assert isinstance(network, swarm_wan.NamespaceNetwork)
    namespaces, links = our_names()
    mine = {link.namespace for link in network.links}
    assert mine <= namespaces and len(links) >= 3  # bridge + 2 ports (others' may exist too)
    proxies = [proxy.pid for proxy in network._proxies]
    network.close()
    network.close()  # idempotent
    namespaces_after, links_after = our_names()
    assert not mine & namespaces_after
    assert not {network._bridge, network._port(0), network._port(1)} & links_after
    assert all(not swarm_wan._alive(pid) for pid in proxies)


def test_sigterm_tears_down_and_stale_leftovers_are_removed(tmp_path: Path) -> None:
    if why := swarm_wan.why_not_emulated():
        pytest.skip(f"namespaces unavailable: {why}")
    script = f"""
        import os, sys, time
        sys.path.insert(0, {str(BENCHMARKS)!r})
        import swarm_wan
        network = swarm_wan.open_network(2, seed=4)
        print(network.emulated, flush=True)
        if sys.argv[1] == "crash":
            os._exit(0)  # no atexit, no handler: leftovers for cleanup_stale
        time.sleep(60)
        """
    for mode in ("sigterm", "crash"):
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script), mode], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "True"
        prefix = f"swan-{child.pid}-"
        assert any(name.startswith(prefix) for name in our_names()[0])
        if mode == "sigterm":
            child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=20) == (-signal.SIGTERM if mode == "sigterm" else 0)
        if mode == "crash":
            assert any(name.startswith(prefix) for name in our_names()[0])
            removed = swarm_wan.cleanup_stale()
            # its 2 namespaces (their veths go with them) and its bridge
            assert sum(name.startswith(prefix) for name in removed) == 2 and len(removed) >= 3, removed
        namespaces, _links = our_names()
        assert not any(name.startswith(prefix) for name in namespaces)
        aliases = json.loads(swarm_wan.run_ip("ip", "-j", "link", "show"))
        assert not [link for link in aliases if link.get("ifalias") == f"{swarm_wan.ALIAS}{child.pid}"]


def test_the_proxy_adds_the_round_trip_and_stalls_on_loss() -> None:
    """Runs in this namespace (no root needed): one RTT per kept-alive request, plus 2 RTOs when every chunk is lost."""
    server = swarm_wan_probe.start_server("127.0.0.1")
    proxy = subprocess.Popen(
        [sys.executable, "-I", str(swarm_wan.PROXY), "--seed", "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    try:
        assert swarm_wan._read_reply(proxy, 15) == {"ready": True}
        timings = {}
        for loss in (0.0, 1.0):
            assert proxy.stdin is not None
            proxy.stdin.write(
                json.dumps(
                    {"host": "127.0.0.1", "port": server.server_address[1], "rtt_ms": 100, "loss": loss}
                )
                + "\n"
            )
            port = swarm_wan._read_reply(proxy, 15)["port"]
            timings[loss] = swarm_wan_probe.probe(f"http://127.0.0.1:{port}/", bulk_bytes=1 << 16, bulk_s=5.0)
    finally:
        server.shutdown()
        proxy.stdin.close()  # type: ignore[union-attr]
        proxy.wait(timeout=10)
    assert 0.09 <= timings[0.0]["rtt_min_s"] < 0.1 + 0.15
    # every chunk lost: RTT/2 + RTO each way, RTO = max(200 ms, RTT) = 200 ms -> 100 + 2 * 200 ms
    assert 0.5 * 0.98 <= timings[1.0]["rtt_min_s"] < 0.5 + 0.15


def test_loopback_fallback_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(swarm_wan.os, "geteuid", lambda: 1000)
    network = swarm_wan.open_network(3, seed=0)
    assert not network.emulated and "loopback (not root)" in network.description
    assert network.sites() == 3 and network.server_host == network.site_host(2) == "127.0.0.1"
    assert network.command(1, ["worker"]) == ["worker"]
    assert network.url(1, "http://127.0.0.1:8000/tasks") == "http://127.0.0.1:8000/tasks"
    network.cut(0, 1.0)
    network.close()
    off = swarm_wan.open_network(2, seed=0, emulate=False)
    assert not off.emulated and "emulation off" in off.description


def test_links_are_drawn_from_the_seed_within_the_ranges() -> None:
    draws = swarm_wan.draw_links(50, 7, rtt_ms=(50, 300), mbit=(50, 600), loss=0.005, flaky_share=0.1)
    assert draws == swarm_wan.draw_links(50, 7, rtt_ms=(50, 300), mbit=(50, 600), loss=0.005, flaky_share=0.1)
    assert draws != swarm_wan.draw_links(50, 8, rtt_ms=(50, 300), mbit=(50, 600), loss=0.005, flaky_share=0.1)
    assert all(50 <= rtt <= 300 and 50 <= rate <= 600 and loss == 0.005 for rtt, rate, loss, _ in draws)
    assert sum(flaky for *_, flaky in draws) == 5
    with pytest.raises(ValueError, match="sites must be"):
        swarm_wan.open_network(0, seed=0)


def test_nothing_of_a_live_process_is_cleaned_as_stale(wan: swarm_wan.SwarmNetwork) -> None:
    removed = swarm_wan.cleanup_stale()
    assert not {link.namespace for link in wan.links} & set(removed)
    assert {link.namespace for link in wan.links} <= our_names()[0]
