"""K validators in the swarm rehearsal (issue 45 item 6): K = 1, 2, 4, real and emulated prefill cost.

    python benchmarks/swarm_scaling.py --identities 256 --steps 16 --ks 1,2,4 --emulated-ms 2
    python benchmarks/swarm_scaling.py --identities 256 --ks 3 --kills 6 --targets validator,validator-1,validator-2

Each row is one ``benchmarks/swarm.py`` run (its own process, its own root, deleted afterwards unless
``--keep``) with ``--validators K``: the same swarm, the same seed, one validator count after the
other, so the rows compare under the same load. ``real``: the validators compute on this machine's
CPU; ``emulated``: each validator's prefill takes at least ``--emulated-ms`` per token (a sleep
after the real prefill, ``validator/emulated_cost.py``: BENCHMARK EMULATION of a validator on a GPU
of its own, where K validators do not share cores). Per row: samples judged per second (all
validators, ``swarm_validators.py``), the ratio to K = 1 of the same cost, batches prefilled twice
(by cause), batches judged twice, the honest samples' expired share, honest rejected / banned and the
invariants. The rows go to ``<out>`` (JSON) and are printed as a markdown table; the notes around
them are hand-written in ``benchmarks/results/validators.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def run_one(args: argparse.Namespace, k: int, emulated_ms: float, root: Path) -> dict[str, Any]:
    argv = [
        sys.executable, str(REPO / "benchmarks" / "swarm.py"), "--identities", str(args.identities),
        "--steps", str(args.steps), "--validators", str(k), "--batches-per-poll", str(args.batches_per_poll),
        "--seed", str(args.seed), "--root", str(root), "--no-record", "--timeout-s", str(args.timeout_s),
    ]  # fmt: skip
    if emulated_ms:
        argv += ["--emulated-prefill-ms-per-token", str(emulated_ms)]
    if args.kills:
        argv += ["--kills", str(args.kills), "--kill-gap-s", str(args.kill_gap_s), "--validator-lease-s", str(args.validator_lease_s)]
        if args.targets:
            argv += ["--targets", args.targets]
    started = time.time()
    with (root.parent / f"{root.name}.out").open("wb") as out:
        code = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    figures = json.loads((root / "figures.json").read_text()) if (root / "figures.json").exists() else {}
    summary, validators = figures.get("summary", {}), figures.get("validators", {})
    return {
        "validators": k, "cost": f"emulated {emulated_ms} ms/token" if emulated_ms else "real (CPU)",
        "emulated_ms_per_token": emulated_ms, "exit_code": code, "seconds": round(time.time() - started),
        "samples_judged": validators.get("samples_judged"), "samples_judged_per_s": validators.get("samples_judged_per_s"),
        "per_validator": validators.get("samples_judged_per_validator"),
        "batches_prefilled": validators.get("batches_prefilled"),
        "prefilled_twice": validators.get("prefilled_twice"), "judged_twice": validators.get("judged_twice"),
        "expired_share": validators.get("expired_share"),
        "honest_rejected": summary.get("honest_rejected"), "honest_banned": summary.get("honest_banned"),
        "invariants_ok": summary.get("invariants_ok"), "violations": {n: ids for n, ids in figures.get("invariants", {}).items() if ids},
        "kills": [k_["target"] for k_ in figures.get("kills", [])], "load_average": summary.get("load_average"),
    }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    base = {r["cost"]: r["samples_judged_per_s"] for r in rows if r["validators"] == 1}
    lines = [
        "| cost | K | samples judged/s | vs K=1 | prefilled twice: while a lease held / after a validator kill / after an orchestrator restart | judged twice | honest expired share | honest rejected / banned | invariants | kills | load avg start / end |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rate, one = r["samples_judged_per_s"], base.get(r["cost"])
        ratio = f"{rate / one:.2f}x" if rate and one else "-"
        twice, judged = r["prefilled_twice"] or {}, r["judged_twice"] or {}
        load = " / ".join(f"{x:.1f}" for x in r["load_average"] or [])
        lines.append(
            f"| {r['cost']} | {r['validators']} | {rate} | {ratio} | {twice.get('while_lease_held')} / "
            f"{twice.get('after_validator_kill')} / {twice.get('after_orchestrator_restart')} | "
            f"{judged.get('while_lease_held')} / {judged.get('after_validator_kill')} / {judged.get('after_orchestrator_restart')} | "
            f"{r['expired_share']} | {r['honest_rejected']} / {r['honest_banned']} | "
            f"{'hold' if r['invariants_ok'] else 'VIOLATED'} | {len(r['kills'])} | {load} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--identities", type=int, default=256)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--ks", default="1,2,4", help="validator counts, comma-separated")
    parser.add_argument("--emulated-ms", type=float, default=2.0, help="emulated floor, ms per prefilled token")
    parser.add_argument("--costs", default="emulated,real", help="which costs to run: emulated, real or both")
    parser.add_argument("--batches-per-poll", type=int, default=2)
    parser.add_argument("--kills", type=int, default=0)
    parser.add_argument("--kill-gap-s", type=float, default=6.0)
    parser.add_argument("--validator-lease-s", type=float, default=10.0, help="with --kills: a killed validator's lease")
    parser.add_argument("--targets", default="", help="with --kills: swarm.py --targets")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--out", default="", help="JSON of the rows (default: none)")
    parser.add_argument("--keep", action="store_true", help="keep each run's folder")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    work = Path(tempfile.mkdtemp(prefix="swarm-scaling-"))
    rows: list[dict[str, Any]] = []
    for cost in args.costs.split(","):
        for k in (int(x) for x in args.ks.split(",")):
            root = work / f"{cost}-k{k}"
            row = run_one(args, k, args.emulated_ms if cost == "emulated" else 0.0, root)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
            if args.out:
                Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
