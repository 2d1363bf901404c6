"""Weight deltas by checkpoint dtype (issue 48): how large shardcast's delta of one policy step is
when the trainer publishes fp32 checkpoints (``trainer.save_dtype = "model"`` with ``model.dtype =
"float32"``, the CPU default) versus bf16 ones (``save_dtype = "bfloat16"``), at INTELLECT-2-like
learning rates, published exactly as the trainer does (``shardcast.publish_file(..., delta=True)``).

A random Llama keeps fp32 master weights and takes ``--steps`` AdamW steps per learning rate; after
each step both checkpoints are written and published as the next version, and the delta's stored
bytes are compared with the file. Every step is one repeat: min and median over the steps.

    python benchmarks/delta_dtype_bench.py --out benchmarks/results/delta_dtype.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def measure(hidden: int, layers: int, steps: int, lrs: tuple[float, ...], workdir: Path) -> list[dict]:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    import shardcast

    rows = []
    config = LlamaConfig(
        vocab_size=32000, hidden_size=hidden, intermediate_size=int(hidden * 2.6875), num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=4,
    )  # fmt: skip
    for lr in lrs:
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        ratios: dict[str, list[tuple[int, int]]] = {"float32": [], "bfloat16": []}
        for version in range(steps + 1):
            if version:
                tokens = torch.randint(0, config.vocab_size, (4, 64))
                model(input_ids=tokens, labels=tokens).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            for dtype in ratios:
                path = workdir / dtype / f"v{version}" / "model.safetensors"
                path.parent.mkdir(parents=True, exist_ok=True)
                target = getattr(torch, dtype)
                save_file({k: v.detach().to(target).contiguous() for k, v in model.state_dict().items()}, str(path))
                manifest = shardcast.publish_file(workdir / dtype / "origin", path, version=version + 1, keep=3, delta=True)
                if version and manifest.delta is not None:
                    delta = sum(shard.stored_size for shard in manifest.delta.shards)
                    ratios[dtype].append((path.stat().st_size, delta))
        for dtype, pairs in ratios.items():
            shares = [delta / size for size, delta in pairs]
            rows.append({
                "lr": lr, "dtype": dtype, "file_mb": pairs[0][0] / 1e6,
                "delta_mb_min": min(d for _, d in pairs) / 1e6, "delta_mb_median": statistics.median(d for _, d in pairs) / 1e6,
                "share_min": min(shares), "share_median": statistics.median(shares),
                "smaller_median": statistics.median(size / delta for size, delta in pairs),
            })  # fmt: skip
        shutil.rmtree(workdir / "float32", ignore_errors=True)
        shutil.rmtree(workdir / "bfloat16", ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="AdamW steps (= repeats) per learning rate")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    workdir = Path(tempfile.mkdtemp(prefix="delta-dtype-"))
    try:
        rows = measure(args.hidden, args.layers, args.steps, (1e-6, 1e-5), workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    lines = [
        "# Weight deltas by checkpoint dtype",
        "",
        f"`python benchmarks/delta_dtype_bench.py --hidden {args.hidden} --layers {args.layers} --steps {args.steps}` "
        f"({started}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; the machine was shared with other "
        "processes, which changes no size below). A random Llama with fp32 master weights, one AdamW step per "
        "version, each version published by `shardcast.publish_file(..., delta=True)` as the trainer does; "
        f"min / median over {args.steps} steps.",
        "",
        "| AdamW lr | checkpoint | file MB | delta MB (min / median) | delta / file (min / median) | file / delta (median) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['lr']:.0e} | {r['dtype']} | {r['file_mb']:.1f} | {r['delta_mb_min']:.2f} / {r['delta_mb_median']:.2f} | "
            f"{100 * r['share_min']:.1f}% / {100 * r['share_median']:.1f}% | {r['smaller_median']:.0f}x |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
