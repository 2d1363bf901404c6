"""The tables of benchmarks/broadcast_tree.py: one row per (depth, N), plus the payload's delta sizes.

Time-to-all of a version: from the moment `publish_file` returned (the version is listed at the
origin) until the last client placed the verified file. Delta versions are pooled over the
versions and repeats of a configuration: min / median of each version's p50 and max.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import broadcast_tree_payload as payloads


def _min_median(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    return f"{min(values):.1f} / {statistics.median(values):.1f}"


def _median(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    return f"{statistics.median(values):.1f}" if values else "n/a"


def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e6:.2f}"


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per (depth, clients), in the order the runs came."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["depth"], run["clients"]), []).append(run)
    rows = []
    for (depth, clients), group in groups.items():
        full = [v for run in group for v in run["versions"] if v["delta_bytes"] is None]
        delta = [v for run in group for v in run["versions"] if v["delta_bytes"] is not None]
        tiers = sorted({t for v in delta for t in v["egress_relay_by_tier"]})
        relay_egress = {
            tier: statistics.mean(b for v in delta for b in v["egress_relay_by_tier"][tier]) for tier in tiers
        }
        wire = {}
        for run in group:
            for tier, values in run["wire_tx_bytes_by_tier"].items():
                wire.setdefault(int(tier), []).extend(values)
        rows.append(
            {
                "depth": depth,
                "clients": clients,
                "relays": group[0]["relays"],
                "runs": len(group),
                "ok": all(run["ok"] for run in group),
                "emulated": all(run["emulated"] for run in group),
                "full_p50": [v["time_to_all_p50_s"] for v in full],
                "full_max": [v["time_to_all_max_s"] for v in full],
                "delta_p50": [v["time_to_all_p50_s"] for v in delta],
                "delta_max": [v["time_to_all_max_s"] for v in delta],
                "relays_done_delta": [v["relays_done_max_s"] for v in delta],
                "relay_start_delta": {
                    tier: [v["relay_start_by_tier"][tier] for v in delta]
                    for tier in sorted({t for v in delta for t in v["relay_start_by_tier"]})
                },
                "fetch_s_delta": [v["fetch_s_p50"] for v in delta],
                "bytes_full": statistics.mean(v["bytes_per_client_mean"] or 0 for v in full)
                if full
                else None,
                "bytes_delta": statistics.mean(v["bytes_per_client_mean"] or 0 for v in delta)
                if delta
                else None,
                "used_delta": sum(v["clients_used_delta"] for v in delta),
                "delta_fetches": sum(v["clients_done"] for v in delta),
                "origin_egress_delta": statistics.mean(v["egress_origin"] for v in delta) if delta else None,
                "relay_egress_delta": relay_egress,
                "wire_tx_mean": {tier: statistics.mean(values) for tier, values in sorted(wire.items())},
                "cpu_share": [run["cpu_s"] / run["wall_s"] for run in group],
                "wall_s": [run["wall_s"] for run in group],
                "load": [run["load_before"][0] for run in group] + [run["load_after"][0] for run in group],
            }
        )
    return rows


def write_report(
    args: argparse.Namespace,
    payload: payloads.Payload,
    sizes: dict[float, list[payloads.DeltaSize]],
    runs: list[dict[str, Any]],
    out: Path,
) -> None:
    """Write `out`.md (tables) and `out`.json (every run, every version)."""
    summary = summarise(runs)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        f"# Policy broadcast through a relay tree over the emulated WAN ({stamp})",
        "",
        f"Command: `python benchmarks/broadcast_tree.py --grid {args.grid} --fanout {args.fanout} "
        f"--per-host {args.per_host} --repeat {args.repeat} --versions {args.versions} --lr {args.lr:g}`",
        f"Network (first run): {runs[0]['network']}" if runs else "Network: no run",
        f"Machine: {os.cpu_count()} CPUs shared with other jobs; load average (1 min) at the start and end of the runs: "
        f"{min(min(r['load']) for r in summary):.1f} to {max(max(r['load']) for r in summary):.1f}."
        if summary
        else "",
        "",
        f"Payload: Qwen2-shaped model built in code, {payload.parameters / 1e6:.1f} M parameters, "
        f"bf16 safetensors of {payload.size / 1e6:.1f} MB per version, {args.shard_size / 1e6:g} MB shards; "
        f"version 1 is the initial model, each later version one AdamW step (lr {args.lr:g}, batch 8 x 128 tokens) "
        "on fp32 master weights, published with `publish_file(..., delta=True)`.",
        "",
        "Times in seconds from the moment the version was listed at the origin; for delta versions, "
        "min / median over every delta version of every repeat.",
        "",
        "| depth | N | relays | v1 full: time-to-all p50 / max | deltas: time-to-all p50 | deltas: time-to-all max "
        "| deltas: last relay of each tier started | deltas: a client's own fetch, median "
        "| deltas: last relay complete (full shards too) | bytes per client, full / delta MB | clients on deltas "
        "| origin egress per delta version, MB | relay egress per delta version by tier, MB (mean per relay) "
        "| bytes sent on relay links, whole run, by tier, MB (mean) | child CPU s / wall s | load (1 min) "
        "| wall s | all verified |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary:
        full = f"{_median(row['full_p50'])} / {_median(row['full_max'])}"
        starts = ", ".join(f"t{t}: {_min_median(v)}" for t, v in row["relay_start_delta"].items())
        lines.append(
            f"| {row['depth']} | {row['clients']} | {row['relays']} | {full} | {_min_median(row['delta_p50'])} "
            f"| {_min_median(row['delta_max'])} | {starts} | {_min_median(row['fetch_s_delta'])} "
            f"| {_min_median(row['relays_done_delta'])} "
            f"| {_mb(row['bytes_full'])} / {_mb(row['bytes_delta'])} | {row['used_delta']} of {row['delta_fetches']} "
            f"| {_mb(row['origin_egress_delta'])} "
            f"| {', '.join(f't{t}: {_mb(b)}' for t, b in row['relay_egress_delta'].items())} "
            f"| {', '.join(f't{t}: {_mb(b)}' for t, b in row['wire_tx_mean'].items()) or 'n/a (loopback)'} "
            f"| {statistics.median(row['cpu_share']):.2f} | {min(row['load']):.0f}-{max(row['load']):.0f} "
            f"| {statistics.median(row['wall_s']):.0f} | {'yes' if row['ok'] else 'NO'} |"
        )
    if getattr(args, "compare", None):
        earlier = summarise(json.loads(Path(args.compare).read_text())["runs"])
        lines += [
            "",
            f"The same grid with {args.compare_label} (`{Path(args.compare).name}`), delta versions, "
            "min / median as above, earlier -> this table:",
            "",
            "| depth | N | time-to-all p50 | time-to-all max | last relay complete | load (1 min), earlier |",
            "|---|---|---|---|---|---|",
        ]
        now = {(r["depth"], r["clients"]): r for r in summary}
        for row in earlier:
            other = now.get((row["depth"], row["clients"]))
            if other is None:
                continue
            lines.append(
                f"| {row['depth']} | {row['clients']} | {_min_median(row['delta_p50'])} -> "
                f"{_min_median(other['delta_p50'])} | {_min_median(row['delta_max'])} -> "
                f"{_min_median(other['delta_max'])} | {_min_median(row['relays_done_delta'])} -> "
                f"{_min_median(other['relays_done_delta'])} | {min(row['load']):.0f}-{max(row['load']):.0f} |"
            )
    lines += [
        "",
        "Delta size per version against the full file (one AdamW step each; the broadcast used the first lr):",
        "",
        "| AdamW lr | version | file MB | delta MB | delta / file | bf16 elements changed |",
        "|---|---|---|---|---|---|",
    ]
    for lr, rows in sizes.items():
        for size in rows:
            if size.delta_bytes is None:
                continue
            lines.append(
                f"| {lr:g} | {size.version} | {size.file_bytes / 1e6:.1f} | {size.delta_bytes / 1e6:.2f} "
                f"| {size.delta_bytes / size.file_bytes:.2%} | {size.changed_elements:.2%} |"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "payload": {
                    "spec": asdict(payload.spec),
                    "bytes": payload.size,
                    "parameters": payload.parameters,
                    "sha256": payload.sha256,
                },
                "delta_sizes": {str(lr): [asdict(s) for s in rows] for lr, rows in sizes.items()},
                "summary": summary,
                "runs": runs,
            },
            indent=1,
        )
    )
