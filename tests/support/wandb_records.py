"""Reading back what W&B wrote in offline mode (no network, no API): the run file's protobuf records.

Offline runs no longer write ``files/wandb-summary.json``; the run file ``run-<id>.wandb`` holds
everything `wandb sync` would upload. Format (wandb's datastore): a 7-byte header ``<4sHB`` =
(":W&B", 0xBEE1, version), then LevelDB log blocks of 32 KiB; each chunk has a 7-byte header
``<IHB`` = (crc32, length, type: 1 full, 2 first, 3 middle, 4 last); a block tail shorter than a
header is zero padding. Each complete payload is a ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

_BLOCK = 32768


def read_wandb_records(path: Path) -> list[Any]:
    """Every record of one ``run-*.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7])[:2] == (b":W&B", 0xBEE1), f"{path} is not a W&B run file"
    records, pending, position = [], b"", 7
    while position + 7 <= len(data):
        left = _BLOCK - position % _BLOCK
        _, length, kind = struct.unpack("<IHB", data[position : position + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):
            position += left
            continue
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def complete_wandb_records(path: Path, timeout_s: float = 60.0) -> list[Any]:
    """The records of a finished run: wandb's service writes the file in the background and
    ``finish()`` can return before the final ``exit`` record is there, so wait (bounded) for it."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = read_wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"{path} never got its exit record"
        time.sleep(0.2)


def read_wandb_history(run_folder: Path) -> tuple[str, list[dict[str, Any]]]:
    """(display name, logged rows without W&B's own ``_`` keys) of an ``offline-run-*`` folder."""
    (run_file,) = run_folder.glob("run-*.wandb")
    records = complete_wandb_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    history = [  # a key with "/" is stored as nested_key parts
        {key: json.loads(item.value_json) for item in r.history.item
         if not (key := item.key or "/".join(item.nested_key)).startswith("_")}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]  # fmt: skip
    return run.display_name, history
