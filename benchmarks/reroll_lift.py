"""Keep-or-reroll: the reward a worker gains by looking at its tails before it switches (issue 46, items 4 and 8).

A real orchestrator (in-process, real HTTP on loopback) at step 2 with v1 and v2 committed; the
attacker asks each lease at the window's oldest version (``GET /tasks?version=0``), so every newer
version is already committed and no deadline applies: the worst case for the rule (the mandatory
switch only limits look-ahead for versions committed while a lease is open). Per lease, with the
real HF decode of the tiny test model (fp32, no EOS, 512-token completions: 480 tokens after a
switch at chunk 1):

1. decode the whole no-switch continuation with v0 and score it (the reward below);
2. if the lease's mean reward is below ``threshold`` (the honest expectation, 0.5), announce a
   switch (``POST /leases/switch``) to the next version at the next chunk and decode again with the
   answered nonce's seeds: a fresh tail from the cut; keep it if the orchestrator allowed the switch;
3. repeat while the orchestrator accepts another switch (the old rules: v1 at chunk 1, v2 at chunk 2).

The reward depends on every token of the tail (1 if the completion holds an odd number of digit
characters, else 0: Bernoulli(~0.5), the worst case for a reroll). Lift = mean kept reward - mean
reward of the first draw (what an honest worker's lease gets), paired per lease, with its standard
error. Every kept lease is then judged by the real validator checks (chained forwards, the
lease's records, the switch seeds): a lift counts only if the lease is accepted.

Run under each rule set: ``python benchmarks/reroll_lift.py --rules default`` (what the config
ships), ``--rules one_switch`` (switches on, as the config allows them), and, on ``main``'s code
(``PYTHONPATH`` at its packages), ``--rules default`` again (its default took up to three draws).
Writes ``benchmarks/results/reroll_lift_<label>.json``; ``--report`` joins them into ``reroll_lift.md``.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import math
import platform
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from tiny_lm import make_tiny_lm, make_tiny_tokenizer  # noqa: E402
from validator_setup import TinyRun  # noqa: E402

from prime_rl.api.client import ClientRequestError, OrchestratorClient  # noqa: E402
from prime_rl.api.protocol import (  # noqa: E402
    PendingBatch,
    RolloutBatch,
    RolloutSample,
    Verdict,
    VerdictRequest,
)
from prime_rl.config import load_config  # noqa: E402
from prime_rl.inference.backend import HFBackend  # noqa: E402
from prime_rl.inference.contract import PROOF_CHUNK, VersionSwitch  # noqa: E402
from prime_rl.orchestrator.server import OrchestratorServer  # noqa: E402
from prime_rl.validator.checks import Checks  # noqa: E402
from prime_rl.validator.verdicts import validate_batch  # noqa: E402
from prime_rl.weights.files import save_policy  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TOKENIZER = make_tiny_tokenizer()
NUM_TASKS = 64
RULES = {
    "default": [],
    "one_switch": [
        "--orchestrator.max_versions_per_sample", "2", "--orchestrator.switch_deadline_s", "3600",
        "--orchestrator.max_decode_tokens_per_s", "1e9",
    ],
}  # fmt: skip


def prompt_text(task_id: int) -> str:
    return f"{task_id}*{task_id + 7}="


class Tasks(TinyRun):
    """TinyRun's prompts, scored by the parity of the completion's digit count (every tail token counts)."""

    def score(self, task_id: int, completion: str, num_tokens: int) -> float:
        return float(sum(ch.isdigit() for ch in completion) % 2 == 1)


class OrchestratorTasks:
    def __len__(self) -> int:
        return NUM_TASKS

    def prompt(self, task_id: int) -> str:
        return prompt_text(task_id)


class Cuts:
    """A version source that switches at fixed boundaries with the orchestrator's nonces."""

    max_versions = 8

    def __init__(self, switches: dict[int, VersionSwitch]) -> None:
        self.switches = switches  # boundary -> switch

    def newer(self, current: int, boundary: int) -> VersionSwitch | None:
        switch = self.switches.get(boundary)
        return switch if switch is not None and switch.version > current else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def filler(lease: Any, version: int) -> RolloutBatch:
    samples = [
        RolloutSample(
            task_id=task.task_id, group_index=g, prompt_tokens=[1, 2, 3], completion_tokens=[4, 5], sampling_seed=seed,
            temperature=lease.temperature, reward=float(g == 0), advantage=1.0 if g == 0 else -1.0,
            proofs=base64.b64encode(b"\x00" * 258).decode(),  # type: ignore[arg-type]  # base64 on the wire
            inference_logprobs=[-0.5, -0.25],
        )
        for task in lease.tasks
        for g, seed in enumerate(task.sampling_seeds)
    ]  # fmt: skip
    return RolloutBatch(
        worker_id=lease.worker_id, step=lease.step, batch_index=lease.batch_index, policy_version=version, samples=samples
    )


def commit_next(feeder: OrchestratorClient, feeder_id: str, trainer: OrchestratorClient) -> int:
    lease = feeder.get_tasks(feeder_id)
    feeder.submit_rollouts(filler(lease, lease.policy_version))
    batch = next(b for b in trainer.pending().batches if b.worker_id == feeder_id and b.batch_index == lease.batch_index)
    trainer.post_verdicts(VerdictRequest(batch_id=batch.batch_id, verdicts=[
        Verdict(sample_index=i, accepted=True, reason="ok", reward=s.reward, advantage=s.advantage,
                logprobs=s.inference_logprobs) for i, s in enumerate(batch.samples)
    ]))  # fmt: skip
    step = trainer.status().step
    assert trainer.claim(step, 1, filter_zero_advantage=False).ready
    return trainer.commit(step, step + 1).policy_version


def mean_reward(run: Tasks, batch: RolloutBatch) -> float:
    return sum(run.score(s.task_id, run.decode(s.completion_tokens), 0) for s in batch.samples) / len(batch.samples)


def session(
    label: str, rules: str, leases: int, max_new: int, threshold: float, budget_s: float,
    on_lease: Any = None, earlier: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="reroll-lift-"))
    files = {v: save_policy(make_tiny_lm(seed=v).state_dict(), root / f"v{v}.safetensors") for v in range(3)}
    config: Any = load_config(None, [
        "--run_dir", str(root / "run"), "--orchestrator.port", str(free_port()), "--orchestrator.async_level", "2",
        "--orchestrator.prompts_per_batch", "2", "--orchestrator.max_open_leases", "4",
        "--orchestrator.task_timeout_s", "3600", "--orchestrator.release_after_tokens", "0", "--sampling.group_size", "4", "--sampling.max_new_tokens", str(max_new),
        "--sampling.stop", "[]", "--sampling.temperature", "1.0", "--tasks.num_tasks", str(NUM_TASKS),
        "--orchestrator.max_fresh_workers_per_network", str(leases + 8), "--orchestrator.max_workers", str(leases + 64),
        "--orchestrator.max_open_leases_per_address", str(leases + 8),  # the attacker's leases are judged here, not submitted
        *RULES[rules],
    ])  # fmt: skip
    rows: list[dict[str, Any]] = list(earlier or [])  # --append: the leases of an earlier session first
    started = time.monotonic()
    try:
        _play(config, files, key_rows=rows, label=label, leases=leases, max_new=max_new, threshold=threshold,
              budget_s=budget_s, started=started, on_lease=on_lease, rules=rules)  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the run directory and the version files
    return summary(label, rules, config, rows, max_new, threshold, started)


def _play(
    config: Any, files: dict[int, Path], *, key_rows: list[dict[str, Any]], label: str, leases: int, max_new: int,
    threshold: float, budget_s: float, started: float, on_lease: Any, rules: str,
) -> None:
    """The attacker's leases (module docstring), appended to ``key_rows``."""
    rows = key_rows
    with OrchestratorServer(config, OrchestratorTasks()) as server:  # type: ignore[arg-type]
        trainer = OrchestratorClient(server.url, retries=0, admin_token=server.admin_token)
        feeder = OrchestratorClient(server.url, retries=0)
        feeder_id = feeder.register("feeder").worker_id
        assert [commit_next(feeder, feeder_id, trainer) for _ in range(2)] == [1, 2]
        key = server.trusted.assignment_key
        run = Tasks(key, TOKENIZER, prompt_text, NUM_TASKS, group_size=4, prompts_per_batch=2, max_new_tokens=max_new)
        checks = Checks.from_config(
            config, vocab_size=100, eos_token_ids=frozenset(), assignment_key=key, hidden_size=run.hidden_size
        )
        validator = HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER)

        def backend_for(version: int) -> HFBackend | None:
            if version not in files:
                return None
            if version != validator.policy_version:
                validator.load_weights(files[version], version)
            return validator

        for n in range(leases):
            if time.monotonic() - started > budget_s:
                break
            worker = OrchestratorClient(server.url, retries=0)
            worker_id = worker.register(f"shopper-{n}").worker_id
            lease = worker.get_tasks(worker_id, version=0)
            assert (lease.step, lease.policy_version) == (2, 0)
            switches: dict[int, VersionSwitch] = {}
            draws: list[float] = []
            refusals: list[str] = []
            while True:
                backend = HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER, decode="dynamic")
                backend.eos_token_ids = frozenset()  # long completions: every sample runs to max_new_tokens
                backend.version_source = Cuts(dict(switches)) if switches else None
                batch = run.worker("honest").answer(lease, backend)
                draws.append(mean_reward(run, batch))
                if draws[-1] >= threshold or len(switches) >= 2:
                    break
                version, chunk = len(switches) + 1, len(switches) + 1
                try:
                    nonce = worker.announce_switch(
                        worker_id, step=lease.step, batch_index=lease.batch_index, policy_version=version, chunk=chunk
                    ).nonce
                except ClientRequestError as error:
                    refusals.append(f"{error.status} {error.message[:80]}")
                    break
                switches[chunk * PROOF_CHUNK] = VersionSwitch(version, files[version], nonce)
            held = server.ledger.leases.get(worker_id, lease.batch_index)
            assert held is not None
            record = held.record
            pending = PendingBatch(
                batch_id=f"{worker_id}-b{lease.batch_index}", worker_id=worker_id, step=lease.step,
                batch_index=lease.batch_index, policy_version=0, received_at=time.time(), lease=record, samples=batch.samples,
            )  # fmt: skip
            verdicts = validate_batch(pending, tasks=run, backend_for=backend_for, decode=run.decode, checks=checks, newest_version=2)
            rows.append({
                "draws": draws, "kept": draws[-1], "switches": len(switches), "refusals": refusals,
                "accepted": all(v.accepted for v in verdicts),
                "reasons": sorted({v.reason for v in verdicts if not v.accepted}),
                "tokens_after_first_cut": max_new - PROOF_CHUNK,
                "completion_tokens": [len(s.completion_tokens) for s in batch.samples],
            })  # fmt: skip
            worker.close()
            if on_lease is not None:
                on_lease(summary(label, rules, config, rows, max_new, threshold, started))
            print(f"{label} lease {n}: draws {draws} switches {len(switches)} accepted {rows[-1]['accepted']}", flush=True)


def summary(
    label: str, rules: str, config: Any, rows: list[dict[str, Any]], max_new: int, threshold: float, started: float
) -> dict[str, Any]:
    """The results so far (written after every lease, so a run cut short keeps what it measured)."""
    first = [r["draws"][0] for r in rows]
    lifts = [r["kept"] - r["draws"][0] for r in rows]
    n = len(rows)
    mean_lift = sum(lifts) / n if n else float("nan")
    sd = math.sqrt(sum((x - mean_lift) ** 2 for x in lifts) / (n - 1)) if n > 1 else float("nan")
    return {
        "label": label, "rules": rules, "leases": n, "max_new_tokens": max_new, "threshold": threshold,
        "config": {k: getattr(config.orchestrator, k) for k in ("max_versions_per_sample", "switch_deadline_s", "max_decode_tokens_per_s")},
        "honest_mean_reward": sum(first) / n if n else None, "kept_mean_reward": sum(r["kept"] for r in rows) / n if n else None,
        "lift": mean_lift, "lift_se": sd / math.sqrt(n) if n > 1 else None,
        "max_draws": max((len(r["draws"]) for r in rows), default=0),
        "switches_per_lease": [r["switches"] for r in rows], "accepted": sum(r["accepted"] for r in rows),
        "seconds": round(time.monotonic() - started, 1), "rows": rows,
        "code": "this branch" if "switches are off" in _switches_source() else "main",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "python": platform.python_version(),
    }  # fmt: skip


def _switches_source() -> str:
    import prime_rl.orchestrator.switches as switches

    return Path(switches.__file__).read_text()


def report() -> str:
    runs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("reroll_lift_*.json"))]
    lines = [
        "# Keep-or-reroll lift on long completions (issue 46, items 4 and 8)",
        "",
        "`benchmarks/reroll_lift.py`: a real orchestrator (in-process, HTTP on loopback) at step 2 with v1 and v2",
        "committed; an attacker asks each lease at v0 (`GET /tasks?version=0`), decodes the whole no-switch",
        "continuation (real HF decode of the tiny test model, fp32, no EOS: 8 samples x 512 tokens, 480 after a",
        "cut at chunk 1), scores it (1 if the completion has an odd number of digits: Bernoulli(~0.5), every tail",
        "token counts), and rerolls from the next chunk while the lease's mean reward is below 0.5 and the",
        "orchestrator accepts another switch. Lift = kept mean reward - first draw's (an honest lease's), paired",
        "per lease. Every kept lease was judged by the real validator checks (chained forwards, records, seeds).",
        "Measured on a shared 2-core machine (other helpers' processes running); rewards do not depend on speed.",
        "The `main` and `one_switch` rows each join two sessions of their rules (`--append`: 16 leases, stopped by the",
        "per-address lease cap, then 60 more with it raised).",
        "",
        "| code | rules (max_versions / deadline s / cap tok/s) | leases | most draws | switches per lease | honest mean | kept mean | lift +- se | accepted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        c = r["config"]
        se = f"{r['lift_se']:.3f}" if r["lift_se"] is not None else "-"
        lines.append(
            f"| {r['code']} | {r['rules']} ({c['max_versions_per_sample']} / {c['switch_deadline_s']:g} / "
            f"{c['max_decode_tokens_per_s']:g}) | {r['leases']} | {r['max_draws']} | "
            f"{sorted(set(r['switches_per_lease']))} | {r['honest_mean_reward']:.3f} | {r['kept_mean_reward']:.3f} | "
            f"{r['lift']:+.3f} +- {se} | {r['accepted']}/{r['leases']} |"
        )
    lines += ["", "What it says:", ""]
    for r in runs:
        rows = r["rows"]
        rerolled = sum(1 for x in rows if x["switches"] > 0)
        refused = sum(1 for x in rows if x["refusals"])
        third = sum(1 for x in rows if x["switches"] >= 2)
        lines.append(
            f"- {r['code']}, {r['rules']}: {rerolled} of {r['leases']} leases rerolled ({third} twice, a third draw), "
            f"{refused} announcements refused (first: {next((x['refusals'][0] for x in rows if x['refusals']), 'none')[:90]!r}); "
            f"lift {r['lift']:+.3f} per sample"
        )
    lines += [
        "",
        "The lift of one keep-or-reroll is what a run with switches on still gives away (stated in API.md's",
        "threat model); the shipped default (switches off) gives nothing. One switch per lease removes the",
        "third draw (refused 409 where the attacker wanted it); at this sample size the runs with two and three",
        "draws are not told apart by their lift (the third draw was wanted in few leases: most first or second",
        "draws already reached the threshold). The bound of section 4 of docs/inflight.md for an optimal",
        "best-of-2 on a lease of n = 8 Bernoulli(0.5) samples is 0.5 / sqrt(8 pi) = 0.10 per sample.",
        "Each row is one session of its own leases (different assignment keys), so the honest means differ.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", choices=sorted(RULES), default="default")
    parser.add_argument("--label", default=None, help="results file suffix (default: the rules' name)")
    parser.add_argument("--leases", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--budget-s", type=float, default=900.0, help="stop starting leases after this long")
    parser.add_argument("--append", action="store_true", help="add this session's leases to the results file's")
    parser.add_argument("--report", action="store_true", help="only join the results files into reroll_lift.md")
    args = parser.parse_args()
    if not args.report:
        label = args.label or args.rules
        path = RESULTS / f"reroll_lift_{label}.json"

        def save(result: dict[str, Any]) -> None:
            path.write_text(json.dumps(result, indent=1) + "\n")

        earlier = json.loads(path.read_text())["rows"] if args.append and path.exists() else None
        save(session(label, args.rules, args.leases, args.max_new_tokens, args.threshold, args.budget_s, save, earlier))
    (RESULTS / "reroll_lift.md").write_text(report())
    print(report())


if __name__ == "__main__":
    main()
