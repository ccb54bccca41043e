"""Checkers for chapter 3, *Scaling and temperature*.

* :func:`check_scaled_weights`: the reader writes ``softmax(q k^T / sqrt(D_k) / T)``.
* :func:`check_entropy`: the reader writes the entropy (in nats) of each row of weights, with
  ``torch.log`` (the checker makes ``torch.special.entr`` and ``xlogy`` unavailable while it runs).

The known mistakes are the tables :data:`WEIGHT_MISTAKES` and :data:`ENTROPY_MISTAKES`; each entry
is a wrong version of the reader's function, and the chapter's tests run every entry through its
checker.
"""

from __future__ import annotations

import contextlib
import math
import re
from typing import Callable, Iterator

import torch
from torch import Tensor

from .diagrams import INK, MUTED, Diagram, diagram
from .feedback import (
    Feedback,
    Mistake,
    MistakeTable,
    as_cpu_float64,
    close,
    compare_tensors,
    computed_narrower,
    correct,
    describe,
    diagnose,
    exercise,
    run_reader_code,
    wrong,
)

__all__ = ["train_marker_scaling", "marker_query_grad", "SOFTCAP", "TRAIN_LR", "check_scaled_weights", "check_entropy", "entropy", "WEIGHT_MISTAKES", "ENTROPY_MISTAKES", "TEMPERATURE"]

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


#: The weights checker's cases ``(B, S_q, S_k, D_k, T, dtype)``: the second differs from the first in
#: every size, the temperature and the dtype, so no hard-coded size or constant passes.
WEIGHT_CASES: tuple[tuple[int, int, int, int, float, torch.dtype], ...] = (
    (2, 5, 6, 16, TEMPERATURE, torch.float32),  # sqrt(D_k) = 4
    (3, 4, 7, 12, 0.7, torch.float64),  # sqrt(D_k) = 3.46, not a whole number
)


def _qk(case: int = 0) -> tuple[Tensor, Tensor]:
    B, S_q, S_k, D_k, _, dtype = WEIGHT_CASES[case]
    gen = torch.Generator().manual_seed(3 + case)
    q = torch.randn(B, S_q, D_k, generator=gen, dtype=torch.float64).to(dtype)  # [B, S_q, D_k]
    k = torch.randn(B, S_k, D_k, generator=gen, dtype=torch.float64).to(dtype)  # [B, S_k, D_k]
    return q, k


def _raw(q: Tensor, k: Tensor) -> Tensor:
    return q @ k.transpose(-2, -1)  # [..., S_q, S_k]


def _sm(x: Tensor, dim: int = -1) -> Tensor:
    return torch.softmax(x, dim=dim)


def _right(q: Tensor, k: Tensor, t: float) -> Tensor:
    return _sm(_raw(q, k) / math.sqrt(q.shape[-1]) / t)


#: The D_k of the chapter's examples (its diagram and its temperature cells): a divisor hard-coded from it is a
#: mistake the checker names, and its cases are narrower.
CHAPTER_D_K = 64


def _not_the_width(divisor: float, width: int, q: Tensor) -> float:
    """A constant divisor read from the chapter; where the inputs' D_k is ``width`` it is the right answer."""
    if q.shape[-1] == width:
        raise ValueError("the inputs' D_k is the chapter's constant here")
    return divisor


def _batch_size(q: Tensor) -> int:
    """``q.shape[0]`` where it is a batch axis; without one it is S_q (the "sqrt(S_q)" mistake)."""
    if q.dim() < 3:
        raise ValueError("without a batch axis, shape[0] is S_q")
    return q.shape[0]


#: Known wrong answers ``compute(q, k, temperature) -> weights``, tried in order.
WEIGHT_MISTAKES: tuple[Mistake, ...] = (
    Mistake("no scaling", lambda q, k, t: _sm(_raw(q, k) / t),
            "you did not scale the scores: divide q @ k^T by sqrt(D_k) before the softmax."),
    Mistake("divided by D_k", lambda q, k, t: _sm(_raw(q, k) / q.shape[-1] / t),
            "you divided by D_k instead of sqrt(D_k) (for D_k = 16: by 16 instead of 4): the scores come out too flat."),
    Mistake("multiplied by sqrt(D_k)", lambda q, k, t: _sm(_raw(q, k) * math.sqrt(q.shape[-1]) / t),
            "you multiplied by sqrt(D_k) instead of dividing by it."),
    Mistake("sqrt(D_k * T)", lambda q, k, t: _sm(_raw(q, k) / math.sqrt(q.shape[-1] * t)),
            "you divided by sqrt(D_k * T): the square root must cover D_k only. Divide by sqrt(D_k), then by T "
            "itself: q @ k^T / sqrt(D_k) / T."),
    Mistake("scaled after the softmax", lambda q, k, t: _sm(_raw(q, k) / t) / math.sqrt(q.shape[-1]),
            "you scaled after the softmax: your rows sum to 1/sqrt(D_k) instead of 1. Divide the scores, then take the softmax."),
    Mistake("sqrt(S_k)", lambda q, k, t: _sm(_raw(q, k) / math.sqrt(k.shape[-2]) / t),
            "you divided by sqrt(S_k), the number of keys; the divisor is sqrt(D_k), the width of q and k."),
    Mistake("sqrt(S_q)", lambda q, k, t: _sm(_raw(q, k) / math.sqrt(q.shape[-2]) / t),
            "you divided by sqrt(S_q), the number of queries; the divisor is sqrt(D_k), the width of q and k."),
    Mistake("softmax over the queries", lambda q, k, t: _sm(_raw(q, k) / math.sqrt(q.shape[-1]) / t, dim=-2),
            "the softmax runs over the wrong axis: each of your columns sums to 1. Normalise over the keys (dim=-1)."),
    Mistake("softmax over dim 0", lambda q, k, t: _sm(_raw(q, k) / math.sqrt(q.shape[-1]) / t, dim=0),
            "your softmax runs over dim 0, the batch axis: F.softmax without dim picks dim 0 for 3-D input "
            "(and so does dim=0). Pass dim=-1, the keys."),
    Mistake("k @ q^T", lambda q, k, t: _sm(_raw(k, q) / math.sqrt(q.shape[-1]) / t),
            "your result is [S_k, S_q]: compute q @ k^T so that each row is one query, not k @ q^T."),
    Mistake("ignores T", lambda q, k, t: _right(q, k, 1.0),
            "right for T = 1, but your function ignores the temperature: divide the scaled scores by T too."),
    Mistake("multiplied by T", lambda q, k, t: _sm(_raw(q, k) / math.sqrt(q.shape[-1]) * t),
            "you multiplied by the temperature; divide by it (large T must flatten the weights)."),
    Mistake("T after the softmax", lambda q, k, t: _right(q, k, 1.0) / t,
            "you applied the temperature after the softmax: your rows sum to 1/T. Divide the scores by T first."),
    Mistake("T squared", lambda q, k, t: _right(q, k, t * t), "you divided by T twice (or by T squared)."),
    Mistake("integer sqrt", lambda q, k, t: _sm(_raw(q, k) / math.isqrt(q.shape[-1]) / t),
            "you rounded sqrt(D_k) down to a whole number (math.isqrt or int(...)): for D_k = 12 that divides by 3 "
            "instead of 3.46. Use math.sqrt(D_k) or D_k ** 0.5."),
    Mistake("no softmax", lambda q, k, t: _raw(q, k) / math.sqrt(q.shape[-1]) / t,
            "you returned the scaled scores themselves: they are right, but they are not weights yet. Weights are "
            "positive and each row sums to 1 over the keys: did you apply the softmax?"),
    Mistake("fourth root of D_k once", lambda q, k, t: _sm(_raw(q, k) / q.shape[-1] ** 0.25 / t),
            "your scores are divided by the fourth root of D_k, not its square root: if you split the scale "
            "between q and k, each of them needs its share (D_k^(1/4) on each side)."),
    Mistake("log_softmax", lambda q, k, t: torch.log_softmax(_raw(q, k) / math.sqrt(q.shape[-1]) / t, dim=-1),
            "you returned log-probabilities (log_softmax): the weights are the softmax itself, rows of positive "
            "numbers that sum to 1."),
    Mistake("the chapter's D_k", lambda q, k, t: _sm(_raw(q, k) / _not_the_width(8.0, CHAPTER_D_K, q) / t),
            f"you divided by 8 = sqrt({CHAPTER_D_K}) on every call: {CHAPTER_D_K} is the D_k of the chapter's examples, "
            "not the width of the q and k your function received (the checker's are narrower). Read D_k from the "
            "inputs, the last axis of q, inside the function."),
    Mistake("sqrt(8)", lambda q, k, t: _sm(_raw(q, k) / _not_the_width(math.sqrt(8), 8, q) / t),
            "you divided by sqrt(8) on every call: 8 is a constant of the chapter's examples (their S = 8 keys, and "
            f"8 = sqrt(D_k) for their D_k = {CHAPTER_D_K}), not taken from the q and k your function received. The "
            "divisor is the square root of D_k, the width of q and k: read it from the last axis of q."),
    Mistake("sqrt(B)", lambda q, k, t: _sm(_raw(q, k) / math.sqrt(_batch_size(q)) / t),
            "you divided by sqrt(q.shape[0]): with a batch axis, q.shape[0] is the batch size B, not D_k. D_k is the "
            "last axis of q and k, whatever axes come before it."),
    Mistake("weights transposed", lambda q, k, t: _right(q, k, t).mT,
            "your weights are the right ones transposed, [..., S_k, S_q], so each column sums to 1: return one row "
            "per query and one column per key, [..., S_q, S_k]. Don't transpose the result."),
)

_NO_BATCH_HINT = (
    "it works with a batch axis but not without one: on 2-D inputs [S, D_k] your code {what}. Count axes from "
    "the end, so that the code works for any number of leading axes: dim=-1, q.shape[-1], k.transpose(-2, -1) "
    "and @ (not a fixed axis such as dim=2 or shape[2], and not torch.bmm, which needs exactly three axes)."
)


_KEEPDIM_HINT = (
    "a reduction over the keys lost its axis: a row's sum (or maximum) taken with dim=-1 has shape [..., S_q], "
    "which does not line up with the [..., S_q, S_k] scores, so dividing (or subtracting) fails to broadcast. "
    "Keep the reduced axis as a size-1 axis with keepdim=True, so that each row's sum sits beside its row."
)


def _lost_keepdim(message: str, s_q: int, s_k: int) -> bool:
    """Whether PyTorch's broadcast error names S_k against S_q, as ``scores / scores.sum(dim=-1)`` gives."""
    found = re.search(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)", message)
    return found is not None and s_q != s_k and {int(found[1]), int(found[2])} == {s_q, s_k}


def _weights_one(fn: Callable[..., Tensor], q: Tensor, k: Tensor, t: float) -> Feedback | None:
    """``None`` when ``fn`` gives the right weights for ``(q, k, t)``, else the feedback."""
    got, fb = run_reader_code(fn, q.clone(), k.clone(), t)
    if fb is not None and fb.message.startswith("your code raised") and _lost_keepdim(fb.message, q.shape[-2], k.shape[-2]):
        return wrong(_KEEPDIM_HINT)
    if fb is not None:
        return fb
    expected = _right(q, k, t)
    if q.dtype == torch.float64:  # the dtype rule: float32 inside, cast back, is refused even where it fits ATOL
        narrower = _float32_divisor(got, q, k, t) or computed_narrower(
            got, expected, _right(q.float(), k.float(), t).double(), name="your weight tensor")
        if narrower is not None:
            return narrower
    if close(got, expected):
        return _kept_dtype(got, q, "weights")
    hint = diagnose(got, WEIGHT_MISTAKES, q, k, t)
    if hint is not None:
        return hint
    if not isinstance(got, Tensor):
        return wrong(f"return the weights as a torch.Tensor, got {describe(got)}.")
    if tuple(got.shape) == tuple(expected.shape) and not got.is_complex():
        sums = as_cpu_float64(got).sum(dim=-1)
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
            return wrong(f"your rows should each sum to 1 but sum to between {float(sums.min()):.3f} and {float(sums.max()):.3f}.")
    return compare_tensors(got, expected, name=f"the weight tensor for T = {t}")


def _float32_divisor(got: object, q: Tensor, k: Tensor, t: float) -> Feedback | None:
    """The hint for float64 scores divided by a float32 0-d tensor, ``torch.sqrt(torch.tensor(d_k))`` (torch.sqrt of an
    int tensor is float32, and so is ``torch.tensor(2.5)``), as the scale, the temperature or both: PyTorch keeps the
    scores' float64, but the divisor was rounded to float32's 7 digits, so the weights are right only to about 1e-8.
    ``None`` when that is not what happened."""
    if not (isinstance(got, Tensor) and got.dtype == torch.float64):
        return None
    d_k32 = torch.tensor(float(q.shape[-1]), dtype=torch.float32)
    root, root32, rsqrt32 = math.sqrt(q.shape[-1]), float(d_k32.sqrt()), float(d_k32.rsqrt())
    t32 = float(torch.tensor(t, dtype=torch.float32))
    for scale, temp in ((root32, t), (root, t32), (root32, t32), (1 / rsqrt32, t)):
        if close(got, _sm(_raw(q, k) / scale / temp), atol=1e-13, rtol=1e-11):
            return wrong("you divided by a float32 tensor: torch.tensor of a Python float is float32 (unless you pass "
                         "dtype=), and so is torch.sqrt (or rsqrt) of an integer tensor. The scores stay float64, but "
                         "they are divided by a number rounded to float32's 7 digits, so the weights are right only to "
                         "about 8 significant digits. Compute in the inputs' dtype or wider: divide by Python floats "
                         "(math.sqrt of the width, or the width ** 0.5, and the temperature as it came).")
    return None


def _kept_dtype(got: Tensor, x: Tensor, what: str) -> Feedback | None:
    """``None`` when a right ``got`` kept float64 inputs' precision, else the feedback."""
    if x.dtype == torch.float64 and isinstance(got, Tensor) and got.dtype == torch.float32:
        return wrong(f"your {what} are right but float32 for float64 inputs: keep the inputs' dtype (no .float()), "
                     "so that the result keeps float64's precision.")
    return None


def _solution_weights(q: Tensor, k: Tensor, temperature: float = 1.0) -> Tensor:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [..., S_q, S_k]
    return torch.softmax(scores / temperature, dim=-1)


def _weight_cases() -> list[tuple[Tensor, Tensor, float]]:
    out: list[tuple[Tensor, Tensor, float]] = []
    for c, case in enumerate(WEIGHT_CASES):
        q, k = _qk(c)
        out.append((q, k, case[4]))
    return out


@exercise(solution=_solution_weights, tables=(MistakeTable(WEIGHT_MISTAKES, _weight_cases, _right),))
def check_scaled_weights(fn: Callable[[Tensor, Tensor, float], Tensor]) -> Feedback:
    """Check ``fn(q, k, temperature) -> weights``.

    ``q: [..., S_q, D_k]``, ``k: [..., S_k, D_k]``; the answer is
    ``softmax(q @ k^T / sqrt(D_k) / temperature)`` over the key axis, ``[..., S_q, S_k]``.
    The checker tries the cases of :data:`WEIGHT_CASES` (the first also without its batch axis,
    as 2-D inputs), so that every wrong divisor gives a different answer, no hard-coded size passes
    and code that assumes a batch axis shows.
    """
    q, k = _qk()
    t = TEMPERATURE
    got, fb = run_reader_code(fn, q.clone(), k.clone(), t)
    if fb is not None and fb.message.startswith("your code raised"):  # maybe it only works without the batch axis (k.T on a 3-D tensor)
        got2, fb2 = run_reader_code(fn, q[0].clone(), k[0].clone(), t)
        if fb2 is None and close(got2, _right(q[0], k[0], t)):
            return wrong(
                "it works on 2-D inputs but not with a batch axis: transpose the last two axes "
                "with k.transpose(-2, -1) (k.T reverses *all* axes)."
            )
    problem = _weights_one(fn, q, k, t)
    if problem is not None:
        return problem
    got2, fb2 = run_reader_code(fn, q[0].clone(), k[0].clone(), t)  # the same without a batch axis
    if fb2 is not None:
        return wrong(_NO_BATCH_HINT.format(what="raised an error")) if fb2.message.startswith("your code raised") else fb2
    if not close(got2, _right(q[0], k[0], t)):
        return wrong(_NO_BATCH_HINT.format(what="gives other weights"))
    q2, k2 = _qk(1)
    problem = _weights_one(fn, q2, k2, WEIGHT_CASES[1][4])
    if problem is not None:
        return problem
    return correct("softmax(q k^T / sqrt(D_k) / T), normalised over the keys, with and without a batch axis.")


#: The length of the entropy checker's long rows: softmaxes of unit-variance scores, whose weights are
#: mostly below 1e-3 (as in the chapter's section on the sequence length), so that a fix for the zeros
#: that also touches small non-zero weights shows.
LONG_ROW = 4096

#: The length of the entropy checker's last case, float64 rows compared to :data:`TINY_TOL`: a uniform
#: row (every weight 1.5e-5), a row whose weights but one lie between 1e-9 and 1e-7, and a row of 256
#: weights of 1/256 among zeros, so that any epsilon inside the log (even 1e-12) and any clamp or
#: threshold above 1e-9 shows, and the last row tells the two apart.
TINY_ROW = 65536

#: How far the last case's entropies may be from the float64 reference, plus a tenth of it times the
#: entropy: a float64 sum of 65,536 terms, added one by one, is off by up to 2e-11; an epsilon of 1e-12
#: lowers the last row's entropy by 2.6e-10 and the uniform row's by 6.6e-8.
TINY_TOL = 1e-10


def _weights_for_entropy(case: int = 0) -> tuple[Tensor, Tensor]:
    """Case 0: ``[7, 6]`` float32 (7 rows, so that summing over the wrong axis shows); case 1:
    ``[2, 4, 5]`` float64, with two leading axes and another row length; case 2: ``[2, 4096]``
    float32, two long rows with no zeros and many weights below 1e-3; case 3: ``[3, 65536]`` float64, a
    uniform row, a row of tiny weights (1e-9 to 1e-7) and 256 weights of 1/256 among zeros, compared to
    :data:`TINY_TOL`."""
    if case == 0:
        gen = torch.Generator().manual_seed(4)
        rows = torch.softmax(torch.randn(5, 6, generator=gen) * 1.5, dim=-1)  # [5, 6], no zeros
        one_hot = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])  # entropy 0
        half = torch.tensor([[0.5, 0.0, 0.0, 0.5, 0.0, 0.0]])  # entropy ln 2
        w = torch.cat([rows, one_hot, half])  # [7, 6]
        has_zero = torch.tensor([False] * 5 + [True, True])
        return w, has_zero
    if case == 3:
        gen = torch.Generator().manual_seed(7)
        uniform = torch.full((TINY_ROW,), 1.0 / TINY_ROW, dtype=torch.float64)  # [65536], every weight 1.5e-5
        # 65,535 weights log-uniform in [1e-9, 1e-7], the rest on one key
        tiny = 10.0 ** (-9 + 2 * torch.rand(TINY_ROW - 1, generator=gen, dtype=torch.float64))  # [65535]
        peaked = torch.cat([(1 - tiny.sum()).reshape(1), tiny])  # [65536]
        few = torch.zeros(TINY_ROW, dtype=torch.float64)  # [65536]: 256 weights of 1/256, zeros elsewhere
        few[::256] = 1.0 / 256
        return torch.stack([uniform, peaked, few]), torch.tensor([False, False, True])
    if case == 2:
        gen = torch.Generator().manual_seed(6)
        w = torch.softmax(torch.randn(2, LONG_ROW, generator=gen), dim=-1)  # [2, 4096], most weights below 1e-3
        return w, torch.zeros(2, dtype=torch.bool)
    gen = torch.Generator().manual_seed(5)
    w = torch.softmax(torch.randn(2, 4, 5, generator=gen, dtype=torch.float64) * 2, dim=-1)  # [2, 4, 5]
    w[1, 2] = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0], dtype=torch.float64)  # a row with zeros
    has_zero = torch.zeros(2, 4, dtype=torch.bool)
    has_zero[1, 2] = True
    return w, has_zero


def _plogp(w: Tensor, log: Callable[[Tensor], Tensor] = torch.log) -> Tensor:
    return w * log(w.clamp_min(1e-30))  # [..., S], finite where w = 0


_EPS_HINT = ("you added a small epsilon inside the log: that shifts every log, not only the zeros, so every "
             "entropy comes out a little too low. Touch only p = 0: clamp (p.clamp_min(tiny)) or "
             "torch.where(p > 0, ...).")

_SMALL_WEIGHTS_HINT = ("right on short rows, but too low on long rows (4,096 or 65,536 keys), where weights are far "
                       "below 1e-3: your fix for the zeros also changes small weights that are not zero (a clamp at a "
                       "'small' number, or dropping weights under a threshold). Weights of 1e-4 are ordinary in long "
                       "rows, and a row can hold weights of 1e-9; change only the exact zeros, for example by "
                       "clamping at the smallest positive number of the dtype, torch.finfo(p.dtype).tiny.")

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
    Mistake("mean instead of sum", lambda w: -_plogp(w).mean(-1),
            "you took the mean of -p ln p over the keys; the entropy is their sum (the p already weight the terms)."),
    Mistake("exp of the entropy", lambda w: torch.exp(-_plogp(w).sum(-1)),
            "you returned exp(entropy), the 'effective number of keys' (perplexity); return the entropy itself, "
            "-sum p ln p, in nats."),
    Mistake("clamped too large / dropped small weights", lambda w: -(w * torch.log(w.clamp_min(1e-3))).sum(-1),
            _SMALL_WEIGHTS_HINT),
    Mistake("weights below 1e-3 dropped", lambda w: -torch.where(w > 1e-3, w * torch.log(w.clamp_min(1e-30)), 0).sum(-1),
            _SMALL_WEIGHTS_HINT),
    *(Mistake(f"epsilon {eps:g} inside the log", lambda w, eps=eps: -(w * torch.log(w + eps)).sum(-1), _EPS_HINT)
      for eps in (1e-3, 1e-4, 1e-5, 1e-6)),
)


class _Forbidden(Exception):
    pass


@contextlib.contextmanager
def _without_entr() -> Iterator[None]:
    """Make ``torch.special.entr``, the ``xlogy`` functions and ``Categorical.entropy`` raise while the
    reader's code runs."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise _Forbidden

    saved = [(torch.special, "entr"), (torch.special, "xlogy"), (torch, "xlogy"), (torch.Tensor, "xlogy"),
             (torch.distributions.Categorical, "entropy")]
    originals = [getattr(owner, name) for owner, name in saved]
    for owner, name in saved:
        setattr(owner, name, refuse)
    try:
        yield
    finally:
        for (owner, name), original in zip(saved, originals):
            setattr(owner, name, original)


def _narrower_entropy(got: object, w: Tensor, expected: Tensor) -> Feedback | None:
    """The hint of the dtype rule for float64 rows whose entropy was computed in float32 and cast back (or
    multiplied by float32 logs): it is off by about 1e-8 in both directions. ``None`` otherwise, and also when no
    entropy is too high: an epsilon inside the log, a clamp or a dropped weight is off by as little but only
    ever lowers the entropy, and has hints of its own."""
    if not (w.dtype == torch.float64 and isinstance(got, Tensor) and got.dtype == torch.float64
            and tuple(got.shape) == tuple(expected.shape) and not got.is_complex()):
        return None
    ref = expected.to(torch.float64)
    too_high = as_cpu_float64(got) - ref > TINY_TOL * (1 + ref.abs() / 10)  # beyond float64's rounding of the sum
    if not bool(too_high.any()):
        return None
    return computed_narrower(got, expected, entropy(w.float()).double(), name="your entropy tensor")


def _entropy_one(fn: Callable[[Tensor], Tensor], w: Tensor, has_zero: Tensor) -> Feedback | None:
    def guarded(weights: Tensor) -> Tensor:
        with _without_entr():
            return fn(weights)

    guarded.__wrapped__ = fn  # type: ignore[attr-defined]  # the reader's function, for feedback's generic second look
    got, fb = run_reader_code(guarded, w.clone())  # a refused call comes back as "your code raised _Forbidden"
    if fb is not None and "_Forbidden" in fb.message:
        return wrong(
            "this exercise asks for torch.log: torch.special.entr, xlogy and Categorical(...).entropy() build "
            "the 0 ln 0 = 0 rule in, "
            "and the point is to handle the zeros yourself (for example with clamp_min or torch.where)."
        )
    if fb is not None:
        return fb
    expected = entropy(w)  # [...]
    narrower = _narrower_entropy(got, w, expected)
    if narrower is not None:
        return narrower
    if (w.shape[-1] == TINY_ROW and isinstance(got, Tensor) and tuple(got.shape) == tuple(expected.shape)
            and not got.is_complex()):  # a tighter look: float64 rows of tiny weights
        dtype_problem = _kept_dtype(got, w, "entropies")
        if dtype_problem is not None:
            return dtype_problem
        low = expected.to(torch.float64) - as_cpu_float64(got)  # [3], > 0 where the entropy is too low
        tol = TINY_TOL * (1 + expected.to(torch.float64).abs() / 10)  # [3]: 1e-10 plus 1e-11 relative
        if bool((low.abs() <= tol).all()):
            return None
        if bool((low > tol).any()) and bool((low >= -tol).all()):
            # An epsilon in the log lowers the last row's entropy by about 256 * eps (its non-zero weights
            # are all 1/256) and the uniform row's by 65,536 * eps; a clamp or threshold below 1/256 leaves
            # the last row alone, and one below 1/65,536 the uniform row too (one above it lowers that
            # row's entropy by ln(c * 65,536), never by as little as 1e-6).
            eps = bool(low[2] > tol[2]) or (bool(low[0] > tol[0]) and float(low[0]) < 1e-6)
            return wrong(_EPS_HINT if eps else _SMALL_WEIGHTS_HINT)
        return compare_tensors(got, expected, name="the entropy", atol=10 * TINY_TOL, rtol=TINY_TOL)
    if close(got, expected):
        return _kept_dtype(got, w, "entropies")
    if not isinstance(got, Tensor):
        return wrong(f"return the entropies as a torch.Tensor, got {describe(got)}.")
    if tuple(got.shape) == tuple(w.shape):
        return wrong("you returned one number per weight: sum -p ln p over the last axis (the keys) to get one entropy per row.")
    if tuple(got.shape) != tuple(expected.shape):
        return wrong(
            f"your result has shape {tuple(got.shape)}, expected {tuple(expected.shape)}: "
            "one entropy per row, summing over the last axis (dim=-1)."
        )
    if got.is_complex():
        return compare_tensors(got, expected, name="the entropy")
    ok = ~has_zero
    g = as_cpu_float64(got)
    if torch.allclose(g[ok], expected.to(torch.float64)[ok]):
        if not torch.isfinite(g[has_zero]).all():
            return wrong("rows that contain a 0 give NaN: 0 * ln 0 must count as 0. Clamp p before the log "
                         "(p.clamp_min(tiny)), or use torch.where(p > 0, p * torch.log(p), 0) (right here, but in "
                         "training its backward pass still computes log(0) and gives NaN gradients; the clamp does not).")
        return wrong("right for rows without zeros, but wrong where a weight is 0: a zero weight contributes nothing (0 ln 0 = 0).")
    on_rows = tuple(Mistake(m.name, lambda x, m=m: m.compute(x)[ok], m.hint) for m in ENTROPY_MISTAKES)
    hint = diagnose(got[ok], on_rows, w)
    if hint is None and w.shape[-1] >= LONG_ROW and w.shape[-1] != TINY_ROW and bool((g < expected.to(torch.float64) - 1e-4).all()):
        return wrong(_SMALL_WEIGHTS_HINT)  # any other threshold: right on the short rows, too low on the long ones
    return hint or compare_tensors(got, expected, name="the entropy")


def _solution_entropy(weights: Tensor) -> Tensor:
    return -(weights * torch.log(weights.clamp_min(1e-30))).sum(dim=-1)


def _entropy_on_rows_without_zeros(w: Tensor) -> Tensor:
    return entropy(w)


def _entropy_same(a: Tensor, b: Tensor) -> bool:
    """As the checker compares a mistake: on the rows without zeros of the case."""
    return a.shape == b.shape and bool(torch.allclose(as_cpu_float64(a), as_cpu_float64(b), atol=1e-5, rtol=1e-5))


def _entropy_cases() -> list[tuple[Tensor]]:
    return [(_weights_for_entropy(c)[0],) for c in range(4)]


def _entropy_table() -> MistakeTable:
    # compare as the checker does: on the rows without zeros
    def rows(c: int) -> Tensor:
        return ~_weights_for_entropy(c)[1]

    masks = {c: rows(c) for c in range(4)}

    def pick(t: Tensor) -> Tensor:
        for c, m in masks.items():
            if t.shape == m.shape:
                return t[m]
        return t

    return MistakeTable(ENTROPY_MISTAKES, _entropy_cases, entropy, same=lambda a, b: _entropy_same(pick(a), pick(b)))


@exercise(solution=_solution_entropy, tables=(_entropy_table(),), not_generic={"transposed": "one entropy per row: a vector"})
def check_entropy(fn: Callable[[Tensor], Tensor]) -> Feedback:
    """Check ``fn(weights) -> entropy``: ``weights [..., S_k]`` rows summing to 1, result ``[...]`` in nats.

    The inputs include a one-hot row (entropy 0), a row with zeros (``0 ln 0`` must count as 0) and long
    rows of 4,096 keys with many weights below 1e-3, and float64 rows of 65,536 keys compared to
    :data:`TINY_TOL`, one uniform and one with weights from 1e-9 to 1e-7 (an epsilon inside the log, or a
    clamp or threshold that touches them, shows). The exercise asks for ``torch.log``;
    ``torch.special.entr``, ``xlogy`` and ``Categorical.entropy`` are refused while it runs.
    """
    for case in (0, 1, 3, 2):  # the tight float64 case before the float32 long rows: it tells an epsilon from a clamp
        problem = _entropy_one(fn, *_weights_for_entropy(case))
        if problem is not None:
            return problem
    return correct("-sum p ln p per row, with 0 ln 0 = 0; it runs from 0 (one-hot) to ln S (uniform).")


# --- does the scale matter in training? ---------------------------------------------------------

#: Learning rates of the training comparison: Adam 0.01, plain SGD 0.5 (each solves the scaled task
#: within 150 steps).
TRAIN_LR = {"Adam": 0.01, "SGD": 0.5}

#: The control of the comparison: the unscaled head trained with Adam at these rates too.
ADAM_CONTROL_LRS = (0.003, 0.03, 0.1)


def train_marker_scaling(optimiser: str, scaled: bool, *, seed: int = 0, d_k: int = 1024, steps: int = 150,
                         every: int = 50, batch: int = 32, S: int = 8, d_content: int = 6,
                         lr: float | None = None) -> list[float]:
    """Train one head on chapter 2's "find the marked token" task, with or without the 1/sqrt(D_k) scale.

    The head is ``softmax(x W^Q (x W^K)^T * scale) x W^V`` with weights drawn N(0, 1/D_in), so query and
    key entries have roughly unit variance and unscaled scores spread like sqrt(D_k). It trains in
    float64 on one thread (small tensors; the printed losses then hold across CPUs), seeded from
    ``seed``, with ``optimiser`` "Adam" or "SGD" at :data:`TRAIN_LR` (or at ``lr``). Returns the loss on one fixed
    batch of 512 held-out sequences after every ``every`` steps.

    >>> len(train_marker_scaling("SGD", True, d_k=16, steps=4, every=2))
    2
    """
    from .ch02 import marker_batch  # chapter 2's task

    params, loss_of = _marker_head(scaled, seed, d_k, d_content)
    opt_cls = {"Adam": torch.optim.Adam, "SGD": torch.optim.SGD}[optimiser]
    opt = opt_cls(params, lr=TRAIN_LR[optimiser] if lr is None else lr)
    data = torch.Generator().manual_seed(seed + 100)
    x_eval, target_eval, _ = marker_batch(512, S, d_content, torch.Generator().manual_seed(10_000 + seed))

    losses: list[float] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step in range(1, steps + 1):
            loss = loss_of(*marker_batch(batch, S, d_content, data)[:2])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % every == 0:
                with torch.no_grad():
                    losses.append(loss_of(x_eval, target_eval).item())
    finally:
        torch.set_num_threads(threads)
    return losses


def _marker_head(scaled: bool, seed: int, d_k: int, d_content: int
                 ) -> tuple[list[Tensor], Callable[[Tensor, Tensor], Tensor]]:
    """The head of :func:`train_marker_scaling` at initialisation: its weights and its loss."""
    g = torch.Generator().manual_seed(seed)
    d_in = d_content + 2
    params = [(torch.randn(d_in, n, generator=g, dtype=torch.float64) / math.sqrt(d_in)).requires_grad_()
              for n in (d_k, d_k, d_content)]  # W^Q [D, D_k], W^K [D, D_k], W^V [D, D_c]
    scale = 1 / math.sqrt(d_k) if scaled else 1.0

    def loss_of(x: Tensor, target: Tensor) -> Tensor:
        x, target = x.double(), target.double()  # [B, S, D], [B, S, D_c]
        q, k, v = (x @ w for w in params)  # [B, S, D_k], [B, S, D_k], [B, S, D_c]
        weights = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)  # [B, S, S]
        return torch.nn.functional.mse_loss(weights @ v, target)

    return params, loss_of


def marker_query_grad(scaled: bool, *, seed: int = 0, d_k: int = 1024, batch: int = 32, S: int = 8,
                      d_content: int = 6) -> float:
    """Norm of the gradient that reaches ``W^Q`` on the first step of :func:`train_marker_scaling`.

    Same initial weights and first batch as the training run with this ``seed`` (float64, one thread,
    so the value holds across CPUs).

    >>> marker_query_grad(True, d_k=16) > 0
    True
    """
    from .ch02 import marker_batch  # chapter 2's task

    params, loss_of = _marker_head(scaled, seed, d_k, d_content)
    x, target = marker_batch(batch, S, d_content, torch.Generator().manual_seed(seed + 100))[:2]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loss_of(x, target).backward()
    finally:
        torch.set_num_threads(threads)
    return params[0].grad.norm().item()


# --- diagram: what the scale and a temperature do to one softmax row ----------------------------

#: The diagram's row of raw dot products q . k_j for four keys of a head of width DIAGRAM_DK.
DIAGRAM_SCORES = (16.0, 8.0, 0.0, -8.0)
DIAGRAM_DK = 64
DIAGRAM_TEMPS = (0.5, 4.0)


def _softmax_list(scores: tuple[float, ...], divide: float) -> list[float]:
    top = max(scores)
    e = [math.exp((s - top) / divide) for s in scores]
    return [v / sum(e) for v in e]


@diagram
def softmax_row_diagram() -> Diagram:
    """One row of four raw scores, its softmax unscaled, divided by sqrt(D_k), and at two temperatures."""
    root = math.sqrt(DIAGRAM_DK)
    t_lo, t_hi = DIAGRAM_TEMPS
    rows = [
        ("softmax(s)", "unscaled", 1.0, "vermillion"),
        (f"softmax(s / {root:g})", f"÷ √D\u2096 = {root:g}, T = 1", root, "blue"),
        (f"softmax(s / {root:g} / {t_lo:g})", f"T = {t_lo:g}: sharper", root * t_lo, "orange"),
        (f"softmax(s / {root:g} / {t_hi:g})", f"T = {t_hi:g}: flatter", root * t_hi, "green"),
    ]
    raw = ", ".join(f"{s:g}".replace("-", "−") for s in DIAGRAM_SCORES)
    d = Diagram(
        "ch03_softmax_row", 420, 448, title="What the scale and a temperature do to one softmax row",
        alt=(f"One query's raw dot products with four keys, {raw}, in a head of width D_k = {DIAGRAM_DK}. "
             "Four bar rows show the weights the softmax makes of them: unscaled, almost all weight goes "
             f"to the first key ({_softmax_list(DIAGRAM_SCORES, 1.0)[0]:.2f}); divided by sqrt(D_k) = {root:g} "
             f"the weights are {', '.join(f'{w:.2f}' for w in _softmax_list(DIAGRAM_SCORES, root))}; a "
             f"temperature T = {t_lo:g} on top sharpens them and T = {t_hi:g} flattens them towards 1/4."))
    x0, bw, gap, top = 186, 44, 12, 22
    d.text(16, top + 14, f"raw scores s = q·k (D\u2096 = {DIAGRAM_DK})", size=14, anchor="start", weight="bold")
    for j, s in enumerate(DIAGRAM_SCORES):
        cx = x0 + j * (bw + gap)
        d.box(cx, top + 26, bw, 30, f"{s:g}".replace("-", "−"), color="grey", size=15)
        d.text(cx + bw / 2, top + 74, f"key {j + 1}", size=13, color=MUTED)
    y = top + 96
    row_h, bar_max = 84, 46
    for label, note, divide, colour in rows:
        w = _softmax_list(DIAGRAM_SCORES, divide)
        d.text(16, y + 30, label, size=14, anchor="start")
        d.text(16, y + 50, note, size=13, anchor="start", color=MUTED)
        base = y + 62
        d.line(x0 - 6, base, x0 + 4 * (bw + gap) - gap + 6, base, color=MUTED, width=1)
        for j, v in enumerate(w):
            cx = x0 + j * (bw + gap)
            h = max(bar_max * v, 1.0)
            d.rect(cx, base - h, bw, h, fill=colour, stroke=colour, rx=1, width=1)
            d.text(cx + bw / 2, base - h - 5, f"{v:.2f}", size=13)
        y += row_h
    return d


# --- diagram: logit soft-capping ---------------------------------------------------------------

#: Gemma 2's cap on attention scores (its ``attn_logit_softcapping``; the chapter checks it in transformers).
SOFTCAP = 50.0
_CAP_RANGE = 150.0  # scores drawn from -_CAP_RANGE to _CAP_RANGE


@diagram
def softcap_diagram() -> Diagram:
    """Soft-capping ``c tanh(s / c)`` against the identity: nearly equal for small scores, never beyond +-c."""
    c, r = SOFTCAP, _CAP_RANGE
    at = {s: c * math.tanh(s / c) for s in (10.0, 50.0, 150.0)}
    alt = (f"Scores s from {-r:g} to {r:g} on the horizontal axis. The identity line keeps growing; the soft-capped "
           f"score {c:g} tanh(s / {c:g}) follows it for small scores ({at[10.0]:.2f} at s = 10), bends away "
           f"({at[50.0]:.1f} at s = {c:g}) and flattens below the cap {c:g} ({at[150.0]:.1f} at s = {r:g}), "
           f"and the same below -{c:g}.")
    d = Diagram("ch03_softcap", 420, 300, title="Logit soft-capping", alt=alt)
    x0, x1, y_mid, half = 60.0, 400.0, 150.0, 105.0  # plot box: s in [-r, r] -> [x0, x1]; value in [-r, r] -> +-half

    def px(s: float) -> float:
        return x0 + (s + r) / (2 * r) * (x1 - x0)

    def py(v: float) -> float:
        return y_mid - v / r * half

    d.line(x0, y_mid, x1, y_mid, color=MUTED, width=1)  # the s axis
    d.line(px(0), py(r), px(0), py(-r), color=MUTED, width=1)  # the value axis
    for v in (c, -c):
        d.line(x0, py(v), x1, py(v), color=MUTED, width=1, dash=True)
        d.text(x0 - 6, py(v) + 5, f"{v:+g}", size=14, anchor="end", color=MUTED)
    d.line(px(-r), py(-r), px(r), py(r), color="grey", width=2, dash=True)  # the identity
    d.text(px(r) - 4, py(r) + 16, "identity", size=14, anchor="end", color=MUTED)
    steps = 60
    pts = [(-r + 2 * r * i / steps) for i in range(steps + 1)]
    for a, b in zip(pts, pts[1:]):
        d.line(px(a), py(c * math.tanh(a / c)), px(b), py(c * math.tanh(b / c)), color="vermillion", width=3)
    d.text(px(r), py(c) - 10, f"{c:g} tanh(s / {c:g})", size=15, anchor="end", color="vermillion")
    d.text(x1, y_mid + 22, f"s = {r:g}", size=14, anchor="end", color=MUTED)
    d.text(x0, y_mid + 22, f"{-r:g}", size=14, anchor="start", color=MUTED)
    d.text(210, 292, f"nearly the identity for small scores, never beyond ±{c:g}", size=14, color=MUTED)
    return d


# --- diagram: the gradient's path back to W^Q ----------------------------------------------------


#: The boxes of the gradient-path diagram, top (the loss) to bottom (the weight matrix it trains).
GRADIENT_PATH = (("L", "loss"), ("p = softmax(s)", "weights"), ("s_{j} = q·k_{j}", "scores"), ("q = x W^{Q}", "query"),
                 ("W^{Q}", "a weight matrix"))


@diagram
def gradient_path_diagram() -> Diagram:
    """The chain L -> p -> s -> q -> W^Q that the gradient follows back, with what each link multiplies by."""
    alt = ("A column of five boxes, from top to bottom: the loss L, the weights p = softmax(s), the scores "
           "s_j = q·k_j, the query q = x W^Q, and the weight matrix W^Q. Arrows run downwards, the way the gradient "
           "flows back. From the weights to the scores it is multiplied by the softmax's slope, nearly 0 when one "
           "weight is nearly 1, so it shrinks; from the scores to the query it is multiplied by the keys, each of "
           "length about sqrt(D_k) when the scores are not divided by sqrt(D_k), so it grows; from the query to "
           "W^Q it is multiplied by the input x.")
    d = Diagram("ch03_gradient_path", 400, 476, title="The path of the gradient back to W^Q", alt=alt)
    x, w, h, step, top = 10, 156, 52, 100, 16
    colours = ("grey", "blue", "blue", "blue", "orange")
    for i, ((label, sub), colour) in enumerate(zip(GRADIENT_PATH, colours)):
        d.box(x, top + i * step, w, h, label, sub=sub, color=colour, size=16)
    links = (
        (("∂L/∂p = g arrives", "from the layers above"), INK),
        (("× the softmax's slope:", "≈ 0 if one weight ≈ 1"), "vermillion"),
        (("× the keys, each of", "length ≈ √D\u2096 (unscaled)"), "green"),
        (("× the input x", ""), INK),
    )
    tx = x + w + 12
    for i, ((first, second), colour) in enumerate(links):
        y1, y2 = top + i * step + h, top + (i + 1) * step
        d.arrow(x + w / 2, y1 + 2, x + w / 2, y2 - 4, color=colour)
        d.text(tx, (y1 + y2) / 2 - 2 if second else (y1 + y2) / 2 + 5, first, size=14, anchor="start", color=colour)
        if second:
            d.text(tx, (y1 + y2) / 2 + 16, second, size=14, anchor="start", color=colour)
    d.text(tx, top + 18, "the gradient", size=14, anchor="start", color=MUTED)
    d.text(tx, top + 36, "flows down", size=14, anchor="start", color=MUTED)
    return d
