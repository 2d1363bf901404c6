"""`shardcast_bench.py --compression`: zstd and XOR-delta sizes of a bf16 safetensors checkpoint
(random Llama) before and after one AdamW step, published and fetched through shardcast.

Needs torch and transformers (imported only when this mode runs).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


def _changed_fraction(old: Path, new: Path) -> float:
    """Fraction of tensor elements whose stored (bf16) value differs between two checkpoints."""
    from safetensors.torch import load_file

    a, b = load_file(str(old)), load_file(str(new))
    changed = sum(int((a[k].view(-1) != b[k].view(-1)).sum()) for k in a)
    return changed / sum(t.numel() for t in a.values())


def main_compression(args: argparse.Namespace) -> None:
    """zstd and XOR-delta sizes on a bf16 safetensors checkpoint before/after one AdamW step."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from shardcast import Client, Origin

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=args.hidden,
        intermediate_size=int(args.hidden * 2.6875),
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
    )
    base = Path(args.workdir or tempfile.mkdtemp(prefix="shardcast-compress-"))
    base.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for lr in (3e-7, 1e-5, 1e-4):
            model = LlamaForCausalLM(config)  # fp32 master weights, as a trainer keeps them

            def save(path: Path, model: LlamaForCausalLM = model) -> None:
                state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
                save_file(state, str(path), metadata={"format": "pt"})

            save(base / "v1.safetensors")
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
            tokens = torch.randint(0, config.vocab_size, (4, 64))
            model(input_ids=tokens, labels=tokens).loss.backward()
            optimizer.step()
            save(base / "v2.safetensors")
            new = (base / "v2.safetensors").read_bytes()
            changed = _changed_fraction(base / "v1.safetensors", base / "v2.safetensors")
            with Origin(
                base / f"origin{lr}", port=0, encoding="zstd", delta=True, shard_size=args.shard_size
            ) as origin:
                origin.publish(base / "v1.safetensors", file_name="model.safetensors")
                t0 = time.monotonic()
                manifest = origin.publish(base / "v2.safetensors", file_name="model.safetensors")
                publish_s = time.monotonic() - t0
                client = Client([origin.url])
                first = client.fetch(1, base / "c" / "v1.safetensors")
                full = client.fetch(2, base / "c" / "v2full.safetensors")
                delta = client.fetch(2, base / "c" / "v2.safetensors", base=first.path)
                assert delta.used_delta and (base / "c" / "v2.safetensors").read_bytes() == new
            assert manifest.delta is not None
            rows.append(
                (
                    lr,
                    len(new),
                    manifest.stored_bytes,
                    sum(d.stored_size for d in manifest.delta.shards),
                    changed,
                    publish_s,
                    full.seconds,
                    delta.seconds,
                )
            )
            shutil.rmtree(base / "c", ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(base, ignore_errors=True)
    params = sum(p.numel() for p in LlamaForCausalLM(config).parameters()) / 1e6
    print(
        f"\nshardcast compression: random Llama ({params:.0f} M params, bf16 safetensors), one AdamW step, "
        f"{args.shard_size / 1e6:g} MB shards, loopback\n"
    )
    header = (
        f"{'AdamW lr':>9}{'file MB':>9}{'zstd MB':>9}{'zstd %':>8}{'delta MB':>10}{'delta %':>9}"
        f"{'elems changed %':>16}{'publish s':>11}{'fetch full s':>14}{'fetch delta s':>15}"
    )
    print(header)
    print("-" * len(header))
    for lr, size, zstd, delta, changed, publish_s, full_s, delta_s in rows:
        print(
            f"{lr:>9.0e}{size / 1e6:>9.1f}{zstd / 1e6:>9.1f}{100 * zstd / size:>8.1f}{delta / 1e6:>10.2f}"
            f"{100 * delta / size:>9.1f}{100 * changed:>16.2f}{publish_s:>11.2f}{full_s:>14.2f}{delta_s:>15.2f}"
        )
