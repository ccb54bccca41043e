"""Checkers for chapter 2, *Queries, keys and values*.

* :func:`check_self_attention`: single-head self-attention from ``x`` and three projections.
* :func:`check_cross_attention`: the same with queries from one sequence and keys/values from
  another (``S_q != S_k``).

Both diagnose the usual mistakes: softmax over the wrong axis, a missing or wrong scale, a
forgotten multiplication by ``V``, ``K @ Q^T`` instead of ``Q @ K^T``, skipped projections.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from .feedback import (
    Feedback,
    as_cpu_float64,
    close,
    compare_tensors,
    correct,
    run_reader_code,
    wrong,
)

__all__ = ["qkv_inputs", "reference_attention", "check_self_attention", "check_cross_attention"]

# Sizes of the test case: every width differs, so a wrong shape names its mistake.
S_Q, S_K, D, D_K, D_V = 3, 5, 6, 4, 3


def qkv_inputs() -> dict[str, Tensor]:
    """The checkers' fixed test case.

    Returns:
        ``x [S_K, D]`` (also the key/value sequence of the cross-attention check),
        ``x_q [S_Q, D]`` (the query sequence of the cross-attention check),
        ``w_q [D, D_K]``, ``w_k [D, D_K]``, ``w_v [D, D_V]`` with ``S_Q, S_K, D, D_K, D_V = 3, 5, 6, 4, 3``.
    """
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(S_K, D, generator=gen)  # [S_k, D]
    x_q = torch.randn(S_Q, D, generator=gen)  # [S_q, D]
    scale = 1.0 / math.sqrt(D)  # keeps q.k of order sqrt(D_k), so the weights are neither flat nor one-hot
    w_q = torch.randn(D, D_K, generator=gen) * scale  # [D, D_k]
    w_k = torch.randn(D, D_K, generator=gen) * scale  # [D, D_k]
    w_v = torch.randn(D, D_V, generator=gen) * scale  # [D, D_v]
    return {"x": x, "x_q": x_q, "w_q": w_q, "w_k": w_k, "w_v": w_v}


def reference_attention(x_q: Tensor, x_kv: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor) -> tuple[Tensor, Tensor]:
    """``softmax(Q K^T / sqrt(D_k)) V`` with ``Q = x_q w_q``, ``K = x_kv w_k``, ``V = x_kv w_v``.

    Returns:
        ``output [S_q, D_v]`` and ``weights [S_q, S_k]``.
    """
    q = x_q @ w_q  # [S_q, D_k]
    k = x_kv @ w_k  # [S_k, D_k]
    v = x_kv @ w_v  # [S_k, D_v]
    weights = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)  # [S_q, S_k]
    return weights @ v, weights  # [S_q, D_v], [S_q, S_k]



def _unpack(result: Any) -> tuple[tuple[Tensor, Tensor] | None, Feedback | None]:
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return None, wrong(f"return a pair (output, weights), got {type(result).__name__}.")
    output, weights = result
    for name, t in (("output", output), ("weights", weights)):
        if not isinstance(t, Tensor):
            return None, wrong(f"{name} should be a torch.Tensor, got {type(t).__name__}.")
    return (output, weights), None


def _diagnose_weights(got: Tensor, x_q: Tensor, x_kv: Tensor, w_q: Tensor, w_k: Tensor) -> Feedback | None:
    """``None`` when ``got [S_q, S_k]`` are the right weights, else a hint."""
    q = x_q @ w_q  # [S_q, D_k]
    k = x_kv @ w_k  # [S_k, D_k]
    d_k, d = q.shape[-1], x_q.shape[-1]
    S_q, S_k = q.shape[0], k.shape[0]
    raw = q @ k.T  # [S_q, S_k]
    scores = raw / math.sqrt(d_k)  # [S_q, S_k]
    expected = torch.softmax(scores, dim=-1)
    shape = tuple(got.shape)
    if shape != (S_q, S_k):
        if S_q != S_k and shape == (S_k, S_q):
            return wrong(
                f"your weights have shape {shape} = [S_k, S_q]: you computed K @ Q.T. Rows belong to "
                f"queries: Q @ K.T gives [S_q, S_k] = {(S_q, S_k)}."
            )
        if S_q != S_k and shape == (S_q, S_q):
            return wrong(
                f"your weights have shape {shape} = [S_q, S_q]: you took the keys from the query sequence. "
                f"Keys and values come from x_kv, so the weights are [S_q, S_k] = {(S_q, S_k)}."
            )
        if S_q != S_k and shape == (S_k, S_k):
            return wrong(
                f"your weights have shape {shape} = [S_k, S_k]: you took the queries from x_kv. "
                f"Queries come from x_q, so the weights are [S_q, S_k] = {(S_q, S_k)}."
            )
        return wrong(f"your weights have shape {shape}, expected [S_q, S_k] = {(S_q, S_k)}: one row per query, one column per key.")
    if close(got, expected):
        return None
    g = as_cpu_float64(got)
    if close(got, scores) or close(got, raw):
        return wrong("your weights are the raw scores: apply softmax over each row (dim=-1) so that every row sums to 1.")
    row_sums = g.sum(dim=-1)
    worst = int((row_sums - 1).abs().argmax())
    if not torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-4):
        axis = " (your columns sum to 1 instead)" if close(got, torch.softmax(scores, dim=0)) else ""
        return wrong(
            f"your rows sum to {float(row_sums[worst]):.2f} (row {worst}){axis}: did you apply softmax over "
            "the right axis? Normalise over the keys, the last axis (dim=-1)."
        )
    if close(got, torch.softmax(raw, dim=-1)):
        return wrong(
            f"you forgot to divide by sqrt(D_k): your weights are too peaked (largest weight "
            f"{float(g.max()):.2f} instead of {float(expected.max()):.2f})."
        )
    if close(got, torch.softmax(raw / d_k, dim=-1)):
        return wrong(
            f"you divided by D_k = {d_k} instead of sqrt(D_k) = {math.sqrt(d_k):.0f}: your weights are too flat."
        )
    if d != d_k and close(got, torch.softmax(raw / math.sqrt(d), dim=-1)):
        return wrong(
            f"you divided by sqrt(D) with D = {d}, the width of x. The scale uses D_k = {d_k}, the width "
            "of the query and key vectors: divide by sqrt(D_k)."
        )
    if S_q == S_k and close(got, torch.softmax(scores.T, dim=-1)):
        return wrong(
            "your weights are those of K @ Q.T: row i must hold query i's scores against every key, Q @ K.T."
        )
    for plain in (x_q @ x_kv.T, q @ q.T if S_q == S_k else None, k @ k.T if S_q == S_k else None):
        if plain is None:
            continue
        for s in (1.0, math.sqrt(d_k), math.sqrt(d)):
            if close(got, torch.softmax(plain / s, dim=-1)):
                return wrong(
                    "your scores do not compare queries with keys. Project first, Q = x_q @ w_q and "
                    "K = x_kv @ w_k, then score Q @ K.T / sqrt(D_k)."
                )
    return compare_tensors(got, expected, name="your weight matrix")


def _diagnose_output(got: Tensor, weights: Tensor, x_kv: Tensor, w_k: Tensor, w_v: Tensor) -> Feedback | None:
    """``None`` when ``got [S_q, D_v]`` equals ``weights @ V``, else a hint."""
    v = x_kv @ w_v  # [S_k, D_v]
    expected = weights @ v  # [S_q, D_v]
    S_q, S_k = weights.shape
    shape = tuple(got.shape)
    if close(got, expected):
        return None
    if shape == (S_q, S_k):
        return wrong(
            f"your output has shape {shape} = [S_q, S_k], the shape of the weights: did you forget to multiply by V?"
        )
    if close(got, weights @ x_kv):
        return wrong("you mixed the rows of x itself. Mix the values instead: V = x @ w_v, output = weights @ V.")
    if close(got, weights @ (x_kv @ w_k)):
        return wrong("you mixed the keys. Keys are for scoring; the output mixes the values: weights @ V.")
    if S_q == S_k and close(got, weights.T @ v):
        return wrong("you multiplied weights.T @ V. Row i of the output mixes the values with row i of the weights: weights @ V.")
    if close(got, v):
        return wrong("your output equals V: no mixing happened. Multiply by the weights: weights @ V.")
    return compare_tensors(got, expected, name="your output")


def _run_and_diagnose(
    call: Callable[[], object], x_q: Tensor, x_kv: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor
) -> Feedback | None:
    """Run the reader's code and return the first problem found in its (output, weights), or None."""
    result, feedback = run_reader_code(call)
    if feedback is not None:
        return feedback
    pair, feedback = _unpack(result)
    if feedback is not None:
        return feedback
    output, weights = pair
    S_q, S_k = x_q.shape[0], x_kv.shape[0]
    if tuple(output.shape) == (S_q, S_k) and tuple(weights.shape) == (S_q, w_v.shape[1]) and S_q == S_k:
        return wrong("return (output, weights) in that order: your first item has the weights' shape [S, S].")
    feedback = _diagnose_weights(weights, x_q, x_kv, w_q, w_k)
    if feedback is not None:
        return feedback
    _, expected_w = reference_attention(x_q, x_kv, w_q, w_k, w_v)
    return _diagnose_output(output, expected_w, x_kv, w_k, w_v)


def check_self_attention(fn: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> Feedback:
    """Check ``fn(x [S, D], w_q [D, D_k], w_k [D, D_k], w_v [D, D_v]) -> (output [S, D_v], weights [S, S])``."""
    t = qkv_inputs()
    x, w_q, w_k, w_v = t["x"], t["w_q"], t["w_k"], t["w_v"]
    feedback = _run_and_diagnose(lambda: fn(x.clone(), w_q.clone(), w_k.clone(), w_v.clone()), x, x, w_q, w_k, w_v)
    if feedback is not None:
        return feedback
    expected_out, expected_w = reference_attention(x, x, w_q, w_k, w_v)
    return correct(
        f"rows sum to 1, output has shape {tuple(expected_out.shape)} = [S, D_v]; query 0 puts "
        f"{float(expected_w[0].max()):.2f} on its favourite key."
    )


def check_cross_attention(fn: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> Feedback:
    """Check ``fn(x_q [S_q, D], x_kv [S_k, D], w_q, w_k, w_v) -> (output [S_q, D_v], weights [S_q, S_k])``."""
    t = qkv_inputs()
    x_q, x_kv, w_q, w_k, w_v = t["x_q"], t["x"], t["w_q"], t["w_k"], t["w_v"]
    feedback = _run_and_diagnose(
        lambda: fn(x_q.clone(), x_kv.clone(), w_q.clone(), w_k.clone(), w_v.clone()), x_q, x_kv, w_q, w_k, w_v
    )
    if feedback is not None:
        return feedback
    expected_out, expected_w = reference_attention(x_q, x_kv, w_q, w_k, w_v)
    return correct(
        f"{S_Q} queries each spread their attention over {S_K} keys: weights {tuple(expected_w.shape)} = [S_q, S_k], "
        f"output {tuple(expected_out.shape)} = [S_q, D_v]."
    )
