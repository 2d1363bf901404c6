"""Benchmark: our math checker vs math-verify, sandbox overhead, verify_batch throughput.

    .venv/bin/python benchmarks/verifiers_bench.py [--repeats 3] [--batch 1000]

One table, everything measured in this run on this machine:
- math accuracy and median latency on the 63 public cases (../shared/bench), ours vs
  math-verify 0.9.0 (pip-installed into a cached temporary venv, run with each row's
  harness settings). Each repeat uses fresh processes on both sides, so neither side's
  caches carry over; we report the min and median over repeats of the per-row median.
- code sandbox overhead per test run: wall time of `run_tests` divided by tests, for a
  trivial program (10 tests per program, and 1 test = full startup-to-result), vs the naive
  unsandboxed `subprocess.run(python -c program)` per test.
- verify_batch throughput on 1,000 verifiable_math items with max_workers=2 (pool of 2), and
  math-verify's sequential parse+verify on the same pairs.
- agreement with math-verify's own regression suites (tests/test_all.py, test_numina_cases.py,
  test_open_thoughts.py from its 0.9.0 sdist), every `compare_strings` case, both checkers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PUBLIC = Path(__file__).resolve().parents[1].parent / "shared" / "bench" / "math_equiv_public.jsonl"
if not PUBLIC.exists():
    PUBLIC = Path("/work/shared/bench/math_equiv_public.jsonl")
MV_VENV = Path(tempfile.gettempdir()) / "verifiers-bench-math-verify-0.9.0"

MV_SCRIPT = r"""
import json, statistics, sys, time
from math_verify import parse, verify, LatexExtractionConfig, ExprExtractionConfig
rows = [json.loads(l) for l in open(sys.argv[1])]
pairs = json.load(open(sys.argv[2]))
def configs(kinds):
    return [LatexExtractionConfig(boxed_match_priority=0) if k == "latex" else ExprExtractionConfig() for k in kinds]
# warm-up on an unrelated pair (imports, grammar)
verify(parse("$x^2$"), parse("$x \\cdot x$"))
correct, lat = 0, []
for r in rows:
    t = time.perf_counter()
    if r["harness"].startswith("tests/test_all.py::compare_strings"):
        g = parse(r["gold"], configs(r["match_types"]))
        p = parse(r["pred"], configs(r["match_types"]))
        ok = verify(g, p, float_rounding=r["float_rounding"], strict=r["strict"],
                    allow_set_relation_comp=r["allow_set_relation_comp"])
    else:
        ok = verify(parse(r["gold"]), parse(r["pred"]))
    lat.append(time.perf_counter() - t)
    correct += int(bool(ok) == bool(r["expected"]))
t = time.perf_counter()
for gold, completion in pairs:
    verify(parse("\\boxed{" + gold + "}"), parse(completion))
batch_s = time.perf_counter() - t
print(json.dumps({"correct": correct, "n": len(rows), "median_s": statistics.median(lat), "batch_s": batch_s}))
"""


SUITES = ("test_all.py", "test_numina_cases.py", "test_open_thoughts.py")
SUITE_SCRIPT = r"""
import importlib.util, json, sys, types
root, use_ours = sys.argv[1], sys.argv[2] == "ours"
sys.path.insert(0, root)


class Mark:
    def __init__(self, name, args):
        self.name, self.args = name, args


class MarkGenerator:  # records @pytest.mark.<name>(...) like pytest does, without pytest
    def __getattr__(self, name):
        def decorator(*args, **kwargs):
            def wrap(fn):
                fn.pytestmark = [*getattr(fn, "pytestmark", []), Mark(name, args)]
                return fn
            return wrap
        return decorator


fake_pytest = types.ModuleType("pytest")
fake_pytest.mark = MarkGenerator()
fake_pytest.param = lambda *values, **kwargs: values
sys.modules["pytest"] = fake_pytest
if use_ours:
    from verifiers.math import is_equivalent
    fake = types.ModuleType("math_verify")
    for n in ["ExprExtractionConfig", "LatexExtractionConfig", "StringExtractionConfig", "parse", "verify"]:
        setattr(fake, n, lambda *a, **k: None)
    grader = types.ModuleType("math_verify.grader")
    grader.sympy_expr_eq = lambda *a, **k: None
    sys.modules["math_verify"], sys.modules["math_verify.grader"] = fake, grader

    def ours(gold, pred, match_types=("latex", "expr"), precision=6, strict=True, allow_set_relation_comp=False):
        return int(is_equivalent(gold, pred, float_rounding=precision, strict=strict,
                                 allow_set_relation_comp=allow_set_relation_comp, timeout=10))
passed = total = 0
for name in sys.argv[3:]:
    spec = importlib.util.spec_from_file_location("tests." + name[:-3], f"{root}/tests/{name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if use_ours and hasattr(module, "compare_strings"):
        module.compare_strings = ours
    for attr in dir(module):
        fn = getattr(module, attr)
        if not attr.startswith("test_") or "compare_strings" not in getattr(fn, "__code__", compile("", "", "exec")).co_names:
            continue
        for mark in [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"][:1]:
            names = [a.strip() for a in mark.args[0].split(",")]
            for case in mark.args[1]:
                values = case.values if hasattr(case, "values") else case
                total += 1
                try:
                    fn(**dict(zip(names, values)))
                    passed += 1
                except AssertionError:
                    pass
print(json.dumps({"passed": passed, "total": total}))
"""


def upstream_suites(mv_python: Path) -> tuple[dict, dict]:
    """(ours, math-verify) on the compare_strings cases of math-verify's own test files."""
    root = MV_VENV / "sdist" / "math_verify-0.9.0"
    if not (root / "tests").exists():
        (MV_VENV / "sdist").mkdir(exist_ok=True)
        subprocess.run(
            [str(mv_python), "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
             "-d", str(MV_VENV / "sdist"), "math-verify==0.9.0"],
            check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run(["tar", "xzf", "math_verify-0.9.0.tar.gz"], cwd=MV_VENV / "sdist", check=True)
    results = []
    for python, who in ((sys.executable, "ours"), (str(mv_python), "theirs")):
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(SUITE_SCRIPT)
        out = subprocess.run(
            [python, f.name, str(root), who, *SUITES], capture_output=True, text=True, check=True
        )
        os.unlink(f.name)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return results[0], results[1]


def ensure_math_verify() -> Path:
    python = MV_VENV / "bin" / "python"
    probe = [str(python), "-c", "import math_verify"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"installing math-verify 0.9.0 into {MV_VENV} ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(MV_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "math-verify[antlr4_13_2]==0.9.0"], check=True)
    return python


def run_math_verify(python: Path, pairs_path: Path) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(MV_SCRIPT)
    out = subprocess.run(
        [str(python), f.name, str(PUBLIC), str(pairs_path)], capture_output=True, text=True, check=True
    )
    os.unlink(f.name)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_ours(rows: list[dict]) -> dict:
    from verifiers.math import MathWorkerPool, is_equivalent

    pool = MathWorkerPool(1)
    pool.warm()
    is_equivalent("x^2", "x \\cdot x", pool=pool)  # warm-up on an unrelated pair
    correct, latencies = 0, []
    for row in rows:
        t = time.perf_counter()
        got = is_equivalent(
            row["gold"],
            row["pred"],
            float_rounding=row["float_rounding"],
            strict=row["strict"],
            allow_set_relation_comp=row["allow_set_relation_comp"],
            pool=pool,
        )
        latencies.append(time.perf_counter() - t)
        correct += int(got == bool(row["expected"]))
    pool.close()
    return {"correct": correct, "n": len(rows), "median_s": statistics.median(latencies)}


def batch_items(n: int, seed: int = 0) -> tuple[list, list[str], list[tuple[str, str]]]:
    """Half plain-number answers (exact fast path), half symbolic (worker), 20% wrong."""
    from verifiers import Task

    rng = random.Random(seed)
    tasks, completions, pairs = [], [], []
    for i in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        wrong = rng.random() < 0.2
        if i % 2 == 0:
            gold, pred = f"\\frac{{{a}}}{{{b}}}", f"{2 * a + int(wrong)}/{2 * b}"
        else:
            gold, pred = f"{a}x + {b}", f"{b} + {a + int(wrong)} \\cdot x"
        completion = f"<think>work</think> so the answer is $\\boxed{{{pred}}}$."
        tasks.append(Task(f"q{i}", "verifiable_math", {"ground_truth": gold}))
        completions.append(completion)
        pairs.append((gold, completion))
    return tasks, completions, pairs


def sandbox_overhead(repeats: int) -> dict:
    from verifiers.code import run_tests

    program = "print(input())"
    ten = {"inputs": [f"{i}\n" for i in range(10)], "outputs": [f"{i}\n" for i in range(10)]}
    one = {"inputs": ["7\n"], "outputs": ["7\n"]}
    per_test, single, naive = [], [], []
    run_tests(program, one)  # warm the page cache
    for _ in range(repeats):
        t = time.perf_counter()
        result = run_tests(program, ten)
        per_test.append((time.perf_counter() - t) / 10)
        assert result.passed == 10, result
        t = time.perf_counter()
        assert run_tests(program, one).passed == 1
        single.append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", program], input="7\n", capture_output=True, text=True
        )
        naive.append(time.perf_counter() - t)
    return {"per_test": per_test, "single": single, "naive": naive, "sandbox": result.sandbox}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process repeats of the math comparison")
    parser.add_argument("--batch", type=int, default=1000, help="items for the verify_batch throughput")
    parser.add_argument("--sandbox-repeats", type=int, default=15)
    args = parser.parse_args()

    rows = [json.loads(line) for line in PUBLIC.read_text().splitlines() if line.strip()]
    mv_python = ensure_math_verify()
    tasks, completions, pairs = batch_items(args.batch)
    pairs_path = Path(tempfile.mkstemp(suffix=".json")[1])
    pairs_path.write_text(json.dumps(pairs))

    ours, theirs = [], []
    for _ in range(args.repeats):
        ours.append(run_ours(rows))
        theirs.append(run_math_verify(mv_python, pairs_path))
    pairs_path.unlink()

    from verifiers import verify_batch
    from verifiers.math import configure_default_pool

    configure_default_pool(2).warm()
    verify_batch(tasks[:20], completions[:20], max_workers=2)  # warm-up
    t = time.perf_counter()
    scores = verify_batch(tasks, completions, max_workers=2)
    batch_s = time.perf_counter() - t
    mean_reward = sum(s.reward for s in scores) / len(scores)

    sb = sandbox_overhead(args.sandbox_repeats)
    suite_ours, suite_theirs = upstream_suites(mv_python)

    def ms(values: list[float]) -> str:
        return f"{1000 * min(values):.1f} / {1000 * statistics.median(values):.1f}"

    our_acc = f"{ours[0]['correct']}/{ours[0]['n']}"
    their_acc = f"{theirs[0]['correct']}/{theirs[0]['n']}"
    our_lat = [o["median_s"] for o in ours]
    their_lat = [o["median_s"] for o in theirs]
    their_batch = statistics.median(o["batch_s"] for o in theirs)
    lines = [
        ("metric", "ours", "reference", "target", "met"),
        ("math accuracy, 63 public cases", our_acc, f"{their_acc} (math-verify 0.9.0)", ">= reference",
         str(ours[0]["correct"] >= theirs[0]["correct"])),
        ("math median latency ms (min/med)", ms(our_lat), ms(their_lat), "<= 1/2 reference",
         str(statistics.median(our_lat) <= 0.5 * statistics.median(their_lat))),
        (f"sandbox ms per test run, 10 tests ({sb['sandbox']})", ms(sb["per_test"]), f"{ms(sb['naive'])} (naive subprocess, no sandbox)",
         "<= 30 ms median", str(statistics.median(sb["per_test"]) <= 0.030)),
        ("math-verify's own suites (256 compare cases)", f"{suite_ours['passed']}/{suite_ours['total']}",
         f"{suite_theirs['passed']}/{suite_theirs['total']} (math-verify 0.9.0)", "", ""),
        ("sandbox ms, 1-test program startup->result", ms(sb["single"]), "", "", ""),
        (f"verify_batch items/s, {args.batch} math, 2 workers", f"{args.batch / batch_s:.0f}",
         f"{args.batch / their_batch:.0f} (math-verify, 1 thread)", "", f"mean reward {mean_reward:.2f}"),
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in lines) for i in range(5)]
    for k, row in enumerate(lines):
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
        if k == 0:
            print("-+-".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
