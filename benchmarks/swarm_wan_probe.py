"""Measures the emulated WAN of benchmarks/swarm_wan.py: a tiny HTTP server and a client that runs in a site.

- `serve HOST`: an HTTP server on HOST (port printed as {"port": p}): GET /ping answers the client's
  address; GET /bulk?bytes=N sends N bytes; POST /sink reads the body and answers its size.
- `probe URL`: from inside a site, through the URL its proxy gives: a request on a fresh
  connection, REQUESTS requests on one kept-alive connection (min and median seconds), a bulk
  download and a bulk upload (Mbit/s), each bounded in bytes and in seconds. Prints one JSON line.
- `load URL --clients N --seconds S`: N threads looping GET on their own kept-alive connections;
  requests/s and p50/p99 seconds (client, proxy and server are all Python: the sum is measured).
- `--selftest [--out FILE]`: opens a network, probes every site from the root server, prints the
  configured against the measured RTT and bandwidth, concurrent clients in one site, and the proxy's
  own cost on loopback (Markdown tables, also written to FILE).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

REQUESTS = 5
BLOCK = 256 * 1024


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the RTT probe reuses one connection
    disable_nagle_algorithm = True  # headers and body are two writes: Nagle + delayed ACK would add 40 ms

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path == "/ping":
            self._answer(json.dumps({"client": self.client_address[0]}).encode())
            return
        size = int(parse_qs(parts.query)["bytes"][0])
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        block = b"x" * BLOCK
        with_error = False
        while size > 0 and not with_error:
            try:
                self.wfile.write(block[: min(size, BLOCK)])
            except OSError:
                with_error = True  # the client stopped reading at its time bound
            size -= BLOCK

    def do_POST(self) -> None:
        size, left = 0, int(self.headers["Content-Length"])
        while left > 0 and (chunk := self.rfile.read(min(left, BLOCK))):
            size, left = size + len(chunk), left - len(chunk)
        self._answer(json.dumps({"bytes": size}).encode())


class ProbeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # listen backlog; the default 5 drops SYNs of a burst of clients (1 s retries)

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client gone at its time bound is no error
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def start_server(host: str) -> ThreadingHTTPServer:
    """The probe server on (host, free port) in a daemon thread; stop it with .shutdown()."""
    server = ProbeServer((host, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def probe(url: str, bulk_bytes: int, bulk_s: float, timeout_s: float = 20.0) -> dict:
    """RTT and bandwidth from here to the probe server at `url` (through a site proxy)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    started = time.perf_counter()
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    connection.request("GET", "/ping")
    client = json.loads(connection.getresponse().read())["client"]
    fresh_s = time.perf_counter() - started
    times = []
    for _ in range(REQUESTS):
        started = time.perf_counter()
        connection.request("GET", "/ping")
        connection.getresponse().read()
        times.append(time.perf_counter() - started)
    connection.close()
    return {
        "client": client,
        "fresh_s": fresh_s,
        "rtt_min_s": min(times),
        "rtt_median_s": statistics.median(times),
        "down_mbit": _download(host, port, bulk_bytes, bulk_s, timeout_s),
        "up_mbit": _upload(host, port, bulk_bytes, bulk_s, timeout_s),
    }


def _download(host: str, port: int, size: int, bound_s: float, timeout_s: float) -> float:
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    connection.request("GET", f"/bulk?bytes={size}")
    response = connection.getresponse()
    first = response.read(1)  # the clock starts at the first byte: the rate, not the request's RTT
    started, received = time.perf_counter(), len(first)
    while received < size and time.perf_counter() - started < bound_s and (chunk := response.read1(BLOCK)):
        received += len(chunk)
    elapsed = time.perf_counter() - started
    connection.close()
    return received * 8 / elapsed / 1e6


def _upload(host: str, port: int, size: int, bound_s: float, timeout_s: float) -> float:
    """Upload rate on a kept-alive connection: the time to the server's answer less one request round trip."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    connection.request("GET", "/ping")  # the handshake is over before the clock starts
    connection.getresponse().read()
    started = time.perf_counter()
    connection.request("GET", "/ping")  # a kept-alive request: the round trip to subtract
    connection.getresponse().read()
    round_trip_s = time.perf_counter() - started
    block = b"y" * BLOCK
    started = time.perf_counter()
    connection.putrequest("POST", "/sink")
    connection.putheader("Content-Length", str(size))
    connection.endheaders()
    sent = 0
    while sent < size and time.perf_counter() - started < bound_s:
        connection.send(block[: min(BLOCK, size - sent)])
        sent += min(BLOCK, size - sent)
    if sent < size:  # time bound: what was handed over in it (a slight overestimate: some is in flight)
        connection.close()
        return sent * 8 / (time.perf_counter() - started) / 1e6
    received = json.loads(connection.getresponse().read())["bytes"]
    connection.close()
    return received * 8 / max(1e-6, time.perf_counter() - started - round_trip_s) / 1e6


def load(url: str, clients: int, seconds: float, timeout_s: float = 20.0) -> dict:
    """`clients` threads, each looping GET /ping on its own kept-alive connection for `seconds`."""
    parts = urlsplit(url)
    times: list[float] = []
    deadline = time.perf_counter() + seconds

    def client() -> None:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=timeout_s)
        connection.request("GET", "/ping")  # the connection's setup (2 RTT) is not a kept-alive request
        connection.getresponse().read()
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            connection.request("GET", "/ping")
            connection.getresponse().read()
            times.append(time.perf_counter() - started)
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 2 * timeout_s)
    times.sort()
    return {
        "requests_per_s": len(times) / seconds,
        "p50_s": times[len(times) // 2],
        "p99_s": times[min(len(times) - 1, int(len(times) * 0.99))],
    }


def run_in_site(network: object, site: int, args: list[str]) -> dict:
    """Runs this script with `args` inside `site` (a fresh process there) and returns its JSON."""
    argv = [sys.executable, "-I", str(Path(__file__)), *args]
    done = subprocess.run(network.command(site, argv), capture_output=True, text=True, timeout=120)  # type: ignore[attr-defined]
    if done.returncode != 0:
        raise RuntimeError(f"probe in site {site} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def run_probe(network: object, site: int, url: str, bulk_bytes: int, bulk_s: float) -> dict:
    """Runs `probe` inside `site` through its proxy and returns its JSON."""
    proxied = network.url(site, url)  # type: ignore[attr-defined]
    return run_in_site(
        network, site, ["probe", proxied, "--bytes", str(bulk_bytes), "--seconds", str(bulk_s)]
    )


def proxy_overhead_rows(clients: tuple[int, ...] = (16, 64), seconds: float = 3.0) -> list[str]:
    """Kept-alive GETs on loopback, straight to the server and through a proxy set to 0 ms RTT."""
    from swarm_wan import PROXY, _read_reply

    server = start_server("127.0.0.1")
    argv = [sys.executable, "-I", str(PROXY), "--seed", "0"]
    proxy = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    rows = ["| clients | path | requests/s | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    try:
        assert proxy.stdin is not None and _read_reply(proxy, 15) == {"ready": True}
        upstream = {"host": "127.0.0.1", "port": server.server_address[1], "rtt_ms": 0, "loss": 0}
        proxy.stdin.write(json.dumps(upstream) + "\n")
        paths = {"direct": server.server_address[1], "proxy": _read_reply(proxy, 15)["port"]}
        for count in clients:
            for name, port in paths.items():
                argv = [sys.executable, "-I", __file__, "load", f"http://127.0.0.1:{port}/ping"]
                argv += ["--clients", str(count), "--seconds", str(seconds)]
                result = json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout)
                rows.append(
                    f"| {count} | {name} | {result['requests_per_s']:.0f} | {result['p50_s'] * 1e3:.1f} | "
                    f"{result['p99_s'] * 1e3:.1f} |"
                )
                print(rows[-1], flush=True)
    finally:
        server.shutdown()
        if proxy.stdin is not None:
            proxy.stdin.close()
        proxy.wait(timeout=10)
    return rows


def selftest_main(argv: list[str]) -> int:
    from swarm_wan import open_network

    parser = argparse.ArgumentParser(description="configured against measured RTT and bandwidth per site")
    parser.add_argument("--selftest", action="store_true", required=True)
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=3.0, help="bound of each bulk transfer")
    parser.add_argument("--rtt-ms", type=float, nargs=2, default=(50, 300), help="range of the RTTs drawn")
    parser.add_argument("--mbit", type=float, nargs=2, default=(50, 600), help="range of the rates drawn")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    network = open_network(args.sites, args.seed, rtt_ms=tuple(args.rtt_ms), mbit=tuple(args.mbit), loss=0.0)
    try:
        server = start_server(network.server_host)
        url = f"http://{network.server_host}:{server.server_address[1]}/"
        rows = [
            "| site | RTT ms (set) | request ms min / median | fresh connection ms | "
            "Mbit/s (set) | down Mbit/s | up Mbit/s | down / up Mbit/s, tbf alone |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for link in network.links:
            # 3 s at the link's rate, at most 64 MiB: bounded in bytes and in time
            bulk = min(int(link.mbit * 1e6 / 8 * args.seconds), 64 << 20)
            result = run_probe(network, link.site, url, bulk, args.seconds)
            # The same transfers straight to the server's address (the bridge is reachable): no proxy.
            direct = run_in_site(
                network, link.site, ["probe", url, "--bytes", str(bulk), "--seconds", str(args.seconds)]
            )
            rows.append(
                f"| {link.site} | {link.rtt_ms:.0f} | {result['rtt_min_s'] * 1e3:.0f} / "
                f"{result['rtt_median_s'] * 1e3:.0f} | {result['fresh_s'] * 1e3:.0f} | {link.mbit:.0f} | "
                f"{result['down_mbit']:.1f} | {result['up_mbit']:.1f} | "
                f"{direct['down_mbit']:.1f} / {direct['up_mbit']:.1f} |"
            )
            print(rows[-1], flush=True)
        load_rows = [
            "| site | RTT ms (set) | clients | requests/s | p50 ms | p99 ms |",
            "|---|---|---|---|---|---|",
        ]
        for clients in (1, 16, 64):
            link = network.links[0]
            result = run_in_site(
                network,
                0,
                ["load", network.url(0, url) + "ping", "--clients", str(clients), "--seconds", "3"],
            )
            load_rows.append(
                f"| {link.site} | {link.rtt_ms:.0f} | {clients} | {result['requests_per_s']:.0f} | "
                f"{result['p50_s'] * 1e3:.0f} | {result['p99_s'] * 1e3:.0f} |"
            )
            print(load_rows[-1], flush=True)
        server.shutdown()
    finally:
        network.close()
    overhead_rows = proxy_overhead_rows()
    load = os.getloadavg()
    text = "\n".join(
        [
            f"# swarm_wan selftest ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
            "",
            f"Command: `python benchmarks/swarm_wan_probe.py {' '.join(argv)}` "
            f"(loss set to 0 so the RTT column is the delay alone).",
            f"Network: {network.description}",
            f"Machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the end.",
            "",
            *rows,
            "",
            "Concurrent kept-alive clients in one site (the proxy's overhead on top of the RTT, "
            "one Python process per site):",
            "",
            *load_rows,
            "",
            "The proxy's own cost: loopback, one proxy process at 0 ms RTT against the same clients straight "
            "to the server:",
            "",
            *overhead_rows,
            "",
            "Reading it:",
            "- tbf counts whole frames: TCP payload is at most 1448/1514 = 95.6% of the set rate. "
            "The last column bypasses the proxy (a site can reach the bridge address directly): where the "
            "proxied rate falls below it, the Python proxy (CPU) is the limit.",
            "- request ms is one kept-alive GET (RTT/2 each way in the proxy) plus the Python client, "
            "proxy and server on this loaded machine; a fresh connection adds the handshake's RTT.",
            "- one site's proxy is one Python process (asyncio); its cost is the last table; tails (p99) "
            "move with this machine's load (load average above, 2 cores shared with other jobs).",
            "- loss is 0 here so the RTT column is the delay alone; tests/test_swarm_wan.py checks the loss stall.",
            "",
        ]
    )
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        server = start_server(sys.argv[2])
        print(json.dumps({"port": server.server_address[1]}), flush=True)
        sys.stdin.read()  # until the parent closes stdin
    elif sys.argv[1:2] in (["probe"], ["load"]):
        parser = argparse.ArgumentParser()
        parser.add_argument("mode")
        parser.add_argument("url")
        parser.add_argument("--bytes", type=int)
        parser.add_argument("--clients", type=int)
        parser.add_argument("--seconds", type=float, required=True)
        args = parser.parse_args()
        if args.mode == "probe":
            print(json.dumps(probe(args.url, args.bytes, args.seconds)))
        else:
            print(json.dumps(load(args.url, args.clients, args.seconds)))
    else:
        raise SystemExit(selftest_main(sys.argv[1:]))
