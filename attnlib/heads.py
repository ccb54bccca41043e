"""Moving between ``[B, S, D]`` and per-head ``[B, H, S, D_k]`` (with ``D = H * D_k``).

The head axis goes in front of the sequence axis so that one batched matmul (``@``), which
treats every axis but the last two as batch, runs all heads at once.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["split_heads", "merge_heads", "repeat_kv"]


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``[B, S, D] -> [B, H, S, D_k]`` with ``D_k = D // H``.

    Head ``h`` gets features ``h*D_k .. (h+1)*D_k - 1`` of every position. The result is a
    view (no copy) and is not contiguous.

    Raises:
        ValueError: if ``x`` is not 3-D or ``D`` is not divisible by ``num_heads``.
    """
    if x.dim() != 3:
        raise ValueError(f"split_heads expects [B, S, D] (3 dims), got shape {tuple(x.shape)}")
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    B, S, D = x.shape
    if D % num_heads != 0:
        raise ValueError(f"D = {D} is not divisible by num_heads = {num_heads} (shape {tuple(x.shape)})")
    d_k = D // num_heads
    x = x.view(B, S, num_heads, d_k)  # [B, S, H, D_k]
    return x.transpose(1, 2)  # [B, H, S, D_k]


def merge_heads(x: Tensor) -> Tensor:
    """``[B, H, S, D_k] -> [B, S, H * D_k]``, the inverse of :func:`split_heads`.

    Raises:
        ValueError: if ``x`` is not 4-D.
    """
    if x.dim() != 4:
        raise ValueError(f"merge_heads expects [B, H, S, D_k] (4 dims), got shape {tuple(x.shape)}")
    B, H, S, d_k = x.shape
    x = x.transpose(1, 2)  # [B, S, H, D_k]
    return x.reshape(B, S, H * d_k)  # [B, S, D]; reshape copies because x is not contiguous


def repeat_kv(x: Tensor, num_heads: int) -> Tensor:
    """Share each key/value head with a group of query heads (grouped-query attention).

    ``[B, H_kv, S, D_k] -> [B, H, S, D_k]``: query head ``h`` uses key/value head
    ``h // (H // H_kv)``. Implemented with ``expand``, which creates a broadcast view; the
    following ``reshape`` does copy, once, into the ``[B, H, S, D_k]`` layout that matmul needs.

    Raises:
        ValueError: if ``x`` is not 4-D or ``num_heads`` is not a multiple of ``H_kv``.
    """
    if x.dim() != 4:
        raise ValueError(f"repeat_kv expects [B, H_kv, S, D_k] (4 dims), got shape {tuple(x.shape)}")
    B, H_kv, S, d_k = x.shape
    if num_heads % H_kv != 0:
        raise ValueError(f"num_heads = {num_heads} is not a multiple of the {H_kv} key/value heads")
    group = num_heads // H_kv
    if group == 1:
        return x
    x = x[:, :, None, :, :].expand(B, H_kv, group, S, d_k)  # [B, H_kv, G, S, D_k], no copy
    return x.reshape(B, num_heads, S, d_k)  # [B, H, S, D_k]
