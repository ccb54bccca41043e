"""Counting what attention costs: parameters, FLOPs and the bytes of the attention weights.

Everything here is exact and machine independent: a count, not a measurement.

Shapes follow the legend in :mod:`attnlib`.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from . import _checks

__all__ = [
    "mha_param_count",
    "mha_matmul_flops",
    "count_flops",
    "flops_by_op",
    "attention_weights_bytes",
    "kv_cache_bytes",
]


def mha_param_count(d_model: int, num_heads: int, bias: bool = True, num_kv_heads: int | None = None) -> int:
    """Parameters of one multi-head attention block (``w_q``, ``w_k``, ``w_v``, ``w_o``).

    With ``H_kv = H`` (classic multi-head attention) this is ``4 D^2 + 4 D`` with biases and
    ``4 D^2`` without: it does not depend on ``H``. With fewer key/value heads
    (``D_k = D / H``) the key and value projections shrink to ``D x H_kv D_k`` each.

    Args:
        d_model: ``D``.
        num_heads: ``H``; must divide ``D``.
        bias: whether the four projections have biases.
        num_kv_heads: ``H_kv`` (default ``H``); must divide ``H``.

    Returns:
        The number of scalars, as ``sum(p.numel() for p in MultiHeadSelfAttention(...).parameters())``.

    >>> mha_param_count(768, 12), mha_param_count(768, 12, num_kv_heads=4)
    (2362368, 1574912)
    """
    D, H, H_kv = _checks.head_counts(d_model, num_heads, num_kv_heads)
    kv_width = H_kv * (D // H)
    weights = D * D + 2 * D * kv_width + D * D  # w_q, w_k + w_v, w_o
    biases = (D + 2 * kv_width + D) if bias else 0
    return weights + biases


def mha_matmul_flops(batch: int, seq_len: int, d_model: int) -> int:
    """FLOPs of the matrix multiplications of one self-attention forward pass (``H_kv = H``).

    Counts a multiply-add as 2 FLOPs, as ``torch.utils.flop_counter.FlopCounterMode`` does:
    four projections ``4 * 2 B S D^2`` plus ``Q K^T`` and ``weights @ V``, ``2 * 2 B S^2 D``.
    ``H`` does not appear. Biases, scaling, masking and softmax (elementwise work that grows as
    ``B H S^2``) are not included.

    >>> mha_matmul_flops(batch=1, seq_len=256, d_model=512)
    671088640
    """
    B = _checks.positive_int("batch", batch)
    S = _checks.positive_int("seq_len", seq_len)
    D = _checks.positive_int("d_model", d_model)
    return 8 * B * S * D * D + 4 * B * S * S * D


def flops_by_op(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, int]:
    """Run ``fn(*args, **kwargs)`` under ``FlopCounterMode`` and return FLOPs per ATen op.

    Only ops with a registered FLOP formula (matmuls, convolutions, some attention kernels) are
    counted; elementwise ops (softmax, division, masking) count as 0. Runs under ``no_grad``.

    >>> flops_by_op(torch.nn.Linear(4, 3), torch.zeros(2, 4))  # 2 * (2 * 4 * 3)
    {'aten.addmm': 48}
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        fn(*args, **kwargs)
    return {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}


def count_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Total FLOPs that ``FlopCounterMode`` sees for ``fn(*args, **kwargs)`` (see :func:`flops_by_op`).

    >>> count_flops(torch.nn.Linear(4, 3), torch.zeros(2, 4))
    48
    """
    return sum(flops_by_op(fn, *args, **kwargs).values())


_DTYPE_BYTES = {torch.float64: 8, torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}


def attention_weights_bytes(
    batch: int, num_heads: int, seq_len: int, dtype: torch.dtype = torch.float32, *, seq_len_k: int | None = None
) -> int:
    """Bytes of a materialised ``[B, H, S_q, S_k]`` attention-weights tensor (``S_k = S_q`` by default).

    >>> attention_weights_bytes(1, 8, 4096) // 2**20  # MiB
    512
    """
    B = _checks.positive_int("batch", batch)
    H = _checks.positive_int("num_heads", num_heads)
    S_q = _checks.positive_int("seq_len", seq_len)
    S_k = S_q if seq_len_k is None else _checks.positive_int("seq_len_k", seq_len_k)
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(map(str, _DTYPE_BYTES))}, got {dtype!r}")
    return B * H * S_q * S_k * _DTYPE_BYTES[dtype]


def kv_cache_bytes(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    seq_len: int = 1,
    batch: int = 1,
    dtype_bytes: int = 2,
) -> int:
    """Bytes a decoder's KV cache holds: keys **and** values of every layer, KV head and position.

    ``2 (K and V) * layers * H_kv * D_k * S * B * bytes per number``. Only the key/value heads
    count: with grouped-query attention several query heads read the same cached head, so
    ``H_kv`` (not the number of query heads ``H``) sets the size. ``seq_len=1, batch=1`` gives
    the bytes per token.

    Args:
        num_layers: attention layers, each with its own cache.
        num_kv_heads: ``H_kv`` (``= H`` for multi-head, ``1`` for multi-query attention).
        head_dim: ``D_k``, the width of one key (and one value) vector.
        seq_len: cached positions ``S``.
        batch: sequences ``B`` decoded together.
        dtype_bytes: bytes per number (2 for float16/bfloat16, 4 for float32, 1 for 8-bit).

    Returns:
        The size in bytes (an exact count).

    Llama 2 7B (32 layers, 32 heads of width 128, float16), bytes per token:

    >>> kv_cache_bytes(32, 32, 128)
    524288
    """
    args = dict(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, seq_len=seq_len,
                batch=batch, dtype_bytes=dtype_bytes)
    sizes = [_checks.positive_int(name, value) for name, value in args.items()]  # Python ints: NumPy's would overflow
    return 2 * math.prod(sizes)
