"""Publishing a state dict from memory: the same bytes as save_file + publish_file, written once.

The oracle is safetensors itself: ``safetensors.torch.save`` (what ``save_file`` writes) for the
layout, and a file published the ordinary way for what clients receive.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import wait_until  # type: ignore[import-not-found]
from shardcast import Client, PublishError, SafetensorsStream, publish_file, publish_tensors
from shardcast.layout import DataDir

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.float32,
    torch.complex64,
    torch.float64,
    torch.int64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


def mixed_state_dict() -> dict[str, object]:
    """Every case the layout has to get right: dtypes of every width, a 0-d and an empty tensor,
    a transposed (non-contiguous) one, a parameter that requires grad, a non-ASCII name."""
    generator = torch.Generator().manual_seed(0)
    return {
        "model.embed.weight": torch.randn(300, 64, generator=generator).to(torch.bfloat16),
        "model.layers.0.mlp.weight": torch.randn(64, 128, generator=generator).t(),
        "model.norm.weight": torch.nn.Parameter(torch.ones(64)),
        "step": torch.tensor(7),
        "mask": torch.rand(33, generator=generator) > 0.5,
        "empty": torch.zeros(0, 5),
        "scale.fp8": torch.randn(17, generator=generator).to(torch.float8_e4m3fn),
        "größe": torch.arange(5, dtype=torch.int16),
        "rope": torch.randn(9, generator=generator, dtype=torch.float64),
    }


def saved_bytes(tensors: dict[str, object], metadata: dict[str, str] | None = None) -> bytes:
    """What ``save_file`` writes (it needs contiguous tensors without grad; publish_tensors does not)."""
    plain = {name: value.detach().contiguous() for name, value in tensors.items()}  # type: ignore[attr-defined]
    return safetensors_torch.save(plain, metadata=metadata)


def raw(tensor) -> object:  # type: ignore[no-untyped-def]
    """A tensor's bytes as a uint8 tensor (exact comparison for every dtype, NaN included)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def written_bytes() -> int:
    """Bytes this process has passed to write() so far (``wchar`` of /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.dictionaries(
        st.text(min_size=1, max_size=12).filter(lambda name: name != "__metadata__"),
        st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 4), max_size=3)),
        max_size=6,
    ),
    metadata=st.none() | st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=1),
    chunk=st.integers(1, 100),
)
def test_stream_is_save_file_bytes(specs: dict, metadata: dict[str, str] | None, chunk: int) -> None:
    # Property: for any names (unicode, quotes, control characters), dtypes and shapes (0-d,
    # empty), the stream's bytes, read in any chunk size, are what safetensors writes.
    # (One metadata key at most: safetensors writes several in hash order. No tensors with
    # metadata {} is left out: safetensors 0.8 writes invalid JSON for it, '{},"__metadata__":{}}'.)
    assume(specs or metadata != {})
    tensors = {
        name: torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float64).reshape(shape).to(dtype)
        for name, (dtype, shape) in specs.items()
    }
    stream = SafetensorsStream(tensors, metadata)
    expected = saved_bytes(tensors, metadata)
    assert stream.size == len(expected)
    assert b"".join(stream.read(offset, chunk) for offset in range(0, stream.size, chunk)) == expected


def test_numpy_arrays_match_safetensors_numpy() -> None:
    numpy = pytest.importorskip("numpy")
    from safetensors.numpy import save

    arrays = {
        "a": numpy.arange(10, dtype=numpy.float32),
        "b": numpy.ones((2, 3), dtype=bool),
        "c": numpy.arange(6, dtype=">i4").reshape(3, 2).T,  # big-endian and transposed
    }
    assert SafetensorsStream(arrays).read(0, 1 << 20) == save(
        {k: numpy.ascontiguousarray(v) for k, v in arrays.items()}
    )


def test_memory_publish_delivers_file_publish_bytes(origin_factory, relay_factory, tmp_path: Path) -> None:
    # The same state dict published two ways, through a relay to a client: identical bytes,
    # identical manifests except the version number and timestamp.
    tensors = mixed_state_dict()
    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(saved_bytes(tensors, {"format": "pt"}))
    origin = origin_factory(shard_size=10_000)
    relay = relay_factory([origin.url], "relay")
    from_file = origin.publish(checkpoint)
    # A relay never goes back to an older version: let it mirror v1 before v2 appears.
    wait_until(lambda: relay.local_index().latest(complete_only=True) == 1, timeout=60, what="relay has v1")
    from_memory = origin.publish(tensors, metadata={"format": "pt"})
    wait_until(lambda: relay.local_index().latest(complete_only=True) == 2, timeout=60, what="relay has v2")
    assert (from_file.version, from_memory.version) == (1, 2)
    assert from_memory.num_shards > 3  # shards cut across tensor boundaries and the header
    assert from_memory.file_digest == from_file.file_digest
    assert from_memory.shards == from_file.shards
    client = Client([relay.url])
    first = client.fetch(1, tmp_path / "out1" / "model.safetensors", deadline_s=60)
    second = client.fetch(2, tmp_path / "out2" / "model.safetensors", deadline_s=60)
    assert second.path.read_bytes() == first.path.read_bytes() == checkpoint.read_bytes()
    loaded = safetensors_torch.load_file(second.path)
    assert loaded.keys() == tensors.keys()
    for name, value in tensors.items():
        assert loaded[name].dtype == value.dtype and loaded[name].shape == value.shape  # type: ignore[attr-defined]
        assert torch.equal(raw(loaded[name]), raw(value))


def test_memory_publish_writes_the_checkpoint_once(tmp_path: Path) -> None:
    # wchar counts every byte this process hands to write(): the in-memory path writes the
    # shards (+ manifest and index, a few KB); the file path writes the checkpoint, then the shards.
    tensors = {f"layer{i}": torch.randn(256, 1024) for i in range(4)}  # 4 MiB
    size = SafetensorsStream(tensors).size
    before = written_bytes()
    publish_tensors(tmp_path / "memory", tensors, shard_size=1 << 20)
    memory_written = written_bytes() - before
    before = written_bytes()
    safetensors_torch.save_file(tensors, tmp_path / "model.safetensors")
    publish_file(tmp_path / "file", tmp_path / "model.safetensors", shard_size=1 << 20)
    file_written = written_bytes() - before
    assert size <= memory_written < size + 64 * 1024
    assert file_written >= 2 * size
    shards = sorted((tmp_path / "memory" / "v1").glob("shard_*.bin"))
    assert sum(p.stat().st_size for p in shards) == size
    assert [p.read_bytes() for p in shards] == [
        p.read_bytes() for p in sorted((tmp_path / "file" / "v1").glob("shard_*.bin"))
    ]


def test_zstd_delta_and_signature_work_from_memory(tmp_path: Path) -> None:
    from shardcast import HmacKey
    from shardcast.publish import read_decoded_shard
    from shardcast.signing import verify_manifest

    key = HmacKey(b"k" * 32)
    tensors = {"w": torch.zeros(50_000)}
    store = DataDir(tmp_path / "origin")
    publish_tensors(store, tensors, shard_size=50_000, encoding="zstd")
    tensors["w"][7] = 1.0
    second = publish_tensors(store, tensors, shard_size=50_000, encoding="zstd", delta=True, signing_key=key)
    verify_manifest(second, key)
    assert second.delta is not None and second.delta.base_version == 1
    data = b"".join(read_decoded_shard(store, second, i) for i in range(second.num_shards))
    assert data == saved_bytes(tensors)


@pytest.mark.parametrize(
    ("tensors", "metadata", "message"),
    [
        ({"w": [1.0, 2.0]}, None, "expected a torch.Tensor or numpy.ndarray"),
        ({"w": torch.zeros(2, dtype=torch.float4_e2m1fn_x2)}, None, "float4_e2m1fn_x2"),
        ({"": torch.zeros(1)}, None, "bad tensor name"),
        ({"__metadata__": torch.zeros(1)}, None, "bad tensor name"),
        ({"w": torch.zeros(2).to_sparse()}, None, "make it dense"),
        ({"w": torch.zeros(1)}, {"step": 3}, "str -> str"),
        ([torch.zeros(1)], None, "expected a mapping"),
    ],
)
def test_bad_state_dicts_fail_before_anything_is_written(
    tmp_path: Path, tensors: object, metadata: object, message: str
) -> None:
    with pytest.raises(PublishError, match=message):
        publish_tensors(tmp_path / "origin", tensors, metadata=metadata)  # type: ignore[arg-type]
    assert not list(tmp_path.glob("origin/v*"))


def test_retention_disk_use_is_keep_times_the_checkpoint(tmp_path: Path) -> None:
    # The README's disk-use figure: a data directory holds `keep` full copies (grace 0 here;
    # with a grace period, versions retired less than grace_s ago are still on disk too).
    tensors = {"w": torch.zeros(100_000)}
    store = DataDir(tmp_path / "origin")
    for step in range(7):
        tensors["w"][0] = step
        publish_tensors(store, tensors, keep=5, grace_s=0, shard_size=100_000)
    assert store.local_versions() == [3, 4, 5, 6, 7]
    on_disk = sum(p.stat().st_size for p in store.root.glob("v*/shard_*.bin"))
    assert on_disk == 5 * SafetensorsStream(tensors).size


def test_readme_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = re.search(r"## Publishing from memory\n.*?```python\n(.*?)```", readme, re.DOTALL).group(1)  # type: ignore[union-attr]
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.split() == ["1", "6", "526152"]
