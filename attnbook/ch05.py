"""Chapter 5, *Multi-head attention*: the two-relation example, the attention paths compared, checkers.

* :func:`relation_subspaces`, :func:`best_single_head_error`, :func:`two_head_module`: the example
  in which one head cannot serve two relations that need different value subspaces.
* :func:`softmax_attention`, :func:`core_paths`: one attention core three ways (attnlib,
  ``torch.softmax``, fused SDPA), for timing and saved-tensor counts.
* :func:`check_param_count`: the reader's number for the parameters of one attention block.
* :func:`check_per_head_loop`: the reader writes multi-head attention as a loop over heads.
* :func:`check_weights_bytes`: the reader computes the bytes of the ``[B, H, S, S]`` weights.

Each checker keeps its known mistakes in one table (:class:`attnbook.feedback.Mistake`), tried by
:func:`attnbook.feedback.diagnose`; the tests iterate over the same tables.
"""

from __future__ import annotations

import math
import re
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import attnlib
from attnlib.cost import attention_weights_bytes, mha_param_count
from attnlib.heads import merge_heads, split_heads
from attnlib.multihead import MultiHeadSelfAttention

from .diagrams import MUTED, Diagram, diagram
from .examples import THEY_SENTENCE
from .measure import interleaved_median_ms
from .feedback import (
    Feedback,
    Mistake,
    MistakeTable,
    check_number,
    close,
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
    "relation_subspaces", "relation_batch", "best_single_head_error", "two_head_module", "relative_error",
    "softmax_attention", "core_paths", "softmax_block", "interleaved_min_ms",
    "check_param_count", "PARAM_MISTAKES", "PARAM_EXERCISE", "check_per_head_loop", "LOOP_MISTAKES",
    "check_weights_bytes", "BYTES_MISTAKES",
]

# --- one head cannot serve two relations that need different value subspaces -----------------


def relation_subspaces(generator: torch.Generator, d: int = 12, r: int = 6, r_z: int | None = None) -> tuple[Tensor, Tensor]:
    """Two orthonormal bases ``U: [d, r]`` and ``Z: [d, r_z]`` (``r_z = r`` by default) of orthogonal
    subspaces, in a random rotation of ``R^d``.

    The first relation needs the part of one target token's content in ``span(U)``, the second the
    part of the other target's content in ``span(Z)``.
    """
    r_z = r if r_z is None else r_z
    if r + r_z > d:
        raise ValueError(f"orthogonal subspaces of dimensions {r} and {r_z} need d >= {r + r_z}, got d = {d}")
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))  # random rotation
    return q[:, :r], q[:, r:r + r_z]


def relation_batch(n: int, S: int, d: int, generator: torch.Generator) -> Tensor:
    """``[n, S, S + d]`` float64 sentences: token ``j`` is ``[one-hot(j), content_j]``, content random."""
    ident = torch.eye(S, dtype=torch.float64).expand(n, S, S)  # [n, S, S]: which token this is
    content = torch.randn(n, S, d, generator=generator, dtype=torch.float64)  # [n, S, d]
    return torch.cat([ident, content], dim=-1)  # [n, S, S + d]


def relative_error(got: Tensor, target: Tensor) -> float:
    """``||got - target||^2 / ||target||^2`` over the whole batch."""
    return float((got - target).pow(2).sum() / target.pow(2).sum())


def best_single_head_error(U: Tensor, Z: Tensor, *, n: int = 4000, shares: int = 21, generator: torch.Generator) -> tuple[float, float]:
    """The smallest relative error any single head can reach on ``y = P_U c_a + P_Z c_t``, and the share of ``a`` there.

    One head adds ``M (sum_j w_j c_j)`` to the query (``M = W_V W_O`` restricted to the content, the
    same map for every key). For each share ``w_a`` of the first target, *books* (the rest on the
    second, *dusty*; weight on other tokens only adds noise), ``M`` is fitted by least squares *on the
    very samples it is scored on*, which can only flatter the head. Theory, for orthogonal ``span(U)``
    and ``span(Z)``: ``min(r_U, r_Z) / (r_U + r_Z)``, so exactly 0.5 (for every share) when the two
    dimensions are equal.
    """
    d = U.shape[0]
    c_a = torch.randn(n, d, generator=generator, dtype=torch.float64)  # [n, d]: content of "books"
    c_t = torch.randn(n, d, generator=generator, dtype=torch.float64)  # [n, d]: content of "dusty"
    y = c_a @ U @ U.T + c_t @ Z @ Z.T  # [n, d]: what "they" should receive
    best = (math.inf, 0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny solves: extra threads only wait on each other
    try:
        for w_a in torch.linspace(0, 1, shares, dtype=torch.float64).tolist():
            z = w_a * c_a + (1 - w_a) * c_t  # [n, d]: the head's weighted average
            M = torch.linalg.lstsq(z, y).solution  # [d, d], the best shared map for this share
            best = min(best, (relative_error(z @ M, y), w_a))
    finally:
        torch.set_num_threads(threads)
    return best


def two_head_module(U: Tensor, Z: Tensor, S: int, query: int, antecedent: int, predicate: int, s: float = 16.0) -> MultiHeadSelfAttention:
    """``H = 2`` module on ``[one-hot(S), content(d)]`` tokens: head 0 brings ``P_U`` of the first target's
    content (*books*, at position ``antecedent``), head 1 ``P_Z`` of the second's (*dusty*, at ``predicate``).

    Each head's query/key pick its target (score ``s``), its ``W_V`` reads the content through its
    own basis (``U^T`` or ``Z^T``) and its block of ``W_O`` writes it back (``U`` or ``Z``) into the
    content features of the output. Positions and bases are arguments, so nothing depends on where
    the tokens or the features sit.
    """
    d, r = U.shape
    D = S + d
    if D % 2:
        raise ValueError(f"D = S + d = {D} must be even for two heads")
    m = MultiHeadSelfAttention(D, 2, bias=False).double()
    d_k = D // 2
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for h, (target, basis) in enumerate(((antecedent, U), (predicate, Z))):
            rows = slice(h * d_k, h * d_k + r)
            m.w_q.weight[h * d_k, query] = 1.0  # "I am the query token"
            m.w_k.weight[h * d_k, target] = s * math.sqrt(d_k)  # score s on the head's target, 0 elsewhere
            m.w_v.weight[rows, S:] = basis.T  # [r, d]: the head's value = coordinates in its subspace
            m.w_o.weight[S:, rows] = basis  # [d, r]: written back into the content features
    return m


# --- one attention core three ways ----------------------------------------------------------


def softmax_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """``softmax(q k^T / sqrt(D_k)) v`` with ``torch.softmax``: ``[B, H, S, D_k]`` in and out (weights materialised)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, H, S, S]
    return torch.softmax(scores, dim=-1) @ v  # [B, H, S, D_k]


def core_paths() -> dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]]:
    """``{name: fn(q, k, v) -> [B, H, S, D_k]}``: attnlib (its own stable softmax), ``torch.softmax``, fused SDPA."""
    return {
        "attnlib": lambda q, k, v: attnlib.scaled_dot_product_attention(q, k, v).output,
        "torch.softmax": softmax_attention,
        "fused SDPA": F.scaled_dot_product_attention,
    }


def interleaved_min_ms(fns: dict[str, Callable[[], Any]], *, repeats: int = 31,
                       device: torch.device | str | None = None) -> dict[str, float]:
    """The fastest of ``repeats`` interleaved runs of each callable, in milliseconds (after one warm-up round).

    Each round calls every callable once (:func:`attnbook.measure.interleaved_median_ms` with one
    repeat), so load from other programs hits them alike; the minimum over the rounds is the run that
    other programs disturbed least, steadier on a shared machine than the median. A measurement:
    print it with the book's ``~``.
    """
    rounds = [interleaved_median_ms(fns, repeats=1, warmup=1 if r == 0 else 0, device=device) for r in range(repeats)]
    return {name: min(r[name] for r in rounds) for name in fns}


# --- exercise 1: the parameter count ---------------------------------------------------------

#: The known mistakes of :func:`check_param_count`: ``compute(D, H)`` is the number such an answer gives.
PARAM_MISTAKES: tuple[Mistake, ...] = (
    Mistake("weights only", lambda D, H: 4 * D * D,
            "that is the four weight matrices only: each of the four projections also has a bias vector of D numbers."),
    Mistake("no W_O", lambda D, H: 3 * D * D + 3 * D,
            "that covers W_Q, W_K and W_V: the output projection W_O (D×D plus its bias) belongs to the block too."),
    Mistake("no W_O, no biases", lambda D, H: 3 * D * D,
            "that is W_Q, W_K and W_V without biases: add the output projection W_O and the four bias vectors."),
    Mistake("no W_O bias", lambda D, H: 4 * D * D + 3 * D,
            "one bias is missing: W_Q, W_K and W_V have theirs, and the output projection W_O has one of D numbers too."),
    Mistake("one head's width", lambda D, H: 4 * D * (D // H) + 4 * (D // H),
            "that is the block for one head's width D_k: the projections map D to H·D_k = D, so each is D×D."),
    Mistake("one head's share", lambda D, H: 4 * D * (D // H),
            "that is one head's share (D×D_k per projection): the projections map D to H·D_k = D, so each is D×D (plus biases)."),
    Mistake("times H", lambda D, H: H * (4 * D * D + 4 * D),
            "you multiplied by H: the heads share the D×D projections (each head owns D_k of their output features), so H does not multiply the count."),
    Mistake("one bias per head", lambda D, H: 4 * D * D + 4 * D * H,
            "you gave every head its own bias of D numbers: each projection has one bias of D numbers, and head h "
            "uses its slice of D_k of them, so the biases add 4·D, not 4·D·H."),
    Mistake("biases of one head's width", lambda D, H: 4 * D * D + 4 * (D // H),
            "the four D×D weight matrices are right, but each bias has D numbers, not D_k: head h uses a slice of D_k "
            "of each bias, and the H slices together make the whole vector of D."),
    Mistake("one bias number per head", lambda D, H: 4 * D * D + 4 * H,
            "the four D×D weight matrices are right, but a bias is not one number per head: each projection adds a "
            "vector of D numbers (head h uses its slice of D_k of them)."),
    Mistake("one bias", lambda D, H: 4 * D * D + D, "you have one bias vector: each of the four projections has its own bias of D numbers."),
    Mistake("scalar biases", lambda D, H: 4 * (D * D + 1), "each bias is a vector of D numbers, not one number."),
    Mistake("a full D×D per head", lambda D, H: H * D * D,
            "you gave each head a full D×D matrix: the heads share the projections, each head using D_k = D / H of "
            "their output features, so H does not multiply the count. Count the matrices of the block, and their biases."),
    Mistake("two matrices", lambda D, H: 2 * D * D + 2 * D,
            "that counts two projections with their biases: the block has four, W_Q, W_K, W_V and the output projection W_O."),
    Mistake("half the width", lambda D, H: 4 * (D // 2) ** 2 + 4 * (D // 2),
            "that is the count for a model half as wide (D = 768, the BERT-base row of the chapter's table); this "
            "block has D = 1536."),
)


#: The block of exercise 5.1, ``(D, H)``: a size that no row of the chapter's parameter table shows.
PARAM_EXERCISE: tuple[int, int] = (1536, 12)


@exercise(solution=4 * 1536**2 + 4 * 1536, kind="value",
          tables=(MistakeTable(PARAM_MISTAKES, lambda: [PARAM_EXERCISE], lambda D, H: mha_param_count(D, H, bias=True)),),
          not_generic={"float16": "a count typed as a number"})
def check_param_count(answer: object, *, d_model: int = PARAM_EXERCISE[0], num_heads: int = PARAM_EXERCISE[1],
                      bias: bool = True) -> Feedback:
    """Check a number for the parameters of ``MultiHeadSelfAttention(d_model, num_heads, bias=bias)``.

    The right answer is ``4 D^2 + 4 D`` with biases (``4 D^2`` without), whatever ``H`` is. Any
    real-scalar form is accepted (``int``, an integral ``float``, NumPy integers, a 0-d tensor).
    """
    if answer is None:
        return todo("replace `None` with your number (an int), then run the cell again.")
    D, H = d_model, num_heads
    right = mha_param_count(D, H, bias=bias)
    if isinstance(answer, str):  # the reader sets a variable: say so, not "return"
        return wrong("set `answer` to a number (an int), not a string: write the digits without quotes (and without "
                     "commas; Python reads 1_000 as a thousand).")
    value, problem = check_number(answer, right, integer=True, what="a number of parameters")
    if value is None:
        return wrong(f"set `answer` to a number of parameters (an int), got {describe(answer)}.")
    if problem is None:
        extra = " Note that H never entered the formula." if bias else ""
        return correct(f"{right:,} = 4·D² + 4·D: four D×D weight matrices and four bias vectors of D.{extra}" if bias
                       else f"{right:,} = 4·D²: four D×D weight matrices, no biases.")
    if value is None or not math.isfinite(value) or not value.is_integer():
        return problem
    for m in PARAM_MISTAKES:
        if int(value) == m.compute(D, H) and m.compute(D, H) != right:
            return wrong(m.hint)
    return wrong(f"{int(value):,} is not it. Count the weight matrices (how many, what shape?) and the bias vectors; D = {D}, H = {H}.")


# --- exercise 2: multi-head attention as a loop over heads ------------------------------------

#: The loop checker's modules and inputs ``(D, H, B, S, dtype)``: the second differs in every size and the dtype.
LOOP_CASES: tuple[tuple[int, int, int, int, torch.dtype], ...] = ((12, 3, 2, 5, torch.float32), (15, 5, 3, 4, torch.float64))


def _reference_module(case: int = 0) -> tuple[MultiHeadSelfAttention, Tensor]:
    D, H, B, S, dtype = LOOP_CASES[case]
    with torch.random.fork_rng(devices=[]):  # leave the reader's random state alone
        torch.manual_seed(5 + case)
        module = MultiHeadSelfAttention(D, H, bias=True)  # D_k = D / H
        with torch.no_grad():
            for p in module.parameters():  # larger weights make every mistake visible
                p.mul_(3.0)
        x = torch.randn(B, S, D)  # [B, S, D]
    return module.to(dtype), x.to(dtype)


def _loop(module: MultiHeadSelfAttention, x: Tensor, *, scale: float | None = None, dim: int | tuple[int, int] = -1, use_wo: bool = True,
          qkv_bias: bool = True, wo_bias: bool = True, columns: bool = False, merge: str = "cat", transposed: bool = False,
          wo_bias_per_head: bool = False, same_slice: bool = False, scale_after: bool = False,
          weights_transposed: bool = False, keys_from_w_q: bool = False, causal: bool = False,
          strided: bool = False, wo_untransposed: bool = False) -> Tensor:
    """The per-head loop with one thing changed (a typical mistake); the defaults give the right answer."""
    d_k, H = module.d_k, module.num_heads
    heads = []
    for h in range(H):
        sl = slice(0, d_k) if same_slice else slice(h, None, H) if strided else slice(h * d_k, (h + 1) * d_k)

        def project(lin: torch.nn.Linear) -> Tensor:
            w = lin.weight[:, sl] if columns else lin.weight[sl].T  # [D, D_k]
            return x @ w + (lin.bias[sl] if qkv_bias else 0.0)  # [B, S, D_k]

        q, k, v = project(module.w_q), project(module.w_q if keys_from_w_q else module.w_k), project(module.w_v)  # each [B, S, D_k]
        s = 1.0 / math.sqrt(d_k) if scale is None else scale
        scores = (k @ q.transpose(-2, -1) if transposed else q @ k.transpose(-2, -1)) * (1.0 if scale_after else s)  # [B, S, S]
        if causal:  # a causal mask, as in chapter 4's decoder
            S = scores.shape[-1]
            scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool, device=scores.device).triu(1), float("-inf"))
        if isinstance(dim, tuple):  # one softmax over the whole [S, S] matrix
            weights = torch.softmax(scores.flatten(-2), dim=-1).view_as(scores)
        else:
            weights = torch.softmax(scores, dim=dim)
        if weights_transposed:
            weights = weights.transpose(-2, -1)  # [B, S_k, S_q]
        heads.append(weights @ v * (s if scale_after else 1.0))  # [B, S, D_k]
    if wo_bias_per_head:  # each head through its block of W_O, with the bias added every time
        return sum(heads[h] @ module.w_o.weight[:, h * d_k:(h + 1) * d_k].T + module.w_o.bias for h in range(H))  # [B, S, D]
    if merge == "cat":
        merged = torch.cat(heads, dim=-1)  # [B, S, D]
    elif merge == "reverse":
        merged = torch.cat(heads[::-1], dim=-1)  # [B, S, D], heads in reverse order
    elif merge == "stack heads":  # stack(1).reshape: the head axis is not moved back behind the positions
        merged = torch.stack(heads, dim=1).reshape(x.shape[0], x.shape[1], -1)  # [B, H, S, D_k] -> [B, S, D]
    else:  # "stack": stack(-1).flatten(-2) interleaves the heads' features
        merged = torch.stack(heads, dim=-1).flatten(-2)  # [B, S, D_k, H] -> [B, S, D]
    if not use_wo:
        return merged
    if wo_untransposed:  # W_O's weight as stored, [out, in]: merged @ weight (= F.linear(merged, weight.T))
        return merged @ module.w_o.weight + (module.w_o.bias if wo_bias else 0.0)  # [B, S, D]
    return merged @ module.w_o.weight.T + (module.w_o.bias if wo_bias else 0.0)  # [B, S, D]


#: The known mistakes of :func:`check_per_head_loop`: ``compute(module, x)`` is what such a loop returns.
LOOP_MISTAKES: tuple[Mistake, ...] = (
    Mistake("no W_O", lambda m, x: _loop(m, x, use_wo=False),
            "this is the concatenation of the heads without the output projection: finish with module.w_o(...)."),
    Mistake("no q/k/v biases", lambda m, x: _loop(m, x, qkv_bias=False),
            "you left out the biases of the q, k and v projections: head h adds the slice module.w_q.bias[h·D_k:(h+1)·D_k] "
            "(and likewise for w_k and w_v) to x @ W[rows].T."),
    Mistake("no W_O bias", lambda m, x: _loop(m, x, wo_bias=False),
            "everything is right except the output projection's bias: module.w_o(...) adds it, a bare @ module.w_o.weight.T does not."),
    Mistake("no biases at all", lambda m, x: _loop(m, x, qkv_bias=False, wo_bias=False),
            "you left out every bias: the q, k and v projections (the slice of each bias that belongs to head h) and W_O's."),
    Mistake("W_O bias once per head", lambda m, x: _loop(m, x, wo_bias_per_head=True),
            "summing the heads through their blocks of W_O is right, but you added W_O's bias once per head (H times): "
            "add it once, after the sum."),
    Mistake("stack + flatten", lambda m, x: _loop(m, x, merge="stack"),
            "you merged the heads with torch.stack(heads, -1).flatten(-2): that interleaves them (feature 0 of every head, then "
            "feature 1, ...). Head h's output must fill features h·D_k .. (h+1)·D_k - 1: use torch.cat(heads, dim=-1)."),
    Mistake("stack on the head axis + reshape", lambda m, x: _loop(m, x, merge="stack heads"),
            "you stacked the heads as [B, H, S, D_k] and reshaped to [B, S, D] without moving the head axis back: "
            "the reshape then cuts each head's [S, D_k] block into rows, mixing heads and positions (chapter 6's "
            "silent bug). Transpose to [B, S, H, D_k] first, or concatenate with torch.cat(heads, dim=-1)."),
    Mistake("scaled by sqrt(D)", lambda m, x: _loop(m, x, scale=1.0 / math.sqrt(m.d_model)),
            "you scaled by 1/sqrt(D); each head scales by 1/sqrt(D_k), D_k = D / H."),
    Mistake("scaled by sqrt(H)", lambda m, x: _loop(m, x, scale=1.0 / math.sqrt(m.num_heads)),
            "you scaled by 1/sqrt(H), the number of heads; each head scales by 1/sqrt(D_k), its own width."),
    Mistake("not scaled", lambda m, x: _loop(m, x, scale=1.0),
            "the scores are not scaled: divide q_h k_h^T by sqrt(D_k). (Dividing by int(math.sqrt(D_k)) or "
            "math.isqrt(D_k) rounds the root down, to 1 for D_k = 3: use math.sqrt(D_k) itself.)"),
    Mistake("divided by D_k", lambda m, x: _loop(m, x, scale=1.0 / m.d_k),
            "your scores are divided by D_k (as dividing by D_k, or scaling both q and k by 1/sqrt(D_k), does): "
            "divide q_h k_h^T by sqrt(D_k) once."),
    Mistake("softmax over queries", lambda m, x: _loop(m, x, dim=-2),
            "your softmax normalises over the queries (dim=-2): each query's weights over the keys must sum to 1, so use dim=-1."),
    Mistake("softmax without dim", lambda m, x: _loop(m, x, dim=0),
            "your softmax normalises over the batch axis: F.softmax called without dim picks dim 0 for a 3-D tensor "
            "(PyTorch warns that this implicit choice is deprecated), so each weight is shared out among the B "
            "sequences. Always name the axis: each query's weights over the keys must sum to 1."),
    Mistake("softmax over the whole matrix", lambda m, x: _loop(m, x, dim=(-2, -1)),
            "your softmax normalises over the whole [S, S] matrix of a head, so each row sums to less than 1: each query's "
            "weights over the keys must sum to 1, softmax(..., dim=-1)."),
    Mistake("k @ q^T", lambda m, x: _loop(m, x, transposed=True),
            "your scores are k_h @ q_h^T, the transpose: row i must hold query i's scores against every key, q_h @ k_h^T."),
    Mistake("same slice for every head", lambda m, x: _loop(m, x, same_slice=True),
            "every head uses the same slice, rows 0 .. D_k - 1 of the weights: head h takes rows h·D_k .. (h+1)·D_k - 1 "
            "(and the same slice of each bias), so the slice must depend on h."),
    Mistake("scaled after the softmax", lambda m, x: _loop(m, x, scale_after=True),
            "you scaled after the softmax (softmax(q_h k_h^T) @ v_h / sqrt(D_k)): the scale belongs inside, on the "
            "scores, softmax(q_h k_h^T / sqrt(D_k)) @ v_h. Scaling afterwards only shrinks the output, while the "
            "weights stay as peaked as without any scale."),
    Mistake("weights^T @ v", lambda m, x: _loop(m, x, weights_transposed=True),
            "you multiplied the transposed weights by v (weights.transpose(-2, -1) @ v_h): row i of the weights is "
            "query i's share over the keys, so query i's output is row i of the weights times v_h: weights @ v_h, with no transpose."),
    Mistake("keys from w_q", lambda m, x: _loop(m, x, keys_from_w_q=True),
            "your keys come from w_q: k_h is x @ module.w_k.weight[rows].T + module.w_k.bias[rows], with w_k's rows."),
    Mistake("reversed heads", lambda m, x: _loop(m, x, merge="reverse"),
            "the heads are concatenated in reverse order: head h's output goes to features h·D_k .. (h+1)·D_k - 1."),
    Mistake("causal mask", lambda m, x: _loop(m, x, causal=True),
            "your heads use a causal mask (each query sees only itself and earlier positions): this block is "
            "unmasked, as module(x) is called with no mask, so every query sees every key."),
    Mistake("every H-th feature", lambda m, x: _loop(m, x, strided=True),
            "head h takes every H-th feature (rows h, h + H, h + 2H, ...): the heads are contiguous slices, head h "
            "owns rows h·D_k .. (h+1)·D_k - 1 of each weight and bias (chapter 6 shows what the split [B, S, H, D_k] means)."),
    Mistake("weight columns", lambda m, x: _loop(m, x, columns=True),
            "you sliced the columns of the weight matrices (x @ module.w_q.weight[:, sl], or x @ module.w_q.weight "
            "without .T and then a slice of its output): nn.Linear stores weight as [out, in], so head h "
            "uses rows h·D_k .. (h+1)·D_k - 1 (module.w_q.weight[sl]) and computes x @ W[sl].T + b[sl]."),
    Mistake("W_O without .T", lambda m, x: _loop(m, x, wo_untransposed=True),
            "everything up to the output projection is right, but you applied W_O transposed: nn.Linear stores "
            "module.w_o.weight as [out, in], so a bare merged @ module.w_o.weight (or head h's rows "
            "module.w_o.weight[h·D_k:(h+1)·D_k]) multiplies by the transpose. Write module.w_o(merged), or "
            "merged @ module.w_o.weight.T + module.w_o.bias. The slip also comes the other way: "
            "F.linear(merged, module.w_o.weight.T, ...) is wrong, because F.linear transposes for you."),
)


_NO_FORWARD = "the exercise asks for the per-head loop: do not call the module itself"

_NO_SPLIT_HEADS = (
    "your loop calls split_heads: the exercise asks you to take head h's rows of each weight (and slice of each "
    "bias) yourself, module.w_q.weight[h·D_k:(h+1)·D_k], inside the loop over the heads."
)

_NO_LOOP = (
    "your code computes the scores or weights of all heads at once, as one [B, H, S, S] tensor: the exercise asks "
    "for a loop over the heads, one head's [B, S, S] attention at a time from its own rows of the weights."
)

_NO_SDPA = (
    "you called F.scaled_dot_product_attention: the exercise asks you to write each head's attention yourself, "
    "softmax(q_h k_h^T / sqrt(D_k)) v_h with torch.softmax, one head at a time from its rows of the weights."
)


_CAT_AXIS = {
    1: "you concatenated the heads along dim=1 (torch.cat(heads, dim=1), or torch.hstack): each head's output is "
       "[B, S, D_k], so dim=1 is the positions axis, and the heads end up one after another as H·S positions of "
       "width D_k instead of side by side in one position's features. Concatenate along the last axis, the "
       "features: torch.cat(heads, dim=-1), which gives [B, S, H·D_k] = [B, S, D] for w_o.",
    0: "you concatenated the heads along dim=0 (torch.cat(heads), whose default is dim=0, or torch.vstack): each "
       "head's output is [B, S, D_k], so dim=0 is the batch axis, and the heads end up as H·B separate sequences. "
       "Concatenate along the last axis, the features: torch.cat(heads, dim=-1), which gives [B, S, H·D_k] = "
       "[B, S, D] for w_o.",
}


class _NoForward(MultiHeadSelfAttention):
    def forward(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        raise RuntimeError(_NO_FORWARD)


class _AllHeadsSpy(TorchDispatchMode):  # type: ignore[misc, valid-type]
    """Record what the reader's loop does that the result alone cannot show: an operation that produces a
    tensor of shape ``[B, H, S, S]`` (all heads' scores at once), a tensor computed in float16 or bfloat16
    (``"torch.float16"``), and the H heads' ``[B, S, D_k]`` outputs concatenated on another axis than the
    last (``"cat dim 0"``, ``"cat dim 1"``)."""

    def __init__(self, shape: tuple[int, ...], used: set[str], d_k: int = 0,
                 module: MultiHeadSelfAttention | None = None) -> None:
        super().__init__()
        self.shape, self.used = shape, used
        B, H, S, _ = shape
        self.num_heads, self.head_out = H, (B, S)  # each head's output is [B, S, D_k]
        self.d_k = d_k
        # the memory of the module's q/k/v biases and of W_O's weight, to name what an operation that fails was given
        self.qkv_biases = set() if module is None else {
            lin.bias.untyped_storage().data_ptr() for lin in (module.w_q, module.w_k, module.w_v) if lin.bias is not None}
        self.w_o = None if module is None else module.w_o.weight.untyped_storage().data_ptr()
        self.d_model = 0 if module is None else module.d_model

    def _failed(self, args: Any, kwargs: Any) -> None:
        """Record what an operation that raised was given: a whole q/k/v bias ``[D]`` (added to a head's
        ``[B, S, D_k]`` projection), or a ``[D, D_k]`` piece of W_O's weight (a head's output multiplied by it)."""
        for t in tree_flatten((args, kwargs))[0]:
            if not isinstance(t, Tensor):
                continue
            try:
                ptr = t.untyped_storage().data_ptr()
            except Exception:  # a tensor without storage (a meta or fake tensor) belongs to neither
                continue
            if ptr in self.qkv_biases and tuple(t.shape) == (self.d_model,):
                self.used.add("whole q/k/v bias")
            if ptr == self.w_o and tuple(t.shape) == (self.d_model, self.d_k):
                self.used.add("W_O piece [D, D_k]")

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if (func is torch.ops.aten.permute.default and len(args) > 1 and isinstance(args[0], Tensor)
                and args[0].dim() == 3 and list(args[1]) == [2, 1, 0]):
            self.used.add(".T of a 3-D tensor")  # .T reverses every axis: [B, S, D_k] -> [D_k, S, B]
        try:
            out = func(*args, **(kwargs or {}))
        except Exception:
            self._failed(args, kwargs)
            raise
        if isinstance(out, Tensor):
            if tuple(out.shape) == self.shape:
                self.used.add("all heads at once")
            if out.dtype in (torch.float16, torch.bfloat16) and out.numel() > 1:  # not a 0-d constant
                self.used.add(str(out.dtype))
        if func is torch.ops.aten.cat.default and args and isinstance(args[0], (list, tuple)):
            parts = args[0]
            dim = args[1] if len(args) > 1 else (kwargs or {}).get("dim", 0)
            if (len(parts) == self.num_heads and all(isinstance(p, Tensor) and p.dim() == 3 for p in parts)
                    and all(tuple(p.shape[:2]) == self.head_out for p in parts)):
                widths = [p.shape[2] for p in parts]
                if len(set(widths)) == 1 and widths[0] != self.d_k:
                    self.used.add(f"head width {widths[0]}")
                # a slice one row too long is D_k + 1 wide in every head but the last, which the weight's end
                # cuts back to D_k
                if widths == [self.d_k + 1] * (self.num_heads - 1) + [self.d_k]:
                    self.used.add(f"head width {self.d_k + 1}")
                if len({tuple(p.shape) for p in parts}) == 1 and dim % 3 != 2:
                    self.used.add(f"cat dim {dim % 3}")
        return out


@contextmanager
def _loop_guard(all_heads_shape: tuple[int, ...] = (), d_k: int = 0,
                module: MultiHeadSelfAttention | None = None) -> Iterator[set[str]]:
    """While the reader's loop runs: refuse the module's own forward however it is reached (also
    ``MultiHeadSelfAttention.forward(module, x)``), and record calls of F.scaled_dot_product_attention,
    of ``split_heads`` (however it was imported: its code object is watched) and any tensor of shape
    ``all_heads_shape`` (``[B, H, S, S]``); with ``module``, also what a failing operation was given of
    its weights (:class:`_AllHeadsSpy`)."""
    used: set[str] = set()
    forward, sdpa = MultiHeadSelfAttention.forward, F.scaled_dot_product_attention
    split_code, old_profile = split_heads.__code__, sys.getprofile()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is split_code:
            used.add("split_heads")

    def no_forward(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(_NO_FORWARD)

    def spy_sdpa(*args: Any, **kwargs: Any) -> Any:
        used.add("scaled_dot_product_attention")
        return sdpa(*args, **kwargs)

    MultiHeadSelfAttention.forward = no_forward  # type: ignore[method-assign]
    F.scaled_dot_product_attention = spy_sdpa
    sys.setprofile(profile)
    try:
        if all_heads_shape:
            with _AllHeadsSpy(all_heads_shape, used, d_k, module):
                yield used
        else:
            yield used
    finally:
        sys.setprofile(old_profile)
        MultiHeadSelfAttention.forward = forward  # type: ignore[method-assign]
        F.scaled_dot_product_attention = sdpa


_THREE_D_T = (
    "your code transposed a 3-D tensor with .T (k.T, for instance): for a tensor with more than two axes .T "
    "reverses all of them, so k [B, S, D_k] becomes [D_k, S, B] and the batch axis moves too, which is why the "
    "matmul could not broadcast. Swap only the last two axes, with transpose(-2, -1) (or .mT)."
)


def _weight_layout_hint(message: str, rows: int, d: int, d_k: int) -> str | None:
    """The hint for ``x @ lin.weight[rows]`` without ``.T``: PyTorch's message names ``[B·S, D]`` and ``[D_k, D]``."""
    found = re.search(r"shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)", message)
    if found is None or [int(g) for g in found.groups()] != [rows, d, d_k, d]:
        return None
    return ("your code multiplied x [B, S, D] by a head's slice of a weight as it is stored, [D_k, D]: nn.Linear "
            "keeps weight as [out, in], one row per output feature, so head h's rows have to be transposed to "
            "[D, D_k] before x can multiply them.")


_WHOLE_BIAS = (
    "you added the whole bias (D numbers) to head h's [B, S, D_k] projection: take the same slice of the bias as "
    "of the weight, rows h·D_k .. (h+1)·D_k - 1 of both (F.linear(x, W[rows], b) needs b[rows] too)."
)

_W_O_PIECE = (
    "you multiplied head h's output [B, S, D_k] by a [D, D_k] piece of W_O (module.w_o.weight[rows].T, or "
    "module.w_o.weight[:, rows] without .T). nn.Linear stores module.w_o.weight as [out, in] = [D, H·D_k], so the "
    "D_k inputs that head h feeds are its columns h·D_k .. (h+1)·D_k - 1, and the product needs them as [D_k, D], "
    "that is module.w_o.weight[:, rows].T; add module.w_o.bias once, after summing the heads (or concatenate the "
    "heads and call module.w_o)."
)


def _module_changes(module: torch.nn.Module, before: dict[str, Tensor]) -> list[str]:
    """The entries of ``module``'s state that differ from ``before`` (a copy taken before the reader's loop ran).

    A change of dtype alone (``module.float()``, ``module.to(torch.float16)``) is left to the precision hints."""
    after = module.state_dict()
    changed = sorted(set(before) ^ set(after))
    for name in sorted(set(before) & set(after)):
        old, new = before[name], after[name].detach()
        if old.shape != new.shape:
            changed.append(name)
            continue
        try:
            same = torch.equal(old.to(new.dtype), new.cpu())
        except Exception:  # a state entry that cannot be compared any more has been changed in some way
            same = False
        if not same:
            changed.append(name)
    return sorted(changed)


def _module_changed_hint(names: list[str]) -> str:
    listed = ", ".join(f"module.{n}" for n in names[:3]) + (" ..." if len(names) > 3 else "")
    return (f"your loop changed the module itself ({listed}): an in-place operation on a weight or bias (mul_, /= "
            "under torch.no_grad(), an assignment to .data) or a new layer assigned to module.w_q changes every later "
            "call of the module. Only read the weights: compute new tensors from them (q = x @ W[rows].T + b[rows]) "
            "and scale the scores, not the weights.")


def _slice_width_hint(width: int, d_k: int) -> str:
    return (f"a head's output has {width} features, not D_k = {d_k}: each head's slice must hold D_k rows of "
            "each weight and bias. The end of h*d_k:(h+1)*d_k is exclusive, so slice(h * d_k, (h + 1) * d_k) "
            "already stops at row (h+1)·D_k - 1; a - 1 (or + 1) at the end makes it one row short (or long).")


def _hard_coded_hint(case: int) -> str:
    D, H = LOOP_CASES[case][:2]
    return (f"your loop is right for the first module (D = {LOOP_CASES[0][0]}, H = {LOOP_CASES[0][1]}) but not for "
            f"this one (D = {D}, H = {H}, D_k = {D // H}): did you hard-code D_k or H? Use module.d_k and "
            "module.num_heads, so the loop fits any module.")


def _loop_one(fn: Callable[[Tensor, MultiHeadSelfAttention], Tensor], case: int) -> Feedback | None:
    ref, x = _reference_module(case)
    D, H = LOOP_CASES[case][:2]
    with torch.random.fork_rng(devices=[]):  # a new module draws its initial weights: leave the reader's random state alone
        module = _NoForward(D, H, bias=True).to(x.dtype)
    module.load_state_dict(ref.state_dict())
    with torch.no_grad():
        expected = ref(x).hidden_states  # [B, S, D]
    B, S = x.shape[:2]
    state = {name: t.detach().clone() for name, t in module.state_dict().items()}
    with _loop_guard((B, H, S, S), D // H, module) as used:
        got, fb = run_reader_code(fn, x.clone(), module)
    if fb is None or fb.status == "wrong":
        changed = _module_changes(module, state)
        if changed:
            return wrong(_module_changed_hint(changed))
    for dim in (0, 1):
        if f"cat dim {dim}" in used and (fb is not None or not close(got, expected)):
            return wrong(_CAT_AXIS[dim])
    width = next((w for w in used if w.startswith("head width ")), None)
    if width is not None and (fb is not None or not close(got, expected)):
        return wrong(_slice_width_hint(int(width.rsplit(" ", 1)[1]), D // H))
    if fb is not None and fb.status == "wrong" and fb.message.startswith("your code raised"):
        if "whole q/k/v bias" in used:
            return wrong(_WHOLE_BIAS)
        if "W_O piece [D, D_k]" in used:
            return wrong(_W_O_PIECE)
        if ".T of a 3-D tensor" in used:
            return wrong(_THREE_D_T)
        layout = _weight_layout_hint(fb.message, B * S, D, D // H)
        if layout is not None:
            return wrong(layout)
    if fb is not None:
        if case > 0 and fb.status == "wrong" and fb.message.startswith("your code raised"):
            return wrong(_hard_coded_hint(case))
        return fb
    if "scaled_dot_product_attention" in used:
        return wrong(_NO_SDPA)
    if "split_heads" in used:
        return wrong(_NO_SPLIT_HEADS)
    if "all heads at once" in used:
        return wrong(_NO_LOOP)
    if not isinstance(got, Tensor):
        return wrong(f"return a torch.Tensor of shape [B, S, D] = {tuple(expected.shape)}, got {describe(got)}.")
    if tuple(got.shape) != tuple(expected.shape):
        if case > 0 and got.dim() == 3:
            return wrong(_hard_coded_hint(case))
        if got.dim() == 4:
            return wrong(f"your result has shape {tuple(got.shape)}: concatenate the heads' outputs along the "
                         "last axis (torch.cat(heads, dim=-1)) and apply w_o.")
        return wrong(f"your result has shape {tuple(got.shape)}, expected [B, S, D] = {tuple(expected.shape)} "
                     f"(D = {D}, H = {H} heads of D_k = {D // H}).")
    if got.dtype == torch.float32 and x.dtype == torch.float64:  # half precision is named by the guard
        return wrong("your result is torch.float32, but x and the module are torch.float64: compute in the dtype of "
                     "the inputs (a cast to a smaller float drops the precision that the inputs carry).")
    half = next((h for h in ("torch.float16", "torch.bfloat16") if h in used), None)
    if half is not None:  # the dtype rule: compute in the inputs' dtype or wider
        returned_half = got.dtype in (torch.float16, torch.bfloat16)
        named = low_precision(got, expected, name="your result") if returned_half else None
        if named is not None:
            return named
        worst = float((got.detach().cpu().to(torch.float64) - expected.to(torch.float64)).abs().max())
        return wrong(f"your loop computed in {half} inside (a {half} tensor appeared in it), though x and the module "
                     f"are {x.dtype}: {half} keeps only about {2 if 'bfloat16' in half else 3} significant digits, "
                     f"so your result is off by up to {worst:.1g}"
                     + ("" if returned_half else ", even after casting back") + ". Compute in the inputs' dtype or "
                     "wider; a cast to a narrower float drops the precision the inputs carry.")
    with torch.no_grad():
        if close(got, expected):
            if x.dtype == torch.float64 and not close(got, expected, atol=1e-9, rtol=1e-9):
                worst = float((got.detach().cpu().to(torch.float64) - expected).abs().max())
                return wrong(f"your result is torch.float64 but only as precise as float32 (it differs from the float64 "
                             f"reference by up to {worst:.1e}): somewhere you computed in float32 and cast back. "
                             "Compute in the dtype of the inputs, which carry float64 precision.")
            return None
        hint = diagnose(got, LOOP_MISTAKES, ref, x)
    if hint is not None:
        return hint
    if got.is_complex() or not torch.isfinite(got.detach()).all():
        return wrong("your result contains NaN or inf (or is not real).")
    if case > 0:  # right on the first module, wrong here
        return wrong(_hard_coded_hint(case))
    worst = float((got.detach().cpu().to(torch.float64) - expected.to(torch.float64)).abs().max())
    return wrong(
        f"the shape is right but the numbers differ (largest difference {worst:.3g}, for D = {D}, H = {H}). Compare "
        "one head at a time with the module's own: its rows of each weight matrix and slice of each bias "
        "(nn.Linear stores [out, in]), the scale 1/sqrt(D_k), softmax over the keys (dim=-1), then torch.cat and w_o."
    )


def _solution_loop(x: Tensor, module: MultiHeadSelfAttention) -> Tensor:
    d_k = module.d_k
    heads = []
    for h in range(module.num_heads):
        rows = slice(h * d_k, (h + 1) * d_k)
        q, k, v = (x @ lin.weight[rows].T + lin.bias[rows] for lin in (module.w_q, module.w_k, module.w_v))  # [B, S, D_k]
        heads.append(torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1) @ v)  # [B, S, D_k]
    return module.w_o(torch.cat(heads, dim=-1))  # [B, S, D]


def _loop_reference(module: MultiHeadSelfAttention, x: Tensor) -> Tensor:
    with torch.no_grad():
        return module(x).hidden_states


@exercise(solution=_solution_loop,
          tables=(MistakeTable(LOOP_MISTAKES, lambda: [_reference_module(c) for c in range(len(LOOP_CASES))], _loop_reference),))
def check_per_head_loop(fn: Callable[[Tensor, MultiHeadSelfAttention], Tensor]) -> Feedback:
    """Check ``fn(x, module) -> [B, S, D]``, multi-head attention written as a loop over heads.

    ``x: [B, S, D]``; ``module`` is a :class:`MultiHeadSelfAttention` (no mask), biases on. The
    checker tries the cases of :data:`LOOP_CASES` (``D = 12, H = 3`` in float32, then ``D = 15,
    H = 5`` in float64) and compares with ``module(x).hidden_states``. The module passed in cannot
    be called directly (that would skip the exercise), and a version that calls ``split_heads``,
    ``F.scaled_dot_product_attention`` or computes all heads' ``[B, H, S, S]`` scores at once (no loop)
    is refused with a hint that says so, and so is one that changes the module's weights or biases.
    """
    for case in range(len(LOOP_CASES)):
        problem = _loop_one(fn, case)
        if problem is not None:
            return problem
    return correct("your loop matches the batched module: the heads are independent until W_O mixes them.")


# --- exercise 3: the bytes of the weights ----------------------------------------------------


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


#: The configurations :func:`check_weights_bytes` tries, ``(B, H, S, dtype)``: four dtypes of 2, 4 and 8 bytes.
BYTES_CONFIGS: tuple[tuple[int, int, int, torch.dtype], ...] = (
    (1, 12, 128, torch.float32), (3, 32, 4096, torch.float16), (3, 8, 100, torch.bfloat16), (4, 1, 7, torch.float32),
    (2, 5, 9, torch.float64),
)

#: The known mistakes of :func:`check_weights_bytes`: ``compute(B, H, S, dtype)`` is what such a formula returns.
BYTES_MISTAKES: tuple[Mistake, ...] = (
    Mistake("elements", lambda B, H, S, dt: B * H * S * S,
            "That is the number of elements: multiply by the bytes per element (torch.empty((), dtype=dtype).element_size())."),
    Mistake("always 4 bytes", lambda B, H, S, dt: B * H * S * S * 4,
            "You used 4 bytes per element for every dtype; use torch.empty((), dtype=dtype).element_size() "
            "(4 for float32, 2 for float16 and bfloat16, 8 for float64)."),
    Mistake("always 2 bytes", lambda B, H, S, dt: B * H * S * S * 2,
            "You hard-coded 2 bytes per element: right for float16 and bfloat16, not for float32 (4) or float64 (8). "
            "Use torch.empty((), dtype=dtype).element_size()."),
    Mistake("bytes from the dtype's name", lambda B, H, S, dt: B * H * S * S * (2 if "16" in str(dt) else 4),
            "Your bytes per element are right for float32, float16 and bfloat16 but not for float64 (8 bytes): read "
            "them from the dtype, torch.empty((), dtype=dtype).element_size() (or dtype.itemsize)."),
    Mistake("no H", lambda B, H, S, dt: B * S * S * _size(dt), "Each of the H heads has its own S×S weights: multiply by H."),
    Mistake("S, not S²", lambda B, H, S, dt: B * H * S * _size(dt), "Each head stores one weight per (query, key) pair: S·S, not S."),
    Mistake("no B", lambda B, H, S, dt: H * S * S * _size(dt), "Every sequence in the batch has its own weights: multiply by B."),
    Mistake("4 for float32, else 2", lambda B, H, S, dt: B * H * S * S * (4 if dt == torch.float32 else 2),
            "Your bytes per element are right for float32, float16 and bfloat16 but not for float64 (8 bytes): read "
            "them from the dtype, torch.empty((), dtype=dtype).element_size() (or dtype.itemsize), instead of "
            "listing the dtypes you thought of."),
    Mistake("bits", lambda B, H, S, dt: B * H * S * S * _size(dt) * 8, "A factor 8 too large: bytes, not bits."),
    Mistake("GiB", lambda B, H, S, dt: B * H * S * S * _size(dt) / 2**30,
            "Those are GiB (you divided by 2**30): the function returns bytes."),
    Mistake("MiB", lambda B, H, S, dt: B * H * S * S * _size(dt) / 2**20,
            "Those are MiB (you divided by 2**20): the function returns bytes."),
    Mistake("GB", lambda B, H, S, dt: B * H * S * S * _size(dt) / 1e9,
            "Those are GB (you divided by 1e9; a GiB is 2**30 bytes): the function returns bytes."),
    Mistake("whole MiB, floored", lambda B, H, S, dt: B * H * S * S * _size(dt) // 2**20,
            "Those are whole MiB, rounded down (// 2**20, or int(... / 2**20)): everything under 1 MiB is lost, "
            "so weights smaller than 1 MiB come out as 0. The function returns the exact number of bytes, an int: "
            "no conversion to MiB and no rounding."),
    Mistake("whole MiB, rounded", lambda B, H, S, dt: round(B * H * S * S * _size(dt) / 2**20),
            "Those are MiB rounded to a whole number (round(... / 2**20)): the function returns the exact number "
            "of bytes, an int, with no conversion to MiB and no rounding."),
    Mistake("MiB to 2 decimals", lambda B, H, S, dt: round(B * H * S * S * _size(dt) / 2**20, 2),
            "Those are MiB rounded to 2 decimals (round(... / 2**20, 2)), the way the chapter prints sizes: the "
            "function returns the exact number of bytes, an int, with no conversion and no rounding."),
    Mistake("whole GiB", lambda B, H, S, dt: round(B * H * S * S * _size(dt) / 2**30),
            "Those are whole GiB (/ 2**30, then rounded or floored): the function returns the exact number of "
            "bytes, an int, with no conversion and no rounding."),
    Mistake("MB", lambda B, H, S, dt: B * H * S * S * _size(dt) / 1e6,
            "Those are MB (you divided by 1e6; a MiB is 2**20 bytes): the function returns bytes, with no conversion."),
    Mistake("KiB", lambda B, H, S, dt: B * H * S * S * _size(dt) / 2**10,
            "Those are KiB (you divided by 2**10 = 1024): the function returns bytes."),
    Mistake("causal triangle", lambda B, H, S, dt: B * H * (S * (S + 1) // 2) * _size(dt),
            "You counted only the causal triangle, S(S+1)/2 per head: the weights tensor is a full [B, H, S, S] "
            "(masked entries are stored as zeros), S·S per head."),
    Mistake("scores and weights", lambda B, H, S, dt: 2 * B * H * S * S * _size(dt),
            "That is twice the weights: the scores and the weights together. The question asks for the weights alone."),
)


_ALLOCATED = (
    "your function allocates the [B, H, S, S] tensor (torch.empty, zeros, ones, rand... with that many elements; "
    "for B = 3, H = 32, S = 4096 in float16 that is 3 GiB): the exercise asks for its size without allocating it. "
    "Multiply the numbers of elements, B·H·S·S, by the bytes per element; if you want a tensor to ask, "
    "create it on the meta device (device=\"meta\"), which records the shape and allocates nothing."
)

_FACTORIES = frozenset({"empty", "empty_strided", "zeros", "ones", "full", "rand", "randn", "randint", "randperm",
                        "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "empty_like",
                        "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like", "arange"})


class _NoAllocation(TorchDispatchMode):  # type: ignore[misc, valid-type]
    """Refuse, before it allocates, a tensor factory call (``torch.empty``, ``zeros``, ``ones``, ``full``,
    ``rand*``, ``new_*``, ``*_like``) whose result would have at least ``limit`` elements on a device other
    than ``meta``; the refusal is recorded in ``used``."""

    def __init__(self, limit: int, used: set[str]) -> None:
        super().__init__()
        self.limit, self.used = limit, used

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in _FACTORIES:
            like = args[0] if args and isinstance(args[0], Tensor) else None
            size = None
            if name.endswith("_like"):
                size = like.shape if like is not None else None
            elif name.startswith("new_"):
                size = args[1] if len(args) > 1 else kwargs.get("size")
            elif name in ("full", "randint"):
                size = next((a for a in args if isinstance(a, (list, tuple))), kwargs.get("size"))
            elif name not in ("randperm", "arange"):
                size = args[0] if args else kwargs.get("size")
            numel = math.prod(int(n) for n in size) if isinstance(size, (list, tuple, torch.Size)) else 0
            if name in ("randperm", "arange"):
                numel = int(args[0]) if args and isinstance(args[0], (int, float)) and name == "randperm" else 0
            device = kwargs.get("device") or (like.device if like is not None else None)
            if numel >= self.limit and (device is None or torch.device(device).type != "meta"):
                self.used.add("allocated")
                raise MemoryError(_ALLOCATED)
        return func(*args, **kwargs)


def _bytes_vector(f: Callable[[int, int, int, torch.dtype], Any]) -> tuple[Any, ...]:
    return tuple(f(*c) for c in BYTES_CONFIGS)


def _bytes_same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(math.isclose(float(x), float(y), rel_tol=1e-9) for x, y in zip(a, b))


def _solution_bytes(batch: int, num_heads: int, seq_len: int, dtype: torch.dtype) -> int:
    return batch * num_heads * seq_len * seq_len * torch.empty((), dtype=dtype).element_size()


@exercise(solution=_solution_bytes,
          tables=(MistakeTable(tuple(Mistake(m.name, lambda m=m: _bytes_vector(m.compute), m.hint) for m in BYTES_MISTAKES),
                               lambda: [()], lambda: _bytes_vector(attention_weights_bytes), same=_bytes_same),),
          not_generic={"float16": "the answer is a count"})
def check_weights_bytes(fn: Callable[[int, int, int, torch.dtype], int]) -> Feedback:
    """Check ``fn(batch, num_heads, seq_len, dtype) -> int``, the bytes of ``[B, H, S, S]`` weights.

    Tried on every configuration of :data:`BYTES_CONFIGS` (float32, float16, bfloat16, float64) and
    compared with ``torch.empty(B, H, S, S, dtype=dtype).nbytes`` (on the meta device, so nothing is
    allocated). The answers on all configurations together identify a known mistake.
    """
    answers, expected = [], []
    floats: list[bool] = []
    for B, H, S, dtype in BYTES_CONFIGS:
        used: set[str] = set()
        with _NoAllocation(B * H * S * S, used):
            got, fb = run_reader_code(fn, B, H, S, dtype)
        if "allocated" in used:
            return wrong(_ALLOCATED)
        if fb is not None:
            if fb.status == "wrong" and fb.message.startswith("your code raised KeyError") and str(dtype) in fb.message:
                return wrong(f"your code raised KeyError for {dtype}: a table of bytes per dtype misses it. Read the "
                             "size from the dtype itself, torch.empty((), dtype=dtype).element_size() (or "
                             "dtype.itemsize), which knows every dtype (float32, float16, bfloat16, float64, ...).")
            return fb
        right = torch.empty(B, H, S, S, dtype=dtype, device="meta").nbytes
        assert right == attention_weights_bytes(B, H, S, dtype)
        value, problem = check_number(got, right, what="a number of bytes")
        if value is None or not math.isfinite(value):
            return problem  # type: ignore[return-value]
        answers.append(value)
        expected.append(right)
        floats.append(isinstance(got, float) or type(got).__module__ == "numpy" and "float" in type(got).__name__
                      or isinstance(got, Tensor) and got.is_floating_point())
    if all(math.isclose(a, e, rel_tol=1e-9) for a, e in zip(answers, expected)):
        if any(floats):
            return wrong("your numbers are right but come back as floats: the exercise asks for an int, an exact "
                         "count of bytes. `/` always returns a float (even 8 / 2 is 4.0), and a float stops holding "
                         "every whole number exactly above 2**53: keep to integer arithmetic (*, //) or convert at "
                         "the end with int(...).")
        return correct("B·H·S²·(bytes per element): linear in H, quadratic in S. At S = 4096 and H = 32 in float16 that is already 1 GiB per sequence and layer.")
    bad = next(i for i, (a, e) in enumerate(zip(answers, expected)) if not math.isclose(a, e, rel_tol=1e-9))
    B, H, S, dtype = BYTES_CONFIGS[bad]
    where = f"for B={B}, H={H}, S={S}, {dtype}: you returned {answers[bad]:,.6g}."
    for m in BYTES_MISTAKES:
        if _bytes_same(tuple(answers), _bytes_vector(m.compute)):
            return wrong(f"{where} {m.hint}")
    return wrong(f"{where} That is not B·H·S·S·(bytes per element) for this dtype; count the numbers of the "
                 "[B, H, S, S] tensor, then multiply by torch.empty((), dtype=dtype).element_size().")


def softmax_block(module: MultiHeadSelfAttention, x: Tensor) -> Tensor:
    """``module``'s computation with :func:`softmax_attention` (``torch.softmax``) as its core: ``[B, S, D] -> [B, S, D]``."""
    q, k, v = (split_heads(lin(x), module.num_heads) for lin in (module.w_q, module.w_k, module.w_v))  # [B, H, S, D_k]
    return module.w_o(merge_heads(softmax_attention(q, k, v)))  # [B, S, D]


# --- diagrams ----------------------------------------------------------------------------------

#: The score the opening example gives each target key (the notebook's ``s``).
OPENING_SCORE = 6.0
#: Sizes of the split-and-merge walk-through: B, S, D, H (D_k = D / H).
SPLIT_SIZES = (2, 8, 384, 12)


def opening_weights(s: float = OPENING_SCORE, S: int = len(THEY_SENTENCE)) -> tuple[float, float]:
    """The weight of one target in the opening example: one head with two targets, one head with one."""
    return math.exp(s) / (2 * math.exp(s) + S - 2), math.exp(s) / (math.exp(s) + S - 1)


@diagram
def one_vs_two_heads_diagram() -> Diagram:
    """One head: one row of weights and one value map; two heads: a row and a map each, then a sum."""
    one, two = opening_weights()
    d = Diagram(
        "ch05_one_vs_two_heads", 420, 372, title="One head against two heads for the query 'they'",
        alt=("Two panels for the query 'they'. One head: 'books' and 'dusty' share a single row of weights "
             f"({one:.2f} each at score s = {OPENING_SCORE:g}), their values are averaged and pass through "
             "one value map into the new vector of 'they'. Two heads: head 0 gives 'books' "
             f"{two:.2f}, head 1 gives 'dusty' {two:.2f}; each head passes its result through its own value "
             "map, and the two results are added."))
    tok = dict(color="sky", size=15)
    # one head
    d.text(14, 26, "one head", size=15, anchor="start", weight="bold")
    d.box(14, 42, 76, 34, "books", **tok)
    d.box(14, 100, 76, 34, "dusty", **tok)
    d.box(150, 68, 80, 40, "average", color="blue", size=15)
    d.arrow(90, 59, 148, 82, label=f"{one:.2f}", size=14, label_side=-8)
    d.arrow(90, 117, 148, 96, label=f"{one:.2f}", size=14, label_side=20)
    d.box(252, 64, 84, 48, "one", sub="value map", color="orange", size=15)
    d.arrow(230, 88, 250, 88)
    d.arrow(336, 88, 350, 88)
    d.box(352, 70, 58, 36, "they′", color="green", size=15)
    d.text(14, 160, "one row of weights, summing to 1", size=14, anchor="start", color=MUTED)
    d.line(14, 178, 406, 178, color=MUTED, width=1, dash=True)
    # two heads
    d.text(14, 206, "two heads", size=15, anchor="start", weight="bold")
    d.box(14, 222, 76, 34, "books", **tok)
    d.box(14, 290, 76, 34, "dusty", **tok)
    d.box(160, 216, 84, 46, "map 0", sub="head 0", color="orange", size=15)
    d.box(160, 284, 84, 46, "map 1", sub="head 1", color="orange", size=15)
    d.arrow(90, 239, 158, 239, label=f"{two:.2f}", size=14)
    d.arrow(90, 307, 158, 307, label=f"{two:.2f}", size=14)
    d.box(276, 256, 40, 36, "+", color="grey", size=18)
    d.arrow(244, 239, 274, 266)
    d.arrow(244, 307, 274, 284)
    d.arrow(316, 274, 350, 274)
    d.box(352, 256, 58, 36, "they′", color="green", size=15)
    d.text(14, 356, "a row of weights and a value map per head", size=14, anchor="start", color=MUTED)
    return d


@diagram
def one_value_map_diagram() -> Diagram:
    """One head: one map M applied to the weighted sum of both contents; two heads: a map per content."""
    d = Diagram(
        "ch05_one_value_map", 420, 360, title="One value map against two",
        alt=("Two panels for the query 'they', which should receive the U-part of the content of 'books' plus the "
             "Z-part of the content of 'dusty'. One head: the contents of 'books' and 'dusty' are mixed first, by one "
             "row of weights, and the mix goes through one map M, the same for both tokens: M sees only the mix, so it "
             "cannot keep U of one token and Z of the other. Two heads: head 0 sends the content of 'books' through its "
             "own map, which keeps U, head 1 sends the content of 'dusty' through its own map, which keeps Z, and the "
             "two results are added: a map per head gives exactly the target."))
    tok = dict(color="sky", size=15)
    d.text(14, 26, "one head", size=15, anchor="start", weight="bold")
    d.box(14, 40, 86, 34, "books", **tok)
    d.box(14, 98, 86, 34, "dusty", **tok)
    d.box(146, 62, 84, 48, "mix", sub="one row", color="blue", size=15)
    d.arrow(100, 57, 144, 78)
    d.arrow(100, 115, 144, 96)
    d.box(252, 62, 66, 48, "M", sub="one map", color="orange", size=15)
    d.arrow(230, 86, 250, 86)
    d.arrow(318, 86, 346, 86)
    d.box(348, 68, 62, 36, "they′", color="green", size=15)
    d.text(14, 156, "M sees only the mix: it cannot keep", size=14, anchor="start", color=MUTED)
    d.text(14, 174, "U of one token and Z of the other", size=14, anchor="start", color=MUTED)
    d.line(14, 190, 406, 190, color=MUTED, width=1, dash=True)
    d.text(14, 216, "two heads", size=15, anchor="start", weight="bold")
    for h, (token, keep, y) in enumerate((("books", "keep U", 230), ("dusty", "keep Z", 290))):
        d.box(14, y, 86, 34, token, **tok)  # the token's content, through its head's own map
        d.box(150, y - 6, 84, 46, keep, sub=f"head {h}", color="orange", size=15)
        d.arrow(100, y + 17, 148, y + 17)
        d.arrow(234, y + 17, 264, 270 + 18 * h)
    d.box(266, 260, 40, 36, "+", color="grey", size=18)
    d.arrow(306, 278, 346, 278)
    d.box(348, 260, 62, 36, "they′", color="green", size=15)
    d.text(14, 350, "a map per head: exactly the target", size=14, anchor="start", color=MUTED)
    return d


@diagram
def split_merge_diagram() -> Diagram:
    """The D axis cut into H slices of D_k, attention per head, and the merge back, with shapes."""
    B, S, D, H = SPLIT_SIZES
    dk = D // H
    sentences = [
        f"A top-to-bottom flow with B = {B}, S = {S}, D = {D}, H = {H}.",
        f"The query projection (keys and values alike) of shape ({B}, {S}, {D}) is viewed as ({B}, {S}, {H}, {dk}),",
        f"cutting each position's {D} features into {H} slices of D_k = {dk}, then transposed to ({B}, {H}, {S}, {dk}).",
        f"Each head attends in its own slice: weights ({B}, {H}, {S}, {S}), output ({B}, {H}, {S}, {dk}).",
        f"Transposing back and reshaping gives the concatenation ({B}, {S}, {D}), in which each slice still comes",
        f"from one head; the output projection, ({D}, {D}), mixes them into ({B}, {S}, {D}).",
    ]
    d = Diagram("ch05_split_merge", 420, 500, title="Splitting the feature axis into heads and merging it back",
                alt=" ".join(sentences))
    cx, w = 140, 240
    steps = [
        ("projection Q (K, V alike)", f"[{B}, {S}, {D}]", "blue", None),
        ("split the features", f"[{B}, {S}, {H}, {dk}]", "sky", ".view"),
        ("heads in front", f"[{B}, {H}, {S}, {dk}]", "sky", ".transpose(1, 2)"),
        ("attention per head", f"weights [{B}, {H}, {S}, {S}]", "orange", "q @ kᵀ, softmax"),
        ("head outputs", f"[{B}, {H}, {S}, {dk}]", "orange", "weights @ V"),
        ("concatenation", f"[{B}, {S}, {D}]", "sky", ".transpose(1, 2).reshape"),
        ("heads mixed", f"[{B}, {S}, {D}]", "green", f"output projection [{D}, {D}]"),
    ]
    y, h, step = 14, 46, 70
    for i, (label, shape, colour, how) in enumerate(steps):
        d.box(cx - w / 2 + 20, y, w, h, label, sub=shape, color=colour, size=15)
        if i + 1 < len(steps):
            d.arrow(cx + 20, y + h, cx + 20, y + step - 2)
            nxt = steps[i + 1][3]
            d.text(cx + 30, y + h + 17, nxt, size=14, anchor="start", color=MUTED)
        y += step
    # the D axis cut into H slices, drawn beside the first box
    sx, sy, sw = 296, 24, 108
    for j in range(H):
        d.rect(sx + j * sw / H, sy, sw / H, 24, fill="sky" if j % 2 else "blue", tint=True, stroke="blue", rx=0, width=1)
    d.text(sx + sw / 2, sy + 44, f"{H} slices of {dk}", size=14)
    return d


#: The key/value sharing diagram of section 5.7: query heads, and the key/value heads of MHA, GQA and MQA.
KV_SHARING_QUERY_HEADS, KV_SHARING_KV_HEADS = 8, (8, 2, 1)


@diagram
def kv_sharing_diagram() -> Diagram:
    """Multi-head, grouped-query and multi-query attention: which key/value head each query head reads."""
    H = KV_SHARING_QUERY_HEADS
    names = {H: "multi-head (MHA)", 1: "multi-query (MQA)"}
    x0, qw, gap, row = 14, 40, 10, 124
    width = x0 * 2 + H * qw + (H - 1) * gap
    d = Diagram("ch05_kv_sharing", width, 24 + row * len(KV_SHARING_KV_HEADS) + 8,
                title="Query heads sharing key/value heads",
                alt=f"Three rows, each with {H} query heads on top. Multi-head attention: each query head has its "
                    f"own key/value head, {H} in all. Grouped-query attention with {KV_SHARING_KV_HEADS[1]} key/value "
                    f"heads: each group of {H // KV_SHARING_KV_HEADS[1]} query heads reads one key/value head. "
                    "Multi-query attention: all query heads read a single key/value head. The KV cache stores only "
                    "the key/value heads.")
    for r, H_kv in enumerate(KV_SHARING_KV_HEADS):
        y = 24 + r * row
        label = names.get(H_kv, "grouped-query (GQA)")
        d.text(x0, y + 4, f"{label}: {H_kv} K/V head{'s' if H_kv > 1 else ''} cached", size=14, anchor="start",
               weight="bold")
        group = H // H_kv
        for h in range(H):
            d.box(x0 + h * (qw + gap), y + 16, qw, 26, f"q{h}", color="sky", size=14)
        for g in range(H_kv):
            first = x0 + g * group * (qw + gap)
            span = group * qw + (group - 1) * gap
            d.box(first, y + 74, span, 26, f"kv{g}" if span < 80 else f"K/V head {g}", color="orange", size=14)
            for h in range(g * group, (g + 1) * group):
                cx = x0 + h * (qw + gap) + qw / 2
                d.line(cx, y + 42, first + span / 2, y + 74, color=MUTED, width=1)
    return d


#: Sizes of the cost diagram of section 5.4: S and D, as in the chapter's FLOP count, and the head counts drawn.
HEADS_COST_SIZES, HEADS_COST_COUNTS = (256, 512), (1, 4)


def score_cost(num_heads: int, S: int = HEADS_COST_SIZES[0], D: int = HEADS_COST_SIZES[1]) -> tuple[int, int]:
    """The multiply-adds of all heads' ``Q_h K_h^T`` products and the number of ``[S, S]`` score matrices, for
    one sequence with ``H D_k = D``: ``H`` products ``[S, D_k] x [D_k, S]`` of ``S * S * D_k`` multiply-adds each."""
    d_k = D // num_heads
    return num_heads * S * S * d_k, num_heads


@diagram
def heads_cost_diagram() -> Diagram:
    """H = 1 against H = 4 at the same D: the same multiply-adds for the scores, H times the S x S matrices."""
    S, D = HEADS_COST_SIZES
    h1, h4 = HEADS_COST_COUNTS
    (macs1, sheets1), (macs4, sheets4) = score_cost(h1), score_cost(h4)
    d_k = D // h4
    d = Diagram(
        "ch05_heads_cost", 420, 500, title="One head against four: the same multiply-adds, four times the score matrices",
        alt=(f"Two panels for one sequence of S = {S} tokens and width D = {D}. With H = {h1} head, one product of "
             f"Q, {S} by {D}, and Kᵀ, {D} by {S}, gives one S by S matrix of scores: {macs1:,} multiply-adds. "
             f"With H = {h4} heads, {h4} products of a head's Q, {S} by {d_k}, and Kᵀ, {d_k} by {S}, give {sheets4} "
             f"S by S matrices, drawn the same size: {h4} times {macs4 // h4:,}, again {macs4:,} multiply-adds. "
             f"The same arithmetic, {sheets4 // sheets1} times the score matrices to store."))
    sub = "₀₁₂₃₄₅₆₇"

    def product(y: float, q: str, k: str, d_k: int) -> None:  # one head's Q_h K_h^T and its S x S scores
        d.box(14, y, 104, 48, q, sub=f"[{S}, {d_k}]", color="blue", size=15)
        d.text(131, y + 30, "×", size=18)
        d.box(144, y, 104, 48, k, sub=f"[{d_k}, {S}]", color="sky", size=15)
        d.arrow(248, y + 24, 280, y + 24)
        d.rect(284, y - 4, 56, 56, fill="orange", tint=True, stroke="orange", width=2, rx=0)
        d.text(312, y + 29, "S × S", size=14)

    d.text(14, 26, f"H = {h1}: one head, D_k = {D}", size=15, anchor="start", weight="bold")
    product(48, "Q", "Kᵀ", D)
    d.text(14, 134, f"{S}·{S}·{D} = {macs1:,} multiply-adds", size=14, anchor="start", color=MUTED)
    d.text(14, 154, f"{sheets1} score matrix to store", size=14, anchor="start", color=MUTED)
    d.line(14, 170, 406, 170, color=MUTED, width=1, dash=True)
    d.text(14, 196, f"H = {h4}: {h4} heads, D_k = {d_k}", size=15, anchor="start", weight="bold")
    for h in range(h4):
        product(218 + 62 * h, f"Q{sub[h]}", f"K{sub[h]}ᵀ", d_k)
    d.text(14, 468, f"{h4}·{S}·{S}·{d_k} = {macs4:,} multiply-adds", size=14, anchor="start", color=MUTED)
    d.text(14, 490, f"{sheets4} score matrices to store: {sheets4 // sheets1}× the memory", size=14, anchor="start",
           weight="bold")
    return d
