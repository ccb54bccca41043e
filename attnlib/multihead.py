"""Multi-head self-attention as one readable ``nn.Module``.

Shapes follow the legend in :mod:`attnlib`. ``H_kv = H`` is classic multi-head attention,
``1 < H_kv < H`` grouped-query attention, ``H_kv = 1`` multi-query attention.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _checks
from .core import scaled_dot_product_attention
from .heads import merge_heads, repeat_kv, split_heads
from .kv_cache import KVCache
from .masks import _key_mask, causal_mask, combine_masks

__all__ = ["AttentionOutput", "MultiHeadSelfAttention"]


class AttentionOutput(NamedTuple):
    """The two results of one :class:`MultiHeadSelfAttention` call.

    Attributes:
        hidden_states: ``[B, S, D]``: per position, what its heads gathered, mixed by ``w_o``.
        attention_weights: ``[B, H, S, S_k]``, every head's weights of every query over the keys,
            a copy to inspect (``hidden_states`` is computed without reading it), or ``None`` after
            ``need_weights=False``. ``S_k = S`` without a cache, else every key attended over.

    >>> out = MultiHeadSelfAttention(8, 2)(torch.randn(1, 3, 8), need_weights=False)
    >>> out.hidden_states.shape, out.attention_weights
    (torch.Size([1, 3, 8]), None)
    """

    hidden_states: Tensor
    attention_weights: Tensor | None


class MultiHeadSelfAttention(nn.Module):
    """Multi-head self-attention: project, split into heads, attend, merge, project.

    Args:
        d_model: ``D``, the width of every token vector.
        num_heads: ``H``, the number of query heads; ``D`` must be divisible by ``H``.
        bias: whether the four projections have a bias term.
        num_kv_heads: ``H_kv``, the number of key/value heads (default ``H``). ``H`` must be a
            multiple of it. Fewer key/value heads shrink ``w_k``/``w_v`` and the KV cache.
        window: if set, a causal query sees only the last ``window`` positions, itself included
            (sliding-window attention as in Mistral 7B); a cache then keeps only those.

    Layers: ``w_q``, ``w_o``: ``nn.Linear(D, D)``; ``w_k``, ``w_v``: ``nn.Linear(D, H_kv * D_k)``. No dropout.

    >>> layer = MultiHeadSelfAttention(d_model=16, num_heads=4, num_kv_heads=2)
    >>> out = layer(torch.randn(2, 5, 16), torch.tensor([[1, 1, 1, 0, 0], [1] * 5]), causal=True)
    >>> out.hidden_states.shape, out.attention_weights.shape
    (torch.Size([2, 5, 16]), torch.Size([2, 4, 5, 5]))
    """

    def __init__(
        self, d_model: int, num_heads: int, *, bias: bool = True, num_kv_heads: int | None = None, window: int | None = None
    ) -> None:
        super().__init__()
        d_model, num_heads, num_kv_heads = _checks.head_counts(d_model, num_heads, num_kv_heads)
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.d_k = d_model // num_heads
        self.window = None if window is None else _checks.positive_int("window", window)
        self.w_q = nn.Linear(d_model, d_model, bias=bias)  # [D] -> [H * D_k]
        self.w_k = nn.Linear(d_model, num_kv_heads * self.d_k, bias=bias)  # [D] -> [H_kv * D_k]
        self.w_v = nn.Linear(d_model, num_kv_heads * self.d_k, bias=bias)  # [D] -> [H_kv * D_k]
        self.w_o = nn.Linear(d_model, d_model, bias=bias)  # [H * D_k] -> [D]

    def extra_repr(self) -> str:
        window = "" if self.window is None else f", window={self.window}"
        return f"d_model={self.d_model}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, d_k={self.d_k}{window}"

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None = None,
        *,
        causal: bool = False,
        need_weights: bool = True,
        cache: KVCache | None = None,
    ) -> AttentionOutput:
        """Let every position gather information from the positions it may see.

        Args:
            hidden_states: ``[B, S, D]`` token vectors; queries, keys and values all come from it.
            attention_mask: optional ``[B, S]`` (with a cache ``[B, cache.length + S]``, every position
                so far), 1 (or True) for a real token, 0 for padding, as in Hugging Face;
                ``nn.MultiheadAttention``'s ``key_padding_mask`` (True = ignore) must be passed as
                ``~key_padding_mask``. A sequence with no real token gets a UserWarning.
            causal: if True, position ``i`` sees only positions ``0..i`` (decoder style).
            need_weights: if False, run PyTorch's fused ``scaled_dot_product_attention`` (faster,
                less memory) and return ``attention_weights=None``.
            cache: a :class:`attnlib.KVCache` of this layer: the new keys and values (``H_kv``
                heads, never the repeated ``H``) are appended, and the new queries attend over
                every cached position, aligned bottom-right (the last query sees every key).

        Returns:
            :class:`AttentionOutput` with ``hidden_states [B, S, D]`` and
            ``attention_weights [B, H, S, S_k]`` (or ``None``); ``S_k = S`` without a cache,
            ``S_cached + S`` with one, where a window's cache holds at most ``window`` earlier
            positions: older columns (all zero) are not returned. Both paths give the same result,
            also for ``B = 0`` or ``S = 0`` and for fully masked rows (zero attention output).

        >>> layer, cache = MultiHeadSelfAttention(16, 4, num_kv_heads=2), KVCache()
        >>> prefill = layer(torch.randn(1, 5, 16), causal=True, cache=cache)
        >>> step = layer(torch.randn(1, 1, 16), causal=True, cache=cache)  # one new token
        >>> step.attention_weights.shape, cache.keys.shape  # [B, H, 1, 6], [B, H_kv, 6, D_k]
        (torch.Size([1, 4, 1, 6]), torch.Size([1, 2, 6, 4]))
        """
        if cache is not None:
            _checks.instance("cache", cache, KVCache, "an attnlib.KVCache")
        past, kept = (0, 0) if cache is None else cache.held_by(self)  # positions seen, still cached
        x = _checks.module_inputs(hidden_states, attention_mask, self.d_model, self.w_q.weight, past)
        S = x.shape[1]
        mask = scores_mask(attention_mask, S, past, kept + S, causal, self.window, x.device)  # [B, 1, S, S_k] or less

        q = split_heads(self.w_q(x), self.num_heads)  # [B, H, S, D_k]
        k = split_heads(self.w_k(x), self.num_kv_heads)  # [B, H_kv, S, D_k]
        v = split_heads(self.w_v(x), self.num_kv_heads)  # [B, H_kv, S, D_k]
        if cache is not None:
            k, v = cache.update(k, v, window=self.window, owner=self)  # [B, H_kv, S_k, D_k], S_k = S_kept + S

        if need_weights:
            k, v = repeat_kv(k, self.num_heads), repeat_kv(v, self.num_heads)  # [B, H, S_k, D_k] each
            context, weights = scaled_dot_product_attention(q, k, v, mask)  # [B, H, S, D_k], [B, H, S, S_k]
        else:
            # plain causal (no padding, cache or window): is_causal=True, since on CUDA an explicit mask rules out
            # the flash backend; otherwise a bottom-right mask (is_causal=True would align top-left when S != S_k)
            is_causal = causal and attention_mask is None and self.window is None and k.shape[-2] == S
            mask = None if is_causal else mask
            gqa = self.num_kv_heads != self.num_heads  # SDPA shares each key/value head without copying it
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=gqa)  # [B, H, S, D_k]
            if mask is not None:  # a query that sees no key gets 0 as above (torch 2.1 CUDA gave NaN: pytorch#110213)
                context = context.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
            weights = None

        merged = merge_heads(context)  # [B, S, D]
        return AttentionOutput(hidden_states=self.w_o(merged), attention_weights=weights)

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> "MultiHeadSelfAttention":
        """Copy the weights of a ``torch.nn.MultiheadAttention`` into a new module.

        The copy computes the same function, batch first (``[B, S, D]``; PyTorch's default
        ``batch_first=False`` means ``[S, B, D]``). Dropout is not copied: compare in ``eval()``.
        ``kdim``/``vdim``, ``add_bias_kv`` and ``add_zero_attn`` raise ``ValueError``.

        >>> MultiHeadSelfAttention.from_torch(nn.MultiheadAttention(16, 4, batch_first=True)).w_k
        Linear(in_features=16, out_features=16, bias=True)
        """
        if not isinstance(m, nn.MultiheadAttention):
            raise ValueError(f"from_torch expects torch.nn.MultiheadAttention, got {type(m).__name__}")
        if not m._qkv_same_embed_dim:
            raise ValueError(f"kdim/vdim ({m.kdim}, {m.vdim}) differ from embed_dim {m.embed_dim}; not supported")
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn are not supported")
        bias = m.in_proj_bias is not None
        out = cls(m.embed_dim, m.num_heads, bias=bias)
        out = out.to(device=m.in_proj_weight.device, dtype=m.in_proj_weight.dtype)
        D = m.embed_dim
        with torch.no_grad():
            for i, layer in enumerate((out.w_q, out.w_k, out.w_v)):
                layer.weight.copy_(m.in_proj_weight[i * D : (i + 1) * D])  # rows of the packed [3D, D]
                if bias:
                    layer.bias.copy_(m.in_proj_bias[i * D : (i + 1) * D])
            out.w_o.weight.copy_(m.out_proj.weight)
            if bias:
                out.w_o.bias.copy_(m.out_proj.bias)
        return out


def scores_mask(
    attention_mask: Tensor | None, S: int, past: int, S_k: int, causal: bool, window: int | None, device: torch.device
) -> Tensor | None:
    """The bool mask for scores ``[B, H, S, S_k]`` (True = may attend), or None for no mask.

    The ``S`` queries are the last of ``past + S`` positions; the ``S_k`` keys are the last ``S_k``.
    """
    causal = _checks.flag("causal", causal, "; pass masks as attention_mask")
    if window is not None and not causal:
        raise ValueError(f"a sliding window (window = {window}) needs causal=True")
    # an empty sequence warns (an inverted mask?) on a whole prompt, not while left padding is fed token by token
    pad = None if attention_mask is None else _key_mask(attention_mask[:, past + S - S_k :], warn=past == 0 and S > 1)
    sees_all = S == 1 and (window is None or window >= S_k)  # one decoded token sees every cached key: no mask
    future = causal_mask(S, device=device, S_k=S_k, window=window) if causal and not sees_all else None  # [S, S_k]
    return combine_masks(pad, future)  # [B, 1, S, S_k], [B, 1, 1, S_k], [S, S_k] or None
