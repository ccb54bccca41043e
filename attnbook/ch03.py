"""Checkers for chapter 3, *Scaling and temperature*.

* :func:`check_scaled_weights`: the reader writes ``softmax(q k^T / sqrt(D_k) / T)``.
* :func:`check_entropy`: the reader writes the entropy (in nats) of each row of weights, with
  ``torch.log`` (the checker makes ``torch.special.entr`` and ``xlogy`` unavailable while it runs).

The known mistakes are the tables :data:`WEIGHT_MISTAKES` and :data:`ENTROPY_MISTAKES`; each entry
is a wrong version of the reader's function, and ``tests/test_ch03.py`` runs every entry through
its checker.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator

import torch
from torch import Tensor

from .feedback import (
    Feedback,
    Mistake,
    as_cpu_float64,
    close,
    compare_tensors,
    correct,
    diagnose,
    run_reader_code,
    wrong,
)

__all__ = ["check_scaled_weights", "check_entropy", "entropy", "WEIGHT_MISTAKES", "ENTROPY_MISTAKES", "TEMPERATURE"]

#: The temperature the weights checker uses (not 1, so that ignoring it shows).
TEMPERATURE = 2.5


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


def _raw(q: Tensor, k: Tensor) -> Tensor:
    return q @ k.transpose(-2, -1)  # [..., S_q, S_k]


def _sm(x: Tensor, dim: int = -1) -> Tensor:
    return torch.softmax(x, dim=dim)


def _right(q: Tensor, k: Tensor, t: float) -> Tensor:
    return _sm(_raw(q, k) / math.sqrt(q.shape[-1]) / t)


#: Known wrong answers ``compute(q, k, temperature) -> weights``, tried in order.
WEIGHT_MISTAKES: tuple[Mistake, ...] = (
    Mistake("no scaling", lambda q, k, t: _sm(_raw(q, k) / t),
            "you did not scale the scores: divide q @ k^T by sqrt(D_k) before the softmax."),
    Mistake("divided by D_k", lambda q, k, t: _sm(_raw(q, k) / q.shape[-1] / t),
            "you divided by D_k instead of sqrt(D_k) (here 16 instead of 4): the scores come out too flat."),
    Mistake("multiplied by sqrt(D_k)", lambda q, k, t: _sm(_raw(q, k) * math.sqrt(q.shape[-1]) / t),
            "you multiplied by sqrt(D_k) instead of dividing by it."),
    Mistake("sqrt(D_k * T)", lambda q, k, t: _sm(_raw(q, k) / math.sqrt(q.shape[-1] * t)),
            "you divided by sqrt(D_k * T): the square root must cover D_k only. Divide by sqrt(D_k), then by T "
            "itself: q @ k^T / sqrt(D_k) / T."),
    Mistake("scaled after the softmax", lambda q, k, t: _sm(_raw(q, k) / t) / math.sqrt(q.shape[-1]),
            "you scaled after the softmax: your rows sum to 1/sqrt(D_k) = 0.25. Divide the scores, then take the softmax."),
    Mistake("sqrt(S_k)", lambda q, k, t: _sm(_raw(q, k) / math.sqrt(k.shape[-2]) / t),
            "you divided by sqrt(S_k), the number of keys; the divisor is sqrt(D_k), the width of q and k."),
    Mistake("sqrt(S_q)", lambda q, k, t: _sm(_raw(q, k) / math.sqrt(q.shape[-2]) / t),
            "you divided by sqrt(S_q), the number of queries; the divisor is sqrt(D_k), the width of q and k."),
    Mistake("softmax over the queries", lambda q, k, t: _sm(_raw(q, k) / math.sqrt(q.shape[-1]) / t, dim=-2),
            "the softmax runs over the wrong axis: each of your columns sums to 1. Normalise over the keys (dim=-1)."),
    Mistake("k @ q^T", lambda q, k, t: _sm(_raw(k, q) / math.sqrt(q.shape[-1]) / t),
            "your result is [S_k, S_q]: compute q @ k^T so that each row is one query, not k @ q^T."),
    Mistake("ignores T", lambda q, k, t: _right(q, k, 1.0),
            "right for T = 1, but your function ignores the temperature: divide the scaled scores by T too."),
    Mistake("multiplied by T", lambda q, k, t: _sm(_raw(q, k) / math.sqrt(q.shape[-1]) * t),
            "you multiplied by the temperature; divide by it (large T must flatten the weights)."),
    Mistake("T after the softmax", lambda q, k, t: _right(q, k, 1.0) / t,
            "you applied the temperature after the softmax: your rows sum to 1/T. Divide the scores by T first."),
    Mistake("T squared", lambda q, k, t: _right(q, k, t * t), "you divided by T twice (or by T squared)."),
)

_NO_BATCH_HINT = (
    "it works with a batch axis but not without one: on 2-D inputs [S, D_k] your code {what}. Transpose the "
    "last two axes with k.transpose(-2, -1), which works for any number of leading axes."
)


def check_scaled_weights(fn: Callable[[Tensor, Tensor, float], Tensor]) -> Feedback:
    """Check ``fn(q, k, temperature) -> weights``.

    ``q: [..., S_q, D_k]``, ``k: [..., S_k, D_k]``; the answer is
    ``softmax(q @ k^T / sqrt(D_k) / temperature)`` over the key axis, ``[..., S_q, S_k]``.
    The checker uses ``S_q = 5``, ``S_k = 6``, ``D_k = 16`` and ``T = 2.5``, with a batch axis of 2
    and again without one (2-D inputs), so that every wrong divisor gives a different answer and
    code that assumes a batch axis shows.
    """
    q, k = _qk()
    t = TEMPERATURE
    got, fb = run_reader_code(fn, q.clone(), k.clone(), t)
    if fb is not None:
        if fb.status == "wrong":  # maybe it only works without the batch axis (k.T on a 3-D tensor)
            got2, fb2 = run_reader_code(fn, q[0].clone(), k[0].clone(), t)
            if fb2 is None and close(got2, _right(q[0], k[0], t)):
                return wrong(
                    "it works on 2-D inputs but not with a batch axis: transpose the last two axes "
                    "with k.transpose(-2, -1) (k.T reverses *all* axes)."
                )
        return fb
    expected = _right(q, k, t)  # [B, S_q, S_k]
    if not close(got, expected):
        hint = diagnose(got, WEIGHT_MISTAKES, q, k, t)
        if hint is not None:
            return hint
        if isinstance(got, Tensor) and tuple(got.shape) == tuple(expected.shape):
            sums = as_cpu_float64(got).sum(dim=-1)
            if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
                return wrong(f"your rows should each sum to 1 but sum to between {float(sums.min()):.3f} and {float(sums.max()):.3f}.")
        return compare_tensors(got, expected, name=f"the weights for T = {t}") or correct()
    got2, fb2 = run_reader_code(fn, q[0].clone(), k[0].clone(), t)  # the same without a batch axis
    if fb2 is not None:
        return wrong(_NO_BATCH_HINT.format(what="raised an error")) if fb2.status == "wrong" else fb2
    if not close(got2, expected[0]):
        return wrong(_NO_BATCH_HINT.format(what="gives other weights"))
    return correct("softmax(q k^T / sqrt(D_k) / T), normalised over the keys, with and without a batch axis.")


def _weights_for_entropy() -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(4)
    rows = torch.softmax(torch.randn(5, 6, generator=gen) * 1.5, dim=-1)  # [5, 6], no zeros
    one_hot = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])  # entropy 0
    half = torch.tensor([[0.5, 0.0, 0.0, 0.5, 0.0, 0.0]])  # entropy ln 2
    w = torch.cat([rows, one_hot, half])  # [7, 6]: 7 rows, so that summing over the wrong axis shows
    has_zero = torch.tensor([False] * 5 + [True, True])
    return w, has_zero


def _plogp(w: Tensor, log: Callable[[Tensor], Tensor] = torch.log) -> Tensor:
    return w * log(w.clamp_min(1e-30))  # [..., S], finite where w = 0


#: Known wrong entropies ``compute(weights [7, 6]) -> [7]``; compared on the rows without zeros.
ENTROPY_MISTAKES: tuple[Mistake, ...] = (
    Mistake("log2", lambda w: -_plogp(w, torch.log2).sum(-1),
            "you used log2 (bits); this book measures entropy in nats with the natural log, so the ceiling is ln S."),
    Mistake("log10", lambda w: -_plogp(w, torch.log10).sum(-1),
            "you used log10; use the natural log (torch.log), so the ceiling is ln S."),
    Mistake("no minus sign", lambda w: _plogp(w).sum(-1),
            "your entropies are negative: you forgot the minus sign in -sum p ln p."),
    Mistake("normalised", lambda w: -_plogp(w).sum(-1) / math.log(w.shape[-1]),
            "you divided by ln S (a normalised entropy); return the entropy itself, in nats."),
    Mistake("unweighted", lambda w: -torch.log(w.clamp_min(1e-30)).sum(-1),
            "you summed -ln p without weighting each term by p: the entropy is -sum p ln p."),
)


class _Forbidden(Exception):
    pass


@contextlib.contextmanager
def _without_entr() -> Iterator[None]:
    """Make ``torch.special.entr`` and the ``xlogy`` functions raise while the reader's code runs."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise _Forbidden

    saved = [(torch.special, "entr"), (torch.special, "xlogy"), (torch, "xlogy"), (torch.Tensor, "xlogy")]
    originals = [getattr(owner, name) for owner, name in saved]
    for owner, name in saved:
        setattr(owner, name, refuse)
    try:
        yield
    finally:
        for (owner, name), original in zip(saved, originals):
            setattr(owner, name, original)


def check_entropy(fn: Callable[[Tensor], Tensor]) -> Feedback:
    """Check ``fn(weights) -> entropy``: ``weights [..., S_k]`` rows summing to 1, result ``[...]`` in nats.

    The inputs include a one-hot row (entropy 0) and a row with zeros (``0 ln 0`` must count as 0).
    The exercise asks for ``torch.log``; ``torch.special.entr`` and ``xlogy`` are refused while it runs.
    """
    w, has_zero = _weights_for_entropy()

    def guarded(weights: Tensor) -> Tensor:
        with _without_entr():
            return fn(weights)

    got, fb = run_reader_code(guarded, w.clone())  # a refused call comes back as "your code raised _Forbidden"
    if fb is not None and "_Forbidden" in fb.message:
        return wrong(
            "this exercise asks for torch.log: torch.special.entr and xlogy build the 0 ln 0 = 0 rule in, "
            "and the point is to handle the zeros yourself (for example with clamp_min or torch.where)."
        )
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
    ok = ~has_zero
    g = as_cpu_float64(got)
    if torch.allclose(g[ok], expected.to(torch.float64)[ok]):
        if not torch.isfinite(g[has_zero]).all():
            return wrong("rows that contain a 0 give NaN: 0 * ln 0 must count as 0. Clamp p before the log "
                         "(p.clamp_min(tiny)) or use torch.where(p > 0, p * torch.log(p), 0).")
        return wrong("right for rows without zeros, but wrong where a weight is 0: a zero weight contributes nothing (0 ln 0 = 0).")
    on_rows = tuple(Mistake(m.name, lambda x, m=m: m.compute(x)[ok], m.hint) for m in ENTROPY_MISTAKES)
    hint = diagnose(got[ok], on_rows, w)
    return hint or compare_tensors(got, expected, name="the entropy") or correct()
