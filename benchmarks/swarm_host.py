"""One swarm host: many worker identities in one process, sharing one model, backend and weight follower.

``benchmarks/swarm.py`` starts one or more of these (``python benchmarks/swarm_host.py --config RUN.toml
--host H --first I --count K ...``). Each identity is a real :class:`prime_rl.worker.process.Worker`
loop (register or resume its saved identity, status -> lease -> seeded sampler with toploc proofs ->
score -> submit) with its own identity file (``<run_dir>/swarm/<name>/identity.json``) and its own
HTTP client, in its own thread. What the identities share: the model and its backend (generation
is serialised by one lock, held from the weight reload through the batch, so no batch mixes
versions), and one shardcast follower that downloads each policy version once for the host.
Every ``hostile_every``-th identity plays one behaviour of ``redteam/attacks.py`` (``HOSTILE``, in turn).

What it records, for the harness's figures and invariant checks, in ``<out>/host-<H>.jsonl``
(one JSON object a line, written before the next request):
  ``{"kind": "submitted", "identity", "worker_id", "batch_id", "honest", "t"}`` per rollout batch
  answered 2xx; ``{"kind": "request", "path", "status", "s", "t"}`` per HTTP answer (``s``: seconds
  until its headers arrived, ``requests``' ``elapsed``); ``{"kind": "fetched", "version", "bytes",
  "resumed_bytes", "file_bytes", "delta", "delta_base", "s", "t"}`` per downloaded policy version
  (``bytes``: on the wire; ``delta``: only the delta shards against cached ``delta_base`` travelled).

Pitfall: the identities' threads share one interpreter, so what one host sustains is bounded by
the GIL and by generation; the harness spreads identities over several hosts for that reason.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests
import torch

from prime_rl.api.client import OrchestratorClient
from prime_rl.config import RunConfig, load_config
from prime_rl.episodes import load_episode_env
from prime_rl.inference.select import make_backend
from prime_rl.metrics import init_process
from prime_rl.redteam.attacks import MIXED_CYCLE, HostileWorker
from prime_rl.reward import run_tasks
from prime_rl.weights.store import PolicyFetch, PolicyStore, VersionFollower
from prime_rl.worker.identity import IDENTITY_FILE
from prime_rl.worker.process import Honest, Worker

log = logging.getLogger("swarm_host")

HOSTILE = tuple(name for name in MIXED_CYCLE if name != "stale_policy")
"""The hostile behaviours identities play in turn (``stale_policy`` needs weights of its own, which a
shared backend cannot keep)."""


class Records:
    """Thread-safe JSON-lines writer (line buffered: a record is on disk before the next request)."""

    def __init__(self, path: Path, host: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.host = host
        self._file = path.open("a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"kind": kind, "host": self.host, "t": time.time(), **fields})
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


class Shared:
    """What a host's identities share: config, backend, tasks, policy store, follower, lock, stop."""

    def __init__(self, config: RunConfig, host: int, records: Records) -> None:
        self.config = config
        self.records = records
        self.backend = make_backend(
            config, backend="hf", device=torch.device("cpu"), max_batch_size=config.workers.batch_size
        )
        cache = Path(config.run_dir) / "swarm" / f"host-{host}" / "policies"
        # local=None: download through shardcast like a remote worker (no hard link to the trainer's file).
        self.store = PolicyStore(
            config.shardcast.client_servers, cache, self.backend.model.state_dict(), local=None,
            on_fetch=self._record_fetch,
        )  # fmt: skip
        self.follower = VersionFollower(self.store, config.workers.weights_poll_s)
        self.tasks = run_tasks(config, self.backend.tokenizer)
        self.env = load_episode_env(config, self.tasks.task_set, self.backend.tokenizer)
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def _record_fetch(self, fetch: PolicyFetch) -> None:
        """Each version the host's store brings in: bytes on the wire, full or delta, resumed or not."""
        self.records.write(
            "fetched", version=fetch.version, bytes=fetch.bytes_downloaded, resumed_bytes=fetch.bytes_resumed,
            file_bytes=fetch.file_bytes, delta=fetch.used_delta, delta_base=fetch.delta_base, s=fetch.seconds,
        )  # fmt: skip


class SwarmIdentity(Worker):
    """One identity of the swarm: the real worker loop on the host's shared model (module docstring)."""

    def __init__(self, shared: Shared, name: str, behaviour: str, think_s: float, seed: int) -> None:
        # Not Worker.__init__: the model, store, follower and tasks are the host's.
        config = shared.config
        self.run, self.cfg, self.name, self.shared = config, config.workers, name, shared
        self.backend, self.store, self.follower = shared.backend, shared.store, shared.follower
        self.tasks, self.env = shared.tasks, shared.env
        self.client = OrchestratorClient(config.orchestrator.url, timeout_s=30, retries=2)
        self.client._session.hooks["response"].append(self._record_response)
        self.worker_id, self.resuming = "", False
        self.identity_path = Path(config.run_dir) / "swarm" / name / IDENTITY_FILE
        self.submitted = 0
        self.stop_event = shared.stop
        self.behaviour, self.think_s, self.rng = behaviour, think_s, random.Random(seed)
        self.answers: Honest | HostileWorker = (
            Honest(self.tasks, self.env)
            if behaviour == "honest"
            else HostileWorker(
                behaviour, self.tasks.encode, self.tasks.score, self.tasks.prompt_tokens, self.tasks.num_tasks
            )
        )

    def _record_response(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        path = requests.utils.urlparse(response.url).path
        self.shared.records.write(
            "request", path=path, status=response.status_code, s=response.elapsed.total_seconds()
        )

    def one_batch(self) -> bool:
        status = self.client.status()
        if not self.answers.ready(status):
            self.stop_event.wait(self.cfg.poll_interval_s)
            return False
        with self.shared.lock:
            if self.answers.follows_new_weights:
                self.reload_newest(status.policy_version)
            held = self.backend.policy_version
        # The lease fixes the version stated here if it is inside the async window (Worker.one_batch).
        lease = self.client.get_tasks(self.worker_id, version=held, resume=self.resuming)
        self.resuming = False
        with self.shared.lock:  # one generation at a time, with the lease's version: no reload mid-batch
            if self.answers.follows_new_weights and not self.wait_for_version(lease.policy_version, lease.deadline):
                return False  # the lease expired waiting for its version
            batch = self.answers.answer(lease, self.backend)
        self.answers.before_submit(lease, self.client)
        answer = self.client.submit_rollouts(batch)
        self.submitted += 1
        self.shared.records.write(
            "submitted", identity=self.name, worker_id=self.worker_id, batch_id=answer.batch_id,
            honest=self.behaviour == "honest", samples=len(batch.samples),
        )  # fmt: skip
        if self.think_s:  # a realistic pace: generation on a real GPU takes this long
            self.stop_event.wait(self.rng.expovariate(1 / self.think_s))
        return True

    def live(self) -> None:
        """The identity's thread: wait for the orchestrator, resume or register, serve."""
        try:
            self.client.wait_until_up(self.run.orchestrator.connect_timeout_s)
            self.start_identity()
            self.shared.records.write(
                "identity", identity=self.name, worker_id=self.worker_id, behaviour=self.behaviour
            )
            code = self.serve()
            self.shared.records.write("stopped", identity=self.name, worker_id=self.worker_id, code=code)
        except Exception as error:  # one identity's crash must not end the host; it is recorded
            log.exception("%s failed", self.name)
            self.shared.records.write(
                "crashed", identity=self.name, worker_id=self.worker_id, error=repr(error)[:300]
            )


def behaviour_of(index: int, hostile_every: int) -> str:
    """Identity ``index``'s behaviour: every ``hostile_every``-th (from the last of each group) is hostile."""
    if hostile_every and index % hostile_every == hostile_every - 1:
        return HOSTILE[(index // hostile_every) % len(HOSTILE)]
    return "honest"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--host", type=int, default=0, help="this host's index")
    parser.add_argument("--first", type=int, default=0, help="index of this host's first identity")
    parser.add_argument("--count", type=int, default=16, help="identities on this host")
    parser.add_argument(
        "--hostile-every", type=int, default=10, help="every n-th identity is hostile (0: none)"
    )
    parser.add_argument(
        "--think-s", type=float, default=0.0, help="mean pause after each batch (0: as fast as possible)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="folder of the records")
    parser.add_argument(
        "--orchestrator-url", default="", help="URL of the orchestrator from this host's site"
    )
    parser.add_argument("--servers", default="", help="comma-separated shardcast URLs from this host's site")
    args, overrides = parser.parse_known_args(argv)
    if args.orchestrator_url:
        overrides += ["--orchestrator.public_url", args.orchestrator_url]
    if args.servers:
        overrides += ["--shardcast.servers", json.dumps(args.servers.split(","))]
    config = load_config(args.config, overrides)
    init_process("worker", f"swarm-host-{args.host}", config.run_dir, level="WARNING")
    torch.set_num_threads(1)
    records = Records(Path(args.out) / f"host-{args.host}.jsonl", args.host)
    shared = Shared(config, args.host, records)
    signal.signal(signal.SIGTERM, lambda *_: shared.stop.set())
    signal.signal(signal.SIGINT, lambda *_: shared.stop.set())
    identities = [
        SwarmIdentity(
            shared,
            f"swarm-{i:05d}",
            behaviour_of(i, args.hostile_every),
            args.think_s,
            args.seed * 100_003 + i,
        )
        for i in range(args.first, args.first + args.count)
    ]
    shared.follower.start()
    threads = [
        threading.Thread(target=identity.live, name=identity.name, daemon=True) for identity in identities
    ]
    for thread in threads:
        thread.start()
    while not shared.stop.wait(0.5) and any(thread.is_alive() for thread in threads):
        pass
    shared.stop.set()
    for thread in threads:
        thread.join(timeout=5)
    shared.follower.stop()
    records.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
