"""Red team, round three (issue 34), with real processes: one ``prime-rl run`` of
``configs/tiny-cpu-tools.toml`` (the Python tool, 3 model turns, 5 s tool limit) on the tiny random
model, attacked by this process (``benchmarks/redteam_round3.py`` says how; its benchmark runs the
same session longer and writes ``benchmarks/results/redteam_round3.md``).

* Tool-replay denial of service: fresh identities, each from its own loopback /24, send
  fabricated episodes whose two tool calls loop until the 5 s limit, with random well-formed
  proofs. The validator runs no tool for them (its replays come after every model turn's proofs
  pass: 0 tool seconds per lease, where issue 34 measured 82 s a lease before), judges them in
  under 2 s (median), trains none, and bans every identity at its first lease (before fe9527b a
  fresh identity's 8 rejected samples stayed under ``ban_min_samples`` 16 and none was banned:
  ``benchmarks/results/redteam_round3.md``);
  the honest worker's accepted samples per minute during the attack stay within half the rate
  without it (a bound with margin for 20 s windows; the benchmark measures the 20% goal).
* Free veto: a trusted identity answers honestly but lowers one sample's claimed reward on the
  leases it dislikes. Every lease it took is trained, task for task (the vetoed ones by another
  identity, after re-issue), so the trained task ids do not depend on which leases it vetoed; each
  veto costs it an open lease of allowance, like walking away.
* Version shopping: a lease fixes version v; a batch generated with v + 1 or v - 1 (both committed
  and inside the async window) is ``wrong_policy_version``, never trained, and the identity banned.

Each part fails on a broken copy: with the validator's ``wrong_policy_version`` check off, the
shopper's batch is accepted (``ok``); with rejected leases not marked rejected in the ledger
(``Ledger.record_verdicts``), the vetoed lease's tasks are never re-issued and the wait for them to
train times out; on the validator before fe9527b no fabricating identity is banned.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from redteam_round3 import session  # noqa: E402

pytestmark = pytest.mark.slow


def test_tool_replay_dos_free_veto_and_version_shopping_buy_nothing(tmp_path: Path) -> None:
    from tiny_lm import save_tiny_lm

    result = session(  # max_new_tokens: the loop's tool call is 73 tokens of the tiny model's characters
        tmp_path,
        save_tiny_lm(tmp_path / "model"),
        window_s=20,
        attacks=[(1, 1.0)],
        vetoes=1,
        max_new_tokens=80,
    )
    report = json.dumps(result, indent=1, default=str)
    print(report)
    if os.environ.get("REDTEAM_REPORT"):
        Path(os.environ["REDTEAM_REPORT"]).write_text(report)
    assert result["returncode"] in (0, 130, -2), result["returncode"]

    # 1. Tool replay: no tool ran, the validator's time per fabricated lease is under 2 s, nothing
    # trained, every identity banned, the honest rate held.
    dos: dict[str, Any] = result["tool_replay"]
    assert dos["leases_answered"] >= 4, dos
    assert dos["tool_seconds_per_lease_max"] == 0, dos
    assert dos["validator_seconds_per_lease"]["median"] < 2.0, dos
    assert dos["accepted"] == 0 and dos["in_trainer_claims"] == 0, dos
    assert set(dos["reasons"]) - {"lease_rejected", "group_rejected"} <= {
        "toploc_mismatch",
        "malformed_proof",
    }, dos
    assert dos["banned_identities"] == dos["identities"], dos
    honest = result["honest"]
    # 20 s windows hold 3-4 honest leases of 8 samples each, on 2 cores shared with the attacker and the
    # other agents: a bound with margin here; the benchmark measures the 20% goal over longer windows.
    during = honest["during_attack"][0]["accepted_per_min"]
    assert during >= 0.5 * honest["accepted_per_min_without_attack"] > 0, honest
    assert honest["rejected"] == 0 and honest["banned"] == 0, honest

    # 2. Free veto: every lease of the vetoer trained with exactly its tasks (group_size samples each),
    # the vetoed ones by another identity after re-issue; each veto cost a lease of allowance.
    veto = result["veto"]
    vetoed = [lease for lease in veto["leases"] if lease["vetoed"]]
    assert len(vetoed) >= 1, veto
    for lease in veto["leases"]:
        assert Counter(lease["trained_task_ids"]) == Counter(lease["expected_task_ids"]), lease
        if lease["vetoed"]:
            assert lease["trained_by"] not in (None, "vetoer"), lease
    rejected = sum(1 for lease in vetoed if "accepted" not in lease["reasons"])
    assert veto["abandoned"] == rejected, veto
    assert veto["allowance"] <= max(1, veto["max_open_leases"] - rejected), veto

    # 3. Version shopping: rejected with its own reason, never trained.
    for shop in result["version_shopping"]:
        assert "wrong_policy_version" in shop["reasons"] and "accepted" not in shop["reasons"], shop
        assert not shop["in_trainer_claims"] and shop["banned"], shop
