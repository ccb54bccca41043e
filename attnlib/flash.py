"""Flash-style attention: ``softmax(q k^T) v`` and its gradients without the ``[S_q, S_k]`` matrix.

FlashAttention (Dao et al., 2022; FlashAttention-2, Dao 2023), in plain PyTorch so every step reads:

* **Forward.** The keys are cut into blocks of ``block_k``, the queries into blocks of ``block_q``.
  On a GPU each query block is one program that walks over the key blocks; here all query blocks
  walk *in step* (FlashAttention-2's parallelism over query blocks): the one loop runs over the key
  blocks, and each step handles every query row that can see that key block with one batched matmul,
  a tile ``[rows, block_k]``. Every query row keeps three running quantities: ``m`` (the largest
  score so far), ``l`` (the sum of ``exp(score - m)``) and ``acc`` (the sum of ``exp(score - m) * v``).
  When a tile raises the maximum, ``l`` and ``acc`` are rescaled by ``exp(m_old - m_new)``: the
  *online softmax* (Milakov & Gimelshein, 2018). At the end ``out = acc / l`` and
  ``lse = m + log(l)``, the log of each row's softmax denominator.
* **Backward.** Only ``q, k, v``, ``out`` and ``lse`` are kept. The loop again runs over the key
  blocks (as FlashAttention-2's backward does): each tile's weights come back as
  ``p = exp(score - lse)``, with no running max needed; the key block's ``dk`` and ``dv`` are
  complete after its one step, and ``dq`` of the rows that see it is accumulated.

Only tiles ``[rows, block_k]`` (times the batch/head dims) ever exist: extra memory grows like
``S * block_k``, not ``S^2``. Causal: query blocks entirely before a key block skip it. The loop
has ``ceil(S_k / block_k)`` steps of about a dozen large operations. On a GPU each line below is a
kernel that reads and writes HBM; :func:`attnlib.triton_flash.triton_flash_attention` fuses one
query block's walk into one kernel. In practice, use PyTorch's ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from . import _checks

__all__ = ["flash_attention", "BLOCK_Q", "BLOCK_K"]

#: Default tile edges (``make bench``): ``BLOCK_Q`` sets which rows skip a key block (causal), ``BLOCK_K``
#: the keys per step; a tile ``[N, S_q, BLOCK_K]`` float32 is 32 MiB for N = 8, S_q = 8192.
BLOCK_Q, BLOCK_K = 64, 128


def _key_blocks(S_q: int, S_k: int, block_q: int, block_k: int, causal: bool) -> Iterator[tuple[slice, slice]]:
    """Each block of keys with the query rows that see it: the query blocks not entirely before it."""
    offset = S_k - S_q  # query i sits at absolute position i + offset (bottom-right alignment)
    for k0 in range(0, S_k, block_k):
        first = max(0, k0 - offset) // block_q * block_q if causal else 0  # first query block that sees key k0
        yield slice(first, S_q), slice(k0, min(k0 + block_k, S_k))


def _scores(qs: Tensor, k: Tensor, rows: slice, cols: slice, causal: bool, offset: int) -> Tensor:
    """One tile of scaled scores ``qs[rows] k[cols]^T``, the future set to -inf when causal."""
    s = qs[:, rows] @ k[:, cols].transpose(1, 2)  # [N, R, D_k] @ [N, D_k, bk] -> [N, R, bk]
    last = min(rows.stop, cols.stop - 1 - offset)  # rows from `last` on see every key of the block
    if causal and last > rows.start:
        i = torch.arange(rows.start + offset, last + offset, device=s.device)[:, None]  # [r, 1]
        j = torch.arange(cols.start, cols.stop, device=s.device)[None, :]  # [1, bk]
        s[:, : last - rows.start].masked_fill_(j > i, float("-inf"))  # [N, r, bk], in place: s is this tile's own
    return s


class _FlashAttention(torch.autograd.Function):
    """Inputs ``[N, S, D]``; float16/bfloat16 run in float32 and ``out`` stays float32 (unrounded for backward)."""

    @staticmethod
    def forward(q, k, v, causal, scale, block_q, block_k):  # type: ignore[no-untyped-def]
        work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        qs = q.to(work) * scale  # [N, S_q, D_k], upcast first, then scaled once
        kw, vw = k.to(work), v.to(work)  # [N, S_k, D_k], [N, S_k, D_v]
        N, S_q, S_k = q.shape[0], q.shape[1], k.shape[1]
        m = torch.full((N, S_q, 1), float("-inf"), dtype=work, device=q.device)  # [N, S_q, 1] running max
        l = torch.zeros_like(m)  # [N, S_q, 1] running sum of exp(score - m)
        acc = torch.zeros(N, S_q, v.shape[-1], dtype=work, device=q.device)  # [N, S_q, D_v]
        for rows, cols in _key_blocks(S_q, S_k, block_q, block_k, causal):
            s = _scores(qs, kw, rows, cols, causal, S_k - S_q)  # [N, R, bk], R rows see this key block
            m_new = torch.maximum(m[:, rows], s.amax(dim=-1, keepdim=True))  # [N, R, 1]
            p = torch.exp(s - m_new)  # [N, R, bk] exp(score - m_new), out of place (see the tests' first-call check)
            alpha = torch.exp(m[:, rows] - m_new)  # [N, R, 1] rescales what was summed relative to m
            l[:, rows] = l[:, rows] * alpha + p.sum(dim=-1, keepdim=True)  # [N, R, 1]
            acc[:, rows] = torch.baddbmm(acc[:, rows] * alpha, p, vw[:, cols])  # [N, R, D_v] += [N, R, bk] @ [N, bk, D_v]
            m[:, rows] = m_new
        out = acc / l.clamp_min(1.0)  # [N, S_q, D_v]; l >= 1 (the max term is exp(0)), l = 0 only when S_k = 0
        lse = (m + torch.log(l)).squeeze(-1)  # [N, S_q]
        return out, lse

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
        q, k, v, causal, scale, block_q, block_k = inputs
        ctx.save_for_backward(q, k, v, *output)  # out and lse; no [S_q, S_k] tensor is kept
        ctx.args = (causal, scale, block_q, block_k)

    @staticmethod
    def backward(ctx, d_out, d_lse):  # type: ignore[no-untyped-def]
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale, block_q, block_k = ctx.args
        work = lse.dtype
        qs, kw, vw, d_out = q.to(work) * scale, k.to(work), v.to(work), d_out.to(work)
        # ds = p * (dp - delta) for every tile; the rowsum of p * dp equals rowsum(d_out * out)
        delta = (d_out * out).sum(dim=-1) - d_lse  # [N, S_q]; d lse / d score = p
        dq, dk, dv = torch.zeros_like(qs), torch.zeros_like(kw), torch.zeros_like(vw)
        S_q, S_k = q.shape[1], k.shape[1]
        for rows, cols in _key_blocks(S_q, S_k, block_q, block_k, causal):
            s = _scores(qs, kw, rows, cols, causal, S_k - S_q)  # [N, R, bk] recomputed
            p = torch.exp(s - lse[:, rows, None])  # [N, R, bk] the tile's weights, exactly
            dv[:, cols] = p.transpose(1, 2) @ d_out[:, rows]  # [N, bk, D_v], complete in one step
            dp = d_out[:, rows] @ vw[:, cols].transpose(1, 2)  # [N, R, bk]
            ds = p * (dp - delta[:, rows, None])  # [N, R, bk] gradient of the scores
            dk[:, cols] = ds.transpose(1, 2) @ qs[:, rows]  # [N, bk, D_k], complete in one step
            dq[:, rows] += ds @ kw[:, cols]  # [N, R, D_k], accumulated over the key blocks
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
        block_q, block_k: query rows per block (causal: a query block skips the key blocks entirely
            in its future) and keys per step; the result does not depend on them.
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
    lead, (q3, k3, v3), causal, scale = _flatten(q, k, v, causal, scale)  # [N, S, D] each
    with torch.autocast(q.device.type, enabled=False):  # the inputs' dtype rules; half runs in float32 anyway
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            out, lse = _FlashAttention.apply(q3, k3, v3, causal, scale, block_q, block_k)
        else:  # inference: on a CPU, one slice of the batch-heads per core
            out, lse = _per_core(lambda *t: _FlashAttention.forward(*t, causal, scale, block_q, block_k), q3, k3, v3)
    S_q = q.shape[-2]
    out, lse = out.to(q.dtype).reshape(*lead, S_q, v.shape[-1]), lse.reshape(*lead, S_q)  # [..., S_q, D_v], [..., S_q]
    return (out, lse) if return_lse else out


def _per_core(fn: Callable[..., tuple[Tensor, ...]], *tensors: Tensor) -> tuple[Tensor, ...]:
    """``fn`` on one slice of the batch-heads N per CPU thread, each single-threaded: a multi-threaded
    operation waits for its slowest thread, slow on a machine that other programs share."""
    threads = torch.get_num_threads()
    n = min(threads, tensors[0].shape[0])
    small = tensors[0].shape[1] * tensors[1].shape[1] < 2**16  # not worth the threads; nor while tracing
    if tensors[0].device.type != "cpu" or n < 2 or small or _checks.tracing():
        return fn(*tensors)
    with ThreadPoolExecutor(n, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        parts = list(pool.map(lambda ts: fn(*ts), zip(*(t.tensor_split(n) for t in tensors))))
    torch.set_num_threads(threads)  # the new threads' setting would otherwise become the default for later threads
    return tuple(torch.cat(outs) for outs in zip(*parts))


def _flatten(q: Tensor, k: Tensor, v: Tensor, causal: object, scale: object) -> tuple[list[int], list[Tensor], bool, float]:
    """Validate, then view every leading dim (B, H, ...) as one batch axis N: ``[N, S, D]``."""
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
