"""Checkers for chapter 2, *Queries, keys and values*.

* :func:`check_self_attention`: single-head self-attention from ``x`` and three projections.
* :func:`check_cross_attention`: the same with queries from one sequence and keys/values from
  another (``S_q != S_k``).

The known mistakes live in two tables, :data:`WEIGHT_MISTAKES` (wrong weights) and
:data:`OUTPUT_MISTAKES` (right weights, wrong output). Every entry computes its wrong answer from
the exercise's inputs ``(x_q, x_kv, w_q, w_k, w_v)``; ``tests/test_ch02.py`` turns each into a
reader's function and checks that the checker answers with its hint.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import re
import traceback
from typing import Callable, Iterator

import torch
from torch import Tensor

from .diagrams import Diagram, diagram
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

__all__ = [
    "qkv_inputs", "reference_attention", "check_self_attention", "check_cross_attention",
    "WEIGHT_MISTAKES", "OUTPUT_MISTAKES", "PROBE_MISTAKES", "CASES", "marker_batch", "OneHead", "initial_marker_head", "train_marker_head",
    "TOY_D", "TOY_D_K", "TOY_D_V", "qkv_path_diagram", "FRENCH", "cross_attention_diagram",
]

#: The chapter's toy sizes: width D = 16 for the running example's vectors, D_k = 4 and D_v = 6 for
#: the head, all different from S = 8 so that every shape names its axes. The notebook and the
#: diagram both read them.
TOY_D, TOY_D_K, TOY_D_V = 16, 4, 6

# Sizes of the first test case: every size differs and so does every square root (sqrt(S_q) is not
# D_v, sqrt(S_k) is not D_k, ...), so a wrong divisor or shape names its own mistake.
S_Q, S_K, D, D_K, D_V = 3, 7, 6, 5, 2

#: The checkers' cases ``(S_q, S_k, D, D_k, D_v, dtype)``: the second differs from the first in every
#: size and in the dtype, so that no hard-coded size or constant passes.
CASES: tuple[tuple[int, int, int, int, int, torch.dtype], ...] = (
    (S_Q, S_K, D, D_K, D_V, torch.float32),
    (4, 11, 8, 3, 5, torch.float64),
)

#: The batch size of the self-attention check in each case: it differs from every other size there.
BATCHES: tuple[int, ...] = (3, 2)


def qkv_inputs(s_q: int = S_Q, case: int = 0) -> dict[str, Tensor]:
    """One of the checkers' test cases (:data:`CASES`).

    Returns:
        ``x [S_k, D]`` (also the key/value sequence of the cross-attention check),
        ``x_q [S_q, D]`` (the query sequence of the cross-attention check),
        ``w_q [D, D_k]``, ``w_k [D, D_k]``, ``w_v [D, D_v]``, and ``x_batch [B, S_k, D]`` (the
        self-attention check's batch, ``B`` = :data:`BATCHES` of the case).
        ``qkv_inputs(S_K)`` gives the square probe (``S_q = S_k``) on which code that mixes up the
        sequences still runs.
    """
    sq, sk, d, dk, dv, dtype = CASES[case]
    if case == 0:
        sq = s_q
    gen = torch.Generator().manual_seed(2 + case)
    x = torch.randn(sk, d, generator=gen, dtype=torch.float64)  # [S_k, D]
    x_q = torch.randn(sq, d, generator=gen, dtype=torch.float64)  # [S_q, D]
    scale = 1.0 / math.sqrt(d)  # keeps q.k of order sqrt(D_k), so the weights are neither flat nor one-hot
    w_q = torch.randn(d, dk, generator=gen, dtype=torch.float64) * scale  # [D, D_k]
    w_k = torch.randn(d, dk, generator=gen, dtype=torch.float64) * scale  # [D, D_k]
    w_v = torch.randn(d, dv, generator=gen, dtype=torch.float64) * scale  # [D, D_v]
    x_batch = torch.randn(BATCHES[case], sk, d, generator=gen, dtype=torch.float64)  # [B, S_k, D]
    tensors = {"x": x, "x_q": x_q, "w_q": w_q, "w_k": w_k, "w_v": w_v, "x_batch": x_batch}
    return {name: t.to(dtype) for name, t in tensors.items()}


def reference_attention(x_q: Tensor, x_kv: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor) -> tuple[Tensor, Tensor]:
    """``softmax(Q K^T / sqrt(D_k)) V`` with ``Q = x_q w_q``, ``K = x_kv w_k``, ``V = x_kv w_v``.

    Returns:
        ``output [S_q, D_v]`` and ``weights [S_q, S_k]``.
    """
    q = x_q @ w_q  # [S_q, D_k]
    k = x_kv @ w_k  # [S_k, D_k]
    v = x_kv @ w_v  # [S_k, D_v]
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)  # [..., S_q, S_k]
    return weights @ v, weights  # [..., S_q, D_v], [..., S_q, S_k]


def _scores(x_q: Tensor, x_kv: Tensor, w_q: Tensor, w_k: Tensor) -> Tensor:
    return (x_q @ w_q) @ (x_kv @ w_k).mT  # [..., S_q, S_k], unscaled


def _sm(t: Tensor, dim: int = -1) -> Tensor:
    return torch.softmax(t, dim=dim)


def _cross_only(t: Tensor, x_q: Tensor, x_kv: Tensor) -> Tensor:
    if x_q is x_kv or (x_q.shape == x_kv.shape and torch.equal(x_q, x_kv)):
        raise ValueError("in self-attention x_q is x_kv, so this mistake gives the right answer")
    return t


def _square_only(t: Tensor, x_q: Tensor, x_kv: Tensor) -> Tensor:
    if x_q.shape[-2] != x_kv.shape[-2]:
        raise ValueError("this mistake is only recognisable when S_q == S_k")
    return t


def _batched_only(t: Tensor, x_q: Tensor) -> Tensor:
    if x_q.dim() < 3:
        raise ValueError("without a batch axis, dim 0 is the queries' axis: the 'softmax over dim 0' mistake")
    return t


def _unbatched_only(t: Tensor, x_q: Tensor) -> Tensor:
    if x_q.dim() >= 3:
        raise ValueError("with a batch axis this mistake has the batched wording")
    return t


def _projected_with(x_q: Tensor, map_q: Tensor, x_kv: Tensor, map_k: Tensor) -> Tensor:
    """Scaled-softmax weights with the queries and keys projected by the given maps (one shared map: a mistake)."""
    return _sm((x_q @ map_q) @ (x_kv @ map_k).mT / math.sqrt(map_q.shape[-1]))


def _unequal_lengths(t: Tensor, x_q: Tensor, x_kv: Tensor) -> Tensor:
    if x_q.shape[-2] == x_kv.shape[-2]:
        raise ValueError("when S_q = S_k this mistake is the sqrt(S_k) one")
    return t


_PROJECT_FIRST = (
    "your scores do not compare queries with keys. Project first, Q = x_q @ w_q and K = x_kv @ w_k, "
    "then score Q @ K.T / sqrt(D_k)."
)

def _notebook_width(width: int, x_q: Tensor) -> float:
    """sqrt(width) for a scale read from a notebook variable (the chapter's D_k or D) instead of the inputs;
    where S_q equals that width it is the "divided by sqrt(S_q)" mistake, so it does not apply there (the
    first case, S_q = 3, tells the two apart)."""
    if x_q.shape[-2] == width:
        raise ValueError("S_q equals the notebook's width here: the sqrt(S_q) mistake")
    return math.sqrt(width)


#: Known wrong weight matrices, ``compute(x_q, x_kv, w_q, w_k, w_v) -> weights``, tried in order.
WEIGHT_MISTAKES: tuple[Mistake, ...] = (
    Mistake("K @ Q.T", lambda xq, xk, wq, wk, wv: _sm((xk @ wk) @ (xq @ wq).mT / math.sqrt(wq.shape[-1])),
            "your weights are those of K @ Q.T (shape [S_k, S_q]): row i must hold query i's scores against "
            "every key, so compute Q @ K.T, shape [S_q, S_k]."),
    Mistake("keys from x_q", lambda xq, xk, wq, wk, wv: _cross_only(_sm((xq @ wq) @ (xq @ wk).mT / math.sqrt(wq.shape[-1])), xq, xk),
            "your weights have shape [S_q, S_q]: you took the keys from the query sequence. Keys and values "
            "come from x_kv, so the weights are [S_q, S_k]."),
    Mistake("queries from x_kv", lambda xq, xk, wq, wk, wv: _cross_only(_sm((xk @ wq) @ (xk @ wk).mT / math.sqrt(wq.shape[-1])), xq, xk),
            "your weights have shape [S_k, S_k]: you took the queries from x_kv. Queries come from x_q, so "
            "the weights are [S_q, S_k]."),
    Mistake("x_q and x_kv swapped", lambda xq, xk, wq, wk, wv: _cross_only(_sm((xk @ wq) @ (xq @ wk).mT / math.sqrt(wq.shape[-1])), xq, xk),
            "your weights have shape [S_k, S_q]: you swapped the two sequences, taking the queries from x_kv and the "
            "keys and values from x_q. Queries come from x_q, keys and values from x_kv, so the weights are [S_q, S_k]."),
    Mistake("raw scores", lambda xq, xk, wq, wk, wv: _scores(xq, xk, wq, wk) / math.sqrt(wq.shape[-1]),
            "your weights are the raw scores: apply softmax over each row (dim=-1) so that every row sums to 1."),
    Mistake("unscaled raw scores", lambda xq, xk, wq, wk, wv: _scores(xq, xk, wq, wk),
            "your weights are the raw scores: apply softmax over each row (dim=-1) so that every row sums to 1."),
    Mistake("softmax over the batch", lambda xq, xk, wq, wk, wv: _batched_only(_sm(_scores(xq, xk, wq, wk) / math.sqrt(wq.shape[-1]), 0), xq),
            "your softmax ran over dim=0, which for the batched scores [B, S, S] is the batch axis B: each weight "
            "was normalised against the same position in the other sequences. Normalise over the keys, the last "
            "axis (dim=-1), so that every row sums to 1."),
    Mistake("divided by sqrt(B)", lambda xq, xk, wq, wk, wv: _batched_only(_sm(_scores(xq, xk, wq, wk) / math.sqrt(xq.shape[0])), xq),
            "you divided by the square root of the batch size B (k.shape[0] on a batched tensor is B, not D_k). "
            "The scale is sqrt(D_k), the width of the queries and keys: k.shape[-1]."),
    Mistake("keys projected with w_q", lambda xq, xk, wq, wk, wv: _cross_only(_projected_with(xq, wq, xk, wq), xq, xk),
            "your keys were projected with w_q: one shared map for queries and keys, Q = K = x @ w_q, which "
            "section 2.2 shows keeps the scores symmetric. Project the keys with their own map, K = x_kv @ w_k."),
    Mistake("queries projected with w_k", lambda xq, xk, wq, wk, wv: _cross_only(_projected_with(xq, wk, xk, wk), xq, xk),
            "your queries were projected with w_k: one shared map for queries and keys, Q = K = x @ w_k, which "
            "section 2.2 shows keeps the scores symmetric. Project the queries with their own map, Q = x_q @ w_q."),
    Mistake("softmax over dim 0", lambda xq, xk, wq, wk, wv: _sm(_scores(xq, xk, wq, wk) / math.sqrt(wq.shape[-1]), -2),
            "your columns sum to 1 instead of your rows: softmax ran over the queries (dim=0 of an [S, S] matrix, dim=-2 in general). Normalise over "
            "the keys, the last axis (dim=-1)."),
    Mistake("no scale", lambda xq, xk, wq, wk, wv: _sm(_scores(xq, xk, wq, wk)),
            "you forgot to divide by sqrt(D_k): your weights are too peaked."),
    Mistake("multiplied by sqrt(D_k)", lambda xq, xk, wq, wk, wv: _sm(_scores(xq, xk, wq, wk) * math.sqrt(wq.shape[-1])),
            "you multiplied the scores by sqrt(D_k) (s / (1 / sqrt(d)) is s * sqrt(d)): divide them by sqrt(D_k), "
            "s / math.sqrt(d_k), so the weights are not too peaked."),
    Mistake("divided by D_k", lambda xq, xk, wq, wk, wv: _sm(_scores(xq, xk, wq, wk) / wq.shape[-1]),
            "you divided by D_k instead of sqrt(D_k): your weights are too flat."),
    Mistake("divided by sqrt(D)", lambda xq, xk, wq, wk, wv: _sm(_scores(xq, xk, wq, wk) / math.sqrt(xq.shape[-1])),
            "you divided by sqrt(D), the width of x. The scale uses D_k, the width of the queries and keys: "
            "divide by sqrt(D_k)."),
    Mistake("divided by sqrt(D_v)", lambda xq, xk, wq, wk, wv: _sm(_scores(xq, xk, wq, wk) / math.sqrt(wv.shape[-1])),
            "you divided by sqrt(D_v), the width of the values (k.shape[-1] would be D_k; v.shape[-1] is D_v). "
            "The scale belongs to the dot products of queries and keys: divide by sqrt(D_k)."),
    Mistake("no projection", lambda xq, xk, wq, wk, wv: _sm(xq @ xk.mT), _PROJECT_FIRST),
    Mistake("no projection, scaled", lambda xq, xk, wq, wk, wv: _sm(xq @ xk.mT / math.sqrt(wq.shape[-1])), _PROJECT_FIRST),
    Mistake("no projection, scaled by D", lambda xq, xk, wq, wk, wv: _sm(xq @ xk.mT / math.sqrt(xq.shape[-1])), _PROJECT_FIRST),
    Mistake("Q @ Q.T", lambda xq, xk, wq, wk, wv: _square_only(_sm((xq @ wq) @ (xq @ wq).mT / math.sqrt(wq.shape[-1])), xq, xk),
            "you compared the queries with the queries (Q @ Q.mT, or keys projected with w_q: one shared map, which "
            "section 2.2 shows keeps the scores symmetric): the scores compare each query with every *key*, "
            "Q @ K.T, with K = x @ w_k."),
    Mistake("K @ K.T", lambda xq, xk, wq, wk, wv: _square_only(_sm((xk @ wk) @ (xk @ wk).mT / math.sqrt(wq.shape[-1])), xq, xk),
            "you compared the keys with the keys (K @ K.mT, or queries projected with w_k: one shared map, which "
            "section 2.2 shows keeps the scores symmetric): the scores compare each *query* with every key, "
            "Q @ K.T, with Q = x @ w_q."),
    Mistake("divided by sqrt(S_k)", lambda xq, xk, wq, wk, wv: _unbatched_only(_sm(_scores(xq, xk, wq, wk) / math.sqrt(xk.shape[-2])), xq),
            "you divided by the square root of a sequence length (the number of keys, S_k = x_kv.shape[0]). The "
            "scale is sqrt(D_k), the width of the queries and keys: shape[-1] of q or k, not shape[0]."),
    Mistake("divided by sqrt(S)", lambda xq, xk, wq, wk, wv: _batched_only(_sm(_scores(xq, xk, wq, wk) / math.sqrt(xk.shape[-2])), xq),
            "you divided by sqrt(S), the sequence length: x.shape[1] for x of shape [B, S, D], and q.shape[1] or "
            "k.shape[1] too. The scale uses the key width D_k, the last axis of q and k, not a length."),
    Mistake("weights transposed", lambda xq, xk, wq, wk, wv: _unbatched_only(_right_weights(xq, xk, wq, wk, wv).mT, xq),
            "your weight matrix is the right one transposed: its columns sum to 1. Return the weights with one "
            "row per query, [S_q, S_k], not weights.T."),
    Mistake("weights transposed, batched", lambda xq, xk, wq, wk, wv: _batched_only(_right_weights(xq, xk, wq, wk, wv).mT, xq),
            "each of your weight matrices is the right one transposed: its columns sum to 1. Return the weights "
            "[B, S, S] with one row per query in every sequence of the batch: don't transpose them."),
    Mistake("divided after softmax", lambda xq, xk, wq, wk, wv: _sm(_scores(xq, xk, wq, wk)) / math.sqrt(wq.shape[-1]),
            "every row of your weights sums to 1/sqrt(D_k), not 1: you divided by sqrt(D_k) after softmax. The "
            "scale belongs to the scores, before softmax turns them into weights; after it, the weights no longer "
            "sum to 1."),
    Mistake("the notebook's D_k", lambda xq, xk, wq, wk, wv: _sm(_scores(xq, xk, wq, wk) / _notebook_width(TOY_D_K, xq)),
            f"you divided by sqrt({TOY_D_K}) = {math.sqrt(TOY_D_K):g} on every call: that is the chapter's D_k = {TOY_D_K}, "
            "a variable of the notebook, not the width of the tensors your function received (the checker's heads "
            "are wider or narrower). Read D_k from the inputs inside the function, q.shape[-1] (or w_q.shape[1])."),
    Mistake("the notebook's D", lambda xq, xk, wq, wk, wv: _sm(_scores(xq, xk, wq, wk) / _notebook_width(TOY_D, xq)),
            f"you divided by sqrt({TOY_D}) = {math.sqrt(TOY_D):g} on every call: that is the chapter's D = {TOY_D}, a "
            "variable of the notebook, and the wrong width too. The scale is sqrt(D_k), the width of the queries and "
            "keys your function received: q.shape[-1] (or w_q.shape[1])."),
    Mistake("divided by sqrt(S_q)", lambda xq, xk, wq, wk, wv: _unequal_lengths(_sm(_scores(xq, xk, wq, wk) / math.sqrt(xq.shape[-2])), xq, xk),
            "you divided by sqrt(S_q), the number of queries (x_q.shape[0]). The scale is sqrt(D_k), the width of "
            "the queries and keys: shape[-1] of q or k, not shape[0]."),
)


def _sum_without_keepdim(xq: Tensor, xk: Tensor, wq: Tensor, wk: Tensor) -> Tensor:
    """A softmax written by hand whose row sums lost their axis: ``e / e.sum(dim=-1)``. It runs only where the
    sums, shape [..., S_q], broadcast against the last axis, S_k (a square probe, with a batch of 1)."""
    e = torch.exp(_scores(xq, xk, wq, wk) / math.sqrt(wq.shape[-1]))
    return e / e.sum(dim=-1)


#: Known wrong weights that raise an error on the checkers' cases and run only on a probe (``S_q = S_k``,
#: and a batch of one in self-attention); the checkers try the probe when the reader's code raises.
PROBE_MISTAKES: tuple[Mistake, ...] = (
    Mistake("softmax sum without keepdim", lambda xq, xk, wq, wk, wv: _sum_without_keepdim(xq, xk, wq, wk),
            "your hand-written softmax divides by e.sum(dim=-1), which drops the summed axis: the sums, one per "
            "query, are then lined up with the keys' axis, so each column is divided by another row's sum (and with "
            "S_q != S_k, or a batch, the division raised an error). Keep the axis, e.sum(dim=-1, keepdim=True), or "
            "use torch.softmax(scores, dim=-1)."),
)


def _right_weights(xq: Tensor, xk: Tensor, wq: Tensor, wk: Tensor, wv: Tensor) -> Tensor:
    return reference_attention(xq, xk, wq, wk, wv)[1]


#: Known wrong outputs given the right weights, ``compute(x_q, x_kv, w_q, w_k, w_v) -> output``.
OUTPUT_MISTAKES: tuple[Mistake, ...] = (
    Mistake("forgot V", lambda xq, xk, wq, wk, wv: _unbatched_only(_right_weights(xq, xk, wq, wk, wv), xq),
            "your output is the weights themselves, shape [S_q, S_k]: did you forget to multiply by V?"),
    Mistake("forgot V, batched", lambda xq, xk, wq, wk, wv: _batched_only(_right_weights(xq, xk, wq, wk, wv), xq),
            "your output is the weights themselves, shape [B, S, S]: did you forget to multiply by V?"),
    Mistake("mixed x", lambda xq, xk, wq, wk, wv: _right_weights(xq, xk, wq, wk, wv) @ xk,
            "you mixed the rows of x itself. Mix the values instead: V = x @ w_v, output = weights @ V."),
    Mistake("mixed the keys", lambda xq, xk, wq, wk, wv: _right_weights(xq, xk, wq, wk, wv) @ (xk @ wk),
            "you mixed the keys. Keys are for scoring; the output mixes the values: weights @ V."),
    Mistake("values from x_q", lambda xq, xk, wq, wk, wv: _cross_only(_right_weights(xq, xk, wq, wk, wv) @ (xq @ wv), xq, xk),
            "you took the values from x_q. Values come from the same sequence as the keys, x_kv: each key "
            "labels one value, so weights [S_q, S_k] @ V [S_k, D_v]. (With S_q != S_k your code raised an error.)"),
    Mistake("weights.T @ V", lambda xq, xk, wq, wk, wv: _right_weights(xq, xk, wq, wk, wv).mT @ (xk @ wv),
            "you multiplied weights.T @ V. Row i of the output mixes the values with row i of the weights: weights @ V."),
    Mistake("output from unscaled weights", lambda xq, xk, wq, wk, wv: _sm(_scores(xq, xk, wq, wk)) @ (xk @ wv),
            "your weights are right, but your output mixes the values with different weights: those of the "
            "scores without the division by sqrt(D_k). Mix the values with the weights you return: weights @ V."),
    Mistake("output = V", lambda xq, xk, wq, wk, wv: _square_only(xk @ wv, xq, xk),
            "your output equals V: no mixing happened. Multiply by the weights: weights @ V."),
)


def _with_scale(x_q: Tensor, x_kv: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor, divide: float | None,
                multiply: float | None) -> tuple[Tensor, Tensor]:
    """The right attention with the scores divided by ``divide`` (or multiplied by ``multiply``) instead of sqrt(D_k)."""
    scores = _scores(x_q, x_kv, w_q, w_k)
    weights = _sm(scores / divide if divide is not None else scores * multiply)
    return weights @ (x_kv @ w_v), weights


def _float32_scale(output: Tensor, weights: Tensor, *args: Tensor) -> Feedback | None:
    """The hint for float64 scores divided by a float32 0-d tensor, ``torch.sqrt(torch.tensor(d_k))`` (torch.sqrt of an
    int tensor is float32, and so is ``torch.tensor(5.0)``): PyTorch keeps the scores' float64, but the scale itself was
    rounded to float32's 7 digits, so the answer is right only to about 1e-8. ``None`` when that is not what happened."""
    d_k = args[2].shape[-1]
    root32 = torch.sqrt(torch.tensor(float(d_k), dtype=torch.float32))
    variants = (_with_scale(*args, divide=float(root32), multiply=None),
                _with_scale(*args, divide=None, multiply=float(torch.rsqrt(torch.tensor(float(d_k), dtype=torch.float32)))),
                _with_scale(*args, divide=None, multiply=float(1 / root32)))
    for out, w in variants:
        if close(output, out, atol=1e-13, rtol=1e-11) and close(weights, w, atol=1e-13, rtol=1e-11):
            return wrong("your scale is a float32 tensor (torch.sqrt(torch.tensor(d_k)): torch.sqrt of an integer tensor "
                         "is float32, and so is torch.tensor of a Python float, or one made with dtype=torch.float32). "
                         "The scores stay float64, but they are divided by a number rounded to float32's 7 digits, so "
                         "the weights are right only to about 8 significant digits. Compute in the inputs' dtype or wider; don't narrow it: "
                         "scale by a Python float, math.sqrt(k.shape[-1]) or k.shape[-1] ** 0.5.")
    return None


def _diagnose(result: object, x_q: Tensor, x_kv: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor) -> Feedback | None:
    """``None`` when ``result`` is the right ``(output, weights)``, else a hint.

    A pair that is right to half precision (``HALF_TOL``) but not to ``ATOL`` is named as low precision
    before the row sums are read: softmax rows computed in bfloat16 sum to 1 only to about 3 digits."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return wrong(f"return a pair (output, weights), got {describe(result)}.")
    output, weights = result
    for name, t in (("output", output), ("weights", weights)):
        if not isinstance(t, Tensor):
            return wrong(f"{name} should be a torch.Tensor, got {describe(t)}.")
    args = (x_q, x_kv, w_q, w_k, w_v)
    expected_out, expected_w = reference_attention(*args)
    from .ch01 import lost_precision, not_finite, rounded_like_half, unfilled_rows

    input_name = "x" if x_q is x_kv else "x_q"  # the self-attention checker passes x as both
    for name, t, ref in (("output", output, expected_out), ("weights", weights, expected_w)):
        lost = lost_precision(t, ref, name=f"your {name}", input_name=input_name)
        if lost is not None:
            return lost
    if x_q.dtype == torch.float64:  # the dtype rule: float32 inside, cast back, is refused even where it fits ATOL
        scale32 = _float32_scale(output, weights, *args)
        if scale32 is not None:
            return scale32
        narrow = reference_attention(*(a.float() for a in args))
        for name, t, ref, nar in (("output", output, expected_out, narrow[0]), ("weights", weights, expected_w, narrow[1])):
            narrower = computed_narrower(t, ref, nar.double(), name=f"your {name}")
            if narrower is not None:
                return narrower
    if close(output, expected_w) and close(weights, expected_out):
        return wrong("return (output, weights) in that order: your first item is the weight matrix.")
    if not close(weights, expected_w):
        hint = diagnose(weights, WEIGHT_MISTAKES + PROBE_MISTAKES, *args)
        if hint is not None:
            return hint
        if tuple(weights.shape) != tuple(expected_w.shape):
            axes = "[B, S, S]" if expected_w.dim() == 3 else "[S_q, S_k]"
            return wrong(f"your weights have shape {tuple(weights.shape)}, expected {axes} = "
                         f"{tuple(expected_w.shape)}: one row per query, one column per key"
                         + (", for every sequence of the batch." if expected_w.dim() == 3 else "."))
        half = rounded_like_half(weights, expected_w, name="your weight matrix") or not_finite(weights, name="your weight matrix")
        if half is not None:
            return half
        sums = as_cpu_float64(weights).sum(dim=-1)
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4) and torch.allclose(sums, sums.flatten()[0].expand_as(sums), atol=1e-6):
            return wrong(f"your rows sum to {float(sums.flatten()[0]):.4f}, every row alike, not 1: the weights were "
                         "scaled after softmax. Scale the scores before softmax; the weights it returns already sum to 1.")
        unfilled = unfilled_rows(weights)
        if unfilled is not None:
            return unfilled
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
            worst = int((sums - 1).abs().flatten().argmax())
            row = worst % sums.shape[-1]
            where = f"sequence {worst // sums.shape[-1]}, row {row}" if sums.dim() == 2 else f"row {row}"
            return wrong(f"your rows sum to {float(sums.flatten()[worst]):.4f} ({where}): apply softmax over the keys, "
                         "the last axis (dim=-1), so that every row sums to 1.")
        return compare_tensors(weights, expected_w, name="your weight matrix")
    if close(output, expected_out):
        return None
    return (diagnose(output, OUTPUT_MISTAKES, *args) or rounded_like_half(output, expected_out, name="your output")
            or not_finite(output, name="your output") or compare_tensors(output, expected_out, name="your output"))


@contextlib.contextmanager
def _watch_attention_functions() -> Iterator[list[str]]:
    """Record calls of ``attnlib.scaled_dot_product_attention`` and PyTorch's fused SDPA while active."""
    import attnlib
    import torch.nn.functional as F

    called: list[str] = []
    originals = [(attnlib, "scaled_dot_product_attention", "attnlib.scaled_dot_product_attention"),
                 (F, "scaled_dot_product_attention", "F.scaled_dot_product_attention")]
    saved = [getattr(mod, attr) for mod, attr, _ in originals]
    for (mod, attr, label), orig in zip(originals, saved):
        def spy(*a: object, _orig: Callable[..., object] = orig, _label: str = label, **k: object) -> object:
            called.append(_label)
            return _orig(*a, **k)
        setattr(mod, attr, spy)
    try:
        yield called
    finally:
        for (mod, attr, _), orig in zip(originals, saved):
            setattr(mod, attr, orig)


def _check(fn: Callable[..., object], make_args: Callable[[dict[str, Tensor]], tuple[Tensor, ...]],
           select: Callable[[tuple[Tensor, ...]], tuple[Tensor, ...]], *,
           by_hand: bool = False) -> Feedback | None:
    """Run the reader's code on every case of :data:`CASES`; if the first raises, once more on the square probe.

    ``select`` picks the reader's arguments from the case's tensors; the reader gets copies, passed
    directly, so run_reader_code sees them (and refuses code that changes them in place)."""
    for case in range(len(CASES)):
        args = make_args(qkv_inputs(case=case))
        with _watch_attention_functions() as called:
            result, feedback = run_reader_code(fn, *select(tuple(a.clone() for a in args)))
        if by_hand and called and feedback is None:
            return wrong(f"your function calls {called[0]}: the exercise is to write the attention by hand, "
                         "with matrix products and torch.softmax only.")
        if feedback is None:
            problem = _diagnose(result, *args)
            if problem is not None:
                return problem
            continue
        if case == 0 and feedback.message.startswith("your code raised"):  # maybe a mix-up that only runs when S_q == S_k
            square = make_args(qkv_inputs(S_K))
            result2, feedback2 = run_reader_code(fn, *select(tuple(a.clone() for a in square)))
            if feedback2 is None:
                hint = _diagnose(result2, *square)
                if hint is not None:
                    return hint
        return feedback
    return None


def _table_cases(self_attention: bool) -> Callable[[], list[tuple[Tensor, ...]]]:
    def cases() -> list[tuple[Tensor, ...]]:
        out = []
        for c in range(len(CASES)):
            t = qkv_inputs(case=c)
            x_kv = t["x_batch"] if self_attention else t["x"]
            out.append((x_kv if self_attention else t["x_q"], x_kv, t["w_q"], t["w_k"], t["w_v"]))
        if not self_attention:  # the square probe, tried when the reader's code raises on the first case
            t = qkv_inputs(S_K)
            out.append((t["x_q"], t["x"], t["w_q"], t["w_k"], t["w_v"]))
        return out
    return cases


def _solution_self(x: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor) -> tuple[Tensor, Tensor]:
    q, k, v = x @ w_q, x @ w_k, x @ w_v  # [B, S, D_k], [B, S, D_k], [B, S, D_v]
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1)  # [B, S, S]
    return weights @ v, weights


def _solution_cross(x_q: Tensor, x_kv: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor) -> tuple[Tensor, Tensor]:
    q, k, v = x_q @ w_q, x_kv @ w_k, x_kv @ w_v  # [S_q, D_k], [S_k, D_k], [S_k, D_v]
    weights = torch.softmax(q @ k.T / math.sqrt(k.shape[-1]), dim=-1)  # [S_q, S_k]
    return weights @ v, weights


def _probe_args(self_attention: bool) -> tuple[Tensor, ...]:
    """Where a slip that raises on the checkers' cases runs: ``S_q = S_k``, and a batch of one in self-attention."""
    if self_attention:
        t = qkv_inputs()
        x = t["x_batch"][:1]  # [1, S, D]
        return x, x, t["w_q"], t["w_k"], t["w_v"]
    t = qkv_inputs(S_K)
    return t["x_q"], t["x"], t["w_q"], t["w_k"], t["w_v"]


def _tables(self_attention: bool) -> tuple[MistakeTable, ...]:
    cases = _table_cases(self_attention)
    return (MistakeTable(WEIGHT_MISTAKES, cases, _right_weights),
            MistakeTable(OUTPUT_MISTAKES, cases, lambda *a: reference_attention(*a)[0]),
            MistakeTable(PROBE_MISTAKES, lambda: [_probe_args(self_attention)], _right_weights))


_PRODUCT = re.compile(r"@|matmul|\bbmm\b|\bmm\b|einsum")
_QUERY_NAME = re.compile(r"\b(q|queries|query|Q)\w*\b")
_KEY_NAME = re.compile(r"\b(k|keys|key|K)\w*\b")
_VALUES_TRANSPOSED = re.compile(r"\b(v|values|value|V)\w*\s*\.\s*(T\b|mT\b|transpose\b|permute\b)")


_ASSIGNED = re.compile(r"^\s*[\w\s,.\[\]:-]*?(?<![=!<>])(?:[-+*/@%]|//)?=(?!=)")
_WEIGHT_NAME = r"\bw_?[qkvQKV]\w*"
_PROJECTION_SLIP = re.compile(
    _WEIGHT_NAME + r"\s*\.\s*(T\b|mT\b|t\s*\(|transpose\b|permute\b)"  # w_q.T: nn.Linear's layout
    + r"|" + _WEIGHT_NAME + r"\s*(\.\s*T\s*)?@"  # w_q @ x: the weight first
    + r"|\b(torch\s*\.\s*)?matmul\s*\(\s*" + _WEIGHT_NAME  # torch.matmul(w_q, x)
)


def _right_side(line: str) -> str:
    """The code of a source line without its comment and, for an assignment, without its targets (``q, k, v =``)."""
    code = line.split("#")[0]
    target = _ASSIGNED.match(code)
    return code[target.end():] if target else code


def _score_product(line: str) -> bool:
    """True for a line that multiplies the queries with the keys (its right-hand side names both, and a product): where
    a transpose of the wrong axes raises. A line that mixes the values or projects x is not one, whatever it assigns to
    (``q, k, v = x @ w_q.T, ...`` names q and k only as targets)."""
    code = _right_side(line)
    names_both = _QUERY_NAME.search(code) and _KEY_NAME.search(code)
    projects_both = re.search(r"\bw_?[qQ]\w*", code) and re.search(r"\bw_?[kK]\w*", code)  # (x @ w_q) @ (x @ w_k).T
    return bool(_PRODUCT.search(code) and (names_both or projects_both))


def _projection_slip(line: str) -> bool:
    """True for a line that projects x with a weight transposed (``x @ w_q.T``, the nn.Linear habit) or put first
    (``w_q @ x``)."""
    return bool(_PROJECTION_SLIP.search(_right_side(line)))


def _failing_line(fn: Callable[..., object], args: tuple[Tensor, ...]) -> str | None:
    """The source line of the reader's function on which it raised for ``args`` (``None`` when unknown)."""
    code = getattr(fn, "__code__", None)
    try:
        fn(*(a.clone() for a in args))
    except Exception as err:  # the reader's error, read for its line only
        frames = [f for f in traceback.extract_tb(err.__traceback__) if code is not None and f.filename == code.co_filename]
        return frames[-1].line if frames and frames[-1].line else None
    return None


_TRANSPOSE_ADVICE = (" (The error is in the score product. With x of shape [B, S, D], q and k are [B, S, D_k]: k.T "
                     "reverses all three axes, a transpose of the wrong pair, such as k.transpose(0, 1), moves the batch "
                     "axis, and transposing q instead of k multiplies [B, D_k, S] by [B, S, D_k]; swap only the last two "
                     "axes of k, k.transpose(-2, -1).)")


_VALUES_ADVICE = (" (The error is in the product with the values, which you transposed. V = x @ w_v is already [B, S, D_v], "
                  "one row per key, in the order of the weights' columns: weights [B, S, S] @ V [B, S, D_v] needs no "
                  "transpose.)")

_ZEROS_LIKE_ADVICE = (" (Your buffer torch.zeros_like(x) has x's shape, [B, S, D], but each sequence's output weights @ v "
                      "has the values' width, [S, D_v]: start from torch.zeros(B, S, w_v.shape[1], dtype=x.dtype), or "
                      "drop the loop.)")


def _source(fn: Callable[..., object]) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


_DTYPE_ADVICE = (" (It raised on the checker's float64 case: a tensor made without dtype=, such as a buffer from "
                 "torch.zeros(...) or torch.empty(...), is float32 by default, and a product of float32 with float64 "
                 "raises. Make every tensor in the inputs' dtype: pass dtype=x.dtype.)")

_PROJECTION_ADVICE = (" (The line that raised, `{line}`, projects x. The exercise's w_q and w_k are the book's [D, D_k] "
                      "matrices and w_v is [D, D_v], not nn.Linear's .weight, which is stored as [D_k, D]: they need no "
                      "transpose, and x, [B, S, D], comes first in the product, so that its last axis, D, meets their "
                      "first.)")

_SHAPES_ADVICE = (" (The line that raised is `{line}`. With x of shape [B, S, D]: q = x @ w_q and k are [B, S, D_k], "
                  "v = x @ w_v is [B, S, D_v] (x comes first: x @ w), the weights are [B, S, S] and the output [B, S, D_v]; "
                  "write the shape of each tensor on that line next to it.)")


@exercise(solution=_solution_self, tables=_tables(True))
def check_self_attention(fn: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> Feedback:
    """Check ``fn(x [B, S, D], w_q [D, D_k], w_k [D, D_k], w_v [D, D_v]) -> (output [B, S, D_v], weights [B, S, S])``."""
    feedback = _check(fn, lambda t: (t["x_batch"], t["x_batch"], t["w_q"], t["w_k"], t["w_v"]),
                      lambda a: (a[0], *a[2:]), by_hand=True)
    if feedback is not None:
        if feedback.message.startswith("your code raised"):
            probe = _probe_args(True)
            result, raised = run_reader_code(fn, *(a.clone() for a in (probe[0], *probe[2:])))
            if raised is None and isinstance(result, (tuple, list)) and len(result) == 2:
                hint = diagnose(result[1], PROBE_MISTAKES + WEIGHT_MISTAKES, *probe)
                if hint is not None:
                    return hint
            t = qkv_inputs()
            line = _failing_line(fn, (t["x_batch"], t["w_q"], t["w_k"], t["w_v"]))
            if line is not None and _VALUES_TRANSPOSED.search(line.split("#")[0]) and _PRODUCT.search(line):
                return wrong(feedback.message + _VALUES_ADVICE)
            if re.search(r"same dtype|Float did not match Double|Double did not match Float|expected scalar type "
                         r"(Float|Double)", feedback.message):  # raised on the float64 case only
                return wrong(feedback.message + _DTYPE_ADVICE)
            if line is not None and _projection_slip(line):
                return wrong(feedback.message + _PROJECTION_ADVICE.format(line=line.strip()))
            sizes = {int(n) for n in re.findall(r"\b\d+\b", feedback.message)}
            projects_x = line is not None and re.search(_WEIGHT_NAME, _right_side(line)) is not None
            projects_x = projects_x and not _score_product(line)
            # D_k = 5 only as a wrong score product's axis (a line that projects x with w_q, w_k, w_v is not one)
            if line is None or _score_product(line) or (D_K in sizes and not projects_x):
                return wrong(feedback.message + _TRANSPOSE_ADVICE)
            if "zeros_like(x" in line or ("expanded size" in feedback.message and "zeros_like(x" in _source(fn)):
                return wrong(feedback.message + _ZEROS_LIKE_ADVICE)
            return wrong(feedback.message + _SHAPES_ADVICE.format(line=line.strip()))
        return feedback
    t = qkv_inputs()
    expected_out, expected_w = reference_attention(t["x_batch"], t["x_batch"], t["w_q"], t["w_k"], t["w_v"])
    return correct(
        f"rows sum to 1, output has shape {tuple(expected_out.shape)} = [B, S, D_v]; in sequence 0, query 0 puts "
        f"{float(expected_w[0, 0].max()):.2f} on its favourite key (checked on two sizes and dtypes)."
    )


@exercise(solution=_solution_cross, tables=_tables(False))
def check_cross_attention(fn: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> Feedback:
    """Check ``fn(x_q [S_q, D], x_kv [S_k, D], w_q, w_k, w_v) -> (output [S_q, D_v], weights [S_q, S_k])``."""
    feedback = _check(fn, lambda t: (t["x_q"], t["x"], t["w_q"], t["w_k"], t["w_v"]), lambda a: a)
    if feedback is not None:
        return feedback
    t = qkv_inputs()
    expected_out, expected_w = reference_attention(t["x_q"], t["x"], t["w_q"], t["w_k"], t["w_v"])
    return correct(
        f"{S_Q} queries each spread their attention over {S_K} keys: weights {tuple(expected_w.shape)} = [S_q, S_k], "
        f"output {tuple(expected_out.shape)} = [S_q, D_v] (checked on two sizes and dtypes)."
    )


# --- a head that learns something --------------------------------------------------------


def marker_batch(batch: int, S: int, d_content: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """A batch of the "find the marked token" task.

    Each of the ``S`` tokens has a random content vector ``[d_content]``, a marker feature (1 on
    exactly one token per sequence, 0 elsewhere) and a constant feature 1. The target of *every*
    position is the content of the marked token.

    Returns:
        ``x [batch, S, d_content + 2]``, ``target [batch, S, d_content]``, ``marked [batch]``.
    """
    content = torch.randn(batch, S, d_content, generator=gen)  # [B, S, d_c]
    marked = torch.randint(S, (batch,), generator=gen)  # [B]
    flag = torch.nn.functional.one_hot(marked, S).float()[..., None]  # [B, S, 1]
    x = torch.cat([content, flag, torch.ones(batch, S, 1)], dim=-1)  # [B, S, d_c + 2]
    target = content[torch.arange(batch), marked][:, None, :].expand(batch, S, d_content)  # [B, S, d_c]
    return x, target, marked


class OneHead(torch.nn.Module):
    """Single-head self-attention without biases: ``softmax(x W^Q (x W^K)^T / sqrt(D_k)) x W^V``."""

    def __init__(self, d_in: int, d_k: int, d_v: int) -> None:
        super().__init__()
        self.w_q = torch.nn.Parameter(torch.randn(d_in, d_k) / math.sqrt(d_in))  # [D, D_k]
        self.w_k = torch.nn.Parameter(torch.randn(d_in, d_k) / math.sqrt(d_in))  # [D, D_k]
        self.w_v = torch.nn.Parameter(torch.randn(d_in, d_v) / math.sqrt(d_in))  # [D, D_v]

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        q, k, v = x @ self.w_q, x @ self.w_k, x @ self.w_v  # [B, S, D_k], [B, S, D_k], [B, S, D_v]
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)  # [B, S, S]
        return weights @ v, weights  # [B, S, D_v], [B, S, S]


def initial_marker_head(*, d_content: int = 6, d_k: int = 4, seed: int = 0) -> OneHead:
    """The untrained head :func:`train_marker_head` starts from (seeded privately; the global generator is untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return OneHead(d_content + 2, d_k, d_content)


def train_marker_head(
    steps: int = 300, *, S: int = 8, d_content: int = 6, d_k: int = 4, batch: int = 64, lr: float = 0.03, seed: int = 0
) -> tuple[OneHead, list[float]]:
    """Train a :class:`OneHead` on :func:`marker_batch` with Adam and a mean squared error.

    Everything is seeded from ``seed`` with private generators; the reader's global generator is
    left as it was.

    Returns:
        ``(head, losses)``: the trained head and the loss of every step.

    >>> head, losses = train_marker_head(steps=5)
    >>> len(losses), head.w_q.shape
    (5, torch.Size([8, 4]))
    """
    head = initial_marker_head(d_content=d_content, d_k=d_k, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    losses: list[float] = []
    threads = torch.get_num_threads()
    # Tiny tensors: one thread is fastest, and fixes the order of the sums. It does not fix the last bits
    # across instruction sets (AVX2, AVX-512): there the losses agree to 4 digits, but a parameter that
    # gets no gradient in exact arithmetic still moves by rounding-level steps that Adam enlarges (chapter 2 prints them with a ~).
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            x, target, _ = marker_batch(batch, S, d_content, gen)
            out, _ = head(x)
            loss = torch.nn.functional.mse_loss(out, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return head, losses


@diagram
def qkv_path_diagram() -> Diagram:
    """Chapter 2: X through Q, K, V to the scores, the weights and the output, with the chapter's sizes."""
    from .ch01 import draw_head_path
    from .examples import BOOKS_SENTENCE

    S, D, Dk, Dv = len(BOOKS_SENTENCE), TOY_D, TOY_D_K, TOY_D_V
    alt = (f"X, one row per token, shape ({S}, {D}) = (S, D), goes through W^Q, W^K and W^V to Q and K, "
           f"each ({S}, {Dk}) = (S, D_k), and V, ({S}, {Dv}) = (S, D_v). Q and K give the score matrix Z = QK^T divided by the square root of D_k, "
           f"({S}, {S}): row i holds query i's score for every key. Softmax along each row gives "
           f"the weights A, ({S}, {S}), each row summing to 1. A times V gives the output O, ({S}, {Dv}), one row per token.")
    return draw_head_path(
        "ch02_qkv_path",
        {"x": f"[{S}, {D}]", "q": f"[{S}, {Dk}]", "k": f"[{S}, {Dk}]", "v": f"[{S}, {Dv}]",
         "scores": f"[{S}, {S}]", "weights": f"[{S}, {S}], rows sum to 1", "out": f"[{S}, {Dv}], one row per token"},
        title="From X to the output, in chapter 2's sizes", alt=alt,
        labels=("Z = QK^{T} / √D_{k}", "A = softmax(Z, dim=-1)", "O = A V"))


#: The French sentence of section 2.7, whose 3 tokens ask the queries of the cross-attention example.
FRENCH: tuple[str, ...] = ("Les", "livres", "sont")


@diagram
def cross_attention_diagram() -> Diagram:
    """Chapter 2: cross-attention, queries from the French sentence, keys and values from the English one."""
    from .examples import BOOKS_SENTENCE

    S_q, S_k, D, Dk, Dv = len(FRENCH), len(BOOKS_SENTENCE), TOY_D, TOY_D_K, TOY_D_V
    alt = (f"Cross-attention, top to bottom. Two inputs: the French tokens, shape ({S_q}, {D}), and the English "
           f"tokens, ({S_k}, {D}). W^Q maps the French to the queries Q, ({S_q}, {Dk}); W^K and W^V map the English "
           f"to the keys K, ({S_k}, {Dk}), and the values V, ({S_k}, {Dv}). The scores QK^T divided by the square "
           f"root of D_k are ({S_q}, {S_k}): one row per French query, one column per English key. Softmax along "
           f"each row gives the weights, ({S_q}, {S_k}), and the weights times V give the output, ({S_q}, {Dv}), "
           "one row per French token.")
    d = Diagram("ch02_cross_attention", 360, 470, title="Cross-attention: queries from one sequence, keys and values from another", alt=alt)
    d.box(12, 12, 120, 50, "X_{fr} (queries)", sub=f"[{S_q}, {D}]", color="purple", size=14)
    d.box(168, 12, 180, 50, "X_{en} (keys, values)", sub=f"[{S_k}, {D}]", color="grey", size=14)
    for x, label, shape, colour in ((12, "Q", f"[{S_q}, {Dk}]", "blue"), (132, "K", f"[{S_k}, {Dk}]", "blue"),
                                    (252, "V", f"[{S_k}, {Dv}]", "green")):
        d.box(x, 112, 96, 50, label, sub=shape, color=colour)
    d.arrow(60, 62, 60, 110)
    d.arrow(258, 62, 180, 110)
    d.arrow(258, 62, 300, 110)
    d.text(56, 92, "W^{Q}", size=15, anchor="end")
    d.text(200, 84, "W^{K}", size=15, anchor="end")
    d.text(290, 84, "W^{V}", size=15, anchor="start")
    d.box(12, 206, 216, 54, "QK^{T} / √D_{k}", sub=f"[{S_q}, {S_k}] = [S_q, S_k]", color="orange")
    d.arrow(60, 162, 60, 204)
    d.arrow(180, 162, 180, 204)
    d.box(12, 300, 216, 54, "softmax, each row", sub=f"[{S_q}, {S_k}], rows sum to 1", color="orange")
    d.arrow(120, 260, 120, 298)
    d.box(12, 394, 336, 54, "weights @ V", sub=f"[{S_q}, {Dv}], one row per French token", color="green")
    d.arrow(120, 354, 120, 392)
    d.arrow(300, 162, 300, 392)
    return d
