"""The swarm harness's count of batches prefilled or judged twice (``benchmarks/swarm_validators.py``).

The classifier reads what validators wrote (``prefill`` lines: batch id, process name, pid, time) and
the harness's kills: a second prefill by another process is ``after_validator_kill`` when the first
process was SIGKILLed between the two, ``after_orchestrator_restart`` when the orchestrator was,
else ``while_lease_held`` (the count that must be 0); one process prefilling a batch again is not
two validators. The real records are checked by ``test_redteam_validators.py`` and the swarm runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from swarm_validators import _twice


def _line(batch: str, name: str, pid: int, t: float) -> dict[str, Any]:
    return {"event": "prefill", "batch_id": batch, "name": name, "pid": pid, "time": t}


def test_second_prefills_are_told_apart_by_cause() -> None:
    lines = [
        _line("a", "validator", 10, 1.0), _line("a", "validator-1", 11, 5.0),  # validator (pid 10) killed at 2
        _line("b", "validator", 12, 6.0), _line("b", "validator-2", 13, 9.0),  # the orchestrator restarted at 7
        _line("c", "validator-1", 11, 10.0), _line("c", "validator-2", 13, 11.0),  # nothing between: a violation
        _line("d", "validator-1", 11, 12.0), _line("d", "validator-1", 11, 13.0),  # one process, twice
        _line("e", "validator", 14, 14.0),
    ]  # fmt: skip
    kills = [{"t": 2.0, "target": "validator", "pid": 10}, {"t": 7.0, "target": "orchestrator", "pid": 99},
             {"t": 10.5, "target": "validator", "pid": 12}]  # fmt: skip
    found = _twice(lines, kills)
    assert (found["after_validator_kill"], found["after_orchestrator_restart"], found["while_lease_held"]) == (1, 1, 1)
    assert found["total"] == 3 and found["same_process_again"] == 1
    assert len(found["examples"]) == 1 and found["examples"][0].startswith("c:")


def test_a_restarted_validator_is_another_process() -> None:
    lines = [_line("a", "validator", 10, 1.0), _line("a", "validator", 20, 15.0)]  # same name, new pid
    assert _twice(lines, [{"t": 3.0, "target": "validator", "pid": 10}])["after_validator_kill"] == 1
    assert _twice(lines, [])["while_lease_held"] == 1
