"""A NumPy twin of (causal) multi-head self-attention, for readers who know NumPy but not PyTorch.

It computes exactly what :class:`attnlib.MultiHeadSelfAttention` computes (without biases);
the tests check that. Weights use the NumPy convention
``y = x @ W`` with ``W`` of shape ``[D_in, D_out]``; ``torch.nn.Linear`` stores the transpose.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from . import _checks

__all__ = ["softmax", "causal_mask", "split_heads", "merge_heads", "multi_head_attention"]

Array = NDArray[np.floating]


def softmax(scores: Array, axis: int = -1) -> Array:
    """Stable softmax along ``axis``; all ``-inf`` slices give all zeros (as in attnlib.softmax).

    >>> softmax(np.array([[0.0, np.log(3.0)], [-np.inf, -np.inf]]))
    array([[0.25, 0.75],
           [0.  , 0.  ]])
    """
    scores = np.asarray(scores)
    if not np.issubdtype(scores.dtype, np.floating):
        raise ValueError(f"scores must be a floating-point array, got dtype {scores.dtype}")
    row_max = np.max(scores, axis=axis, keepdims=True, initial=-np.inf)  # initial: empty rows too
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    exps = np.exp(scores - row_max)
    total = np.sum(exps, axis=axis, keepdims=True)
    return exps / np.maximum(total, np.finfo(scores.dtype).tiny)


def causal_mask(S: int) -> NDArray[np.bool_]:
    """``[S, S]`` bool, True where query ``i`` may see key ``j`` (``j <= i``).

    >>> causal_mask(3).shape
    (3, 3)
    """
    S = _checks.positive_int("S", S, minimum=0)
    return np.tril(np.ones((S, S), dtype=bool))


def split_heads(x: Array, num_heads: int) -> Array:
    """``[B, S, D] -> [B, H, S, D_k]``.

    >>> split_heads(np.zeros((2, 5, 12)), 4).shape
    (2, 4, 5, 3)
    """
    x, num_heads = np.asarray(x), _checks.positive_int("num_heads", num_heads)
    if x.ndim != 3:
        raise ValueError(f"split_heads expects [B, S, D] (3 dims), got shape {x.shape}")
    B, S, D = x.shape
    if D % num_heads != 0:
        raise ValueError(f"D = {D} is not divisible by num_heads = {num_heads}")
    return x.reshape(B, S, num_heads, D // num_heads).transpose(0, 2, 1, 3)  # [B, H, S, D_k]


def merge_heads(x: Array) -> Array:
    """``[B, H, S, D_k] -> [B, S, H * D_k]``.

    >>> merge_heads(np.zeros((2, 4, 5, 3))).shape
    (2, 5, 12)
    """
    x = np.asarray(x)
    if x.ndim != 4:
        raise ValueError(f"merge_heads expects [B, H, S, D_k] (4 dims), got shape {x.shape}")
    B, H, S, d_k = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, S, H * d_k)  # [B, S, D]


def multi_head_attention(
    x: Array, w_q: Array, w_k: Array, w_v: Array, w_o: Array, num_heads: int, *, causal: bool = True
) -> tuple[Array, Array]:
    """Multi-head self-attention on ``x``.

    Args:
        x: ``[B, S, D]`` token vectors.
        w_q, w_k, w_v, w_o: ``[D, D]`` projection matrices (``y = x @ W``).
        num_heads: ``H``; ``D`` must be divisible by it.
        causal: hide future positions (True) or let every position see every other (False).

    Returns:
        ``(output [B, S, D], weights [B, H, S, S])``.

    >>> w = np.eye(8)
    >>> out, weights = multi_head_attention(np.ones((2, 5, 8)), w, w, w, w, num_heads=2)
    >>> out.shape, weights.shape
    ((2, 5, 8), (2, 2, 5, 5))
    """
    x = np.asarray(x, dtype=float)
    if x.ndim != 3:
        raise ValueError(f"x must be [B, S, D], got shape {x.shape}")
    B, S, D = x.shape
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v), ("w_o", w_o)):
        if np.shape(w) != (D, D):
            raise ValueError(f"{name} must be [D, D] = {(D, D)}, got {np.shape(w)}")
    q = split_heads(x @ w_q, num_heads)  # [B, H, S, D_k]
    k = split_heads(x @ w_k, num_heads)  # [B, H, S, D_k]
    v = split_heads(x @ w_v, num_heads)  # [B, H, S, D_k]
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])  # [B, H, S, S], scaled by 1 / sqrt(D_k)
    if causal:
        scores = np.where(causal_mask(S), scores, -np.inf)  # future -> -inf
    weights = softmax(scores, axis=-1)  # [B, H, S, S]
    context = weights @ v  # [B, H, S, D_k]
    output = merge_heads(context) @ w_o  # [B, S, D]
    return output, weights
