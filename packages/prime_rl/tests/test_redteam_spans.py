"""Red team of in-flight version spans (issue 38), with real processes: ``benchmarks/redteam_spans.py``'s
session (one ``prime-rl run``: an honest in-flight worker and one hostile identity per span forgery
of ``redteam/attacks.py``, each decoding its lease for real before it forges).

Asserted on what the run left on disk (trainer lr 1e-2: adjacent versions far enough apart for
toploc to tell them apart): every span forgery the validator judges is rejected with its own
reasons (``hostile.ATTACKS``; its first listed reason among them wherever a sample claimed the
forged span, or, for a mid-chunk switch, the switch chunk the first to fail), the two the orchestrator
refuses are refused at submission with ``422 bad_spans`` and the rule's own message, no attacker
sample is in any trainer claim, and the honest worker's samples (those that switched version
mid-completion among them) are never rejected. In-process twins of each attack:
``test_inflight_redteam.py``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from redteam_spans import SPAN_ATTACKS, session  # noqa: E402

from prime_rl.redteam.attacks import ATTACKS  # noqa: E402

pytestmark = pytest.mark.slow

REFUSAL_MESSAGES = {"future_span_version": "is not committed", "too_many_spans": "versions per sample"}
# Attacks whose first reason needs a chunk the forgery left intact. mid_chunk_switch reads as
# span_boundary_mismatch only where a chunk after the switch chunk still matches the claimed version:
# a sample that ends before token 64 has none, and the 16 positions the old weights wrote into the KV
# cache (32-47) can push the next chunk past tolerance too (one CI run: 7 samples, all
# span_version_forged). Either reason is right; which one is the model's, not the validator's, choice.
FIRST_REASON_CONTINGENT = {"mid_chunk_switch"}


@pytest.mark.timeout(720)
def test_each_span_forgery_is_rejected_with_its_own_reason_and_honest_spans_pass(tmp_path: Path) -> None:
    from tiny_lm import save_tiny_lm

    # lr 1e-2: one step moves the weights far enough for toploc to tell v from v + 1; at the default
    # 1e-5 the forged spans pass every per-sample check and only the evidence bans (benchmarks/results/redteam_spans.md)
    result = session(tmp_path, save_tiny_lm(tmp_path / "model"), lr=1e-2, timeout_s=540)
    report = json.dumps(result, indent=1, default=str)
    print(report)
    if os.environ.get("REDTEAM_REPORT"):
        Path(os.environ["REDTEAM_REPORT"]).write_text(report)
    assert result["returncode"] in (0, 130, -2), result["output_tail"]
    assert result["finished"], report  # every attack judged or refused, two commits

    assert set(REFUSAL_MESSAGES) == {name for name in SPAN_ATTACKS if ATTACKS[name].refused}
    for name, attack in result["attacks"].items():
        assert attack["accepted"] == 0 and attack["in_trainer_claims"] == 0, (name, attack)
        if ATTACKS[name].refused:
            # refused at submission: nothing stored, the rule's own message
            assert attack["batches_stored"] == 0, (name, attack)
            refusal = attack["refused"][0]
            assert (refusal["status"], refusal["error"]) == (422, "bad_spans"), (name, attack)
            assert REFUSAL_MESSAGES[name] in refusal["message"], (name, attack)
        else:
            own = set(attack["own_reasons"])
            expected = set(ATTACKS[name].expected)
            assert own and own <= expected, (name, attack)
            if name in FIRST_REASON_CONTINGENT:
                # found where the forgery is: the lease's own chunk passes, the switch chunk is the first to fail
                assert all("first chunk 1 in span 1" in d for d in attack["details"] if d.startswith("span_")), (name, attack)
            else:
                # the attack's first reason wherever its shape was played (a lease whose samples all end
                # before the shifted boundary, 64, claims no span: toploc_mismatch only)
                assert ATTACKS[name].expected[0] in own or attack["samples_claiming_spans"] == 0, (name, attack)

    honest = result["honest"]
    assert honest["accepted"] > 0 and honest["rejected"] == {}, honest
    assert honest["spanned_accepted"] > 0, honest  # samples that switched version mid-completion, accepted
    assert honest["in_trainer_claims"] > 0, honest
