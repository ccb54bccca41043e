"""Checkers for chapter 3, *Scaling and temperature*.

* :func:`check_scaled_weights`: the reader writes ``softmax(q k^T / sqrt(D_k) / T)``.
* :func:`check_entropy`: the reader writes the entropy (in nats) of each row of weights.

Each checker runs the reader's function on fixed inputs and, when the answer is wrong, compares it
with the usual mistakes (dividing by ``D_k``, scaling after softmax, ``log2`` instead of ``ln``, ...)
to say which one it looks like.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from .feedback import Feedback, close, compare_tensors, correct, run_reader_code, wrong

__all__ = ["check_scaled_weights", "check_entropy", "entropy"]



def entropy(weights: Tensor) -> Tensor:
    """Entropy in nats of each row of weights: ``-sum_j p_j ln p_j`` with ``0 ln 0 = 0``.

    Args:
        weights: ``[..., S_k]`` non-negative rows that sum to 1.

    Returns:
        ``[...]`` entropies, each between 0 (one-hot) and ``ln S_k`` (uniform).
    """
    return -torch.special.xlogy(weights, weights).sum(dim=-1)  # [..., S_k] -> [...]



def _qk() -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 5, 16, generator=gen)  # [B, S_q, D_k]: S_q = 5, D_k = 16, sqrt(D_k) = 4
    k = torch.randn(2, 6, 16, generator=gen)  # [B, S_k, D_k]: S_k = 6
    return q, k


def check_scaled_weights(fn: Callable[[Tensor, Tensor, float], Tensor]) -> Feedback:
    """Check ``fn(q, k, temperature) -> weights``.

    ``q: [..., S_q, D_k]``, ``k: [..., S_k, D_k]``; the answer is
    ``softmax(q @ k^T / sqrt(D_k) / temperature)`` over the key axis, ``[..., S_q, S_k]``.
    The checker uses ``S_q = 5``, ``S_k = 6``, ``D_k = 16`` and a leading batch axis of 2,
    so that every wrong divisor gives a different answer.
    """
    q, k = _qk()
    d_k, s_q, s_k = q.shape[-1], q.shape[-2], k.shape[-2]
    raw = q @ k.transpose(-2, -1)  # [B, S_q, S_k] unscaled dot products

    def sm(x: Tensor, dim: int = -1) -> Tensor:
        return torch.softmax(x, dim=dim)

    got, fb = run_reader_code(fn, q.clone(), k.clone(), 1.0)
    if fb is not None:
        if fb.status == "wrong":  # maybe it only works without the batch axis (k.T on a 3-D tensor)
            got2, fb2 = run_reader_code(fn, q[0].clone(), k[0].clone(), 1.0)
            if fb2 is None and close(got2, sm(raw[0] / math.sqrt(d_k))):
                return wrong(
                    "it works on 2-D inputs but not with a batch axis: transpose the last two axes "
                    "with k.transpose(-2, -1) (k.T reverses *all* axes)."
                )
        return fb

    expected = sm(raw / math.sqrt(d_k))  # [B, S_q, S_k]
    if isinstance(got, Tensor) and tuple(got.shape) == (2, s_k, s_q):
        return wrong("your result is [S_k, S_q]: compute q @ k^T so that each row is one query, not k @ q^T.")
    generic = compare_tensors(got, expected, name="the weights")
    if generic is not None and (not isinstance(got, Tensor) or tuple(got.shape) != tuple(expected.shape)):
        return generic  # not a tensor, or the wrong shape: the generic message says which
    if generic is not None:
        mistakes: list[tuple[Tensor, str]] = [
            (sm(raw), "you did not scale the scores: divide q @ k^T by sqrt(D_k) before the softmax."),
            (sm(raw / d_k), "you divided by D_k instead of sqrt(D_k) (here 16 instead of 4): the scores come out too flat."),
            (sm(raw * math.sqrt(d_k)), "you multiplied by sqrt(D_k) instead of dividing by it."),
            (sm(raw) / math.sqrt(d_k),
             "you scaled after the softmax: your rows sum to 1/sqrt(D_k) = 0.25. Divide the scores, then take the softmax."),
            (sm(raw / math.sqrt(s_k)), "you divided by sqrt(S_k), the number of keys; the divisor is sqrt(D_k), the width of q and k."),
            (sm(raw / math.sqrt(s_q)), "you divided by sqrt(S_q), the number of queries; the divisor is sqrt(D_k), the width of q and k."),
            (sm(raw / math.sqrt(d_k), dim=-2),
             "the softmax runs over the wrong axis: each of your columns sums to 1. Normalise over the keys (dim=-1)."),
        ]
        for candidate, hint in mistakes:
            if close(got, candidate):
                return wrong(hint)
        sums = got.detach().to(torch.float64).sum(dim=-1)
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
            return wrong(f"your rows should each sum to 1 but sum to between {float(sums.min()):.3f} and {float(sums.max()):.3f}.")
        return generic

    temperature = 2.5
    got_t, fb = run_reader_code(fn, q.clone(), k.clone(), temperature)
    if fb is not None:
        return fb
    expected_t = sm(raw / math.sqrt(d_k) / temperature)
    if close(got_t, expected_t):
        return correct("softmax(q k^T / sqrt(D_k) / T), normalised over the keys.")
    t_mistakes: list[tuple[Tensor, str]] = [
        (expected, "right for T = 1, but your function ignores the temperature: divide the scaled scores by T too."),
        (sm(raw / math.sqrt(d_k) * temperature), "you multiplied by the temperature; divide by it (large T must flatten the weights)."),
        (expected / temperature, "you applied the temperature after the softmax: your rows sum to 1/T. Divide the scores by T first."),
        (sm(raw / math.sqrt(d_k) / temperature**2), "you divided by T twice (or by T squared)."),
    ]
    for candidate, hint in t_mistakes:
        if close(got_t, candidate):
            return wrong(hint)
    return compare_tensors(got_t, expected_t, name="the weights for T = 2.5") or correct()


def _weights_for_entropy() -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(4)
    rows = torch.softmax(torch.randn(5, 6, generator=gen) * 1.5, dim=-1)  # [5, 6], no zeros
    one_hot = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])  # entropy 0
    half = torch.tensor([[0.5, 0.0, 0.0, 0.5, 0.0, 0.0]])  # entropy ln 2
    w = torch.cat([rows, one_hot, half])  # [7, 6]: 7 rows, so that summing over the wrong axis shows
    has_zero = torch.tensor([False] * 5 + [True, True])
    return w, has_zero


def check_entropy(fn: Callable[[Tensor], Tensor]) -> Feedback:
    """Check ``fn(weights) -> entropy``: ``weights [..., S_k]`` rows summing to 1, result ``[...]`` in nats.

    The inputs include a one-hot row (entropy 0) and a row with zeros (``0 ln 0`` must count as 0).
    """
    w, has_zero = _weights_for_entropy()
    got, fb = run_reader_code(fn, w.clone())
    if fb is not None:
        return fb
    expected = entropy(w)  # [7]
    if close(got, expected):
        return correct("-sum p ln p per row, with 0 ln 0 = 0; it runs from 0 (one-hot) to ln S (uniform).")
    if not isinstance(got, Tensor):
        return compare_tensors(got, expected, name="the entropy") or correct()
    if tuple(got.shape) == tuple(w.shape):
        return wrong("you returned one number per weight: sum -p ln p over the last axis (the keys) to get one entropy per row.")
    if tuple(got.shape) != tuple(expected.shape):
        return wrong(
            f"your result has shape {tuple(got.shape)}, expected {tuple(expected.shape)}: "
            "one entropy per row, summing over the last axis (dim=-1)."
        )
    g = got.detach().to(torch.float64)
    e = expected.to(torch.float64)
    ok = ~has_zero
    if torch.allclose(g[ok], e[ok]):
        if not torch.isfinite(g[has_zero]).all():
            return wrong("rows that contain a 0 give NaN: 0 * ln 0 must count as 0. Use torch.special.xlogy(p, p) or clamp p before the log.")
        return wrong("right for rows without zeros, but wrong where a weight is 0: a zero weight contributes nothing (0 ln 0 = 0).")
    plain = -torch.log(w.to(torch.float64)[ok]).sum(dim=-1)
    mistakes: list[tuple[Tensor, str]] = [
        (e / math.log(2), "you used log2 (bits); this book measures entropy in nats with the natural log, so the ceiling is ln S."),
        (e / math.log(10), "you used log10; use the natural log (torch.log), so the ceiling is ln S."),
        (-e, "your entropies are negative: you forgot the minus sign in -sum p ln p."),
        (e / math.log(w.shape[-1]), "you divided by ln S (a normalised entropy); return the entropy itself, in nats."),
    ]
    for candidate, hint in mistakes:
        if torch.allclose(g[ok], candidate[ok]):
            return wrong(hint)
    if torch.allclose(g[ok], plain, atol=1e-4, rtol=1e-4):
        return wrong("you summed -ln p without weighting each term by p: the entropy is -sum p ln p.")
    return compare_tensors(got, expected, name="the entropy") or correct()
