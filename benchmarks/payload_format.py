"""A batch payload's CPU to write and read, and its bytes: zstd parquet (before) against an Arrow IPC
file (``orchestrator/payloads.py``); and a verdict row's text by ``json.dumps`` (before) against
pydantic's serializer (``store_schema.verdicts_json``), and read back by ``json.loads`` (before)
against pydantic's reader (``store_schema.verdict_rows``: ``record.py`` reads each settled batch's
row once).

The payload is ``soak.py``'s batch: 2 prompts x 4 samples of 128 prompt + 384 completion tokens,
toploc proofs of 258 B per 32 tokens, float64 log-probs. Token ids, log-probs and proofs are drawn
at random per sample (what compresses least, so the parquet bytes are an upper bound). Each
operation runs ``--repeats`` times on files in a fresh temporary folder (page cache warm, as a
server's reads of files it just wrote are); CPU time (``time.process_time``), min and median.

Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/payload_format.py --json
benchmarks/results/payload_format.json`` (a few seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from history_ledger import COMPLETION, GROUP, PROMPT, PROMPTS  # benchmarks/

from prime_rl.api.protocol import Verdict
from prime_rl.orchestrator.payloads import read_payload_file, write_payload_file
from prime_rl.orchestrator.store_schema import BATCH_SCHEMA, verdict_rows, verdicts_json


def _payload(rng: random.Random) -> pa.Table:
    n = GROUP * PROMPTS
    rows = {
        "sample_index": list(range(n)), "task_id": [i // GROUP for i in range(n)], "group_index": [i % GROUP for i in range(n)],
        "prompt_tokens": [[rng.randrange(32000) for _ in range(PROMPT)] for _ in range(n)],
        "completion_tokens": [[rng.randrange(32000) for _ in range(COMPLETION)] for _ in range(n)],
        "sampling_seed": [rng.randrange(2**62) for _ in range(n)], "temperature": [1.0] * n,
        "reward": [float(i % 2) for i in range(n)], "advantage": [0.5 - i % 2 for i in range(n)],
        "proofs": [rng.randbytes(258 * (COMPLETION // 32)) for _ in range(n)],
        "inference_logprobs": [[-rng.expovariate(1.0) for _ in range(COMPLETION)] for _ in range(n)],
        "segments": [None] * n, "spans": [None] * n,
    }  # fmt: skip
    return pa.Table.from_pydict(rows, schema=BATCH_SCHEMA)


def cpu_ms(repeats: int, operation: Callable[[int], Any]) -> dict[str, float]:
    """CPU time of ``operation(index)`` for each index below ``repeats``: min and median, in ms."""
    times = []
    for index in range(repeats):
        start = time.process_time()
        operation(index)
        times.append(1e3 * (time.process_time() - start))
    return {"min_ms": round(min(times), 4), "median_ms": round(statistics.median(times), 4)}


def measure(repeats: int) -> dict[str, Any]:
    rng = random.Random(0)
    table = _payload(rng)
    folder = Path(tempfile.mkdtemp(prefix="payload-format-"))
    try:
        parquet = [folder / f"b{i}.parquet" for i in range(repeats)]
        arrow = [folder / f"b{i}.arrow" for i in range(repeats)]
        result: dict[str, Any] = {
            "parquet_zstd": {
                "write": cpu_ms(repeats, lambda i: pq.write_table(table, str(parquet[i]), compression="zstd")),
                "read": cpu_ms(repeats, lambda i: read_payload_file(parquet[i])),
                "bytes": os.path.getsize(parquet[0]),
            },
            "arrow_ipc": {
                "write": cpu_ms(repeats, lambda i: write_payload_file(table, arrow[i])),
                "read": cpu_ms(repeats, lambda i: read_payload_file(arrow[i])),
                "bytes": os.path.getsize(arrow[0]),
            },
        }
        assert read_payload_file(parquet[0]).equals(read_payload_file(arrow[0]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    verdicts = [
        Verdict(sample_index=i, accepted=True, reason="ok", reward=0.5, advantage=-0.25,
                logprobs=[-rng.expovariate(1.0) for _ in range(COMPLETION)])
        for i in range(GROUP * PROMPTS)
    ]  # fmt: skip
    before = json.dumps([v.model_dump() for v in verdicts], separators=(",", ":"))
    assert json.loads(before) == json.loads(verdicts_json(verdicts))
    result["verdict_row"] = {
        "json_dumps": cpu_ms(repeats, lambda i: json.dumps([v.model_dump() for v in verdicts], separators=(",", ":"))),
        "pydantic": cpu_ms(repeats, lambda i: verdicts_json(verdicts)),
        "same_values": True,
    }
    text = verdicts_json(verdicts)
    assert verdict_rows(text) == json.loads(text)
    result["verdict_row_read"] = {  # the record reads every settled batch's row once (record.py)
        "json_loads": cpu_ms(repeats, lambda i: json.loads(text)),
        "pydantic": cpu_ms(repeats, lambda i: verdict_rows(text)),
        "same_values": True,
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", default="", help="write the results here")
    args = parser.parse_args()
    emit({"repeats": args.repeats, "load_average": os.getloadavg(), **measure(args.repeats)}, args.json)


def emit(result: dict[str, Any], path: str) -> None:
    """Print ``result`` as JSON, and write it to ``path`` too unless that is empty."""
    text = json.dumps(result, indent=1)
    print(text)
    if path:
        Path(path).write_text(text + "\n")


if __name__ == "__main__":
    main()
