"""The noise cache's model fingerprint: what changes it, what does not, and that it reads a few MiB
of a 1 GiB model, not the model (prime_rl.validator.model_fingerprint)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from prime_rl.config import load_config
from prime_rl.validator import model_fingerprint as fingerprint_module
from prime_rl.validator.model_fingerprint import TENSOR_EDGE_BYTES, model_fingerprint
from prime_rl.validator.noise_cache import key_for_run

CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64}
TOKENIZER = {"model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1}}}


def write_small_files(directory: Path) -> None:
    (directory / "config.json").write_text(json.dumps(CONFIG))
    (directory / "tokenizer.json").write_text(json.dumps(TOKENIZER))


@pytest.fixture
def model_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Config, tokenizer and two weight files of real float32 tensors of 64 KiB, with files over
    64 KiB (not 64 MiB) fingerprinted as large ones, so every test here takes the sampled path."""
    monkeypatch.setattr(fingerprint_module, "WHOLE_FILE_BYTES", 64 << 10)
    directory = tmp_path / "model"
    directory.mkdir()
    write_small_files(directory)
    generator = torch.Generator().manual_seed(0)
    for part in (1, 2):
        tensors = {f"layers.{part}.{name}": torch.randn(128, 128, generator=generator) for name in ("q", "k", "v")}
        tensors[f"layers.{part}.norm"] = torch.randn(64, generator=generator)  # 256 bytes: read whole
        save_file(tensors, directory / f"model-0000{part}-of-00002.safetensors")
    return directory


def edit_tensor(path: Path, name: str, element: int, value: float) -> None:
    """Set one float32 element of tensor ``name`` in place (same shapes, same header)."""
    data = bytearray(path.read_bytes())
    (header_bytes,) = struct.unpack("<Q", data[:8])
    begin = json.loads(data[8 : 8 + header_bytes])[name]["data_offsets"][0]
    position = 8 + header_bytes + begin + 4 * element
    data[position : position + 4] = struct.pack("<f", value)
    path.write_bytes(bytes(data))


def test_values_at_either_end_of_any_tensor_change_it(model_dir: Path) -> None:
    weights = model_dir / "model-00002-of-00002.safetensors"
    before = model_fingerprint(model_dir)
    edge_elements = TENSOR_EDGE_BYTES // 4
    for element in (0, edge_elements - 1, 128 * 128 - edge_elements, 128 * 128 - 1):
        edit_tensor(weights, "layers.2.k", element, 1234.5)
        after = model_fingerprint(model_dir)
        assert after != before, element
        before = after
    edit_tensor(weights, "layers.2.norm", 31, 0.5)  # a tensor under 8 KiB is read whole
    assert model_fingerprint(model_dir) != before


def test_a_values_edit_in_the_middle_of_a_tensor_is_not_seen(model_dir: Path) -> None:
    # The documented limit: a same-shaped edit away from every tensor's two ends keeps the key.
    before = model_fingerprint(model_dir)
    edit_tensor(model_dir / "model-00001-of-00002.safetensors", "layers.1.v", 128 * 64, 1234.5)
    assert model_fingerprint(model_dir) == before


def test_a_tensors_dtype_name_or_shape_changes_it(model_dir: Path) -> None:
    weights = model_dir / "model-00001-of-00002.safetensors"
    tensors = load_file(weights)
    before = model_fingerprint(model_dir)
    seen = {before}
    same_bytes = {
        "dtype": {**tensors, "layers.1.q": tensors["layers.1.q"].view(torch.int32)},
        "shape": {**tensors, "layers.1.q": tensors["layers.1.q"].reshape(64, 256)},
        "name": {**{k: v for k, v in tensors.items() if k != "layers.1.q"}, "layers.1.o": tensors["layers.1.q"]},
    }
    for change, changed in same_bytes.items():
        save_file(changed, weights)
        fingerprint = model_fingerprint(model_dir)
        assert fingerprint not in seen, change
        seen.add(fingerprint)
    save_file(tensors, weights)
    assert model_fingerprint(model_dir) == before  # the same tensors again: the same key


def test_adding_removing_or_renaming_a_file_changes_it(model_dir: Path) -> None:
    before = model_fingerprint(model_dir)
    (model_dir / "generation_config.json").write_text("{}")
    added = model_fingerprint(model_dir)
    (model_dir / "generation_config.json").unlink()
    assert model_fingerprint(model_dir) == before
    weights = model_dir / "model-00002-of-00002.safetensors"
    weights.rename(model_dir / "model-00002-of-00002.renamed.safetensors")
    renamed = model_fingerprint(model_dir)
    (model_dir / "model-00002-of-00002.renamed.safetensors").unlink()
    removed = model_fingerprint(model_dir)
    assert len({before, added, renamed, removed}) == 4


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_any_byte_of_the_config_and_tokenizer_changes_it(model_dir: Path, name: str) -> None:
    before = model_fingerprint(model_dir)
    text = (model_dir / name).read_text()
    (model_dir / name).write_text(text.replace("64", "65") if name == "config.json" else text.replace('"b"', '"c"'))
    assert model_fingerprint(model_dir) != before


def test_copies_and_mtimes_do_not_change_it(model_dir: Path, tmp_path: Path) -> None:
    before = model_fingerprint(model_dir)
    copy = shutil.copytree(model_dir, tmp_path / "elsewhere" / "copy", copy_function=shutil.copyfile)
    for path in model_dir.iterdir():
        os.utime(path, (1_000_000_000, 1_000_000_000))
    assert model_fingerprint(copy) == before
    assert model_fingerprint(model_dir) == before
    (model_dir / "noise-profiles").mkdir()  # the cache's own folder and the provenance record
    (model_dir / "noise-profiles" / "noise-0.json").write_text("{}")
    (model_dir / "prime_rl_source.json").write_text("{}")
    assert model_fingerprint(model_dir) == before


def test_a_large_file_that_is_not_safetensors_is_sampled_at_fixed_blocks(model_dir: Path) -> None:
    blob = model_dir / "pytorch_model.bin"
    size = 4 << 20
    with blob.open("wb") as handle:
        handle.truncate(size)
    before = model_fingerprint(model_dir)
    with blob.open("r+b") as handle:  # the last block is always read
        handle.seek(size - 1)
        handle.write(b"\x01")
    assert model_fingerprint(model_dir) != before


def bytes_read() -> int:
    """Bytes this process has read through read(2) and its kind (``rchar``, page-cache hits included)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar line in /proc/self/io")


def write_sparse_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], element_bytes: int = 4) -> int:
    """A valid safetensors file whose data region is a hole (reads as zeros, takes no disk)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        length = element_bytes * int(torch.tensor(shape).prod())
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + length]}
        offset += length
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text)
        handle.truncate(8 + len(text) + offset)
    return 8 + len(text) + offset


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")
def test_the_key_reads_a_few_mib_of_a_1_gib_model(tmp_path: Path) -> None:
    """Through ``key_for_run`` (what a validator computes at start): 1 GiB of weights in 4 tensors
    of 256 MiB and one of 4 MiB; the key may read 64 MiB at most (it reads ~200 KB, most of it
    package metadata for the engine versions). Hashing every byte, as the key did before, read
    1,078,095,517 bytes here."""
    directory = tmp_path / "model"
    directory.mkdir()
    write_small_files(directory)
    tensors = {f"layers.{i}.mlp": ("F32", [8192, 8192]) for i in range(4)}
    tensors["norm"] = ("F32", [1 << 20])
    size = write_sparse_safetensors(directory / "model.safetensors", tensors)
    assert size > 1 << 30
    config = load_config(None, ["--run_dir", str(tmp_path / "run"), "--model.path", str(directory)])
    start = bytes_read()
    key = key_for_run(config, "hf")
    read = bytes_read() - start
    assert read < 64 << 20, f"read {read} bytes of a {size}-byte model"
    # Not a key that ignores the weights: a value at a tensor's start changes it.
    with (directory / "model.safetensors").open("r+b") as handle:
        (header_bytes,) = struct.unpack("<Q", handle.read(8))
        handle.seek(8 + header_bytes + (256 << 20))  # layers.1.mlp's first element
        handle.write(struct.pack("<f", 1.0))
    assert key_for_run(config, "hf").model != key.model
