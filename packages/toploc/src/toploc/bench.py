"""CPU benchmark: batched build/verify vs the naive per-chunk loop, in one run.

    python benchmarks/toploc_bench.py            # or: toploc bench
    toploc bench --hidden 4096 --tokens 1024 8192 --repeats 5

Activations are bf16 ``randn(N, H)`` (seed 0), dbs 32, topk 128, ``skip_prefill=True``,
as prime-rl calls the reference. "verify" is the compare step only (selection,
evaluation, comparison) on given activations; the validator's prefill is not included.
The naive loop selects each chunk with ``torch.topk`` and commits it alone, as the
reference's Python loop does (its C++ interpolation is not available here).
Times are ms per 1,000 tokens: min and median of ``repeats`` runs, wall clock, with the
process CPU time of the min run. Set ``OMP_WAIT_POLICY=PASSIVE`` (done here if unset).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from toploc.commitment import commit
from toploc.proofs import build_proofs_bytes, verify_proofs_bytes
from toploc.wire import encode_proofs


def _naive_build(activations: torch.Tensor, dbs: int = 32, topk: int = 128) -> list[bytes]:
    proofs = []
    for start in range(0, activations.shape[0], dbs):
        chunk = activations[start : start + dbs].reshape(-1)
        idx = torch.topk(chunk.abs(), topk).indices
        values = chunk[idx].view(torch.int16).numpy().view(np.uint16).astype(np.int64)
        proofs += encode_proofs(*commit(idx.numpy()[None], values[None]))
    return proofs


def _time(function: Callable[[], object], repeats: int) -> tuple[float, float, float]:
    """(min wall s, median wall s, CPU s of the min run)."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        function()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    best = int(np.argmin(walls))
    return walls[best], statistics.median(walls), cpus[best]


def run(hidden_sizes: list[int], token_counts: list[int], repeats: int, naive_max_tokens: int) -> str:
    """Run the benchmark and return the table as Markdown text."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    header = (
        "| H | tokens | build ms/1k min (med, cpu) | verify ms/1k min (med, cpu) | naive build ms/1k | "
        "speed-up | bytes/token |\n|---|---|---|---|---|---|---|"
    )
    lines = [
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}",
        header,
    ]
    for hidden in hidden_sizes:
        for tokens in token_counts:
            acts = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
            proofs = build_proofs_bytes(acts, 32, 128, True)
            per_1k = 1000.0 / tokens
            b_min, b_med, b_cpu = _time(partial(build_proofs_bytes, acts, 32, 128, True), repeats)
            v_min, v_med, v_cpu = _time(partial(verify_proofs_bytes, acts, proofs, 32, 128, True), repeats)
            naive = speedup = "-"
            if tokens <= naive_max_tokens:
                n_min = _time(partial(_naive_build, acts), max(1, repeats // 2))[0]
                naive, speedup = f"{n_min * 1e3 * per_1k:.1f}", f"{n_min / b_min:.1f}×"
            size = sum(len(p) for p in proofs) / tokens
            lines.append(
                f"| {hidden} | {tokens} | {b_min * 1e3 * per_1k:.2f} ({b_med * 1e3 * per_1k:.2f}, {b_cpu * 1e3 * per_1k:.2f}) "
                f"| {v_min * 1e3 * per_1k:.2f} ({v_med * 1e3 * per_1k:.2f}, {v_cpu * 1e3 * per_1k:.2f}) "
                f"| {naive} | {speedup} | {size:.4f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="toploc bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[4096, 5120], help="hidden sizes H")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192, 32768], help="decode tokens N")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per measurement (min and median reported)"
    )
    parser.add_argument(
        "--naive-max-tokens", type=int, default=8192, help="skip the slow naive loop above this N"
    )
    args = parser.parse_args(argv)
    print(run(args.hidden, args.tokens, args.repeats, args.naive_max_tokens))
