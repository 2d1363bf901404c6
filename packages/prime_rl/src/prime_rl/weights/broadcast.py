"""The weight broadcast processes of a run: a shardcast origin and its relays, with metrics.

``prime-rl origin`` serves ``<shardcast.data_dir>/origin`` on ``shardcast.origin_port``; the trainer
publishes each policy version into that directory (``shardcast.publish_file``) and the running
origin serves it at once. ``prime-rl relay --index i`` mirrors the origin into
``<shardcast.data_dir>/relay-<i>`` and serves it on ``shardcast.relay_ports[i]``. Both log one
metrics event per version that becomes complete on their disk (``version_available``), so a run's
metrics show when weights reached each tier.

Policy version v is shardcast version v (v >= 1; version 0 is the initial model at ``model.path``
and is never broadcast).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from prime_rl.config import RunConfig
from prime_rl.metrics import init_process

__all__ = ["origin_main", "relay_main"]

log = logging.getLogger(__name__)


def _serve_until_signal(service: Any, data_dir: Any, role: str, name: str, config: RunConfig) -> int:
    metrics = init_process(role, name, config.run_dir)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    service.start()
    log.info("%s serving %s from %s", role, service.url, data_dir.root)
    metrics.log("serving", url=service.url)
    seen: set[int] = set()
    try:
        while not stop.wait(0.25):
            try:
                complete = {e.version for e in data_dir.read_index().versions if e.complete}
            except (OSError, ValueError):
                continue  # no index yet
            for version in sorted(complete - seen):
                log.info("%s has policy version %d", role, version)
                metrics.log("version_available", policy_version=version)
            seen |= complete
    finally:
        service.stop()
        log.info("%s stopped", role)
    return 0


def origin_main(config: RunConfig, name: str = "shardcast-origin") -> int:
    """Entry point of ``prime-rl origin``."""
    import shardcast

    sc = config.shardcast
    origin = shardcast.Origin(
        config.shardcast_data_dir / "origin", host=sc.host, port=sc.origin_port, keep=sc.keep_versions
    )
    return _serve_until_signal(origin, origin.data_dir, "shardcast-origin", name, config)


def relay_main(config: RunConfig, name: str = "shardcast-relay-0", index: int = 0) -> int:
    """Entry point of ``prime-rl relay --index i`` (mirrors the origin)."""
    import shardcast

    sc = config.shardcast
    if not 0 <= index < len(sc.relay_ports):
        raise SystemExit(
            f"relay index {index} out of range: shardcast.relay_ports has {len(sc.relay_ports)} ports"
        )
    relay = shardcast.Relay(
        [sc.origin_url],
        config.shardcast_data_dir / f"relay-{index}",
        host=sc.host,
        port=sc.relay_ports[index],
        keep=sc.keep_versions,
        poll_interval_s=0.5,
        local_sources=[config.shardcast_data_dir / "origin"],  # beside the origin: links, one copy
    )
    return _serve_until_signal(relay, relay.data_dir, "shardcast-relay", name, config)
