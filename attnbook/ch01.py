"""Chapter 1, *Attention at a glance*: checkers, the reach experiment and the layer diagram.

* :func:`check_soft_lookup`: attention as a soft dictionary lookup for one query.
* :func:`check_attention_shapes`: the shapes of single-head attention when ``D_k`` and ``D_v``
  differ from ``D``.
* :func:`layers_until_linked`: how many stacked convolutions link two positions (autograd).
* :func:`encoder_layer_figure`: one encoder layer of the original Transformer.

Each exercise keeps its known mistakes in one table (``SOFT_LOOKUP_MISTAKES``,
``SHAPE_MISTAKES``); the checker tries them in order and ``tests/test_ch01.py`` iterates over the
same tables.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor, nn

from .diagrams import MUTED, Diagram, diagram
from .feedback import (
    HALF_TOL,
    Feedback,
    Mistake,
    MistakeTable,
    as_cpu_float64,
    as_index,
    close,
    compare_tensors,
    computed_narrower,
    correct,
    describe,
    diagnose,
    exercise,
    low_precision,
    run_reader_code,
    todo,
    wrong,
)

__all__ = [
    "soft_lookup_inputs", "check_soft_lookup", "SOFT_LOOKUP_MISTAKES", "SOFT_LOOKUP_CASES",
    "reference_shapes", "check_attention_shapes", "SHAPE_KEYS", "SHAPE_MISTAKES", "SHAPE_CONFIGS",
    "unfilled_rows", "layers_until_linked", "check_reach", "REACH_SRC", "REACH_DST", "sinusoidal_code", "position_code_figure", "reach_answer", "REACH_MISTAKES", "encoder_layer_figure", "residual_gradient_norms",
    "MINILM_ARE", "are_row_from_model", "HEAD_B", "HEAD_D", "draw_head_path", "one_head_diagram",
    "TOY_QUERY", "TOY_KEYS", "soft_lookup_diagram", "lost_precision", "rounded_like_half", "not_finite", "reach_rows", "reach_diagram",
    "rope", "MHA_B", "MHA_D", "MHA_H", "layout_diagram", "SHUFFLE_TOKENS", "SHUFFLE", "equivariance_diagram", "GROWTH_S", "weights_growth_diagram",
]


# ---------------------------------------------------------------- soft lookup


#: The soft-lookup checker's cases ``(M, N, D, D_v, dtype)``: ``M`` queries, ``N`` keys of width ``D``,
#: values of width ``D_v``. The first has ``D_v = D`` so that "scored against the values" and "mixed
#: the keys" are possible (and recognisable) mistakes, and ``D = 7`` so that sqrt(D) is no small
#: integer (dividing by 2 is not dividing by sqrt(D)); the second differs in every size, has
#: ``D_v != D`` and is float64, so a hard-coded size, a loop that starts from ``zeros_like(queries)``
#: or a float32 constant cannot pass. ``M`` differs from every other size, so a transposed answer
#: shows in its shape.
SOFT_LOOKUP_CASES: tuple[tuple[int, int, int, int, torch.dtype], ...] = (
    (3, 5, 7, 7, torch.float32), (4, 6, 5, 3, torch.float64))


def soft_lookup_inputs(M: int = 3, N: int = 5, D: int = 7, D_v: int | None = None,
                       dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor, Tensor]:
    """A fixed test case: ``queries [M, D]``, ``keys [N, D]``, ``values [N, D_v]`` (``D_v = D`` by default).

    ``N = D`` gives the square probe that lets a product without the transpose run.
    """
    D_v = D if D_v is None else D_v
    gen = torch.Generator().manual_seed(6 if (M, N, D, D_v) == (3, 5, 7, 7) else 10000 * M + 1000 * N + 10 * D + D_v)
    queries = (0.5 * torch.randn(M, D, generator=gen, dtype=torch.float64)).to(dtype)  # [M, D]: weights neither flat nor one-hot
    keys = torch.randn(N, D, generator=gen, dtype=torch.float64).to(dtype)  # [N, D]
    values = torch.randn(N, D_v, generator=gen, dtype=torch.float64).to(dtype)  # [N, D_v]
    return queries, keys, values


def _s(q: Tensor, k: Tensor) -> Tensor:
    return q @ k.T  # [M, N]: one score per query and key


def _w(q: Tensor, k: Tensor) -> Tensor:
    return torch.softmax(_s(q, k), dim=-1)  # [M, N], rows sum to 1


def _lookup(queries: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    return _w(queries, keys) @ values  # [M, N] @ [N, D_v] -> [M, D_v]


def _row_normalised(e: Tensor) -> Tensor:
    return e / e.sum(dim=-1, keepdim=True)  # each row divided by its own sum


def _cosine(q: Tensor, k: Tensor) -> Tensor:
    return _s(q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True))  # [M, N], in [-1, 1]


def _sqrt_count(n: int, keys: int = 0) -> float:
    """sqrt(n) for the "divided by sqrt(M)" mistake; on a case where it is 2 (M = 4) that mistake is the
    fixed temperature 2, and where M = N (the keepdim probe) the sqrt(N) one, so it does not apply there (the
    first case, M = 3, tells them apart)."""
    if n == 4:
        raise ValueError("sqrt(M) = 2 here: the fixed-temperature mistake")
    if n == keys:
        raise ValueError("M = N here: the sqrt(N) mistake")
    return math.sqrt(n)


def _sqrt_keys(k: Tensor) -> float:
    """sqrt(N) for the "divided by sqrt(N)" mistake; where N = D (the square probe) it is the sqrt(D) one."""
    if k.shape[0] == k.shape[1]:
        raise ValueError("N = D here: the sqrt(D) mistake")
    return math.sqrt(k.shape[0])


def _sum_without_keepdim(q: Tensor, k: Tensor) -> Tensor:
    """``e / e.sum(dim=-1)``: the row sums lost their axis; it runs only where M = N (the second probe)."""
    e = torch.exp(_s(q, k))  # [M, N]
    return e / e.sum(dim=-1)  # [M, N] / [M]: the sums lined up with the keys' axis


_EXP_WITHOUT_SUM = (
    "you took exp of the scores but did not divide by their sum, so each query's 'weights' are positive but "
    "do not add up to 1 (the mix is scaled up or down). softmax is exp(s) divided by the row's total: "
    "exp(s) / exp(s).sum(dim=-1, keepdim=True), which is what torch.softmax(s, dim=-1) computes.")

#: Known wrong answers of the soft-lookup exercise, tried in this order.
SOFT_LOOKUP_MISTAKES: tuple[Mistake, ...] = (
    Mistake("hard lookup", lambda q, k, v: v[_s(q, k).argmax(dim=-1)],
            "you returned, for each query, the single best-matching row (a hard lookup). Attention returns a "
            "mix of all rows, each weighted by softmax of its score."),
    Mistake("raw scores as weights", lambda q, k, v: _s(q, k) @ v,
            "you mixed the values with the raw scores. Turn the scores into weights first with softmax, so "
            "that they are positive and each query's weights sum to 1."),
    Mistake("normalised without exp", lambda q, k, v: (_s(q, k) / _s(q, k).sum(dim=-1, keepdim=True)) @ v,
            "you divided the scores by their sum without exponentiating them first. Those 'weights' sum to 1 "
            "but can be negative or huge (a score sum near 0 blows them up). softmax takes exp first: "
            "exp(s) / exp(s).sum()."),
    Mistake("exp without the sum", lambda q, k, v: torch.exp(_s(q, k)) @ v, _EXP_WITHOUT_SUM),
    Mistake("exp(s - max) without the sum",
            lambda q, k, v: torch.exp(_s(q, k) - _s(q, k).max(dim=-1, keepdim=True).values) @ v, _EXP_WITHOUT_SUM),
    Mistake("equal average", lambda q, k, v: v.mean(dim=0).expand(q.shape[0], -1),
            "you averaged all rows equally. The weights must depend on how well each key matches the query, "
            "through its score."),
    Mistake("softmax over the queries", lambda q, k, v: torch.softmax(_s(q, k), dim=0) @ v,
            "your weights are normalised over the queries, so each key's column sums to 1 (softmax with dim=0 on "
            "queries @ keys.T, [M, N], or with dim=-1 on keys @ queries.T, [N, M], which has one row per key). Each "
            "query spreads its own attention over the keys: normalise along the keys' axis, so that each query's "
            "weights sum to 1."),
    Mistake("scored the values", lambda q, k, v: torch.softmax(q @ v.T, dim=-1) @ v,
            "you scored the queries against the values. The match is measured against the keys: queries @ keys.T."),
    Mistake("mixed the keys", lambda q, k, v: _w(q, k) @ k,
            "you mixed the keys. Keys are only for matching; what is handed over is the values: weights @ values."),
    Mistake("divided by sqrt(D)", lambda q, k, v: torch.softmax(_s(q, k) / math.sqrt(q.shape[1]), dim=-1) @ v,
            "you divided the scores by sqrt(D). This exercise leaves that scaling out (chapter 3 explains it); "
            "it asks for the plain lookup, with the dot products themselves as scores."),
    Mistake("divided by D", lambda q, k, v: torch.softmax(_s(q, k) / q.shape[1], dim=-1) @ v,
            "you divided the scores by D. This exercise asks for the plain lookup, with no scaling."),
    Mistake("divided by sqrt(N)", lambda q, k, v: torch.softmax(_s(q, k) / _sqrt_keys(k), dim=-1) @ v,
            "you divided the scores by the square root of N, the number of keys (keys.shape[0]). This exercise "
            "leaves any scaling out; the one chapter 3 explains uses the width sqrt(D_k), shape[1], not the count "
            "of rows."),
    Mistake("divided by sqrt(M)", lambda q, k, v: torch.softmax(_s(q, k) / _sqrt_count(q.shape[0], k.shape[0]), dim=-1) @ v,
            "you divided the scores by the square root of M, the number of queries (queries.shape[0]). This "
            "exercise leaves any scaling out; the one chapter 3 explains uses the width sqrt(D_k), shape[1], not "
            "a count of rows."),
    Mistake("fixed temperature", lambda q, k, v: torch.softmax(_s(q, k) / 2, dim=-1) @ v,
            "you divided the scores by 2 (a fixed temperature). This exercise asks for the plain lookup, with no "
            "scaling; chapter 3 is about temperatures."),
    Mistake("sigmoid", lambda q, k, v: torch.sigmoid(_s(q, k)) @ v,
            "you used sigmoid: it squashes each score on its own, so the weights do not sum to 1. softmax "
            "normalises them together: exp(s) / exp(s).sum()."),
    Mistake("log_softmax", lambda q, k, v: torch.log_softmax(_s(q, k), dim=-1) @ v,
            "you used log_softmax, the logarithm of the weights (all negative). Use softmax itself."),
    Mistake("weighted rows averaged", lambda q, k, v: (_w(q, k)[..., None] * v).mean(dim=1),
            "you averaged the weighted rows (.mean): the weights already sum to 1, so add the weighted rows "
            "up (.sum, or weights @ values)."),
    Mistake("returned the weights", lambda q, k, v: _w(q, k),
            "you returned the weights, one number per query and row. Finish the lookup by mixing the values "
            "with them: weights @ values."),
    Mistake("returned the scores", lambda q, k, v: _s(q, k),
            "you returned the scores, one number per query and row: the lookup does not stop there. Turn them "
            "into weights, then mix the values with them."),
    Mistake("weighted rows not summed", lambda q, k, v: _w(q, k)[..., None] * v,
            "you returned one weighted row per query and key, shape [M, N, D_v]: add them up over the keys "
            "(weights @ values), so the result has shape [M, D_v]."),
    Mistake("weighted rows summed over the queries", lambda q, k, v: (_w(q, k)[..., None] * v).sum(dim=0),
            "you summed the weighted rows over the queries (dim=0), which gives one row per key, [N, D_v]. Add "
            "them up over the keys, the axis of size N (or use weights @ values), so that each query gets its own "
            "mix, [M, D_v]."),
    Mistake("last key dropped", lambda q, k, v: torch.softmax(q @ k[:-1].T, dim=-1) @ v[:-1],
            "you left out the last key and value (a range or slice that stops one early, such as keys[:-1] or "
            "range(N - 1)): every one of the N rows takes part."),
    Mistake("first key dropped", lambda q, k, v: torch.softmax(q @ k[1:].T, dim=-1) @ v[1:],
            "you left out the first key and value (a range or slice that starts at 1, such as keys[1:] or "
            "range(1, N)): Python counts from 0, and every one of the N rows takes part."),
    Mistake("softmax over the whole matrix", lambda q, k, v: (torch.exp(_s(q, k)) / torch.exp(_s(q, k)).sum()) @ v,
            "your weights sum to 1 over the whole [M, N] matrix, so each query's row sums to less than 1: the sum "
            "in exp(s) / exp(s).sum() ran over every entry. Each query normalises its own row of scores, over the "
            "keys (the last axis)."),
    Mistake("max per column", lambda q, k, v: _row_normalised(torch.exp(_s(q, k) - _s(q, k).max(dim=0).values)) @ v,
            "you subtracted each key's largest score (the maximum over a column, dim=0) before exp. Subtracting a "
            "number leaves softmax unchanged only when the whole row of one query gets the same number: take the "
            "maximum over the keys, per query (the last axis, with keepdim=True)."),
    Mistake("cosine similarity", lambda q, k, v: torch.softmax(_cosine(q, k), dim=-1) @ v,
            "you scored with the cosine similarity (the vectors normalised to length 1 first). The lookup scores with "
            "the plain dot product, so a longer query or key gives larger scores and sharper weights."),
    Mistake("multiplied by sqrt(D)", lambda q, k, v: torch.softmax(_s(q, k) * math.sqrt(q.shape[1]), dim=-1) @ v,
            "you multiplied the scores by sqrt(D). This exercise leaves any scaling out (chapter 3 explains the "
            "division by sqrt(D_k)): use the plain dot products as scores."),
    Mistake("one query's mix for all", lambda q, k, v: (_w(q[:1], k) @ v).expand(q.shape[0], -1),
            "every row of your result is the same: the mix of the first query, repeated. Each query has its own "
            "scores and weights, so each row of the result is its own mix of the values."),
    Mistake("mixed values.T", lambda q, k, v: _w(q, k) @ v.T,
            "you multiplied the weights by values.T. values is already [N, D_v], one row per key in the same order "
            "as the columns of the weights, so weights [M, N] @ values [N, D_v] = [M, D_v] needs no transpose "
            "(weights @ values.T only runs when N == D_v, and then mixes the wrong numbers; your code raised an "
            "error when N != D_v)."),
    Mistake("softmax sum without keepdim", lambda q, k, v: _sum_without_keepdim(q, k) @ v,
            "your hand-written softmax divides by exp(s).sum(dim=-1), which drops the summed axis: the M row sums, "
            "shape [M], are then lined up with the keys' axis, so each column is divided by another query's sum (and "
            "with M != N the division raised an error). Keep the axis, exp(s).sum(dim=-1, keepdim=True), shape "
            "[M, 1], or use torch.softmax(s, dim=-1)."),
    Mistake("queries @ keys", lambda q, k, v: torch.softmax(q @ k, dim=-1) @ v,
            "queries @ keys only runs when N == D: keys is [N, D] with one row per entry, so compare the "
            "queries with keys.T, [M, D] @ [D, N] = [M, N] (your code raised an error when N != D)."),
)


def rounded_like_half(got: Any, expected: Tensor, *, name: str = "your result") -> Feedback | None:
    """The hint for a result in the inputs' dtype that is right only to half precision (``HALF_TOL``):
    part of the computation ran in float16/bfloat16 and was cast back. ``None`` otherwise."""
    if not isinstance(got, Tensor) or got.dtype in (torch.float16, torch.bfloat16) or got.shape != expected.shape:
        return None
    if close(got, expected) or not close(got, expected, atol=HALF_TOL, rtol=HALF_TOL):
        return None
    worst = float((as_cpu_float64(got) - as_cpu_float64(expected)).abs().max())
    return wrong(f"{name} is right only to about 3 significant digits (largest difference {worst:.2g}): did part of "
                 "the computation run in float16 or bfloat16 (.half(), .bfloat16(), autocast) before a cast back? "
                 f"Keep the inputs' dtype ({expected.dtype}) throughout.")


def not_finite(got: Any, *, name: str = "your result") -> Feedback | None:
    """The hint for a result that holds inf or NaN (a division by zero, or an overflow); ``None`` otherwise."""
    if isinstance(got, Tensor) and got.is_floating_point() and not bool(torch.isfinite(got).all()):
        return wrong(f"{name} contains inf or NaN: something divided by zero or overflowed (a sum of weights "
                     "that can be 0, or exp of a large number). softmax gives weights that are positive and finite.")
    return None


def lost_precision(got: Any, expected: Tensor, *, name: str = "your result",
                   input_name: str = "the input") -> Feedback | None:
    """The hint for a result in a narrower dtype than the inputs: float16/bfloat16 (when it is right to
    that precision) or float32 from float64 inputs (always: a cast inside the function loses digits, and so does
    a buffer made without ``dtype=``). ``input_name`` is the argument the hint tells the reader to take the dtype
    from (``queries``)."""
    half = low_precision(got, expected, name=name)
    if half is not None:
        return half
    if isinstance(got, Tensor) and got.dtype == torch.float32 and expected.dtype == torch.float64:
        source = f"{input_name}.dtype" if input_name.isidentifier() else f"{input_name}'s dtype"
        return wrong(f"{name} is torch.float32 but the inputs are torch.float64: keep the inputs' dtype. A .float() "
                     "or .to(torch.float32) narrows it, and so does a tensor made without dtype=: torch.zeros(...), "
                     "torch.empty(...) and torch.tensor(...) are float32 by default, so a buffer your loop fills, or "
                     f"a tensor built from Python numbers, holds only 7 digits; pass dtype={source}.")
    return None


_SQRT_D = next(m for m in SOFT_LOOKUP_MISTAKES if m.name == "divided by sqrt(D)")


def _sqrt_d_v(fn: Callable[..., Any]) -> Feedback | None:
    """On the second case (D_v != D): the hint for scores divided by sqrt(D_v), if that is what ``fn`` does."""
    q, k, v = soft_lookup_inputs(*SOFT_LOOKUP_CASES[1])
    result, feedback = run_reader_code(fn, q.clone(), k.clone(), v.clone())
    if feedback is None and close(result, torch.softmax(_s(q, k) / math.sqrt(v.shape[1]), dim=-1) @ v):
        return wrong("you divided the scores by sqrt(D_v), the square root of the values' width. This exercise "
                     "leaves any scaling out (chapter 3 explains the one by sqrt(D_k)).")
    return None


def _float32_scores(result: Tensor, q: Tensor, k: Tensor, v: Tensor) -> Feedback | None:
    """The hint for float64 inputs whose scores were built as a float32 tensor (``torch.tensor([[float(qi @ kj) ...]])``:
    torch.tensor of Python floats is float32) and whose mix with the values then ran in float64 again (``weights[..., None]
    * values`` promotes, or ``weights.to(values.dtype) @ values``). ``None`` when that is not what happened."""
    s32 = _s(q, k).float()  # [M, N], rounded to float32
    variants = (torch.softmax(s32.double(), dim=-1) @ v, torch.softmax(s32, dim=-1).double() @ v)
    if not any(close(result, r, atol=1e-13, rtol=1e-11) for r in variants):
        return None
    return wrong("your scores are float32 though the inputs are torch.float64: torch.tensor(...) of Python floats "
                 "(float(q_i @ k_j) for each pair) makes a float32 tensor, its default dtype, so every score keeps only "
                 "7 significant digits, and the mix with the values cannot bring them back. Compute in the inputs' "
                 "dtype or wider; don't narrow it: build the scores with tensor operations (a matrix product), or pass "
                 "dtype=queries.dtype to torch.tensor.")


_SKIPPED_QUERY = (", while other rows hold a mix. Your loop over the queries stops early or starts late (range(M - 1), "
                  "range(1, M)): query {row} of the M = {M} queries was skipped, and every query needs its own row.")
_SKIPPED_ROW = (". Your loop over the queries stops early (or starts late): run it over every row, or drop it.")


def unfilled_rows(t: Tensor, *, name: str = "your weights", tail: str = _SKIPPED_ROW,
                  partial: bool = False) -> Feedback | None:
    """The hint for a result of which whole rows (last axis) are exactly 0, as in the zeros buffer a loop writes
    into: a query's row, or a whole sequence of a ``[B, S, S]`` batch, that the loop never reached. ``None`` when
    every row holds something (and, with ``partial``, also when every row is 0: nothing was filled at all).

    ``tail`` follows "row {row} of {name} was never filled: it is all 0, as in the zeros you started from" and
    may use ``{row}`` and ``{M}`` (the number of rows). Chapter 1's soft lookup and chapter 2's weights share it.
    """
    w = as_cpu_float64(t)
    empty = (w == 0).all(dim=-1)  # [B, S] or [M]: rows never written
    if not bool(empty.any()) or (partial and bool(empty.all())):
        return None
    if w.dim() == 3:
        whole = [b for b in range(w.shape[0]) if bool(empty[b].all())]
        if whole:
            return wrong(f"sequence {whole[0]} of the batch was never filled: its weights are all 0, as in the zeros "
                         f"you started from, while {'the other sequences hold' if w.shape[0] > 2 else 'the other holds'} "
                         "weights. Your batch loop stops early (or starts late): range(B) runs over every sequence, "
                         "B = x.shape[0]; or drop the loop, since the matrix products work on the whole batch at once.")
        b, row = divmod(int(empty.flatten().nonzero()[0]), w.shape[1])
        return wrong(f"row {row} of sequence {b} was never filled: its weights are all 0, as in the zeros you started "
                     "from. Your loop over the queries stops early (or starts late): run it over every row, or drop it.")
    row = int(empty.nonzero()[0])
    return wrong(f"row {row} of {name} was never filled: it is all 0, as in the zeros you started from"
                 + tail.format(row=row, M=w.shape[0]))


def _soft_lookup_cases() -> list[tuple[Tensor, Tensor, Tensor]]:
    return [soft_lookup_inputs(*c) for c in SOFT_LOOKUP_CASES] + list(_probes())


def _probes() -> tuple[tuple[Tensor, Tensor, Tensor], ...]:
    """Where a slip that raises on the checker's cases runs: ``N = D`` (a product without the transpose, or with
    values.T) and ``M = N`` (row sums without keepdim)."""
    return soft_lookup_inputs(3, 7, 7), soft_lookup_inputs(5, 5, 6)


def _lookup_one(fn: Callable[..., Any], inputs: tuple[Tensor, Tensor, Tensor],
                probes: tuple[tuple[Tensor, Tensor, Tensor], ...]) -> Feedback | None:
    """``None`` when ``fn`` is right on ``inputs``, else the feedback (a known mistake's hint when it is one)."""
    result, feedback = run_reader_code(fn, *(t.clone() for t in inputs))
    if feedback is not None:
        if feedback.status == "wrong" and feedback.message.startswith("your code raised"):  # maybe a slip that runs on a probe
            for probe in probes:
                result2, feedback2 = run_reader_code(fn, *(t.clone() for t in probe))
                hint = diagnose(result2, SOFT_LOOKUP_MISTAKES, *probe) if feedback2 is None else None
                if hint is not None:
                    return hint
        return feedback
    if not isinstance(result, Tensor):
        return wrong(f"return a torch.Tensor of shape [M, D_v], got {describe(result)}.")
    expected = _lookup(*inputs)
    lost = lost_precision(result, expected, input_name="queries")
    if lost is not None:
        return lost
    if inputs[0].dtype == torch.float64:  # the dtype rule: float32 inside, cast back, is refused even where it fits ATOL
        scores32 = _float32_scores(result, *inputs)
        if scores32 is not None:
            return scores32
        narrower = computed_narrower(result, expected, _lookup(*(t.float() for t in inputs)).double())
        if narrower is not None:
            return narrower
    if close(result, expected):
        return None
    hint = diagnose(result, SOFT_LOOKUP_MISTAKES, *inputs) or rounded_like_half(result, expected) or not_finite(result)
    if hint is not None:
        return hint
    if result.shape == expected.shape and result.dim() == 2:
        unfilled = unfilled_rows(result, name="your result", tail=_SKIPPED_QUERY, partial=True)
        if unfilled is not None:
            return unfilled
    N, D_v = inputs[2].shape
    M, D = inputs[0].shape
    if tuple(result.shape) == (D_v, M):
        return wrong(f"your result is [D_v, M] = {tuple(result.shape)}: return one row per query, [M, D_v].")
    if tuple(result.shape) == (M, D) and D != D_v:
        return wrong(f"your result has the queries' width D = {D}, but here the values are D_v = {D_v} wide: the "
                     "output mixes the values, so it has width D_v (a loop that starts from torch.zeros_like(queries) "
                     "only works while D_v = D; start from torch.zeros(M, values.shape[1], dtype=values.dtype) or use weights @ values).")
    if result.dim() == 1:
        return wrong(f"you returned one vector of {result.shape[0]} numbers, but there are M = {M} queries: "
                     f"return one mixed value per query, [M, D_v] = ({M}, {D_v}).")
    return compare_tensors(result, expected, name="your result")


@exercise(solution=lambda q, k, v: torch.softmax(q @ k.T, dim=-1) @ v,
          tables=(MistakeTable(SOFT_LOOKUP_MISTAKES, _soft_lookup_cases, _lookup),))
def check_soft_lookup(fn: Callable[[Tensor, Tensor, Tensor], Tensor]) -> Feedback:
    """Check ``fn(queries [M, D], keys [N, D], values [N, D_v]) -> [M, D_v]``.

    The right answer is ``softmax(queries @ keys.T, dim=-1) @ values``. It is tried on every case of
    :data:`SOFT_LOOKUP_CASES`. When the reader's code raises, it is tried once more on a square
    case (``N = D``), where a product without the transpose runs and can be recognised.
    """
    probes = _probes()
    for c, case in enumerate(SOFT_LOOKUP_CASES):
        problem = _lookup_one(fn, soft_lookup_inputs(*case), probes)
        if problem is not None and c == 0 and problem.message == _SQRT_D.hint:
            hint = _sqrt_d_v(fn)  # the first case has D_v = D: which square root was it?
            if hint is not None:
                return hint
        if problem is not None and c > 0 and problem.message.startswith("your code raised"):
            M, N, D, D_v, _ = case
            return wrong(f"right when the values are as wide as the keys, but with M = {M}, N = {N}, D = {D} and "
                         f"D_v = {D_v} {problem.message}. The output has the values' width D_v: a loop that starts "
                         "from torch.zeros_like(queries) only works while D_v = D (start from "
                         "torch.zeros(M, values.shape[1], dtype=values.dtype), or use weights @ values).")
        if problem is not None:
            return problem
    queries, keys, _ = soft_lookup_inputs(*SOFT_LOOKUP_CASES[0])
    weights = _w(queries, keys)[0]
    return correct(
        f"query 0 gets weights {[round(w, 2) for w in weights.tolist()]} over the {len(weights)} rows, and every "
        "query returns its own weighted mix, not one row (also right when D_v differs from D)."
    )


# ---------------------------------------------------------------- shapes of single-head attention

SHAPE_KEYS: tuple[str, ...] = ("q", "k", "v", "scores", "weights", "context", "output")
#: The configurations the shape checker tries, ``(B, S, D, D_k, D_v)``: every size differs, from the other
#: configuration's too, and no size is another's +-1, so that a slip by one (a token left out of its own row,
#: ``S - 1``) cannot land on another size's shape.
SHAPE_CONFIGS: tuple[tuple[int, int, int, int, int], ...] = ((3, 7, 12, 5, 9), (4, 9, 14, 6, 12))


def reference_shapes(B: int, S: int, D: int, D_k: int, D_v: int) -> dict[str, tuple[int, ...]]:
    """Shapes of single-head self-attention on ``[B, S, D]`` with ``W^Q, W^K: D -> D_k``,
    ``W^V: D -> D_v`` and ``W^O: D_v -> D``."""
    return {
        "q": (B, S, D_k), "k": (B, S, D_k), "v": (B, S, D_v),
        "scores": (B, S, S),  # q @ k^T / sqrt(D_k)
        "weights": (B, S, S),  # softmax over the last axis
        "context": (B, S, D_v),  # weights @ v
        "output": (B, S, D),  # context @ W^O, back to the model width
    }


def _with(**changes: str) -> Callable[..., dict[str, tuple[int, ...]]]:
    """A wrong answer: the reference shapes with some steps replaced, written with axis names."""

    def shapes(B: int, S: int, D: int, D_k: int, D_v: int) -> dict[str, tuple[int, ...]]:
        env = {"B": B, "S": S, "D": D, "D_k": D_k, "D_v": D_v, "1": 1, "S-1": S - 1}
        out = reference_shapes(B, S, D, D_k, D_v)
        out.update({step: tuple(env[a] for a in axes.split()) for step, axes in changes.items()})
        return out

    return shapes


_ONE_HEAD = ("'{step}' has an axis of size 1 for the heads: this exercise has a single head, and a head axis appears "
             "only when there are several (chapter 5).")

#: Known wrong answers of the shape exercise. Each hint may use {B}, {S}, {D}, {D_k}, {D_v}, and {step}:
#: the step the reader got wrong (a hint that names its step this way fits a mistake in either of the
#: steps it changes, such as the weights alone when the scores were right).
SHAPE_MISTAKES: tuple[Mistake, ...] = (
    Mistake("sequence first", _with(q="S B D_k", k="S B D_k", v="S B D_v", scores="S B S", weights="S B S",
                                    context="S B D_v", output="S B D"),
            "your shapes are sequence first, [S, B, ...]: the input here is batch first, [B, S, D], and every step "
            "keeps the batch axis where the input has it (the layout section 1.10 warns about)."),
    Mistake("no batch anywhere", _with(q="S D_k", k="S D_k", v="S D_v", scores="S S", weights="S S",
                                       context="S D_v", output="S D"),
            "none of your shapes has the batch axis: the input is [B, S, D] with B = {B} sequences, and every step "
            "works on all of them at once, so every shape keeps the axis B where the input has it."),
    Mistake("q keeps the model width", _with(q="B S D", k="B S D"),
            "'{step}' still has the model width D = {D}: W^Q and W^K change each token's width, so look at what "
            "the exercise says they map D to."),
    Mistake("v has width D_k", _with(v="B S D_k", context="B S D_k"),
            "'v' has the width D_k = {D_k} of the queries and keys: values have a width of their own, set by W^V. "
            "Only queries and keys must share a width, because only they are multiplied together."),
    Mistake("k of width D_v", _with(k="B S D_v"),
            "'k' has the values' width D_v = {D_v}: queries and keys are dotted together, so 'k' needs the same "
            "width as 'q'."),
    Mistake("D_k and D_v swapped", _with(q="B S D_v", k="B S D_v", v="B S D_k", context="B S D_k"),
            "you swapped D_k and D_v: check which of the two widths the exercise gives W^Q and W^K (whose "
            "outputs are dotted together), and which it gives W^V."),
    Mistake("q, k, v without the batch", _with(q="S D_k", k="S D_k", v="S D_v"),
            "'{step}' has lost the batch axis (B = {B}): the projections act on every token of every sequence, "
            "so each sequence keeps its own rows in 'q', 'k' and 'v'."),
    Mistake("features before positions", _with(q="B D_k S", k="B D_k S", v="B D_v S", context="B D_v S",
                                               output="B D S"),
            "'{step}' puts the features before the positions: you swapped the token axis and the width axis. "
            "Every step here keeps the input's order, [B, S, D]: one row per token, the width last."),
    Mistake("v written as V^T", _with(v="B D_v S"),
            "your 'v' has its last two axes the wrong way round, width before positions: like 'q' and 'k' it "
            "holds one row per token, and nothing in attention transposes V."),
    Mistake("k written as K^T", _with(k="B D_k S"),
            "your 'k' is the transpose K^T, width before positions. That transpose appears only inside the score "
            "product, q @ k.transpose(-2, -1); 'k' itself holds one row per token, like 'q'."),
    Mistake("a head axis of size 1", _with(q="B 1 S D_k", k="B 1 S D_k", v="B 1 S D_v", scores="B 1 S S",
                                           weights="B 1 S S", context="B 1 S D_v"),
            _ONE_HEAD),
    Mistake("a head axis after the positions", _with(q="B S 1 D_k", k="B S 1 D_k", v="B S 1 D_v",
                                                     context="B S 1 D_v"),
            "'{step}' has an axis of size 1 for the heads after the positions, the layout of several heads before "
            "they are moved forward (chapter 6): this exercise has a single head, so there is no head axis at all."),
    Mistake("the projection matrices", _with(q="D D_k", k="D D_k", v="D D_v"),
            "'{step}' is the shape of a weight matrix (W^Q, W^K or W^V), not of what it produces: apply the map "
            "to the input [B, S, D], token by token, and write the shape of the result."),
    Mistake("nn.Linear's weight", _with(q="D_k D", k="D_k D", v="D_v D"),
            "'{step}' is the shape of nn.Linear's .weight (stored as [out, in]), the map itself, not what it "
            "produces: apply the map to the input [B, S, D], token by token, and write the shape of the result."),
    Mistake("context keeps the model width", _with(context="B S D"),
            "'context' has the model width D = {D}, but it is weights @ v: look at the width of 'v'. Only W^O "
            "brings the result back to D (in the chapter's module D_v happened to equal D)."),
    Mistake("v keeps the model width", _with(v="B S D", context="B S D"),
            "'v' still has the model width D = {D}: W^V changes each token's width (look at what the exercise says "
            "it maps D to), and 'context' inherits the width of 'v'. Only W^O maps back to D."),
    Mistake("v alone keeps the model width", _with(v="B S D"),
            "'v' still has the model width D = {D}: W^V changes each token's width; look at what the exercise "
            "says it maps D to."),
    Mistake("scores with a head axis", _with(scores="B 1 S S", weights="B 1 S S"),
            _ONE_HEAD),
    Mistake("scores leave out the token itself", _with(scores="B S S-1", weights="B S S-1"),
            "'{step}' has one column fewer than the sequence has tokens, as if a token did not attend to itself: "
            "every query is compared with every key, its own included."),
    Mistake("scores like q", _with(scores="B S D_k", weights="B S D_k"),
            "'{step}' has the shape of 'q', but it holds one score for every pair of a query and a key: every "
            "query is compared with every key, so count the queries and the keys of one sequence."),
    Mistake("one score per token", _with(scores="B S", weights="B S"),
            "'{step}' has one number per token, as if each query met only the key at its own position (a "
            "(q * k).sum(-1)): every query is compared with every key, so there is one score per pair."),
    Mistake("softmax sum kept as the weights", _with(weights="B S 1"),
            "'{step}' ends in an axis of size 1, the shape of the row sums softmax divides by (sum with "
            "keepdim=True), not of the weights: softmax keeps the shape of the scores it normalises."),
    Mistake("scores without the batch", _with(scores="S S", weights="S S"),
            "'{step}' has lost the batch axis: each sequence of the batch has its own scores and weights; keep "
            "the batch axis."),
    Mistake("scores batch last", _with(scores="S S B", weights="S S B"),
            "'{step}' puts the batch axis last: it stays first in every step, where the input [B, S, D] has it."),
    Mistake("context = weights", _with(context="B S S"),
            "your 'context' has the shape of the weights, but it is weights @ v, a matrix product: work out the "
            "shape that product returns."),
    Mistake("context transposed", _with(context="B D_v S"),
            "your 'context' has its last two axes the wrong way round, width before positions: it is weights @ v "
            "and holds one row per token, like the input."),
    Mistake("context has width D_k", _with(context="B S D_k"),
            "'context' has the width D_k = {D_k} of the queries and keys, but it mixes the values: look at the "
            "width of 'v'."),
    Mistake("no output projection", _with(output="B S D_v"),
            "'output' still has the values' width D_v = {D_v}: W^O comes after the context, and the residual "
            "connection adds the output to the input, so look at what W^O maps D_v to."),
    Mistake("output of width D_k", _with(output="B S D_k"),
            "'output' has the width D_k = {D_k}, which belongs only to queries and keys: look at what W^O maps the "
            "context's width to."),
    Mistake("scores like q^T k", _with(scores="B D_k D_k", weights="B D_k D_k"),
            "your '{step}' is [B, D_k, D_k], the shape of q^T @ k, which compares features, not positions: the "
            "scores compare every query with every key, q @ k^T; work out the shape of that product."),
    Mistake("every width D", _with(q="B S D", k="B S D", v="B S D", context="B S D"),
            "every width in your answer is the model width D = {D}, as in the module above, where D_k = D_v = D. "
            "Here the maps are narrower: look at the width the exercise gives each of W^Q, W^K and W^V."),
)


def _not_a_shape(step: str, value: Any) -> str:
    """The hint for a step whose value is not a shape: a single number, or a tuple with a size that is no int."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (f"'{step}' should be a tuple of ints such as (2, 5, 12), got the single number {value!r}: "
                "a shape is a tuple with one int per axis.")
    return (f"'{step}' should be a tuple of ints such as (2, 5, 12), got {value!r}: "
            "every size of a shape is a whole number, written as a Python int (5, not 5.0 or '5').")


def _as_shape(value: Any) -> tuple[int, ...] | None:
    """A shape as a tuple of ints; ``None`` when it is not a sequence of integers (2.7 is not rounded)."""
    try:
        if isinstance(value, (str, bytes, dict)) or isinstance(value, Tensor) and value.dim() != 1:
            return None
        return tuple(as_index(n) for n in value)
    except (TypeError, ValueError):
        return None


def _shapes_solution(B: int, S: int, D: int, D_k: int, D_v: int) -> dict[str, tuple[int, ...]]:
    return {"q": (B, S, D_k), "k": (B, S, D_k), "v": (B, S, D_v), "scores": (B, S, S), "weights": (B, S, S),
            "context": (B, S, D_v), "output": (B, S, D)}


@exercise(solution=_shapes_solution,
          tables=(MistakeTable(SHAPE_MISTAKES, lambda: SHAPE_CONFIGS, reference_shapes),),
          not_generic={"transposed": "the answer is a dict of shapes, with no axes to swap"})
def check_attention_shapes(fn: Callable[[int, int, int, int, int], dict[str, Any]]) -> Feedback:
    """Check ``fn(B, S, D, D_k, D_v) -> {step: shape}`` for the steps in :data:`SHAPE_KEYS`.

    Tried on every configuration of :data:`SHAPE_CONFIGS`, so that no shape is right by coincidence.
    """
    for config in SHAPE_CONFIGS:
        B, S, D, D_k, D_v = config
        result, feedback = run_reader_code(fn, *config)
        if feedback is not None:
            return feedback
        if not isinstance(result, dict):
            return wrong(f"return a dict mapping each step name to a shape, got {describe(result)}.")
        missing = [k for k in SHAPE_KEYS if k not in result]
        if missing:
            return wrong(f"your dict lacks the steps {missing}; it needs all of {list(SHAPE_KEYS)}.")
        expected = reference_shapes(*config)
        shapes = {step: _as_shape(result[step]) for step in SHAPE_KEYS}
        bad = next((step for step in SHAPE_KEYS if shapes[step] is None), None)
        if bad is not None:
            return wrong(_not_a_shape(bad, result[bad]))
        hints = {"B": B, "S": S, "D": D, "D_k": D_k, "D_v": D_v}
        first_wrong = next((step for step in SHAPE_KEYS if shapes[step] != expected[step]), "q")
        for m in SHAPE_MISTAKES:  # a whole answer that equals a known mistake
            if shapes != expected and shapes == m.compute(*config):
                return wrong(m.hint.format(step=first_wrong, **hints))
        for step in SHAPE_KEYS:
            got = _as_shape(result[step])
            if got is None:
                return wrong(_not_a_shape(step, result[step]))
            if got == expected[step]:
                continue
            earlier = SHAPE_KEYS[:SHAPE_KEYS.index(step)]  # all right in the reader's answer
            for m in SHAPE_MISTAKES:  # else the first mistake that gives this step this shape
                mistaken = m.compute(*config)
                if "{step}" not in m.hint and any(mistaken[s] != expected[s] for s in earlier):
                    continue  # its hint names an earlier step the reader got right ('v', for a wrong context)
                if mistaken[step] == got != expected[step]:
                    return wrong(m.hint.format(step=step, **hints))
            return wrong(f"'{step}' is {got}, which is not its shape for B={B}, S={S}, D={D}, D_k={D_k}, D_v={D_v}: "
                         "write the step's axes by name first (such as [B, S, D_k]), then put in the sizes.")
    names = ", ".join(f"(B, S, D, D_k, D_v) = {c}" for c in SHAPE_CONFIGS)
    return correct(f"every shape matches, for {names}.")


# ---------------------------------------------------------------- reach of convolutions


def layers_until_linked(kernel: int, src: int, dst: int, *, S: int = 8, dilation_growth: int = 1) -> int:
    """How many stacked centred ``Conv1d`` layers until output ``dst`` depends on input ``src``.

    Layer ``l`` (from 0) has dilation ``dilation_growth ** l``; 1 gives plain convolutions, 2 the
    doubling dilations of WaveNet-style stacks. Dependence is read from autograd: the gradient of
    output ``dst`` with respect to input ``src`` is nonzero.
    """
    D = 4
    for depth in range(1, S + 1):
        with torch.random.fork_rng(devices=[]):  # seed the layers without touching the reader's generator
            torch.manual_seed(depth)
            layers = _conv_stack(depth, D, kernel, dilation_growth)
            x = torch.randn(1, D, S, requires_grad=True)  # Conv1d wants [B, D, S]
        nn.Sequential(*layers)(x)[0, :, dst].sum().backward()  # d(output dst) / d(inputs)
        assert x.grad is not None
        if x.grad[0, :, src].abs().sum() > 0:  # nonzero: src reaches dst
            return depth
    raise ValueError(f"positions {src} and {dst} are not linked within {S} layers")


#: The three counts the reach exercise asks for, in this order, with how each is named in a hint.
REACH_PARTS: tuple[str, ...] = ("the first number, the dilated kernel-3 layers", "the second number, the plain kernel-3 layers",
                                "the third number, the self-attention layers")


#: The pair of positions the reach exercise asks about: "books" (1) and "." (7), six positions apart. Neither this
#: distance nor its counts are printed in the chapter (section 1.6 measures "books" to "are" and "The" to ".").
REACH_SRC, REACH_DST = 1, 7


def reach_answer() -> tuple[int, int, int]:
    """The reach exercise's three counts for "books" (position 1) to "." (position 7), measured with autograd."""
    return (layers_until_linked(3, REACH_SRC, REACH_DST, dilation_growth=2), layers_until_linked(3, REACH_SRC, REACH_DST), 1)


def _one_off(i: int, value: int) -> Callable[[], tuple[int, ...]]:
    """A wrong answer with only count ``i`` changed to ``value``."""
    def answer() -> tuple[int, ...]:
        out = list(reach_answer())
        out[i] = value
        return tuple(out)
    return answer


#: Per count, the hint for any wrong value of it (``{got}`` is the reader's number).
REACH_HINTS: tuple[str, ...] = (
    "{part}, is off (you wrote {got}): layer l looks 2^l positions to each side, so L such layers reach "
    "1 + 2 + ... + 2^(L-1) = 2^L - 1 positions; find the smallest L whose reach covers the distance from 'books' to '.'.",
    "{part}, is off (you wrote {got}): each plain kernel-3 layer widens the reach by one position to each side, "
    "so count the layers until the reach covers the distance from 'books' (position 1) to '.' (position 7).",
    "{part}, is off (you wrote {got}): within one attention layer the output at every position is a direct "
    "function of the input at every position, whatever their distance (section 1.6 measured it with autograd).",
)

#: Known slips of the reach exercise, each in one count; the checker names the count and the slip.
REACH_MISTAKES: tuple[Mistake, ...] = (
    Mistake("floor of log2 of the distance", _one_off(0, 2),
            "the first number, the dilated kernel-3 layers, is one short: 2 layers (dilations 1 and 2) reach only "
            "1 + 2 = 3 positions to each side, short of the distance from 'books' to '.'. L layers reach 2^L - 1 "
            "positions, so taking the floor of log2 of the distance rounds the wrong way."),
    Mistake("plain stack one short", _one_off(1, REACH_DST - REACH_SRC - 1),
            "the second number, the plain kernel-3 layers, is one short: after that many layers the reach of "
            "'.' (position 7) ends one position to the right of 'books' (position 1). Each layer adds one position to "
            "each side; count until the reach includes position 1 itself."),
    Mistake("counted tokens, not gaps", _one_off(1, REACH_DST - REACH_SRC + 1),
            "the second number, the plain kernel-3 layers, is one too many: you counted the tokens from 'books' to "
            "'.', both ends included, but a layer moves the reach across one gap between neighbours. Count the gaps "
            "between neighbouring positions, not the tokens."),
    Mistake("two positions per layer", _one_off(1, 3),
            "the second number, the plain kernel-3 layers, counts two positions per layer towards 'books'. A stack of "
            "L kernel-3 layers does see a window 2L + 1 positions wide, but that window is centred on '.': it "
            "grows by one position to the left and one to the right, and only the left side moves towards 'books' "
            "(position 1). Count the layers until the left side alone covers the distance from position 7 to "
            "position 1. (Two positions per layer is what the kernel-5 stack of section 1.6 manages.)"),
    Mistake("the pair of section 1.6", _one_off(1, 4),
            "the second number, the plain kernel-3 layers, is the count section 1.6 measured for 'books' -> 'are', "
            "four positions apart. '.' (position 7) is further from 'books': count the layers for this pair."),
    Mistake("no attention layer", _one_off(2, 0),
            "the third number, the self-attention layers, cannot be 0: with no layer at all, the output at '.' is "
            "only its own input. Count the layers needed before it depends on the input at 'books'."),
)


def _reach_ints(answer: object) -> tuple[int, ...] | None:
    """``answer`` as a tuple of ints when it is a tuple or list of whole numbers (``None`` otherwise)."""
    if not isinstance(answer, (tuple, list)):
        return None
    try:
        return tuple(as_index(a) for a in answer)
    except (TypeError, ValueError):
        return None


@exercise(solution=(3, 6, 1), kind="value",
          tables=(MistakeTable(REACH_MISTAKES, lambda: [()], reach_answer),),
          not_generic={"float16": "the counts are whole numbers", "transposed": "three counts have no axes to swap"})
def check_reach(answer: object) -> Feedback:
    """Check the reader's ``(dilated, plain, attention)`` layer counts for linking position 1 with position 7.

    Each wrong count is named, with the hint of its known slip (:data:`REACH_MISTAKES`) when it is one.
    """
    if answer is None:
        return todo("write your three numbers as my_answer, then run the cell again.")
    ints = _reach_ints(answer)
    if ints is None and isinstance(answer, (tuple, list)) and any(isinstance(a, float) for a in answer):
        return wrong("write each count as a whole number, an int (3, not 3.0): a number of layers has no fraction.")
    if ints is None or len(ints) != 3:
        return wrong("write my_answer as three whole numbers in parentheses, (dilated, plain, attention), such as "
                     f"(5, 9, 2); got {describe(answer)}.")
    right = reach_answer()
    if ints == right:
        return correct(f"{ints}: doubling dilations cover 2^L - 1 positions in L layers, a plain kernel-3 stack one "
                       "more per layer, and one attention layer links every pair.")
    for m in REACH_MISTAKES:
        if ints == m.compute():
            return wrong(m.hint)
    hints = []
    for i, (got, want) in enumerate(zip(ints, right)):
        if got == want:
            continue
        slip = next((m for m in REACH_MISTAKES if m.compute()[i] == got), None)
        hints.append(slip.hint if slip is not None else REACH_HINTS[i].format(part=REACH_PARTS[i], got=got))
    return wrong(" Also, ".join(hints))


def _conv_stack(depth: int, D: int, kernel: int, dilation_growth: int) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for layer in range(depth):
        dilation = dilation_growth**layer
        layers.append(nn.Conv1d(D, D, kernel, padding=dilation * (kernel // 2), dilation=dilation))
    return layers


# ---------------------------------------------------------------- the layer diagram


def encoder_layer_figure():  # -> matplotlib Figure
    """One encoder layer of the original Transformer (post-LN), drawn large enough for a phone."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=(5.2, 6.2))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.3, 11.2)
    ax.axis("off")

    def box(y: float, text: str, colour: str) -> None:
        ax.add_patch(FancyBboxPatch((2.0, y), 7.4, 1.0, boxstyle="round,pad=0.08", fc=colour, ec="black"))
        ax.text(5.7, y + 0.5, text, ha="center", va="center", fontsize=13)

    def arrow(y0: float, y1: float, x: float = 5.7) -> None:
        ax.annotate("", xy=(x, y1), xytext=(x, y0), arrowprops=dict(arrowstyle="->", lw=1.6))

    ax.add_patch(FancyBboxPatch((0.4, 1.85), 9.3, 7.15, boxstyle="round,pad=0.1", fc="none", ec="grey", ls="--"))
    ax.text(9.6, 2.05, "× N", ha="right", fontsize=13, color="dimgrey")
    box(0.0, "embeddings + positions", "#DDDDDD")
    box(2.6, "self-attention", "#E69F00")  # Okabe-Ito orange: this book's topic
    box(4.2, "add, then LayerNorm", "#56B4E9")
    box(5.8, "feed-forward network", "#CCEBDD")
    box(7.4, "add, then LayerNorm", "#56B4E9")
    arrow(1.08, 2.52)
    arrow(3.68, 4.12)
    arrow(5.28, 5.72)
    arrow(6.88, 7.32)
    arrow(8.48, 10.3)
    ax.text(5.9, 9.5, "[B, S, D]", fontsize=12)
    ax.text(5.9, 1.8, "[B, S, D]", fontsize=12, va="center")
    for y_from, y_to in ((2.15, 4.7), (5.45, 7.9)):  # the two residual connections
        ax.plot([5.7, 1.3, 1.3], [y_from, y_from, y_to], color="#0072B2", lw=1.6)
        ax.annotate("", xy=(1.92, y_to), xytext=(1.3, y_to), arrowprops=dict(arrowstyle="->", lw=1.6, color="#0072B2"))
        ax.text(1.1, (y_from + y_to) / 2, "residual", rotation=90, ha="right", va="center", fontsize=12, color="#0072B2")
    ax.set_title("One encoder layer", fontsize=14)
    return fig


# ---------------------------------------------------------------- what the residual path keeps


def sinusoidal_code(S: int, D: int) -> Tensor:
    """The original Transformer's position code, ``[S, D]``: features ``2m`` and ``2m + 1`` of position ``p``
    are ``sin(p * omega_m)`` and ``cos(p * omega_m)``, with ``omega_m = 10000 ** (-2m / D)``."""
    pos = torch.arange(S, dtype=torch.float32)[:, None]  # [S, 1]
    omega = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)  # [D/2]
    pe = torch.zeros(S, D)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * omega), torch.cos(pos * omega)
    return pe


def position_code_figure(tokens: list[str], D: int = 64):  # -> matplotlib Figure
    """The sinusoidal code of ``len(tokens)`` positions at width ``D`` as two heatmaps, the sin features
    (even) and the cos features (odd), one row per token and one column per pair ``m``, in a
    colour-blind-safe diverging map from -1 to 1."""
    import matplotlib.pyplot as plt

    pe = sinusoidal_code(len(tokens), D)
    fig, axes = plt.subplots(1, 2, figsize=(4.6, 3.8), sharey=True)
    for ax, start, name in ((axes[0], 0, "sin (even features)"), (axes[1], 1, "cos (odd features)")):
        image = ax.imshow(pe[:, start::2].numpy(), cmap="PuOr", vmin=-1.0, vmax=1.0, aspect="auto",
                          interpolation="nearest")
        ax.set_xticks(range(0, D // 2, 10))
        ax.set_xlabel("pair m")
        ax.set_title(name, fontsize=12)
    axes[0].set_yticks(range(len(tokens)), labels=[f"{p} {t}" for p, t in enumerate(tokens)])
    axes[0].set_ylabel("position, token")
    fig.suptitle(f"Sinusoidal position code, D = {D}")
    fig.subplots_adjust(top=0.8, wspace=0.15)
    fig.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    return fig


def residual_gradient_norms(depth: int = 12, D: int = 32, S: int = 8, position: int = 5, *, seed: int = 0) -> dict[str, list[float]]:
    """How strongly the output at ``position`` depends on each input, after ``depth`` layers.

    Builds ``depth`` random attention layers (4 heads) each followed by LayerNorm, once as
    ``norm(attn(x))`` and once with the residual connection, ``norm(x + attn(x))``, and returns the
    norm of the gradient of one random projection of the output at ``position`` with respect to
    each input vector: ``{"without": [S], "with": [S]}``. The reader's random generator is left as
    it was.

    >>> g = residual_gradient_norms(depth=2, D=8, S=4, position=1)
    >>> sorted(g), len(g["with"])
    (['with', 'without'], 4)
    """
    from attnlib.multihead import MultiHeadSelfAttention

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers = [MultiHeadSelfAttention(D, num_heads=4) for _ in range(depth)]
        norms = [nn.LayerNorm(D) for _ in range(depth)]
        x = torch.randn(1, S, D)  # [B, S, D]
        probe = torch.randn(D)  # a random read-out of the output at `position`
    out: dict[str, list[float]] = {}
    for name, residual in (("without", False), ("with", True)):
        xi = x.clone().requires_grad_()
        h = xi
        for attn, norm in zip(layers, norms):
            h = norm(h + attn(h).hidden_states) if residual else norm(attn(h).hidden_states)  # [B, S, D]
        (h[0, position] * probe).sum().backward()
        assert xi.grad is not None
        out[name] = xi.grad[0].norm(dim=-1).tolist()  # [S]
    return out


# ---------------------------------------------------------------- a real head on the example sentence

#: One row of attention weights measured in the pretrained model of chapter 7 (all-MiniLM-L6-v2,
#: loaded with :func:`attnlib.pretrained.load_minilm`) on "The books on the shelf are old.": the
#: query "are", in layer 3, head 1 (both counted from 0), the head of the 72 that puts the most
#: weight on "books". Rounded to 3 decimals; ``tests/test_ch01.py`` recomputes it from the model.
#: ``heads_preferring_subject`` counts the heads in which "are" gives "books" more weight than "shelf";
#: ``mean_over_heads`` is the row of "are" averaged over all 72 heads.
MINILM_ARE: dict[str, Any] = {
    "tokens": ["[CLS]", "the", "books", "on", "the", "shelf", "are", "old", ".", "[SEP]"],
    "layer": 3,
    "head": 1,
    "weights": [0.013, 0.188, 0.708, 0.021, 0.004, 0.006, 0.005, 0.029, 0.012, 0.014],
    "heads_preferring_subject": 32,
    "heads": 72,
    "mean_over_heads": [0.412, 0.06, 0.063, 0.03, 0.046, 0.078, 0.07, 0.14, 0.057, 0.044],
}


def are_row_from_model(model: Any, tokenizer: Any) -> dict[str, Any]:
    """Recompute :data:`MINILM_ARE` from the pretrained model (``attnlib.pretrained.load_minilm()``)."""
    from attnlib import pretrained

    text = "The books on the shelf are old."
    toks = pretrained.tokens(tokenizer, text)
    with torch.no_grad():
        out = model(**pretrained.encode(tokenizer, text), output_attentions=True)
    weights = torch.stack(out.attentions)[:, 0]  # [L, H, S, S]
    are, books, shelf = toks.index("are"), toks.index("books"), toks.index("shelf")
    rows = weights[:, :, are]  # [L, H, S]: the query "are" in every head
    L, H = rows.shape[:2]
    best = int(rows[..., books].flatten().argmax())
    layer, head = divmod(best, H)
    return {
        "tokens": toks,
        "layer": layer,
        "head": head,
        "weights": [round(w, 3) for w in rows[layer, head].tolist()],
        "heads_preferring_subject": int((rows[..., books] > rows[..., shelf]).sum()),
        "heads": L * H,
        "mean_over_heads": [round(w, 3) for w in rows.mean(dim=(0, 1)).tolist()],
    }


# ---------------------------------------------------------------- the diagram of one head

#: The sizes of the chapter's head computed by hand: one sequence (B = 1) of the running example's
#: S = 8 tokens, width D = 64, one head, so D_k = D_v = D. The notebook and the diagram both read them.
HEAD_B, HEAD_D = 1, 64


def draw_head_path(name: str, shapes: dict[str, str], *, title: str, alt: str,
                   labels: tuple[str, str, str] = ("QK^{T} / √D_{k}", "softmax, each row", "weights @ V")) -> Diagram:
    """The path of one head, top to bottom: X, then Q, K, V, scores, weights, context or output.

    ``shapes`` maps ``"x"``, ``"q"``, ``"k"``, ``"v"``, ``"scores"``, ``"weights"``, ``"out"`` to the
    shape written under each box (and optionally ``"final"`` for a last box after ``W^O``). Shared
    with chapter 2, which draws the same path with its own sizes; ``labels`` names the scores,
    weights and mixing boxes.
    """
    final = "final" in shapes
    d = Diagram(name, 360, 560 if final else 470, title=title, alt=alt)
    d.box(120, 12, 120, 50, "X", sub=shapes["x"], color="grey")
    for x, label, proj, colour in ((12, "Q", "W^{Q}", "blue"), (132, "K", "W^{K}", "blue"),
                                   (252, "V", "W^{V}", "green")):
        d.box(x, 112, 96, 50, label, sub=shapes[label.lower()], color=colour)
        d.arrow(180, 62, x + 48, 110)
    for x, y, proj, anchor in ((112, 84, "W^{Q}", "end"), (188, 96, "W^{K}", "start"),
                               (248, 84, "W^{V}", "start")):
        d.text(x, y, proj, size=15, anchor=anchor)
    d.box(12, 206, 216, 54, labels[0], sub=shapes["scores"], color="orange")
    d.arrow(60, 162, 60, 204)
    d.arrow(180, 162, 180, 204)
    d.box(12, 300, 216, 54, labels[1], sub=shapes["weights"], color="orange")
    d.arrow(120, 260, 120, 298)
    d.box(12, 394, 336, 54, labels[2], sub=shapes["out"], color="green")
    d.arrow(120, 354, 120, 392)
    d.arrow(300, 162, 300, 392)
    if final:
        d.box(12, 488, 336, 54, "@ W^{O}: back to width D", sub=shapes["final"], color="grey")
        d.arrow(180, 448, 180, 486)
    return d


@diagram
def one_head_diagram() -> Diagram:
    """Chapter 1: the five steps of one head, with the shapes of the chapter's own computation."""
    from .examples import BOOKS_SENTENCE

    B, S, D = HEAD_B, len(BOOKS_SENTENCE), HEAD_D
    alt = (f"The path of one attention head, top to bottom. X, shape ({B}, {S}, {D}), goes through three "
           f"maps W^Q, W^K and W^V to Q, K and V, each ({B}, {S}, {D}). Q and K meet in the scores "
           f"QK^T divided by the square root of D_k, shape ({B}, {S}, {S}): one score per pair of tokens. "
           f"Softmax over each row gives the weights, ({B}, {S}, {S}). The weights mix V into "
           f"({B}, {S}, {D}), and W^O maps that back to the model width, ({B}, {S}, {D}).")
    return draw_head_path(
        "ch01_one_head",
        {"x": f"[{B}, {S}, {D}]", "q": f"[{B}, {S}, {D}]", "k": f"[{B}, {S}, {D}]", "v": f"[{B}, {S}, {D}]",
         "scores": f"[{B}, {S}, {S}]", "weights": f"[{B}, {S}, {S}]", "out": f"[{B}, {S}, {D}]",
         "final": f"[{B}, {S}, {D}]"},
        title="One head, step by step", alt=alt)


#: The toy of the chapter's first cell: one query and the keys of four tokens (values one-hot).
TOY_QUERY: list[float] = [2.0, 1.0]
TOY_KEYS: list[list[float]] = [[1.0, 0.0], [0.0, 1.0], [0.7, 0.7], [-1.0, 0.0]]


@diagram
def soft_lookup_diagram() -> Diagram:
    """Chapter 1: the toy soft lookup, one row per token: its key, its score, its weight as a bar."""
    query, keys = torch.tensor(TOY_QUERY), torch.tensor(TOY_KEYS)
    scores = keys @ query
    weights = torch.softmax(scores, dim=-1)
    cells = ", ".join(f"token {i}: score {s:.1f}, weight {w:.2f}" for i, (s, w) in
                      enumerate(zip(scores.tolist(), weights.tolist())))
    alt = (f"A soft lookup, chapter 1's first example, as a table. The query is ({query[0]:.1f}, {query[1]:.1f}). "
           f"One row per token with its key, the score (the key's dot product with the query) and the "
           f"weight after softmax, drawn as a bar: {cells}. The output takes every token's value in "
           "proportion to its bar, instead of only the best match's.")
    n = len(TOY_KEYS)
    d = Diagram("ch01_soft_lookup", 360, 96 + 44 * n + 56, title="A soft lookup", alt=alt)
    d.box(90, 10, 180, 40, f"query [{query[0]:.1f}, {query[1]:.1f}]", color="blue")
    for x, head, anchor in ((30, "token", "middle"), (114, "key", "middle"), (208, "score", "middle"),
                            (236, "weight", "start")):
        d.text(x, 80, head, size=14, anchor=anchor, color=MUTED)
    for i, (key, s, w) in enumerate(zip(TOY_KEYS, scores.tolist(), weights.tolist())):
        y = 92 + 44 * i
        d.text(30, y + 23, str(i), size=15)
        d.box(62, y, 104, 34, f"[{key[0]:.1f}, {key[1]:.1f}]", color="grey", size=14)
        d.text(208, y + 23, f"{s:.1f}", size=15)
        bar = max(2.0, 90 * w / float(weights.max()))
        d.rect(236, y + 4, bar, 26, fill="orange", stroke="orange", rx=2, tint=True)
        d.text(236 + bar + 4 if bar < 60 else 240, y + 23, f"{w:.2f}", size=14, anchor="start")
    d.text(180, 92 + 44 * n + 30, f"output = weighted sum of the {n} values", size=15)
    return d


# ---------------------------------------------------------------- the reach diagram


def reach_rows(src: int, dst: int, *, S: int = 8, kernel: int = 3, dilation_growth: int = 1) -> list[set[int]]:
    """The positions whose output depends on input ``src``, after 0, 1, 2, ... stacked centred convolutions,
    until ``dst`` is among them (index 0 is the input itself). Counted from the kernel's taps, so that the
    last index equals :func:`layers_until_linked` (``tests/test_ch01.py`` checks it)."""
    rows = [{src}]
    while dst not in rows[-1]:
        dilation = dilation_growth ** (len(rows) - 1)
        taps = range(-(kernel // 2) * dilation, (kernel // 2) * dilation + 1, dilation)
        rows.append({p + t for p in rows[-1] for t in taps if 0 <= p + t < S})
    return rows


@diagram
def reach_diagram() -> Diagram:
    """Chapter 1, section 1.6: how far the input at "books" reaches, layer by layer, in three designs."""
    from .examples import BOOKS_SENTENCE

    S = len(BOOKS_SENTENCE)
    src, dst = BOOKS_SENTENCE.index("books"), BOOKS_SENTENCE.index("are")
    designs = [("kernel-3 convolutions", reach_rows(src, dst, S=S)),
               ("kernel 3, dilations 1, 2, 4", reach_rows(src, dst, S=S, dilation_growth=2)),
               ("self-attention", [{src}, set(range(S))])]
    counts = "; ".join(f"{name}: {len(rows) - 1} layer{'s' if len(rows) > 2 else ''}" for name, rows in designs)
    alt = (f"Three grids, one per design, with the {S} positions of the sentence as columns and the layers as rows, "
           f"input at the bottom. Orange cells are the outputs that depend on the input at position {src}, "
           f"\"{BOOKS_SENTENCE[src]}\"; the cell marked {dst}, a darker orange, is position {dst}, \"{BOOKS_SENTENCE[dst]}\", where it is "
           f"first reached. Layers needed: {counts}. The input cell at position {src} is marked {src}. A plain convolution widens the reach by one position per "
           "layer; doubling dilations double it; one attention layer reaches every position.")
    cell, x0 = 26, 130
    height = 24 + sum(60 + cell * len(rows) for _, rows in designs) + 16
    d = Diagram("ch01_reach", 360, height, title="How far one input reaches, layer by layer", alt=alt)
    y = 24
    for name, rows in designs:
        d.text(12, y, f"{name}: {len(rows) - 1} layer{'s' if len(rows) > 2 else ''}", size=15, anchor="start")
        y += 34
        fills = []
        for layer in reversed(range(len(rows))):  # the last layer on top, the input at the bottom
            first = layer == len(rows) - 1
            fills.append(["vermillion" if first and p == dst else "orange" if p in rows[layer] else "none"
                          for p in range(S)])
        marks = [[str(p) if (p == src and layer == 0) or (p == dst and layer == len(rows) - 1) else ""
                  for p in range(S)] for layer in reversed(range(len(rows)))]
        labels = [f"layer {layer}" if layer else "input" for layer in reversed(range(len(rows)))]
        d.grid(x0, y, fills, cell=cell, labels=marks, row_labels=labels, col_labels=[str(p) for p in range(S)], size=13)
        y += cell * len(rows) + 26
    d.text(12, y, f"columns: positions 0-{S - 1}; {src} = \"{BOOKS_SENTENCE[src]}\", {dst} = \"{BOOKS_SENTENCE[dst]}\"", size=13,
           anchor="start", color=MUTED)
    return d


# ---------------------------------------------------------------- section 1.9: RoPE


def rope(vec: Tensor, p: int) -> Tensor:
    """Rotate a ``[D]`` query or key for position ``p`` (RoPE, "rotate half" pairs).

    Feature pair ``m``, ``(vec[m], vec[m + D/2])``, is turned, as a point in the plane, by the angle
    ``p * omega_m`` with ``omega_m = 10000 ** (-m / (D/2))``. The dot product of a query rotated for
    position ``i`` with a key rotated for ``j`` then depends on the positions only through ``i - j``.
    """
    half = vec.shape[-1] // 2
    angle = p * 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)  # [D/2]
    a, b = vec[:half], vec[half:]  # [D/2] each: the two halves of every pair
    cos, sin = torch.cos(angle), torch.sin(angle)
    return torch.cat([a * cos - b * sin, a * sin + b * cos])  # [D]


#: The RoPE diagram's illustrative feature pair: it turns ``ROPE_STEP_DEG`` degrees per position; the
#: query and key start ``ROPE_KEY_START_DEG`` apart, and the two panels put them at these positions.
ROPE_STEP_DEG, ROPE_KEY_START_DEG = 30, 20
ROPE_PANELS = ((1, 3), (4, 6))


@diagram
def rope_diagram() -> Diagram:
    """Chapter 1, section 1.9: RoPE turns one feature pair of q and k by their positions; the angle between them is set by the offset."""
    step, k0 = ROPE_STEP_DEG, ROPE_KEY_START_DEG
    gaps = {k0 + step * (j - i) for i, j in ROPE_PANELS}
    (gap,) = gaps  # both panels share one offset, so one angle between q and k
    panels = "; ".join(
        f"query at position {i} turned {step * i} degrees, key at position {j} turned {step * j} degrees"
        for i, j in ROPE_PANELS)
    alt = (f"Two panels, each a plane holding one feature pair of a query (blue arrow) and a key (orange arrow). "
           f"The pair turns {step} degrees per position, and the key starts {k0} degrees ahead of the query. {panels[0].upper() + panels[1:]}. In both panels the offset is "
           f"{ROPE_PANELS[0][1] - ROPE_PANELS[0][0]} and the angle between the two arrows is the same, {gap} degrees, "
           "so their dot product, the score, is the same: it depends on the offset, not on where the pair stands.")
    d = Diagram("ch01_rope", 360, 262, title="RoPE: a rotation per position, a score per offset", alt=alt)
    r, rad = 62, math.pi / 180
    for panel, (i, j) in enumerate(ROPE_PANELS):
        cx, cy = 90 + 180 * panel, 128
        d.line(cx - 76, cy, cx + 76, cy, color=MUTED, width=1)
        d.line(cx, cy - 76, cx, cy + 76, color=MUTED, width=1)
        aq, ak = step * i, k0 + step * j
        pts = [(cx + 30 * math.cos(a * rad), cy - 30 * math.sin(a * rad)) for a in range(aq, ak + 1, 8)]
        for (x1, y1), (x2, y2) in zip(pts, pts[1:] + [(cx + 30 * math.cos(ak * rad), cy - 30 * math.sin(ak * rad))]):
            d.line(x1, y1, x2, y2, color=MUTED, width=1.5)
        for ang, colour, label in ((aq, "blue", f"q at {i}"), (ak, "orange", f"k at {j}")):
            x, y = cx + r * math.cos(ang * rad), cy - r * math.sin(ang * rad)
            d.arrow(cx, cy, x, y, color=colour)
            d.text(cx + (r + 14) * math.cos(ang * rad), cy - (r + 14) * math.sin(ang * rad) + 5, label,
                   size=14, color=colour, weight="bold")
        mid = (aq + ak) / 2 * rad
        d.text(cx + 44 * math.cos(mid), cy - 44 * math.sin(mid) + 5, f"{gap}\u00b0", size=13, color=MUTED)
        d.text(cx, 34, f"positions {i} and {j}", size=15)
    d.text(180, 232, f"each pair turns {step}\u00b0 per position (one pair shown)", size=13, color=MUTED)
    d.text(180, 252, f"offset {ROPE_PANELS[0][1] - ROPE_PANELS[0][0]} in both: same angle, same score", size=14)
    return d


# ---------------------------------------------------------------- section 1.10: the layout diagram

#: The batch of sections 1.5 and 1.10: ``MHA_B`` sequences of the sentence's 8 tokens, at the width and
#: head count of all-MiniLM-L6-v2.
MHA_B, MHA_D, MHA_H = 2, 384, 12


@diagram
def layout_diagram() -> Diagram:
    """Chapter 1, section 1.10: a batch-first ``[B, S, D]`` tensor, and how a sequence-first module reads it."""
    from .examples import BOOKS_SENTENCE

    B, S, D = MHA_B, len(BOOKS_SENTENCE), MHA_D
    alt = (f"Two grids of the same {B} by {S} token vectors, each {D} numbers wide. Top, batch first, "
           f"(B, S, D) = ({B}, {S}, {D}): each row is one sequence, sequence 0 in orange and sequence 1 in blue, "
           f"and each of the {S} columns a position. Bottom, the same tensor read as sequence first, (S, B, D), "
           f"by nn.MultiheadAttention with its default batch_first=False: axis 0, of size {B}, is taken for the "
           f"positions and axis 1, of size {S}, for the batch, so each column, outlined, becomes one 'sequence' of "
           f"{B} tokens, one from each real sequence. Nothing is moved and no error is raised; token i attends only "
           f"to itself and to token i of the other sequence, and the weights come out with shape ({S}, {B}, {B}).")
    d = Diagram("ch01_layout", 360, 410, title="Batch first, and how a sequence-first module misreads it", alt=alt)
    colours = ["orange", "blue", "green", "purple"]
    fills = [[colours[b % len(colours)]] * S for b in range(B)]
    d.text(12, 24, f"batch first [B, S, D] = [{B}, {S}, {D}]", size=15, anchor="start", weight="bold")
    d.text(12, 44, "a row is a sequence, a column a position", size=13, anchor="start", color=MUTED)
    cell = 30
    d.grid(100, 80, fills, cell=cell, row_labels=[f"seq {b}" for b in range(B)],
           col_labels=[str(p) for p in range(S)], size=13)
    d.text(12, 80 + B * cell + 22, f"each cell: one token's vector, D = {D} numbers", size=13, anchor="start",
           color=MUTED)
    y0 = 80 + B * cell + 62
    d.text(12, y0, "read as [S, B, D] (batch_first=False)", size=15, anchor="start", weight="bold")
    d.text(12, y0 + 20, f"axis 0, size {B}, taken as positions; axis 1, size {S}, as", size=13, anchor="start",
           color=MUTED)
    d.text(12, y0 + 38, f"the batch: {S} 'sequences' of {B} tokens, outlined", size=13, anchor="start", color=MUTED)
    cell, gap, x0, y1 = 28, 6, 76, y0 + 74
    d.grid(x0, y1, fills, cell=cell, gap=gap, row_labels=[f"token {b}" for b in range(B)],
           col_labels=[str(p) for p in range(S)], size=13)
    for p in range(S):
        d.rect(x0 + p * (cell + gap) - 3, y1 - 3, cell + 6, B * cell + gap + 6, stroke="vermillion", dash=True,
               width=2)
    y2 = y1 + B * cell + gap + 30
    d.text(12, y2, "no error: token i attends only to itself and to", size=13, anchor="start")
    d.text(12, y2 + 18, f"token i of the other sequence; weights [{S}, {B}, {B}]", size=13, anchor="start")
    return d


# ---------------------------------------------------------------- section 1.8: the equivariance diagram

#: The four tokens of section 1.8's example, "the books are old", and the shuffle that reads them as
#: "old books are the": position p of the shuffled sequence holds token ``SHUFFLE[p]``.
SHUFFLE_TOKENS: tuple[str, ...] = ("the", "books", "are", "old")
SHUFFLE: tuple[int, ...] = (3, 1, 2, 0)


@diagram
def equivariance_diagram() -> Diagram:
    """Chapter 1, section 1.8: shuffle, then attend, equals attend, then shuffle."""
    toks, order = SHUFFLE_TOKENS, SHUFFLE
    colours = ("orange", "sky", "green", "purple")
    shuffled = [toks[i] for i in order]
    alt = (f"Shuffle, then attend, equals attend, then shuffle. Top: the input x, one row per token: "
           f"{', '.join(toks)}. Left path: shuffle the rows to {', '.join(shuffled)}, then attend, which gives the outputs "
           f"{', '.join(f'o({t})' for t in shuffled)}. Right path: attend first, which gives "
           f"{', '.join(f'o({t})' for t in toks)}, then shuffle the same way: "
           f"{', '.join(f'o({t})' for t in shuffled)}. The two results are equal row for row: shuffling the input "
           "only shuffles the output, each token's output the same wherever it sits.")
    d = Diagram("ch01_equivariance", 360, 520, title="Shuffle, then attend = attend, then shuffle", alt=alt)
    row, w = 26, 150

    def column(x: float, y: float, names: list[str], idx: list[int], caption: str, output: bool) -> None:
        d.text(x + w / 2, y - 8, caption, size=14, color=MUTED)
        for r, (name, i) in enumerate(zip(names, idx)):
            d.box(x, y + r * row, w, row, f"o({name})" if output else name, color=colours[i], size=14, dash=output)

    column(105, 40, list(toks), list(range(4)), "x: one row per token", False)
    left, right = 12, 198
    column(left, 212, shuffled, list(order), "shuffled x", False)
    column(right, 212, [f"{t}" for t in toks], list(range(4)), "attn(x)", True)
    column(left, 384, shuffled, list(order), "attn(shuffled x)", True)
    column(right, 384, shuffled, list(order), "shuffled attn(x)", True)
    for (x1, y1, x2, y2, label, side) in ((150, 146, 90, 188, "shuffle", "end"), (210, 146, 270, 188, "attend", "start"),
                                          (87, 318, 87, 360, "attend", "start"), (273, 318, 273, 360, "shuffle", "end")):
        d.arrow(x1, y1, x2, y2)
        d.text(x1 + (x2 - x1) / 2 + (-8 if side == "end" else 8), (y1 + y2) / 2 + 5, label, size=14, anchor=side)
    d.text(180, 440, "=", size=22, weight="bold")
    d.text(180, 506, "the same rows, with the same values", size=14)
    return d


# ---------------------------------------------------------------- section 1.5: the weights grow with S^2

#: The sequence lengths the growth diagram draws, each twice the last.
GROWTH_S: tuple[int, ...] = (2, 4, 8)


@diagram
def weights_growth_diagram() -> Diagram:
    """Chapter 1, section 1.5: the [B, H, S, S] weights, one S x S block per sequence and head, growing with S^2."""
    H = MHA_H
    sizes = GROWTH_S
    counts = ", ".join(f"S = {s}: {H} x {s} x {s} = {H * s * s} numbers" for s in sizes)
    alt = (f"The weights a layer can return, shape (B, H, S, S), for one sequence (B = 1) and H = {H} heads: a stack "
           f"of {H} square blocks, one per head, each with one cell per (query, key) pair. Three stacks, for S = "
           f"{', '.join(str(s) for s in sizes)}: each time S doubles, every block gets twice as many rows and twice as "
           f"many columns, so four times as many numbers. {counts}.")
    d = Diagram("ch01_weights_growth", 360, 300, title="The weights [B, H, S, S] grow with S squared", alt=alt)
    cell, x = 14, 30
    base = 226
    for s in sizes:
        side = s * cell
        for back in (2, 1):  # the other heads, stacked behind the first
            d.rect(x + 6 * back, base - side - 6 * back, side, side, fill="grey", stroke="grey", rx=0, tint=True)
        fills = [["orange"] * s for _ in range(s)]
        d.grid(x, base - side, fills, cell=cell, size=13)
        d.text(x + side / 2 + 6, base + 22, f"S = {s}", size=14)
        d.text(x + side / 2 + 6, base + 42, f"{H * s * s:,} numbers", size=13, color=MUTED)
        x += side + 48
    d.text(180, 22, f"one block per head (H = {H}),", size=13, color=MUTED)
    d.text(180, 40, "one cell per (query, key) pair", size=13, color=MUTED)
    d.text(180, 292, "S twice as long: 4x the numbers", size=14)
    return d
