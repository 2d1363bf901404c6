"""A tiny causal LM and tokenizer built entirely in code, so no test needs a model hub.

The tokenizer is character level over printable ASCII (plus `<pad>`, `<s>`, `</s>`),
which suits the arithmetic tasks of the demo and keeps token ids predictable.
``make_byte_tokenizer`` is a byte-level BPE one (Qwen2's kind) whose tokens split multi-byte
UTF-8 characters, for the code that must decode such tokens one at a time.
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


BYTE_TOKENIZER_SPECIALS = ["<|im_end|>", "<|endoftext|>"]
BYTE_TOKENIZER_ADDED = ["<think>"]  # an added token that is not special: decoding keeps it
MULTIBYTE_TEXTS = ["é", "€", "😀", "中文", " the", "ab"]


def make_byte_tokenizer() -> PreTrainedTokenizerFast:
    """A Qwen2 (byte-level BPE) tokenizer made in code, for decoding only (no merges).

    Ids 0-255 are the single bytes; then every byte string inside the UTF-8 of
    :data:`MULTIBYTE_TEXTS` (so ``"€"`` is also ``e2``, ``e2 82``, ``82 ac``, ...) and two tokens
    that hold a whole character and part of another (``"a"`` + the first byte of ``"é"``, the last
byte of ``"€"`` + ``"b"``); then the
    special tokens :data:`BYTE_TOKENIZER_SPECIALS` and the added token ``<think>``.
    """
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    pieces = [bytes([b]) for b in range(256)]
    extra = {b"a" + "é".encode()[:1], "€".encode()[2:] + b"b"}
    for text in MULTIBYTE_TEXTS:
        data = text.encode()
        extra |= {data[i:j] for i in range(len(data)) for j in range(i + 1, len(data) + 1)}
    pieces += sorted(extra - set(pieces))
    as_text = bytes_to_unicode()
    vocab = {"".join(as_text[b] for b in piece): i for i, piece in enumerate(pieces)}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=[], unk_token=None, bos_token=None, eos_token=None, pad_token=None
    )
    tokenizer.add_special_tokens({"additional_special_tokens": BYTE_TOKENIZER_SPECIALS})
    tokenizer.add_tokens(BYTE_TOKENIZER_ADDED)
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
