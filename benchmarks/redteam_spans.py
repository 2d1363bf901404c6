"""Red team of in-flight version spans (issue 38), with real processes.

One ``prime-rl run`` of the test suite's tiny random model (fp32, single-turn arithmetic tasks,
96-token completions with no stop string: three proof chunks each), every role a real process on
loopback: orchestrator, shardcast origin and relay, trainer, validator, one honest worker with
``workers.inflight_updates`` on, and one hostile worker per span forgery of ``redteam/attacks.py``
(the attacks marked ``spans``), each its own identity: the validator bans a fresh identity at its
first rejected lease (issue 34), so one identity is judged once. Every forgery decodes its lease
for real, switching in flight to the next committed version where it needs one
(``redteam/spans.py``), and then claims other spans.

What the run leaves on disk decides (:func:`session`): each judged attack's own verdict reasons
(and a detail line), the orchestrator's refusal of the two it refuses at submission (the worker's
``submit_refused`` metrics line), bans, attacker samples in trainer claims, and the honest
worker's samples, spanned and not, with their verdicts.

Run: ``python benchmarks/redteam_spans.py [--timeout 480] [--lr 1e-5 1e-2]`` (one session per
learning rate: it sets how far apart adjacent versions are); writes
``benchmarks/results/redteam_spans.{md,json}``. ``packages/prime_rl/tests/test_redteam_spans.py``
runs the same session and asserts on it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from prime_rl.metrics import read_metrics
from prime_rl.orchestrator.records import rollout_samples
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.redteam.attacks import ATTACKS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SPAN_ATTACKS = tuple(name for name, attack in ATTACKS.items() if attack.spans)
FOLLOWERS = {"group_rejected", "lease_rejected", "expired"}
MAX_NEW_TOKENS = 96


def write_run_config(tmp: Path, model_dir: Path, ports: list[int], total_steps: int, lr: float) -> Path:
    config: dict[str, Any] = {
        "run_dir": str(tmp / "run"),
        "model": {"path": str(model_dir), "dtype": "float32"},
        "tasks": {"num_tasks": 64, "digits": 1, "seed": 0},
        "sampling": {"group_size": 4, "temperature": 1.0, "max_new_tokens": MAX_NEW_TOKENS, "stop": []},
        "orchestrator": {
            "port": ports[0],
            # a span attack waits inside its lease for the next commit and then decodes (the mid-chunk
            # one token by token, 4-10 s here): at async_level 1 its batch went stale before validation
            "async_level": 4,
            "prompts_per_batch": 2,
            "task_timeout_s": 120.0,  # a span attack waits for the next commit inside its lease
            "release_after_tokens": 0,
            "max_buffered_samples": 64,
            "ban_abandoned_leases": 1000,  # a refused attack's lease expires unanswered: no abandonment ban
            # in-flight switches as the config allows them (issue 46): one per lease, with the mandatory
            # switch and a speed cap, both wide enough never to bind here (the forgeries are what is judged)
            "max_versions_per_sample": 2,
            "switch_deadline_s": 3600.0,
            "max_decode_tokens_per_s": 100000.0,
        },
        "shardcast": {"origin_port": ports[1], "relay_ports": [ports[2]], "keep_versions": 10},
        "trainer": {"total_steps": total_steps, "samples_per_step": 16, "filter_zero_advantage": False, "lr": lr},
        "workers": {"count": 1, "hostile": list(SPAN_ATTACKS), "inflight_updates": True, "weights_poll_s": 0.2},
        "evaluator": {"enabled": False},
    }
    return _conftest().write_toml(tmp / "run.toml", config)


def _conftest() -> Any:
    """prime_rl's tests/conftest.py under its own name (its TOML writer and free ports)."""
    import importlib.util

    name = "prime_rl_tests_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "packages" / "prime_rl" / "tests" / "conftest.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def metrics(run_dir: Path, name: str) -> list[dict[str, Any]]:
    path = run_dir / "metrics" / f"{name}.jsonl"
    return list(read_metrics(path)) if path.exists() else []


def attack_id(names: dict[str, str], name: str) -> str | None:
    """The worker id the orchestrator gave process ``name``."""
    return next((worker_id for worker_id, n in names.items() if n == name), None)


def hostile_name(attack: str) -> str:
    return f"hostile-{SPAN_ATTACKS.index(attack)}"


def _attack_done(run_dir: Path, attack: str, judged: set[str]) -> bool:
    events = metrics(run_dir, hostile_name(attack))
    if ATTACKS[attack].refused:
        return any(e["event"] == "submit_refused" for e in events)
    return any(e["event"] == "rollouts" and e["batch_id"] in judged for e in events)


def _done(run_dir: Path) -> bool:
    """Every attack judged or refused, two commits, and an honest batch with a mid-completion switch judged."""
    judged = {e["batch_id"] for e in metrics(run_dir, "validator") if e["event"] == "verdict"}
    commits = sum(1 for e in metrics(run_dir, "orchestrator") if e["event"] == "commit")
    honest_switched = any(
        e["event"] == "rollouts" and e["switched_samples"] and e["batch_id"] in judged for e in metrics(run_dir, "worker-0")
    )
    return commits >= 2 and honest_switched and all(_attack_done(run_dir, attack, judged) for attack in SPAN_ATTACKS)


def session(
    tmp: Path, model_dir: Path, *, lr: float = 1e-5, timeout_s: float = 480.0, total_steps: int = 30
) -> dict[str, Any]:
    """One run (module docstring) with trainer learning rate ``lr`` until every attack is judged or
    refused (at most ``timeout_s``); what it left on disk, as a dict."""
    config_path = write_run_config(tmp, model_dir, _conftest().free_ports(3), total_steps, lr)
    run_dir = tmp / "run"
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-m", "prime_rl.cli", "run", "--config", str(config_path)]
    started = time.monotonic()
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    finished = False
    try:
        while time.monotonic() - started < timeout_s and run.poll() is None:
            if _done(run_dir):
                finished = True
                break
            time.sleep(1.0)
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
        try:
            output, _ = run.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            run.kill()
            output, _ = run.communicate()
    result = collect(run_dir)
    result.update(returncode=run.returncode, finished=finished, wall_s=round(time.monotonic() - started, 1))
    result["output_tail"] = output[-3000:] if not finished or run.returncode not in (0, 130, -2) else ""
    return result


def collect(run_dir: Path) -> dict[str, Any]:
    """Per attack and for the honest worker, what the run's store and metrics hold."""
    names = {e["worker_id"]: e["worker_name"] for e in metrics(run_dir, "orchestrator") if e["event"] == "register"}
    store = RolloutStore(run_dir / "orchestrator")
    verdicts = store.all_verdicts()
    batches = {record.meta.batch_id: record for record in store.batch_records()}
    claimed = [s for claim in store.claims() for s in claim.sample_ids]
    by_name: dict[str, list[str]] = defaultdict(list)
    for batch_id, record in batches.items():
        by_name[names.get(record.meta.worker_id, "?")].append(batch_id)
    validator_lines = {e["batch_id"]: e for e in metrics(run_dir, "validator") if e["event"] == "verdict"}
    bans = {e["worker_id"]: e["reason"] for e in metrics(run_dir, "validator") if e["event"] == "ban"}

    attacks: dict[str, Any] = {}
    for attack in SPAN_ATTACKS:
        name = hostile_name(attack)
        events = metrics(run_dir, name)
        own: Counter[str] = Counter()
        details: list[str] = []
        accepted = 0
        for batch_id in by_name.get(name, []):
            for v in verdicts.get(batch_id, []):
                accepted += v.accepted
                if not v.accepted and v.reason not in FOLLOWERS:
                    own[str(v.reason)] += 1
                    if len(details) < 3:
                        details.append(f"{v.reason}: {v.detail}")
        attacks[attack] = {
            "identity": name,
            "expected": list(ATTACKS[attack].expected),
            "refused_expected": ATTACKS[attack].refused,
            "batches_stored": len(by_name.get(name, [])),
            # samples that claimed a switch (a lease whose samples all ended before the claimed boundary
            # claims none: the forgery's shape is then missing, e.g. no sample ran past 64 for the shift)
            "samples_claiming_spans": sum(
                1 for b in by_name.get(name, []) for s in rollout_samples(store.read_batch(b)) if s.spans and len(s.spans) > 1
            ),
            "batches_judged": sum(1 for b in by_name.get(name, []) if b in verdicts),
            "own_reasons": dict(own),
            "accepted": accepted,
            "details": details,
            "refused": [
                {"status": e["status"], "error": e["error"], "message": e["message"]}
                for e in events
                if e["event"] == "submit_refused"
            ],
            # the validator's ban (the worker itself learns of it at its next request)
            "banned": attack_id(names, name) in bans,
            "generation_errors": sum(1 for e in events if e["event"] == "error"),
            "in_trainer_claims": sum(1 for s in claimed if s.batch_id in by_name.get(name, [])),
            "validator_seconds": [validator_lines[b]["seconds"] for b in by_name.get(name, []) if b in validator_lines],
        }

    honest: dict[str, Any] = {"batches": 0, "samples": 0, "accepted": 0, "rejected": {}, "expired": 0,
                              "spanned_samples": 0, "spanned_accepted": 0, "spanned_batches": 0,
                              "validator_s_per_sample_spanned": [], "validator_s_per_sample_plain": []}  # fmt: skip
    rejected: Counter[str] = Counter()
    for batch_id in by_name.get("worker-0", []):
        samples = rollout_samples(store.read_batch(batch_id))
        judged = verdicts.get(batch_id, [])
        spanned = [i for i, s in enumerate(samples) if s.spans and len(s.spans) > 1]
        honest["batches"] += 1
        honest["samples"] += len(samples)
        honest["spanned_samples"] += len(spanned)
        honest["spanned_batches"] += bool(spanned)
        for v in judged:
            if v.accepted:
                honest["accepted"] += 1
                honest["spanned_accepted"] += v.sample_index in spanned
            elif v.reason == "expired":
                honest["expired"] += 1
            else:
                rejected[str(v.reason)] += 1
        if batch_id in validator_lines and judged:
            key = "validator_s_per_sample_spanned" if spanned else "validator_s_per_sample_plain"
            honest[key].append(round(validator_lines[batch_id]["seconds"] / len(samples), 4))
    honest["rejected"] = dict(rejected)
    honest["in_trainer_claims"] = sum(1 for s in claimed if s.batch_id in by_name.get("worker-0", []))
    honest["newest_span_version"] = max(
        (e["newest_span_version"] for e in metrics(run_dir, "worker-0") if e["event"] == "rollouts"), default=0
    )
    commits = sum(1 for e in metrics(run_dir, "orchestrator") if e["event"] == "commit")
    return {"attacks": attacks, "honest": honest, "commits": commits, "claimed_samples": len(claimed)}


def _median(values: list[float]) -> float | None:
    return sorted(values)[len(values) // 2] if values else None


def report(results: dict[float, dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Red team: in-flight version spans (issue 38), real processes",
        "",
        f"Written by `benchmarks/redteam_spans.py` on {meta['date']} ({meta['machine']}, shared with other jobs); raw:",
        "`redteam_spans.json`. Each session is one `prime-rl run` of the tiny random model (fp32, 96-token completions,",
        "8 samples per lease, async_level 4): an honest worker with `workers.inflight_updates` on and one hostile",
        "identity per span forgery of `redteam/attacks.py`, each decoding its lease for real (switching in flight to",
        "the next committed version where the attack needs it) before it forges its claim. The trainer's learning",
        "rate sets how far apart two adjacent versions are: at the default 1e-5 one AdamW step moves each weight by",
        "about 1e-5; at 1e-2 by about 1e-2. `own reasons` are the validator's per-sample verdicts other than",
        "`lease_rejected` / `group_rejected` (samples counted).",
    ]
    for lr, result in results.items():
        lines += [
            "",
            f"## trainer.lr = {lr:g}",
            "",
            f"Run: {result['wall_s']} s, {result['commits']} commits, every attack judged or refused: {result['finished']}.",
            "",
            "| attack | expected (hostile.ATTACKS) | own reasons (samples) | refused at submission | banned by validator | samples trained |",
            "|---|---|---|---|---|---|",
        ]
        for attack, a in result["attacks"].items():
            expected = a["refused_expected"] or " / ".join(a["expected"])
            own = ", ".join(f"{r} ({n})" for r, n in sorted(a["own_reasons"].items())) or "-"
            refused = "; ".join(f"{r['status']} {r['error']}: {r['message']}" for r in a["refused"][:1] if r["status"] != 403) or "-"
            lines.append(
                f"| `{attack}` | {expected} | {own} | {refused} | {'yes' if a['banned'] else 'no'} | {a['in_trainer_claims']} |"
            )
        h = result["honest"]
        lines += [
            "",
            "First rejection detail of each judged attack:",
            "",
            *[f"- `{attack}`: {a['details'][0]}" for attack, a in result["attacks"].items() if a["details"]],
            "",
            f"Honest in-flight worker: {h['batches']} batches, {h['samples']} samples, {h['accepted']} accepted, rejected "
            f"{h['rejected'] or 'none'}, {h['expired']} expired (the rest not judged when the run stopped); {h['spanned_samples']} "
            f"samples in {h['spanned_batches']} batches switched version mid-completion, {h['spanned_accepted']} of them "
            f"accepted; {h['in_trainer_claims']} of its samples in trainer claims. Validator seconds per sample of its batches "
            f"(median): with a switch {_median(h['validator_s_per_sample_spanned'])}, without "
            f"{_median(h['validator_s_per_sample_plain'])}.",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=480.0, help="seconds per session at most")
    parser.add_argument("--lr", type=float, nargs="+", default=[1e-5, 1e-2], help="one session per trainer.lr")
    args = parser.parse_args()
    import tempfile

    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from tiny_lm import save_tiny_lm

    results: dict[float, dict[str, Any]] = {}
    for lr in args.lr:
        with tempfile.TemporaryDirectory() as tmp:
            results[lr] = session(Path(tmp), save_tiny_lm(Path(tmp) / "model"), lr=lr, timeout_s=args.timeout)
    meta = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = {"meta": meta, "sessions": {str(lr): result for lr, result in results.items()}}
    (RESULTS / "redteam_spans.json").write_text(json.dumps(raw, indent=1, default=str))
    (RESULTS / "redteam_spans.md").write_text(report(results, meta))
    print(report(results, meta))


if __name__ == "__main__":
    main()
