"""One worker host of benchmarks/broadcast_tree.py: several shardcast followers in one process.

Each client is a `shardcast.Follower` (the library's own fetch loop: list the server's versions,
fetch the newest new one with the previous one as delta base, keep two) pointed at its parent
relay. For every version it writes one JSON line to stdout: client id, version, wall-clock time
of completion (time.time(), the clock the publisher stamps too: all hosts share this machine's
clock), bytes downloaded, whether deltas were used, and, with `--rehash`, the SHA-256 of the
file it placed (computed after the time is taken).

The process stops when stdin reaches EOF (the harness closed it, or died) or after
`--max-seconds`. Usage: `python broadcast_tree_clients.py '<json spec>'` where the spec is
{"clients": [{"id": int, "server": url}], "output_dir": str, "poll_s": float, "rehash": bool,
"max_seconds": float}.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import threading
import time
from pathlib import Path

from shardcast import Client, FetchResult


def main(spec: dict) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    write = threading.Lock()
    stop = threading.Event()
    followers = []

    def callback(client_id: int, result: FetchResult) -> None:
        done_at = time.time()
        line = {
            "client": client_id,
            "version": result.version,
            "t": done_at,
            "bytes": result.bytes_downloaded,
            "used_delta": result.used_delta,
            "seconds": result.seconds,
            "file_digest": result.manifest.file_digest,
        }
        if spec.get("rehash"):
            line["sha256"] = hashlib.sha256(Path(result.path).read_bytes()).hexdigest()
        with write:
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()

    for client in spec["clients"]:
        follower = Client([client["server"]], per_server_connections=4).follower(
            lambda result, client_id=client["id"]: callback(client_id, result),
            output_dir=Path(spec["output_dir"]) / f"client{client['id']}",
            poll_interval_s=spec["poll_s"],
            keep=2,  # the newest and its delta base
            deadline_s=spec["max_seconds"],
        )
        followers.append(follower.start())
    watcher = threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True)
    watcher.start()
    stop.wait(spec["max_seconds"])
    for follower in followers:
        follower.stop(timeout=0)  # set every stop flag first, then wait once for all
    for follower in followers:
        follower.join(5.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(json.loads(sys.argv[1])))
