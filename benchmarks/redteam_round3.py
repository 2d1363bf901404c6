"""Red team, round three (issue 34): tool-replay denial of service, a free veto on leases, and
version shopping, against a real ``prime-rl run`` of the multi-turn Python-tool environment.

The run is ``configs/tiny-cpu-tools.toml`` as shipped (``python_tool``, 3 model turns, 5 s tool
limit, its stop strings and turn template, one honest worker process) with the test suite's tiny
random model in place of SmolLM2 (``--model`` takes any model directory), its own ports and
``release_after_tokens = 0``; every role is a real process started by ``prime-rl run``. The
attacker is this process, a client written against API.md:

* **tool replay** (``Fabricators``): fresh identities, each from its own loopback /24
  (``127.A.B.1``: no per-address or per-network cap binds, as for an attacker with many
  addresses), each answering one lease with fabricated episodes whose two tool calls loop until
  the tool limit (``while 1:0``), with random well-formed toploc proofs (built from random
  activations) and everything else as an honest worker would send it (tasks, seeds, prompts,
  the lease's version, termination, env reply). Measured: the validator's seconds per attacker
  lease (its ``verdict`` metrics lines), its tool seconds there, and the honest worker's
  accepted samples per minute in a window without the attack and in one with it.
* **free veto** (``HonestClient.answer(veto=True)``): a trusted identity answers every lease
  honestly, then lowers one sample's claimed reward (advantages consistent with the claim) on the
  leases it dislikes (task ids summing odd). Measured: what became of each vetoed lease, whether
  its tasks were re-issued and trained by another identity, and the identity's open-lease
  allowance.
* **version shopping**: an identity whose lease fixed version ``v`` answers it with another
  committed version (``v + 1`` or ``v - 1``).

Run: ``python benchmarks/redteam_round3.py [--window 60] [--threads 4]``; writes
``benchmarks/results/redteam_round3.{md,json}``. ``test_redteam_round3.py`` runs the same session,
smaller, and asserts its bounds.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import tomllib
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import toploc
from prime_rl.api.client import ApiError, ClientRequestError, OrchestratorBusy, OrchestratorClient
from prime_rl.api.protocol import RolloutBatch, RolloutSample, Segment, TaskLease
from prime_rl.config import RunConfig, load_config
from prime_rl.episodes import EpisodeEnv, load_episode_env
from prime_rl.inference.backend import HFBackend, proof_topk
from prime_rl.metrics import read_metrics
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.orchestrator.store_schema import BatchRecord
from prime_rl.reward import run_tasks
from prime_rl.weights.store import PolicyStore, PolicyUnavailable
from prime_rl.worker.episodes import build_episode_batch
from prime_rl.worker.rollout import group_advantages
from verifiers.envs import Message

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LOOP = '<tool_call>{"name":"python","arguments":{"code":"while 1:0"}}</tool_call>'


# --------------------------------------------------------------------------- the run


def write_run_config(tmp: Path, model_dir: Path, ports: list[int], **sections: dict[str, Any]) -> Path:
    """``configs/tiny-cpu-tools.toml`` with this session's model, run dir and ports, no hostile worker
    process (this process is the attacker), a long trainer and ``sections`` merged over it."""
    config = tomllib.loads((ROOT / "configs" / "tiny-cpu-tools.toml").read_text())
    config["run_dir"] = str(tmp / "run")
    config["model"]["path"] = str(model_dir)
    # async_level 8 (shipped: 2): the in-process identities load each version through shardcast while the
    # trainer takes a step per honest lease (seconds on the tiny model); their batches must not go stale
    config["orchestrator"].update(port=ports[0], release_after_tokens=0, async_level=8)
    config["shardcast"].update(origin_port=ports[1], relay_ports=[ports[2]], keep_versions=10)
    config["trainer"].update(total_steps=1000, checkpoint_every=1000)
    config["workers"].update(count=1, hostile=[])
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values}
    return _prime_rl_test_helpers().write_toml(tmp / "run.toml", config)


def _prime_rl_test_helpers() -> Any:
    """prime_rl's tests/conftest.py, loaded under its own name: under pytest the module ``conftest``
    may be another package's (one TOML writer serves the run configs of tests and benches)."""
    import importlib.util

    name = "prime_rl_tests_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "packages" / "prime_rl" / "tests" / "conftest.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@contextlib.contextmanager
def prime_rl_run(config_path: Path) -> Iterator[subprocess.Popen[str]]:
    """``prime-rl run`` in its own process; SIGINT (then SIGKILL) on the way out."""
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-m", "prime_rl.cli", "run", "--config", str(config_path)]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        yield run
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
        try:
            run.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            run.kill()
            run.communicate()


def metrics(run_dir: Path, name: str) -> list[dict[str, Any]]:
    path = run_dir / "metrics" / f"{name}.jsonl"
    return list(read_metrics(path)) if path.exists() else []


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def client_at(url: str, address: str | None = None) -> OrchestratorClient:
    return OrchestratorClient(url, timeout_s=20, retries=2, backoff_s=0.5, source_address=address)


def lease_of(client: OrchestratorClient, worker_id: str, timeout_s: float = 60.0, **kwargs: Any) -> TaskLease:
    """GET /tasks, waiting out 429 busy answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.get_tasks(worker_id, **kwargs)
        except OrchestratorBusy as busy:
            if time.monotonic() > deadline:
                raise
            time.sleep(min(busy.retry_after_s or 0.5, 2.0))


# --------------------------------------------------------------------------- tool replay


@dataclass
class Fabricators:
    """Fresh identities from their own /24 each, one fabricated lease each (module docstring)."""

    config: RunConfig
    tokenizer: Any
    encode: Callable[[str], Any]  # a prompt's tokens (``RunTasks.encode``)
    env: EpisodeEnv
    hidden_size: int
    leases: list[dict[str, Any]] = field(default_factory=list)  # worker_id, address, batch_id, time
    refusals: list[str] = field(default_factory=list)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _turns: dict[tuple[str, int], tuple[list[int], bytes]] = field(default_factory=dict)

    def _address(self) -> str:
        with self._lock:
            self._next += 1
            n = self._next
        return f"127.{1 + n // 250}.{n % 250}.1"

    def _model_turn(self, text: str, stop: list[str], rng: random.Random) -> tuple[list[int], bytes]:
        """A turn's tokens as generation ends them (at its stop string, else EOS) and random proofs, one
        of 8 sets per text (drawn once: the attacker's CPU is not what is measured, and it shares the cores)."""
        key = (text, rng.randrange(8))
        if key not in self._turns:
            self._turns[key] = self._draw_turn(text, stop, rng)
        return self._turns[key]

    def _draw_turn(self, text: str, stop: list[str], rng: random.Random) -> tuple[list[int], bytes]:
        tokens = list(self.tokenizer.encode(text, add_special_tokens=False))
        if not any(s and text.endswith(s) for s in stop):
            tokens.append(self.tokenizer.eos_token_id)
        generator = torch.Generator().manual_seed(rng.randrange(2**31))
        activations = torch.randn(len(tokens), self.hidden_size, generator=generator)
        proofs = b"".join(
            toploc.build_proofs_bytes(activations, topk=proof_topk(self.hidden_size), skip_prefill=True)
        )
        return tokens, proofs

    def batch(self, lease: TaskLease, rng: random.Random) -> RolloutBatch:
        """Every sample: tool call, timeout reply, tool call, timeout reply, final answer."""
        reply = list(self.env.render((Message("tool", "\n[timeout]\n"),)))
        samples = []
        for task in lease.tasks:
            prompt = [int(t) for t in self.encode(task.prompt)]
            for g, seed in enumerate(task.sampling_seeds):
                call0, proofs0 = self._model_turn(LOOP, lease.stop, rng)
                call1, proofs1 = self._model_turn(LOOP, lease.stop, rng)
                answer, proofs2 = self._model_turn("\\boxed{1}", lease.stop, rng)
                tokens = [*call0, *reply, *call1, *reply, *answer]
                segments = [
                    Segment(kind="model", length=len(call0), turn=0), Segment(kind="env", length=len(reply), turn=0),
                    Segment(kind="model", length=len(call1), turn=1), Segment(kind="env", length=len(reply), turn=1),
                    Segment(kind="model", length=len(answer), turn=2),
                ]  # fmt: skip
                logprobs = [-1.0] * len(call0) + [0.0] * len(reply) + [-1.0] * len(call1) + [0.0] * len(reply)
                samples.append(RolloutSample(
                    task_id=task.task_id, group_index=g, prompt_tokens=prompt, completion_tokens=tokens,
                    sampling_seed=seed, temperature=lease.temperature, reward=0.0, advantage=0.0,
                    proofs=proofs0 + proofs1 + proofs2, inference_logprobs=logprobs + [-1.0] * len(answer),
                    segments=segments,
                ))  # fmt: skip
        return RolloutBatch(
            worker_id=lease.worker_id, step=lease.step, batch_index=lease.batch_index,
            policy_version=lease.policy_version, samples=samples,
        )  # fmt: skip

    def one(self, rng: random.Random) -> None:
        address = self._address()
        client = client_at(self.config.orchestrator.url, address)
        try:
            worker_id = client.register("fabricator").worker_id
            lease = lease_of(client, worker_id, timeout_s=20)
            batch_id = client.submit_rollouts(self.batch(lease, rng)).batch_id
            with self._lock:
                self.leases.append(
                    {"worker_id": worker_id, "address": address, "batch_id": batch_id, "time": time.time()}
                )
        except ApiError as error:
            with self._lock:
                self.refusals.append(f"{address}: {error}")
        finally:
            client.close()

    def attack(self, seconds: float, threads: int, pause_s: float) -> None:
        """``threads`` loops, each a fresh identity after another, for ``seconds``."""
        stop = time.monotonic() + seconds

        def loop(index: int) -> None:
            rng = random.Random(index)
            while time.monotonic() < stop:
                self.one(rng)
                time.sleep(pause_s)

        workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(seconds + 120)


# --------------------------------------------------------------------------- veto, version shopping


class HonestClient:
    """An identity that generates with its own copy of the model, following the policy through shardcast."""

    def __init__(self, config: RunConfig, cache: Path, name: str) -> None:
        # One intra-op thread: the run's processes hold the cores, and a second thread that spins waiting
        # for them made each decode step many times slower (benchmarks/results/redteam_round3.md).
        torch.set_num_threads(1)
        self.config = config
        self.backend = HFBackend(config.model.path, dtype=config.model.dtype)
        self.tasks = run_tasks(config, self.backend.tokenizer)
        env = load_episode_env(config, self.tasks.task_set, self.backend.tokenizer)
        assert env is not None
        self.env = env
        self.weights = PolicyStore(config.shardcast.client_servers, cache, self.backend.model.state_dict())
        self.identity(name)

    def identity(self, name: str) -> str:
        """Register a fresh identity (on loopback's own address) and answer as it from now on."""
        self.client = client_at(self.config.orchestrator.url)
        self.worker_id: str = self.client.register(name).worker_id
        return self.worker_id

    def hold(self, version: int) -> None:
        deadline = time.monotonic() + 120
        while self.backend.policy_version != version:
            try:
                self.backend.load_weights(self.weights.ensure(version), version)
            except PolicyUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def lease(self, version: int | None = None) -> TaskLease:
        return lease_of(self.client, self.worker_id, version=version)

    def answer(self, lease: TaskLease, *, veto: bool = False, generate_with: int | None = None) -> str:
        """Generate ``lease`` honestly (with ``generate_with`` instead of the lease's version if set) and
        submit it; ``veto``: first lower sample 0's claimed reward by 1, its group's advantages
        recomputed from the claims. Returns the batch id."""
        self.hold(lease.policy_version if generate_with is None else generate_with)
        batch = build_episode_batch(lease, self.backend, self.env, encode=self.tasks.encode)[0]
        if veto:
            samples = list(batch.samples)
            group = [i for i, s in enumerate(samples) if s.task_id == samples[0].task_id]
            rewards = [samples[i].reward - (1.0 if i == 0 else 0.0) for i in group]
            for i, reward, advantage in zip(group, rewards, group_advantages(rewards), strict=True):
                samples[i] = samples[i].model_copy(update={"reward": reward, "advantage": advantage})
            batch = batch.model_copy(update={"samples": samples})
        return self.client.submit_rollouts(batch).batch_id


def dislikes(lease: TaskLease) -> bool:
    """The vetoing identity's taste: leases whose task ids sum odd (about half of them)."""
    return sum(task.task_id for task in lease.tasks) % 2 == 1


# --------------------------------------------------------------------------- reading the run


def log(message: str) -> None:
    print(f"[redteam_round3 {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def verdict_lines(run_dir: Path) -> dict[str, dict[str, Any]]:
    return {e["batch_id"]: e for e in metrics(run_dir, "validator") if e["event"] == "verdict"}


def accepted_per_minute(run_dir: Path, worker_ids: set[str], start: float, end: float) -> float:
    """Samples of ``worker_ids`` the validator accepted between ``start`` and ``end`` (its verdict lines' times)."""
    accepted = sum(
        e["accepted"]
        for e in verdict_lines(run_dir).values()
        if e["worker_id"] in worker_ids and start <= e["time"] < end
    )
    return 60.0 * accepted / (end - start)


def origin(record: BatchRecord) -> tuple[str, int, int] | None:
    """Where the tasks of the lease ``record`` answers were first issued (``LeaseRecord.source_*``): a
    re-issued lease keeps its source's origin; None for an unleased batch."""
    lease = record.meta.lease
    return None if lease is None else (lease.source_worker_id, lease.source_step, lease.source_batch_index)


def trained_answer(store: RolloutStore, lease: tuple[str, int]) -> tuple[tuple[str, int], list[int]] | None:
    """The lease whose batch for ``lease``'s tasks reached trainer claims, (worker, batch_index), with
    the trained task ids; None while none has.

    Read from the batches' own lease records (their tasks' origin), which the run's record keeps: the
    lease log's re-issue links are folded out at every trainer commit once their leases settle (issue
    44), so a chain read from it loses the links that settled between two reads."""
    claims = store.claims()  # before the batches: a claim only names batches stored before it
    records = {r.meta.batch_id: r for r in store.batch_records()}
    asked = next(
        (origin(r) for r in records.values() if (r.meta.worker_id, r.meta.batch_index) == lease and r.meta.lease),
        None,
    )
    if asked is None:
        return None
    trained: dict[tuple[str, int], list[int]] = defaultdict(list)
    for claim in claims:
        for sample in claim.sample_ids:
            record = records[sample.batch_id]
            if origin(record) == asked:
                trained[(record.meta.worker_id, record.meta.batch_index)].append(record.task_ids[sample.index])
    return next(iter(trained.items()), None)


def seconds_summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "median": round(statistics.median(ordered), 3) if ordered else float("nan"),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 3) if ordered else float("nan"),
        "max": round(ordered[-1], 3) if ordered else float("nan"),
    }


# --------------------------------------------------------------------------- one session


def session(
    tmp: Path,
    model_dir: Path,
    *,
    window_s: float,
    attacks: list[tuple[int, float]],
    vetoes: int,
    max_new_tokens: int = 40,
) -> dict[str, Any]:
    """Start the run, measure the honest rate for ``window_s`` without the tool-replay attack and
    ``window_s`` with each of ``attacks`` ((threads, pause_s): each thread sends a fabricated lease,
    then waits pause_s), then the veto (until ``vetoes`` vetoed leases or a ban) and version
    shopping; stop; read the disk."""
    free_ports = _prime_rl_test_helpers().free_ports
    from prime_rl.orchestrator.ledger import Ledger
    from prime_rl.tasks import load_tasks

    config_path = write_run_config(tmp, model_dir, free_ports(3), sampling={"max_new_tokens": max_new_tokens})
    config = load_config(config_path)
    run_dir = Path(config.run_dir)
    out: dict[str, Any] = {"config": {"window_s": window_s, "attacks": attacks, "vetoes": vetoes}}

    def commits() -> int:
        return sum(1 for e in metrics(run_dir, "orchestrator") if e["event"] == "commit")

    def judged(batch_id: str) -> bool:
        return batch_id in verdict_lines(run_dir)

    def settled(batch_ids: list[str]) -> bool:
        """Every batch has verdicts: the validator's, or ``expired`` (the orchestrator's, too old to train)."""
        return set(batch_ids) <= set(store.all_verdicts())

    with prime_rl_run(config_path) as run:
        client_at(config.orchestrator.url).wait_until_up(120)
        store = RolloutStore(run_dir / "orchestrator", reader=True)  # the orchestrator has created it now
        wait_for(lambda: commits() >= 1 or run.poll() is not None, 300, "the first trained step")
        assert run.poll() is None, "prime-rl run exited early"
        honest = HonestClient(config, tmp / "cache", "vetoer")
        tokenizer = honest.backend.tokenizer
        hidden_size = int(honest.backend.model.config.hidden_size)
        fabricators = Fabricators(config, tokenizer, honest.tasks.encode, honest.env, hidden_size)
        # The honest batches stored before the first step are judged in a burst: not the steady rate.
        log(
            f"run up, first step trained; {window_s / 2:.0f} s of warm-up, then {window_s:.0f} s without the attack"
        )
        time.sleep(window_s / 2)
        baseline = (time.time(), time.time() + window_s)
        time.sleep(window_s)
        windows = []
        for threads, pause_s in attacks:
            start, sent = time.time(), len(fabricators.leases)
            log(f"{window_s:.0f} s of fabricated tool episodes: {threads} threads, {pause_s} s pauses")
            fabricators.attack(window_s, threads, pause_s)
            windows.append((threads, pause_s, start, time.time(), len(fabricators.leases) - sent))
        log(f"{len(fabricators.leases)} fabricated leases sent; the veto")

        # Free veto: a trusted identity (3 honest leases first), then a veto on every lease it dislikes.
        veto_leases: list[dict[str, Any]] = []
        vetoer = honest.worker_id
        # About half of the leases are disliked: 12 leases per veto miss one about once in 4,096 runs
        # (with 4, once in 16: the full suite of 2026-12-07 drew 4 liked leases and vetoed nothing).
        for index in range(3 + 12 * vetoes):
            try:
                lease = honest.lease()
            except ClientRequestError as error:  # banned for abandoning (rejected leases count)
                out["veto_refused"] = f"{error.status} {error.message}"
                break
            veto = index >= 3 and dislikes(lease)
            started = time.monotonic()
            batch_id = honest.answer(lease, veto=veto)
            log(
                f"vetoer lease {lease.batch_index} (v{lease.policy_version}) answered in {time.monotonic() - started:.1f} s"
            )
            veto_leases.append({"batch_index": lease.batch_index, "batch_id": batch_id, "vetoed": veto,
                                "task_ids": [t.task_id for t in lease.tasks]})  # fmt: skip
            wait_for(lambda batch_id=batch_id: judged(batch_id), 120, "the verdict on the vetoer's batch")
            if sum(v["vetoed"] for v in veto_leases) >= vetoes:
                break

        log("version shopping")
        # Version shopping: the lease fixes v, the batch says (and was generated with) another committed one.
        wait_for(lambda: honest.client.status().policy_version >= 2, 300, "two committed versions")
        shopping: list[dict[str, Any]] = []
        for direction in (-1, +1):
            honest.identity(f"shopper{direction:+d}")
            newest = honest.client.status().policy_version
            lease = honest.lease(version=newest if direction < 0 else newest - 1)
            other = lease.policy_version + direction
            batch_id = honest.answer(lease, generate_with=other)
            shopping.append({"worker_id": honest.worker_id, "batch_id": batch_id, "lease_version": lease.policy_version,
                             "generated_with": other})  # fmt: skip

        log("waiting for verdicts and for the vetoed tasks to train")
        # Everything judged, and every lease of the vetoer trained (re-issued ones by another identity).
        attacker_batches = [entry["batch_id"] for entry in fabricators.leases]
        wait_for(
            lambda: settled(attacker_batches + [s["batch_id"] for s in shopping]),
            300,
            "every attacker batch settled",
        )
        settled_at = commits()
        wait_for(
            lambda: all(trained_answer(store, (vetoer, v["batch_index"])) for v in veto_leases),
            300, "every lease of the vetoer trained",
        )  # fmt: skip
        wait_for(lambda: commits() >= settled_at + 1, 120, "one more trained step")
    out["returncode"] = run.returncode

    # ------------------------------------------------------------------ read what the run left
    events = metrics(run_dir, "orchestrator")
    names = {e["worker_id"]: e["worker_name"] for e in events if e["event"] == "register"}
    honest_ids = {w for w, n in names.items() if n.startswith("worker-")}
    lines = verdict_lines(run_dir)
    # Who trained each lease's tasks (read from the batches' lease records, which outlive the lease log).
    answers = {lease["batch_index"]: trained_answer(store, (vetoer, lease["batch_index"])) for lease in veto_leases}
    store.close()
    store = RolloutStore(run_dir / "orchestrator")  # the run has stopped: a Ledger replays (and may fold) as its owner
    ledger = Ledger(config, load_tasks(config.tasks), store)
    workers = {w.worker_id: w for w in ledger.workers_view().workers}
    verdicts = store.all_verdicts()
    batches = {r.meta.batch_id: r for r in store.batch_records()}
    claimed = {s.batch_id for claim in store.claims() for s in claim.sample_ids}

    fabricated = [lines[b] for b in attacker_batches if b in lines]  # judged by the validator (not expired)
    attacker_ids = {entry["worker_id"] for entry in fabricators.leases}
    reasons: dict[str, int] = defaultdict(int)
    for line in fabricated:
        for reason, count in line["reasons"].items():
            reasons[reason] += count
    out["tool_replay"] = {
        "identities": len(attacker_ids),
        "leases_answered": len(fabricators.leases),
        "refused": len(fabricators.refusals),
        "refusals_sample": fabricators.refusals[:3],
        "validator_seconds_per_lease": seconds_summary([line["seconds"] for line in fabricated]),
        "tool_seconds_per_lease_max": max((line["batch_tool_seconds"] for line in fabricated), default=None),
        "judged_by_validator": len(fabricated),
        "expired_unjudged": sum(
            1
            for b in attacker_batches
            if b not in lines and all(v.reason == "expired" for v in verdicts.get(b, []))
        ),
        "prefilled_leases": sum(1 for line in fabricated if line["prefilled"]),
        "reasons": dict(reasons),
        "accepted": sum(line["accepted"] for line in fabricated),
        "banned_identities": sum(workers[w].banned for w in attacker_ids),
        "banned_among_judged": sum(workers[line["worker_id"]].banned for line in fabricated),
        "in_trainer_claims": sum(1 for b in attacker_batches if b in claimed),
        "tool_seconds_per_lease_bound": config.validator.tool_seconds_per_lease,
    }
    honest_lines = [line for line in lines.values() if line["worker_id"] in honest_ids]
    out["honest"] = {
        "accepted_per_min_without_attack": round(accepted_per_minute(run_dir, honest_ids, *baseline), 1),
        "during_attack": [
            {"threads": threads, "pause_s": pause_s, "fabricated_leases_per_min": round(60 * sent / (end - start), 1),
             "accepted_per_min": round(accepted_per_minute(run_dir, honest_ids, start, end), 1)}
            for threads, pause_s, start, end, sent in windows
        ],
        "validator_seconds_per_lease": seconds_summary([line["seconds"] for line in honest_lines]),
        "accepted": sum(workers[w].samples_accepted for w in honest_ids),
        "rejected": sum(
            1 for b, r in batches.items() if r.meta.worker_id in honest_ids
            for v in verdicts.get(b, []) if not v.accepted and v.reason != "expired"
        ),
        "banned": sum(workers[w].banned for w in honest_ids),
    }  # fmt: skip

    group = config.sampling.group_size
    veto_rows = []
    for lease in veto_leases:
        answer = answers[lease["batch_index"]]
        reasons_of = sorted({v.reason for v in verdicts.get(lease["batch_id"], [])})
        veto_rows.append({
            **lease, "reasons": reasons_of,
            "trained_by": None if answer is None else ("vetoer" if answer[0][0] == vetoer else names.get(answer[0][0])),
            "trained_task_ids": None if answer is None else sorted(answer[1]),
            "expected_task_ids": sorted(t for t in lease["task_ids"] for _ in range(group)),
        })  # fmt: skip
    out["veto"] = {
        "leases": veto_rows,
        "vetoed": sum(v["vetoed"] for v in veto_rows),
        "abandoned": ledger.rules.abandoned(vetoer),
        "allowance": ledger.rules.allowance(vetoer),
        "max_open_leases": config.orchestrator.max_open_leases,
        "banned": workers[vetoer].banned,
    }
    out["version_shopping"] = [
        {**s, "reasons": sorted({v.reason for v in verdicts.get(s["batch_id"], [])}),
         "in_trainer_claims": s["batch_id"] in claimed, "banned": workers[s["worker_id"]].banned}
        for s in shopping
    ]  # fmt: skip
    out["machine"] = f"{platform.platform()}, {os.cpu_count()} CPUs (shared)"
    out["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    store.close()
    return out


# --------------------------------------------------------------------------- report


def report(result: dict[str, Any]) -> str:
    dos, honest, veto = result["tool_replay"], result["honest"], result["veto"]
    seconds = dos["validator_seconds_per_lease"]
    before = honest["accepted_per_min_without_attack"]
    lines = [
        "# Red team, round three: tool-replay DoS, free veto, version shopping (issue 34)",
        "",
        f"`benchmarks/redteam_round3.py`, {result['date']}, {result['machine']}, other agents' jobs running "
        f"(load average {result.get('load_average', '?')} at the end). One `prime-rl run` of "
        "`configs/tiny-cpu-tools.toml` (python_tool, 3 model turns, 5 s tool limit, one honest worker) with the "
        f"tiny random model, max_new_tokens {result['config'].get('max_new_tokens')}, async_level 8, "
        f"release_after_tokens 0; windows of {result['config']['window_s']} s.",
        "",
        "## Tool replay: fabricated episodes, two looping tool calls each, random well-formed proofs",
        "",
        f"- {dos['identities']} fresh identities (one loopback /24 each), {dos['leases_answered']} fabricated leases; "
        f"refused: {dos['refused']}",
        f"- validator seconds per attacker lease (its `verdict` lines: judge + post): median {seconds['median']}, "
        f"p90 {seconds['p90']}, max {seconds['max']} (honest leases: median "
        f"{honest['validator_seconds_per_lease']['median']}, max {honest['validator_seconds_per_lease']['max']})",
        f"- tool seconds per attacker lease: max {dos['tool_seconds_per_lease_max']} (the code's bound: replays run "
        "only for samples whose every model turn passed the proofs and sampling checks, `verdicts.validate_batch`; "
        f"a proven lease's replays are capped at `tool_seconds_per_lease` = {dos['tool_seconds_per_lease_bound']} s)",
        f"- prefilled: {dos['prefilled_leases']} of {len(dos['reasons']) and dos['leases_answered']}; reasons: "
        f"{dos['reasons']}; accepted {dos['accepted']}, in trainer claims {dos['in_trainer_claims']}",
        f"- attacking identities banned: {dos['banned_identities']} of {dos['identities']}; of those whose lease the "
        f"validator judged: {dos['banned_among_judged']} of {dos['judged_by_validator']} (the others' batches expired "
        f"unjudged, too old to train: {dos['expired_unjudged']})",
        "",
        "| attack | fabricated leases / min | honest accepted samples / min | vs without |",
        "|---|---|---|---|",
        f"| none | 0 | {before} | |",
    ]
    for window in honest["during_attack"]:
        share = window["accepted_per_min"] / before if before else float("nan")
        lines.append(
            f"| {window['threads']} thread(s), {window['pause_s']} s pause | {window['fabricated_leases_per_min']} | "
            f"{window['accepted_per_min']} | {share:.0%} |"
        )
    lines += [
        "",
        f"Honest worker: {honest['accepted']} samples accepted, {honest['rejected']} rejected, banned {honest['banned']}.",
        "",
        "## Free veto",
        "",
        "A trusted identity (3 honest leases first) lowers one sample's claimed reward by 1 on the leases whose task "
        "ids sum odd (advantages consistent with the claim).",
        "",
        "| lease | vetoed | verdict reasons | trained by | trained task ids == lease's x group_size |",
        "|---|---|---|---|---|",
    ]
    for lease in veto["leases"]:
        same = lease["trained_task_ids"] == lease["expected_task_ids"]
        lines.append(
            f"| {lease['batch_index']} ({lease['task_ids']}) | {lease['vetoed']} | {', '.join(lease['reasons'])} | "
            f"{lease['trained_by']} | {same} |"
        )
    lines += [
        "",
        f"- vetoed {veto['vetoed']}; abandoned (rejected) leases {veto['abandoned']}; open-lease allowance "
        f"{veto['allowance']} of max_open_leases {veto['max_open_leases']}; banned {veto['banned']}"
        + (f" (refused: {result['veto_refused']})" if result.get("veto_refused") else ""),
        "",
        "## Version shopping",
        "",
        "| lease version | generated with | verdict reasons | in trainer claims | banned |",
        "|---|---|---|---|---|",
    ]
    for shop in result["version_shopping"]:
        lines.append(
            f"| {shop['lease_version']} | {shop['generated_with']} | {', '.join(shop['reasons'])} | "
            f"{shop['in_trainer_claims']} | {shop['banned']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=float, default=40.0, help="seconds per measuring window")
    parser.add_argument("--attack", action="append", default=[], metavar="THREADS:PAUSE",
                        help="one attack window: threads, seconds between a thread's leases (default 1:2 and 2:0.5)")  # fmt: skip
    parser.add_argument("--vetoes", type=int, default=3)
    parser.add_argument(
        "--model", default="", help="model directory (default: the test suite's tiny random model)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=80, help="per turn (the tiny model's tool call: 73)"
    )
    parser.add_argument("--out", default=str(RESULTS / "redteam_round3"))
    args = parser.parse_args()
    attacks = [(int(a.split(":")[0]), float(a.split(":")[1])) for a in args.attack] or [(1, 2.0), (2, 0.5)]
    import tempfile

    with tempfile.TemporaryDirectory(prefix="redteam_round3_") as tmp:
        model_dir = Path(args.model) if args.model else None
        if model_dir is None:
            sys.path.insert(0, str(ROOT / "tests" / "support"))
            from tiny_lm import save_tiny_lm

            model_dir = save_tiny_lm(Path(tmp) / "model")
        result = session(
            Path(tmp), model_dir, window_s=args.window, attacks=attacks, vetoes=args.vetoes,
            max_new_tokens=args.max_new_tokens,
        )  # fmt: skip
    result["config"]["max_new_tokens"] = args.max_new_tokens
    result["load_average"] = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    Path(args.out + ".json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    Path(args.out + ".md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    main()
