"""Benchmark: agreement with labelled answer pairs, and latency by path, ours vs math-verify 0.9.0.

    .venv/bin/python benchmarks/math_equiv_bench.py [--repeats 3] [--file PATH] [--misses]
        [--out results.md] [--json results.json]

Both checkers run in this process on the same rows, pair by pair. Two files:

- packages/verifiers/tests/data/math_equiv_forms.jsonl (default; 338 pairs: 63 public rows from
  math-verify's own tests and issues, 275 hand-written for issue #28's forms): a regression suite,
  written with the checker changes and required 338/338 in CI, so its accuracy is no measurement.
- packages/verifiers/tests/data/math_equiv_frozen.jsonl (`--file`): the frozen evaluation set,
  written from the mathematics and committed before any checker ran on it. Its rows carry
  `convention` (null, or the reading the label assumes); accuracy is reported on the
  convention-free pairs and on the convention pairs separately, and again without the pairs that
  coincide with a regression-suite pair.

math-verify (in the dev group; `pip install "math-verify[antlr4_13_2]==0.9.0"`) is called the way
its README shows. Regression rows: `verify(parse(gold), parse(pred))` with each side wrapped in
`$...$` ("dollar" rows) or with the row's own extraction configs and options (public rows:
math-verify's `compare_strings` harness). Frozen rows (no `harness` field; a bare gold and a model
output): `verify(parse(f"${gold}$"), parse(pred))` with parse's default extraction configs and
verify's defaults. Ours gets the same strings unwrapped, through `verifiers.math.compare_answers`
with a warm pool of one worker and the row's options (defaults for frozen rows).

Latency is wall time per pair (math-verify: parse both sides + verify; ours: the whole
`compare_answers` call). Each pair's path is ours: "caller" if `compare_answers` decided it in the
caller's fast path, "worker" if it sent it to the worker process (counted on the pool, so
`reason == "different"` from either side is attributed right). Latency is reported per path for
both checkers on the same pairs, as mean, p50 and p99 (nearest rank) over all pairs x repeats: a
median over all pairs never sees the worker pairs when most pairs take the fast path. The two
checkers are interleaved pair by pair (which one goes first alternates per pair and per repeat), so
machine load hits both equally; each repeat gives both fresh caches (a new worker for ours;
math-verify's caches cleared). Decisions are taken from the first repeat; a pair whose decision
changes between repeats (a timeout under load) is counted and reported.
`--out FILE` writes the run as Markdown, `--json FILE` as JSON (decisions per pair included).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

DATA = Path(__file__).resolve().parents[1] / "packages/verifiers/tests/data"
FORMS = DATA / "math_equiv_forms.jsonl"


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
            if "harness" not in row:  # a frozen row: bare gold, model output, math-verify's defaults
                return bool(verify(parse(f"${row['gold']}$"), parse(row["pred"])))
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


@dataclass
class Run:
    """One repeat: per pair, each checker's decision and latency (s), and our path."""

    ours: list[bool] = field(default_factory=list)
    ours_lat: list[float] = field(default_factory=list)
    theirs: list[bool] = field(default_factory=list)
    theirs_lat: list[float] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def run_interleaved(rows: list[dict], repeat: int) -> Run:
    """Both checkers on every row, alternating which goes first, with fresh caches."""
    from verifiers.math import MathWorkerPool, compare_answers

    class CountingPool(MathWorkerPool):
        """Counts requests, so a pair's path is known whatever its reason says."""

        asked = 0

        def ask(self, request: dict, timeout: float):  # type: ignore[override]
            self.asked += 1
            return super().ask(request, timeout)

    pool = CountingPool(1)  # a fresh worker: no cache carried over from an earlier repeat
    pool.warm()
    compare_answers("x^2", "x \\cdot x", pool=pool)  # warm-up on an unrelated pair
    theirs_check = math_verify_checker()
    run = Run()

    def ours_check(row: dict) -> bool:
        before = pool.asked
        verdict = compare_answers(
            row["gold"],
            row["pred"],
            timeout=10.0,
            float_rounding=row.get("float_rounding", 6),
            strict=row.get("strict", True),
            allow_set_relation_comp=row.get("allow_set_relation_comp", False),
            pool=pool,
        )
        run.paths.append("worker" if pool.asked > before else "caller")
        run.reasons.append(verdict.reason)
        return verdict.equal

    for i, row in enumerate(rows):
        order = ((ours_check, run.ours, run.ours_lat), (theirs_check, run.theirs, run.theirs_lat))
        for check, decisions, latencies in order if (i + repeat) % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            decisions.append(check(row))
            latencies.append(time.perf_counter() - start)
    pool.close()
    return run


def category_of(row: dict) -> str:
    return row["category"].split("/")[0] if row["category"].startswith("public/") else row["category"]


def score(rows: list[dict], decisions: list[bool], keep: Callable[[dict], bool]) -> tuple[int, int]:
    """(right, pairs) over the rows `keep` selects."""
    picked = [(row, got) for row, got in zip(rows, decisions, strict=True) if keep(row)]
    return sum(got == bool(row["expected"]) for row, got in picked), len(picked)


def p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile: the smallest value >= 99% of the values."""
    ordered = sorted(values)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


def latency_stats(values: list[float]) -> dict[str, float]:
    return {
        "mean_ms": 1000 * statistics.fmean(values),
        "p50_ms": 1000 * statistics.median(values),
        "p99_ms": 1000 * p99(values),
    }


def regression_pairs() -> set[tuple[str, str]]:
    """The regression suite's pairs in both orders, to flag frozen rows that coincide with one."""
    pairs = {(row["gold"], row["pred"]) for row in load(FORMS)}
    return pairs | {(pred, gold) for gold, pred in pairs}


def unboxed(text: str) -> str:
    return (
        text[len("$\\boxed{") : -len("}$")] if text.startswith("$\\boxed{") and text.endswith("}$") else text
    )


def markdown_table(header: tuple[str, ...], lines: list[tuple[str, ...]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh-cache repeats (latency samples)")
    parser.add_argument("--file", type=Path, default=FORMS, help="labelled pairs (JSONL)")
    parser.add_argument("--misses", action="store_true", help="list the rows each checker gets wrong")
    parser.add_argument("--out", type=Path, help="write the run as Markdown to this file")
    parser.add_argument("--json", type=Path, help="write the run as JSON to this file")
    args = parser.parse_args()
    rows = load(args.file)

    try:
        import math_verify  # noqa: F401
    except ImportError:
        sys.exit('math-verify is not installed: pip install "math-verify[antlr4_13_2]==0.9.0" (dev group)')

    runs = [run_interleaved(rows, repeat) for repeat in range(args.repeats)]
    first = runs[0]
    unstable = {
        name: sum(len({getattr(run, name)[i] for run in runs}) > 1 for i in range(len(rows)))
        for name in ("ours", "theirs")
    }

    # accuracy: per category, and by group where rows name their conventions
    groups: list[tuple[str, Callable[[dict], bool]]] = [("all pairs", lambda row: True)]
    if all("convention" in row for row in rows):
        seen = regression_pairs()
        in_suite = {id(row) for row in rows if (row["gold"], unboxed(row["pred"])) in seen}
        groups = [
            ("convention-free pairs", lambda row: row["convention"] is None),
            ("convention pairs", lambda row: row["convention"] is not None),
            ("all pairs", lambda row: True),
            (
                "convention-free, not in the regression suite",
                lambda row: row["convention"] is None and id(row) not in in_suite,
            ),
            (
                "convention pairs, not in the regression suite",
                lambda row: row["convention"] is not None and id(row) not in in_suite,
            ),
        ]
    accuracy = []
    for name, keep in groups:
        (o, n), (t, _) = score(rows, first.ours, keep), score(rows, first.theirs, keep)
        accuracy.append({"group": name, "pairs": n, "ours": o, "math_verify": t})
    categories = []
    for cat in sorted({category_of(row) for row in rows}):
        (o, n), (t, _) = (
            score(rows, d, lambda row, c=cat: category_of(row) == c) for d in (first.ours, first.theirs)
        )
        categories.append({"category": cat, "pairs": n, "ours": o, "math_verify": t})

    # latency by our path, both checkers on the same pairs, all repeats pooled
    latency = []
    for path in ("caller", "worker", "all"):
        ours_ms = [run.ours_lat[i] for run in runs for i in range(len(rows)) if path in ("all", run.paths[i])]
        theirs_ms = [
            run.theirs_lat[i] for run in runs for i in range(len(rows)) if path in ("all", run.paths[i])
        ]
        if ours_ms:
            pairs = sum(path in ("all", p) for p in first.paths)
            latency.append(
                {
                    "path": path,
                    "pairs": pairs,
                    "samples": len(ours_ms),
                    "ours": latency_stats(ours_ms),
                    "math_verify": latency_stats(theirs_ms),
                }
            )
    reasons: dict[str, int] = defaultdict(int)
    for path, reason in zip(first.paths, first.reasons, strict=True):
        reasons[f"{path}:{reason}"] += 1

    when = f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end"
    command = f"python benchmarks/math_equiv_bench.py --file {args.file.relative_to(Path.cwd()) if args.file.is_relative_to(Path.cwd()) else args.file} --repeats {args.repeats}"

    def pct(a: int, n: int) -> str:
        return f"{a}/{n} ({a / n:.1%})" if n else "0/0"

    acc_lines = [
        (a["group"], str(a["pairs"]), pct(a["ours"], a["pairs"]), pct(a["math_verify"], a["pairs"]))
        for a in accuracy
    ]
    cat_lines = [
        (c["category"], str(c["pairs"]), pct(c["ours"], c["pairs"]), pct(c["math_verify"], c["pairs"]))
        for c in categories
    ]
    lat_lines = [
        (
            x["path"],
            str(x["pairs"]),
            str(x["samples"]),
            *(
                f"{x[k]['mean_ms']:.2f} / {x[k]['p50_ms']:.2f} / {x[k]['p99_ms']:.2f}"
                for k in ("ours", "math_verify")
            ),
            f"{x['math_verify']['mean_ms'] / x['ours']['mean_ms']:.1f}x",
        )
        for x in latency
    ]
    misses = {
        name: [
            {
                "category": row["category"],
                "expected": row["expected"],
                "convention": row.get("convention"),
                "gold": row["gold"],
                "pred": row["pred"],
            }
            for row, got in zip(rows, decisions, strict=True)
            if got != bool(row["expected"])
        ]
        for name, decisions in (("ours", first.ours), ("math_verify", first.theirs))
    }
    md = [
        f"## {args.file.name}: {when}",
        "",
        f"`{command}`; {len(rows)} pairs, {args.repeats} repeats (decisions from the first; pairs whose "
        f"decision changed between repeats: ours {unstable['ours']}, math-verify {unstable['theirs']}).",
        "",
        markdown_table(("pairs", "n", "ours", "math-verify 0.9.0"), acc_lines),
        "",
        markdown_table(("category", "n", "ours", "math-verify 0.9.0"), cat_lines),
        "",
        "Latency per pair, ms, mean / p50 / p99 over pairs x repeats, split by our path (caller = decided "
        "in the caller's fast path, worker = sent to the worker process); math-verify on the same pairs:",
        "",
        markdown_table(
            ("path", "pairs", "samples", "ours, ms", "math-verify 0.9.0, ms", "ratio of means"), lat_lines
        ),
        "",
        "Our reasons (first repeat): " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())),
        "",
    ]
    for name, label in (("ours", "ours"), ("math_verify", "math-verify 0.9.0")):
        md.append(f"Pairs {label} gets wrong ({len(misses[name])}):")
        md.append("")
        md += [
            f"- [{m['category']}{', convention: ' + m['convention'] if m['convention'] else ''}] expected "
            f"{m['expected']}: `{m['gold']}` vs `{m['pred'].replace(chr(10), ' ')}`"
            for m in misses[name]
        ]
        md.append("")
    print("\n".join(md))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(md))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "file": str(args.file.name),
                    "command": command,
                    "when": when,
                    "repeats": args.repeats,
                    "unstable_pairs": unstable,
                    "accuracy": accuracy,
                    "categories": categories,
                    "latency": latency,
                    "reasons": dict(reasons),
                    "misses": misses,
                    "pairs": [
                        {
                            "gold": row["gold"],
                            "pred": row["pred"],
                            "expected": row["expected"],
                            "path": first.paths[i],
                            "reason": first.reasons[i],
                            "ours": first.ours[i],
                            "math_verify": first.theirs[i],
                        }
                        for i, row in enumerate(rows)
                    ],
                },
                indent=1,
                ensure_ascii=False,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
