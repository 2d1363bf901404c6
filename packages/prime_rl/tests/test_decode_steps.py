"""HFBackend's decode steps: the static step (fixed shapes, in-place KV buffers, the CUDA graph's
body) gives the dynamic step's completions, and the validator prefills a batch in chunks."""

from __future__ import annotations

import time

import pytest
import torch
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from transformers import Qwen2Config, Qwen2ForCausalLM
from validator_setup import TinyRun

from prime_rl.api.protocol import PendingBatch
from prime_rl.inference.backend import HFBackend, SamplingParams
from prime_rl.validator.checks import Reason
from prime_rl.validator.verdicts import validate_batch

TOKENIZER = make_tiny_tokenizer()
PROMPTS = ["12+7=", "3+4=", "100+250=", "9=", "5*5=", "1+1="]
CASES = [
    SamplingParams(temperature=1.0, max_new_tokens=70),  # ragged EOS stops, partial proof chunks
    SamplingParams(temperature=0.0, max_new_tokens=33),
    SamplingParams(temperature=1.3, max_new_tokens=40, stop=("5", "+")),
]


def encode(texts) -> list[list[int]]:
    return [TOKENIZER(t)["input_ids"] for t in texts]


def completions(backend: HFBackend, params: SamplingParams, prompts=PROMPTS) -> list[tuple]:
    out = backend.generate(encode(prompts), list(range(11, 11 + len(prompts))), params)
    return [(c.completion_tokens, c.logprobs, c.proofs, c.finish_reason) for c in out]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("params", CASES)
def test_static_step_equals_dynamic_step_in_float64(arch, params):
    # fp64: the 4D mask over the whole buffer and the grown cache give the same numbers exactly.
    model = make_tiny_lm(arch=arch).to(torch.float64)
    dynamic = HFBackend("unused", model=model, tokenizer=TOKENIZER, decode="dynamic")
    static = HFBackend("unused", model=model, tokenizer=TOKENIZER, decode="static", sync_every=5)
    expected = completions(dynamic, params)
    assert completions(static, params) == expected
    assert len({e[3] for e in expected}) > 1 or params.temperature == 0.0  # rows end in different ways


def test_static_step_in_float32_gives_the_same_tokens_and_proofs():
    model = make_tiny_lm(arch="qwen2")
    dynamic = completions(HFBackend("unused", model=model, tokenizer=TOKENIZER, decode="dynamic"), CASES[0])
    static = completions(HFBackend("unused", model=model, tokenizer=TOKENIZER, decode="static"), CASES[0])
    assert [(d[0], d[2], d[3]) for d in dynamic] == [(s[0], s[2], s[3]) for s in static]
    gaps = [abs(a - b) for d, s in zip(dynamic, static, strict=True) for a, b in zip(d[1], s[1], strict=True)]
    assert max(gaps) < 1e-5  # fp32 rounding of another reduction order, nothing more


def test_static_step_serves_batches_of_other_widths_one_after_another():
    # Each batch gets buffers of its own width + limit: a short batch after a long one is unaffected.
    model = make_tiny_lm().to(torch.float64)
    static = HFBackend("unused", model=model, tokenizer=TOKENIZER, decode="static", max_batch_size=2)
    dynamic = HFBackend("unused", model=model, tokenizer=TOKENIZER, decode="dynamic", max_batch_size=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=20)
    prompts = ["100+250+999=", "1=", "7*7=", "2+2="]
    assert completions(static, params, prompts) == completions(dynamic, params, prompts)


def test_auto_is_the_dynamic_step_on_the_cpu():
    assert HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER).decode == "dynamic"


def test_decode_modes_are_checked():
    with pytest.raises(ValueError, match="decode must be one of"):
        HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER, decode="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a CUDA device"):
        HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER, decode="graph")


def sliding_window_model() -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(TOKENIZER), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=8,
        max_window_layers=1, layer_types=["full_attention", "sliding_attention"],
    )  # fmt: skip
    return Qwen2ForCausalLM(config)


def test_a_sliding_window_model_keeps_the_dynamic_step():
    # One 4D mask for every layer would let a sliding-window layer see past its window.
    model = sliding_window_model()
    assert HFBackend("unused", model=model, tokenizer=TOKENIZER).decode == "dynamic"
    with pytest.raises(ValueError, match="layer types"):
        HFBackend("unused", model=model, tokenizer=TOKENIZER, decode="static")


def test_eager_attention_takes_the_static_step():
    # fp32: transformers' eager attention turns a left-padded fp64 prefill into NaN on either step.
    model = make_tiny_lm()
    model.set_attn_implementation("eager")
    dynamic = completions(HFBackend("unused", model=model, tokenizer=TOKENIZER, decode="dynamic"), CASES[2])
    static = completions(HFBackend("unused", model=model, tokenizer=TOKENIZER, decode="static"), CASES[2])
    assert [(d[0], d[2], d[3]) for d in dynamic] == [(s[0], s[2], s[3]) for s in static]


class CountingBackend(HFBackend):
    """Records how many samples each prefill call holds."""

    prefill_sizes: list[int]

    def prefill(self, prompts, completions):
        self.prefill_sizes.append(len(prompts))
        return super().prefill(prompts, completions)


def test_the_validator_prefills_and_checks_a_batch_in_chunks():
    # A prefill holds fp32 logits [completion, V] per sample: a whole batch of long samples at once
    # does not fit on a GPU. Chunks of max_batch_size, each checked before the next, same verdicts.
    run = TinyRun(b"decode-steps-test-assignment-key", TOKENIZER, lambda t: f"{t}+{t * 3}=", 12, 4, 3, 6)
    model = make_tiny_lm()
    lease, record = run.lease("chunks", 0, 0)
    batch = run.worker("honest").answer(lease, HFBackend("unused", model=model, tokenizer=TOKENIZER))
    pending = PendingBatch(
        batch_id="chunks", worker_id=batch.worker_id, step=batch.step, batch_index=batch.batch_index,
        policy_version=batch.policy_version, received_at=time.time(), lease=record, samples=batch.samples,
    )  # fmt: skip
    verdicts = {}
    for size in (5, 64):
        backend = CountingBackend("unused", model=model, tokenizer=TOKENIZER, max_batch_size=size)
        backend.prefill_sizes = []
        verdicts[size] = validate_batch(
            pending, tasks=run, backend_for=lambda v, b=backend: b, decode=run.decode, checks=run.checks()
        )
        assert backend.prefill_sizes == ([5, 5, 2] if size == 5 else [12])
    assert [v.reason for v in verdicts[5]] == [Reason.ACCEPTED] * 12
    for chunked, whole in zip(verdicts[5], verdicts[64], strict=True):
        assert (chunked.reason, chunked.reward, chunked.advantage) == (whole.reason, whole.reward, whole.advantage)
        # Another padding width in the prefill: fp32 rounding, nothing more.
        assert chunked.logprobs == pytest.approx(whole.logprobs, abs=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_step_replays_the_static_step_on_cuda():
    # fp32 on the GPU: the graph replays exactly the static step's kernels, so the same numbers.
    model = make_tiny_lm(arch="qwen2")
    graph = HFBackend("unused", model=model, tokenizer=TOKENIZER, device="cuda")
    assert graph.decode == "graph"
    static = HFBackend("unused", model=model, tokenizer=TOKENIZER, device="cuda", decode="static")
    for params in CASES:
        assert completions(graph, params) == completions(static, params)
    assert graph.graph_error is None
    dynamic = completions(HFBackend("unused", model=model, tokenizer=TOKENIZER, device="cuda", decode="dynamic"), CASES[0])
    assert [d[0] for d in dynamic] == [g[0] for g in completions(graph, CASES[0])]


def test_static_decode_attention_equals_transformers_sdpa_with_repeated_kv_heads():
    # One query position: the query heads sharing a KV head become its queries (no repeat_kv copy).
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from prime_rl.inference.decode_steps import static_decode_attention

    g = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 7, True  # type: ignore[assignment]
    query = torch.randn(3, 14, 1, 16, generator=g, dtype=torch.float64)
    key, value = (torch.randn(3, 2, 40, 16, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.zeros(3, 1, 1, 40, dtype=torch.float64)
    mask[0, ..., :5] = mask[1, ..., 30:] = torch.finfo(torch.float64).min  # left padding, future columns
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    got, _ = static_decode_attention(module, query, key, value, mask, scaling=0.25)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_static_steps_attend_through_the_grouped_function_and_give_the_model_back():
    from prime_rl.inference import decode_steps

    model = make_tiny_lm(arch="qwen2").to(torch.float64)  # 4 query heads, 2 KV heads
    seen: list[tuple[int, ...]] = []
    original = decode_steps.static_decode_attention

    def spy(module, query, key, value, mask, *args, **kwargs):
        seen.append(tuple(query.shape))
        return original(module, query, key, value, mask, *args, **kwargs)

    decode_steps.static_decode_attention = spy  # what the registered name calls (looked up at call time)
    try:
        from transformers import AttentionInterface

        AttentionInterface.register(decode_steps.STATIC_DECODE_ATTENTION, spy)
        backend = HFBackend("unused", model=model, tokenizer=TOKENIZER, decode="static")
        backend.generate(encode(PROMPTS[:2]), [1, 2], SamplingParams(max_new_tokens=5))
    finally:
        AttentionInterface.register(decode_steps.STATIC_DECODE_ATTENTION, original)
        decode_steps.static_decode_attention = original
    assert seen and all(shape[2] == 1 for shape in seen)  # decode steps only: the prefill is SDPA's
    assert model.config._attn_implementation == "sdpa"  # the model's own attention is back


def test_a_model_asking_the_cache_for_more_than_update_decodes_with_the_dynamic_step():
    # An architecture whose forward calls another cache method fails at step 0, before the
    # prefill's cache is touched: the batch goes on with the dynamic step, same completions.
    model = make_tiny_lm().to(torch.float64)
    expected = completions(HFBackend("unused", model=model, tokenizer=TOKENIZER, decode="dynamic"), CASES[0])
    backend = HFBackend("unused", model=model, tokenizer=TOKENIZER, decode="static")
    decoder = backend._decoder

    def asks_for_the_length(**kwargs):
        kwargs["past_key_values"].get_seq_length()  # DynamicCache has it; the static buffers do not
        return decoder(**kwargs)

    backend._decoder = asks_for_the_length
    with pytest.warns(RuntimeWarning, match="fast decode step was given up"):
        assert completions(backend, CASES[0]) == expected
    assert backend.graph_error is not None and "get_seq_length" in backend.graph_error
