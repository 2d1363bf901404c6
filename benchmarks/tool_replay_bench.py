"""Benchmark: honest tool episodes that no replay can reproduce exactly, and forged ones, through the
validator's tool replay (``prime_rl.validator.episodes.replay_episode``) and its ban accounting.

Each episode is scripted (a model turn with one Python tool call, the tool's reply, a final answer)
and played honestly by a worker: ``EpisodeEnv.step`` runs the call in the real sandbox
(``verifiers.envs.PythonToolEnv``), and its reply tokens go into the sample. The validator then
replays the episode with the same environment while ``--load`` replays run at once (a loaded
validator: sandbox starts and sleeps compete for the 2 cores), the worker having played with
``--worker-threads`` at once. The programs are those #35 names:

* ``clock``: prints ``time.time()``; ``address``: prints ``id(object())``; ``address_error``: raises
  an exception whose message holds an object's address (differs in every process);
* ``near_limit``: sleeps between 0.8 and 1.05 times the tool's time limit (some finish on one side
  only, some time out on both);
* ``raise``: raises a plain exception (deterministic traceback);
* ``slow_worker``: prints, then sleeps past the *worker's* limit only (the worker's machine was the
  slower one: its reply shows ``[timeout]`` where the validator's run finished; played with a
  limit of ``--limit / 2``).

Every 8 episodes (one program kind each) form one lease of one of 4 honest worker identities; its
verdict reasons go through
``verdicts.ban_counts`` into the validator's own ``FailureTracker`` (``[validator]`` defaults:
ban at a 50% rejected share after 16 samples), and through the orchestrator's rules: each lease is
a real lease of a real ``Ledger`` (default ``[orchestrator]`` settings), answered and judged with
the replay's verdicts (one failed sample rejects the lease, the rest ``lease_rejected``), so its
abandonment ban (``lease_rules``) sees them as it would in a run. Both bans are reported, and the
orchestrator's also under the rule before issue 46 (every rejected lease abandoned), on the same
verdicts; the honest share of machine-rejected leases is the figure
``orchestrator.machine_rejected_honest_share`` must stay above. Forged episodes (``--forged``): the honest reply of
a deterministic program (``print(<n> * 7)``) with one character changed, played the same way.

Pass: no honest episode is ``tool_output_mismatch`` (cheating), no honest identity is banned, and
every forged episode is ``tool_output_mismatch``.

Run: ``.venv/bin/python benchmarks/tool_replay_bench.py [--episodes 1000] [--forged 200] [--limit 0.3]
[--load 8] [--worker-threads 4]``; writes ``benchmarks/results/tool_replay_bench.{md,json}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from history_ledger import judgeable_off  # benchmarks/

from prime_rl.api.protocol import RolloutBatch, RolloutSample, Segment, Verdict, VerdictRequest
from prime_rl.config import load_config
from prime_rl.episodes import EpisodeEnv
from prime_rl.orchestrator.lease_rules import machine_caused
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.tasks import TaskSet
from prime_rl.validator.episodes import replay_episode
from prime_rl.validator.evidence import FailureTracker
from prime_rl.validator.verdicts import ban_counts
from verifiers import Task
from verifiers.envs import PythonToolEnv

RESULTS = Path(__file__).resolve().parent / "results"
TEMPLATE = "\n<{role}>\n{content}\n</{role}>\n"
LEASE = 8
KINDS = ("clock", "address", "address_error", "near_limit", "raise", "slow_worker")


class CodepointTokenizer:
    """One token per Unicode code point: exact for any text (all ``EpisodeEnv`` needs)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def decode(tokens: Sequence[int]) -> str:
    return "".join(chr(t) for t in tokens)


def program(kind: str, index: int, limit: float) -> str:
    if kind == "clock":
        return "import time\nprint(time.time())"
    if kind == "address":
        return "print(id(object()))"
    if kind == "address_error":
        return "raise RuntimeError(object())"
    if kind == "near_limit":
        return f"import time\ntime.sleep({limit * (0.8 + 0.25 * (index % 11) / 10):.4f})\nprint('done')"
    if kind == "raise":
        return f"raise ValueError('bad input {index}')"
    if kind == "slow_worker":  # the worker plays with limit / 2: it times out, the validator does not
        return f"import time\nprint('started', flush=True)\ntime.sleep({limit * 0.6:.4f})\nprint('done')"
    if kind == "forged":
        return f"print({index} * 7)"
    raise ValueError(kind)


def environment(limit: float, tokenizer: CodepointTokenizer) -> EpisodeEnv:
    tasks = TaskSet([Task("7 * 6?", "verifiable_math", {"ground_truth": "42"})])
    return EpisodeEnv(PythonToolEnv(max_turns=2, timeout_s=limit), tasks, tokenizer, turn_template=TEMPLATE)


def play(env: EpisodeEnv, code: str, *, forge: bool = False) -> RolloutSample:
    """A worker's honest episode: the tool call, the environment's reply as run here, a final answer
    (``forge``: the reply's first digit changed, as a cheater would make it up)."""
    call = json.dumps({"name": "python", "arguments": {"code": code}})
    turn0 = f"<tool_call>{call}</tool_call>"
    step = env.step(0, env.start(0), turn0)
    reply = list(step.tokens)
    if forge:
        at = next(i for i, t in enumerate(reply) if chr(t).isdigit())
        reply[at] = ord(str((int(chr(reply[at])) + 1) % 10))
    turn1 = "\\boxed{42}"
    tokens = [*map(ord, turn0), *reply, *map(ord, turn1)]
    segments = [
        Segment(kind="model", length=len(turn0), turn=0),
        Segment(kind="env", length=len(reply), turn=0),
        Segment(kind="model", length=len(turn1), turn=1),
    ]
    return RolloutSample(
        task_id=0, group_index=0, prompt_tokens=[1], completion_tokens=tokens, sampling_seed=1,
        temperature=1.0, reward=1.0, advantage=0.0, proofs=b"", inference_logprobs=[0.0] * len(tokens),
        segments=segments,
    )  # fmt: skip


def orchestrator_bans(leases: list[list[Verdict]], identities: int, run_dir: Path) -> dict[str, Any]:
    """Play ``leases`` (verdicts per lease, in order) as the leases of ``identities`` honest identities
    through a real ``Ledger`` (default orchestrator settings): lease, submit a batch answering it,
    post the verdicts. Returns the bans under today's rules and under the rule before issue 46."""
    import hashlib

    config = load_config(
        None,
        ["--run_dir", str(run_dir), "--orchestrator.prompts_per_batch", "1", "--sampling.group_size", str(LEASE),
         *judgeable_off()],
    )  # fmt: skip
    ledger = Ledger(config, TaskSet([Task(f"q{i}", "verifiable_math", {"ground_truth": "1"}) for i in range(64)]),
                    RolloutStore(config.orchestrator_data_dir))  # fmt: skip
    workers = [ledger.workers[ledger.register(f"honest-{i}").worker_id] for i in range(identities)]
    machine = 0
    for index, verdicts in enumerate(leases):
        worker = workers[index % identities]
        if worker.banned:
            continue
        lease = ledger.lease(worker, None, None, f"10.0.0.{index % identities}")
        samples = [
            RolloutSample(task_id=task.task_id, group_index=g, prompt_tokens=[1], completion_tokens=[2],
                          sampling_seed=seed, temperature=1.0, reward=0.0, advantage=0.0, proofs="cA==",
                          inference_logprobs=[0.0])
            for task in lease.tasks
            for g, seed in enumerate(task.sampling_seeds)
        ]
        batch = RolloutBatch(worker_id=worker.worker_id, step=0, batch_index=lease.batch_index, policy_version=0,
                             samples=samples)  # fmt: skip
        answer = ledger.submit(worker, batch, hashlib.sha256(batch.model_dump_json().encode()).hexdigest())
        full = [v.model_copy(update={"sample_index": i}) for i, v in enumerate(verdicts)][: len(samples)]
        ledger.record_verdicts(VerdictRequest(batch_id=answer.batch_id, verdicts=full))
        machine += machine_caused(full)
    orch = config.orchestrator
    before = sum(
        ledger.rules.abandoned(w.worker_id) >= orch.ban_abandoned_leases
        and ledger.rules.abandoned(w.worker_id) >= orch.ban_abandoned_share * ledger.leases.issued(w.worker_id)
        for w in workers
    )
    return {
        "orchestrator_bans": sum(w.banned for w in workers),
        "orchestrator_ban_reasons": [w.ban_reason for w in workers if w.banned],
        "orchestrator_bans_before_issue_46": before,
        "machine_rejected_leases": machine,
        "leases": len(leases),
        "honest_machine_rejected_share": round(machine / len(leases), 3) if leases else 0.0,
        "machine_rejected_honest_share_setting": orch.machine_rejected_honest_share,
        "per_identity": {
            w.name: {"issued": ledger.leases.issued(w.worker_id), "machine_rejected": ledger.leases.machine_rejected(w.worker_id),
                     "chargeable": ledger.rules.chargeable(w.worker_id), "allowance": ledger.lease_allowance(w.worker_id)}
            for w in workers
        },
    }


def lease_verdicts(replays: Sequence[Any]) -> list[Verdict]:
    """The validator's verdicts of one lease: each failed sample its reason; once one fails, the
    others are ``lease_rejected`` (a lease is accepted whole or not at all)."""
    failed = any(r.code for r in replays)
    return [
        Verdict(sample_index=i, accepted=not failed, reason=r.code or ("lease_rejected" if failed else "ok"),
                detail="", reward=0.0, advantage=0.0, logprobs=[] if failed else [-1.0])
        for i, r in enumerate(replays)
    ]


def run(episodes: int, forged: int, limit: float, load: int, worker_threads: int) -> dict[str, Any]:
    tokenizer = CodepointTokenizer()
    worker_env, slow_worker_env = environment(limit, tokenizer), environment(limit / 2, tokenizer)
    validator_env = environment(limit, tokenizer)
    # one program kind per lease of 8, so some leases are all deterministic and count towards the ban
    # accounting in full, others hold an unverifiable episode and count nothing
    jobs = [(KINDS[(i // LEASE) % len(KINDS)], i) for i in range(episodes)]

    def honest(job: tuple[str, int]) -> RolloutSample:
        kind, index = job
        return play(slow_worker_env if kind == "slow_worker" else worker_env, program(kind, index, limit))

    started = time.monotonic()
    with ThreadPoolExecutor(worker_threads) as pool:
        samples = list(pool.map(honest, jobs))
        fakes = list(pool.map(lambda i: play(worker_env, program("forged", i, limit), forge=True), range(forged)))
    played = time.monotonic() - started
    started = time.monotonic()
    with ThreadPoolExecutor(load) as pool:
        replays = list(pool.map(lambda s: replay_episode(s, validator_env, decode), samples + fakes))
    replayed = time.monotonic() - started
    honest_replays, forged_replays = replays[:episodes], replays[episodes:]

    by_kind: dict[str, Counter[str]] = {kind: Counter() for kind in KINDS}
    for (kind, _), replay in zip(jobs, honest_replays, strict=True):
        by_kind[kind][replay.code or "ok"] += 1
    failures = FailureTracker(ban_failure_rate=0.5, ban_min_samples=16)
    bans = 0
    for lease in range(0, episodes, LEASE):
        verdicts = [
            Verdict(sample_index=i, accepted=not r.code, reason=r.code or "ok", detail="", reward=0.0, advantage=0.0)
            for i, r in enumerate(honest_replays[lease : lease + LEASE])
        ]
        accepted, rejected = ban_counts(verdicts)
        bans += failures.record(f"honest-{lease // LEASE % 4}", accepted=accepted, rejected=rejected) is not None
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tool_replay_orch_") as run_dir:
        orchestrator = orchestrator_bans(
            [lease_verdicts(honest_replays[lease : lease + LEASE]) for lease in range(0, episodes - LEASE + 1, LEASE)],
            4, Path(run_dir),
        )  # fmt: skip
    honest_reasons = Counter(r.code or "ok" for r in honest_replays)
    forged_reasons = Counter(r.code or "ok" for r in forged_replays)
    return {
        "episodes": episodes,
        "forged": forged,
        "tool_limit_s": limit,
        "validator_concurrent_replays": load,
        "worker_threads": worker_threads,
        "honest_reasons": dict(honest_reasons),
        "honest_by_kind": {kind: dict(counts) for kind, counts in by_kind.items()},
        "honest_rejected_as_cheating": honest_reasons["tool_output_mismatch"],
        "honest_identities": 4,
        "honest_bans": bans,
        "ban_counts_by_identity": {worker: {"accepted": a, "rejected": r} for worker, (a, r) in failures.counts.items()},
        "orchestrator": orchestrator,
        "forged_reasons": dict(forged_reasons),
        "forged_caught_share": forged_reasons["tool_output_mismatch"] / forged if forged else None,
        "validator_tool_seconds": round(sum(r.tool_seconds for r in replays), 2),
        "play_seconds": round(played, 2),
        "replay_seconds": round(replayed, 2),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs (shared)",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def report(result: dict[str, Any]) -> str:
    o = result["orchestrator"]
    lines = [
        "# Tool replay: honest episodes no replay reproduces exactly, and forged ones",
        "",
        f"`benchmarks/tool_replay_bench.py`, {result['date']}, {result['machine']}. Tool limit "
        f"{result['tool_limit_s']} s; the validator replays {result['validator_concurrent_replays']} episodes at once.",
        "",
        "| program | " + " | ".join(sorted({r for c in result["honest_by_kind"].values() for r in c})) + " |",
    ]
    reasons = sorted({r for c in result["honest_by_kind"].values() for r in c})
    lines.append("|---" * (len(reasons) + 1) + "|")
    for kind, counts in result["honest_by_kind"].items():
        lines.append(f"| {kind} | " + " | ".join(str(counts.get(r, 0)) for r in reasons) + " |")
    lines += [
        "",
        f"- honest episodes: {result['episodes']}; rejected as cheating (`tool_output_mismatch`): "
        f"{result['honest_rejected_as_cheating']}; bans among {result['honest_identities']} honest identities: "
        f"{result['honest_bans']} (samples counted towards a ban, per identity: "
        + ", ".join(f"{c['accepted']} accepted / {c['rejected']} rejected" for c in result["ban_counts_by_identity"].values())
        + ")",
        f"- orchestrator's rules (a real `Ledger`, default settings; issue 46): of {o['leases']} honest leases, "
        f"{o['machine_rejected_leases']} were rejected for reasons the machine may explain only "
        f"(share {o['honest_machine_rejected_share']}; setting `machine_rejected_honest_share` = "
        f"{o['machine_rejected_honest_share_setting']}); bans among {result['honest_identities']} honest identities: "
        f"**{o['orchestrator_bans']}** (under the rule before issue 46, every rejected lease abandoned: "
        f"{o['orchestrator_bans_before_issue_46']}); per identity: "
        + ", ".join(f"{n}: {c['machine_rejected']} of {c['issued']} machine-rejected, {c['chargeable']} chargeable, allowance {c['allowance']}" for n, c in o["per_identity"].items()),
        f"- forged episodes: {result['forged']}; `tool_output_mismatch`: {result['forged_reasons'].get('tool_output_mismatch', 0)} "
        f"({result['forged_caught_share']:.0%})",
        f"- validator tool time: {result['validator_tool_seconds']} s over all replays "
        f"({result['replay_seconds']} s wall); worker play {result['play_seconds']} s wall",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--forged", type=int, default=200)
    parser.add_argument("--limit", type=float, default=0.3, help="the Python tool's time limit, seconds")
    parser.add_argument("--load", type=int, default=8, help="episodes the validator replays at once")
    parser.add_argument("--worker-threads", type=int, default=4)
    parser.add_argument("--out", default=str(RESULTS / "tool_replay_bench"))
    args = parser.parse_args()
    result = run(args.episodes, args.forged, args.limit, args.load, args.worker_threads)
    Path(args.out + ".json").write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out + ".md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    main()
