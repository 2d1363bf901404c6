"""The backend contract module: one home for the rules every engine shares, imported (not copied)."""

from __future__ import annotations

import math
import typing
from types import SimpleNamespace

import pytest
import torch
from tiny_lm import make_tiny_lm, make_tiny_tokenizer

import prime_rl.inference.backend as hf_module
import prime_rl.inference.contract as contract
import prime_rl.inference.vllm_backend as vllm_module
from prime_rl.inference.select import make_backend

SHARED = (
    "PROOF_CHUNK",
    "SAMPLER_SEED",
    "Completion",
    "FinishReason",
    "GenerationError",
    "Prefill",
    "SamplingParams",
    "proof_topk",
    "completion_text",
    "tokenizer_eos_ids",
)


def test_engines_share_the_contract_by_import():
    # Identity, not equality: a copied dataclass or constant would be a different object.
    for name in SHARED:
        assert getattr(vllm_module, name) is getattr(contract, name), name
        assert getattr(hf_module, name) is getattr(contract, name), name
    # The names other modules import from ``backend`` keep working and are the contract's own.
    for name in ("GenerationBackend", "build_proofs", "verify_proofs", "proof_size"):
        assert getattr(hf_module, name) is getattr(contract, name), name


def test_hf_backend_satisfies_the_protocol():
    backend = hf_module.HFBackend("unused", model=make_tiny_lm(), tokenizer=make_tiny_tokenizer())
    assert isinstance(backend, contract.GenerationBackend)
    assert backend.eos_token_ids == frozenset({make_tiny_tokenizer().eos_token_id})
    # Something without the tokenizer/eos attributes is not a backend.
    assert not isinstance(SimpleNamespace(policy_version=0, generate=None, prefill=None), contract.GenerationBackend)


def test_make_backend_returns_the_protocol():
    hints = typing.get_type_hints(make_backend, globalns={**vars(contract), "RunConfig": object})
    assert hints["return"] is contract.GenerationBackend


def test_tokenizer_eos_ids_accepts_one_many_or_none():
    assert contract.tokenizer_eos_ids(SimpleNamespace(eos_token_id=7)) == frozenset({7})
    assert contract.tokenizer_eos_ids(SimpleNamespace(eos_token_id=[2, 9])) == frozenset({2, 9})
    assert contract.tokenizer_eos_ids(SimpleNamespace(eos_token_id=None)) == frozenset()


def test_token_logprobs_hand_oracle():
    # Row 0: logits (0, ln 3) -> softmax (1/4, 3/4); token 1 -> ln(3/4). At T = 2 the logits halve:
    # (0, ln 3 / 2) -> softmax (1/(1+√3), √3/(1+√3)); token 0 -> -ln(1+√3). Greedy (T = 0) uses T = 1.
    logits = torch.tensor([[0.0, math.log(3.0)]])
    assert math.isclose(hf_module.token_logprobs(logits, torch.tensor([1]), 1.0).item(), math.log(0.75), abs_tol=1e-6)
    assert math.isclose(hf_module.token_logprobs(logits, torch.tensor([1]), 0.0).item(), math.log(0.75), abs_tol=1e-6)
    expected = -math.log(1 + math.sqrt(3))
    assert math.isclose(hf_module.token_logprobs(logits, torch.tensor([0]), 2.0).item(), expected, abs_tol=1e-6)


def test_the_workers_vllm_settings_reach_the_engine(monkeypatch):
    """Every ``[workers] vllm_*`` engine setting is handed to the vLLM backend (an in-flight switch
    needs ``vllm_max_num_batched_tokens``: a lease's prompts in one engine step)."""
    pytest.importorskip("vllm")
    seen: dict[str, typing.Any] = {}
    monkeypatch.setattr(vllm_module, "VLLMBackend", lambda path, **kwargs: seen.update(kwargs) or "engine")
    workers = SimpleNamespace(
        vllm_kv_cache_mb=512, vllm_max_model_len=1024, vllm_gpu_memory_utilization=0.3,
        vllm_enforce_eager=False, vllm_max_num_batched_tokens=8192, inflight_updates=True,
    )  # fmt: skip
    config = SimpleNamespace(workers=workers, model=SimpleNamespace(path="unused", dtype="float32"))
    assert make_backend(config, backend="vllm", device=torch.device("cpu"), max_batch_size=32) == "engine"
    assert seen["memory"] == vllm_module.EngineMemory(
        kv_cache_bytes=512 << 20, max_model_len=1024, gpu_memory_utilization=0.3, enforce_eager=False,
        max_num_batched_tokens=8192,
    )  # fmt: skip
    assert seen["inflight_updates"] is True and seen["max_batch_size"] == 32
