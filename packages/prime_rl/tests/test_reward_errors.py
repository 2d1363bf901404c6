"""Issue 48 item 2: a reward is a finite real number or an error naming the environment, the
function and the task id. The worker reports it and goes on (the lease is not submitted, so the
sample never reaches a batch); the validator refuses it too, without blaming the worker.

Before: ``"1.0"`` and ``True`` were converted by ``float()`` and trained on, NaN and inf passed the
rubric, and a NaN killed the worker with ``grpo.errors.ShapeError: rewards contain NaN or inf``,
naming neither the environment nor the function.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import socket
import threading
from typing import Any

import pytest
from calculator_tasks import TEMPLATE, sum_prompt, sum_tasks  # tests/support
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from validator_setup import TinyRun

from prime_rl.api.client import OrchestratorClient
from prime_rl.config import load_config
from prime_rl.episodes import EpisodeEnv
from prime_rl.inference.backend import HFBackend
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.redteam.attacks import HostileWorker
from prime_rl.reward import RunTasks
from prime_rl.tasks import TaskSet, load_tasks
from prime_rl.validator.checks import Reason
from prime_rl.worker.process import Worker
from verifiers import RewardError, Task
from verifiers.envs import CalculatorEnv, Message, RewardFunc, Rubric

NOT_NUMBERS = ["1.0", True, None, math.nan, math.inf]
KEY = b"reward-errors-assignment-key"
NUM_TASKS, GROUP, PER_BATCH, MAX_NEW, TURNS = 12, 2, 2, 5, 2
TOKENIZER = make_tiny_tokenizer()
RUN = TinyRun(KEY, TOKENIZER, sum_prompt, NUM_TASKS, GROUP, PER_BATCH, MAX_NEW)
TASKS = sum_tasks(NUM_TASKS)


@pytest.fixture(scope="module")
def backend() -> HFBackend:
    return HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER)


def worker(env: EpisodeEnv) -> HostileWorker:
    return HostileWorker("honest", RUN.encode, RUN.score, RUN.prompt_tokens, NUM_TASKS, env=env)


def judge(batch: Any, record: Any, backend: HFBackend, checks: Any) -> Any:
    return RUN.judge(batch, record, checks, lambda v: backend)


class BadRewardEnv(CalculatorEnv):
    """The calculator, scored by a reward that returns ``bad`` (the tiny model never answers right)."""

    def __init__(self, bad: object = math.nan, max_turns: int = TURNS) -> None:
        super().__init__(max_turns=max_turns, feedback=True)

        def reversed_answer(task: Task, messages: tuple[Message, ...]):  # unannotated: only its value can tell
            return bad

        self.rubric = Rubric((RewardFunc("reversed_answer", reversed_answer),))


def bad_env(bad: object) -> EpisodeEnv:
    return EpisodeEnv(BadRewardEnv(bad), TASKS, TOKENIZER, turn_template=TEMPLATE, name="rev_env.py:BadRewardEnv")


@pytest.mark.parametrize("bad", NOT_NUMBERS, ids=repr)
def test_the_worker_refuses_to_build_a_batch_with_a_reward_that_is_not_a_number(bad: object, backend: Any) -> None:
    lease, _ = RUN.lease("bad-reward", 0, 0)
    with pytest.raises(RewardError) as refused:
        worker(bad_env(bad)).answer(lease, backend)
    first_task = lease.tasks[0].task_id
    assert str(refused.value).startswith(
        f"environment 'rev_env.py:BadRewardEnv', reward function 'reversed_answer', task {first_task}: "
        f"returned {bad!r} ({type(bad).__name__}); a reward must be a finite real number"
    )


@pytest.mark.parametrize("bad", NOT_NUMBERS, ids=repr)
def test_the_validator_refuses_every_sample_whose_recomputed_reward_is_not_a_number(bad: object, backend: Any) -> None:
    """All five: the validator recomputes every reward with the run's environment, and a value that
    is not a finite real number can never be trained on. The reason is ``internal_error`` (the
    environment's bug, not the worker's: no ban count), and the detail names environment, function
    and task."""
    lease, record = RUN.lease("honest-for-bad-reward", 0, 0)
    good = EpisodeEnv(BadRewardEnv(0.0), TASKS, TOKENIZER, turn_template=TEMPLATE)
    batch = worker(good).answer(lease, backend)
    checks = dataclasses.replace(RUN.checks(), episode_env=bad_env(bad))
    verdicts = judge(batch, record, backend, checks)
    assert not any(v.accepted for v in verdicts) and len(verdicts) == GROUP * PER_BATCH
    internal = [v for v in verdicts if v.reason == Reason.INTERNAL_ERROR]
    assert internal, {(v.reason, v.detail) for v in verdicts}
    assert internal[0].detail.startswith(
        "reward is not a number: environment 'rev_env.py:BadRewardEnv', reward function 'reversed_answer', task "
    )


def test_a_single_turn_reward_returning_a_bool_is_an_error(tiny_tokenizer: Any) -> None:
    def passed(task: Any, completion: str, num_tokens: int, budget: Any) -> bool:
        return completion == "2"

    tasks = RunTasks(TaskSet([{"prompt": "1 + 1 =", "task_type": "arithmetic_exact"}]), tiny_tokenizer, reward=passed)
    with pytest.raises(RewardError, match=r"^environment 'single_turn', reward function '.*passed', task 0: returned True \(bool\)"):
        tasks.score(0, "2", 1)


class FlakyRewardEnv(CalculatorEnv):
    """A replayable calculator whose reward returns NaN for the first ``nan_calls`` episodes scored
    in this process, then 0.5: the worker must survive the NaN lease and submit the next one."""

    replayable = True
    calls = 0

    def __init__(self, nan_calls: int = 1, max_turns: int = 2) -> None:
        super().__init__(max_turns=max_turns)
        self.nan_calls = nan_calls
        self.rubric = Rubric((RewardFunc("flaky", self.flaky),))

    def flaky(self, task: Task, messages: tuple[Message, ...]) -> float:
        FlakyRewardEnv.calls += 1
        return math.nan if FlakyRewardEnv.calls <= self.nan_calls else 0.5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_worker_reports_a_nan_reward_and_goes_on_with_the_next_lease(tmp_path: Any, tiny_lm_dir: Any, caplog: Any) -> None:
    config = load_config(None, [
        "--run_dir", str(tmp_path / "run"), "--model.path", str(tiny_lm_dir), "--tasks.num_tasks", "20",
        "--orchestrator.port", str(_free_port()), "--orchestrator.prompts_per_batch", "2",
        "--sampling.group_size", "2", "--sampling.max_new_tokens", "4",
        "--shardcast.origin_port", str(_free_port()), "--shardcast.relay_ports", "[]",
        "--workers.max_batches", "1", "--workers.poll_interval_s", "0.2", "--orchestrator.task_timeout_s", "4",
        "--tasks.environment.name", f"{__file__}:FlakyRewardEnv",
    ])  # fmt: skip
    caplog.set_level(logging.ERROR, logger="prime_rl.worker.process")
    FlakyRewardEnv.calls = 0
    with OrchestratorServer(config, load_tasks(config.tasks)) as server, OrchestratorClient(
        server.url, admin_token=server.admin_token
    ) as admin:
        the_worker = Worker(config, "worker-0")
        runner = threading.Thread(target=the_worker.run_loop)
        runner.start()
        runner.join(timeout=300)
        assert not runner.is_alive()
        the_worker.close()
        pending = admin.pending(8).batches
    assert the_worker.reward_errors == 1 and the_worker.submitted == 1  # it went on, and did not die
    (line,) = [r.getMessage() for r in caplog.records if "not submitted" in r.getMessage()]
    assert f"environment '{__file__}:FlakyRewardEnv', reward function 'flaky', task " in line
    assert "returned nan (float)" in line
    # the NaN lease (batch 0) never reached a batch: only the next lease's samples did, all scored 0.5
    assert [b.batch_index for b in pending] == [1]
    assert all(s.reward == 0.5 for s in pending[0].samples)
