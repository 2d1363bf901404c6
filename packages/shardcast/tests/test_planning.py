"""Shard planning: hand-computed cases and properties (tiling, count formula)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardcast.planning import ShardSpan, num_shards, plan_shards, shard_span


def test_hand_computed_plan() -> None:
    # 10 bytes in shards of 4: [0,4) [4,8) [8,10) -> 3 shards, the last one 2 bytes.
    assert plan_shards(10, 4) == [ShardSpan(0, 0, 4), ShardSpan(1, 4, 4), ShardSpan(2, 8, 2)]
    assert num_shards(0, 4) == 0 and plan_shards(0, 4) == []
    assert num_shards(8, 4) == 2  # exact division: no empty trailing shard
    # The reference's 500 MB file with 50 MB shards is exactly 10 shards.
    assert num_shards(500_000_000, 50_000_000) == 10


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        num_shards(10, 0)
    with pytest.raises(ValueError):
        num_shards(-1, 4)
    with pytest.raises(IndexError):
        shard_span(3, 10, 4)


@given(st.integers(1, 10**9), st.integers(0, 2000), st.integers(0, 10**9))
@settings(deadline=None)  # no timing in tests: CI machines are shared
def test_spans_tile_the_file(shard_size: int, full_shards: int, tail: int) -> None:
    file_size = full_shards * shard_size + tail % shard_size
    spans = plan_shards(file_size, shard_size)
    assert len(spans) == -(-file_size // shard_size) == num_shards(file_size, shard_size)
    position = 0
    for i, span in enumerate(spans):
        assert span.index == i and span.offset == position
        assert 0 < span.size <= shard_size
        assert span == shard_span(i, file_size, shard_size)
        position += span.size
    assert position == file_size
    # Every shard but the last is full.
    assert all(s.size == shard_size for s in spans[:-1])
