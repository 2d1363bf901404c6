"""A tiny causal LM and tokenizer built entirely in code, so no test needs a model hub.

The tokenizer is character level over printable ASCII (plus `<pad>`, `<s>`, `</s>`),
which suits the arithmetic tasks of the demo and keeps token ids predictable.
The model is a 2-layer Llama (or Qwen2) with random weights from a fixed seed.

Used by the root ``conftest.py`` fixtures and importable directly by scripts that
need the same model in a subprocess (``save_tiny_lm(path)`` writes a checkpoint
directory that ``transformers.AutoModelForCausalLM.from_pretrained`` loads).
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]
CHARACTERS = sorted(set(string.printable) - set("\x0b\x0c\r"))


def make_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level fast tokenizer: one id per printable ASCII character."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    # Split every character (whitespace included) into its own token.
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()  # tokens are characters: join them back without spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.padding_side = "left"  # generation pads on the left
    return tokenizer


def make_tiny_lm(
    *,
    arch: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    tie_word_embeddings: bool = False,
) -> PreTrainedModel:
    """A 2-layer causal LM with random weights drawn from ``seed`` (``tie_word_embeddings``: the
    output head shares the input embedding, as in SmolLM2)."""
    vocab_size = len(SPECIAL_TOKENS) + len(CHARACTERS)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=tie_word_embeddings,
    )
    config = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config) if arch == "llama" else Qwen2ForCausalLM(config)
    return model.to(dtype).eval()


def save_tiny_lm(path: str | Path, **kwargs: object) -> Path:
    """Write model + tokenizer to ``path`` (a from_pretrained-loadable directory)."""
    path = Path(path)
    make_tiny_lm(**kwargs).save_pretrained(path)  # type: ignore[arg-type]
    make_tiny_tokenizer().save_pretrained(path)
    return path
