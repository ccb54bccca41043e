"""attnlib: a small, readable multi-head self-attention library (torch and numpy only).

Shape legend (batch first; every shape comment in attnlib uses these letters):

=========  ===============================================================================
``B``      batch: independent sequences processed together; ``BH`` = B * H pairs in one axis (:mod:`attnlib.flash`)
``S``      sequence length; ``S_q`` query positions and ``S_k`` key/value positions when they differ
``D``      model width ``d_model``, the length of each token vector
``H``      query heads; ``H_kv`` key/value heads (grouped-query attention), ``H % H_kv == 0``
``D_k``    width of one head's query and key vectors, ``D_k = D // H``
``D_v``    width of one head's value vectors (``D_k`` inside :class:`MultiHeadSelfAttention`)
=========  ===============================================================================

Tensors: token vectors ``[B, S, D]``; per-head q, k, v ``[B, H, S, D_k]``; scores and weights
``[B, H, S_q, S_k]`` (query positions down, key positions across).

Masks are ``torch.bool`` with **True = may attend**, like ``F.scaled_dot_product_attention``.
``nn.MultiheadAttention`` (True = ignore), Hugging Face (1 = keep) and additive float masks
(0 = keep) differ: :mod:`attnlib.masks` has the table and a converter for each.

>>> import torch, attnlib
>>> layer = attnlib.MultiHeadSelfAttention(d_model=32, num_heads=4)
>>> layer(torch.randn(2, 6, 32), causal=True).attention_weights.shape  # [B, H, S, S]
torch.Size([2, 4, 6, 6])
"""

from .core import AttentionResult, scaled_dot_product_attention, softmax
from .cost import kv_cache_bytes
from .device import get_device
from .flash import flash_attention
from .heads import merge_heads, repeat_kv, split_heads
from .kv_cache import KVCache
from .latent import MultiHeadLatentAttention
from .masks import causal_mask, combine_masks, from_additive_mask, from_key_padding_mask, padding_mask
from .multihead import AttentionOutput, MultiHeadSelfAttention
from .paged import BlockPool, PagedKVCache, paged_attention, paged_attention_in_place

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``attnlib.triton_flash_attention`` imports Triton on first use, so ``import attnlib`` never needs it."""
    if name == "triton_flash_attention":
        from .triton_flash import triton_flash_attention

        return triton_flash_attention
    raise AttributeError(f"module 'attnlib' has no attribute {name!r}")


__all__ = [
    "AttentionOutput", "AttentionResult", "BlockPool", "KVCache", "MultiHeadLatentAttention", "MultiHeadSelfAttention", "causal_mask",
    "combine_masks", "flash_attention", "from_additive_mask", "from_key_padding_mask", "get_device", "kv_cache_bytes",
    "merge_heads", "padding_mask", "PagedKVCache", "paged_attention", "paged_attention_in_place", "repeat_kv", "scaled_dot_product_attention", "softmax", "split_heads",
]  # fmt: skip
