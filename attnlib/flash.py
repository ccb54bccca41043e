"""Flash-style attention: the same result as softmax(q k^T) v without the ``[S_q, S_k]`` matrix.

The idea of FlashAttention (Dao et al., 2022), written in plain PyTorch so every step can be read:

1. Cut the queries into blocks of ``block_size`` rows and the keys/values into blocks of
   ``block_size`` rows.
2. For one query block, walk over the key blocks. Each step computes a small tile of scores
   ``[block_q, block_k]`` and folds it into three running quantities per query row:

   * ``m``, the largest score seen so far,
   * ``l``, the sum of ``exp(score - m)`` over the keys seen so far,
   * ``acc``, the sum of ``exp(score - m) * v`` over the keys seen so far.

   When a new tile raises the maximum from ``m_old`` to ``m_new``, everything accumulated so far
   was computed relative to ``m_old``, so ``l`` and ``acc`` are rescaled by ``exp(m_old - m_new)``
   (the *online softmax*).
3. After the last key block, ``output = acc / l``.

Only ``[block_q, block_k]`` tiles (times the leading batch/head dims) ever exist; peak extra
memory grows like ``S * D`` instead of ``S^2``. With ``causal=True`` tiles that lie entirely above
the diagonal are skipped, which halves the work.

The loops run in Python over blocks only; inside a tile all leading dims (``B``, ``H``, ...) go
through one batched matmul. PyTorch's fused ``scaled_dot_product_attention`` does the same in
C++/CUDA and is the one to use in practice; this module is for reading and measuring.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .core import _check_qkv, _shape

__all__ = ["flash_attention", "DEFAULT_BLOCK_SIZE"]

#: Default tile edge. Measured on a 2-core CPU (B=1, H=8, D_k=64, S=4096, causal, float32), time
#: relative to PyTorch's SDPA on a quiet machine: 128 -> 1.9x, 256 -> 2.0x, 384 -> 1.8x, 512 -> 2.6x
#: (an ``[H, 256, 256]`` float32 tile is 2 MiB and stays in cache). Under heavy load larger blocks
#: won instead (fewer Python-level steps). Chapter 8 repeats the measurement on the reader's device.
DEFAULT_BLOCK_SIZE = 256


def _check_block_size(block_size: object) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    return block_size


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Tensor:
    """Tiled attention with the online softmax; never builds the ``[..., S_q, S_k]`` weights.

    Computes ``softmax(q k^T * scale) v`` (masked when ``causal``) and equals
    ``torch.nn.functional.scaled_dot_product_attention`` to float tolerance.

    Causal convention (same as :func:`attnlib.causal_mask` ``(S_q, S_k=S_k)``): the queries are the
    **last** ``S_q`` positions of the ``S_k`` keys, so query ``i`` sees keys ``j <= i + (S_k - S_q)``
    ("bottom-right" alignment, what a decoder with a KV cache needs). With ``S_q == S_k`` this is the
    ordinary causal mask and matches PyTorch's ``is_causal=True``; with ``S_q < S_k`` PyTorch's
    ``is_causal`` aligns to the top-left instead, so compare against an explicit
    ``attn_mask=causal_mask(S_q, S_k=S_k)``. ``causal=True`` with ``S_q > S_k`` raises, as
    :func:`attnlib.causal_mask` does.

    Args:
        q: ``[..., S_q, D_k]`` queries (typically ``[B, H, S_q, D_k]``).
        k: ``[..., S_k, D_k]`` keys.
        v: ``[..., S_k, D_v]`` values.
        causal: hide keys in each query's future (bottom-right aligned, see above).
        scale: multiplier for the dot products; ``None`` means ``1 / sqrt(D_k)``.
        block_size: rows per query block and per key block (the tile is ``[block_size, block_size]``).

    Returns:
        ``[..., S_q, D_v]``, in the dtype of ``q``. float16/bfloat16 inputs are accumulated in float32.

    Raises:
        ValueError: on mismatched shapes, dtypes or devices (the checks of
            :func:`attnlib.scaled_dot_product_attention`), empty sequences, a bad ``block_size``,
            or ``causal=True`` with ``S_q > S_k``.
    """
    _check_qkv(q, k, v)
    block_size = _check_block_size(block_size)
    *lead, S_q, d_k = q.shape
    S_k, d_v = k.shape[-2], v.shape[-1]
    if S_q == 0 or S_k == 0:
        raise ValueError(f"q and k need at least one position, got q {_shape(q)} and k {_shape(k)}")
    if causal and S_q > S_k:
        raise ValueError(
            f"causal=True needs S_q <= S_k (queries are the last S_q of S_k positions), got S_q = {S_q}, S_k = {S_k}"
        )
    if scale is None:
        scale = 1.0 / math.sqrt(d_k)
    out_dtype = q.dtype
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype

    n = math.prod(lead)  # every leading dim (B, H, ...) becomes one batch axis N for bmm
    qf = (q.reshape(n, S_q, d_k) * scale).to(work)  # [N, S_q, D_k], scale folded in once
    kt = k.reshape(n, S_k, d_k).to(work).transpose(1, 2)  # [N, D_k, S_k]
    vf = v.reshape(n, S_k, d_v).to(work)  # [N, S_k, D_v]
    out = torch.empty(n, S_q, d_v, dtype=work, device=q.device)  # [N, S_q, D_v]
    offset = S_k - S_q  # query i sits at absolute position i + offset

    for q0 in range(0, S_q, block_size):
        q1 = min(q0 + block_size, S_q)
        q_blk = qf[:, q0:q1]  # [N, bq, D_k]
        bq = q1 - q0
        m = torch.full((n, bq, 1), float("-inf"), dtype=work, device=q.device)  # running max
        l = torch.zeros(n, bq, 1, dtype=work, device=q.device)  # running sum of exp
        acc = torch.zeros(n, bq, d_v, dtype=work, device=q.device)  # running sum of exp * v
        # causal: the last query of this block is at q1 - 1 + offset; keys after it are never seen
        k_end = min(S_k, q1 + offset) if causal else S_k
        for k0 in range(0, k_end, block_size):
            k1 = min(k0 + block_size, k_end)
            s = torch.bmm(q_blk, kt[:, :, k0:k1])  # [N, bq, bk] scores of this tile
            if causal and k1 - 1 > q0 + offset:  # the tile crosses the diagonal: hide the future
                rows = torch.arange(q0 + offset, q1 + offset, device=q.device)[:, None]  # [bq, 1]
                cols = torch.arange(k0, k1, device=q.device)[None, :]  # [1, bk]
                s.masked_fill_(cols > rows, float("-inf"))  # [N, bq, bk]
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # [N, bq, 1]
            p = s.sub_(m_new).exp_()  # [N, bq, bk] exp(score - m_new), in place over s
            alpha = torch.exp(m - m_new)  # [N, bq, 1] rescales what was summed relative to m
            l.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))  # [N, bq, 1]
            acc.mul_(alpha).baddbmm_(p, vf[:, k0:k1])  # [N, bq, D_v] += [N, bq, bk] @ [N, bk, D_v]
            m = m_new
        out[:, q0:q1] = acc / l  # [N, bq, D_v]
    return out.reshape(*lead, S_q, d_v).to(out_dtype)  # [..., S_q, D_v]
