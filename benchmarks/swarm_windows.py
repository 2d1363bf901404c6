"""Windows of a long swarm run (issue 44, item 6): throughput, latency and memory from its start to
its end, read from what a finished ``benchmarks/swarm.py --root ROOT`` run left in ``ROOT``.

    python benchmarks/swarm.py --identities 256 --kills 20 --kill-gap-s 150 --validators 2 --seed 3 \\
        --steps 2100 --timeout-s 3900 --root /tmp/swarm_long --no-record
    python benchmarks/swarm_windows.py /tmp/swarm_long --window-s 300 --out benchmarks/results/swarm_long

Per window of ``--window-s`` seconds, from the first batch the swarm submitted to the last:

  - batches submitted (2xx answers the hosts recorded) and honest ones, per second: lease cycles;
  - samples the validators judged (their ``verdict`` events), per second;
  - steps the trainer published;
  - ``/tasks`` and ``/rollouts`` answer times, p50 / p99 (every answer, 429s included: what a worker
    waits for), from the hosts' request records;
  - trusted calls (validators' and trainer's calls to the orchestrator): the worst 10 s window's p99;
  - resident memory of the orchestrator, validators and trainer, the window's largest sample (every 2 s,
    ``rss.json``);
  - kills in the window.

The first window is warm-up (start-up, the first versions, registrations). The comparison line sets
the last full window against the first window after it: the goal is throughput and p99 within 20%
(a last window shorter than half a window is left out, as is the run's last 30 s, when it stops).
Writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from swarm_checks import RunRecords, read_jsonl
from swarm_figures import _ms, _quantile  # the figures' own p50/p99 and rounding

TRUSTED_PREFIXES = ("validator", "trainer")


def windows(root: Path, window_s: float) -> dict[str, Any]:
    """The per-window figures of the run in ``root`` (module docstring)."""
    records = RunRecords.read(root)
    metrics = root / "run" / "metrics"
    submitted = records.of("submitted")
    requests = records.of("request")
    if not submitted:
        raise SystemExit(f"{root}: no batch was submitted")
    start = min(r["t"] for r in submitted)
    end = max(r["t"] for r in submitted) - 30.0  # the run's last seconds: it stops
    count = max(1, int((end - start) // window_s) + (1 if (end - start) % window_s >= window_s / 2 else 0))
    verdicts = [r for path in metrics.glob("validator*.jsonl") for r in read_jsonl(path) if r.get("event") == "verdict"]
    published = [r for r in read_jsonl(metrics / "trainer.jsonl") if r.get("event") == "published"]
    calls = [
        r for path in metrics.glob("*.jsonl") if path.stem.startswith(TRUSTED_PREFIXES)
        for r in read_jsonl(path) if r.get("event") == "orchestrator_calls"
    ]  # fmt: skip
    rss_path = root / "rss.json"
    rss = json.loads(rss_path.read_text()) if rss_path.exists() else []
    figures = json.loads((root / "figures.json").read_text()) if (root / "figures.json").exists() else {}
    kills = figures.get("kills", [])

    def index(t: float) -> int | None:
        i = int((t - start) // window_s)
        return i if 0 <= i < count and t <= end else None

    rows: list[dict[str, Any]] = []
    for i in range(count):
        lo = start + i * window_s
        hi = min(end, lo + window_s)
        rows.append({"window": i, "from_s": round(lo - start), "to_s": round(hi - start), "seconds": hi - lo})
    per: dict[int, dict[str, Any]] = defaultdict(lambda: defaultdict(list))
    for r in submitted:
        if (w := index(r["t"])) is not None:
            per[w]["submitted"].append(r)
    for r in requests:
        if (w := index(r["t"])) is not None:
            per[w][r["path"]].append(r["s"])
    for r in verdicts:
        if (w := index(r["time"])) is not None:
            per[w]["judged"].append(r.get("samples", 0))
    for r in published:
        if (w := index(r["time"])) is not None:
            per[w]["published"].append(1)
    for r in calls:
        if (w := index(r["time"])) is not None:
            per[w]["trusted_p99"] += [c["p99_ms"] for c in r["calls"].values()]
    for r in rss:
        if (w := index(r["t"])) is not None:
            per[w][f"rss_{r['process']}"].append(r["rss_mb"])
    for k in kills:
        if (w := index(k["t"])) is not None:
            per[w]["kills"].append(k["target"])
    for row in rows:
        got, seconds = per[row["window"]], row["seconds"]
        honest = [r for r in got["submitted"] if r.get("honest")]
        row.update(
            {
                "lease_cycles_per_s": round(len(got["submitted"]) / seconds, 2),
                "honest_cycles_per_s": round(len(honest) / seconds, 2),
                "samples_judged_per_s": round(sum(got["judged"]) / seconds, 2),
                "steps": len(got["published"]),
                "tasks_p50_ms": _ms(_quantile(got["/tasks"], 0.5)),
                "tasks_p99_ms": _ms(_quantile(got["/tasks"], 0.99)),
                "rollouts_p99_ms": _ms(_quantile(got["/rollouts"], 0.99)),
                "trusted_p99_ms_worst": max(got["trusted_p99"], default=None),
                "rss_mb": {
                    name.removeprefix("rss_"): round(max(values))
                    for name, values in sorted(got.items()) if name.startswith("rss_")
                },
                "kills": got["kills"],
            }
        )  # fmt: skip
    out: dict[str, Any] = {"root": str(root), "window_s": window_s, "windows": rows, "summary": figures.get("summary", {})}
    full = [r for r in rows[1:] if r["seconds"] >= window_s / 2]
    if len(full) >= 2:
        first, last = full[0], full[-1]
        out["last_vs_first_after_warmup"] = {
            "windows": [first["window"], last["window"]],
            "lease_cycles": _ratio(last["lease_cycles_per_s"], first["lease_cycles_per_s"]),
            "samples_judged": _ratio(last["samples_judged_per_s"], first["samples_judged_per_s"]),
            "tasks_p99": _ratio(last["tasks_p99_ms"], first["tasks_p99_ms"]),
            "rollouts_p99": _ratio(last["rollouts_p99_ms"], first["rollouts_p99_ms"]),
            "trusted_p99_worst": _ratio(last["trusted_p99_ms_worst"], first["trusted_p99_ms_worst"]),
            "orchestrator_rss": _ratio(last["rss_mb"].get("orchestrator"), first["rss_mb"].get("orchestrator")),
            "cycles_median_over_windows": statistics.median(r["lease_cycles_per_s"] for r in full),
        }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| window | s | lease cycles/s (honest) | samples judged/s | steps | /tasks p50 / p99 ms | /rollouts p99 ms "
        "| trusted calls p99 ms (worst 10 s) | RSS MB | kills |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["windows"]:
        rss = ", ".join(f"{k} {v}" for k, v in r["rss_mb"].items())
        lines.append(
            f"| {r['window']} | {r['from_s']}-{r['to_s']} | {r['lease_cycles_per_s']} ({r['honest_cycles_per_s']}) "
            f"| {r['samples_judged_per_s']} | {r['steps']} | {r['tasks_p50_ms']} / {r['tasks_p99_ms']} "
            f"| {r['rollouts_p99_ms']} | {r['trusted_p99_ms_worst']} | {rss} | {len(r['kills'])} |"
        )
    if "last_vs_first_after_warmup" in result:
        lines += ["", "Last window against the first after warm-up (ratio, 1.0 = flat):", ""]
        lines += [f"- {k}: {v}" for k, v in result["last_vs_first_after_warmup"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="a finished swarm.py run's --root")
    parser.add_argument("--window-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    args = parser.parse_args()
    result = windows(args.root, args.window_s)
    text = markdown(result)
    print(text)
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
        args.out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
