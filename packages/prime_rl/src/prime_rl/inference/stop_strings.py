"""Where a completion meets a stop string, found in O(new tokens) per decode step.

The contract's rule (:mod:`prime_rl.inference.contract`): a completion ends at the first token
whose appending makes its text (:func:`~prime_rl.inference.contract.completion_text`: the tokens
decoded with ``skip_special_tokens=True``) contain a stop string. Decoding the whole completion
after every token costs O(n) per token and O(n^2) per completion; :class:`StopStringMatcher`
gives the same answer at every token while decoding only the last few tokens.

It keeps the text in two parts, as the incremental detokenizers of vLLM and HF TGI do. The
*committed* text is final: a later token cannot change it. The *pending* text belongs to the tokens
after the last commit; it may end in U+FFFD (a byte-level BPE token can end inside a multi-byte
UTF-8 character, and decoding it alone gives the replacement character until the next token
completes it), so it is decoded again at every step until it ends in a whole character, then
committed. Pending text is decoded after a *window*, the tokens committed last (decode
``window + pending`` minus decode ``window``), so that a decoding which treats a text's first token
differently (SentencePiece drops its leading space) does so to the window, as the whole decode
does to the completion's first token, and never to the pending tokens.

Every step checks the stop strings against the last ``max(len(stop)) - 1`` committed characters
plus the pending text: all committed text was part of the previous step's text, which held no
stop string (else the completion would have ended there), so a new occurrence ends in the pending
text.

Pitfall: exact as long as decoding is *local*: decoding the window plus the pending tokens starts
with the window's own decoding and continues with the characters the whole decode has there
(true of byte-level BPE, of character and SentencePiece tokenizers, with special tokens skipped).
``clean_up_tokenization_spaces`` is not local (it turns ``"a n't"`` into ``"an't"``, three
characters back): a tokenizer whose configuration turns it on (it is off by default in
transformers 5 and for Qwen2's tokenizer) is checked the old way, the whole completion decoded at
every token. SentencePiece's byte fallback decodes a run of byte tokens (``<0x80>``) together and,
if the run is not valid UTF-8, turns *every* byte of it into U+FFFD (``<0x00><0x20>`` is
``"\x00 "`` until ``<0x80>`` makes it three U+FFFD): the window therefore always reaches back to
the start of the run of byte tokens it ends in. Any other decoding that rewrites committed text
inside the window is caught and answered with one whole decode, after which the matcher goes on
from there; a rewrite further back would not be.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

from prime_rl.inference.contract import completion_text

__all__ = ["StopStringMatcher"]

REPLACEMENT = "\ufffd"
"""What a decode gives for bytes that are not (yet) a whole UTF-8 character."""


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@functools.lru_cache(maxsize=8)
def byte_run_ids(tokenizer: Any) -> frozenset[int]:
    """Ids a run of SentencePiece byte-fallback tokens (``<0x00>`` ... ``<0xFF>``) is decoded across:
    those tokens and the special tokens that decoding skips. Empty for a tokenizer without them."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    ids = {i for token, i in vocab.items() if _BYTE_TOKEN.fullmatch(token)}
    return frozenset(ids | set(getattr(tokenizer, "all_special_ids", ()))) if ids else frozenset()


class StopStringMatcher:
    """One completion's stop-string check: :meth:`append` each token, in order, as it is sampled.

    ``append`` returns True at the first token whose appending makes
    ``completion_text(tokenizer, tokens)`` contain one of ``stop`` (empty strings never match),
    exactly as ``any(s in completion_text(tokenizer, tokens) for s in stop if s)`` would after every
    token. Cost per token: decoding the tokens appended since the last whole character plus the
    window before them (one to a few tokens), and scanning ``max(len(stop)) - 1`` characters more.

    Pitfall: a run of tokens that never completes a character (invalid bytes that all decode to
    U+FFFD) stays pending and is decoded again at every step, as long as the run lasts; with a
    tokenizer that cleans up spaces every step decodes the whole completion (module docstring).
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.overlap = max((len(s) for s in self.stop), default=1) - 1
        """How many committed characters a stop string ending in the pending text can reach back."""
        self.whole_decode = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
        self._byte_run = byte_run_ids(tokenizer)
        """Decode the whole completion at every token: the tokenizer's decoding is not local."""
        self.tokens: list[int] = []
        self._window_start = 0  # the first token of the decode window
        self._read = 0  # tokens before it are committed; those from it on are pending
        self._window_text = ""  # the decode of tokens[_window_start:_read]
        self._recent = ""  # the last `overlap` characters of the committed text

    def _decode_from(self, start: int) -> str:
        return completion_text(self.tokenizer, self.tokens[start:])

    def append(self, token: int) -> bool:
        """Add the completion's next token; True when the text now contains a stop string."""
        self.tokens.append(int(token))
        if self.whole_decode:
            text = self._decode_from(0)
            return any(s in text for s in self.stop)
        text = self._decode_from(self._window_start)
        if not text.startswith(self._window_text):
            # This decoding rewrote committed characters: go back to the whole decode once.
            self._window_start = self._read = 0
            self._window_text = self._recent = ""
            text = self._decode_from(0)
        pending = text[len(self._window_text) :]
        matched = any(s in self._recent + pending for s in self.stop)
        if pending and not pending.endswith(REPLACEMENT):
            self._commit(pending)
        return matched

    def _commit(self, pending: str) -> None:
        """Make the pending text final; the tokens just committed become the next window."""
        recent = self._recent + pending
        self._recent = recent[-self.overlap :] if self.overlap else ""
        start = self._read
        while start > 0 and self.tokens[start - 1] in self._byte_run and self.tokens[start] in self._byte_run:
            start -= 1  # the run of byte tokens the window starts in is decoded together (module docstring)
        self._window_start, self._read = start, len(self.tokens)
        self._window_text = self._decode_from(self._window_start)
