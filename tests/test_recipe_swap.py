"""A one-line edit of ``examples/intellect2.py`` swaps the reward or the loss in every role that uses it.

Each test copies the recipe, edits exactly one line, points ``[components]`` at the copy (as the
recipe does for its own file) and checks what the roles then do, with the tiny in-code model:
workers claim the edited reward and only a validator with the same reward accepts it; the
trainer's loss is the edited recipe.
"""

from __future__ import annotations

import socket
from pathlib import Path

import grpo
from prime_rl.api.client import OrchestratorClient
from prime_rl.config import load_component, load_config
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.tasks import load_tasks
from prime_rl.trainer.process import Trainer
from prime_rl.validator.process import Validator
from prime_rl.worker.process import Worker

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "intellect2.py"


def edit_one_line(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the recipe with the line ``old`` replaced by ``new`` (and nothing else changed)."""
    lines = RECIPE.read_text().splitlines(keepends=True)
    (index,) = [i for i, line in enumerate(lines) if line.rstrip("\n") == old]
    lines[index] = new + "\n"
    copy = tmp_path / "my_recipe.py"
    copy.write_text("".join(lines))
    return copy


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_one_line_loss_edit_is_the_trainers_loss(tmp_path: Path, tiny_lm_dir: Path):
    edited = edit_one_line(tmp_path, 'loss = grpo.Loss("intellect2")', 'loss = grpo.Loss("dapo")')
    for path, name in ((RECIPE, "intellect2"), (edited, "dapo")):
        config = load_config(
            None,
            [
                "--run_dir", str(tmp_path / name), "--model.path", str(tiny_lm_dir), "--trainer.device", "cpu",
                "--components.loss", f"{path}:loss",
            ],
        )  # fmt: skip
        trainer = Trainer(config)
        try:
            assert trainer.loss_fn is load_component("components.loss", f"{path}:loss")
            assert trainer.loss_fn.config == grpo.RECIPES[name]
        finally:
            trainer.close()


def test_one_line_reward_edit_reaches_workers_and_the_validator(tmp_path: Path, tiny_lm_dir: Path):
    """The worker claims the edited reward; a validator with the shipped recipe rejects the claims
    (reward_mismatch), one with the edited recipe accepts them."""
    edited = edit_one_line(
        tmp_path,
        "    score = verifiers.verify(task, completion).reward",
        "    score = 1 - len(completion) / 100  # prefer short answers",
    )
    base = [
        "--run_dir", str(tmp_path / "run"), "--model.path", str(tiny_lm_dir), "--tasks.num_tasks", "20",
        "--orchestrator.port", str(free_port()), "--orchestrator.prompts_per_batch", "2",
        "--sampling.group_size", "4", "--sampling.max_new_tokens", "6", "--validator.max_batches", "1",
        "--workers.device", "cpu", "--validator.device", "cpu",
    ]  # fmt: skip
    swapped = load_config(None, [*base, "--components.reward", f"{edited}:reward"])
    shipped = load_config(None, [*base, "--components.reward", f"{RECIPE}:reward"])
    with (
        OrchestratorServer(swapped, load_tasks(swapped.tasks)) as server,
        OrchestratorClient(server.url, admin_token=server.admin_token) as admin,
    ):
        worker = Worker(swapped, "worker-0")
        worker.worker_id = worker.client.register("worker-0").worker_id
        decode = worker.backend.tokenizer.decode

        assert worker.one_batch()
        (batch,) = admin.pending(8).batches
        claimed = [s.reward for s in batch.samples]
        texts = [decode(list(s.completion_tokens), skip_special_tokens=True) for s in batch.samples]
        # The edited reward: never what verifiers gives (1 for an empty completion, which verifiers
        # scores 0; strictly between 0 and 1 for the others), so every claim differs from the shipped one.
        assert claimed == [1 - len(text) / 100 for text in texts]
        judge = Validator(shipped)
        judge.run_loop()
        judge.close()

        assert worker.one_batch()
        judge = Validator(swapped)
        judge.run_loop()
        judge.close()
        worker.close()
        (stats,) = admin.workers().workers
    assert (stats.samples_rejected, stats.samples_accepted) == (8, 8)
    assert dict(stats.rejected_reasons) == {"reward_mismatch": 8}
