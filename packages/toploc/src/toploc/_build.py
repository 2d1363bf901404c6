"""Build a shared library once into the toploc cache, keyed by what went into it.

Both kernel loaders (``toploc.native`` for the CPU, ``toploc.cuda`` for the GPU) compile on
first use into ``$TOPLOC_CACHE_DIR`` (default ``~/.cache/toploc``). The file name carries a
hash of the sources and flags, so a changed source or compiler builds anew and an unchanged
one is reused; the build happens in a temporary folder inside the cache and is moved into
place atomically, so concurrent builders race harmlessly.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$TOPLOC_CACHE_DIR``, else ``~/.cache/toploc``."""
    return Path(os.environ.get("TOPLOC_CACHE_DIR", Path.home() / ".cache" / "toploc"))


def build_cached(
    stem: str, key: bytes, command: Callable[[Path], list[str]], *, timeout: float
) -> Path | None:
    """The path of ``<stem>_<hash of key>.so`` in the cache, compiled first if absent.

    ``command(output)`` is the compiler's argument list writing the library to ``output``.
    Returns None when the compiler fails (its output is not kept: callers fall back to the
    pure path). Raises ``OSError`` / ``subprocess.SubprocessError`` as ``subprocess.run`` does.
    """
    digest = hashlib.sha256(key).hexdigest()[:16]
    cache = cache_dir()
    target = cache / f"{stem}_{digest}.so"
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            built = Path(tmp) / target.name
            done = subprocess.run(command(built), capture_output=True, timeout=timeout)
            if done.returncode != 0:
                return None
            os.replace(built, target)  # atomic: concurrent builders race harmlessly
    return target
