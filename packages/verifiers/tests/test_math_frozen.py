"""The frozen math evaluation set stays frozen (issue #36, "Math, honestly").

math_equiv_frozen.jsonl (v1) was written from the mathematics alone and committed before any
checker was run on it; benchmarks/math_equiv_bench.py measures ours and math-verify on it. A
measurement is only worth something if nobody edits the set to make a checker pass, so this test
pins the file's sha256. Nothing here requires any checker to agree with the labels: that is
measured, not gated (the 338-pair regression suite, test_math_forms.py, is the gate).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

DATA = Path(__file__).parent / "data"
FROZEN = DATA / "math_equiv_frozen.jsonl"
FROZEN_SHA256 = "481a7dc51676b22db56e4761d69ae8f0bde6eef318e62649b56a4ff2c6fc4d04"
FIELDS = {"gold", "pred", "expected", "category", "convention", "why"}


def test_the_frozen_set_is_unchanged():
    digest = hashlib.sha256(FROZEN.read_bytes()).hexdigest()
    assert digest == FROZEN_SHA256, (
        f"{FROZEN.name} is a frozen evaluation set and must not change (sha256 {digest}, pinned "
        f"{FROZEN_SHA256}). Do not edit its pairs or labels to make a checker pass. To measure on more "
        "pairs, add a new versioned file (math_equiv_frozen_v2.jsonl) with its own pinned hash and keep "
        "v1 as it is. The one allowed edit is a label proved mathematically wrong: fix it, update this pin "
        "in the same commit, and list the row, the old label and the proof in tests/data/README.md."
    )


def test_rows_are_labelled_and_conventions_named():
    rows = [json.loads(line) for line in FROZEN.read_text().splitlines() if line.strip()]
    assert len(rows) >= 200
    assert all(set(row) == FIELDS for row in rows), [set(row) ^ FIELDS for row in rows if set(row) != FIELDS]
    assert all(row["expected"] in (0, 1) and row["why"] and row["category"] for row in rows)
    assert all(row["convention"] is None or row["convention"].strip() for row in rows)
    pairs = [(row["gold"], row["pred"]) for row in rows]
    assert len(set(pairs)) == len(pairs)
    # Both scored groups hold both labels: a checker that answers "equal" (or "not equal") to
    # everything scores visibly badly on each.
    for group in (False, True):
        labels = {row["expected"] for row in rows if (row["convention"] is not None) == group}
        assert labels == {0, 1}, (group, labels)
