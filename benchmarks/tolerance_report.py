"""Per-sample tolerance curves: honest rejections by sample length, old rules against the per-precision rule.

Reads the samples ``detection_bench.py`` collected (``--data``, ``<job>.npz``): the validator's
statistics of every sample (sampling margins, claimed and recomputed log-probs, proof results).
The honest-noise profile is built from the calibration jobs only; every *other* honest sample is
judged (held out), and so is every calibration sample under a profile built without its own job
(leave one job out), so that long samples count too. Rules compared, per sample:

* ``fixed``: the worst-margin rule at the configured 0.25 and a mean log-prob gap <= 0.05;
* ``widened``: the validator before this change (with evidence): worst margin <= max(0.25, 3x the
  profile's largest honest margin), mean gap <= max(0.05, 3x the largest honest per-token gap);
* ``per-precision``: ``prime_rl.validator.tolerances.for_precision`` (fp32: exact; bf16: the
  binomial allowance beyond 0.25 and 3x the honest max as a hard limit), same log-prob rule.

Proof thresholds (toploc defaults) apply to all three. Prints, per length bucket: samples, worst
margin p50/max, mean |log-prob gap| p50/max, rejections under each rule; then the share of
deviating samples (attack jobs) each rule rejects per sample (the rest is the evidence's work).

Run: ``.venv/bin/python benchmarks/tolerance_report.py --data <detection data> --dtype bfloat16``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from detection_bench import load

import toploc
from prime_rl.config import load_config
from prime_rl.validator.checks import Checks
from prime_rl.validator.tolerances import for_precision

BUCKETS = ((0, 255), (256, 511), (512, 1023), (1024, 1 << 30))


def proofs_fail(sample: Any) -> bool:
    thresholds = toploc.Thresholds()
    rows = zip(sample.exp_mismatches, sample.mant_err_mean, sample.mant_err_median, sample.sign_mismatches, strict=True)
    return any(not thresholds.check(toploc.VerificationResult(int(e), float(m), float(d), int(s))).passed for e, m, d, s in rows)


def rules(profile: toploc.NoiseProfile, dtype: str) -> dict[str, Any]:
    """name -> predicate(sample) -> rejected."""
    checks = for_precision(Checks.from_config(load_config(None, []), vocab_size=2**31, eos_token_ids=frozenset(), assignment_key=b"", hidden_size=128), dtype, profile)
    assert checks.sampling_rule is not None
    rule = checks.sampling_rule
    widened_margin = max(0.25, profile.per_sample_limit("sampling_margin"))
    atol = max(0.05, profile.per_sample_limit("logprob_gap"))

    def gap(s: Any) -> float:
        return float(np.abs(s.claimed - s.recomputed).mean())

    return {
        "fixed": lambda s: proofs_fail(s) or s.margins.max() > 0.25 or gap(s) > 0.05,
        "widened": lambda s: proofs_fail(s) or s.margins.max() > widened_margin or gap(s) > atol,
        "per-precision": lambda s: proofs_fail(s) or rule.problem(torch.from_numpy(s.margins)) is not None
        or gap(s) > checks.validator.logprob_atol,
        "_headroom": lambda s: (int((s.margins > rule.tolerance).sum()), rule.allowed(s.margins.size)),
        "_describe": f"per-precision: tolerance {rule.tolerance:.3g}, honest rate {rule.rate:.2g}, hard limit "
        f"{rule.hard_limit:.3g}, allowed beyond the tolerance at 1,024 / 4,096 tokens: {rule.allowed(1024)} / "
        f"{rule.allowed(4096)}; widened worst margin {widened_margin:.3g}; log-prob atol {atol:.3g}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    prefix = "fp32" if args.dtype == "float32" else "bf16"
    jobs = {p.stem: load(p) for p in sorted(args.data.glob(f"{prefix}-*.npz")) if not p.name.endswith(".tmp.npz")}
    calibration = {name: samples for name, samples in jobs.items() if "-calibrate-" in name}
    honest = {name: samples for name, samples in jobs.items() if "-honest-" in name}
    attacks = {name: samples for name, samples in jobs.items() if "-attack-" in name}
    if not calibration:
        raise SystemExit(f"no {prefix} calibration jobs in {args.data}")

    def profile_without(excluded: str | None) -> toploc.NoiseProfile:
        observations = [s.observations() for name, samples in calibration.items() if name != excluded for s in samples]
        return toploc.NoiseProfile.calibrate(observations)

    full = profile_without(None)
    full_rules = rules(full, args.dtype)
    judged: list[tuple[Any, dict[str, bool]]] = []
    for samples in honest.values():
        judged += [(s, {k: bool(f(s)) for k, f in full_rules.items() if not k.startswith("_")}) for s in samples]
    if len(calibration) > 1:  # leave one calibration job out
        for name, samples in calibration.items():
            own = rules(profile_without(name), args.dtype)
            judged += [(s, {k: bool(f(s)) for k, f in own.items() if not k.startswith("_")}) for s in samples]
    print(f"# {args.dtype}: per-sample rules on honest samples ({len(judged)} samples, "
          f"{sum(s.margins.size for s, _ in judged)} tokens; calibration {sum(len(v) for v in calibration.values())} samples)\n")  # fmt: skip
    print(full_rules["_describe"] + "\n")
    print("| tokens | samples | worst margin p50 / max | mean log-prob gap p50 / max | rejected: fixed | widened | per-precision "
          "| most tokens beyond the tolerance (allowed) |")
    print("|---|---|---|---|---|---|---|---|")
    result: dict[str, Any] = {"dtype": args.dtype, "rules": full_rules["_describe"], "buckets": [], "attacks": {}}
    for low, high in BUCKETS:
        rows = [(s, r) for s, r in judged if low <= s.margins.size <= high]
        if not rows:
            continue
        worst = np.array([s.margins.max() for s, _ in rows])
        gaps = np.array([np.abs(s.claimed - s.recomputed).mean() for s, _ in rows])
        counts = {k: sum(r[k] for _, r in rows) for k in ("fixed", "widened", "per-precision")}
        label = f"{low}-{high}" if high < 1 << 30 else f">= {low}"
        over, allowed = max((full_rules["_headroom"](s) for s, _ in rows), key=lambda pair: pair[0] / max(pair[1], 1))
        print(f"| {label} | {len(rows)} | {np.median(worst):.3g} / {worst.max():.3g} | {np.median(gaps):.3g} / {gaps.max():.3g} | "
              f"{counts['fixed']} | {counts['widened']} | {counts['per-precision']} | {over} ({allowed}) |")  # fmt: skip
        result["buckets"].append({"tokens": label, "samples": len(rows), "worst_margin_p50": float(np.median(worst)),
                                  "worst_margin_max": float(worst.max()), "gap_p50": float(np.median(gaps)),
                                  "gap_max": float(gaps.max()), "rejected": counts})  # fmt: skip
    by_attack: dict[str, list[Any]] = defaultdict(list)
    for name, samples in attacks.items():
        by_attack[name.split("-attack-")[1].rsplit("-", 1)[0]] += samples
    if by_attack:
        print("\n| deviation | samples | tokens | rejected per sample: fixed | widened | per-precision |")
        print("|---|---|---|---|---|---|")
    for attack, samples in by_attack.items():
        shares = {k: float(np.mean([bool(full_rules[k](s)) for s in samples])) for k in ("fixed", "widened", "per-precision")}
        print(f"| {attack} | {len(samples)} | {sum(s.margins.size for s in samples)} | {shares['fixed']:.2f} | "
              f"{shares['widened']:.2f} | {shares['per-precision']:.2f} |")  # fmt: skip
        result["attacks"][attack] = shares
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
