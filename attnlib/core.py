"""Scaled dot-product attention, written out so that every step can be read.

Axis names used throughout the book (einops style):

* ``B``   batch: independent sequences processed together
* ``H``   heads
* ``S_q`` query positions, ``S_k`` key/value positions (equal in self-attention)
* ``D_k`` width of a query/key vector, ``D_v`` width of a value vector

``attention(Q, K, V) = softmax(Q K^T * scale / temperature) V`` with ``scale = 1 / sqrt(D_k)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["AttentionResult", "softmax", "scaled_dot_product_attention", "attention_scores"]


class AttentionResult(NamedTuple):
    """What :func:`scaled_dot_product_attention` returns.

    Attributes:
        output: ``[..., S_q, D_v]``, each query's weighted mix of the values.
        weights: ``[..., S_q, S_k]``, row ``i`` holds how much query ``i`` takes from every key;
            each row sums to 1 (or is all zeros when the mask hides every key from that query).
    """

    output: Tensor
    weights: Tensor


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_float(name: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t


def _check_temperature(temperature: float) -> None:
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    if not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")


def softmax(scores: Tensor, dim: int = -1, temperature: float = 1.0) -> Tensor:
    """Numerically stable softmax with a temperature.

    ``softmax(x / T)_i = exp((x_i - m) / T) / sum_j exp((x_j - m) / T)`` where ``m = max_j x_j``.
    Subtracting the maximum changes nothing mathematically and keeps ``exp`` from overflowing.

    Entries equal to ``-inf`` get weight exactly 0. A slice whose entries are *all* ``-inf``
    (a query that may see nothing) gets all-zero weights instead of NaN, which is what PyTorch's
    fused attention does too.

    Args:
        scores: any shape, floating point.
        dim: the axis that is normalised (it sums to 1 afterwards).
        temperature: ``T > 0``. ``T < 1`` sharpens the distribution, ``T > 1`` flattens it.

    Returns:
        A tensor of the same shape and dtype as ``scores``.

    Raises:
        ValueError: if ``temperature <= 0`` or ``scores`` is not floating point.
    """
    _check_float("scores", scores)
    _check_temperature(temperature)
    if not -scores.dim() <= dim < max(scores.dim(), 1):
        raise ValueError(f"dim {dim} is out of range for scores of shape {_shape(scores)}")
    x = scores / temperature
    row_max = x.amax(dim=dim, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))  # all -inf rows
    exps = torch.exp(x - row_max)
    total = exps.sum(dim=dim, keepdim=True)
    return exps / total.clamp_min(torch.finfo(scores.dtype).tiny)  # 0 / tiny = 0 for empty rows


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_float(name, t)
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dims [..., S, D], got shape {_shape(t)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got q {q.device}, k {k.device}, v {v.device}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dim D_k: got q {_shape(q)} [..., S_q, D_k] and k {_shape(k)} [..., S_k, D_k]"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of positions S_k: got k {_shape(k)} [..., S_k, D_k] and v {_shape(v)} [..., S_k, D_v]"
        )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            f"q, k, v must share their leading (batch, head) dims: got q {_shape(q)}, k {_shape(k)}, v {_shape(v)}"
        )


def check_mask(mask: object, scores_shape: tuple[int, ...], device: torch.device) -> Tensor:
    """Validate a boolean attention mask against the shape of the scores it will hide.

    Args:
        mask: bool, broadcastable to ``scores_shape`` (``[..., S_q, S_k]``); True means "may attend".
        scores_shape: the shape of the scores, e.g. ``(B, H, S_q, S_k)``.
        device: the device of the scores.

    Returns:
        The mask, unchanged.

    Raises:
        ValueError: naming the mask's shape, dtype or device and what was expected.
    """
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a torch.Tensor of dtype torch.bool, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise ValueError(
            f"mask must have dtype torch.bool (True = may attend), got {mask.dtype}; "
            "convert a 1/0 mask with attnlib.padding_mask(...) or mask.bool()"
        )
    if mask.device != device:
        raise ValueError(f"mask is on {mask.device} but the scores are on {device}")
    try:
        broadcast = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != torch.Size(scores_shape):
        raise ValueError(f"mask shape {_shape(mask)} cannot broadcast to scores {tuple(scores_shape)}")
    return mask


def attention_scores(q: Tensor, k: Tensor, *, scale: float | None = None) -> Tensor:
    """Scaled scores ``q @ k^T * scale``.

    Args:
        q: ``[..., S_q, D_k]`` queries.
        k: ``[..., S_k, D_k]`` keys.
        scale: multiplier for the dot products; ``None`` means ``1 / sqrt(D_k)``.

    Returns:
        ``[..., S_q, S_k]`` scores (before masking and softmax).
    """
    d_k = q.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(d_k)
    return (q @ k.transpose(-2, -1)) * scale  # [..., S_q, D_k] @ [..., D_k, S_k] -> [..., S_q, S_k]


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
    temperature: float = 1.0,
) -> AttentionResult:
    """Attention that also returns its weights: ``softmax(q k^T * scale / temperature) v``.

    With ``temperature=1`` the output equals
    ``torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)``
    to float tolerance. Unlike PyTorch's fused kernel, this version materialises the
    ``[..., S_q, S_k]`` weights, so it can hand them back for inspection.

    Args:
        q: ``[..., S_q, D_k]`` queries (typically ``[B, H, S_q, D_k]``).
        k: ``[..., S_k, D_k]`` keys.
        v: ``[..., S_k, D_v]`` values.
        mask: optional bool tensor broadcastable to ``[..., S_q, S_k]``; True means "may attend".
            ``causal_mask(S)`` gives ``[S, S]``, ``padding_mask(m)`` gives ``[B, 1, 1, S]``.
        scale: multiplier for the dot products; ``None`` means ``1 / sqrt(D_k)``.
        temperature: ``T > 0``; the scores are divided by it before softmax.

    Returns:
        :class:`AttentionResult` with ``output [..., S_q, D_v]`` and ``weights [..., S_q, S_k]``.
        A query whose every key is masked gets all-zero weights and an all-zero output.

    Raises:
        ValueError: on mismatched shapes, dtypes or devices, a non-bool or mis-shaped mask,
            or ``temperature <= 0``.
    """
    _check_qkv(q, k, v)
    _check_temperature(temperature)
    scores = attention_scores(q, k, scale=scale)  # [..., S_q, S_k]
    if mask is not None:
        check_mask(mask, tuple(scores.shape), scores.device)
        scores = scores.masked_fill(~mask, float("-inf"))  # hidden keys get -inf -> weight 0
    weights = softmax(scores, dim=-1, temperature=temperature)  # [..., S_q, S_k], rows sum to 1
    output = weights @ v  # [..., S_q, S_k] @ [..., S_k, D_v] -> [..., S_q, D_v]
    return AttentionResult(output=output, weights=weights)
