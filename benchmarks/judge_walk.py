"""The walk of one batch through ``Validator.judge``: how often a reader following the calls is sent
back to a file of ``prime_rl`` it has already left (issue 47, item 1).

A real ``prime_rl.validator.process.Validator`` (its ``judge``, ``backend_for``, ``log``, ``banned``;
only the I/O around it is in-process: its orchestrator client answers ``POST /validator/verdicts``
as the run's ledger would, and its policy store hands out local weights files) judges two honest
batches of the test suite's tiny models (fp32; two tiny models seeded 0 and 1 are versions 0 and 1),
each of which must be accepted whole:

* ``spanned``: a single-turn lease decoded by ``HFBackend`` with an announced in-flight switch to v1
  at token 32 (keep-KV; the lease's record holds the switch, as the orchestrator keeps it);
* ``episodes``: a multi-turn lease (the calculator environment, three model turns) played by
  ``worker/episodes.py`` with an announced switch to v1 at model turn 1 (recompute-KV).

The tracer (``sys.setprofile``) keeps every ``call`` event of a function defined in a file of the
``prime_rl`` package while ``judge`` runs (comprehension frames are part of their function, not
counted), each function at its first call only: the order a reader following the batch meets them.
Consecutive calls in one file form one *stay*; a stay in a file the walk had already left is a
*return*, where "left" is read two ways: any earlier stay, or (*callers' files not left*) an earlier
stay of a file none of whose frames still runs below the call: going back up into a caller's file is
reading on, top-down. The *span walk* is the part under the span entry points (:data:`SPAN_ENTRIES`),
read from its own start; the *whole judge walk* is everything ``judge`` runs.

Run: ``python benchmarks/judge_walk.py [--label main] [--json out.json]``; it prints a markdown
table (``benchmarks/results/judge_walk.md`` holds the before/after figures). Deterministic: the
same code gives the same walk.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

import prime_rl  # noqa: E402

PACKAGE = Path(prime_rl.__file__).resolve().parent
KEY = b"judge-walk-assignment-key"


SPAN_ENTRIES = {
    ("validator/spans.py", "span_checks"),
    ("validator/spans.py", "plan_spans"),
    ("validator/spans.py", "span_model_checks"),
    ("validator/episode_spans.py", "episode_span_model_checks"),
}
"""Where the validator enters its span code (``verdicts.validate_batch`` calls them), before and after."""


INLINE = {"<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>"}
"""Frames that are part of the function they are written in (a comprehension), not functions of their own."""


@dataclass(frozen=True)
class Call:
    """One call into ``prime_rl``: the callee's file (relative to the package) and function, the
    files of the ``prime_rl`` frames still running below it, and whether a span entry point is one."""

    file: str
    function: str
    running: frozenset[str]
    in_span: bool


def trace(run: Callable[[], Any]) -> tuple[list[Call], Any]:
    """Every call into ``prime_rl`` while ``run()`` runs, in order; and what ``run()`` returned."""
    calls: list[Call] = []
    root = str(PACKAGE) + "/"

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(root) or frame.f_code.co_name in INLINE:
            return
        running: set[str] = set()
        in_span, here = False, frame  # type: bool, FrameType | None
        while here is not None:
            if here.f_code.co_filename.startswith(root):
                file = here.f_code.co_filename[len(root) :]
                in_span = in_span or (file, here.f_code.co_qualname) in SPAN_ENTRIES
                if here is not frame:
                    running.add(file)
            here = here.f_back
        calls.append(
            Call(frame.f_code.co_filename[len(root) :], frame.f_code.co_qualname, frozenset(running), in_span)
        )

    sys.setprofile(profile)
    try:
        result = run()
    finally:
        sys.setprofile(None)
    return calls, result


def reading(calls: Sequence[Call]) -> list[Call]:
    """Each function at its first call only: the order a reader following the batch meets them."""
    seen: set[tuple[str, str]] = set()
    out = []
    for call in calls:
        if (call.file, call.function) not in seen:
            seen.add((call.file, call.function))
            out.append(call)
    return out


def walk_figures(calls: Sequence[Call], *, running_is_left: bool = False) -> dict[str, Any]:
    """Stays (consecutive calls in one file collapsed), files, and returns: stays in a file the walk
    had left before. ``running_is_left`` False: a file with a frame still running below the call has
    not been left (going back up to a caller's file is reading on, top-down); True: any earlier file
    counts."""
    stays: list[str] = []
    returns: Counter[str] = Counter()
    left: set[str] = set()
    for call in calls:
        if stays and stays[-1] == call.file:
            continue
        if call.file in left and (running_is_left or call.file not in call.running):
            returns[call.file] += 1
        if stays:
            left.add(stays[-1])
        stays.append(call.file)
    return {
        "stays": len(stays),
        "files": len(set(stays)),
        "returns": sum(returns.values()),
        "returned_to": dict(returns.most_common()),
        "walk": stays,
    }


class _Store:
    """The validator's policy store over local weights files (``PolicyStore.ensure``'s contract)."""

    def __init__(self, files: dict[int, Path]) -> None:
        self.files = files

    def ensure(self, version: int) -> Path:
        return self.files[version]


class _Ledger:
    """``POST /validator/verdicts`` answered as the run's ledger answers an honest batch."""

    def post_verdicts(self, request: Any) -> Any:
        from prime_rl.api.protocol import VerdictResponse

        accepted = sum(v.accepted for v in request.verdicts)
        return VerdictResponse(
            batch_id=request.batch_id, accepted=accepted, rejected=len(request.verdicts) - accepted
        )


def _validator(checks: Any, run: Any, files: dict[int, Path], tokenizer: Any) -> Any:
    """A real ``Validator`` with its I/O in-process (module docstring); its checks are the run's."""
    from tiny_lm import make_tiny_lm

    from prime_rl.inference.backend import HFBackend
    from prime_rl.validator.process import Validator
    from prime_rl.validator.tool_budget import ToolBudget

    validator = Validator.__new__(Validator)
    validator.backend = HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=tokenizer)
    validator.store = _Store(files)  # type: ignore[assignment]
    validator.tasks = run
    validator.checks = checks
    validator.client = _Ledger()  # type: ignore[assignment]
    validator.validator_id = "judge-walk"
    validator.evidence = None
    validator.established = set()
    validator.tool_budget = ToolBudget(600.0, 600.0, 3600.0)
    validator.backoff, validator.refused, validator.bans_seen, validator.done = {}, set(), set(), 0
    return validator


def _pending(batch: Any, record: Any) -> Any:
    from prime_rl.api.protocol import PendingBatch

    return PendingBatch(
        batch_id=f"{batch.worker_id}-s{batch.step}-b{batch.batch_index}", worker_id=batch.worker_id,
        step=batch.step, batch_index=batch.batch_index, policy_version=batch.policy_version,
        received_at=time.time(), lease=record, samples=batch.samples,
    )  # fmt: skip


class _Offer:
    """A version source offering ``version`` at its first chance, announced for the lease (token
    boundary or model turn), answered with the nonce the orchestrator would give, and recorded."""

    def __init__(self, path: Path, version: int, lease: Any) -> None:
        self.path, self.version, self.lease, self.max_versions = path, version, lease, 2
        self.switches: list[Any] = []

    def _offer(self, current: int, chunk: int) -> Any:
        from prime_rl.api.assignment import switch_nonce
        from prime_rl.api.protocol import LeaseSwitch
        from prime_rl.inference.contract import VersionSwitch

        if current >= self.version or self.switches:
            return None
        self.switches.append(LeaseSwitch(policy_version=self.version, chunk=chunk, announced_at=time.time()))
        where = {
            "worker_id": self.lease.worker_id,
            "step": self.lease.step,
            "batch_index": self.lease.batch_index,
        }
        return VersionSwitch(
            self.version, self.path, switch_nonce(key=KEY, **where, policy_version=self.version, chunk=chunk)
        )

    def newer(self, current: int, boundary: int) -> Any:
        return self._offer(current, boundary // 32)

    def at_turn(self, current: int, turn: int) -> Any:
        return self._offer(current, turn)


def batches(tmp: Path) -> dict[str, tuple[Any, Any, Any, Any, Any]]:
    """``name -> (checks, run, pending batch, files, tokenizer)`` for the two walks."""
    import dataclasses

    from tiny_lm import make_tiny_lm, make_tiny_tokenizer
    from validator_setup import TinyRun

    from prime_rl.episodes import EpisodeEnv
    from prime_rl.inference.backend import HFBackend
    from prime_rl.tasks import TaskSet
    from prime_rl.weights.files import save_policy
    from prime_rl.worker.episodes import build_episode_batch
    from verifiers import Task
    from verifiers.envs import CalculatorEnv

    inflight = (
        "--orchestrator.max_versions_per_sample", "2", "--orchestrator.switch_deadline_s", "3600",
        "--orchestrator.max_decode_tokens_per_s", "1e9",
    )  # fmt: skip
    tokenizer = make_tiny_tokenizer()
    files = {v: save_policy(make_tiny_lm(seed=v).state_dict(), tmp / f"v{v}.safetensors") for v in range(2)}
    out = {}

    run = TinyRun(
        KEY, tokenizer, lambda t: f"{t}*{t + 7}=", 12, group_size=4, prompts_per_batch=2, max_new_tokens=96
    )
    lease, record = run.lease("w-walk", 0, 0)
    backend = HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=tokenizer, decode="dynamic")
    offer = _Offer(files[1], 1, lease)
    backend.version_source = offer
    batch = run.worker("honest").answer(lease, backend)
    assert any(s.spans for s in batch.samples), "the spanned lease did not switch"
    record = record.model_copy(update={"switches": offer.switches})
    out["spanned"] = (run.checks(*inflight), run, _pending(batch, record), files, tokenizer)

    run = TinyRun(KEY, tokenizer, lambda t: f"{t}+{t * 3}=", 12, 2, 2, 5)
    tasks = TaskSet(
        [Task(f"{t}+{t * 3}=", "verifiable_math", {"ground_truth": str(4 * t + 1)}) for t in range(12)]
    )
    env = EpisodeEnv(
        CalculatorEnv(max_turns=3, feedback=True),
        tasks,
        tokenizer,
        turn_template="\n<{role}>\n{content}\n</{role}>\n",
    )
    lease, record = run.lease("w-walk-episodes", 0, 0)
    backend = HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=tokenizer, decode="dynamic")
    offer = _Offer(files[1], 1, lease)
    backend.version_source = offer
    batch = build_episode_batch(lease, backend, env, encode=run.encode)[0]
    assert any(s.spans for s in batch.samples), "the episode lease did not switch"
    record = record.model_copy(update={"switches": offer.switches})
    checks = dataclasses.replace(run.checks(*inflight), episode_env=env)
    out["episodes"] = (checks, run, _pending(batch, record), files, tokenizer)
    return out


def measure() -> dict[str, Any]:
    from prime_rl import metrics

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="judge-walk-") as tmp:
        metrics._METRICS = metrics.MetricsWriter(Path(tmp) / "validator.jsonl", role="validator", name="walk")
        for name, (checks, run, pending, files, tokenizer) in batches(Path(tmp)).items():
            validator = _validator(checks, run, files, tokenizer)
            calls, done = trace(functools.partial(validator.judge, pending, newest_version=1))
            verdicts = [
                json.loads(line) for line in (Path(tmp) / "validator.jsonl").read_text().splitlines()
            ][-1]
            assert done and verdicts["rejected"] == 0, (
                f"{name}: the honest batch was not accepted: {verdicts}"
            )
            whole = reading(calls)
            span = reading([c for c in calls if c.in_span])
            out[name] = {
                "samples": len(pending.samples),
                "spanned_samples": sum(1 for s in pending.samples if s.spans),
                "span": walk_figures(span, running_is_left=True),
                "span_top_down": walk_figures(span),
                "span_after_judge": walk_figures([c for c in whole if c.in_span], running_is_left=True),
                "judge": walk_figures(whole, running_is_left=True),
                "judge_top_down": walk_figures(whole),
            }
    return out


WALKS = {
    "span": "span walk (any file left before)",
    "span_top_down": "span walk, callers' files not left",
    "span_after_judge": "span walk, functions read earlier in judge skipped (any file left before)",
    "judge": "whole judge walk (any file left before)",
    "judge_top_down": "whole judge walk, callers' files not left",
}


def table(label: str, figures: dict[str, Any]) -> str:
    """Markdown rows: per batch and walk, stays / files / returns."""
    return "\n".join(
        f"| {label} | {name} | {title} | {f[walk]['stays']} | {f[walk]['files']} | {f[walk]['returns']} |"
        for name, f in figures.items()
        for walk, title in WALKS.items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--json", type=Path, default=None, help="write the figures (with the walks) here")
    args = parser.parse_args()
    figures = measure()
    print("| code | batch | walk | stays | files | returns |")
    print("|---|---|---|---|---|---|")
    print(table(args.label, figures))
    for name, f in figures.items():
        for walk in ("span", "judge"):
            print(f"\n{name}, {WALKS[walk]}: {' > '.join(f[walk]['walk'])}")
            print(f"returned to: {f[walk]['returned_to']}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
