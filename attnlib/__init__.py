"""attnlib: the small attention library behind *Inside Self-Attention*.

Shapes are batch first: ``[B, S, D]`` token vectors, ``[B, H, S, D_k]`` per-head vectors,
``[B, H, S_q, S_k]`` scores and weights. Masks are bool with True meaning "may attend".
"""

from .core import AttentionResult, scaled_dot_product_attention, softmax
from .cost import kv_cache_bytes
from .device import get_device
from .flash import flash_attention
from .heads import merge_heads, repeat_kv, split_heads
from .masks import causal_mask, combine_masks, padding_mask
from .multihead import AttentionOutput, MultiHeadSelfAttention

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``attnlib.triton_flash_attention`` imports Triton on first use, so ``import attnlib`` never needs it."""
    if name == "triton_flash_attention":
        from .triton_flash import triton_flash_attention

        return triton_flash_attention
    raise AttributeError(f"module 'attnlib' has no attribute {name!r}")


__all__ = [
    "AttentionOutput",
    "AttentionResult",
    "MultiHeadSelfAttention",
    "causal_mask",
    "combine_masks",
    "flash_attention",
    "get_device",
    "kv_cache_bytes",
    "merge_heads",
    "padding_mask",
    "repeat_kv",
    "scaled_dot_product_attention",
    "softmax",
    "split_heads",
]
