"""Benchmark: one trainer step (document attention, chunked head) vs today's dense-mask step vs plain HF.

Three ways to take one AdamW step on the same packed row of ``--tokens`` tokens (16 sequences of
a quarter prompt and three quarters completion; grpo recipe "intellect2", entropy on):

* ``document``: ``prime_rl.trainer.step.train_minibatch`` as the trainer runs it: document
  attention from the sequence boundaries (``grpo.document_attention``: SDPA per sequence on CPU,
  FlexAttention or flash-attention varlen on CUDA) and the chunked LM head;
* ``dense mask``: the same step with the dense additive ``[1, 1, L, L]`` ``grpo.block_causal_mask``
  instead (the trainer's attention up to main at fff8989), built per forward in place of
  ``grpo.shared_prefix_kwargs`` (:func:`dense_mask_attention`; the step raises if the trainer
  built none) and attended by the model's own SDPA;
* ``plain HF``: what a plain HF trainer does: ``model(input_ids).logits`` with plain causal
  attention over the whole row, fp32 log-softmax of all ``[L, V]`` logits, a masked policy loss.

The model is a random Qwen2-shaped model from a config (no hub): on CPU 2 layers, hidden 256,
4 heads of 64, 2 KV heads, Qwen2's vocabulary (V = 151,936), fp32. ``benchmarks/gpu_check.py``
runs the same steps on a GPU with Qwen2-0.5B's shape (:data:`QWEN2_05B`).

Memory: peak extra RSS of one step in a fresh child per variant (the kernel's high-water mark is
reset after a warm-up step, so weights and optimizer state are not counted; the step's gradients
are), with glibc's mmap threshold fixed at 64 KiB so the high-water mark follows live tensors. Time:
the variants alternate in one child; wall min/median and process CPU time median. tok/s is the
row's tokens over the least wall time (on a shared machine, CPU time is the steadier figure).

Attention alone (``--parts attention``): one layer's attention, forward and backward, Qwen2-0.5B's
heads (14 x 64, 2 KV heads, fp32), on the same row layout: SDPA with the dense mask (as transformers
runs it: KV heads repeated), ``grpo.document_attention`` and plain causal SDPA over the whole row
(what the plain HF step computes, across sequences); the mask is built once, outside the timing.

Shared prompt (``--parts shared``): one AdamW step on one GRPO group, ``G`` completions of one
prompt (``G`` = 8, 16; prompts of 150 and 1,000 tokens; completions 64-256 tokens, seeded), packed
as today (``share_prompts=False``: ``G`` sequences ``prompt ⧺ completion`` in one row) against
the shared-prompt row (``[prompt, completion_1, ..., completion_G]``: the prompt computed once).
Both in one row of at most 32,768 tokens (INTELLECT-2's ``micro_batch_tokens``), same loss, same
chunked head. tok/s counts the tokens the loss trains on (completion tokens) over the least wall
time, so the two layouts are compared on the same work; cpu ratio is the median process CPU time
against the packed row's (the steadier figure on a shared machine). One fresh child per case and
layout: a warm-up step, one step for the RSS high-water mark (as above), then the timed steps
(with the fixed mmap threshold of the memory children, in both layouts alike). The model is Qwen2-shaped with Qwen2-0.5B's proportions between
body and head (:data:`SHARED_SHAPE`; the 151,936-token head of :data:`CPU_SHAPE` on a 2-layer body
would make the head, computed on completion tokens only in both layouts, all of the step).

Run: ``.venv/bin/python benchmarks/trainer_bench.py [--repeats 3] [--tokens 1024 4096]
[--parts steps attention shared] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from grpo_bench import reset_peak, status_kib

VARIANTS = ("document", "dense", "plain")
TITLES = {
    "document": "document attn + chunked head",
    "dense": "dense mask + chunked head",
    "plain": "plain HF",
}
DOCUMENTS = 16  # sequences per packed row
CPU_SHAPE = {"hidden": 256, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 1024, "vocab": 151936}
SHARED_SHAPE = {"hidden": 192, "layers": 4, "heads": 3, "kv_heads": 1, "intermediate": 512, "vocab": 4096}
SHARED_CASES = ((8, 150), (16, 150), (8, 1000), (16, 1000))  # (group size, prompt tokens)
SHARED_VARIANTS = ("packed", "shared")
SHARED_ROW_TOKENS = 32768
QWEN2_05B = {"hidden": 896, "layers": 24, "heads": 14, "kv_heads": 2, "intermediate": 4864, "vocab": 151936}


def qwen2_model(shape: dict[str, int], max_positions: int, dtype, device):
    """A random-weight Qwen2 causal LM of ``shape`` (see :data:`QWEN2_05B`), in train mode."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"], max_position_embeddings=max_positions,
        tie_word_embeddings=True,  # as Qwen2-0.5B
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: a 0.5B model in seconds on a GPU
        model = Qwen2ForCausalLM(config)
    return model.to(dtype=dtype).train()


def packed_samples(tokens: int, vocab: int):
    """``DOCUMENTS`` train samples filling one row of ``tokens`` (a quarter prompt each)."""
    import torch

    from prime_rl.api.protocol import TrainSample

    length = tokens // DOCUMENTS
    prompt, completion = length // 4, length - length // 4
    g = torch.Generator().manual_seed(0)
    return [
        TrainSample(
            sample_id=f"b/{i}", batch_id="b", worker_id="w", task_id=i // 4, group_index=i % 4,
            policy_version=0, prompt_tokens=torch.randint(0, vocab, (prompt,), generator=g).tolist(),
            completion_tokens=torch.randint(0, vocab, (completion,), generator=g).tolist(),
            behaviour_logprobs=[-12.0] * completion, temperature=1.0, reward=float(i % 2), advantage=(-1.0) ** i,
        )
        for i in range(DOCUMENTS)
    ]  # fmt: skip


def dense_structure_mask(structure, dtype=None, device=None):
    """The additive ``[1, 1, L, L]`` mask of ``structure``'s rule (a ``grpo.SharedPrefixStructure`` of
    one row): ``grpo.block_causal_mask`` over its segments, then each suffix's queries opened to its
    prefix's keys, so each completion sees its prompt and, causally, itself; plain documents (no
    suffixes, as ``share_prompts=False`` packs) are exactly ``block_causal_mask`` of the documents.
    ``dtype``: the mask's (the model's; SDPA wants them equal), fp32 by default; ``device``: where
    it is built (the model's: a CUDA SDPA kernel takes no CPU mask), the CPU by default.
    """
    import torch

    import grpo

    bounds = structure.bounds
    segment = torch.repeat_interleave(torch.arange(len(bounds) - 1), structure.cu_seqlens().diff())
    mask = grpo.block_causal_mask(segment[None].to(device), dtype or torch.float32)
    for suffix, prefix in enumerate(structure.prefix_of):
        if prefix != suffix:  # the prefix lies before the suffix: all of it is visible
            mask[..., bounds[suffix] : bounds[suffix + 1], bounds[prefix] : bounds[prefix + 1]] = 0
    return mask


@contextmanager
def dense_mask_attention(dtype=None, device=None) -> Iterator[list[tuple[int, ...]]]:
    """The trainer's forward as it was: the dense ``block_causal_mask`` (fp32, built per forward).

    Stands in for what ``prime_rl.trainer.forward`` calls: ``grpo.shared_prefix_kwargs(structure)``
    gives ``{"attention_mask": dense_structure_mask(structure, dtype)}`` and
    ``grpo.use_document_attention`` leaves the model's own attention (SDPA) in place. Yields the
    shapes of the masks built, so a caller can check that the trainer still asked for them.
    Pitfall: transformers builds its own block-causal mask from position ids that restart when
    it is given no mask, so a stand-in the trainer no longer calls is silent in the values.
    """
    import grpo

    saved = grpo.shared_prefix_kwargs, grpo.use_document_attention
    built: list[tuple[int, ...]] = []

    def dense_kwargs(structure):
        mask = dense_structure_mask(structure, dtype, device)
        built.append(tuple(mask.shape))
        return {"attention_mask": mask}

    grpo.shared_prefix_kwargs = dense_kwargs
    grpo.use_document_attention = lambda model, backend="auto": nullcontext()
    try:
        yield built
    finally:
        grpo.shared_prefix_kwargs, grpo.use_document_attention = saved


def make_steps(model, samples, tokens: int, device) -> dict[str, Callable[[], None]]:
    """One callable per variant, each a full step: batching, forward, backward, AdamW.

    :data:`VARIANTS`, plus ``document_full``: document attention with the full-logits head, and
    ``document_ckpt``: ``document`` with activation checkpointing (``[trainer]
    activation_checkpointing``: the decoder layers recomputed in backward), on for its step only.
    """
    import torch

    import grpo
    from prime_rl.trainer.batching import make_micro_batches
    from prime_rl.trainer.step import train_minibatch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)
    loss = grpo.Loss("intellect2")
    completion = len(samples[0].completion_tokens)

    def trainer_step(fused: bool = True) -> None:
        micro = make_micro_batches(samples, tokens)
        train_minibatch(
            model, optimizer, micro, None, loss, temperature=1.0, constant=float(completion),
            max_grad_norm=1.0, device=device, fused_lm_head=fused,
        )  # fmt: skip
        optimizer.zero_grad(set_to_none=True)

    def checkpointed_step() -> None:
        grpo.enable_activation_checkpointing(model)
        try:
            trainer_step()
        finally:  # the other variants share the model
            model.gradient_checkpointing_disable()

    def dense_step() -> None:
        # In the model's dtype and on its device: CPU SDPA takes an fp32 mask beside bf16 queries, a
        # GPU kernel takes neither that nor a mask on the CPU.
        weight = next(model.parameters())
        with dense_mask_attention(weight.dtype, weight.device) as built:
            trainer_step()
        if not built:
            raise RuntimeError(
                "the trainer built no dense mask: it no longer calls grpo.shared_prefix_kwargs"
            )

    def plain_step() -> None:
        micro = make_micro_batches(samples, tokens)[0]
        ids = micro.input_ids.to(device)
        weights = torch.zeros(ids.shape[1], device=device)  # -advantage on completion-predicting positions
        for place, advantage in zip(micro.placements, micro.advantages.tolist(), strict=True):
            predictors = torch.tensor(place.predictor_positions(), device=device)
            weights[predictors] = -advantage / (len(samples) * completion)
        logits = model(input_ids=ids).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
        (logprobs * weights[:-1]).sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return {
        "document": trainer_step,
        "document_full": lambda: trainer_step(fused=False),
        "document_ckpt": checkpointed_step,
        "dense": dense_step,
        "plain": plain_step,
    }


def _cpu_steps(tokens: int) -> dict[str, Callable[[], None]]:
    import torch

    model = qwen2_model(CPU_SHAPE, tokens, torch.float32, "cpu")
    return make_steps(model, packed_samples(tokens, CPU_SHAPE["vocab"]), tokens, torch.device("cpu"))


def measure_memory(tokens: int, variant: str) -> dict[str, float]:
    step = _cpu_steps(tokens)[variant]
    step()  # warm-up: lazy init, allocator arenas, gradients and AdamW state exist from here on
    gc.collect()
    before = status_kib("VmRSS")
    exact = reset_peak()
    step()
    peak = status_kib("VmHWM") if exact else status_kib("VmPeak")
    return {"peak_extra_mib": (peak - before) / 1024}


def measure_time(tokens: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    steps = _cpu_steps(tokens)
    for step in steps.values():
        step()
    times: dict[str, dict[str, list[float]]] = {v: {"wall": [], "cpu": []} for v in VARIANTS}
    for _ in range(repeats):
        for variant in VARIANTS:
            wall, cpu = time.perf_counter(), time.process_time()
            steps[variant]()
            times[variant]["wall"].append(time.perf_counter() - wall)
            times[variant]["cpu"].append(time.process_time() - cpu)
    return times


def measure_attention(tokens: int, repeats: int) -> dict[str, list[float]]:
    import torch
    import torch.nn.functional as F

    import grpo

    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim = (
        QWEN2_05B["heads"],
        QWEN2_05B["kv_heads"],
        QWEN2_05B["hidden"] // QWEN2_05B["heads"],
    )
    q = torch.randn(1, heads, tokens, dim, generator=g, requires_grad=True)
    k, v = (torch.randn(1, kv_heads, tokens, dim, generator=g, requires_grad=True) for _ in "kv")
    cu = torch.arange(0, tokens + 1, tokens // DOCUMENTS, dtype=torch.int32)
    mask = grpo.block_causal_mask(torch.repeat_interleave(torch.arange(DOCUMENTS), cu.diff())[None])
    groups = heads // kv_heads
    ways = {
        "dense": lambda: F.scaled_dot_product_attention(
            q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), attn_mask=mask
        ),
        "document": lambda: grpo.document_attention(q, k, v, cu),
        "causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
    }
    times: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(repeats + 1):  # the first round warms up
        for way, attend in ways.items():
            start = time.perf_counter()
            attend().sum().backward()
            times[way].append(time.perf_counter() - start)
    return {way: values[1:] for way, values in times.items()}


def group_samples(
    group: int, prompt: int, vocab: int, seed: int = 0, completions: tuple[int, int] = (64, 256)
):
    """One GRPO group: ``group`` samples of one ``prompt``-token prompt, completions of
    ``completions`` (inclusive range) tokens."""
    import torch

    from prime_rl.api.protocol import TrainSample

    g = torch.Generator().manual_seed(seed)
    prompt_tokens = torch.randint(0, vocab, (prompt,), generator=g).tolist()
    lengths = torch.randint(completions[0], completions[1] + 1, (group,), generator=g).tolist()
    return [
        TrainSample(
            sample_id=f"b/{i}", batch_id="b", worker_id="w", task_id=0, group_index=i, policy_version=0,
            prompt_tokens=prompt_tokens, completion_tokens=torch.randint(0, vocab, (c,), generator=g).tolist(),
            behaviour_logprobs=[-9.0] * c, temperature=1.0, reward=float(i % 2), advantage=(-1.0) ** i,
        )
        for i, c in enumerate(lengths)
    ]  # fmt: skip


def _shared_steps(group: int, prompt: int) -> tuple[dict[str, Callable[[], None]], dict[str, int]]:
    """One step callable per :data:`SHARED_VARIANTS`, and each layout's row length; completion tokens."""
    import torch

    import grpo
    from prime_rl.trainer.batching import make_micro_batches
    from prime_rl.trainer.step import train_minibatch

    model = qwen2_model(SHARED_SHAPE, prompt + 512, torch.float32, "cpu")
    samples = group_samples(group, prompt, SHARED_SHAPE["vocab"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)
    loss = grpo.Loss("intellect2")
    rows = {
        v: make_micro_batches(samples, SHARED_ROW_TOKENS, share_prompts=v == "shared")
        for v in SHARED_VARIANTS
    }

    def step(variant: str) -> None:
        train_minibatch(
            model, optimizer, rows[variant], None, loss, temperature=1.0, constant=256.0, max_grad_norm=1.0,
            device=torch.device("cpu"),
        )  # fmt: skip
        optimizer.zero_grad(set_to_none=True)

    sizes = {v: sum(m.input_ids.shape[1] for m in rows[v]) for v in SHARED_VARIANTS}
    sizes["completion"] = sum(len(s.completion_tokens) for s in samples)
    return {v: (lambda v=v: step(v)) for v in SHARED_VARIANTS}, sizes


def measure_shared(case: str, variant: str, repeats: int) -> dict:
    """One child per (case, layout): a warm-up step, one step for the RSS high-water mark, then
    ``repeats`` timed steps (wall and process CPU time)."""
    group, prompt = map(int, case.split("x"))
    steps, sizes = _shared_steps(group, prompt)
    step = steps[variant]
    step()
    gc.collect()
    before = status_kib("VmRSS")
    exact = reset_peak()
    step()
    peak = status_kib("VmHWM") if exact else status_kib("VmPeak")
    wall, cpu = [], []
    for _ in range(repeats):
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - start_wall)
        cpu.append(time.process_time() - start_cpu)
    return {"peak_extra_mib": (peak - before) / 1024, "wall": wall, "cpu": cpu, "sizes": sizes}


def run_shared(repeats: int, json_path: Path | None = None) -> list[dict]:
    rows: list[dict] = []
    for group, prompt in SHARED_CASES:
        for v in SHARED_VARIANTS:
            got = _child("shared", v, f"{group}x{prompt}", str(repeats))
            wall, cpu = got["wall"], got["cpu"]
            completion = got["sizes"]["completion"]
            rows.append(
                {
                    "group": group, "prompt": prompt, "variant": v, "row_tokens": got["sizes"][v],
                    "completion_tokens": completion, "peak_extra_mib": got["peak_extra_mib"],
                    "wall_min_s": min(wall), "wall_median_s": statistics.median(wall), "cpu_min_s": min(cpu),
                    "cpu_median_s": statistics.median(cpu), "tokens_per_s": completion / min(wall),
                    "tokens_per_cpu_s": completion / statistics.median(cpu),
                }
            )  # fmt: skip
        print(shared_table([r for r in rows if (r["group"], r["prompt"]) == (group, prompt)]), flush=True)
        if json_path is not None:  # a case at a time: a long run keeps what it measured
            json_path.write_text(json.dumps({"shape": SHARED_SHAPE, "rows": rows}, indent=1))
    return rows


def shared_table(rows: list[dict]) -> str:
    header = (
        f"{'G':>3} {'prompt':>6} {'layout':8} {'row tokens':>10} {'peak extra MiB':>14} {'wall min s':>10} "
        f"{'wall med s':>10} {'cpu med s':>9} {'loss tok/s':>10} {'tok/s ratio':>11} {'cpu ratio':>9} "
        f"{'memory ratio':>12}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        base = next(
            r
            for r in rows
            if (r["group"], r["prompt"], r["variant"]) == (row["group"], row["prompt"], "packed")
        )
        lines.append(
            f"{row['group']:3d} {row['prompt']:6d} {row['variant']:8} {row['row_tokens']:10d} "
            f"{row['peak_extra_mib']:14.0f} {row['wall_min_s']:10.3f} {row['wall_median_s']:10.3f} "
            f"{row['cpu_median_s']:9.3f} {row['tokens_per_s']:10.0f} "
            f"{row['tokens_per_s'] / base['tokens_per_s']:11.2f} {row['cpu_median_s'] / base['cpu_median_s']:9.2f} "
            f"{row['peak_extra_mib'] / base['peak_extra_mib']:12.2f}"
        )
    return "\n".join(lines)


def _child(*args: str) -> dict:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    if args[0] in ("memory", "shared"):
        # A fixed mmap threshold: every large tensor is its own mapping, returned on free, so the RSS
        # high-water mark follows live tensors (glibc's moving threshold adds hundreds of MiB of noise).
        # Not for timing: a fresh mapping per tensor costs page faults.
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True
    )
    if proc.returncode:
        raise RuntimeError(f"child {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(tokens: int, repeats: int) -> list[dict]:
    memory = {v: _child("memory", v, str(tokens))["peak_extra_mib"] for v in VARIANTS}
    times = _child("time", str(repeats), str(tokens))
    return [
        {
            "tokens": tokens, "variant": v, "peak_extra_mib": memory[v],
            "wall_min_s": min(times[v]["wall"]), "wall_median_s": statistics.median(times[v]["wall"]),
            "cpu_median_s": statistics.median(times[v]["cpu"]),
            "tokens_per_s": tokens / min(times[v]["wall"]),
        }
        for v in VARIANTS
    ]  # fmt: skip


def attention_table(rows: list[dict]) -> str:
    header = (
        f"{'tokens':>6} {'attention (fwd+bwd, one layer)':34} {'min ms':>8} {'median ms':>9} {'vs dense':>8}"
    )
    lines = [header, "-" * len(header)]
    titles = {
        "dense": "SDPA, dense block-causal mask",
        "document": "grpo.document_attention",
        "causal": "SDPA causal (crosses sequences)",
    }
    for row in rows:
        dense = next(r for r in rows if r["tokens"] == row["tokens"] and r["way"] == "dense")
        lines.append(
            f"{row['tokens']:6d} {titles[row['way']]:34} {1e3 * row['min_s']:8.1f} {1e3 * row['median_s']:9.1f} "
            f"{row['median_s'] / dense['median_s']:8.3f}"
        )
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    header = (
        f"{'tokens':>6} {'variant':30} {'peak extra MiB':>14} {'wall min s':>10} {'wall med s':>10} "
        f"{'cpu med s':>9} {'tok/s':>7} {'cpu/plain':>9}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        plain = next(r for r in rows if r["tokens"] == row["tokens"] and r["variant"] == "plain")
        lines.append(
            f"{row['tokens']:6d} {TITLES[row['variant']]:30} {row['peak_extra_mib']:14.0f} {row['wall_min_s']:10.3f} "
            f"{row['wall_median_s']:10.3f} {row['cpu_median_s']:9.3f} {row['tokens_per_s']:7.0f} "
            f"{row['cpu_median_s'] / plain['cpu_median_s']:9.3f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--tokens", type=int, nargs="+", default=[1024, 4096], help="tokens in the packed row"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["steps", "attention", "shared"],
        default=["steps", "attention", "shared"],
    )
    args = parser.parse_args()
    if args.child and args.child[0] == "shared":
        _, variant, case, repeats = args.child
        print(json.dumps(measure_shared(case, variant, int(repeats))))
        return
    if args.child:
        kind, arg, tokens = args.child
        measure = {"memory": measure_memory, "time": measure_time, "attention": measure_attention}[kind]
        print(json.dumps(measure(int(tokens), arg if kind == "memory" else int(arg))))
        return
    import torch

    shape = ", ".join(f"{k} {v}" for k, v in CPU_SHAPE.items())
    print(
        f"trainer step benchmark (CPU): torch {torch.__version__}, {os.cpu_count()} cores, load avg "
        f"{os.getloadavg()[0]:.1f}; Qwen2-shaped ({shape}), fp32; {DOCUMENTS} sequences per row; "
        f"one AdamW step, recipe intellect2; {args.repeats} alternating repeats"
    )
    result: dict = {"torch": torch.__version__, "shape": CPU_SHAPE, "load_average": os.getloadavg()[0]}
    if "steps" in args.parts:
        result["rows"] = [row for tokens in args.tokens for row in run(tokens, args.repeats)]
        print(table(result["rows"]))
    if "attention" in args.parts:
        result["attention"] = [
            {"tokens": tokens, "way": way, "min_s": min(times), "median_s": statistics.median(times)}
            for tokens in args.tokens
            for way, times in _child("attention", str(max(args.repeats, 5)), str(tokens)).items()
        ]
        print(attention_table(result["attention"]))
    if "shared" in args.parts:
        shape = ", ".join(f"{k} {v}" for k, v in SHARED_SHAPE.items())
        print(f"shared prompt: one GRPO group per step, Qwen2-shaped ({shape}), fp32, {args.repeats} repeats")
        result["shared"] = run_shared(
            args.repeats, args.json.with_suffix(".shared.json") if args.json else None
        )
        print(shared_table(result["shared"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
