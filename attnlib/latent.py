"""Multi-head latent attention (MLA, DeepSeek-V2): cache one small latent per token, not K and V.

Each position is compressed to a latent ``c = x W_dkv`` of width ``L = latent_dim``; keys and
values are up-projections of it, ``k_h = c W_uk_h`` and ``v_h = c W_uv_h`` per head. Only ``c``
is cached: ``L`` numbers per token and layer instead of ``2 H D_k``.

Two equal ways to attend (tests pin that they agree):

* **decompress** (readable): rebuild ``k`` and ``v`` ``[B, H, S_k, D_k]`` from every cached
  latent, then attend as usual.
* **absorbed** (decoding): ``q_h . (c W_uk_h) = (q_h W_uk_h^T) . c``, so the query is mapped
  into latent space once and scores are taken against the cached latents directly; likewise
  ``sum_j w_j c_j W_uv_h = (sum_j w_j c_j) W_uv_h`` moves the value up-projection after the
  weighted sum. Attention then runs as multi-query attention with one key head that is also
  the value head, of width ``L``. ``W_uk``/``W_uv`` could be multiplied into ``w_q``/``w_o``
  once ahead of time; applying them per head, as here, costs fewer FLOPs when ``L > D_k``.

Left out from DeepSeek-V2: the compression of the queries, the RMSNorm on the latent, and the
decoupled rotary part (a separate ``64``-wide RoPE key shared by all heads, cached next to the
latent, because a rotation between ``W_uk`` and the query would block the absorption). This
module has no position encoding inside attention, so it needs no such part.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _checks
from .core import scaled_dot_product_attention
from .heads import merge_heads, split_heads
from .kv_cache import KVCache
from .multihead import AttentionOutput, scores_mask

__all__ = ["MultiHeadLatentAttention"]


class MultiHeadLatentAttention(nn.Module):
    """Multi-head attention whose keys and values are decompressed from a cached latent.

    Args:
        d_model: ``D``; ``num_heads``: ``H`` (``D_k = D // H``).
        latent_dim: ``L``, the width of the cached latent (DeepSeek-V2: 512 with ``D = 5120``).
        bias: whether ``w_q``, ``w_dkv`` and ``w_o`` have a bias (the up-projections have none).

    Layers: ``w_q`` ``[D] -> [H D_k]``, ``w_dkv`` ``[D] -> [L]``, ``w_uk``, ``w_uv`` ``[L] -> [H D_k]``,
    ``w_o`` ``[H D_k] -> [D]``.

    >>> mla, cache = MultiHeadLatentAttention(32, 4, latent_dim=8), KVCache()
    >>> out = mla(torch.randn(2, 5, 32), causal=True, cache=cache)
    >>> out.attention_weights.shape, cache.keys.shape, cache.values  # latents [B, 1, S, L] only
    (torch.Size([2, 4, 5, 5]), torch.Size([2, 1, 5, 8]), None)
    """

    def __init__(self, d_model: int, num_heads: int, *, latent_dim: int, bias: bool = True) -> None:
        super().__init__()
        d_model, num_heads, _ = _checks.head_counts(d_model, num_heads)
        self.d_model, self.num_heads, self.d_k = d_model, num_heads, d_model // num_heads
        self.latent_dim = _checks.positive_int("latent_dim", latent_dim)
        self.w_q = nn.Linear(d_model, d_model, bias=bias)  # [D] -> [H * D_k]
        self.w_dkv = nn.Linear(d_model, latent_dim, bias=bias)  # [D] -> [L], down-projection
        self.w_uk = nn.Linear(latent_dim, d_model, bias=False)  # [L] -> [H * D_k], key up-projection
        self.w_uv = nn.Linear(latent_dim, d_model, bias=False)  # [L] -> [H * D_k], value up-projection
        self.w_o = nn.Linear(d_model, d_model, bias=bias)  # [H * D_k] -> [D]

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, latent_dim={self.latent_dim}"

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None = None,
        *,
        causal: bool = False,
        need_weights: bool = True,
        cache: KVCache | None = None,
        absorbed: bool = False,
    ) -> AttentionOutput:
        """Same contract as :meth:`attnlib.MultiHeadSelfAttention.forward`; the cache holds latents.

        Args:
            absorbed: attend against the latents directly (the decode path) instead of
                decompressing keys and values; both give the same result to float tolerance.

        >>> mla, x = MultiHeadLatentAttention(32, 4, latent_dim=8), torch.randn(1, 6, 32)
        >>> a, b = mla(x, causal=True), mla(x, causal=True, absorbed=True)
        >>> torch.allclose(a.hidden_states, b.hidden_states, atol=1e-6), b.attention_weights.shape
        (True, torch.Size([1, 4, 6, 6]))
        """
        if cache is not None:
            _checks.instance("cache", cache, KVCache, "an attnlib.KVCache")
        past, kept = (0, 0) if cache is None else cache.held_by(self)  # positions seen, still cached
        x = _checks.module_inputs(hidden_states, attention_mask, self.d_model, self.w_q.weight, past)
        S = x.shape[1]
        mask = scores_mask(attention_mask, S, past, kept + S, causal, None, x.device)  # [B, 1, S, S_k] or less

        q = split_heads(self.w_q(x), self.num_heads)  # [B, H, S, D_k]
        latents = self.w_dkv(x)[:, None]  # [B, 1, S, L]: one "head" shared by all
        if cache is not None:
            (latents,) = cache.update(latents, owner=self)  # [B, 1, S_k, L]
        if absorbed:
            context, weights = self._absorbed(q, latents, mask, need_weights)
        else:
            context, weights = self._decompressed(q, latents[:, 0], mask, need_weights)
        if not need_weights and mask is not None:  # a query that sees no key gets 0, as on the explicit path
            context = context.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        return AttentionOutput(hidden_states=self.w_o(merge_heads(context)), attention_weights=weights)

    def _decompressed(self, q: Tensor, latents: Tensor, mask: Tensor | None, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        k = split_heads(self.w_uk(latents), self.num_heads)  # [B, H, S_k, D_k]
        v = split_heads(self.w_uv(latents), self.num_heads)  # [B, H, S_k, D_k]
        if need_weights:
            return scaled_dot_product_attention(q, k, v, mask)  # [B, H, S, D_k], [B, H, S, S_k]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None  # [B, H, S, D_k]

    def _absorbed(self, q: Tensor, latents: Tensor, mask: Tensor | None, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        H, D_k, L = self.num_heads, self.d_k, self.latent_dim
        w_uk = self.w_uk.weight.view(H, D_k, L)  # k_h = c @ w_uk[h].T
        w_uv = self.w_uv.weight.view(H, D_k, L)  # v_h = c @ w_uv[h].T
        q_latent = q @ w_uk  # [B, H, S, D_k] @ [H, D_k, L] -> [B, H, S, L]
        scale = 1.0 / math.sqrt(D_k)  # the scale of the decompressed keys, not 1 / sqrt(L)
        c = latents.expand(-1, H, -1, -1)  # [B, H, S_k, L], a view: every head reads the same latents
        if need_weights:
            context_latent, weights = scaled_dot_product_attention(q_latent, c, c, mask, scale=scale)
        else:
            context_latent = F.scaled_dot_product_attention(q_latent, c, c, attn_mask=mask, scale=scale)
            weights = None  # context_latent: [B, H, S, L], weights: [B, H, S, S_k]
        return context_latent @ w_uv.transpose(-2, -1), weights  # [B, H, S, L] @ [H, L, D_k] -> [B, H, S, D_k]
