"""Running vLLM's in-process CPU engine inside a shared pytest process, and leaving it as found.

vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op, drops torch to one thread and
opens a one-rank torch.distributed group; later tests in this process must see none of it. Import
this only where vLLM is installed (``pytest.importorskip("vllm")`` first).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from vllm.distributed.parallel_state import cleanup_dist_env_and_memory


@contextmanager
def restored_process_state() -> Iterator[list]:
    """Shut down the engines appended to the yielded list (``VLLMBackend``s), then undo what
    vLLM's in-process engine changed in this process."""
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    engines: list = []
    try:
        yield engines
    finally:
        for engine in engines:
            engine.llm.llm_engine.engine_core.shutdown()
        cleanup_dist_env_and_memory()
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
