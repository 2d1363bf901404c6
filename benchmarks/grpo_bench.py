"""Benchmark: grpo's memory-lean log-prob paths vs the naive full-softmax way, on CPU.

Cases (each measured in its own subprocess so peak memory is honest):

* ``selective_log_softmax(logits, tokens)`` vs ``log_softmax(logits.float()).gather(...)``
  on fp32 logits [1024, 151936] (622 MB), forward only (the targets: peak extra memory
  <= 10% of the logits, time <= naive) and forward+backward;
* ``logprobs_from_hidden(hidden, W, tokens)`` vs ``log_softmax(hidden @ W.T).gather`` at
  T = 2048, V = 151936, hidden size 896 (Qwen2.5-0.5B's), random fp32 weights, forward +
  backward into hidden and W (targets: peak memory <= 1/4 of naive, time <= 1.3x).

Peak extra memory = peak RSS during the operation minus RSS just before it: the child
resets the kernel's high-water mark (``/proc/self/clear_refs`` = 5) after building its
inputs and reads ``VmHWM`` afterwards (tracemalloc cannot see torch's allocations). The
operation's own outputs and gradients count; the inputs do not.

Time: wall clock (min and median) and process CPU time (median, all threads); the targets
are judged on CPU time, because on a shared machine wall time mostly measures waiting for a
core (CPU time of one op varies by ~2%, its wall time by 2x).

Run: ``.venv/bin/python benchmarks/grpo_bench.py [--repeats 3] [--only hidden]`` (children get
OMP_WAIT_POLICY=PASSIVE). Memory: one run per child process; time: naive and grpo alternate
in one child so drifting load from other processes hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VOCAB = 151936
LOGIT_ROWS = 1024
SEQ = 2048
HIDDEN = 896


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def build(group: str):
    """Inputs and the two operations (naive, ours) of one comparison group."""
    import torch

    import grpo

    torch.manual_seed(0)
    if group.startswith("sls"):
        backward = group == "sls_bwd"
        logits = torch.randn(LOGIT_ROWS, VOCAB) * 3
        tokens = torch.randint(0, VOCAB, (LOGIT_ROWS,))
        logits.requires_grad_(backward)

        def finish(out: torch.Tensor) -> None:
            if backward:
                out.sum().backward()
                logits.grad = None

        def naive() -> None:
            with torch.set_grad_enabled(backward):
                finish(torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, None])[:, 0])

        def ours() -> None:
            with torch.set_grad_enabled(backward):
                finish(grpo.selective_log_softmax(logits, tokens))

        return naive, ours
    hidden = (torch.randn(SEQ, HIDDEN) / HIDDEN**0.5).requires_grad_(True)
    weight = (torch.randn(VOCAB, HIDDEN) * 0.02).requires_grad_(True)
    tokens = torch.randint(0, VOCAB, (SEQ,))

    def backward_and_clear(out: torch.Tensor) -> None:
        out.sum().backward()
        hidden.grad = None
        weight.grad = None

    def naive_hidden() -> None:
        logits = hidden @ weight.T
        backward_and_clear(torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, None])[:, 0])

    def ours_hidden() -> None:
        backward_and_clear(grpo.logprobs_from_hidden(hidden, weight, tokens))

    return naive_hidden, ours_hidden


def warm_up() -> None:
    """Initialise torch's lazy state (thread pool, allocator arenas) on a tiny problem, so the
    measured peak is the operation's own memory, not one-time initialisation."""
    import torch

    import grpo

    small = torch.randn(4, 64, requires_grad=True)
    grpo.selective_log_softmax(small, torch.zeros(4, dtype=torch.long)).sum().backward()
    torch.log_softmax(small, -1).sum().backward()
    head = torch.randn(8, 64, requires_grad=True)
    grpo.logprobs_from_hidden(small, head, torch.zeros(4, dtype=torch.long)).sum().backward()


def measure_memory(group: str, variant: str) -> dict[str, float]:
    """Child process: peak extra RSS (MiB) of one run of ``variant`` ("naive" or "ours")."""
    import gc

    naive, ours = build(group)
    op = naive if variant == "naive" else ours
    warm_up()
    gc.collect()
    before = status_kib("VmRSS")
    exact = reset_peak()
    op()
    peak = status_kib("VmHWM") if exact else status_kib("VmPeak")
    return {"peak_extra_mib": (peak - before) / 1024}


def measure_time(group: str, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Child process: alternate naive and ours ``repeats`` times (after a small warm-up), so
    drifting machine load hits both alike. Records wall time and process CPU time (all
    threads): on a shared machine the CPU time is the stable measure of the work done."""
    naive, ours = build(group)
    warm_up()
    times: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in ("naive", "ours")}
    for _ in range(repeats):
        for name, op in (("naive", naive), ("ours", ours)):
            wall, cpu = time.perf_counter(), time.process_time()
            op()
            times[name]["wall"].append(time.perf_counter() - wall)
            times[name]["cpu"].append(time.process_time() - cpu)
    return times


CASES = [  # (title, group, max memory ratio vs naive, max time ratio vs naive); None = reported only
    ("selective_log_softmax fwd", "sls_fwd", None, 1.0),
    ("selective_log_softmax fwd+bwd", "sls_bwd", None, None),
    ("logprobs_from_hidden fwd+bwd", "hidden", 0.25, 1.3),
]


def _child(*args: str) -> dict:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--only", help="run only the groups whose name contains this (sls_fwd, sls_bwd, hidden)"
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, group, *rest = args.child
        result = measure_memory(group, rest[0]) if kind == "memory" else measure_time(group, args.repeats)
        print(json.dumps(result))
        return
    import torch

    logits_mib = LOGIT_ROWS * VOCAB * 4 / 2**20
    print(
        f"grpo benchmark (CPU): torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f}; V={VOCAB}; selective: fp32 logits "
        f"[{LOGIT_ROWS}, {VOCAB}] = {logits_mib:.0f} MiB; hidden: T={SEQ}, H={HIDDEN}, fp32, W = "
        f"{VOCAB * HIDDEN * 4 / 2**20:.0f} MiB; time: {args.repeats} alternating repeats"
    )
    header = (
        f"{'case':30} {'variant':7} {'peak extra MiB':>14} {'mem/naive':>9} {'wall min s':>10} "
        f"{'wall med s':>10} {'cpu med s':>9} {'cpu/naive':>9} {'wall/naive':>10}  targets (time on CPU s)"
    )
    print(header)
    print("-" * len(header), flush=True)
    for title, group, mem_target, time_target in CASES:
        if args.only and args.only not in group:
            continue
        memory = {
            variant: _child("memory", group, variant)["peak_extra_mib"] for variant in ("naive", "ours")
        }
        times = _child("time", group, "-", "--repeats", str(args.repeats))
        med = {v: {k: statistics.median(times[v][k]) for k in ("wall", "cpu")} for v in ("naive", "ours")}
        mem_ratio = memory["ours"] / max(memory["naive"], 1e-9)
        cpu_ratio = med["ours"]["cpu"] / med["naive"]["cpu"]
        wall_ratio = med["ours"]["wall"] / med["naive"]["wall"]
        verdicts = []
        if group == "sls_fwd":
            ok = memory["ours"] <= 0.10 * logits_mib
            verdicts.append(f"mem <= 10% of logits ({0.1 * logits_mib:.0f} MiB) {'PASS' if ok else 'FAIL'}")
        if mem_target is not None:
            verdicts.append(f"mem <= {mem_target:g}x {'PASS' if mem_ratio <= mem_target else 'FAIL'}")
        if time_target is not None:
            verdicts.append(f"time <= {time_target:g}x {'PASS' if cpu_ratio <= time_target else 'FAIL'}")
        for variant in ("naive", "ours"):
            ours = variant == "ours"
            print(
                f"{title:30} {'grpo' if ours else 'naive':7} {memory[variant]:14.1f} "
                f"{(f'{mem_ratio:.3f}' if ours else '1'):>9} {min(times[variant]['wall']):10.3f} "
                f"{med[variant]['wall']:10.3f} {med[variant]['cpu']:9.3f} "
                f"{(f'{cpu_ratio:.3f}' if ours else '1'):>9} {(f'{wall_ratio:.3f}' if ours else '1'):>10}  "
                f"{'; '.join(verdicts) if ours else ''}",
                flush=True,
            )


if __name__ == "__main__":
    main()
