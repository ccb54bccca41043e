"""Flash-style attention: ``softmax(q k^T) v`` and its gradients without the ``[S_q, S_k]`` matrix.

FlashAttention (Dao et al., 2022; FlashAttention-2, Dao 2023), in plain PyTorch so every step reads:

* **Forward.** For one block of queries, walk over the blocks of keys. Each step computes a tile of
  scores ``[block_q, block_k]`` and folds it into three running quantities per query row: ``m``
  (the largest score so far), ``l`` (the sum of ``exp(score - m)``) and ``acc`` (the sum of
  ``exp(score - m) * v``). When a tile raises the maximum, ``l`` and ``acc`` are rescaled by
  ``exp(m_old - m_new)``: the *online softmax* (Milakov & Gimelshein, 2018). At the end
  ``out = acc / l`` and ``lse = m + log(l)``, the log of each row's softmax denominator.
* **Backward.** Only ``q, k, v``, ``out`` and ``lse`` are kept. Each tile's weights come back as
  ``p = exp(score - lse)``, with no running max needed, and give the tile's share of
  ``dq, dk, dv``.

Only tiles (times the batch/head dims) ever exist, so extra memory grows like ``S * D``, not
``S^2``. With ``causal=True`` tiles entirely above the diagonal are skipped. The loops run in
Python; each tile is one batched matmul. On a GPU every line below is a separate kernel that
reads and writes HBM; :func:`attnlib.triton_flash.triton_flash_attention` fuses one query block's
whole walk into one kernel. PyTorch's ``scaled_dot_product_attention`` is the one to use in practice.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from . import _checks

__all__ = ["flash_attention", "BLOCK_Q", "BLOCK_K"]

#: Default tile ``[BLOCK_Q, BLOCK_K]``. Measured by ``make bench`` on a 2-core CPU (B=1, H=8, D_k=64,
#: S=4096, causal, float32); an ``[H, 256, 256]`` float32 tile is 2 MiB and stays in cache.
BLOCK_Q, BLOCK_K = 256, 256


def _tiles(S_q: int, S_k: int, block_q: int, block_k: int, causal: bool) -> Iterator[tuple[slice, list[slice]]]:
    """Each query block with the key blocks it sees (causal: none entirely in its future)."""
    offset = S_k - S_q  # query i sits at absolute position i + offset (bottom-right alignment)
    for q0 in range(0, S_q, block_q):
        q1 = min(q0 + block_q, S_q)
        k_end = min(S_k, q1 + offset) if causal else S_k  # the block's last query sees keys < q1 + offset
        yield slice(q0, q1), [slice(k0, min(k0 + block_k, k_end)) for k0 in range(0, k_end, block_k)]


def _scores(qs: Tensor, k: Tensor, rows: slice, cols: slice, causal: bool, offset: int) -> Tensor:
    """One tile of scaled scores ``qs[rows] k[cols]^T``, the future set to -inf when causal."""
    s = torch.bmm(qs[:, rows], k[:, cols].transpose(1, 2))  # [N, bq, D_k] @ [N, D_k, bk] -> [N, bq, bk]
    if causal and cols.stop - 1 > rows.start + offset:  # the tile crosses the diagonal
        i = torch.arange(rows.start + offset, rows.stop + offset, device=s.device)[:, None]  # [bq, 1]
        j = torch.arange(cols.start, cols.stop, device=s.device)[None, :]  # [1, bk]
        s.masked_fill_(j > i, float("-inf"))  # [N, bq, bk], in place: s is this tile's own buffer
    return s


class _FlashAttention(torch.autograd.Function):
    """Inputs ``[N, S, D]`` (any float dtype); works in float32 for float16/bfloat16."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, block_q, block_k):  # type: ignore[no-untyped-def]
        work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        qs = q.to(work) * scale  # [N, S_q, D_k], upcast first, then scaled once
        kw, vw = k.to(work), v.to(work)  # [N, S_k, D_k], [N, S_k, D_v]
        N, S_q, S_k = q.shape[0], q.shape[1], k.shape[1]
        out = torch.empty(N, S_q, v.shape[-1], dtype=work, device=q.device)  # [N, S_q, D_v]
        lse = torch.empty(N, S_q, dtype=work, device=q.device)  # [N, S_q] log of each softmax denominator
        for rows, col_blocks in _tiles(S_q, S_k, block_q, block_k, causal):
            m = torch.full((N, rows.stop - rows.start, 1), float("-inf"), dtype=work, device=q.device)  # [N, bq, 1]
            l = torch.zeros_like(m)  # [N, bq, 1] running sum of exp(score - m)
            acc = torch.zeros(N, rows.stop - rows.start, v.shape[-1], dtype=work, device=q.device)  # [N, bq, D_v]
            for cols in col_blocks:
                s = _scores(qs, kw, rows, cols, causal, S_k - S_q)  # [N, bq, bk]
                m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # [N, bq, 1]
                p = s.sub_(m_new).exp_()  # [N, bq, bk] exp(score - m_new), in place over s
                alpha = torch.exp(m - m_new)  # [N, bq, 1] rescales what was summed relative to m
                l = l.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))  # [N, bq, 1]
                acc = acc.mul_(alpha).baddbmm_(p, vw[:, cols])  # [N, bq, D_v] += [N, bq, bk] @ [N, bk, D_v]
                m = m_new
            out[:, rows] = acc / l  # [N, bq, D_v]
            lse[:, rows] = (m + torch.log(l)).squeeze(-1)  # [N, bq]
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)  # no [S_q, S_k] tensor is kept
        ctx.args = (causal, scale, block_q, block_k)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):  # type: ignore[no-untyped-def]
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale, block_q, block_k = ctx.args
        work = lse.dtype
        qs, kw, vw, d_out = q.to(work) * scale, k.to(work), v.to(work), d_out.to(work)
        # ds = p * (dp - delta) for every tile; the rowsum of p * dp equals rowsum(d_out * out)
        delta = (d_out * out.to(work)).sum(dim=-1) - d_lse  # [N, S_q]; d lse / d score = p
        dq, dk, dv = torch.zeros_like(qs), torch.zeros_like(kw), torch.zeros_like(vw)
        S_q, S_k = q.shape[1], k.shape[1]
        for rows, col_blocks in _tiles(S_q, S_k, block_q, block_k, causal):
            for cols in col_blocks:
                s = _scores(qs, kw, rows, cols, causal, S_k - S_q)  # [N, bq, bk] recomputed
                p = s.sub_(lse[:, rows, None]).exp_()  # [N, bq, bk] the tile's weights, exactly
                dv[:, cols] += p.transpose(1, 2) @ d_out[:, rows]  # [N, bk, D_v]
                dp = d_out[:, rows] @ vw[:, cols].transpose(1, 2)  # [N, bq, bk]
                ds = dp.sub_(delta[:, rows, None]).mul_(p)  # [N, bq, bk] gradient of the scores
                dq[:, rows] += (ds @ kw[:, cols]) * scale  # [N, bq, D_k]
                dk[:, cols] += ds.transpose(1, 2) @ qs[:, rows]  # [N, bk, D_k]
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Tiled attention with the online softmax and a recomputing backward pass.

    Equals ``torch.nn.functional.scaled_dot_product_attention`` (output and gradients) to float
    tolerance, without building the ``[..., S_q, S_k]`` weights, forward or backward.

    Causal convention (that of :func:`attnlib.causal_mask` ``(S_q, S_k=S_k)``): the queries are the
    **last** ``S_q`` of the ``S_k`` positions, so query ``i`` sees keys ``j <= i + S_k - S_q``
    (bottom-right, what decoding with a KV cache needs; ``torch.nn.attention.bias.causal_lower_right``).
    With ``S_q == S_k`` this is PyTorch's ``is_causal=True``, which aligns top-left when ``S_q < S_k``.

    Args:
        q: ``[..., S_q, D_k]`` queries (typically ``[B, H, S_q, D_k]``).
        k: ``[..., S_k, D_k]`` keys.
        v: ``[..., S_k, D_v]`` values.
        causal: hide keys in each query's future (bottom-right aligned); needs ``S_q <= S_k``.
        scale: multiplier for the dot products; ``None`` means ``1 / sqrt(D_k)``.
        block_q, block_k: query rows and key rows per tile ``[block_q, block_k]``.
        return_lse: also return ``lse [..., S_q]``, ``log sum_j exp(score_ij)`` per query row.

    Returns:
        ``out [..., S_q, D_v]`` in the dtype of ``q`` (float16/bfloat16 are computed in float32),
        or ``(out, lse)`` with ``lse`` in float32 for half inputs, else in the dtype of ``q``.

    Raises:
        ValueError: on mismatched shapes, dtypes or devices, empty sequences, a bad block size,
            or ``causal=True`` with ``S_q > S_k``.

    >>> q, k, v = torch.randn(2, 4, 100, 16), torch.randn(2, 4, 120, 16), torch.randn(2, 4, 120, 8)
    >>> out, lse = flash_attention(q, k, v, causal=True, block_q=32, block_k=64, return_lse=True)
    >>> out.shape, lse.shape  # [B, H, S_q, D_v], [B, H, S_q]
    (torch.Size([2, 4, 100, 8]), torch.Size([2, 4, 100]))
    """
    block_q, block_k = _checks.positive_int("block_q", block_q), _checks.positive_int("block_k", block_k)
    lead, (q3, k3, v3), scale = _flatten(q, k, v, causal, scale)  # [N, S, D] each
    out, lse = _FlashAttention.apply(q3, k3, v3, bool(causal), scale, block_q, block_k)
    out, lse = out.reshape(*lead, *out.shape[1:]), lse.reshape(*lead, -1)  # [..., S_q, D_v], [..., S_q]
    return (out, lse) if return_lse else out


def _flatten(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float | None) -> tuple[list[int], list[Tensor], float]:
    """Validate, then view every leading dim (B, H, ...) as one batch axis N: ``[N, S, D]``."""
    _checks.qkv(q, k, v)
    *lead, S_q, d_k = q.shape
    S_k = k.shape[-2]
    if S_q == 0 or S_k == 0:
        raise ValueError(f"q and k need at least one position, got q {_checks.shape(q)} and k {_checks.shape(k)}")
    if causal and S_q > S_k:
        raise ValueError(f"causal=True needs S_q <= S_k (queries are the last S_q of S_k), got S_q = {S_q}, S_k = {S_k}")
    scale = 1.0 / math.sqrt(d_k) if scale is None else float(scale)
    return lead, [t.reshape(math.prod(lead), *t.shape[-2:]) for t in (q, k, v)], scale
