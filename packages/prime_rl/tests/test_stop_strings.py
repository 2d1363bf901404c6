"""The incremental stop-string check against the rule it replaces (the whole completion decoded
after every token, :func:`old_stop_index`): the same stopping token on random token sequences of
byte-level BPE, character and SentencePiece tokenizers, through ``HFBackend.generate`` too, and a
number of decoded tokens linear in the completion's length (prime_rl.inference.stop_strings)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_lm import make_byte_tokenizer, make_tiny_tokenizer
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from prime_rl.inference import backend as backend_module
from prime_rl.inference.backend import HFBackend, SamplingParams
from prime_rl.inference.contract import completion_text
from prime_rl.inference.stop_strings import StopStringMatcher

BYTE = make_byte_tokenizer()
CHARS = make_tiny_tokenizer()
# Characters whose UTF-8 the byte strategy splits into one token per byte.
SPLIT_CHARACTERS = ["a", "b", " ", ".", "é", "€", "😀", "中"]
# Stop strings that need no text to be drawn from: U+FFFD matches a character still incomplete.
FIXED_STOPS = ["\ufffd", "é", "€b", " a", "ab", "<think>", "<|im_end|>", "zz", ""]


def make_sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """Llama 2's decoder (``▁`` as space, byte fallback, the text's first space dropped) over a few
    words and the 256 byte tokens ``<0xNN>``; ``<s>``, ``</s>`` and ``<unk>`` are special."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for word in ["▁", "a", "b", "▁a", "▁b", "ab", "▁ab", ".", "▁.", "é"]:
        vocab[word] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    core.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


SENTENCEPIECE = make_sentencepiece_tokenizer()


def old_stop_index(tokenizer: Any, tokens: Sequence[int], stop: Sequence[str]) -> int | None:
    """The rule before: the first index whose prefix's whole decode contains a stop string."""
    for end in range(1, len(tokens) + 1):
        text = completion_text(tokenizer, tokens[:end])
        if any(s and s in text for s in stop):
            return end - 1
    return None


def matcher_stop_index(tokenizer: Any, tokens: Sequence[int], stop: Sequence[str]) -> int | None:
    matcher = StopStringMatcher(tokenizer, stop)
    for index, token in enumerate(tokens):
        if matcher.append(token):
            return index
    return None


def token_lists(tokenizer: Any) -> st.SearchStrategy[list[int]]:
    """Random ids; for the byte tokenizer also whole characters split into one token per byte."""
    any_id = st.integers(0, len(tokenizer) - 1).map(lambda i: [i])
    if tokenizer is not BYTE:
        elements = any_id
    else:
        elements = st.one_of(any_id, st.sampled_from(SPLIT_CHARACTERS).map(lambda c: list(c.encode())))
    return st.lists(elements, min_size=1, max_size=24).map(lambda runs: [i for run in runs for i in run])


@st.composite
def completions(draw: st.DrawFn, tokenizer: Any) -> tuple[list[int], list[str]]:
    """Tokens and 1-3 stop strings, most of them 1-4 characters taken from the tokens' own text."""
    tokens = draw(token_lists(tokenizer))
    text = completion_text(tokenizer, tokens)
    stops = []
    for _ in range(draw(st.integers(1, 3))):
        if text and draw(st.booleans()):
            start = draw(st.integers(0, len(text) - 1))
            stops.append(text[start : start + draw(st.integers(1, 4))])
        else:
            stops.append(draw(st.sampled_from(FIXED_STOPS)))
    return tokens, stops


@pytest.mark.parametrize("tokenizer", [BYTE, CHARS, SENTENCEPIECE], ids=["byte-bpe", "chars", "sentencepiece"])
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_the_matcher_stops_where_the_whole_decode_does(tokenizer: Any, data: st.DataObject) -> None:
    tokens, stop = data.draw(completions(tokenizer))
    assert matcher_stop_index(tokenizer, tokens, stop) == old_stop_index(tokenizer, tokens, stop)


def byte_ids(text: str) -> list[int]:
    """The byte tokenizer's ids of ``text``, one token per byte (ids 0-255 are the bytes)."""
    return list(text.encode())


def test_hand_cases_of_split_characters_and_special_tokens() -> None:
    end, think = BYTE.convert_tokens_to_ids(["<|im_end|>", "<think>"])
    e_acute = byte_ids("é")  # c3 a9: the first decodes to U+FFFD alone
    cases = [
        (byte_ids("a") + e_acute, ["é"], 2),  # the character exists once its last byte arrives
        (byte_ids("a") + e_acute, ["\ufffd"], 1),  # ... and its first byte alone is U+FFFD, as before
        ([*byte_ids("a"), end, *byte_ids("b")], ["ab"], 2),  # a skipped special token joins its neighbours
        ([*byte_ids("a"), end, *byte_ids("b")], ["<|im_end|>"], None),  # and never matches
        ([*byte_ids("a"), think, *byte_ids("b")], ["k>b"], 2),  # an added token is text
        (byte_ids("x€y"), ["€"], 3),
    ]
    for tokens, stop, expected in cases:
        assert old_stop_index(BYTE, tokens, stop) == expected, (tokens, stop)
        assert matcher_stop_index(BYTE, tokens, stop) == expected, (tokens, stop)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_tokenizer_that_cleans_up_spaces_is_checked_on_the_whole_text(data: st.DataObject) -> None:
    # "a n't" decodes to "an't": not local, so every step decodes the whole completion.
    tokenizer = make_tiny_tokenizer()
    tokenizer.clean_up_tokenization_spaces = True
    characters = st.sampled_from(list("an't. ,?")).map(lambda c: tokenizer.convert_tokens_to_ids(c))
    tokens = data.draw(st.lists(characters, min_size=1, max_size=16))
    stop = data.draw(st.lists(st.sampled_from(["an't", "a.", " .", "t.", ".", "n't"]), min_size=1, max_size=2))
    assert StopStringMatcher(tokenizer, stop).whole_decode
    assert matcher_stop_index(tokenizer, tokens, stop) == old_stop_index(tokenizer, tokens, stop)


class RewritingTokenizer:
    """The character tokenizer, except that decoding joins ``" ."`` into ``"."`` (a rewrite of the
    character before) without saying so through ``clean_up_tokenization_spaces``."""

    clean_up_tokenization_spaces = False

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(CHARS.decode(ids, skip_special_tokens=skip_special_tokens)).replace(" .", ".")


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_rewrite_inside_the_window_is_caught(data: st.DataObject) -> None:
    tokenizer = RewritingTokenizer()
    characters = st.sampled_from(list("a .b")).map(lambda c: CHARS.convert_tokens_to_ids(c))
    tokens = data.draw(st.lists(characters, min_size=1, max_size=16))
    stop = data.draw(st.lists(st.sampled_from(["a.", "a .", " .", "b.", ". "]), min_size=1, max_size=2))
    assert matcher_stop_index(tokenizer, tokens, stop) == old_stop_index(tokenizer, tokens, stop)


# -- through HFBackend.generate --------------------------------------------------------------------


class ScriptedLM(torch.nn.Module):
    """A stand-in causal LM for the decode loop's bookkeeping: every hidden state is zero, and the
    tokens come from a script (``sample_next`` replaced), so a 16k-token completion takes seconds."""

    def __init__(self, vocab_size: int, hidden_size: int = 16) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.head = torch.nn.Linear(hidden_size, vocab_size, bias=False)

    def get_decoder(self) -> Any:
        def decoder(input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
            return SimpleNamespace(last_hidden_state=torch.zeros((*input_ids.shape, self.hidden_size)))

        return decoder

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head


def scripted_backend(
    monkeypatch: pytest.MonkeyPatch, tokenizer: Any, script: list[list[int]], sync_every: int = 16
) -> HFBackend:
    """An HFBackend whose row ``i`` samples ``script[i]`` (padded with byte ``x``), one token a step."""
    width = max(len(row) for row in script)
    table = torch.tensor([row + byte_ids("x") * (width - len(row)) for row in script])
    monkeypatch.setattr(backend_module, "sample_next", lambda logits, seeds, position, t: table[:, position])
    return HFBackend("unused", model=ScriptedLM(len(BYTE)), tokenizer=tokenizer, sync_every=sync_every)


@pytest.mark.parametrize("sync_every", [1, 3, 16])
def test_generate_ends_each_row_where_the_whole_decode_does(monkeypatch: pytest.MonkeyPatch, sync_every) -> None:
    end = BYTE.convert_tokens_to_ids("<|im_end|>")
    script = [
        byte_ids("ab€c") + byte_ids("the end"),  # "€" arrives over three steps; the stop is "€c"
        [*byte_ids("a"), end, *byte_ids("bcc")],  # the special token is skipped: "ab" then "c"
        byte_ids("no stop here at all"),
        byte_ids("中文€c"),
    ]
    stop = ("€c", "abc")
    backend = scripted_backend(monkeypatch, BYTE, script, sync_every)
    prompts = [byte_ids("q")] * len(script)
    limit = max(len(row) for row in script)
    out = backend.generate(prompts, [0] * len(script), SamplingParams(max_new_tokens=limit, stop=stop))
    for row, completion in zip(script, out, strict=True):
        index = old_stop_index(BYTE, row, stop)
        if index is None:
            assert completion.finish_reason == "length" and list(completion.completion_tokens) == row
        else:
            assert completion.finish_reason == "stop"
            assert list(completion.completion_tokens) == row[: index + 1]
    assert [c.finish_reason for c in out] == ["stop", "stop", "length", "stop"]
    assert out[0].text == "ab€c" and out[1].text == "abc"


class DecodeCounter:
    """A tokenizer that counts the token ids it is asked to decode and fails past ``budget``
    (the old rule would decode ~n^2 / 2 ids: the test fails early instead of running for hours)."""

    def __init__(self, tokenizer: Any, budget: int) -> None:
        self.tokenizer, self.budget, self.decoded, self.calls = tokenizer, budget, 0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        self.decoded += len(ids)
        self.calls += 1
        assert self.decoded <= self.budget, f"decoded {self.decoded} token ids, over the budget of {self.budget}"
        return str(self.tokenizer.decode(ids, **kwargs))


def test_a_16k_token_completion_decodes_a_linear_number_of_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 16_384
    words = ["ab ", "€", "中文", "😀", "é", "the "]
    text = ""
    while len((text + "STOP").encode()) < n:
        text += words[len(text) % len(words)]
    row = (byte_ids(text) + byte_ids("STOP"))[-n:]  # one token a byte: every character split up
    counter = DecodeCounter(BYTE, budget=64 * n)
    backend = scripted_backend(monkeypatch, counter, [row])
    (out,) = backend.generate([byte_ids("q")], [0], SamplingParams(max_new_tokens=n + 8, stop=("STOP",)))
    assert out.finish_reason == "stop" and len(out.completion_tokens) == n  # the stop is the last token
    # Per step: the pending tokens with the window before them, and on a commit the new window
    # alone (4.4 ids a token on this script), plus one decode of all n for the completion's text.
    assert counter.decoded <= 8 * n, counter.decoded


@pytest.mark.parametrize("tokens", [[3, 35, 131], [3, 0, 35, 131]])
def test_a_byte_run_made_invalid_later_is_decoded_together(tokens: list[int]) -> None:
    # SentencePiece byte fallback: <0x00><0x20> is "\x00 " until <0x80> turns the whole run into
    # three U+FFFD (a skipped special token inside the run changes nothing). Found by hypothesis.
    assert completion_text(SENTENCEPIECE, tokens) == "\ufffd" * 3
    assert matcher_stop_index(SENTENCEPIECE, tokens, ["\ufffd" * 3]) == len(tokens) - 1
