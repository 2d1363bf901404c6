"""The HF decode loop's steps (``HFBackend(decode=...)``, :mod:`prime_rl.inference.backend`).

A step feeds one token per row to the decoder and returns the hidden state the next token is
sampled from. :class:`DynamicStep` grows transformers' ``DynamicCache``; :class:`StaticStep`
writes into buffers sized for the whole completion, so every step has the same shapes and
addresses and can be replayed as one CUDA graph; :func:`decode_attention` switches an SDPA model
to :func:`static_decode_attention` (no ``repeat_kv``) while a batch decodes with static steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = [
    "STATIC_DECODE_ATTENTION",
    "DynamicStep",
    "StaticKV",
    "StaticStep",
    "decode_attention",
    "static_decode_attention",
]


STATIC_DECODE_ATTENTION = "prime_rl_static_decode"
"""The name :func:`static_decode_attention` is registered under with transformers' AttentionInterface."""


def static_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """One decode step's attention over the static buffers, without ``repeat_kv``.

    transformers' SDPA path copies every KV head ``Hq / Hkv`` times whenever a mask is given on
    CUDA (7x the KV bytes for Qwen2, every layer, every step). With one query position, the
    ``Hq / Hkv`` query heads that share a KV head are laid out as that head's queries instead:
    ``query [B, Hq, 1, D] -> [B, Hkv, Hq / Hkv, D]`` against ``key [B, Hkv, L, D]`` under the mask
    ``[B, 1, 1, L]`` (broadcast). Same attention (query head ``i`` reads KV head ``i // (Hq / Hkv)``,
    as ``repeat_kv`` lays them out). Anything else (a prefill) goes to transformers' SDPA function.
    """
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    if length != 1 or attention_mask is None or attention_mask.dim() != 4 or heads % kv_heads:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, 1, heads, dim), None  # [B, L, H, D], as transformers' attention functions


class DynamicStep:
    """One decode step over transformers' ``DynamicCache``: the prefill's cache grows by a column.

    ``step(tokens, t)`` feeds ``tokens [B]`` (sampled at completion position ``t``) and returns
    the last hidden state ``[B, H]`` that the token at position ``t + 1`` is sampled from.
    """

    def __init__(
        self, decoder: Any, prompt_mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache, limit: int
    ) -> None:
        batch, self.width = prompt_mask.shape
        self.decoder, self.cache = decoder, cache
        # One column per decode step, filled in advance: step t attends to width + t + 1 columns.
        self.mask = torch.ones((batch, self.width + limit), dtype=prompt_mask.dtype, device=prompt_mask.device)
        self.mask[:, : self.width] = prompt_mask
        self.positions = positions[:, -1:] + 1 + torch.arange(limit, device=prompt_mask.device)

    def __call__(self, tokens: torch.Tensor, step: int) -> torch.Tensor:
        return self.decoder(
            input_ids=tokens.unsqueeze(-1),
            attention_mask=self.mask[:, : self.width + step + 1],
            position_ids=self.positions[:, step : step + 1],
            past_key_values=self.cache,
            use_cache=True,
        ).last_hidden_state[:, -1]


class StaticKV:
    """Per layer, KV buffers ``[B, Hkv, width + limit, D]`` written in place at column ``column``
    (a one-element device tensor): the only cache method transformers' attention layers call."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], column: torch.Tensor) -> None:
        self.keys, self.values, self.column = keys, values, column

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys[layer_idx].index_copy_(2, self.column, key_states)
        self.values[layer_idx].index_copy_(2, self.column, value_states)
        return self.keys[layer_idx], self.values[layer_idx]


class StaticStep:
    """One decode step with fixed shapes and addresses, optionally replayed as a CUDA graph.

    The prefill's ``DynamicCache`` is copied once into :class:`StaticKV` buffers holding the whole
    completion. Each step attends to all ``width + limit`` columns under an additive 4D mask
    ``[B, 1, 1, width + limit]`` whose columns open one per step; the step's column, positions and
    mask update are tensor operations on the device, driven by ``column``, so the step is the
    same sequence of kernels every time. Calls must be consecutive steps from 0 (the column
    advances on the device; ``step`` is not read).

    With ``use_graph``, step 0 runs eagerly on a side stream (warming up cuBLAS and the attention
    kernels for these shapes), then the step is captured once and every later step replays it.

    A model whose forward asks the cache for more than ``update`` (an architecture this step was
    not written for) fails at step 0, before the prefill's cache is touched: the batch then decodes
    with :class:`DynamicStep` from that cache, and ``on_error`` hears why. Once step 0 has run,
    the prefill's cache is let go: its copy in the static buffers is the one in use.
    """

    def __init__(
        self,
        decoder: Any,
        prompt_mask: torch.Tensor,
        positions: torch.Tensor,
        cache: DynamicCache,
        limit: int,
        dtype: torch.dtype,
        *,
        use_graph: bool,
        on_error: Callable[[str], None],
    ) -> None:
        batch, self.width = prompt_mask.shape
        device, total = prompt_mask.device, self.width + limit
        self.decoder = decoder
        # What a fallback to DynamicStep needs, until step 0 has run.
        self.dynamic: tuple[torch.Tensor, torch.Tensor, DynamicCache, int] | None = (prompt_mask, positions, cache, limit)
        self.fallback: DynamicStep | None = None
        self.column = torch.full((1,), self.width, dtype=torch.long, device=device)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for layer in cache.layers:
            prefill: Any = layer  # a DynamicLayer: keys and values [B, Hkv, width, D]
            for prefilled, out in ((prefill.keys, keys), (prefill.values, values)):
                buffer = prefilled.new_zeros(prefilled.shape[0], prefilled.shape[1], total, prefilled.shape[3])
                buffer[:, :, : self.width] = prefilled
                out.append(buffer)
        self.kv = StaticKV(keys, values, self.column)
        self.mask = torch.full((batch, 1, 1, total), torch.finfo(dtype).min, dtype=dtype, device=device)
        self.mask[:, 0, 0, : self.width].masked_fill_(prompt_mask.bool(), 0.0)
        self.next_position = positions[:, -1:] + 1  # [B, 1]: the position of completion token 0
        self.tokens = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.hidden = torch.empty(0, dtype=dtype, device=device)  # sized by the first step
        self.use_graph = use_graph
        self.on_error = on_error  # called with why the graph, or the static step itself, was given up
        self.graph: torch.cuda.CUDAGraph | None = None

    def _run(self) -> None:
        self.mask.index_fill_(3, self.column, 0.0)
        position = self.next_position + (self.column - self.width)
        hidden = self.decoder(
            input_ids=self.tokens,
            attention_mask=self.mask,
            position_ids=position,
            past_key_values=self.kv,
            use_cache=True,
        ).last_hidden_state[:, -1]
        if self.hidden.shape != hidden.shape:  # first run: the output buffer takes the step's shape
            self.hidden = torch.empty_like(hidden)
        self.hidden.copy_(hidden)
        self.column.add_(1)

    def __call__(self, tokens: torch.Tensor, step: int) -> torch.Tensor:
        if self.fallback is not None:
            return self.fallback(tokens, step)
        self.tokens.copy_(tokens.view(-1, 1))
        if self.graph is not None:
            self.graph.replay()
        elif self.dynamic is not None:  # step 0
            try:
                self._warm_up_and_capture() if self.use_graph else self._run()
            except (AttributeError, TypeError, NotImplementedError) as exc:  # the cache's interface
                self.on_error(f"static decode step: {type(exc).__name__}: {str(exc)[:300]}")
                self.fallback = DynamicStep(self.decoder, *self.dynamic)
                return self.fallback(tokens, step)
            self.dynamic = None  # the prefill's cache (a second copy of the prompts' KV) can go
        else:
            self._run()
        return self.hidden

    def _warm_up_and_capture(self) -> None:
        device = self.tokens.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self._run()  # step 0, for real: it also warms up the kernels for these shapes
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self._run()  # recorded, not run: the state stays as step 0 left it
        except Exception as exc:  # an operation that cannot be captured: keep the eager static step
            torch.cuda.synchronize(device)
            self.use_graph = False
            self.on_error(f"{type(exc).__name__}: {str(exc)[:300]}")
            return
        self.graph = graph


@contextmanager
def decode_attention(model: Any, step: DynamicStep | StaticStep) -> Iterator[None]:
    """Static steps of an SDPA model attend through :func:`static_decode_attention` (no
    ``repeat_kv``); the model's own attention is back when the batch is decoded.

    Pitfall: the switch is the model's (transformers reads the name from its config at every
    forward): a second backend sharing this model must not run a forward meanwhile.
    """
    config = getattr(model, "config", None)
    if not isinstance(step, StaticStep) or getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    if STATIC_DECODE_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(STATIC_DECODE_ATTENTION, static_decode_attention)
    if STATIC_DECODE_ATTENTION not in AttentionMaskInterface._global_mapping:
        # SDPA's masks for it: a forward it meets that is not a static step (a fallback to the
        # dynamic step) gets the mask SDPA would (transformers builds none for unknown names).
        AttentionMaskInterface.register(STATIC_DECODE_ATTENTION, sdpa_mask)
    model.set_attn_implementation(STATIC_DECODE_ATTENTION)
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")
