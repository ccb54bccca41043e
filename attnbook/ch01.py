"""Checkers for chapter 1, *Attention at a glance*.

* :func:`check_soft_lookup`: attention as a soft dictionary lookup for one query.
* :func:`check_attention_shapes`: the tensor shapes of the five internal steps.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from .feedback import Feedback, close, compare_tensors, correct, run_reader_code, wrong

__all__ = ["soft_lookup_inputs", "check_soft_lookup", "reference_shapes", "check_attention_shapes"]

SHAPE_KEYS: tuple[str, ...] = ("qkv", "heads", "scores", "weights", "context", "merged", "output")


def soft_lookup_inputs() -> tuple[Tensor, Tensor, Tensor]:
    """The checker's fixed test case: ``query [D]``, ``keys [N, D]``, ``values [N, D]`` (N = 5, D = 4).

    Values have the same width as keys so that "scored against the values" and "mixed the keys"
    are possible (and recognisable) mistakes.
    """
    gen = torch.Generator().manual_seed(3)
    query = torch.randn(4, generator=gen)  # [D]
    keys = torch.randn(5, 4, generator=gen)  # [N, D]
    values = torch.randn(5, 4, generator=gen)  # [N, D]
    return query, keys, values



def check_soft_lookup(fn: Callable[[Tensor, Tensor, Tensor], Tensor]) -> Feedback:
    """Check ``fn(query [D], keys [N, D], values [N, D_v]) -> [D_v]``.

    The right answer is ``softmax(keys @ query) @ values``: score every row by how well its key
    matches the query, turn the scores into weights that sum to 1, return the weighted mix.
    """
    query, keys, values = soft_lookup_inputs()
    result, feedback = run_reader_code(fn, query.clone(), keys.clone(), values.clone())
    if feedback is not None:
        return feedback
    if not isinstance(result, Tensor):
        return wrong(f"return a torch.Tensor of shape [D_v], got {type(result).__name__}.")
    N, D_v = values.shape
    scores = keys @ query  # [N]
    weights = torch.softmax(scores, dim=-1)  # [N]
    expected = weights @ values  # [D_v]
    if close(result, expected):
        return correct(
            f"the query gets weights {[round(w, 2) for w in weights.tolist()]} over the {N} rows "
            "and returns their weighted mix, not one row."
        )
    shape = tuple(result.shape)
    if shape == (N,):
        if close(result, weights) or close(result, scores):
            return wrong(
                f"you returned {N} numbers, one per row: those are the scores or weights. "
                "Finish the lookup by mixing the values with the weights: weights @ values."
            )
        return wrong(f"you returned {N} numbers (one per row), but the lookup returns one mixed value of width {D_v}.")
    if shape == (N, D_v):
        return wrong(
            f"you returned one row per key, shape {shape}: add the weighted rows up into one vector "
            "(weights @ values), so the result has shape [D_v]."
        )
    hard = values[scores.argmax()]
    if close(result, hard):
        return wrong(
            "you returned the single best-matching row (a hard lookup). Attention returns a mix of "
            "all rows, each weighted by softmax of its score."
        )
    if close(result, scores @ values):
        return wrong(
            "you mixed the values with the raw scores. Turn the scores into weights first with "
            "softmax, so that they are positive and sum to 1."
        )
    if close(result, values.mean(dim=0)):
        return wrong(
            "you averaged all rows equally. The weights must depend on how well each key matches "
            "the query: softmax(keys @ query)."
        )
    if close(result, torch.softmax(values @ query, dim=-1) @ values):
        return wrong("you scored the query against the values. The match is measured against the keys: keys @ query.")
    if close(result, weights @ keys):
        return wrong("you mixed the keys. Keys are only for matching; what is handed over is the values: weights @ values.")
    if close(result, torch.softmax(scores / math.sqrt(query.shape[0]), dim=-1) @ values):
        return wrong(
            "you divided the scores by sqrt(D). That is the scaled attention of chapter 2; this "
            "exercise asks for the plain lookup softmax(keys @ query) @ values."
        )
    mismatch = compare_tensors(result, expected, name="your result")
    return mismatch if mismatch is not None else correct()


def reference_shapes(B: int, S: int, D: int, H: int) -> dict[str, tuple[int, ...]]:
    """The shapes of multi-head self-attention's steps for ``[B, S, D]`` input and ``H`` heads."""
    d_k = D // H
    return {
        "qkv": (B, S, D),  # each of Q, K, V after its projection
        "heads": (B, H, S, d_k),  # after split_heads
        "scores": (B, H, S, S),  # q @ k^T / sqrt(D_k)
        "weights": (B, H, S, S),  # softmax over the last axis
        "context": (B, H, S, d_k),  # weights @ v
        "merged": (B, S, D),  # heads concatenated again
        "output": (B, S, D),  # after W_O
    }


def _as_shape(value: Any) -> tuple[int, ...] | None:
    try:
        return tuple(int(n) for n in value)
    except (TypeError, ValueError):
        return None


def _shape_hint(step: str, got: tuple[int, ...], B: int, S: int, D: int, H: int) -> str:
    d_k = D // H
    if step == "heads" and got == (B, S, H, d_k):
        return (
            f"'heads' is {got} = [B, S, H, D_k]: that is the shape after view, before transpose(1, 2). "
            "The head axis goes in front of the sequence axis: [B, H, S, D_k]."
        )
    if step in ("heads", "context") and got == (B, H, S, D):
        return f"'{step}' is {got}: each head works on D_k = D / H = {D} / {H} = {d_k} features, not all D."
    if step in ("scores", "weights") and got == (B, H, S, d_k):
        return (
            f"'{step}' is {got}: the scores compare every query position with every key position, "
            "so the last two axes are both S: [B, H, S, S]."
        )
    if step in ("scores", "weights") and got == (B, S, S):
        return f"'{step}' is {got}: every head has its own scores, so keep the head axis: [B, H, S, S]."
    if step == "context" and got == (B, H, S, S):
        return f"'context' is {got}: it is weights @ V, [S, S] @ [S, D_k], so its last axis is D_k: [B, H, S, D_k]."
    if step == "merged" and got in ((B, H, S, d_k), (B, S, H, d_k)):
        return f"'merged' is {got}: merging concatenates the {H} heads' D_k features back into one axis of width D: [B, S, D]."
    if step in ("qkv", "output") and got == (B, H, S, d_k):
        return f"'{step}' is {got}: the projections act on whole [B, S, D] tensors; heads exist only between split and merge."
    return f"'{step}' is {got}; for B={B}, S={S}, D={D}, H={H} it should be {reference_shapes(B, S, D, H)[step]}."


def check_attention_shapes(fn: Callable[[int, int, int, int], dict[str, Any]]) -> Feedback:
    """Check ``fn(B, S, D, H) -> {step: shape}`` for the steps in :data:`SHAPE_KEYS`.

    Tried on two configurations so that no shape is right by coincidence.
    """
    for B, S, D, H in ((2, 5, 12, 3), (1, 8, 512, 8)):
        result, feedback = run_reader_code(fn, B, S, D, H)
        if feedback is not None:
            return feedback
        if not isinstance(result, dict):
            return wrong(f"return a dict mapping each step name to a shape, got {type(result).__name__}.")
        missing = [k for k in SHAPE_KEYS if k not in result]
        if missing:
            return wrong(f"your dict lacks the steps {missing}; it needs all of {list(SHAPE_KEYS)}.")
        expected = reference_shapes(B, S, D, H)
        for step in SHAPE_KEYS:
            got = _as_shape(result[step])
            if got is None:
                return wrong(f"'{step}' should be a tuple of ints such as (2, 5, 12), got {result[step]!r}.")
            if got != expected[step]:
                return wrong(_shape_hint(step, got, B, S, D, H))
    return correct("every shape matches, for B=2, S=5, D=12, H=3 and for B=1, S=8, D=512, H=8.")

