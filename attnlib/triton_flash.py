"""FlashAttention's forward pass as one fused Triton kernel (after Triton's fused-attention tutorial).

:func:`attnlib.flash_attention` runs the tiled algorithm as many small PyTorch operations; on a
GPU each of them is a kernel that reads its inputs from HBM and writes its result back. Here one
*program instance* handles one block of ``BLOCK_Q`` queries of one (batch, head) from start to end:
the query block is loaded once, the key/value blocks stream past it, and the scores, the running
max ``m``, the sum ``l`` and the accumulator ``acc`` live in registers and shared memory (SRAM)
until the finished rows are written. HBM sees q, k, v read and out, lse written, never a tile.

The backward pass is the recomputing one of :mod:`attnlib.flash` (PyTorch tiles, no ``[S, S]``).
Needs Triton (``pip install triton``, imported on first use: installing it after a failed call
needs no restart) and a CUDA GPU; on a CPU, Triton's interpreter runs the same kernel on CPU
tensors when ``TRITON_INTERPRET=1`` is set before ``triton`` is first imported.

Precision: float32 products use ``tl.dot(..., input_precision="ieee")`` (Triton's default on NVIDIA GPUs
of compute capability 8.0+ is TF32, 10-bit mantissas, errors near 1e-3 against SDPA; IEEE float32 matches
SDPA to about 1e-6, at a fraction of the tensor cores' speed). Half types pass ``None``: each backend's default.
"""

from __future__ import annotations

import importlib
import os

import torch
from torch import Tensor

from . import _checks
from .flash import BLOCK_K as TORCH_BLOCK_K, BLOCK_Q as TORCH_BLOCK_Q, _FlashAttention, _flatten, flash_attention

triton = tl = _kernel = None  # imported on the first call (attnlib never needs Triton), retried until it works

__all__ = ["triton_flash_attention"]


def _forward_kernel(Q, K, V, Out, Lse,  # [BH, S_q, D_k], [BH, S_k, D_k], [BH, S_k, D_v], [BH, S_q, D_v], [BH, S_q]
                    S_q, S_k, D_k, D_v, scale,
                    CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)  # which (batch, head) pair, of BH
    rows = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)  # [BLOCK_Q] this program's queries
    dk = tl.arange(0, BLOCK_DK)  # [BLOCK_DK] feature index (a power of two >= D_k; the rest masked)
    dv = tl.arange(0, BLOCK_DV)  # [BLOCK_DV]
    q = tl.load(Q + bh * S_q * D_k + rows[:, None] * D_k + dk[None, :],
                mask=(rows[:, None] < S_q) & (dk[None, :] < D_k), other=0.0)  # [BLOCK_Q, BLOCK_DK] stays in SRAM
    m = tl.full([BLOCK_Q], float("-inf"), tl.float32)  # running max per query row
    l = tl.zeros([BLOCK_Q], tl.float32)  # running sum of exp(score - m)
    acc = tl.zeros([BLOCK_Q, BLOCK_DV], tl.float32)  # running sum of exp(score - m) * v
    offset = S_k - S_q  # query i sits at position i + offset (bottom-right causal)
    k_end = S_k
    if CAUSAL:  # key blocks entirely in this block's future are never loaded
        k_end = tl.minimum(S_k, (tl.program_id(0) + 1) * BLOCK_Q + offset)
    for k0 in range(0, k_end, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)  # [BLOCK_K] this step's keys
        kt = tl.load(K + bh * S_k * D_k + cols[None, :] * D_k + dk[:, None],
                     mask=(cols[None, :] < S_k) & (dk[:, None] < D_k), other=0.0)  # [BLOCK_DK, BLOCK_K] k^T
        s = tl.dot(q, kt, input_precision=PRECISION) * scale  # [BLOCK_Q, BLOCK_K] scores, accumulated and scaled in float32
        visible = cols[None, :] < S_k  # [1, BLOCK_K] padding past the last key is hidden
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)  # [BLOCK_Q, BLOCK_K]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # [BLOCK_Q] the online softmax, as in attnlib.flash
        p = tl.exp(s - m_new[:, None])  # [BLOCK_Q, BLOCK_K]
        alpha = tl.exp(m - m_new)  # [BLOCK_Q] rescales what was summed relative to m
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(V + bh * S_k * D_v + cols[:, None] * D_v + dv[None, :],
                    mask=(cols[:, None] < S_k) & (dv[None, :] < D_v), other=0.0)  # [BLOCK_K, BLOCK_DV]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)  # [BLOCK_Q, BLOCK_DV]
        m = m_new
    out = acc / l[:, None]  # [BLOCK_Q, BLOCK_DV], the only write of the output
    tl.store(Out + bh * S_q * D_v + rows[:, None] * D_v + dv[None, :], out.to(Out.dtype.element_ty),
             mask=(rows[:, None] < S_q) & (dv[None, :] < D_v))
    tl.store(Lse + bh * S_q + rows, m + tl.log(l), mask=rows < S_q)  # [BLOCK_Q] for the backward pass


def _import_triton() -> None:
    """Import Triton and decorate the kernel, or raise ImportError; a later call tries again."""
    global triton, tl, _kernel
    if _kernel is None:
        importlib.invalidate_caches()  # see a Triton installed after this process started
        try:
            triton, tl = importlib.import_module("triton"), importlib.import_module("triton.language")
        except ImportError as e:
            raise ImportError("attnlib.triton_flash_attention needs Triton: pip install triton, then call it again") from e
        _kernel = triton.jit(_forward_kernel)  # compiled (or interpreted, under TRITON_INTERPRET=1) when first run


class _TritonFlashAttention(_FlashAttention):
    """Forward: the Triton kernel. Backward: inherited, the recomputing PyTorch tiles."""

    @staticmethod
    def forward(q, k, v, causal, scale, block_q, block_k):  # type: ignore[no-untyped-def]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # [BH, S, D], rows packed
        (BH, S_q, D_k), S_k, D_v = q.shape, k.shape[1], v.shape[2]
        out = torch.empty(BH, S_q, D_v, dtype=torch.float32, device=q.device)  # [BH, S_q, D_v], rounded by the caller
        lse = torch.empty(BH, S_q, dtype=torch.float32, device=q.device)  # [BH, S_q]
        grid = (triton.cdiv(S_q, block_q), BH)  # one program instance per (query block, batch-head)
        _kernel[grid](q, k, v, out, lse, S_q, S_k, D_k, D_v, scale, CAUSAL=causal,
                      BLOCK_Q=block_q, BLOCK_K=block_k,
                      BLOCK_DK=max(16, triton.next_power_of_2(D_k)),
                      BLOCK_DV=max(16, triton.next_power_of_2(D_v)),
                      PRECISION="ieee" if q.dtype == torch.float32 else None)  # half: None, each backend's default
        return out, lse

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
        _FlashAttention.setup_context(ctx, inputs, output)
        ctx.args = (*ctx.args[:2], TORCH_BLOCK_Q, TORCH_BLOCK_K)  # the backward runs PyTorch's tiles


def triton_flash_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
                           scale: float | None = None, block_q: int = 64, block_k: int = 64) -> Tensor:
    """Fused FlashAttention forward (Triton) with the recomputing backward of :mod:`attnlib.flash`.

    Same inputs, causal convention (bottom-right) and result as :func:`attnlib.flash_attention`.

    Args:
        q, k, v: ``[..., S_q, D_k]``, ``[..., S_k, D_k]``, ``[..., S_k, D_v]``; CUDA tensors, or
            CPU tensors under ``TRITON_INTERPRET=1``. float16, bfloat16 or float32 (IEEE float32
            products, not TF32: see the module docstring).
        causal: hide keys in each query's future (needs ``S_q <= S_k``).
        scale: multiplier for the dot products; ``None`` means ``1 / sqrt(D_k)``.
        block_q, block_k: tile edges, powers of two >= 16 (``tl.dot`` needs 16), Python or NumPy ints.

    Returns:
        ``[..., S_q, D_v]`` in the dtype of ``q``.

    >>> q = k = v = torch.randn(2, 4, 100, 32, device="cuda", dtype=torch.float16)  # doctest: +SKIP
    >>> triton_flash_attention(q, k, v, causal=True).shape  # doctest: +SKIP
    torch.Size([2, 4, 100, 32])
    """
    _import_triton()
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if not _checks.is_int(b) or b < 16 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {b!r}")
    lead, (q3, k3, v3), causal, scale = _flatten(q, k, v, causal, scale)  # [BH, S, D] each
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"triton_flash_attention takes float16, bfloat16 or float32, got {q.dtype}")
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if q.device.type == "cpu" and not (interpreted and type(tl.max).__name__ == "InterpretedFunction"):
        raise ValueError("q is on the CPU: Triton runs on CUDA, or on the CPU with TRITON_INTERPRET=1 set "
                         "before triton is first imported (torch.compile and PyTorch's FLOP counter import it)")
    if interpreted and q.dtype == torch.bfloat16:  # Triton's interpreter has no bfloat16 tl.dot (triton#11584)
        raise ValueError("Triton's interpreter (TRITON_INTERPRET=1) cannot run bfloat16; use float16 or float32 on the CPU")
    if q3.numel() == 0 or k3.shape[1] == 0:  # nothing to launch; the PyTorch tiles give SDPA's empty result
        return flash_attention(q, k, v, causal=causal, scale=scale)
    out, _ = _TritonFlashAttention.apply(q3, k3, v3, causal, scale, int(block_q), int(block_k))
    return out.to(q.dtype).reshape(*lead, q.shape[-2], v.shape[-1])  # [..., S_q, D_v]
