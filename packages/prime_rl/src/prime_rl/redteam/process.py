"""The hostile worker process (``prime-rl redteam --config FILE --workers.behaviour NAME``).

It is the honest worker's loop (:class:`prime_rl.worker.process.Worker`) with one hook changed:
each lease is answered by a :class:`~prime_rl.redteam.attacks.HostileWorker` playing
``workers.behaviour`` (a name of :data:`~prime_rl.redteam.attacks.ATTACKS`, ``"mixed"`` or
``"honest"``). ``prime-rl run`` starts one per ``workers.hostile`` entry (children ``hostile-<i>``),
and its ``workers.count`` workers with this role too when ``workers.behaviour`` is not honest.

Hostile behaviours reach into the transformers model (copies, prefills): they always generate with
the HF backend, and ``workers.inflight_updates`` is off for them (the span forgeries switch in
flight on their own, through the worker's committed versions).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from prime_rl.redteam.attacks import BEHAVIOURS, HostileWorker, span_attack
from prime_rl.role import run_role
from prime_rl.worker.process import Answers, Worker
from verifiers.envs import ToolPythonMismatch

if TYPE_CHECKING:
    from prime_rl.config import RunConfig

log = logging.getLogger(__name__)


class HostileProcess(Worker):
    """A worker process that plays ``workers.behaviour`` (see the module docstring)."""

    behaviours = BEHAVIOURS

    @property
    def hostile(self) -> bool:
        return self.cfg.behaviour != "honest"

    def backend_name(self) -> str:
        return "hf" if self.hostile else super().backend_name()

    def start_inflight(self) -> None:
        if self.hostile:
            log.warning("workers.inflight_updates needs an honest worker: off for this one")
            return
        super().start_inflight()

    def make_answers(self) -> Answers:
        if not self.hostile:
            return super().make_answers()
        return HostileWorker(
            self.cfg.behaviour,
            self.tasks.encode,
            self.tasks.score,
            self.tasks.prompt_tokens,
            self.tasks.num_tasks,
            env=self.env,
            # the span forgeries switch in flight for real before they forge: they need what an
            # in-flight worker has (attacks.py), whatever workers.inflight_updates says
            versions=self.committed_versions() if span_attack(self.cfg.behaviour) else None,
        )


def main(config: RunConfig, name: str = "redteam") -> int:
    """Entry point of ``prime-rl redteam`` (:func:`prime_rl.role.run_role`, as ``prime-rl worker``)."""
    return run_role(
        "worker", name, config, num_threads=config.workers.num_threads, start=lambda: HostileProcess(config, name),
        loop=HostileProcess.run_loop, refuse=(ToolPythonMismatch,),
    )  # fmt: skip
