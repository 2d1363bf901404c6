"""The latency-and-loss half of the emulated WAN: a TCP proxy that runs inside one site's namespace.

This kernel has `tc tbf`/`htb` but no `netem`, so bandwidth is shaped in the kernel
(benchmarks/swarm_wan.py) and round-trip time and loss are added here, in user space. Processes in
the site connect to 127.0.0.1:<port> of their own namespace; the proxy connects to the upstream
server from the site's address, so the server sees the site as the client.

Per connection it emulates:
- the TCP handshake: the upstream connection is opened one RTT after the client's connect, so a
  request on a fresh connection costs 2 RTT and one on a kept-alive connection 1 RTT;
- one-way delay RTT/2 per direction: each chunk is stamped on arrival and released at
  arrival + RTT/2, in order, so the delay is not serialised per chunk and throughput is bounded by
  the window (WINDOW_BYTES per direction, Linux's default tcp_rmem maximum) over RTT, as with TCP;
- loss as a retransmission stall: a chunk of n bytes holds ceil(n / MSS) segments; with
  probability 1 - (1 - loss)^segments one of them is lost and the chunk (and all behind it, order
  is kept) is held an extra RTO = max(200 ms, RTT), Linux's minimum RTO.

Pitfall: loss here costs latency (head-of-line stalls), not throughput; congestion control's
window back-off after a loss is not modelled.

Control protocol (one JSON object per line): stdout first says {"ready": true}; each stdin line
{"host", "port", "rtt_ms", "loss"} opens a listener for that upstream with that path's RTT and
loss, answered {"port": <listening port>}. stdin EOF (the parent closed it, or died) stops the proxy.
Standard library only: it runs as `python -I`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import random
import sys
from dataclasses import dataclass

MSS = 1448  # payload of a 1500-byte Ethernet frame with TCP timestamps
MIN_RTO_S = 0.2  # Linux TCP_RTO_MIN
WINDOW_BYTES = 6 * 1024 * 1024  # net.ipv4.tcp_rmem's default maximum
CHUNK = 64 * 1024
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Path:
    """One upstream as seen from this site: where it is, and the path's round trip and loss."""

    host: str
    port: int
    rtt_s: float
    loss: float


async def pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: Path, rng: random.Random
) -> None:
    """Copy one direction with RTT/2 delay and loss stalls, keeping order and at most a window in flight."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()  # None: the sender reset
    space = asyncio.Event()
    in_flight = 0
    one_way_s = path.rtt_s / 2
    rto_s = max(MIN_RTO_S, path.rtt_s)

    async def receive() -> None:
        nonlocal in_flight
        while True:
            while in_flight >= WINDOW_BYTES:
                space.clear()
                await space.wait()
            try:
                data = await reader.read(CHUNK)
            except OSError:
                queue.put_nowait((loop.time(), None))
                return
            in_flight += len(data)
            queue.put_nowait((loop.time(), data))
            if not data:
                return

    async def send() -> None:
        nonlocal in_flight
        released = 0.0
        while True:
            arrived, data = await queue.get()
            if data is None:
                writer.transport.abort()
                raise ConnectionResetError("the other side reset the connection")
            due = arrived + one_way_s
            segments = math.ceil(len(data) / MSS)
            if segments and rng.random() < 1 - (1 - path.loss) ** segments:
                due += rto_s
            released = max(due, released)  # a stalled chunk holds back everything behind it
            await asyncio.sleep(max(0.0, released - loop.time()))
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()
            in_flight -= len(data)
            space.set()

    receiving = asyncio.ensure_future(receive())
    try:
        await send()
    finally:
        receiving.cancel()


async def serve_connection(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    path: Path,
    rng: random.Random,
) -> None:
    upstream_writer = None
    try:
        await asyncio.sleep(path.rtt_s)  # SYN out, SYN-ACK back
        upstream_reader, upstream_writer = await asyncio.wait_for(
            asyncio.open_connection(path.host, path.port), CONNECT_TIMEOUT_S
        )
        directions = [
            asyncio.ensure_future(pipe(client_reader, upstream_writer, path, rng)),
            asyncio.ensure_future(pipe(upstream_reader, client_writer, path, rng)),
        ]
        # A reset on either side ends both; a clean EOF waits for the other direction to finish.
        done, pending = await asyncio.wait(directions, return_when=asyncio.FIRST_EXCEPTION)
        for task in pending:
            task.cancel()
        for task in done:
            task.exception()  # consumed: a reset is an ordinary end of a proxied connection
    except (TimeoutError, OSError):
        pass  # upstream unreachable (a cut link, a dead server): the client sees its connection close
    finally:
        for writer in (client_writer, upstream_writer):
            if writer is not None:
                writer.close()


async def main(seed: int) -> None:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    servers = []
    print(json.dumps({"ready": True}), flush=True)
    while line := await stdin.readline():
        request = json.loads(line)
        path = Path(request["host"], int(request["port"]), request["rtt_ms"] / 1000, request["loss"])
        server = await asyncio.start_server(
            functools.partial(serve_connection, path=path, rng=rng), "127.0.0.1", 0, backlog=1024
        )
        servers.append(server)
        print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    for server in servers:
        server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True, help="seed of the loss draws")
    asyncio.run(main(parser.parse_args().seed))
