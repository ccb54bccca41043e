"""Checkers for chapter 8, *Cost, memory and efficient attention*.

* :func:`check_online_softmax_update`: one step of the online softmax (fold a tile of scores
  into the running max ``m``, running sum ``l`` and running output ``acc``).
* :func:`check_kv_cache_size`: bytes of a decoder's KV cache per token.

Both diagnose the usual mistakes: a running sum or output not rescaled by ``exp(m_old - m_new)``,
the new tile exponentiated against the old maximum, NaN on the first tile (``m = -inf``); K
counted without V, query heads instead of key/value heads, a forgotten layer count, bits for bytes.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from .feedback import Feedback, close, correct, run_reader_code, wrong

__all__ = [
    "reference_online_update",
    "check_online_softmax_update",
    "reference_kv_cache_size",
    "check_kv_cache_size",
]


def reference_online_update(m: Tensor, l: Tensor, acc: Tensor, s: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Fold one tile into the running statistics of the online softmax.

    Args:
        m: ``[S_q, 1]`` running maximum of the scores seen so far (``-inf`` before the first tile).
        l: ``[S_q, 1]`` running sum of ``exp(score - m)``.
        acc: ``[S_q, D_v]`` running sum of ``exp(score - m) * v``.
        s: ``[S_q, S_blk]`` this tile's scores.
        v: ``[S_blk, D_v]`` this tile's values.

    Returns:
        ``(m_new, l_new, acc_new)`` with the same shapes as ``(m, l, acc)``.
    """
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # [S_q, 1]
    p = torch.exp(s - m_new)  # [S_q, S_blk]
    alpha = torch.exp(m - m_new)  # [S_q, 1], 0 on the first tile (m = -inf)
    l_new = l * alpha + p.sum(dim=-1, keepdim=True)  # [S_q, 1]
    acc_new = acc * alpha + p @ v  # [S_q, D_v]
    return m_new, l_new, acc_new


def _case(seed: int) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(3, 8, generator=gen, dtype=torch.float64) * 3  # [S_q, S_k] scores, two tiles of 4
    s[0, 4:] += 6  # query 0's maximum is in the second tile: the rescaling matters
    v = torch.randn(8, 2, generator=gen, dtype=torch.float64)  # [S_k, D_v]
    return s, v, torch.softmax(s, dim=-1) @ v  # [S_q, D_v] the answer after both tiles



def check_online_softmax_update(fn: Callable[..., Any]) -> Feedback:
    """Check ``fn(m, l, acc, s, v) -> (m_new, l_new, acc_new)``, one online-softmax step.

    The checker starts from ``m = -inf, l = 0, acc = 0``, folds two tiles of four keys with the
    reader's function, and compares with :func:`reference_online_update` and with
    ``softmax(s) @ v``. Query 0's largest score sits in the second tile, so a missing rescale shows.
    """
    s, v, expected = _case(8)
    S_q, D_v = s.shape[0], v.shape[1]
    m0 = torch.full((S_q, 1), float("-inf"), dtype=torch.float64)
    l0 = torch.zeros(S_q, 1, dtype=torch.float64)
    acc0 = torch.zeros(S_q, D_v, dtype=torch.float64)

    result, fb = run_reader_code(fn, m0.clone(), l0.clone(), acc0.clone(), s[:, :4].clone(), v[:4].clone())
    if fb is not None:
        return fb
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        return wrong(f"return three tensors (m_new, l_new, acc_new), got {type(result).__name__}.")
    ref1 = reference_online_update(m0, l0, acc0, s[:, :4], v[:4])
    for name, got, exp in zip(("m_new", "l_new", "acc_new"), result, ref1):
        if not isinstance(got, Tensor):
            return wrong(f"{name} should be a torch.Tensor, got {type(got).__name__}.")
        if tuple(got.shape) != tuple(exp.shape):
            return wrong(f"{name} has shape {tuple(got.shape)}, expected {tuple(exp.shape)} (keep dims with keepdim=True).")
        if torch.isnan(got).any():
            return wrong(
                f"{name} contains NaN on the first tile, where m = -inf: compute the new maximum first and "
                "exponentiate against m_new (exp(m - m_new) = exp(-inf) = 0 is fine; -inf - (-inf) is not)."
            )
    m1, l1, acc1 = result
    if not close(m1, ref1[0]):
        return wrong("m_new should be the larger of the old running max and this tile's row max: torch.maximum(m, s.amax(-1, keepdim=True)).")
    if not (close(l1, ref1[1]) and close(acc1, ref1[2])):
        return wrong("after the first tile, l_new should be sum(exp(s - m_new)) per row and acc_new = exp(s - m_new) @ v.")

    result2, fb = run_reader_code(fn, m1.detach().clone(), l1.detach().clone(), acc1.detach().clone(), s[:, 4:].clone(), v[4:].clone())
    if fb is not None:
        return fb
    if not isinstance(result2, (tuple, list)) or len(result2) != 3:
        return wrong(f"return three tensors (m_new, l_new, acc_new), got {type(result2).__name__}.")
    m2, l2, acc2 = result2
    ref2 = reference_online_update(*ref1, s[:, 4:], v[4:])
    if not close(m2, ref2[0]):
        return wrong("on the second tile m_new is wrong: it must be torch.maximum(m_old, tile max), not the tile max alone.")
    m_ref = ref2[0]
    p_old = torch.exp(s[:, 4:] - ref1[0])  # the new tile exponentiated against the OLD maximum
    if close(l2, ref1[1] + torch.exp(s[:, 4:] - m_ref).sum(-1, keepdim=True)):
        return wrong("you forgot to rescale the running sum l by exp(m_old - m_new) before adding the new tile.")
    if close(l2, ref1[1] * torch.exp(ref1[0] - m_ref) + p_old.sum(-1, keepdim=True)) or close(l2, ref1[1] + p_old.sum(-1, keepdim=True)):
        return wrong("exponentiate the new tile against the new maximum: exp(s - m_new), not exp(s - m_old).")
    if not close(l2, ref2[1]):
        return wrong("l_new is off after the second tile: l_new = l * exp(m_old - m_new) + sum(exp(s - m_new)).")
    if close(acc2, ref1[2] + torch.exp(s[:, 4:] - m_ref) @ v[4:]):
        return wrong("you rescaled l but not acc: acc also needs the factor exp(m_old - m_new) before adding exp(s - m_new) @ v.")
    if not close(acc2, ref2[2]):
        return wrong("acc_new is off after the second tile: acc_new = acc * exp(m_old - m_new) + exp(s - m_new) @ v.")
    if not close(acc2 / l2, expected):
        return wrong("the running values are consistent with the reference but acc / l is not softmax(s) @ v.")  # pragma: no cover
    return correct("two tiles folded online give exactly softmax(s) @ v: this is the heart of FlashAttention.")


def reference_kv_cache_size(num_layers: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of KV cache per token: ``2 * layers * H_kv * D_k * bytes`` (``num_heads`` plays no part)."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


# (layers, query heads, kv heads, head dim, bytes): an MQA case whose factors all differ (so each
# mistake has its own signature), then a Llama-2-70B-like GQA case.
_KV_CASES = [(6, 12, 1, 40, 4), (80, 64, 8, 128, 2)]


def check_kv_cache_size(fn: Callable[..., Any]) -> Feedback:
    """Check ``fn(num_layers, num_heads, num_kv_heads, head_dim, dtype_bytes) -> bytes per token``."""
    for case in _KV_CASES:
        layers, H, H_kv, d_k, nbytes = case
        got, fb = run_reader_code(fn, *case)
        if fb is not None:
            return fb
        if isinstance(got, Tensor):
            got = got.item()
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return wrong(f"return a number of bytes, got {type(got).__name__}.")
        expected = reference_kv_cache_size(*case)
        if got == expected:
            continue
        where = f"for layers={layers}, H={H}, H_kv={H_kv}, D_k={d_k}, {nbytes} bytes per number"
        if got * 2 == expected:
            return wrong(f"{where} you get half the answer: you counted K but not V (the cache holds both).")
        if got == expected * H // H_kv or got * 2 == expected * H // H_kv:
            return wrong(f"{where}: you used the query heads H = {H} instead of the key/value heads H_kv = {H_kv}; only KV heads are cached.")
        if got * layers == expected:
            return wrong(f"{where}: every layer keeps its own cache; multiply by the number of layers.")
        if got == expected * 8:
            return wrong(f"{where}: that is bits, not bytes (you multiplied by 8 bits per byte, or used 16 for float16).")
        if got * nbytes == expected:
            return wrong(f"{where}: you counted numbers, not bytes; multiply by dtype_bytes.")
        return wrong(f"{where} the cache holds {expected} bytes per token, you returned {got}.")
    return correct("2 (K and V) x layers x KV heads x head dim x bytes: for the 70B-style model that is 320 KiB per token.")
