"""A one-line edit of ``examples/intellect2.py`` swaps the reward or the loss in every role that uses it.

Each test copies the recipe, edits exactly one line, points ``[components] reward`` or
``[trainer.loss]`` at the copy (as the recipe does for its own file) and checks what the roles
then do, with the tiny in-code model: workers claim the edited reward and only a validator with
the same reward accepts it; the trainer's loss is the edited recipe. The loss has one home: a
config whose ``[trainer.loss]`` names another loss than the recipe's stops the recipe before it
starts (exit 2, naming both), and so does a loss the runtime cannot train on.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

import grpo
from prime_rl.api.client import OrchestratorClient
from prime_rl.config import load_component, load_config
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.reward import default_reward, run_tasks
from prime_rl.tasks import load_tasks
from prime_rl.trainer.process import Trainer
from prime_rl.validator.process import Validator
from prime_rl.worker.process import Worker

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "intellect2.py"
DEFAULT_REWARD_LINE = "    (default_reward, 1.0),  # verifiers.verify's score, then the length term toward the budget"


def edit_one_line(tmp_path: Path, old: str, new: str, *, keep_old: bool = False) -> Path:
    """A copy of the recipe with the line ``old`` replaced by ``new`` (or, ``keep_old``, followed by
    ``new``), and nothing else changed."""
    lines = RECIPE.read_text().splitlines(keepends=True)
    (index,) = [i for i, line in enumerate(lines) if line.rstrip("\n") == old]
    lines[index] = (lines[index] if keep_old else "") + new + "\n"
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
                "--trainer.loss", f"{path}:loss",
            ],
        )  # fmt: skip
        trainer = Trainer(config)
        try:
            assert trainer.loss_fn is load_component("trainer.loss", f"{path}:loss")
            assert trainer.loss_fn.config == grpo.RECIPES[name]
        finally:
            trainer.close()


def run_recipe(recipe: Path, cwd: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """``python <recipe> --config configs/tiny-cpu.toml <overrides>`` as ``make run`` starts it."""
    command = [sys.executable, str(recipe), "--config", str(ROOT / "configs" / "tiny-cpu.toml"), *overrides]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("edit", "overrides", "message"),
    [
        (None, ("--trainer.loss.eps_high", "0.28"), "differ: eps_high 0.28 vs 0.2 (config vs recipe)"),
        (("intellect2", "dapo"), (), "differ: eps_high 0.2 vs 0.28, delta 4.0 vs None, aggregation 'constant' vs 'token_mean'"),
        (("intellect2", "dr_grpo"), (), "its advantage is group_center"),
    ],
    ids=["config-override", "recipe-edit", "dr_grpo"],
)
def test_two_different_losses_stop_the_recipe_before_it_starts(tmp_path: Path, edit, overrides, message):
    """configs/tiny-cpu.toml sets [trainer.loss]: an override of it, or a recipe loss line that differs
    from it, exits 2 naming both (before: the recipe's loss won and the table was dead text); a loss
    with another advantage estimator than the validator's z-scores is refused before anything starts."""
    recipe = RECIPE
    if edit is not None:
        recipe = edit_one_line(tmp_path, 'loss = grpo.Loss("intellect2")', f'loss = grpo.Loss("{edit[1]}")')
    done = run_recipe(recipe, tmp_path, *overrides)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr, done.stderr
    if "differ" in message:
        assert f"[trainer.loss] in {ROOT / 'configs' / 'tiny-cpu.toml'}" in done.stderr
        assert f"the recipe's loss {recipe.resolve()}:loss" in done.stderr
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_one_added_line_adds_a_format_reward(tmp_path: Path, tiny_tokenizer):
    """The recipe composes default_reward with its own terms: a format bonus is one added line, and the
    reward workers and the validator score with (run_tasks) is default_reward + 0.25 * the bonus."""
    bonus = '    (lambda task, completion, num_tokens, budget: float("\\\\boxed{" in completion), 0.25),'
    edited = edit_one_line(tmp_path, DEFAULT_REWARD_LINE, bonus, keep_old=True)
    assert len(edited.read_text().splitlines()) == len(RECIPE.read_text().splitlines()) + 1
    base = ["--tasks.num_tasks", "6", "--tasks.length_reward", "exact", "--tasks.target_lengths", "[4, 9]"]
    shipped = run_tasks(load_config(None, [*base, "--components.reward", f"{RECIPE}:reward"]), tiny_tokenizer)
    swapped = run_tasks(load_config(None, [*base, "--components.reward", f"{edited}:reward"]), tiny_tokenizer)
    for task_id in range(6):
        answer = str(shipped.task_set.task(task_id).verification_info.get("ground_truth", "7"))
        for completion in (f"The answer is \\boxed{{{answer}}}.", answer, "no idea"):
            plain = default_reward(shipped.task_set.task(task_id), completion, 5, shipped.budget(task_id))
            assert shipped.score(task_id, completion, 5) == plain  # the shipped recipe: default_reward exactly
            assert swapped.score(task_id, completion, 5) == plain + 0.25 * ("\\boxed{" in completion)


def test_one_line_reward_edit_reaches_workers_and_the_validator(tmp_path: Path, tiny_lm_dir: Path):
    """The worker claims the edited reward; a validator with the shipped recipe rejects the claims
    (reward_mismatch), one with the edited recipe accepts them."""
    edited = edit_one_line(
        tmp_path, DEFAULT_REWARD_LINE, "    (lambda task, completion, num_tokens, budget: 1 - len(completion) / 100, 1.0),"
    )
    base = [
        "--run_dir", str(tmp_path / "run"), "--model.path", str(tiny_lm_dir), "--tasks.num_tasks", "20",
        "--orchestrator.port", str(free_port()), "--orchestrator.prompts_per_batch", "2",
        "--sampling.group_size", "4", "--sampling.max_new_tokens", "6", "--validator.max_batches", "1",
        "--workers.device", "cpu", "--validator.device", "cpu",
        "--orchestrator.workers_view_max_age_s", "0",  # GET /workers right after acting
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
        # A reward claim no noise explains bans an identity with no accepted work (validator
        # verdicts.ban_counts); the second half answers under a new identity.
        assert admin.workers().workers[0].banned
        worker.worker_id = worker.client.register("worker-0b").worker_id

        assert worker.one_batch()
        judge = Validator(swapped)
        judge.run_loop()
        judge.close()
        worker.close()
        first, second = admin.workers().workers
    assert (first.samples_rejected, first.samples_accepted, second.samples_rejected, second.samples_accepted) == (8, 0, 0, 8)
    assert dict(first.rejected_reasons) == {"reward_mismatch": 8} and not second.banned
