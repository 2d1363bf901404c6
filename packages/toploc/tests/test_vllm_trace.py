"""toploc.vllm.trace without vLLM: step bookkeeping, proof equality with build_proofs_bytes, errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from toploc import build_proofs_bytes
from toploc.vllm.trace import EXTRA_ARGS_KEY, RequestTrace, SamplerArgs, TraceError, TraceRegistry


def _args(**overrides: object) -> SamplerArgs:
    values: dict[str, object] = {"key": "k", "seed": 5, "sequence_id": 2, "temperature": 0.7, "topk": 64}
    values.update(overrides)
    return SamplerArgs(**values)  # type: ignore[arg-type]


def _rows(n: int, hidden: int = 96) -> torch.Tensor:
    return torch.randn(n, hidden, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)


def test_import_toploc_never_imports_vllm() -> None:
    code = "import sys, toploc, toploc.vllm.trace; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_extra_args_round_trip_and_rejects_malformed() -> None:
    args = _args()
    assert SamplerArgs.from_extra_args({EXTRA_ARGS_KEY: args.to_extra_args()}) == args
    assert SamplerArgs.from_extra_args(None) is None
    assert SamplerArgs.from_extra_args({"other": 1}) is None
    for bad in (
        {EXTRA_ARGS_KEY: "seed=1"},
        {EXTRA_ARGS_KEY: {"key": "k", "seed": 1}},  # sequence_id missing
        {EXTRA_ARGS_KEY: {"key": "k", "seed": 1.5, "sequence_id": 0}},
        {EXTRA_ARGS_KEY: {"key": "k", "seed": 1, "sequence_id": 0, "colour": "red"}},
        {EXTRA_ARGS_KEY: {"key": "k", "seed": 1, "sequence_id": 0, "temperature": -1.0}},
        {EXTRA_ARGS_KEY: {"key": "", "seed": 1, "sequence_id": 0}},
    ):
        with pytest.raises(ValueError):
            SamplerArgs.from_extra_args(bad)


def test_trace_proofs_equal_build_proofs_with_discarded_steps() -> None:
    """Partial-prefill steps repeat position 0; only the last row per position is committed."""
    rows = _rows(70)
    trace = RequestTrace(_args())
    trace.record(0, 9, -1.0, torch.ones(96))  # a partial prefill chunk: discarded
    trace.record(0, 9, -1.0, torch.full((96,), 2.0))  # another one
    for t in range(70):
        trace.record(t, 10 + t % 50, -0.5, rows[t])
    trace.record(70, 99, -3.0, torch.ones(96))  # one step past the end (async scheduling): dropped
    out = trace.finish([10 + t % 50 for t in range(70)])
    expected = b"".join(build_proofs_bytes(rows, 32, 64, skip_prefill=True))
    assert out.proofs == expected and len(out.proofs) == 3 * (2 + 2 * 64)
    assert out.token_ids == tuple(10 + t % 50 for t in range(70))
    assert out.logprobs == (-0.5,) * 70
    assert out.discarded_steps == 2


def test_trace_errors_are_specific() -> None:
    gap = RequestTrace(_args())
    gap.record(0, 1, -1.0, _rows(1)[0])
    gap.record(2, 1, -1.0, _rows(1)[0])
    with pytest.raises(TraceError, match="position 2 after 1"):
        gap.finish([1])
    changed = RequestTrace(_args())
    for t in range(3):
        changed.record(t, 4, -1.0, _rows(3)[t])
    with pytest.raises(TraceError, match=r"other than the seeded draws at positions \[1\]"):
        changed.finish([4, 5, 4])
    short = RequestTrace(_args())
    short.record(0, 4, -1.0, _rows(1)[0])
    with pytest.raises(TraceError, match="emitted 2 tokens but the sampler drew 1"):
        short.finish([4, 4])
    blind = RequestTrace(_args())
    blind.record(0, 4, -1.0, None)
    with pytest.raises(TraceError, match="attach"):
        blind.finish([4])
    tiny = RequestTrace(_args(topk=128))  # one row of H = 96 cannot fill a 128-value proof
    tiny.record(0, 4, -1.0, _rows(1)[0])
    with pytest.raises(TraceError, match="cannot build proofs"):
        tiny.finish([4])


def test_trace_without_proofs_and_empty_completion() -> None:
    trace = RequestTrace(_args(proofs=False))
    trace.record(0, 3, -2.0, None)
    assert trace.finish([3]).proofs == b""
    assert RequestTrace(_args()).finish([]).token_ids == ()


def test_registry_keeps_a_resumed_request_and_flags_key_reuse() -> None:
    registry = TraceRegistry()
    first = registry.open(_args())
    assert registry.open(_args()) is first and len(registry) == 1
    registry.open(_args(seed=6))
    assert first.error is not None and "same toploc key" in first.error
    assert registry.take("k") is first and registry.take("k") is None


def test_reseed_changes_the_sequence_id_from_its_position_on_and_only_ahead() -> None:
    trace = RequestTrace(_args())
    base = trace.args.sequence_id
    rows = _rows(2)
    trace.record(0, 3, -1.0, rows[0])
    trace.record(1, 4, -1.0, rows[1])
    with pytest.raises(ValueError, match="2 tokens are drawn"):
        trace.reseed(1, 99)  # token 1 is drawn already: the past keeps its id
    trace.reseed(2, 99)
    trace.reseed(4, 77)
    with pytest.raises(ValueError, match="last reseed from 4"):
        trace.reseed(3, 55)
    assert [trace.sequence_id_at(t) for t in range(6)] == [base, base, 99, 99, 77, 77]


def test_registry_reseeds_open_traces_only() -> None:
    registry = TraceRegistry()
    trace = registry.open(_args())
    registry.reseed("k", 0, 5)
    assert trace.sequence_id_at(0) == 5
    registry.take("k")
    with pytest.raises(TraceError, match="no open trace"):
        registry.reseed("k", 1, 6)
