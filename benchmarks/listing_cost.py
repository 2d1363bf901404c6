"""What a validator's listing costs the orchestrator to serialize, three ways, in one process.

A listing (``GET /validator/pending``, ``POST /validator/leases``) of ``--batches`` batches of 8
samples (128 prompt + 384 completion tokens, toploc proofs of 258 B per 32 tokens, random
log-probs: what ``closed_loop.py`` submits), read from payload tables as the orchestrator stores them:

  - **models**: the sample models built and dumped (``UnreadSamples.into(answer).model_dump_json()``,
    what the routes sent before);
  - **json**: the same bytes from the tables, without the models (``UnreadSamples.json(answer)``);
  - **packed**: the token and log-prob lists packed (``UnreadSamples.json(answer, packed=True)``,
    what ``OrchestratorClient`` asks for).

Each way is timed ``--repeats`` times (``--number`` listings each, ``time.process_time``), alternating;
the table gives min and median ms per listing, and the client's side: parsing the answer back into
``PendingResponse`` (the validator's CPU, not the orchestrator's).

Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/listing_cost.py --json benchmarks/results/listing_cost.json``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROMPT, COMPLETION, SAMPLES, PROOF_BYTES = 128, 384, 8, 258 * (384 // 32)


def _tables(count: int, seed: int) -> list[Any]:
    import pyarrow as pa

    from prime_rl.api.protocol import RolloutBatch, RolloutSample
    from prime_rl.orchestrator.records import batch_rows
    from prime_rl.orchestrator.store_schema import BATCH_SCHEMA

    rng = random.Random(seed)
    tables = []
    for number in range(count):
        samples = [
            RolloutSample(task_id=number, group_index=g % 4, prompt_tokens=[rng.randrange(50_000) for _ in range(PROMPT)],
                          completion_tokens=[rng.randrange(50_000) for _ in range(COMPLETION)], sampling_seed=rng.randrange(2**40),
                          temperature=1.0, reward=float(g % 2), advantage=0.5 - g % 2, proofs=rng.randbytes(PROOF_BYTES),
                          inference_logprobs=[round(-rng.expovariate(2.0), 6) for _ in range(COMPLETION)])
            for g in range(SAMPLES)
        ]  # fmt: skip
        batch = RolloutBatch(worker_id=f"w{number}", step=3, batch_index=number, policy_version=3, samples=samples)
        tables.append(pa.Table.from_pydict(batch_rows(batch), schema=BATCH_SCHEMA))
    return tables


def _time(work: Callable[[], object], number: int) -> float:
    started = time.process_time()
    for _ in range(number):
        work()
    return (time.process_time() - started) / number * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=16, help="batches in a listing (closed_loop.py asks for 16)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=20, help="listings per timing")
    parser.add_argument("--json", default="", help="write the results here")
    args = parser.parse_args(argv)

    from prime_rl.api.protocol import PendingBatch, PendingResponse
    from prime_rl.orchestrator.batch_verdicts import UnreadSamples

    tables = _tables(args.batches, seed=7)
    listed = [PendingBatch(batch_id=f"w{i}-s3-b{i}", worker_id=f"w{i}", step=3, batch_index=i, policy_version=3,
                           received_at=1.0e9 + i, lease=None, samples=[]) for i in range(args.batches)]  # fmt: skip
    answer = PendingResponse(batches=listed, pending_batches=args.batches, policy_version=3, step=3)
    unread = UnreadSamples(list(tables), payloads=None)  # type: ignore[arg-type]  # tables read already: no file
    ways: dict[str, Callable[[], bytes]] = {
        "models": lambda: unread.into(answer).model_dump_json().encode(),
        "json": lambda: unread.json(answer),
        "packed": lambda: unread.json(answer, packed=True),
    }
    bodies = {name: way() for name, way in ways.items()}
    assert bodies["json"] == bodies["models"]
    parsed = PendingResponse.model_validate_json(bodies["models"])
    assert PendingResponse.model_validate_json(bodies["packed"]) == parsed

    server: dict[str, list[float]] = {name: [] for name in ways}
    client: dict[str, list[float]] = {name: [] for name in ("models", "packed")}
    for repeat in range(args.repeats):
        for name in ways if repeat % 2 == 0 else list(ways)[::-1]:
            server[name].append(_time(ways[name], args.number))
        for name in client:
            client[name].append(_time(lambda n=name: PendingResponse.model_validate_json(bodies[n]), args.number))

    def row(times: list[float]) -> dict[str, float]:
        return {"min_ms": round(min(times), 3), "median_ms": round(statistics.median(times), 3)}

    result = {
        "args": vars(args), "samples": args.batches * SAMPLES, "load_average": os.getloadavg(),
        "bytes": {name: len(body) for name, body in bodies.items()},
        "orchestrator": {name: row(times) for name, times in server.items()},
        "validator_parse": {("json" if name == "models" else name): row(times) for name, times in client.items()},
    }  # fmt: skip
    print(f"listing of {args.batches} batches ({result['samples']} samples), ms of CPU per listing (min / median of {args.repeats})")
    for name in ways:
        print(f"  {name:7s} {result['orchestrator'][name]['min_ms']:8.2f} / {result['orchestrator'][name]['median_ms']:8.2f}"
              f"   {result['bytes'][name]:,} bytes")  # fmt: skip
    for name, timing in result["validator_parse"].items():
        print(f"  validator parses {name}: {timing['min_ms']:.2f} / {timing['median_ms']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
