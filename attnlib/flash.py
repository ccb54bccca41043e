"""Flash-style attention: ``softmax(q k^T) v`` and its gradients without the ``[S_q, S_k]`` matrix.

FlashAttention (Dao et al., 2022; FlashAttention-2, Dao 2023), in plain PyTorch so every step reads:

* **Forward** (FlashAttention-2's loop order): one block of ``block_q`` queries at a time (on a GPU
  the blocks run in parallel; on a CPU without gradients each thread takes a share of the
  batch-heads) walks over the blocks of ``block_k`` keys it sees, one tile of scores per step. Each
  row keeps ``m`` (the largest score so far), ``l`` (the sum of ``exp(score - m)``) and ``acc`` (the
  sum of ``exp(score - m) * v``); when a tile raises the maximum, ``l`` and ``acc`` are rescaled by
  ``exp(m_old - m_new)``: the *online softmax* (Milakov & Gimelshein, 2018). After the walk,
  ``out = acc / l`` and ``lse = m + log(l)``, the log of each row's softmax denominator.
* **Backward** (FlashAttention-2's order): only ``q, k, v``, ``out`` and ``lse`` are kept. One key
  block at a time walks over the query blocks that see it; a tile's weights come back exactly as
  ``p = exp(score - lse)``; the block's ``dk`` and ``dv`` are complete after its walk, ``dq`` adds up.

Only tiles ``[block_q, block_k]`` (times the batch-heads) exist: extra memory is a few tiles plus
``O(S)``. Causal: a query block stops at its last visible key block; only diagonal tiles are masked
inside. On a GPU each line is a kernel that reads and writes HBM; :func:`attnlib.triton_flash.
triton_flash_attention` fuses a query block's walk into one kernel. In practice, use PyTorch's SDPA.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from . import _checks

__all__ = ["flash_attention", "BLOCK_Q", "BLOCK_K"]

#: Default tile edges: a starting point, chosen by timing S = 4096 on two CPU cores. The result depends on them only by rounding.
BLOCK_Q, BLOCK_K = 256, 256


def _blocks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _sees(rows: slice, cols: slice, causal: bool, offset: int) -> bool:
    """Whether any query of ``rows`` sees a key of ``cols``: query ``i`` sees keys ``j <= i + offset``."""
    return not causal or cols.start <= rows.stop - 1 + offset


def _mask_future(s: Tensor, rows: slice, cols: slice, causal: bool, offset: int) -> None:
    """Causal: set the scores of keys in each query's future to -inf, in place, if the tile crosses the diagonal."""
    if causal and cols.stop - 1 > rows.start + offset:
        i = torch.arange(rows.start + offset, rows.stop + offset, device=s.device)[:, None]  # [r, 1]
        j = torch.arange(cols.start, cols.stop, device=s.device)[None, :]  # [1, c]
        s.masked_fill_(j > i, float("-inf"))  # [BH, r, c]


class _FlashAttention(torch.autograd.Function):
    """Inputs ``[BH, S, D]``; float16/bfloat16 run in float32 and ``out`` stays float32 (unrounded for backward)."""

    @staticmethod
    def forward(q, k, v, causal, scale, block_q, block_k):  # type: ignore[no-untyped-def]
        work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        qs = q.to(work) * scale  # [BH, S_q, D_k], upcast first, then scaled once
        kt, vw = k.to(work).transpose(1, 2), v.to(work)  # [BH, D_k, S_k], [BH, S_k, D_v]
        BH, S_q, S_k, offset = q.shape[0], q.shape[1], k.shape[1], k.shape[1] - q.shape[1]
        out, lse = qs.new_empty(BH, S_q, v.shape[-1]), qs.new_empty(BH, S_q)  # [BH, S_q, D_v], [BH, S_q]
        tile = qs.new_empty(BH, block_q, block_k)  # every full tile is computed in this one buffer
        key_blocks = [(cols, kt[:, :, cols], vw[:, cols]) for cols in _blocks(S_k, block_k)]  # [BH, D_k, c], [BH, c, D_v]
        for rows in _blocks(S_q, block_q):  # FlashAttention-2: one query block at a time ...
            q_blk, r = qs[:, rows], rows.stop - rows.start  # [BH, r, D_k]
            m, l = qs.new_full((BH, r, 1), float("-inf")), qs.new_zeros(BH, r, 1)  # [BH, r, 1] running max and sum
            acc = qs.new_zeros(BH, r, v.shape[-1])  # [BH, r, D_v] running sum of exp(score - m) * v
            for cols, k_blk, v_blk in key_blocks:  # ... walks over the key blocks it sees
                if not _sees(rows, cols, causal, offset):
                    break
                fits = tile.shape[1:] == (r, cols.stop - cols.start)
                s = torch.bmm(q_blk, k_blk, out=tile if fits else None)  # [BH, r, c] scaled scores
                _mask_future(s, rows, cols, causal, offset)
                m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # [BH, r, 1]
                p = s.sub_(m_new).exp_()  # [BH, r, c] exp(score - m_new), in place in the tile
                alpha = torch.exp(m - m_new)  # [BH, r, 1] rescales what was summed relative to m
                l = l * alpha + p.sum(dim=-1, keepdim=True)  # [BH, r, 1]
                torch.baddbmm(acc.mul_(alpha), p, v_blk, out=acc)  # [BH, r, D_v]: acc = acc * alpha + p @ v_blk
                m = m_new  # every row sees key 0 in its first tile, so m is finite from then on
            out[:, rows] = acc / l.clamp_min(1.0)  # l >= 1 (the max term is exp(0)); l = 0 only when S_k = 0
            lse[:, rows] = (m + torch.log(l)).squeeze(-1)  # [BH, r]
        return out, lse

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
        q, k, v, causal, scale, block_q, block_k = inputs
        ctx.save_for_backward(q, k, v, *output)  # out and lse; no [S_q, S_k] tensor is kept
        ctx.args = (causal, scale, block_q, block_k)

    @staticmethod
    def backward(ctx, d_out, d_lse):  # type: ignore[no-untyped-def]
        (q, k, v, out, lse), (causal, scale, block_q, block_k) = ctx.saved_tensors, ctx.args
        qs, kw, vw, d_out = q.to(lse.dtype) * scale, k.to(lse.dtype), v.to(lse.dtype), d_out.to(lse.dtype)
        # ds = p * (dp - delta) for every tile; the rowsum of p * dp equals rowsum(d_out * out)
        delta = (d_out * out).sum(dim=-1) - d_lse  # [BH, S_q]; d lse / d score = p
        dq, dk, dv, kt, offset = torch.zeros_like(qs), torch.zeros_like(kw), torch.zeros_like(vw), kw.mT, k.shape[1] - q.shape[1]
        for cols in _blocks(k.shape[1], block_k):  # one key block at a time ...
            for rows in _blocks(q.shape[1], block_q):  # ... walks over the query blocks that see it
                if not _sees(rows, cols, causal, offset):
                    continue
                s = torch.bmm(qs[:, rows], kt[:, :, cols])  # [BH, r, c] scaled scores, recomputed
                _mask_future(s, rows, cols, causal, offset)
                p = s.sub_(lse[:, rows, None]).exp_()  # [BH, r, c] the tile's weights, exactly
                dv[:, cols] += p.transpose(1, 2) @ d_out[:, rows]  # [BH, c, D_v]
                dp = d_out[:, rows] @ vw[:, cols].transpose(1, 2)  # [BH, r, c]
                ds = p * (dp - delta[:, rows, None])  # [BH, r, c] gradient of the scores
                dk[:, cols] += ds.transpose(1, 2) @ qs[:, rows]  # [BH, c, D_k], complete after the walk
                dq[:, rows] += ds @ kw[:, cols]  # [BH, r, D_k], accumulated over the key blocks
        return (dq * scale).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


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
        scale: multiplier for the dot products, a real number ``> 0`` (Python, NumPy or a 0-d tensor
            that does not require grad); ``None`` means ``1 / sqrt(D_k)``.
        block_q, block_k: the tile's query rows and keys (the result does not depend on them).
        return_lse: also return ``lse [..., S_q]``, ``log sum_j exp(score_ij)`` per query row.

    Returns:
        ``out [..., S_q, D_v]`` in the dtype of ``q`` (float16/bfloat16 are computed in float32;
        autocast does not apply), or ``(out, lse)`` with ``lse`` in float32 for half inputs, else in
        the dtype of ``q``. Degenerate shapes give what SDPA gives: ``S_k = 0`` zeros (``lse = -inf``),
        ``D_k = 0`` the mean of ``v``, an empty batch or ``S_q = 0`` an empty result.

    Raises:
        ValueError: on mismatched shapes, dtypes or devices, a bad block size or scale, a
            ``causal`` that is not a bool, ``causal=True`` with ``S_q > S_k``, or symbolic sizes.

    Gradients flow to ``q, k, v`` (also under ``torch.func.grad``), never to ``scale``.

    >>> q, k, v = torch.randn(2, 4, 100, 16), torch.randn(2, 4, 120, 16), torch.randn(2, 4, 120, 8)
    >>> out, lse = flash_attention(q, k, v, causal=True, block_q=32, block_k=64, return_lse=True)
    >>> out.shape, lse.shape  # [B, H, S_q, D_v], [B, H, S_q]
    (torch.Size([2, 4, 100, 8]), torch.Size([2, 4, 100]))
    """
    block_q, block_k = _checks.positive_int("block_q", block_q), _checks.positive_int("block_k", block_k)
    lead, (q3, k3, v3), causal, scale = _flatten(q, k, v, causal, scale)  # [BH, S, D] each
    with torch.autocast(q.device.type, enabled=False):  # the inputs' dtype rules; half runs in float32 anyway
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            out, lse = _FlashAttention.apply(q3, k3, v3, causal, scale, block_q, block_k)
        else:  # inference: on a CPU, one slice of the batch-heads per core
            out, lse = _per_core(lambda *t: _FlashAttention.forward(*t, causal, scale, block_q, block_k), q3, k3, v3)
    S_q = q.shape[-2]
    out, lse = out.to(q.dtype).reshape(*lead, S_q, v.shape[-1]), lse.reshape(*lead, S_q)  # [..., S_q, D_v], [..., S_q]
    return (out, lse) if return_lse else out


def _per_core(fn: Callable[..., tuple[Tensor, ...]], *tensors: Tensor) -> tuple[Tensor, ...]:
    """``fn`` on one slice of the batch-heads BH per CPU thread, each single-threaded: a multi-threaded
    operation waits for its slowest thread, slow on a machine that other programs share."""
    threads, n = torch.get_num_threads(), min(torch.get_num_threads(), tensors[0].shape[0])
    small = tensors[0].shape[1] * tensors[1].shape[1] < 2**16  # not worth the threads; nor while tracing
    if tensors[0].device.type != "cpu" or n < 2 or small or _checks.tracing():
        return fn(*tensors)
    try:
        with ThreadPoolExecutor(n, initializer=torch.set_num_threads, initargs=(1,)) as pool:
            parts = list(pool.map(lambda ts: fn(*ts), zip(*(t.tensor_split(n) for t in tensors))))
    finally:  # the new threads' setting would otherwise become the default for later threads
        torch.set_num_threads(threads)
    return tuple(torch.cat(outs) for outs in zip(*parts))


def _flatten(q: Tensor, k: Tensor, v: Tensor, causal: object, scale: object) -> tuple[list[int], list[Tensor], bool, float]:
    """Validate, then view every leading dim (B, H, ...) as one batch axis BH: ``[BH, S, D]``."""
    _checks.qkv(q, k, v)
    causal = _checks.flag("causal", causal, "; flash attention takes no mask tensor, only causal=True/False")
    if not all(isinstance(n, int) for n in (*q.shape, *k.shape, *v.shape)):
        raise ValueError(f"flash attention loops over blocks in Python and needs concrete sizes, got symbolic "
                         f"q {tuple(q.shape)}; export with static shapes or use F.scaled_dot_product_attention")
    *lead, S_q, D_k = q.shape
    if causal and S_q > k.shape[-2]:
        raise ValueError(f"causal=True needs S_q <= S_k (queries are the last S_q of S_k), got S_q = {S_q}, S_k = {k.shape[-2]}")
    scale = 1.0 / math.sqrt(max(D_k, 1)) if scale is None else _checks.constant_scalar("scale", scale)
    return lead, [t.reshape(math.prod(lead), *t.shape[-2:]) for t in (q, k, v)], causal, scale
