"""The red-team tests' untrusted client: its own model copy and identities, the public API only.

``test_redteam.py`` and ``test_redteam_trust.py`` attack a real ``prime-rl run`` from a client
written against ``API.md``; what every attack needs (register an identity, take a lease while
waiting out backpressure, hold the lease's policy version through shardcast, build an honest
batch, hold a hoarding window and count the honest leases in it) is here once, and each test's
attacker subclasses it with its attacks.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_rl.api.client import OrchestratorBusy, OrchestratorClient
from prime_rl.api.protocol import RolloutBatch, TaskLease
from prime_rl.config import RunConfig, load_config
from prime_rl.inference.backend import HFBackend
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.reward import run_tasks
from prime_rl.tasks import load_tasks
from prime_rl.weights.store import PolicyStore, PolicyUnavailable
from prime_rl.worker.rollout import build_batch

WAIT_S = 120.0
"""How long a lease (through 429 busy answers) or a policy version may take to come."""


class RedTeamClient:
    """The untrusted client's common part (see the module docstring)."""

    def __init__(self, config: RunConfig, cache: Path) -> None:
        self.config = config
        self.url = config.orchestrator.url
        self.backend = HFBackend(config.model.path, dtype=config.model.dtype)
        self.tasks = run_tasks(config, self.backend.tokenizer)
        self.weights = PolicyStore(config.shardcast.client_servers, cache, self.backend.model.state_dict())
        self.identities: dict[str, str] = {}  # worker_id -> attack
        self.events: dict[str, Any] = defaultdict(list)

    def identity(self, attack: str, source: str | None = None, retries: int = 3) -> tuple[OrchestratorClient, str]:
        """A fresh identity registered as ``attack-<attack>``; ``source``: another loopback address,
        as a second machine would send from; ``retries``: the client's after registration."""
        client = OrchestratorClient(self.url, timeout_s=10, retries=3, backoff_s=0.5, source_address=source)
        worker_id = client.register(f"attack-{attack}").worker_id
        client.retries = retries
        self.identities[worker_id] = attack
        return client, worker_id

    def lease(self, client: OrchestratorClient, worker_id: str) -> TaskLease:
        """``GET /tasks``, waiting out backpressure (429 busy) like an honest worker."""
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                return client.get_tasks(worker_id)
            except OrchestratorBusy:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def follow_policy(self, version: int) -> None:
        """Hold the lease's policy version (the newest committed when it was issued), like an honest worker."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if self.backend.policy_version == version:
                return
            try:
                self.backend.load_weights(self.weights.ensure(version), version)
            except PolicyUnavailable:  # not on the relay yet
                time.sleep(0.5)
        raise TimeoutError(f"policy version {version} never became available")

    def honest(self, lease: TaskLease) -> RolloutBatch:
        """The batch an honest worker would submit for ``lease`` (with the held policy version)."""
        return build_batch(lease, self.backend, encode=self.tasks.encode, score=self.tasks.score)[0]

    def hoard(self, stop: threading.Event) -> None:
        """Each test's hoarders: identities that take leases and never answer them, until ``stop``;
        every lease they get is a time in ``events["hoard_leases"]``."""
        raise NotImplementedError

    def hoard_for(self, seconds: float, wait_for: Callable[..., Any], join_s: float) -> tuple[float, float]:
        """Run :meth:`hoard` in a thread until ``seconds`` after the hoarders' first lease (registering
        them takes a while: the window starts there); (that first lease's time, the time it stopped).
        ``wait_for``: the harness's ``helpers.wait_for``; ``join_s``: how long the thread may take to end."""
        stop = threading.Event()
        hoarder = threading.Thread(target=self.hoard, args=(stop,), daemon=True)
        hoarder.start()
        wait_for(lambda: self.events["hoard_leases"], 120, "the hoarders' first lease")
        hoard_start = self.events["hoard_leases"][0]
        time.sleep(max(0.0, hoard_start + seconds - time.time()))
        stop.set()
        hoarder.join(join_s)
        return hoard_start, time.time()


@dataclass
class RunLeftBehind:
    """What a stopped run left on disk, as the red-team tests read it: the orchestrator's events,
    the registered names, the honest workers' ids, its store, verdicts and batches, and its ledger
    (to replay what the trainer received)."""

    events: list[dict[str, Any]]
    names: dict[str, str]
    honest: set[str]
    store: RolloutStore
    verdicts: dict[str, Any]
    batches: dict[str, Any]
    ledger: Ledger

    @classmethod
    def read(cls, config: RunConfig, run_dir: Path, metrics_of: Callable[[Path, str], list[dict[str, Any]]]) -> RunLeftBehind:
        events = metrics_of(run_dir, "orchestrator")
        names = {e["worker_id"]: e["worker_name"] for e in events if e["event"] == "register"}
        store = RolloutStore(run_dir / "orchestrator")
        return cls(
            events=events, names=names, honest={w for w, n in names.items() if n.startswith("worker-")}, store=store,
            verdicts=store.all_verdicts(), batches={record.meta.batch_id: record for record in store.batch_records()},
            ledger=Ledger(config, load_tasks(config.tasks), store),
        )  # fmt: skip

    def honest_leases_per_minute(self, start: float, end: float) -> float:
        """Leases the orchestrator issued to the honest workers per minute in ``[start, end)``."""
        count = sum(
            1 for e in self.events if e["event"] == "lease" and e["worker_id"] in self.honest and start <= e["time"] < end
        )
        return 60.0 * count / max(end - start, 1e-9)


def commits(run_dir: Path, helpers: Any) -> int:
    """Policy steps the run's orchestrator has committed so far (its metrics)."""
    return sum(1 for e in helpers.metrics_of(run_dir, "orchestrator") if e["event"] == "commit")


def start_to_first_step(config_path: Path, run_dir: Path, helpers: Any, timeout_s: float) -> tuple[RunConfig, Any]:
    """Start ``prime-rl run`` (``helpers.start_run``) and wait until it trained its first step, as
    the attacks start then; the run is interrupted if that never happens. (config, the run)."""
    config = load_config(config_path)
    run = helpers.start_run(config_path)
    try:
        OrchestratorClient(config.orchestrator.url).wait_until_up(120)
        helpers.wait_for(lambda: commits(run_dir, helpers) >= 1, timeout_s, "the first trained step")
    except BaseException:
        helpers.interrupt_run(run)
        raise
    return config, run
