"""In-flight, between-lease and synchronous weight updates on the real CPU runtime (issue 38 item 4).

Runs the whole pipeline (``prime-rl run``: orchestrator, shardcast origin + relay, trainer, validator,
2 honest HF workers) on the tiny random Llama of ``tests/support`` once per mode and repeat, modes
alternating within each repeat so machine noise hits every mode alike, and reads each run's
metrics files:

* ``sync``: ``orchestrator.async_level = 0`` (on-policy: step s trains only version-s rollouts);
* ``between_lease``: ``async_level = 1``, in-flight updates off (today's default: a worker loads a
  newer version only between leases; ``max_off_policy_steps`` = async_level);
* ``inflight``: ``async_level = 1``, ``max_off_policy_steps = 2``, ``workers.inflight_updates = true``
  (the worker switches at the first 32-token proof-chunk boundary after a newer committed version
  has loaded, keeping the KV cache; docs/inflight.md section 0);
* ``inflight_same_bound``: in-flight at between-lease's bound (``max_off_policy_steps = 1``), which
  separates what the switch does from what the looser bound does.

Reported per run (medians over repeats in the table, every run in the ``.json``):

* trained tokens per second: completion tokens the trainer trained on (the sum of its ``batch``
  events' ``token_staleness`` histograms, i.e. model tokens) over the wall-clock from the trainer's
  start to its last commit;
* token staleness: the trainer's per-claim token-staleness histograms summed (versions behind the
  step that trained them; :mod:`prime_rl.api.staleness`), with mean, p50 and max; samples with 2+
  versions; stale drops per reason (the orchestrator's last ``claim`` event);
* validator seconds per sample: the validator's ``verdict`` events, total seconds / samples, and the
  same over the batches holding spanned samples;
* trainer waiting for data and worker generation time.

The tiny model's weights are random, so its rewards are 0 and a held-out evaluator learns nothing:
the evaluator is off and the zero-advantage filter too (the trainer still trains every sample). The
held-out curve against wall-clock needs the demo model (``make run``), which takes 15-40 minutes per
run on this machine; it is not part of this benchmark.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/inflight_modes.py --steps 4 --repeats 2

writes ``benchmarks/results/inflight_modes.{md,json}`` (with the load average before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from tiny_lm import save_tiny_lm  # noqa: E402

from prime_rl.api.staleness import histogram, histogram_mean, histogram_quantile, merge_histograms  # noqa: E402
from prime_rl.metrics import read_metrics  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"

SWITCHES = {  # in-flight switches as the config allows them (issue 46): one per lease, mandatory, speed-capped
    "orchestrator.max_versions_per_sample": "2",
    "orchestrator.switch_deadline_s": "60",
    "orchestrator.max_decode_tokens_per_s": "100000",  # the tiny model on CPU: the cap never binds an honest decode
}

MODES: dict[str, dict[str, str]] = {
    "sync": {"orchestrator.async_level": "0", "workers.inflight_updates": "false"},
    "between_lease": {"orchestrator.async_level": "1", "workers.inflight_updates": "false"},
    "inflight": {
        "orchestrator.async_level": "1",
        "orchestrator.max_off_policy_steps": "2",
        "workers.inflight_updates": "true",
        **SWITCHES,
    },
    "inflight_same_bound": {
        "orchestrator.async_level": "1",
        "orchestrator.max_off_policy_steps": "1",
        "workers.inflight_updates": "true",
        **SWITCHES,
    },
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_once(
    model_dir: Path, run_dir: Path, mode: str, steps: int, timeout_s: float, max_new_tokens: int
) -> dict[str, Any]:
    overrides = {
        "sampling.max_new_tokens": str(max_new_tokens),
        "run_dir": str(run_dir),
        "model.path": str(model_dir),
        "orchestrator.port": str(free_port()),
        "shardcast.origin_port": str(free_port()),
        "shardcast.relay_ports": f"[{free_port()}]",
        "trainer.total_steps": str(steps),
        "trainer.filter_zero_advantage": "false",
        "trainer.checkpoint_every": str(steps),
        "workers.count": "2",
        "workers.hostile": "[]",
        "workers.backend": "hf",
        "evaluator.enabled": "false",
        **MODES[mode],
    }
    argv = [sys.executable, "-m", "prime_rl.cli", "run", "--config", str(ROOT / "configs" / "tiny-cpu.toml")]
    for key, value in overrides.items():
        argv += [f"--{key}", value]
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    load_before = load()
    started = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{mode}: run failed ({done.returncode}); logs in {run_dir}/logs\n{done.stderr[-3000:]}")
    return {"mode": mode, "total_s": time.time() - started, "load_before": load_before, **read_run(run_dir)}


def read_run(run_dir: Path) -> dict[str, Any]:
    """The numbers of one finished run, from its metrics files."""
    metrics = run_dir / "metrics"
    trainer = list(read_metrics(metrics / "trainer.jsonl"))
    commits = [r["time"] for r in trainer if r.get("event") == "commit"]
    trainer_started = min(r["time"] for r in trainer if r.get("event") == "start")
    batches = [r for r in trainer if r.get("event") == "batch"]
    tokens = merge_histograms([histogram(r.get("token_staleness")) for r in batches])
    rollouts = merge_histograms([histogram(r.get("rollout_staleness")) for r in batches])
    spans = merge_histograms([histogram(r.get("spans_per_sample")) for r in batches])
    claims = [r for r in read_metrics(metrics / "orchestrator.jsonl") if r.get("event") == "claim"]
    verdicts = [r for p in sorted(metrics.glob("validator*.jsonl")) for r in read_metrics(p) if r.get("event") == "verdict"]
    spanned = [r for r in verdicts if r.get("spanned_samples")]
    generate_s = sum(
        r.get("generate_s", 0.0)
        for p in sorted(metrics.glob("worker-*.jsonl"))
        for r in read_metrics(p)
        if r.get("event") == "rollouts"
    )
    wall = max(commits) - trainer_started
    trained = sum(tokens.values())

    def per_sample(records: list[dict[str, Any]]) -> float | None:
        samples = sum(r.get("samples", 0) for r in records)
        return sum(r.get("seconds", 0.0) for r in records) / samples if samples else None

    return {
        "steps": len(commits),
        "wall_s": wall,
        "trained_tokens": trained,
        "trained_tokens_per_s": trained / wall if wall > 0 else 0.0,
        "token_staleness": tokens,
        "token_staleness_mean": histogram_mean(tokens),
        "token_staleness_p50": histogram_quantile(tokens, 0.5),
        "token_staleness_max": max(tokens, default=0),
        "rollout_staleness": rollouts,
        "spans_per_sample": spans,
        "stale_drops": claims[-1].get("stale_drops", {}) if claims else {},
        "validator_s_per_sample": per_sample(verdicts),
        "validator_s_per_sample_spanned_batches": per_sample(spanned),
        "validated_samples": sum(r.get("samples", 0) for r in verdicts),
        "trainer_wait_s": sum(r.get("waited_s", 0.0) for r in batches),
        "worker_generate_s": generate_s,
    }


def _shares(counts: dict[int, int]) -> str:
    total = sum(counts.values())
    return " ".join(f"{k}:{v / total:.2f}" for k, v in sorted(counts.items())) if total else "-"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def report(runs: list[dict[str, Any]], header: str) -> str:
    lines = [
        "# In-flight vs between-lease vs synchronous, real CPU runtime (benchmarks/inflight_modes.py)",
        "",
        header,
        "",
        "Columns (medians over repeats; each run in the .json): trained tok/s = completion tokens trained / "
        "wall-clock from trainer start to last commit; token staleness = versions behind the training step, "
        "token-weighted over all steps (shares per version; mean, p50, max); 2+ versions = trained samples "
        "with an in-flight switch; stale drops = each run's last claim, summed over runs (past_bound / expired / "
        "stale_policy); validator s/sample = verdict seconds / samples (all batches; batches with spans).",
        "",
        "| mode | runs | steps | wall s | trained tok/s | token staleness shares | mean | p50 | max | "
        "2+ versions / trained samples | stale drops | validator s/sample | (spanned batches) | trainer wait s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            continue

        def med(key: str, rows: list[dict[str, Any]] = mine) -> float:
            return statistics.median(r[key] for r in rows)

        tokens = merge_histograms([r["token_staleness"] for r in mine])
        spans = merge_histograms([r["spans_per_sample"] for r in mine])
        multi = sum(v for k, v in spans.items() if k > 1)
        drops = {k: sum(r["stale_drops"].get(k, 0) for r in mine) for k in ("past_bound", "expired", "stale_policy")}
        spanned = [r["validator_s_per_sample_spanned_batches"] for r in mine if r["validator_s_per_sample_spanned_batches"]]
        lines.append(
            f"| {mode} | {len(mine)} | {med('steps'):g} | {med('wall_s'):.0f} | {med('trained_tokens_per_s'):.1f} | "
            f"{_shares(tokens)} | {histogram_mean(tokens):.2f} | {histogram_quantile(tokens, 0.5)} | {max(tokens, default=0)} | "
            f"{multi} / {sum(spans.values())} | {drops['past_bound']}/{drops['expired']}/{drops['stale_policy']} | "
            f"{_seconds(med('validator_s_per_sample'))} | {_seconds(statistics.median(spanned) if spanned else None)} | "
            f"{med('trainer_wait_s'):.0f} |"
        )
    lines += [
        "",
        "Per run (in run order; load average 1/5/15 min when the run started):",
        "",
        "| mode | repeat | load at start | wall s | trained tok/s | token staleness mean | 2+ versions | validator s/sample |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        multi = sum(v for k, v in r["spans_per_sample"].items() if int(k) > 1)
        lines.append(
            f"| {r['mode']} | {r['repeat']} | {r['load_before']} | {r['wall_s']:.0f} | {r['trained_tokens_per_s']:.1f} | "
            f"{r['token_staleness_mean']:.2f} | {multi} | {_seconds(r['validator_s_per_sample'])} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="policy steps per run")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument(
        "--max-new-tokens", type=int, default=256,
        help="completion cap (the random model rarely stops): leases must outlast a step for switches to happen",
    )
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of the tiny Llama")
    parser.add_argument("--layers", type=int, default=4, help="layers of the tiny Llama")
    parser.add_argument("--out", type=Path, default=RESULTS / "inflight_modes", help="writes OUT.md and OUT.json")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    load_start = load()
    runs: list[dict[str, Any]] = []

    def write() -> str:  # after every run, so a run cut short still leaves the finished ones
        header = (
            f"`{' '.join(sys.argv)}` at {started} on this machine: 2 CPU cores shared with other jobs, "
            f"OMP_WAIT_POLICY=PASSIVE; load average (1/5/15 min) {load_start} at the start, {load()} after the "
            f"last run (each run's start: .json). Tiny random Llama (hidden {args.hidden}, {args.layers} layers, "
            f"fp32), configs/tiny-cpu.toml with 2 honest HF workers, no hostile worker, evaluator off, "
            f"max_new_tokens {args.max_new_tokens}, zero-advantage filter off, {args.steps} policy steps per run, "
            f"{len(runs)} runs, modes alternating. Mode overrides: `{json.dumps(MODES)}`."
        )
        text = report(runs, header)
        args.out.with_suffix(".md").write_text(text)
        args.out.with_suffix(".json").write_text(
            json.dumps({"command": sys.argv, "started": started, "modes": MODES, "runs": runs}, indent=1, default=str)
        )
        return text

    with tempfile.TemporaryDirectory(prefix="inflight-modes-") as tmp:
        model_dir = save_tiny_lm(Path(tmp) / "tiny-lm", hidden_size=args.hidden, num_layers=args.layers)
        for repeat in range(args.repeats):
            order = args.modes if repeat % 2 == 0 else args.modes[::-1]  # alternate the order per repeat
            for mode in order:
                result = run_once(
                    model_dir, Path(tmp) / f"run-{mode}-r{repeat}", mode, args.steps, args.timeout, args.max_new_tokens
                )
                result["repeat"] = repeat
                runs.append(result)
                print(
                    f"# {mode} repeat {repeat}: {result['trained_tokens_per_s']:.1f} trained tok/s, wall "
                    f"{result['wall_s']:.0f} s, staleness {result['token_staleness']}, spans {result['spans_per_sample']}, "
                    f"validator {_seconds(result['validator_s_per_sample'])} s/sample, load {result['load_before']}",
                    flush=True,
                )
                write()
    print(write())


if __name__ == "__main__":
    main()
