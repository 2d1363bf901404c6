"""Benchmark: batched build/verify vs the naive per-chunk loop, and the streaming builder, in one run.

    python benchmarks/toploc_bench.py            # or: toploc bench
    toploc bench --hidden 4096 --tokens 1024 8192 --repeats 5
    toploc bench --device cuda --tokens 8192 65536 --stream-sequences 256

Activations are bf16 ``randn(N, H)`` (seed 0), dbs 32, topk 128, ``skip_prefill=True``,
as prime-rl calls the reference. "verify" is the compare step only (selection,
evaluation, comparison) on given activations; the validator's prefill is not included.
The naive loop selects each chunk with ``torch.topk`` and commits it alone, as the
reference's Python loop does (its C++ interpolation is not available here).
Times are ms per 1,000 tokens: min and median of ``repeats`` runs, wall clock, with the
process CPU time of the min run. Set ``OMP_WAIT_POLICY=PASSIVE`` (done here if unset).

Each figure stands next to its memory-bandwidth bound: the bytes it must move at least
(build and verify read the ``N x H`` bf16 activations once; the streaming builder reads
each row, writes it to its buffer and reads it back to select: 3 x) divided by the copy
bandwidth measured in the same run (``dst.copy_(src)`` of 256 MiB, read + write bytes).
The streaming row feeds ``ProofBuilder`` S sequences x 32 tokens one ``add`` per token,
then ``finish`` (INTELLECT-2's decode: one proof per sequence).
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
from toploc.streaming import ProofBuilder
from toploc.wire import encode_proofs

CPU = torch.device("cpu")


def _naive_build(activations: torch.Tensor, dbs: int = 32, topk: int = 128) -> list[bytes]:
    proofs = []
    for start in range(0, activations.shape[0], dbs):
        chunk = activations[start : start + dbs].reshape(-1)
        idx = torch.topk(chunk.abs(), topk).indices
        values = chunk[idx].view(torch.int16).numpy().view(np.uint16).astype(np.int64)
        proofs += encode_proofs(*commit(idx.numpy()[None], values[None]))
    return proofs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(
    function: Callable[[], object], repeats: int, device: torch.device = CPU
) -> tuple[float, float, float]:
    """(min wall s, median wall s, CPU s of the min run); CUDA work is waited for."""
    walls, cpus = [], []
    for _ in range(repeats):
        _sync(device)
        wall, cpu = time.perf_counter(), time.process_time()
        function()
        _sync(device)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    best = int(np.argmin(walls))
    return walls[best], statistics.median(walls), cpus[best]


def copy_bandwidth(device: torch.device, repeats: int = 5, size: int = 256 << 20) -> float:
    """Bytes per second of ``dst.copy_(src)`` on ``device`` (read + write bytes; best of ``repeats``)."""
    src = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    best = _time(lambda: dst.copy_(src), repeats, device)[0]
    return 2 * size / best


def _stream(builder_args: tuple[int, int], rows: torch.Tensor) -> list[bytes]:
    """One ``ProofBuilder`` fed ``rows [T, S, H]`` one ``add`` per token, then finished."""
    builder = ProofBuilder(*builder_args)
    for token_rows in rows:
        builder.add(token_rows)
    return builder.finish()


def run(
    hidden_sizes: list[int],
    token_counts: list[int],
    repeats: int,
    naive_max_tokens: int,
    device: torch.device = CPU,
    stream_sequences: int = 256,
) -> str:
    """Run the benchmark and return the tables as Markdown text."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    bandwidth = copy_bandwidth(device)
    header = (
        "| H | tokens | build ms/1k min (med, cpu) | verify ms/1k min (med, cpu) | bandwidth bound ms/1k | "
        "verify / build | naive build ms/1k | speed-up | bytes/token |\n|---|---|---|---|---|---|---|---|---|"
    )
    lines = [
        f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}, "
        f"copy bandwidth {bandwidth / 1e9:.1f} GB/s",
        header,
    ]
    for hidden in hidden_sizes:
        for tokens in token_counts:
            acts = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
            acts = acts.to(device)
            proofs = build_proofs_bytes(acts, 32, 128, True)
            per_1k = 1000.0 / tokens
            b_min, b_med, b_cpu = _time(partial(build_proofs_bytes, acts, 32, 128, True), repeats, device)
            v_min, v_med, v_cpu = _time(partial(verify_proofs_bytes, acts, proofs, 32, 128, True), repeats, device)
            bound = acts.numel() * acts.element_size() / bandwidth
            naive = speedup = "-"
            if tokens <= naive_max_tokens and device.type == "cpu":
                n_min = _time(partial(_naive_build, acts), max(1, repeats // 2))[0]
                naive, speedup = f"{n_min * 1e3 * per_1k:.1f}", f"{n_min / b_min:.1f}×"
            size = sum(len(p) for p in proofs) / tokens
            lines.append(
                f"| {hidden} | {tokens} | {b_min * 1e3 * per_1k:.2f} ({b_med * 1e3 * per_1k:.2f}, {b_cpu * 1e3 * per_1k:.2f}) "
                f"| {v_min * 1e3 * per_1k:.2f} ({v_med * 1e3 * per_1k:.2f}, {v_cpu * 1e3 * per_1k:.2f}) "
                f"| {bound * 1e3 * per_1k:.3f} | {v_min / b_min:.2f}× | {naive} | {speedup} | {size:.4f} |"
            )
    lines += [
        "",
        "| streaming ProofBuilder | H | total ms min (med) | ms per add | bandwidth bound ms | x bound |",
        "|---|---|---|---|---|---|",
    ]
    for hidden in hidden_sizes:
        shape = (32, stream_sequences, hidden)
        rows = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(device)
        s_min, s_med, _ = _time(partial(_stream, (stream_sequences, hidden), rows), repeats, device)
        bound = 3 * rows.numel() * rows.element_size() / bandwidth
        lines.append(
            f"| {stream_sequences} seqs x 32 tokens | {hidden} | {s_min * 1e3:.2f} ({s_med * 1e3:.2f}) "
            f"| {s_min * 1e3 / 32:.3f} | {bound * 1e3:.3f} | {s_min / bound:.0f}× |"
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
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the naive loop runs on CPU only)")
    parser.add_argument(
        "--stream-sequences", type=int, default=256, help="sequences fed to the streaming ProofBuilder"
    )
    parser.add_argument("--out", help="also write the table to this file, with the command and machine")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    table = run(args.hidden, args.tokens, args.repeats, args.naive_max_tokens, device, args.stream_sequences)
    print(table)
    if args.out:
        import platform
        import sys

        load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
        header = (
            f"# toploc bench\n\n`toploc bench {' '.join(sys.argv[1:] if argv is None else argv)}` on "
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"torch {torch.__version__}; load average at the end {load}.\n\n"
        )
        with open(args.out, "w", encoding="utf-8") as file:
            file.write(header + table + "\n")
