"""Moving between ``[B, S, D]`` and per-head ``[B, H, S, D_k]`` (with ``D = H * D_k``).

The head axis goes in front of the sequence axis so that one batched matmul (``@``), which
treats every axis but the last two as batch, runs all heads at once.
"""

from __future__ import annotations

from torch import Tensor

from . import _checks

__all__ = ["split_heads", "merge_heads", "repeat_kv"]


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``[B, S, D] -> [B, H, S, D_k]`` with ``D_k = D // H``.

    Head ``h`` gets features ``h*D_k .. (h+1)*D_k - 1`` of every position. The result is a
    view (no copy), not contiguous. ``ValueError`` if ``x`` is not 3-D or ``H`` does not divide ``D``.

    >>> split_heads(torch.zeros(2, 5, 12), num_heads=4).shape
    torch.Size([2, 4, 5, 3])
    """
    x = _checks.tensor_with_dims("split_heads input", x, 3, "[B, S, D]")
    num_heads = _checks.positive_int("num_heads", num_heads)
    B, S, D = x.shape
    if D % num_heads != 0:
        raise ValueError(f"D = {D} is not divisible by num_heads = {num_heads} (shape {tuple(x.shape)})")
    x = x.view(B, S, num_heads, D // num_heads)  # [B, S, H, D_k]
    return x.transpose(1, 2)  # [B, H, S, D_k]


def merge_heads(x: Tensor) -> Tensor:
    """``[B, H, S, D_k] -> [B, S, H * D_k]``, the inverse of :func:`split_heads` (``x`` must be 4-D).

    >>> merge_heads(torch.zeros(2, 4, 5, 3)).shape
    torch.Size([2, 5, 12])
    """
    x = _checks.tensor_with_dims("merge_heads input", x, 4, "[B, H, S, D_k]")
    B, H, S, d_k = x.shape
    x = x.transpose(1, 2)  # [B, S, H, D_k]
    return x.reshape(B, S, H * d_k)  # [B, S, D]; a copy unless H, S or D_k is 1 or x's memory is [B, S, H, D_k] order


def repeat_kv(x: Tensor, num_heads: int) -> Tensor:
    """Share each key/value head with a group of query heads (grouped-query attention).

    ``[B, H_kv, S, D_k] -> [B, H, S, D_k]``: query head ``h`` uses key/value head
    ``h // (H // H_kv)``. ``expand`` makes a broadcast view; the ``reshape`` after it copies it,
    once, into ``[B, H, S, D_k]``, except with one key/value head (``H_kv = 1``: a stride-0 view).
    ``ValueError`` if ``x`` is not 4-D or ``num_heads`` is not a positive multiple of ``H_kv``.

    >>> repeat_kv(torch.zeros(2, 2, 5, 3), num_heads=8).shape
    torch.Size([2, 8, 5, 3])
    """
    x = _checks.tensor_with_dims("repeat_kv input", x, 4, "[B, H_kv, S, D_k]")
    num_heads = _checks.positive_int("num_heads", num_heads)
    B, H_kv, S, d_k = x.shape
    if H_kv == 0 or num_heads % H_kv != 0:
        raise ValueError(f"num_heads = {num_heads} is not a multiple of the {H_kv} key/value heads (shape {tuple(x.shape)})")
    group = num_heads // H_kv
    if group == 1:
        return x
    x = x[:, :, None, :, :].expand(B, H_kv, group, S, d_k)  # [B, H_kv, G, S, D_k], no copy
    return x.reshape(B, num_heads, S, d_k)  # [B, H, S, D_k]
