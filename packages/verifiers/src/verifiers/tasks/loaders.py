"""Load and save task files in the INTELLECT-2 RL dataset schema (JSONL, JSON or parquet).

Columns: `prompt`, `task_type`, `verification_info` (JSON string or object), optional
`problem_id`, `source`, `solve_rate_qwen_r1_distill_7b`; others land in `Task.metadata`.
Parquet needs `pyarrow` (extra: `pip install "intellect2-verifiers[parquet]"`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from verifiers.errors import TaskFormatError
from verifiers.task import Task


def _rows(path: Path) -> Iterator[dict]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        with path.open() as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError as exc:
                        raise TaskFormatError(f"{path}:{number}: not JSON: {exc}") from exc
    elif suffix == ".json":
        data = json.loads(path.read_text())
        if not isinstance(data, list):
            raise TaskFormatError(f"{path}: expected a JSON list of rows")
        yield from data
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError("reading parquet needs pyarrow: pip install 'intellect2-verifiers[parquet]'") from exc
        table = pq.read_table(path)
        for batch in table.to_batches(max_chunksize=4096):
            yield from batch.to_pylist()
    else:
        raise TaskFormatError(f"{path}: unsupported extension {suffix!r} (use .jsonl, .json or .parquet)")


def load_tasks(
    path: str | Path,
    *,
    task_types: Sequence[str] | None = None,
    min_solve_rate: float | None = None,
    max_solve_rate: float | None = None,
    limit: int | None = None,
) -> list[Task]:
    """Tasks from one file, optionally filtered by type and difficulty.

    The INTELLECT-2 QwQ run kept 0.1 <= solve_rate_qwen_r1_distill_7b <= 0.8; rows without
    a solve rate pass the difficulty filter.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no task file at {path}")
    tasks = []
    for row in _rows(path):
        task = Task.from_row(row)
        if task_types is not None and task.task_type not in task_types:
            continue
        if task.solve_rate is not None:
            if min_solve_rate is not None and task.solve_rate < min_solve_rate:
                continue
            if max_solve_rate is not None and task.solve_rate > max_solve_rate:
                continue
        tasks.append(task)
        if limit is not None and len(tasks) >= limit:
            break
    return tasks


def save_tasks(tasks: Iterable[Task], path: str | Path) -> Path:
    """Write tasks as INTELLECT-2 rows (.jsonl or .parquet, by extension)."""
    path = Path(path)
    rows = [t.to_row() for t in tasks]
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError("writing parquet needs pyarrow: pip install 'intellect2-verifiers[parquet]'") from exc
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix.lower() in (".jsonl", ".ndjson"):
        with path.open("w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    else:
        raise TaskFormatError(f"{path}: unsupported extension (use .jsonl or .parquet)")
    return path
