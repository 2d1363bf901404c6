"""Benchmark: agreement with labelled answer pairs per form category, ours vs math-verify 0.9.0.

    .venv/bin/python benchmarks/math_equiv_bench.py [--repeats 3] [--file PATH] [--misses]

Both checkers run in this process on the same rows of
packages/verifiers/tests/data/math_equiv_forms.jsonl (338 pairs: 63 public rows from
math-verify's own tests and issues, 275 hand-written for issue #28's forms; each row names its
source and category). math-verify (in the dev group; `pip install "math-verify[antlr4_13_2]==0.9.0"`)
is called the way its README shows: `verify(parse(gold), parse(pred))`, each side wrapped in
`$...$` ("dollar" rows), or with the row's own extraction configs and options (public rows:
math-verify's `compare_strings` harness). Ours gets the same strings unwrapped, through
`verifiers.math.is_equivalent` with a warm pool of one worker and the row's options.

Latency is wall time per pair (math-verify: parse both sides + verify; ours: the whole
`is_equivalent` call: the in-process fast path, or the round trip to the worker process).
The two checkers are interleaved pair by pair (which one goes first alternates per pair and
per repeat), so machine load hits both equally; each repeat gives both fresh caches (a new
worker for ours; math-verify's caches cleared). We report, per checker, the median over pairs
of each repeat, then the min and median of those over repeats, and the ratio of the medians.
`--out FILE` also writes the tables as Markdown (benchmarks/results/math_equiv_bench.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

FORMS = Path(__file__).resolve().parents[1] / "packages/verifiers/tests/data/math_equiv_forms.jsonl"


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def math_verify_checker() -> Callable[[dict], bool]:
    """math-verify's decision for a row (a crash counts as "not equal"), with fresh caches."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    def configs(kinds: list[str]) -> list:
        return [
            LatexExtractionConfig(boxed_match_priority=0) if k == "latex" else ExprExtractionConfig()
            for k in kinds
        ]

    for cached in (parse, verify):  # fresh caches per repeat where math-verify keeps one
        getattr(cached, "cache_clear", lambda: None)()
    verify(parse("$x^2$"), parse("$x \\cdot x$"))  # warm-up: imports and the ANTLR grammar

    def check(row: dict) -> bool:
        try:
            if row["harness"] == "dollar":
                return bool(verify(parse(f"${row['gold']}$"), parse(f"${row['pred']}$")))
            kinds = row["match_types"]  # math-verify's own tests/test_all.py::compare_strings
            return bool(
                verify(
                    parse(row["gold"], configs(kinds)),
                    parse(row["pred"], configs(kinds)),
                    float_rounding=row["float_rounding"],
                    strict=row["strict"],
                    allow_set_relation_comp=row["allow_set_relation_comp"],
                )
            )
        except Exception:
            return False

    return check


def run_interleaved(rows: list[dict], repeat: int) -> tuple[list[bool], list[float], list[bool], list[float]]:
    """(ours, our latencies, math-verify's, its latencies), the two checkers alternating per pair."""
    from verifiers.math import MathWorkerPool, is_equivalent

    pool = MathWorkerPool(1)  # a fresh worker: no cache carried over from an earlier repeat
    pool.warm()
    is_equivalent("x^2", "x \\cdot x", pool=pool)  # warm-up on an unrelated pair
    theirs_check = math_verify_checker()

    def ours_check(row: dict) -> bool:
        return is_equivalent(
            row["gold"],
            row["pred"],
            timeout=10.0,
            float_rounding=row["float_rounding"],
            strict=row["strict"],
            allow_set_relation_comp=row["allow_set_relation_comp"],
            pool=pool,
        )

    ours, ours_lat, theirs, theirs_lat = [], [], [], []
    for i, row in enumerate(rows):
        order = ((ours_check, ours, ours_lat), (theirs_check, theirs, theirs_lat))
        for check, decisions, latencies in order if (i + repeat) % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            decisions.append(check(row))
            latencies.append(time.perf_counter() - start)
    pool.close()
    return ours, ours_lat, theirs, theirs_lat


def per_category(rows: list[dict], decisions: list[bool]) -> dict[str, tuple[int, int]]:
    table: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row, got in zip(rows, decisions, strict=True):
        for key in (
            row["category"].split("/")[0] if row["category"].startswith("public/") else row["category"],
            "all",
        ):
            table[key][0] += int(got == bool(row["expected"]))
            table[key][1] += 1
    return {k: (v[0], v[1]) for k, v in table.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh-cache repeats (latency min/median)")
    parser.add_argument("--file", type=Path, default=FORMS, help="labelled pairs (JSONL)")
    parser.add_argument("--misses", action="store_true", help="list the rows each checker gets wrong")
    parser.add_argument("--out", type=Path, help="also write the tables as Markdown to this file")
    args = parser.parse_args()
    rows = load(args.file)

    try:
        import math_verify  # noqa: F401
    except ImportError:
        sys.exit('math-verify is not installed: pip install "math-verify[antlr4_13_2]==0.9.0" (dev group)')

    ours_lat, theirs_lat = [], []
    for repeat in range(args.repeats):
        ours, lat_ours, theirs, lat_theirs = run_interleaved(rows, repeat)
        ours_lat.append(statistics.median(lat_ours))
        theirs_lat.append(statistics.median(lat_theirs))

    ours_table, theirs_table = per_category(rows, ours), per_category(rows, theirs)
    keys = [*sorted(k for k in ours_table if k != "all"), "all"]
    header = ("category", "pairs", "ours", "math-verify 0.9.0", ">=")
    lines = [header]
    for key in keys:
        (o, n), (t, _) = ours_table[key], theirs_table[key]
        lines.append(
            (key, str(n), f"{o}/{n} ({o / n:.1%})", f"{t}/{n} ({t / n:.1%})", "yes" if o >= t else "NO")
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for k, line in enumerate(lines):
        print(" | ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))
        if k == 0 or k == len(lines) - 2:
            print("-+-".join("-" * w for w in widths))

    def ms(values: list[float]) -> str:
        return f"{1000 * min(values):.2f} / {1000 * statistics.median(values):.2f}"

    speedup = statistics.median(theirs_lat) / statistics.median(ours_lat)
    per_repeat = ", ".join(f"{t / o:.1f}x" for o, t in zip(ours_lat, theirs_lat, strict=True))
    summary = [
        f"median latency per pair, ms (min / median of {args.repeats} interleaved repeats): "
        f"ours {ms(ours_lat)}, math-verify {ms(theirs_lat)}; "
        f"ratio of medians (math-verify / ours) = {speedup:.1f}x",
        f"per repeat: ours {', '.join(f'{1000 * v:.2f}' for v in ours_lat)} ms; "
        f"math-verify {', '.join(f'{1000 * v:.2f}' for v in theirs_lat)} ms; ratios {per_repeat}",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at the end",
    ]
    print("\n" + "\n".join(summary))
    if args.out:
        table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        table += ["| " + " | ".join(line) + " |" for line in lines[1:]]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(f"## math_equiv_bench.py, {summary[2]}\n\n" + "\n".join(table) + "\n\n")
            f.write("".join(f"- {line}\n" for line in summary[:2]) + "\n")
    if args.misses:
        for name, decisions in (("ours", ours), ("math-verify", theirs)):
            print(f"\n{name} disagrees with the label on:")
            for row, got in zip(rows, decisions, strict=True):
                if got != bool(row["expected"]):
                    print(
                        f"  [{row['category']}] expected {row['expected']}: {row['gold']!r} vs {row['pred']!r}"
                    )


if __name__ == "__main__":
    main()
