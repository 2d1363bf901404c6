"""What reaches training: steered tokens per trained token, by steering rate and number of identities.

Replays samples ``detection_bench.py`` collected (``--data``) through what the validator and the
orchestrator do to every accepted sample, per identity, in submission order:

1. the shipped per-sample rule of the precision (``prime_rl.validator.tolerances.for_precision``)
   and toploc's proof thresholds: a rejected sample trains nothing;
2. the identity's evidence (``toploc.WorkerEvidence``, whole history and CUSUM, default policy,
   profile from the calibration jobs): the sample that bans it and everything held is dropped;
3. the release rule (``orchestrator/release.py``, defaults): an accepted sample is trained on once
   its identity has ``2,048`` more accepted tokens and its evidence is below 0.25 of the threshold.

An attacker spreads ``--samples`` samples over I fresh identities (one after another, as Sybil
churn would); a share r of its samples are steered (drawn from the ``steer10`` attack jobs:
runner-up tokens taken on ~10% of positions inside the tolerance), the rest honest (held-out honest
jobs). Reported per (r, I): steered tokens that reach training per 10^6 trained tokens, identities
banned; and, for honest identities through the same replay, bans and the share of tokens trained
(what release costs them: the last 2,048 tokens of every identity are never released).

Pitfall: the orchestrator's probation and per-identity bookkeeping (issue #25 item 3, another
branch) are not modelled; each identity here is judged on its own, which is the attacker's best
case with free identities. And release is modelled on the identity's *current* evidence, where the
orchestrator's ``ReleaseBook`` takes the largest evidence reported with the batch or after it, so
a steered batch that lifted the evidence is released here once honest tokens dilute it, and never
there: these rows overstate what reaches training. ``steering_bf16_tiny.py`` replays the real
``ReleaseBook`` (and adds the attacker that spends exactly ``allowed(n)``, issue #34).

Run: ``.venv/bin/python benchmarks/steering_budget.py --data <detection data> --dtype bfloat16``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from detection_bench import load
from tolerance_report import proofs_fail

import toploc
from prime_rl.config import load_config
from prime_rl.validator.checks import Checks
from prime_rl.validator.tolerances import for_precision

AFTER_TOKENS = 2048
MAX_EVIDENCE = 0.25
RATES = (1.0, 0.3, 0.1, 0.03)
IDENTITIES = (1, 4, 16)


def replay(tests: toploc.EvidenceTests, stream: Sequence[tuple[Any, bool]], rejected: Callable[[Any], bool]) -> dict[str, int]:
    """One identity: (sample, steered) in order -> trained tokens, steered trained tokens, banned."""
    evidence = toploc.WorkerEvidence(tests)
    held: list[tuple[int, int, bool]] = []  # (accepted tokens that release it, tokens, steered)
    accepted = trained = steered_trained = 0
    for sample, steered in stream:
        state = evidence.update(sample.observations())
        if state.banned:
            return {"trained": trained, "steered_trained": steered_trained, "banned": 1}
        if not rejected(sample):
            accepted += sample.margins.size
            held.append((accepted + AFTER_TOKENS, sample.margins.size, steered))
        ready = [h for h in held if accepted >= h[0]]
        if ready and state.fraction < MAX_EVIDENCE:
            trained += sum(h[1] for h in ready)
            steered_trained += sum(h[1] for h in ready if h[2])
            held = [h for h in held if accepted < h[0]]
    return {"trained": trained, "steered_trained": steered_trained, "banned": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--samples", type=int, default=320, help="samples per attacker (and per honest worker)")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    prefix = "fp32" if args.dtype == "float32" else "bf16"
    jobs = {p.stem: load(p) for p in sorted(args.data.glob(f"{prefix}-*.npz")) if not p.name.endswith(".tmp.npz")}
    calibration = [s for name, samples in jobs.items() if "-calibrate-" in name for s in samples]
    steered_pool = [s for name, samples in jobs.items() if "-attack-steer10-" in name for s in samples]
    honest_pool = [s for name, samples in jobs.items() if "-honest-" in name for s in samples]
    if not honest_pool:  # no held-out honest job yet: the calibration samples stand in (in-sample)
        honest_pool = calibration
    if not (calibration and steered_pool):
        raise SystemExit(f"need {prefix} calibration and steer10 attack jobs in {args.data}")
    profile = toploc.NoiseProfile.calibrate([s.observations() for s in calibration])
    tests = toploc.EvidenceTests.from_profile(profile)
    checks = for_precision(Checks.from_config(load_config(None, []), vocab_size=2**31, eos_token_ids=frozenset(), assignment_key=b"", hidden_size=128), args.dtype, profile)
    rule = checks.sampling_rule
    assert rule is not None

    def rejected(sample: Any) -> bool:
        gap = float(np.abs(sample.claimed - sample.recomputed).mean())
        return proofs_fail(sample) or rule.problem(torch.from_numpy(sample.margins)) is not None or gap > checks.validator.logprob_atol

    rng = np.random.default_rng(0)
    result: dict[str, Any] = {"dtype": args.dtype, "samples": args.samples, "repeats": args.repeats, "rows": []}
    print(f"# {args.dtype}: steered tokens reaching training ({args.samples} samples per attacker, {args.repeats} "
          f"attackers per cell; pools: {len(steered_pool)} steered, {len(honest_pool)} honest samples)\n")  # fmt: skip
    print("| steered share of samples | identities | steered tokens per 10^6 trained | trained tokens | identities banned |")
    print("|---|---|---|---|---|")
    for rate in RATES:
        for identities in IDENTITIES:
            trained = steered = banned = 0
            for _ in range(args.repeats):
                flags = rng.random(args.samples) < rate
                samples = [(steered_pool[rng.integers(len(steered_pool))], True) if f else
                           (honest_pool[rng.integers(len(honest_pool))], False) for f in flags]  # fmt: skip
                for chunk in np.array_split(np.arange(args.samples), identities):
                    row = replay(tests, [samples[i] for i in chunk], rejected)
                    trained += row["trained"]
                    steered += row["steered_trained"]
                    banned += row["banned"]
            per_million = 1e6 * steered / trained if trained else 0.0
            print(f"| {rate:g} | {identities} | {per_million:.0f} | {trained} | {banned}/{identities * args.repeats} |")
            result["rows"].append({"rate": rate, "identities": identities, "steered_per_million": per_million,
                                   "trained": trained, "banned": banned})  # fmt: skip
    honest_banned = honest_trained = honest_total = 0
    for identities in IDENTITIES:
        for _ in range(args.repeats):
            samples = [(honest_pool[rng.integers(len(honest_pool))], False) for _ in range(args.samples)]
            for chunk in np.array_split(np.arange(args.samples), identities):
                row = replay(tests, [samples[i] for i in chunk], rejected)
                honest_banned += row["banned"]
                honest_trained += row["trained"]
                honest_total += sum(samples[i][0].margins.size for i in chunk)
    print(f"\nhonest identities through the same replay: {honest_banned} banned of "
          f"{sum(IDENTITIES) * args.repeats}; {honest_trained / honest_total:.1%} of their {honest_total} tokens trained")  # fmt: skip
    result["honest"] = {"banned": honest_banned, "identities": sum(IDENTITIES) * args.repeats,
                        "trained_share": honest_trained / honest_total, "tokens": honest_total}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
