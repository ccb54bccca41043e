"""Scaled dot-product attention, written out so that every step can be read.

``attention(Q, K, V) = softmax(Q K^T * scale / temperature) V`` with ``scale = 1 / sqrt(D_k)``.
Shapes follow the legend in :mod:`attnlib`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from . import _checks

__all__ = ["AttentionResult", "softmax", "scaled_dot_product_attention"]



class AttentionResult(NamedTuple):
    """What :func:`scaled_dot_product_attention` returns.

    Attributes:
        output: ``[..., S_q, D_v]``, each query's weighted mix of the values.
        weights: ``[..., S_q, S_k]``, row ``i`` holds how much query ``i`` takes from every key;
            each row sums to 1 (or is all zeros when the mask hides every key from that query).

    >>> scaled_dot_product_attention(*[torch.randn(1, 2, 3, 4)] * 3).weights.shape
    torch.Size([1, 2, 3, 3])
    """

    output: Tensor
    weights: Tensor


def softmax(scores: Tensor, dim: int = -1, temperature: float | Tensor = 1.0) -> Tensor:
    """Numerically stable softmax with a temperature.

    ``softmax(x / T)_i = exp((x_i - m) / T) / sum_j exp((x_j - m) / T)`` where ``m = max_j x_j``.
    The maximum is subtracted *before* dividing by ``T``, so the largest entry becomes
    ``exp(0) = 1`` and no ``T``, however small, can overflow ``exp`` or empty a row.

    Entries equal to ``-inf`` get weight exactly 0. A slice whose entries are *all* ``-inf``
    (a query that may see nothing) gets all-zero weights instead of NaN, as
    ``F.scaled_dot_product_attention`` does (checked on torch 2.13.0).

    Args:
        scores: any shape, floating point; the result has the same shape and dtype.
        dim: the axis that is normalised (it sums to 1 afterwards).
        temperature: ``T > 0``, a Python or NumPy number or a 0-d tensor (which may require grad).
            ``T < 1`` sharpens, ``T > 1`` flattens. Anything else raises ``ValueError``.

    >>> softmax(torch.tensor([[1.0, 2.0, 3.0]]), temperature=1e-6)
    tensor([[0., 0., 1.]])
    """
    _checks.float_tensor("scores", scores)
    dim = _checks.dim_index(scores, dim)
    temperature = _checks.positive_scalar("temperature", temperature)
    if scores.dim() > 0 and scores.shape[dim] == 0:
        return scores / temperature  # an empty slice has nothing to normalise; keep shape and graph
    x = scores.to(torch.promote_types(scores.dtype, torch.float32))  # float16 -> float32 inside
    row_max = x.amax(dim=dim, keepdim=True)  # the shift changes nothing, but exp(x - max) <= 1
    row_max = row_max.masked_fill(row_max == float("-inf"), 0.0)  # a row that sees nothing
    shifted = x - row_max  # [..., S], largest entry 0, hidden entries -inf
    if isinstance(temperature, Tensor):  # learnable T: keep -inf out of d/dT (0 * inf = NaN)
        hidden = shifted == float("-inf")
        exps = torch.exp(shifted.masked_fill(hidden, 0.0) / temperature).masked_fill(hidden, 0.0)
    else:
        exps = torch.exp(shifted / temperature)  # exp(-inf) = 0: hidden entries get weight 0
    total = exps.sum(dim=dim, keepdim=True)
    return (exps / total.masked_fill(total == 0, 1.0)).to(scores.dtype)  # empty rows: 0 / 1 = 0, finite gradients


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
    scale: float | Tensor | None = None, temperature: float | Tensor = 1.0,
) -> AttentionResult:  # fmt: skip
    """Attention that also returns its weights: ``softmax(q k^T * scale / temperature) v``.

    With ``temperature=1`` the output equals
    ``torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)``
    to float tolerance, including torch 2.13.0's results for fully masked rows (zeros), ``S_k = 0``
    (zeros) and ``D_k = 0`` (every score is 0, so uniform weights). Unlike PyTorch's fused
    kernel, this version materialises the ``[..., S_q, S_k]`` weights and hands them back.

    float16 and bfloat16 are computed in float32 and rounded back at the end (PyTorch's kernels
    accumulate in float32 too), so ``q @ k^T`` of large activations cannot overflow.

    Args:
        q: ``[..., S_q, D_k]`` queries (typically ``[B, H, S_q, D_k]``).
        k: ``[..., S_k, D_k]`` keys.
        v: ``[..., S_k, D_v]`` values.
        mask: optional bool tensor broadcastable to ``[..., S_q, S_k]``; True means "may attend".
            ``causal_mask(S)`` gives ``[S, S]``, ``padding_mask(m)`` gives ``[B, 1, 1, S]``.
        scale: multiplier for the dot products, a real number ``> 0`` or a 0-d tensor;
            ``None`` means ``1 / sqrt(D_k)``.
        temperature: ``T > 0`` (number or 0-d tensor); the scores are divided by it before softmax.

    Returns:
        :class:`AttentionResult` with ``output [..., S_q, D_v]`` and ``weights [..., S_q, S_k]``,
        in the dtype of ``q``. A query whose every key is masked gets all-zero weights and output.

    Raises:
        ValueError: for mismatched q, k, v, a non-bool or mis-shaped mask, or a bad scale or temperature.

    >>> q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 3)
    >>> out, w = scaled_dot_product_attention(q, k, v)
    >>> out.shape, w.shape
    (torch.Size([2, 4, 5, 3]), torch.Size([2, 4, 5, 7]))
    """
    _checks.qkv(q, k, v, mask)  # shapes, dtypes, devices; a bool mask that fits [..., S_q, S_k]
    temperature = _checks.positive_scalar("temperature", temperature)
    D_k = q.shape[-1]  # D_k = 0: every score is 0, whatever the scale
    scale = 1.0 / math.sqrt(max(D_k, 1)) if scale is None else _checks.positive_scalar("scale", scale)
    dtype = q.dtype
    q, k, v = (t.to(torch.promote_types(dtype, torch.float32)) for t in (q, k, v))  # float16 -> float32

    scores = (q * scale) @ k.transpose(-2, -1)  # [..., S_q, D_k] @ [..., D_k, S_k] -> [..., S_q, S_k]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # hidden keys get -inf -> weight 0
    weights = softmax(scores, dim=-1, temperature=temperature)  # [..., S_q, S_k], rows sum to 1
    output = weights @ v  # [..., S_q, S_k] @ [..., S_k, D_v] -> [..., S_q, D_v]
    return AttentionResult(output=output.to(dtype), weights=weights.to(dtype))
