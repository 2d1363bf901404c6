"""Where the HF decode loop's time goes on one device: each per-step part timed alone, then a
profiler table of whole decode steps. Diagnostic for ``gpu_check``'s generation row.

    python benchmarks/gpu_decode_profile.py            # on a GPU: Qwen2-0.5B shape, 64 x 256
    python benchmarks/gpu_decode_profile.py --smoke    # tiny sizes on the CPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import torch  # noqa: E402
from gpu_check import byte_tokenizer, timed  # noqa: E402
from trainer_bench import QWEN2_05B, qwen2_model  # noqa: E402


def median_ms(fn, device: torch.device, repeats: int = 5) -> float:
    """Median milliseconds of ``repeats`` calls after one warm-up call (gpu_check's timer)."""
    fn()
    return 1e3 * statistics.median(timed(fn, repeats, device)[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    import toploc
    from prime_rl.inference.backend import HFBackend, SamplingParams, sample_next, token_logprobs

    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    shape = (
        {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": 1000}
        if args.smoke
        else QWEN2_05B
    )
    batch, new = (8, 16) if args.smoke else (64, 256)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = qwen2_model(shape, 4096, dtype, device).eval()
    backend = HFBackend("unused", model=model, tokenizer=byte_tokenizer(shape["vocab"]), device=device,
                        max_batch_size=batch)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (32,), generator=g).tolist() for _ in range(batch)]
    seeds = list(range(batch))
    params = SamplingParams(max_new_tokens=new, temperature=1.0)
    rows = {}
    rows["backend.generate (whole)"] = median_ms(lambda: backend.generate(prompts, seeds, params), device, 2)
    hidden = torch.randn(batch, shape["hidden"], device=device, dtype=dtype)
    logits = backend._lm_head(hidden).float()
    seed_tensor = torch.tensor(seeds, device=device)
    rows["lm_head + float"] = median_ms(lambda: backend._lm_head(hidden).float(), device)
    rows["sample_next"] = median_ms(lambda: sample_next(logits, seed_tensor, 3, 1.0), device)
    sampled = sample_next(logits, seed_tensor, 3, 1.0)
    rows["token_logprobs"] = median_ms(lambda: token_logprobs(logits, sampled, 1.0), device)
    rows["uniform_noise"] = median_ms(
        lambda: toploc.sampling.uniform_noise(7, seed_tensor, torch.full_like(seed_tensor, 3), shape["vocab"]),
        device,
    )
    # One decode step of the model alone, at ~160 cached positions.
    from transformers import DynamicCache

    with torch.no_grad():
        ids = torch.tensor(prompts, device=device)
        for label, use_mask in (("decoder step, mask", True), ("decoder step, no mask", False)):
            cache = DynamicCache()
            backend._decoder(input_ids=ids, past_key_values=cache, use_cache=True)
            mask = torch.ones(batch, 33, dtype=torch.long, device=device)
            position = torch.full((batch, 1), 32, device=device)
            step_ids = ids[:, :1]

            def step(cache=cache, use_mask=use_mask, mask=mask, position=position, step_ids=step_ids) -> None:
                cache.crop(32)
                backend._decoder(
                    input_ids=step_ids,
                    attention_mask=mask if use_mask else None,
                    position_ids=position,
                    past_key_values=cache,
                    use_cache=True,
                )

            rows[label] = median_ms(step, device)
    for name, ms in rows.items():
        print(f"{name:32} {ms:9.3f} ms")
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            backend.generate(prompts, seeds, SamplingParams(max_new_tokens=32, temperature=1.0))
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
