"""Checkers for chapter 4 (masks).

* :func:`check_combined_mask`: build the padding + causal mask ``[B, 1, S, S]`` by hand.
* :func:`check_masking_order`: fix attention code that masks *after* softmax.
* :func:`check_fully_masked_prediction`: predict the weights of a row whose every key is masked.
* :func:`causal_eval_stats`: what the toy model predicts with the future hidden.

Each checker keeps its known mistakes in one table (``COMBINED_MASK_MISTAKES``,
``MASKING_ORDER_MISTAKES``, ``FULLY_MASKED_MISTAKES``); ``tests/test_ch04.py`` iterates over them.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any, Callable

import torch
from torch import Tensor

from attnlib.core import scaled_dot_product_attention
from attnlib.masks import causal_mask, combine_masks, padding_mask
from attnlib.multihead import MultiHeadSelfAttention

from .diagrams import MUTED, Diagram, diagram
from .examples import BOOKS_SENTENCE

from .feedback import (
    Feedback,
    Mistake,
    MistakeTable,
    call_reader,
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
from .measure import interleaved_median_ms

__all__ = [
    "check_combined_mask", "COMBINED_MASK_MISTAKES", "check_masking_order", "MASKING_ORDER_MISTAKES",
    "check_fully_masked_prediction", "FULLY_MASKED_CASES", "FULLY_MASKED_SCORES", "FULLY_MASKED_MISTAKES",
    "causal_eval_stats", "time_parallel_and_prefixes", "causal_explorer", "mha_fast_path",
    "mha_all_padding_outputs", "mask_seen_by_attention", "document_mask", "prefix_lm_mask",
    "PADDED_BATCH", "LEFT_PADDED_TOKENS", "LEFT_PADDED_MASK", "STACK_FILLS", "left_padded_stack",
    "fully_masked_row_by_dtype", "ENCODER_DECODER", "mask_conventions_agree", "bert_padding_equals_alone",
    "PREFIX_PASSES_S", "NEXT_TOKEN_TEXT", "NEXT_TOKEN_QUERY", "loss_curve_alt",
]

#: The attention mask the combined-mask checker feeds in: ``[B, S] = [3, 5]``, 1 = real token.
#: Sequence 0 is padded on the right, sequence 2 on the left (its first two rows see nothing).
EXAMPLE_ATTENTION_MASK = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])

#: The combined-mask checker's second case, ``[B, S] = [2, 7]``, as int64 rather than a bool-like
#: 0/1: other sizes, so that a hard-coded B or S cannot pass (sequence 1 is padded on the left).
SECOND_ATTENTION_MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1]])


def _tril(S: int) -> Tensor:
    return torch.ones(S, S, dtype=torch.bool).tril()  # [S, S]


def _keys(am: Tensor) -> Tensor:
    return am.bool()[:, None, None, :]  # [B, 1, 1, S]


def _rows(am: Tensor) -> Tensor:
    return am.bool()[:, None, :, None]  # [B, 1, S, 1]


def _combined(am: Tensor) -> Tensor:
    return _tril(am.shape[1]) & _keys(am)  # [B, 1, S, S]


#: Known wrong masks ``compute(attention_mask [B, S]) -> bool mask``, tried in order.
COMBINED_MASK_MISTAKES: tuple[Mistake, ...] = (
    Mistake("inverted", lambda am: ~_combined(am),
            "your mask is inverted: True must mean *may attend* (the visible, lower-left cells)."),
    Mistake("padding inverted", lambda am: _tril(am.shape[1]) & ~_keys(am),
            "your padding part is inverted: in attention_mask 1 marks a real token, so keep the keys where "
            "`attention_mask == 1` (`attention_mask == 0` is the True = blocked form that nn.MultiheadAttention takes)."),
    Mistake("transposed", lambda am: _combined(am).transpose(-1, -2),
            "rows and columns are swapped: rows are queries and columns are keys, so the causal part is "
            "`torch.tril(ones)` (key j <= query i) and the padding must hide columns: it must vary along the last "
            "axis (keys) and be size 1 on the head and query axes."),
    Mistake("no head axis", lambda am: _combined(am)[:, 0],
            "your mask is [B, S, S]: it lacks the head axis. Against scores [B, H, S, S] it would line up B with H "
            "(broadcasting aligns shapes from the right), so insert an axis: `mask[:, None]` -> [B, 1, S, S]."),
    Mistake("future visible", lambda am: _keys(am).expand(-1, 1, am.shape[1], -1),
            "padding is hidden but the future is visible: AND in the causal part `torch.tril(...)`."),
    Mistake("padding visible", lambda am: _tril(am.shape[1]).expand(am.shape[0], 1, -1, -1),
            "the future is hidden but padding keys are visible: AND in the padding part, shaped [B, 1, 1, S]."),
    Mistake("diagonal hidden", lambda am: _tril(am.shape[1]).tril(-1) & _keys(am),
            "the diagonal is hidden: a token may look at itself, so use `torch.tril(ones)` (diagonal=0)."),
    Mistake("tril diagonal=1", lambda am: torch.ones(am.shape[1], am.shape[1], dtype=torch.bool).tril(1) & _keys(am),
            "each query sees one key of the future: `torch.tril(ones, diagonal=1)` keeps the first diagonal above the "
            "main one. The visible part is `torch.tril(ones)` (diagonal=0): key j <= query i."),
    Mistake("triu", lambda am: _tril(am.shape[1]).T & _keys(am),
            "you kept the future and hid the past: `triu` marks the future. Use `tril`, or invert `triu(..., 1)`."),
    Mistake("strict triu", lambda am: _tril(am.shape[1]).T.triu(1) & _keys(am),
            "you kept the future and hid the past: `triu` marks the future. Use `tril`, or invert `triu(..., 1)`."),
    Mistake("padded rows", lambda am: _tril(am.shape[1]) & _rows(am),
            "you hid padded *queries* (rows) instead of padded *keys* (columns): the padding must vary along the "
            "last axis (keys) and be size 1 on the head and query axes."),
    Mistake("padded rows and keys", lambda am: _combined(am) & _rows(am),
            "you also hid the padded query rows. That leaves rows with nothing visible (a plain softmax turns them "
            "into NaN); the padding mask hides keys only, and the outputs at padded positions are simply ignored."),
)


def _additive_mask_hint(got: Tensor) -> Feedback | None:
    """The hint for a float mask in the additive convention (it holds -inf or finfo.min), else None."""
    if got.is_floating_point() and bool((got.detach().cpu().float() <= torch.finfo(torch.float32).min).any()):
        return wrong(
            f"your mask has dtype {got.dtype} and holds -inf or finfo.min: that is the additive convention "
            "(0 = keep, -inf = hide), and `.bool()` would turn its hidden cells into True. attnlib's masks are "
            "torch.bool with True = may attend: build a bool mask, or convert with `attnlib.from_additive_mask`."
        )
    return None


_SIZE_MISMATCH = re.compile(r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) "
                            r"at non-singleton dimension (\d+)")


def _combined_one(fn: Callable[[Tensor], Any], am: Tensor) -> Feedback | None:
    B, S = am.shape
    got, fb = call_reader(fn, (am.clone(),), axes=("B", "H", "S_q", "S_k"))
    mismatch = _SIZE_MISMATCH.search(fb.message) if fb is not None else None
    if mismatch is not None and int(mismatch[3]) == 3 and {int(mismatch[1]), int(mismatch[2])} == {B, S}:
        return wrong(
            fb.message + f". The key axis of your triangle does not match the keys: here attention_mask is [B, S] = "
            f"{(B, S)}, so the sequence length is its *second* size; the first, attention_mask.shape[0] (or "
            "len(attention_mask)), is the batch."
        )
    if fb is not None and re.search(r"bitwise_(and|or)\S* not implemented for '(Float|Double|Half|BFloat16)'", fb.message):
        return wrong(
            "your code raised an error at `&` (or `|`): one side is a float tensor, and `&` works on two bool "
            "tensors. `torch.ones(...)` is float by default, and so is `torch.tril` of it: make the triangle a "
            "bool tensor before you combine it with the padding part."
        )
    if mismatch is not None:
        return wrong(
            fb.message + ". The causal part is [S, S] and the padding part must be [B, 1, 1, S]: the batch axis "
            "first, the padding varying along the last axis (keys) and size 1 on the head and query axes (with "
            "`[None, None, :, :]` it is [1, 1, B, S], and the batch lands on the query axis)."
        )
    if fb is not None:
        return fb
    if not isinstance(got, Tensor):
        return wrong(f"return a torch.Tensor, got {describe(got)}.")
    expected = combine_masks(causal_mask(S), padding_mask(am))  # [B, 1, S, S]
    assert expected is not None
    additive = _additive_mask_hint(got)
    if additive is not None:
        return additive
    if got.dtype != torch.bool:
        return wrong(
            f"your mask has dtype {got.dtype}; attnlib's masks are torch.bool with True = may attend. "
            "Compare with 1 (`attention_mask == 1`) or call `.bool()`."
        )
    if close(got, expected):
        return None
    hint = diagnose(got, COMBINED_MASK_MISTAKES, am)
    if hint is not None:
        return hint
    if tuple(got.shape) != (B, 1, S, S):
        return wrong(f"your mask has shape {tuple(got.shape)}; expected [B, 1, S, S] = {(B, 1, S, S)} for an attention mask of shape {(B, S)}.")
    differ = got.cpu() != expected
    bad = int(differ.sum())
    b, _, i, j = (int(t) for t in differ.nonzero()[0])
    if bool(got[b, 0, i, j]):
        why = (f"key {j} is in the future of query {i}" if j > i else f"key {j} is padding ({am[b].tolist()})")
        what = f"query {i} may see key {j}, but {why}"
    else:
        what = (f"query {i} may not see key {j}, though it is a real token at or before the query"
                + (" (its own key: a token may look at itself)" if i == j else ""))
    return wrong(f"{bad} of {got.numel()} entries differ from padding AND causal. The first, in sequence {b}: {what}. "
                 "Rows are queries, columns are keys.")


def _solution_combined(attention_mask: Tensor) -> Tensor:
    S = attention_mask.shape[1]
    past = torch.ones(S, S, dtype=torch.bool).tril()  # [S, S]
    return past & attention_mask.bool()[:, None, None, :]  # [B, 1, S, S]


@exercise(solution=_solution_combined,
          tables=(MistakeTable(COMBINED_MASK_MISTAKES, lambda: [(EXAMPLE_ATTENTION_MASK,), (SECOND_ATTENTION_MASK,)], _combined),))
def check_combined_mask(fn: Callable[[Tensor], Any]) -> Feedback:
    """Check ``fn(attention_mask [B, S] of 0/1) -> bool [B, 1, S, S]`` (padding AND causal).

    The reference is ``combine_masks(causal_mask(S), padding_mask(attention_mask))``; it is tried
    on :data:`EXAMPLE_ATTENTION_MASK` and on :data:`SECOND_ATTENTION_MASK` (other B and S).
    """
    for am in (EXAMPLE_ATTENTION_MASK, SECOND_ATTENTION_MASK):
        problem = _combined_one(fn, am)
        if problem is not None:
            return problem
    return correct("each query sees itself and earlier real tokens, never the future or padding.")


#: The lower-right exercise's cases ``(S_q, S_k)``: a longer cache first (3 new tokens after 4 cached ones,
#: where every listed mistake gives its own mask), a cache of 3 with 2 new tokens, one new token, and no cache
#: (S_q == S_k, where both alignments agree).
LOWER_RIGHT_CASES: tuple[tuple[int, int], ...] = ((3, 7), (2, 5), (1, 4), (4, 4))


def _lower_right(S_q: int, S_k: int) -> Tensor:
    return torch.ones(S_q, S_k, dtype=torch.bool).tril(S_k - S_q)  # [S_q, S_k]: key j <= query i + (S_k - S_q)


def _wrong_way(S_q: int, S_k: int) -> Tensor:
    """The diagonal moved up instead of down; for one query it hides everything, as the inverted mask does,
    so it is told apart (and named) on the cases with more than one query only."""
    if S_q == 1:
        raise ValueError("the same answer as the inverted mask")
    return torch.ones(S_q, S_k, dtype=torch.bool).tril(S_q - S_k)


def _future_key(S_q: int, S_k: int) -> Tensor:
    """One key of the future for each query but the last. With S_q <= 2 that shows every key, the same
    answer as an all-True mask, so it is told apart (and named) on the cases with more queries only."""
    got = torch.ones(S_q, S_k, dtype=torch.bool).tril(S_k - S_q + 1)
    if bool(got.all()):
        raise ValueError("the same answer as a mask that hides nothing")
    return got


def _offset_s_q(S_q: int, S_k: int) -> Tensor:
    """The diagonal shifted by S_q instead of S_k - S_q. Where that shift equals another listed one (S_k - S_q - 1
    on (3, 7) and (2, 5), a mask that hides nothing on (4, 4)) it gives another mistake's answer, so it is told
    apart on the remaining case, (1, 4), and the checker names it only when it fits the reader's answer on every
    case where it is defined."""
    if S_q in (S_k - S_q - 1, S_k - S_q, S_k - S_q + 1) or S_q >= S_k - 1:
        raise ValueError("the same answer as another mistake")
    return torch.ones(S_q, S_k, dtype=torch.bool).tril(S_q)


#: Known wrong masks ``compute(S_q, S_k) -> bool [S_q, S_k]``, tried in order.
LOWER_RIGHT_MISTAKES: tuple[Mistake, ...] = (
    Mistake("nothing masked", lambda S_q, S_k: torch.ones(S_q, S_k, dtype=torch.bool),
            "your mask is True everywhere, so it hides nothing: every new token but the last sees keys of its "
            "future. Query i sits at position S_k - S_q + i; the keys after that position must be False."),
    Mistake("aligned top-left", lambda S_q, S_k: torch.ones(S_q, S_k, dtype=torch.bool).tril(),
            "your triangle starts in the top-left corner, as is_causal=True does: the first new token sees only "
            "key 0, and the last does not see itself. With a cache the queries are the *newest* S_q positions: "
            "the last query is the last key, and it may see every key."),
    Mistake("shifted the wrong way", lambda S_q, S_k: _wrong_way(S_q, S_k),
            "you moved the diagonal the wrong way: the queries come *after* the S_k - S_q cached keys, so each "
            "sees more keys than in the top-left triangle, not fewer."),
    Mistake("one key of the future", lambda S_q, S_k: _future_key(S_q, S_k),
            "off by one: each query but the last sees one key of its future. Query i sits at position "
            "S_k - S_q + i and may see keys up to that position, itself included."),
    Mistake("offset S_q", lambda S_q, S_k: _offset_s_q(S_q, S_k),
            "you shifted the diagonal by S_q instead of S_k - S_q: the shift is the number of cached keys that come "
            "before the new tokens, so query i sits at position S_k - S_q + i, not S_q + i."),
    Mistake("own key hidden", lambda S_q, S_k: torch.ones(S_q, S_k, dtype=torch.bool).tril(S_k - S_q - 1),
            "off by one: no query sees its own key. Query i sits at position S_k - S_q + i and may see keys up "
            "to that position, itself included."),
    Mistake("inverted", lambda S_q, S_k: ~_lower_right(S_q, S_k),
            "your mask is inverted: True must mean *may attend* (the past and the query itself)."),
    Mistake("transposed", lambda S_q, S_k: _lower_right(S_q, S_k).T,
            "rows and columns are swapped: rows are the S_q queries and columns the S_k keys, so the mask is "
            "[S_q, S_k]."),
)


def _matches_on_every_case(mistake: Mistake, answers: dict[tuple[int, int], Tensor]) -> bool:
    """Whether ``mistake`` gives the reader's answer on every case where both are defined, and on one at least: a
    slip such as an offset of S_q equals another on some cases (on (3, 7), S_q = S_k - S_q - 1), so a mistake is
    named only where it fits them all."""
    defined = False
    for (S_q, S_k), got in answers.items():
        try:
            expected = mistake.compute(S_q, S_k)
        except Exception:  # not defined on this case
            continue
        if not close(got, expected):
            return False
        defined = True
    return defined


def _reader_answers(fn: Callable[[int, int], Any]) -> dict[tuple[int, int], Tensor]:
    """The reader's bool masks on every case on which the code returns one."""
    answers = {}
    for S_q, S_k in LOWER_RIGHT_CASES:
        got, fb = run_reader_code(fn, S_q, S_k)
        if fb is None and isinstance(got, Tensor) and got.dtype == torch.bool:
            answers[S_q, S_k] = got
    return answers


def _lower_right_one(fn: Callable[[int, int], Any], S_q: int, S_k: int,
                     answers: dict[tuple[int, int], Tensor]) -> Feedback | None:
    got, fb = run_reader_code(fn, S_q, S_k)
    if fb is not None:
        return fb
    if not isinstance(got, Tensor):
        return wrong(f"return a torch.Tensor, got {describe(got)}.")
    expected = _lower_right(S_q, S_k)
    additive = _additive_mask_hint(got)
    if additive is not None:
        return additive
    if got.dtype != torch.bool:
        return wrong(f"your mask has dtype {got.dtype}; attnlib's masks are torch.bool with True = may attend.")
    if close(got, expected):
        return None
    for m in LOWER_RIGHT_MISTAKES:
        if _matches_on_every_case(m, answers):
            return wrong(m.hint)
    if tuple(got.shape) != (S_q, S_k):
        return wrong(f"for S_q = {S_q}, S_k = {S_k} your mask has shape {tuple(got.shape)}; expected [S_q, S_k] = {(S_q, S_k)}.")
    i, j = (int(t) for t in (got.cpu() != expected).nonzero()[0])
    what = "may see" if bool(got[i, j]) else "may not see"
    return wrong(f"for S_q = {S_q}, S_k = {S_k}: query {i} (position {S_k - S_q + i}) {what} key {j}, which is wrong. "
                 "Rows are the newest S_q positions, columns all S_k keys.")


def _solution_lower_right(S_q: int, S_k: int) -> Tensor:
    return torch.ones(S_q, S_k, dtype=torch.bool).tril(diagonal=S_k - S_q)  # [S_q, S_k]


@exercise(solution=_solution_lower_right,
          tables=(MistakeTable(LOWER_RIGHT_MISTAKES, lambda: list(LOWER_RIGHT_CASES), _lower_right),))
def check_lower_right_mask(fn: Callable[[int, int], Any]) -> Feedback:
    """Check ``fn(S_q, S_k) -> bool [S_q, S_k]``: a causal mask aligned bottom-right, for ``S_q <= S_k``.

    Tried on :data:`LOWER_RIGHT_CASES`; the reference is ``attnlib.causal_mask(S_q, S_k=S_k)``.
    """
    answers = _reader_answers(fn)
    for S_q, S_k in LOWER_RIGHT_CASES:
        problem = _lower_right_one(fn, S_q, S_k, answers)
        if problem is not None:
            return problem
    return correct("the newest S_q positions each see every key up to their own position, the last one every key.")


def _scores(q: Tensor, k: Tensor) -> Tensor:
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, H, S, S]


def _future(q: Tensor) -> Tensor:
    return ~causal_mask(q.shape[-2])  # [S, S], True above the diagonal


def _nan_as(t: Tensor) -> Tensor:
    """NaN replaced by -1 (no weight is negative), so that a NaN row can be compared like any other."""
    return torch.nan_to_num(t, nan=-1.0)


#: The masking-order checker's cases ``(B, H, S, D_k, dtype)``: the second differs in every size and the dtype.
MASKING_ORDER_CASES: tuple[tuple[int, int, int, int, torch.dtype], ...] = ((1, 2, 5, 4, torch.float32), (2, 3, 6, 5, torch.float64))


def _masking_order_case(c: int) -> tuple[Tensor, Tensor, Tensor]:
    B, H, S, D_k, dtype = MASKING_ORDER_CASES[c]
    gen = torch.Generator().manual_seed(4 + c)
    q, k, v = (torch.randn(B, H, S, D_k, generator=gen, dtype=torch.float64).to(dtype) for _ in range(3))  # [B, H, S, D_k]
    return q, k, v


def _renormalised(q: Tensor, k: Tensor, dim: int) -> Tensor:
    """Softmax, zero the future, divide by the sum over ``dim``: right for ``dim=-1``."""
    w = torch.softmax(_scores(q, k), dim=-1).masked_fill(_future(q), 0.0)
    return w / w.sum(dim, keepdim=True)


def _zeroed_row_sums() -> str:
    """The symptom of zeroing after softmax on the checker's first case: the row sums of head 0."""
    q, k, _ = _masking_order_case(0)
    w = torch.softmax(_scores(q, k), dim=-1).masked_fill(_future(q), 0.0)
    return "[" + ", ".join(f"{x:.2f}" for x in w[0, 0].sum(dim=-1).tolist()) + "]"


def _narrow_scores_weights(q: Tensor, k: Tensor, dtype: torch.dtype) -> Tensor:
    """Causal weights from scores computed in ``dtype`` (float16 or bfloat16) and cast back to q's dtype."""
    scores = (q.to(dtype) @ k.to(dtype).transpose(-2, -1) / math.sqrt(q.shape[-1])).to(q.dtype)  # [B, H, S, S]
    return torch.softmax(scores.masked_fill(_future(q), float("-inf")), dim=-1)


#: Known wrong weights ``compute(q, k, v) -> weights [B, H, S, S]`` (NaN written as -1), tried in order.
MASKING_ORDER_MISTAKES: tuple[Mistake, ...] = (
    Mistake("zeroed after softmax", lambda q, k, v: torch.softmax(_scores(q, k), dim=-1).masked_fill(_future(q), 0.0),
            "the future is at 0, but the rows no longer sum to 1: on the first test input the rows of head 0 sum "
            f"to {_zeroed_row_sums()}. Attention weights must share all of a row's weight among the keys a query "
            "may see. Where does each row lose the rest?"),
    Mistake("softmax twice", lambda q, k, v: torch.softmax(torch.softmax(_scores(q, k), dim=-1).masked_fill(_future(q), float("-inf")), dim=-1),
            "the future is at 0 and the rows sum to 1, but you applied softmax twice: the second one takes the "
            "weights as scores, which flattens every row. Mask the scores, then apply one softmax."),
    Mistake("renormalised over the queries", lambda q, k, v: _renormalised(q, k, -2),
            "the future is at 0, but you renormalised over the queries (dim=-2): each row (one query) must sum to "
            "1 over its keys, so divide by the sum over the last axis (dim=-1, keepdim=True)."),
    Mistake("filled with 0", lambda q, k, v: torch.softmax(_scores(q, k).masked_fill(_future(q), 0.0), dim=-1),
            "the future gets weight because you filled it with 0: exp(0) = 1, so a 0 score is an ordinary "
            "score. Fill with -inf (or torch.finfo(dtype).min) so that exp gives 0."),
    Mistake("inverted mask", lambda q, k, v: _nan_as(torch.softmax(_scores(q, k).masked_fill(~_future(q), float("-inf")), dim=-1)),
            "your mask is inverted: you hid the past (and the diagonal) and kept the future. That is why the last "
            "row is NaN: its query may see nothing at all. Hide `~causal_mask(S)`, the cells where causal_mask "
            "is False."),
    Mistake("no mask", lambda q, k, v: torch.softmax(_scores(q, k), dim=-1),
            "future keys get weight: nothing is masked. Hide the upper triangle of the scores before softmax "
            "(masked_fill returns a new tensor: assign it, or use masked_fill_)."),
    Mistake("unscaled", lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1)).masked_fill(_future(q), float("-inf")), dim=-1),
            "the mask is right, but the scores are not scaled: divide q @ k^T by sqrt(D_k) before masking."),
    Mistake("transposed weights", lambda q, k, v: torch.softmax(_scores(q, k).masked_fill(_future(q), float("-inf")), dim=-1).transpose(-2, -1),
            "your weights are transposed: the masking is right, but rows must be queries and columns keys "
            "(each row sums to 1). Return the weights as softmax gives them, [B, H, S_q, S_k], not `.transpose(-2, -1)`."),
    Mistake("softmax over queries", lambda q, k, v: torch.softmax(_scores(q, k).masked_fill(_future(q), float("-inf")), dim=-2),
            "the mask is right, but your softmax normalises over the queries (dim=-2): each query's weights over the "
            "keys must sum to 1, so use dim=-1."),
    Mistake("divided by D_k", lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1) / q.shape[-1]).masked_fill(_future(q), float("-inf")), dim=-1),
            "the mask is right, but you divided the scores by D_k; divide by its square root, sqrt(D_k)."),
    Mistake("multiplied by sqrt(D_k)", lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1) * math.sqrt(q.shape[-1])).masked_fill(_future(q), float("-inf")), dim=-1),
            "the mask is right, but you multiplied the scores by sqrt(D_k); divide by it."),
    Mistake("tril diagonal=1", lambda q, k, v: torch.softmax(_scores(q, k).masked_fill(~torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril(1), float("-inf")), dim=-1),
            "each query sees one key of the future: `torch.tril(ones, diagonal=1)` keeps the first diagonal above the "
            "main one. The visible part is `torch.tril(ones)` (diagonal=0): key j <= query i."),
    Mistake("diagonal hidden", lambda q, k, v: _nan_as(torch.softmax(_scores(q, k).masked_fill(~causal_mask(q.shape[-2]).tril(-1), float("-inf")), dim=-1)),
            "you hid the diagonal too (triu(diagonal=0), or tril(diagonal=-1) as the visible part): a token may look "
            "at itself. That is why row 0 is NaN: its query sees nothing at all. Hide only the cells above the "
            "diagonal, ~causal_mask(S) (triu with diagonal=1)."),
    Mistake("softmax over the heads", lambda q, k, v: _nan_as(torch.softmax(_scores(q, k).masked_fill(_future(q), float("-inf")), dim=1)),
            "the mask is right, but your softmax runs over the head axis (dim=1): each weight is shared with the same "
            "cell of the other heads, and a future cell, -inf in every head, becomes NaN. A query's weight is shared "
            "among its keys: which axis of [B, H, S_q, S_k] holds them?"),
    Mistake("softmax over the batch", lambda q, k, v: _nan_as(torch.softmax(_scores(q, k).masked_fill(_future(q), float("-inf")), dim=0)),
            "the mask is right, but your softmax runs over the batch axis (dim=0): each weight is shared only with the "
            "same cell of the other sequences (with one sequence, every visible weight is 1), and a future cell, -inf "
            "in every sequence, becomes NaN. A query's weight is "
            "shared among its keys: which axis of [B, H, S_q, S_k] holds them?"),
    Mistake("k @ q^T", lambda q, k, v: torch.softmax((k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(_future(q), float("-inf")), dim=-1),
            "your scores are transposed: `k @ q.transpose(-2, -1)` puts the keys on the rows, so row i holds the "
            "score of every query against key i, and the mask then hides the wrong pairs. Row i must hold query i's "
            "score against every key, [B, H, S_q, S_k]."),
    Mistake("filled with 0, then zeroed", lambda q, k, v: torch.softmax(_scores(q, k).masked_fill(_future(q), 0.0), dim=-1).masked_fill(_future(q), 0.0),
            "the future is at 0, but only because you zeroed it after the softmax: filled with 0 before it, the future "
            "still took its share of each row (exp(0) = 1), so the rows now sum to less than 1. A fill before the "
            "softmax must be a score whose exp is 0."),
    Mistake("scores in float16", lambda q, k, v: _narrow_scores_weights(q, k, torch.float16),
            "your weights match scores computed in float16 and cast back (q.half() @ k.half()...): float16 keeps "
            "only about 3 significant digits, so every weight is off in its fourth digit, and a cast back does not "
            "restore them. Compute the scores in the dtype of q and k."),
    Mistake("scores in bfloat16", lambda q, k, v: _narrow_scores_weights(q, k, torch.bfloat16),
            "your weights match scores computed in bfloat16 and cast back (q.bfloat16() @ k.bfloat16()...): "
            "bfloat16 keeps only about 2 significant digits, so every weight is off in its third digit, and a cast "
            "back does not restore them. Compute the scores in the dtype of q and k."),
    Mistake("divided by the sum of all weights", lambda q, k, v: (lambda w: w / w.sum())(torch.softmax(_scores(q, k), dim=-1).masked_fill(_future(q), 0.0)),
            "you divided by `w.sum()`, the sum of every weight of every sequence, head and query, so no row sums to 1. "
            "Each row (one query) must be divided by its own sum: name the axis of the keys, and keep it "
            "(keepdim=True) so that the sums line up with the rows."),
)


def _masking_order_one(fn: Callable[[Tensor, Tensor, Tensor], Any], q: Tensor, k: Tensor, v: Tensor) -> Feedback | None:
    got, fb = call_reader(fn, (q.clone(), k.clone(), v.clone()), axes=("B", "H", "S_q", "S_k"))
    mismatch = _SIZE_MISMATCH.search(fb.message) if fb is not None else None
    S, D_k = q.shape[-2], q.shape[-1]
    if mismatch is not None and {int(mismatch[1]), int(mismatch[2])} == {S, D_k}:
        return wrong(
            fb.message + f". Something is sized by D_k = {D_k} (q.shape[-1]) where the number of positions "
            f"S = {S} (q.shape[-2]) belongs: the scores and the causal mask are both [S, S]."
        )
    if mismatch is not None:
        return wrong(
            fb.message + ". If you divided by a sum: a sum over one axis drops that axis (`w.sum(-1)` of "
            "[B, H, S_q, S_k] is [B, H, S_q]), and broadcasting lines shapes up from the right, so its query axis "
            "meets the key axis. Keep the summed axis with keepdim=True."
        )
    if fb is not None:
        return fb
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return wrong(f"return a pair `(output, weights)`, got {describe(got)}.")
    out, weights = got
    S = q.shape[-2]
    reference = scaled_dot_product_attention(q, k, v, causal_mask(S))
    exp_out, exp_w = reference.output, reference.weights
    if (isinstance(out, Tensor) and tuple(out.shape) == tuple(exp_w.shape) and isinstance(weights, Tensor)
            and tuple(weights.shape) == tuple(exp_out.shape) and exp_w.shape != exp_out.shape):
        return wrong("you returned `(weights, output)`; the order is `(output, weights)`: the output "
                     f"{tuple(exp_out.shape)} [B, H, S, D_k] first, then the weights {tuple(exp_w.shape)} [B, H, S, S].")
    if not isinstance(weights, Tensor) or tuple(weights.shape) != tuple(exp_w.shape):
        shape = tuple(weights.shape) if isinstance(weights, Tensor) else describe(weights)
        return wrong(f"weights should be a tensor of shape {tuple(exp_w.shape)} [B, H, S, S], got {shape}.")
    # a result less precise than its inputs: half precision is named by low_precision, float64 inputs
    # cast to float32 here
    for name, t, expected in (("weights", weights, exp_w), ("output", out, exp_out)):
        if isinstance(t, Tensor) and t.shape == expected.shape:
            half = low_precision(t, expected, name=f"your {name} tensor")
            if half is not None:
                return half
    wrong_dtype = [f"{name} are {t.dtype}" for name, t in (("weights", weights), ("outputs", out))
                   if isinstance(t, Tensor) and t.is_floating_point()
                   and torch.finfo(t.dtype).eps > torch.finfo(q.dtype).eps]
    if wrong_dtype:
        return wrong(f"your {' and your '.join(wrong_dtype)}, but q, k and v are {q.dtype}: compute in the dtype of "
                     "the inputs (a cast to a smaller float drops the precision that the inputs carry).")
    if q.dtype == torch.float64:  # the dtype rule: float32 inside, cast back, is refused even where it fits ATOL
        narrow = scaled_dot_product_attention(q.float(), k.float(), v.float(), causal_mask(S))
        for name, t, expected, nar in (("weights", weights, exp_w, narrow.weights), ("output", out, exp_out, narrow.output)):
            narrower = computed_narrower(t, expected, nar.double(), name=f"your {name}")
            if narrower is not None:
                return narrower
    w = weights.detach().cpu().to(torch.float64)
    leak = float(w[..., _future(q)].abs().nan_to_num(float("inf")).max())
    if not close(weights, exp_w):
        if bool((w < 0).any()):  # -inf written into the weights (0.0 -> -inf after the softmax), or any negative weight
            neg = "-inf" if bool(torch.isneginf(w).any()) else f"negative values (down to {float(w.min()):.2g})"
            return wrong(f"your weights hold {neg}: a weight is never negative. -inf belongs in the *scores*, before "
                         "the softmax, where exp turns it into a weight of exactly 0 and the softmax shares each row "
                         "among the keys that remain.")
        hint = diagnose(_nan_as(weights.detach().cpu()), MASKING_ORDER_MISTAKES, q, k, v)
        if hint is not None:
            return hint
        if bool(torch.isnan(w[..., _future(q)]).any()) and not bool(torch.isnan(w[..., ~_future(q)]).any()):
            return wrong("your weights are NaN in future cells only: a softmax gives NaN where every entry it "
                         "normalises over is -inf. If your masked scores hold -inf there, your softmax runs over an "
                         "axis that does not hold a query's keys: which axis of [B, H, S_q, S_k] holds them?")
        if leak > 0:
            return wrong(f"future keys get weight (up to {leak:.1e}); hide the upper triangle of the scores with -inf "
                         "(or torch.finfo(dtype).min) before the softmax.")
        if torch.isnan(w).any():
            row = int(torch.isnan(w).any(-1).nonzero()[0, -1])
            return wrong(f"row {row} of your weights is NaN: its query sees no key at all. Check which cells your "
                         "mask hides: only those above the diagonal.")
        mismatch = compare_tensors(weights, exp_w, name="weights")
        assert mismatch is not None
        return wrong(mismatch.message + " Did you scale the scores by 1/sqrt(D_k) and apply softmax over the last axis?")
    if leak > 0:
        return wrong(f"the weights look right to 5 decimals, but future keys still get weight (up to {leak:.1e}): a "
                     "finite fill such as -15 leaves exp(-15) behind, and loses to any real score below -15. Fill with "
                     "-inf (or torch.finfo(dtype).min), so that the future gets exactly 0.")
    mismatch = compare_tensors(out, exp_out, name="output")
    if mismatch is not None:
        return wrong(mismatch.message + " The weights are right; the output is `weights @ v`.")
    return None


def _solution_masking_order(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    S = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, H, S, S]
    scores = scores.masked_fill(~causal_mask(S), float("-inf"))  # hide the future before softmax
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def _masking_order_reference(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return scaled_dot_product_attention(q, k, v, causal_mask(q.shape[-2])).weights


@exercise(solution=_solution_masking_order,
          tables=(MistakeTable(MASKING_ORDER_MISTAKES, lambda: [_masking_order_case(c) for c in range(len(MASKING_ORDER_CASES))],
                               _masking_order_reference),))
def check_masking_order(fn: Callable[[Tensor, Tensor, Tensor], Any]) -> Feedback:
    """Check ``fn(q, k, v) -> (output [B, H, S, D_k], weights [B, H, S, S])``: causal attention.

    Tried on the cases of :data:`MASKING_ORDER_CASES`; the reference is
    ``attnlib.scaled_dot_product_attention`` with ``causal_mask(S)``. The future must get exactly 0
    (a finite fill such as -15 is within the tolerance but wrong in principle). Zeroing after softmax
    *and renormalising* is the same computation and passes.
    """
    for c in range(len(MASKING_ORDER_CASES)):
        problem = _masking_order_one(fn, *_masking_order_case(c))
        if problem is not None:
            return problem
    return correct("the future gets exactly 0 and each row shares all of its weight among the past.")


#: The fully masked row of the prediction exercise: 4 scores, every key hidden. ln 3 makes its
#: softmax easy by hand: e^(ln 3) = 3 against 1, 1, 1, so [1/2, 1/6, 1/6, 1/6].
FULLY_MASKED_SCORES = torch.tensor([math.log(3.0), 0.0, 0.0, 0.0], dtype=torch.float32)

#: The three ways of hiding every key that the prediction exercise asks about.
FULLY_MASKED_CASES: dict[str, str] = {
    "add -1e4": "torch.softmax(scores + (-1e4), dim=-1)",
    "masked_fill -1e4": "torch.softmax(scores.masked_fill(hidden, -1e4), dim=-1)",
    "add finfo.min": "torch.softmax(scores + torch.finfo(torch.float32).min, dim=-1)",
}


def _case_value(case: str) -> Tensor:
    s, hidden = FULLY_MASKED_SCORES, torch.ones(4, dtype=torch.bool)
    if case == "add -1e4":
        return torch.softmax(s + (-1e4), dim=-1)
    if case == "masked_fill -1e4":
        return torch.softmax(s.masked_fill(hidden, -1e4), dim=-1)
    return torch.softmax(s + torch.finfo(torch.float32).min, dim=-1)


#: For each case, the known wrong predictions (NaN written as -1) and their hints.
FULLY_MASKED_MISTAKES: dict[str, tuple[Mistake, ...]] = {
    "add -1e4": (
        Mistake("uniform", lambda: torch.full((4,), 0.25),
                "that is the answer in float16: there, numbers near 1e4 are 8 apart (in bfloat16, 64), so ln 3 - 1e4 "
                "rounds to -1e4 and the four scores become equal. The scores here are float32, where numbers near 1e4 are "
                "about 0.001 apart: -1e4 is added, not written, and the differences survive. Softmax only sees "
                "differences."),
        Mistake("zeros", lambda: torch.zeros(4),
                "softmax always returns a row that sums to 1; zeros come only from code that special-cases such "
                "rows (attnlib, PyTorch's fused attention given a bool or -inf mask, nn.MultiheadAttention's Python "
                "path with need_weights=False). Here -1e4 is added to every score, which changes no difference."),
        Mistake("NaN", lambda: torch.full((4,), -1.0),
                "NaN needs -inf - (-inf); every score here is finite (about -1e4), so the softmax is well defined. "
                "And adding one number to every score changes no difference between them."),
        Mistake("one-hot", lambda: torch.tensor([1.0, 0.0, 0.0, 0.0]),
                "a huge negative number does not pick out the largest score: the same -1e4 is added to all four, so "
                "their differences (ln 3, 0, 0, 0) stay as they are and the row is softmax(scores), not one-hot."),
        Mistake("exponentials", lambda: torch.tensor([3.0, 1.0, 1.0, 1.0]),
                "these are the exponentials e^s, not yet the weights: softmax divides each one by the sum of all four, "
                "so that the row sums to 1."),
        Mistake("one term short", lambda: torch.tensor([0.6, 0.2, 0.2, 0.2]),
                "right idea (the row is softmax(scores), as if nothing were masked), but your sum has one term too "
                "few: softmax divides each exponential by the sum of all four, one per score, e^(ln 3) + e^0 + e^0 + "
                "e^0, not by three of them."),
        Mistake("3 to 1", lambda: torch.tensor([0.75, 1 / 12, 1 / 12, 1 / 12]),
                "right idea (the row is softmax(scores), as if nothing were masked), but the sum is off: softmax divides "
                "each exponential by the sum of all four, e^(ln 3) + e^0 + e^0 + e^0 = 3 + 1 + 1 + 1, not by 3 + 1."),
    ),
    "masked_fill -1e4": (
        Mistake("unmasked", lambda: torch.softmax(FULLY_MASKED_SCORES, dim=-1),
                "masked_fill *replaces* the scores: all four become exactly -1e4. What does softmax give four equal scores?"),
        Mistake("zeros", lambda: torch.zeros(4),
                "softmax always returns a row that sums to 1. All four scores are replaced by the same number, "
                "-1e4: how does softmax share the row among four equal scores?"),
        Mistake("NaN", lambda: torch.full((4,), -1.0),
                "-1e4 is finite, so no -inf - (-inf) happens: all four scores are the same finite number. Softmax them."),
        Mistake("one-hot", lambda: torch.tensor([1.0, 0.0, 0.0, 0.0]),
                "masked_fill *replaces* every score by -1e4, so nothing is left of the largest one: the four scores "
                "are now equal. What does softmax make of that?"),
    ),
    "add finfo.min": (
        Mistake("unmasked", lambda: torch.softmax(FULLY_MASKED_SCORES, dim=-1),
                "torch.finfo(torch.float32).min is about -3.4e38. Adding ln 3 (about 1.1) to it gives the same float32 number "
                "(the gap between neighbouring floats there is about 2e31), so all four scores become equal: the "
                "differences are lost to rounding. Softmax the four equal scores."),
        Mistake("zeros", lambda: torch.zeros(4),
                "softmax always returns a row that sums to 1. Rounding makes all four sums equal to finfo.min: "
                "how does softmax share the row among four equal scores?"),
        Mistake("NaN", lambda: torch.full((4,), -1.0),
                "finfo.min is finite, so the row max is finite and nothing is NaN: all four scores round to the "
                "same number. Softmax them."),
        Mistake("one-hot", lambda: torch.tensor([1.0, 0.0, 0.0, 0.0]),
                "near finfo.min neighbouring float32 numbers are about 2e31 apart, so ln 3 + finfo.min and 0 + finfo.min "
                "round to the same number: the largest score is lost. What does softmax give four equal scores?"),
    ),
}


#: How close a hand prediction must be: the exercise asks for it without running anything, so two
#: decimals are enough (0.17 for 1/6); no listed mistake lies that close to a right row.
PREDICTION_ATOL = 0.01


def _prediction_same(a: Tensor, b: Tensor) -> bool:
    return close(_nan_as(a), _nan_as(b), atol=PREDICTION_ATOL, rtol=0.0)


_FULLY_MASKED_SOLUTION = {
    "add -1e4": [0.5, 0.17, 0.17, 0.17],
    "masked_fill -1e4": [0.25, 0.25, 0.25, 0.25],
    "add finfo.min": [0.25, 0.25, 0.25, 0.25],
}


@exercise(solution=_FULLY_MASKED_SOLUTION, kind="value",
          tables=tuple(MistakeTable(FULLY_MASKED_MISTAKES[case], lambda: [()], lambda case=case: _case_value(case), same=_prediction_same)
                       for case in FULLY_MASKED_CASES),
          not_generic={"float16": "a hand prediction has no dtype"})
def check_fully_masked_prediction(prediction: Any) -> Feedback:
    """Check a dict ``{case: [4 numbers]}`` predicting the weights of the fully masked row
    ``FULLY_MASKED_SCORES`` for each case of :data:`FULLY_MASKED_CASES` (write NaN as ``float("nan")``).

    A prediction made by hand is accepted to two decimals (:data:`PREDICTION_ATOL`).
    """
    if prediction is None:
        return todo("fill in the dict `prediction`, then run the cell again.")
    if not isinstance(prediction, dict):
        return wrong(f"prediction should be a dict with keys {list(FULLY_MASKED_CASES)}, got {describe(prediction)}.")
    missing = [c for c in FULLY_MASKED_CASES if c not in prediction]
    if missing:
        return wrong(f"the dict lacks the key(s) {missing}.")
    if all(prediction[c] is None for c in FULLY_MASKED_CASES):
        return todo("replace each None with a list of 4 numbers (use float('nan') for NaN), then run the cell again.")
    for case in FULLY_MASKED_CASES:
        value = prediction[case]
        if value is None:
            return todo(f"fill in {case!r} as well.")
        try:
            if isinstance(value, Tensor):
                got = value.detach().cpu().to(torch.float32).flatten()
            elif isinstance(value, (str, bytes, dict)):
                raise TypeError
            else:
                got = torch.tensor([float(x) for x in value], dtype=torch.float32)
        except Exception:  # anything that is not 4 numbers
            return wrong(f"{case!r}: give a list of 4 numbers, got {value!r}.")
        if got.numel() != 4:
            return wrong(f"{case!r}: the row has 4 keys, so give 4 numbers (got {got.numel()}).")
        if close(got, _case_value(case), atol=PREDICTION_ATOL, rtol=0.0):
            continue
        if close(got / 100, _case_value(case), atol=PREDICTION_ATOL, rtol=0.0):
            return wrong(f"{case!r}: your numbers look like percentages: give the weights as softmax returns them, "
                         "fractions between 0 and 1 that sum to 1 (0.5 rather than 50).")
        got = _nan_as(got)
        for m in FULLY_MASKED_MISTAKES[case]:
            if _prediction_same(got, m.compute()):
                return wrong(f"{case!r}: {m.hint}")
        return wrong(f"{case!r} is not right. Work it out in two steps: first the 4 scores that softmax receives "
                     "after the mask (written over the scores, or added to them, and rounded in float32), then what "
                     "softmax makes of them; only the differences between the scores matter.")
    return correct(
        "adding -1e4 hides nothing in a fully masked row (softmax only sees differences), writing -1e4 gives "
        "a uniform row, and adding finfo.min gives a uniform row too, because rounding erases the differences."
    )


def causal_eval_stats(model: Any, data: Tensor, *, seq_len: int, batch_size: int = 64, seed: int = 1) -> dict[str, float]:
    """What a :class:`attnbook.toy_lm.TinyLM` predicts with the future hidden, on one seeded batch.

    Returns:
        ``accuracy`` (the top prediction is the next character), ``copy_rate`` (it is the current
        character, the one at the query's own position) and ``top_probability`` (the mean
        probability of the top prediction), all over every position of ``batch_size`` windows.
    """
    from .toy_lm import sample_batch

    x, y = sample_batch(data, batch_size, seq_len, torch.Generator().manual_seed(seed))  # [B, S], [B, S]
    model.eval()
    with torch.no_grad():
        probs = torch.softmax(model(x, causal=True), dim=-1)  # [B, S, V]
    top_p, top = probs.max(dim=-1)  # [B, S], [B, S]
    return {
        "accuracy": (top == y).float().mean().item(),
        "copy_rate": (top == x).float().mean().item(),
        "top_probability": top_p.mean().item(),
    }


def loss_curve_alt(curves: dict[str, list[float]]) -> str:
    """The alt text of section 4.1's loss figure, written from the two training curves.

    ``curves`` maps ``"no mask"`` and ``"causal mask"`` to the training loss of each step (step 1
    first). The steps and levels it states are rounded (steps to 5 or 10) and each is checked for a
    margin that last-bit differences between CPUs cannot cross: it raises ``AssertionError`` naming
    the number that has none, so the description never states what a reader's run does not show.
    """
    free, masked = list(curves["no mask"]), list(curves["causal mask"])
    if len(free) != len(masked) or len(free) < 100:
        raise ValueError(f"expected two curves of the same length, at least 100 steps, got {len(free)} and {len(masked)}")

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise AssertionError(f"the loss figure's description has no margin: {what}")

    start = round(free[0])
    need(all(abs(c[0] - start) < 0.3 for c in (free, masked)), f"both curves start near {start}")
    # together: until the unmasked loss is 0.25 below the masked one, rounded to 10 steps
    split = next(i + 1 for i, (f, m) in enumerate(zip(free, masked)) if m - f > 0.25)
    together = 10 * round(split / 10)
    need(abs(split - (together - 5)) >= 2 and abs(split - (together + 5)) >= 2,
         f"the curves part at step {split}, near a rounding boundary")
    # below 1 by step `below_one` (a multiple of 5), and not yet 5 steps earlier
    below_one = 5 * math.ceil(next(i + 1 for i, f in enumerate(free) if f < 1) / 5)
    need(free[below_one - 1] < 0.9 and free[below_one - 6] > 1.1, f"the loss crosses 1 near step {below_one}")
    # below 0.25 from step `low` on (a multiple of 10), and not from 10 steps earlier
    low = 10 * math.ceil((max(i + 1 for i, f in enumerate(free) if f >= 0.25) + 1) / 10)
    need(max(free[low - 1:]) < 0.23 and max(free[low - 11:]) > 0.27, f"the loss stays below 0.25 from step {low}")
    need(free[-1] < 0.09, "the last step's loss is below 0.1")
    # the masked curve's level: every 10-step mean of its second half, between two halves
    means = [sum(masked[j:j + 10]) / 10 for j in range(len(masked) // 2, len(masked) - 9)]
    lo, hi = math.floor(2 * min(means)) / 2, math.ceil(2 * max(means)) / 2
    need(min(means) - lo > 0.02 and hi - max(means) > 0.02, f"the masked loss levels off between {lo:g} and {hi:g}")
    return (
        f"Line plot of training loss against training step for two tiny models. Both start near {start} and "
        f"fall together for about {together} steps. Then the model trained without the causal mask falls "
        f"steeply: below 1 by step {below_one}, below 0.25 from step {low} on, and it ends below 0.1. The "
        f"model trained with the mask falls more slowly and levels off between {lo:g} and {hi:g}."
    )


# --- the parallel pass against the prefix passes ------------------------------------------


@torch.no_grad()
def time_parallel_and_prefixes(
    attention: MultiHeadSelfAttention,
    x: Tensor,
    *,
    repeats: int = 5,
    parallel_repeats: int | None = None,
    cpu_threads: int | None = None,
) -> tuple[float, float]:
    """Median wall time of the two ways to get a causal output for every position of ``x``.

    * parallel: one call ``attention(x, causal=True)`` over all ``S`` positions;
    * prefixes: ``S`` calls ``attention(x[:, :i])`` for ``i = 1..S``, keeping the last position
      of each (no mask needed: a prefix has no future). This is the same result, computed the
      way a model without a causal mask would have to compute it to avoid cheating.

    Both use PyTorch's fused attention (``need_weights=False``). One warm-up run of each comes
    first.

    Args:
        attention: the module to time (its device is where the timing runs).
        x: ``[B, S, D]`` input on the module's device.
        repeats: how many timed runs of the prefixes; the median is returned.
        parallel_repeats: how many timed runs of the parallel pass (default ``4 * repeats``). It
            is cheap, so more runs buy a steadier median at little cost.
        cpu_threads: on a CPU, run with this many threads (restored afterwards); ``None`` keeps
            PyTorch's setting. With ``cpu_threads=1`` the clock is the CPU time of the calling
            thread (``time.thread_time``), which other programs sharing the machine cannot inflate;
            otherwise it is wall time (``time.perf_counter``, after synchronising a GPU).

    Returns:
        ``(parallel_seconds, prefixes_seconds)``.
    """
    if repeats < 1 or (parallel_repeats is not None and parallel_repeats < 1):
        raise ValueError(f"repeats must be >= 1, got repeats={repeats}, parallel_repeats={parallel_repeats}")
    if x.dim() != 3:
        raise ValueError(f"x must be [B, S, D], got shape {tuple(x.shape)}")
    S = x.shape[1]

    def parallel() -> Tensor:
        return attention(x, causal=True, need_weights=False).hidden_states  # [B, S, D]

    def prefixes() -> Tensor:
        outs = [attention(x[:, :i], need_weights=False).hidden_states[:, -1] for i in range(1, S + 1)]  # S x [B, D]
        return torch.stack(outs, dim=1)  # [B, S, D]

    device = x.device
    threads = torch.get_num_threads()
    if cpu_threads is not None and device.type == "cpu":
        torch.set_num_threads(cpu_threads)
    try:
        n_parallel = 4 * repeats if parallel_repeats is None else parallel_repeats
        clock = time.thread_time if (cpu_threads == 1 and device.type == "cpu") else time.perf_counter
        ms = [
            interleaved_median_ms({"run": fn}, repeats=n, warmup=1, device=device, clock=clock)["run"]
            for fn, n in ((parallel, n_parallel), (prefixes, repeats))
        ]
        return ms[0] / 1000.0, ms[1] / 1000.0
    finally:
        torch.set_num_threads(threads)


# --- the mask explorer ----------------------------------------------------------------------


def causal_explorer(scores: Tensor, tokens: list[str]) -> Callable[[int], Any]:
    """A frame function for the causal-mask explorer of one ``[S, S]`` score matrix.

    The scores and tokens are copied when the explorer is made, so the frame function reads no
    state that later cells can change. Each frame shows one query: the weights it gets when the
    future is filled with ``0`` (the future leaks) and with ``-inf`` (the future gets exactly 0).

    >>> frame = causal_explorer(torch.zeros(3, 3), ["a", "b", "c"])
    >>> frame(0).caption
    "'a' may see: 'a'. Filling the future with 0 would leak 0.67 of its weight to 'b', 'c'."
    """
    from .slider import Frame, Panel

    if scores.dim() != 2 or scores.shape[0] != scores.shape[1] or scores.shape[0] != len(tokens):
        raise ValueError(f"scores must be [S, S] with S = len(tokens) = {len(tokens)}, got {tuple(scores.shape)}")
    scores = scores.detach().cpu().double().clone()  # [S, S], a private copy
    tokens = list(tokens)
    S = len(tokens)
    future = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)  # [S, S], True = j > i
    with_zero = torch.softmax(scores.masked_fill(future, 0.0), dim=-1)  # [S, S]: the future leaks
    with_inf = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)  # [S, S]
    vmin, vmax = float(scores.min()), float(scores.max())

    def frame(looking: int) -> Any:
        hidden = future[looking][None].numpy()  # [1, S]
        leak = float(with_zero[looking][future[looking]].sum())
        later = ", ".join(f"'{t}'" for t in tokens[looking + 1:])
        caption = f"'{tokens[looking]}' may see: {', '.join(repr(t) for t in tokens[: looking + 1])}."
        caption += (f" Filling the future with 0 would leak {leak:.2f} of its weight to {later}." if later
                    else " It is the last token: there is no future to hide.")
        return Frame(
            label=f"{looking}: {tokens[looking]}",
            panels=[
                Panel(scores[looking][None].numpy(), [tokens[looking]], tokens, title="scores (future hatched)",
                      vmin=vmin, vmax=vmax, masked=hidden),
                Panel(torch.stack([with_zero[looking], with_inf[looking]]).numpy(),
                      ["fill 0", "fill -inf"], tokens, title="weights", vmin=0.0, vmax=1.0),
            ],
            caption=caption,
        )

    return frame


# --- how libraries treat a sequence whose keys are all padding ------------------------------


def mask_conventions_agree(mha: torch.nn.MultiheadAttention, x: Tensor, hf_mask: Tensor, blocked: Tensor,
                           may_attend: Tensor, additive: Tensor) -> dict[str, bool]:
    """Whether one padded batch gives the same output through each API in its own mask convention.

    ``mha`` is a one-head ``nn.MultiheadAttention`` (batch first); ``x`` ``[B, S, D]``; ``hf_mask`` ``[B, S]``
    (1 = keep), ``blocked`` ``[B, S]`` (True = blocked), ``may_attend`` ``[B, 1, 1, S]`` (True = may attend) and
    ``additive`` ``[B, 1, 1, S]`` (0 keep, finfo.min hide) are the same padding; the module takes ``blocked``
    as its ``key_padding_mask`` and, expanded to one ``[S, S]`` mask per sequence, as its bool ``attn_mask``, and
    ``additive`` as its float ``attn_mask``. The reference is attnlib with
    ``padding_mask(hf_mask)``, run on the module's own projections (its packed ``in_proj_weight``, chapter 6,
    and ``out_proj``); each API's output is compared with it to 1e-5.
    """
    import torch.nn.functional as F

    with torch.no_grad():
        # the module keeps W^Q, W^K, W^V stacked in one [3D, D] matrix, with biases
        projections = zip(mha.in_proj_weight.chunk(3), mha.in_proj_bias.chunk(3))
        q, k, v = (F.linear(x, w, b)[:, None] for w, b in projections)  # [B, 1, S, D] each: one head
        reference = mha.out_proj(scaled_dot_product_attention(q, k, v, padding_mask(hf_mask)).output[:, 0])
        B, S = blocked.shape
        outputs = {
            "nn.MultiheadAttention, True = blocked": mha(x, x, x, key_padding_mask=blocked)[0],
            # a per-sequence attn_mask is [B * H, S_q, S_k], here with H = 1: [B, S, S]
            "nn.MultiheadAttention, bool attn_mask": mha(x, x, x, attn_mask=blocked[:, None, :].expand(B, S, S))[0],
            "nn.MultiheadAttention, additive attn_mask": mha(x, x, x, attn_mask=additive[:, 0].expand(B, S, S))[0],
            "SDPA, bool True = may attend": mha.out_proj(F.scaled_dot_product_attention(q, k, v, attn_mask=may_attend)[:, 0]),
            "SDPA, additive finfo.min": mha.out_proj(F.scaled_dot_product_attention(q, k, v, attn_mask=additive)[:, 0]),
        }
    return {name: torch.allclose(out, reference, atol=1e-5) for name, out in outputs.items()}


def bert_padding_equals_alone() -> bool:
    """Whether a tiny random-weight BERT given ``attention_mask = [1, 1, 1, 0, 0]`` (Hugging Face: 1 = keep)
    returns, at the 3 real tokens, what it returns on those 3 tokens alone (to 1e-5). The global random state
    is left as it was."""
    from transformers import BertConfig, BertModel

    with torch.random.fork_rng():
        torch.manual_seed(0)
        bert = BertModel(BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=32)).eval()
    ids = torch.tensor([[5, 6, 7, 0, 0]])
    with torch.no_grad():
        padded = bert(ids, attention_mask=torch.tensor([[1, 1, 1, 0, 0]])).last_hidden_state[0, :3]
        alone = bert(ids[:, :3]).last_hidden_state[0]
    return torch.allclose(padded, alone, atol=1e-5)


def mha_fast_path(call: Callable[[], Any]) -> tuple[Any, bool]:
    """Run ``call()`` and say whether ``nn.MultiheadAttention`` took its fused inference fast path.

    The fast path is the single ATen operator ``_native_multi_head_attention``; the Python path
    (``F.multi_head_attention_forward``) never calls it. The operator is recorded with a
    ``TorchDispatchMode``, which sees every ATen call without changing which path runs.

    Returns:
        ``(call's result, True if _native_multi_head_attention ran)``.

    >>> from torch import nn
    >>> mha = nn.MultiheadAttention(4, 2, batch_first=True).eval()
    >>> x = torch.zeros(1, 3, 4)
    >>> with torch.no_grad():
    ...     print(mha_fast_path(lambda: mha(x, x, x))[1])
    True
    >>> print(mha_fast_path(lambda: mha(x, x, x))[1])        # grad on, weights require grad
    False
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class _RecordOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.names.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with _RecordOps() as ops:
        result = call()
    return result, any(name.endswith("_native_multi_head_attention") for name in ops.names)


def mha_all_padding_outputs(
    head_counts: tuple[int, ...] = (1, 2, 3, 4), d_model: int = 12, device: torch.device | str = "cpu"
) -> list[dict[str, Any]]:
    """What ``torch.nn.MultiheadAttention`` returns for a sequence whose keys are all padding.

    Runs one module per configuration (head count, ``batch_first``, train/eval, grad mode off,
    on, or on with the module frozen by ``requires_grad_(False)``, ``need_weights``) on a batch
    of two sequences, the second entirely padding (``key_padding_mask`` True everywhere), records
    whether the fused fast path ran (:func:`mha_fast_path`) and classifies the second sequence's
    output as ``"NaN"`` (every entry NaN), ``"bias"`` (exactly the output projection's bias: a
    zero attention output) or ``"other"``.

    Returns:
        one dict per configuration: ``heads``, ``batch_first``, ``mode``, ``grad`` (grad mode on),
        ``frozen``, ``need_weights``, ``fast_path`` and ``output``.

    >>> rows = mha_all_padding_outputs((1,), d_model=4)
    >>> sorted({r["output"] for r in rows})
    ['NaN', 'bias']
    """
    from itertools import product

    from torch import nn

    rows: list[dict[str, Any]] = []
    x = torch.randn(2, 3, d_model, generator=torch.Generator().manual_seed(3)).to(device)  # [B, S, D]
    all_padding = torch.tensor([[False, False, True], [True, True, True]], device=device)  # True = ignore
    for heads, batch_first, mode, (grad, frozen), need_weights in product(
        head_counts, (True, False), ("train", "eval"), ((False, False), (True, False), (True, True)), (True, False)
    ):
        torch.manual_seed(0)
        mha = nn.MultiheadAttention(d_model, heads, batch_first=batch_first).to(device)
        mha.train(mode == "train").requires_grad_(not frozen)
        xi = x if batch_first else x.transpose(0, 1)  # [B, S, D] or [S, B, D]
        with torch.set_grad_enabled(grad):
            (out, _), fast = mha_fast_path(
                lambda: mha(xi, xi, xi, key_padding_mask=all_padding, need_weights=need_weights))
        second = (out[1] if batch_first else out[:, 1]).detach()  # [S, D]
        if second.isnan().all():
            kind = "NaN"
        elif torch.equal(second, mha.out_proj.bias.detach().expand_as(second)):
            kind = "bias"
        else:
            kind = "other"
        rows.append(dict(heads=heads, batch_first=batch_first, mode=mode, grad=grad, frozen=frozen,
                         need_weights=need_weights, fast_path=fast, output=kind))
    return rows


def mask_seen_by_attention(model: Any, attention_module: Any, **inputs: Tensor) -> Tensor | None:
    """The ``attention_mask`` a Hugging Face model hands to one of its attention modules.

    Runs ``model(**inputs)`` without gradients and records the keyword argument
    ``attention_mask`` of ``attention_module``'s forward call (``None`` when the model passes none).
    """
    seen: dict[str, Any] = {}

    def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        seen["mask"] = kwargs.get("attention_mask")

    handle = attention_module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        handle.remove()
    if "mask" not in seen:
        raise ValueError("the attention module was not called with keyword arguments; cannot read its mask")
    return seen["mask"]


def document_mask(lengths: list[int]) -> Tensor:
    """Causal attention within each document of a packed sequence: ``[S, S]``, True = may attend.

    ``lengths`` are the documents' lengths in the order they were packed; ``S = sum(lengths)``.

    >>> document_mask([2, 1]).int().tolist()
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    if not lengths or any(int(n) < 1 for n in lengths):
        raise ValueError(f"lengths must be a non-empty list of positive ints, got {lengths}")
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # [S]: document id
    same_doc = doc[:, None] == doc[None, :]  # [S, S]
    return same_doc & causal_mask(len(doc))


def prefix_lm_mask(prefix: int, S: int) -> Tensor:
    """Prefix-LM mask: the first ``prefix`` positions see each other, later ones are causal.

    >>> prefix_lm_mask(2, 4).int().tolist()
    [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    """
    if not 0 <= prefix <= S:
        raise ValueError(f"prefix must be between 0 and S = {S}, got {prefix}")
    mask = causal_mask(S).clone()  # [S, S]
    mask[:prefix, :prefix] = True
    return mask


#: The left-padded sequence of the NaN experiments and of the combined-mask diagram:
#: two padding tokens first, then "Old books ." (the third sentence of the chapter's batch).
LEFT_PADDED_TOKENS = ["<pad>", "<pad>", "Old", "books", "."]
LEFT_PADDED_MASK = torch.tensor([[0, 0, 1, 1, 1]])  # [B, S] = [1, 5], 1 = real token

#: The ways of hiding the keys that :func:`left_padded_stack` compares.
STACK_FILLS = (
    "softmax, -inf written",
    "softmax, finfo.min written",
    "softmax, -inf, pad sees itself",
    "attnlib (zero rows)",
    "SDPA, bool mask",
)


def _stack_layer(x: Tensor, w: tuple[Tensor, Tensor, Tensor], mask: Tensor, fill: str) -> Tensor:
    """One single-head attention layer with a residual: ``x + attention(x)``; ``x`` is ``[B, S, D]``."""
    q, k, v = (x @ m for m in w)  # [B, S, D] each
    if fill == "attnlib (zero rows)":
        return x + scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], mask).output[:, 0]
    if fill == "SDPA, bool mask":
        return x + torch.nn.functional.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None],
                                                                     attn_mask=mask)[:, 0]
    if fill == "softmax, -inf, pad sees itself":
        mask = mask | torch.eye(mask.shape[-1], dtype=torch.bool)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, S, S]
    value = torch.finfo(x.dtype).min if fill == "softmax, finfo.min written" else float("-inf")
    weights = torch.softmax(scores.masked_fill(~mask[:, 0], value), dim=-1)
    return x + weights @ v


def left_padded_stack(num_layers: int, fill: str, *, d_model: int = 8, seed: int = 0) -> dict[str, Any]:
    """Run :data:`LEFT_PADDED_MASK` through ``num_layers`` attention layers with residuals, causal and
    padding mask combined, and a loss on the real positions only; then the backward pass.

    Returns ``pad_rows_nan`` (the padded positions' outputs after layer 1 contain NaN), ``loss``
    (a float, NaN included), ``real_finite`` (the last layer's real positions are finite) and
    ``grad_finite`` (the input's gradient is finite). ``fill`` is one of :data:`STACK_FILLS`.
    """
    if fill not in STACK_FILLS:
        raise ValueError(f"fill must be one of {STACK_FILLS}, got {fill!r}")
    gen = torch.Generator().manual_seed(seed)
    layers = [tuple(torch.randn(d_model, d_model, generator=gen) / math.sqrt(d_model) for _ in range(3))
              for _ in range(num_layers)]
    x = torch.randn(1, LEFT_PADDED_MASK.shape[1], d_model, generator=gen).requires_grad_()  # [B, S, D]
    mask = combine_masks(causal_mask(LEFT_PADDED_MASK.shape[1]), padding_mask(LEFT_PADDED_MASK))  # [B, 1, S, S]
    real = LEFT_PADDED_MASK[0].bool()
    h, pad_rows_nan = x, False
    for n, w in enumerate(layers):
        h = _stack_layer(h, w, mask, fill)
        if n == 0:
            pad_rows_nan = bool(h[0, ~real].isnan().any())
    loss = h[0, real].pow(2).mean()  # a loss on the real positions only
    loss.backward()
    assert x.grad is not None
    return {"pad_rows_nan": pad_rows_nan, "loss": float(loss.detach()), "real_finite": bool(h[0, real].isfinite().all()),
            "grad_finite": bool(x.grad.isfinite().all())}


def _row_kind(row: Tensor, mean: Tensor, unmasked: Tensor) -> str:
    """Name what a fully masked output row is: NaN, the mean of the values, or the unmasked row."""
    row, mean, unmasked = (t.float() for t in (row, mean, unmasked))
    if row.isnan().any():
        return "NaN"
    if torch.allclose(row, mean, atol=2e-2) and not torch.allclose(row, unmasked, atol=2e-2):
        return "mean of V"
    if torch.allclose(row, unmasked, atol=2e-2):
        return "as if unmasked"
    return "other"


def fully_masked_row_by_dtype(dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
                              ) -> dict[str, dict[str, str]]:
    """What a query whose every key is hidden with ``torch.finfo(dtype).min`` receives, per dtype.

    Three ways of applying the finite fill (CPU): written over the scores with ``masked_fill`` and a
    plain softmax; *added* to the scores in the dtype (as an eager implementation does), once with
    ordinary scores and once with scores of -16 or less; and passed to
    ``F.scaled_dot_product_attention`` as an additive ``attn_mask``. Each result is named by
    :func:`_row_kind`: ``"mean of V"`` (uniform weights), ``"as if unmasked"`` or ``"NaN"``.
    """
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 3, 4, generator=gen) for _ in range(3))  # [B, H, S, D_k]
    hidden = torch.ones(3, dtype=torch.bool)  # every key of the row is hidden
    out: dict[str, dict[str, str]] = {}
    for dtype in dtypes:
        qd, kd, vd = (t.to(dtype) for t in (q, k, v))
        fmin = torch.finfo(dtype).min
        scores = (qd @ kd.transpose(-2, -1))[0, 0, 0] / 2  # [3]: the row of query 0
        low = torch.tensor([-20.0, -17.0, -30.0], dtype=dtype)  # scores of -16 or less
        mean, unmasked = vd[0, 0].mean(dim=0), torch.softmax(scores.float(), dim=-1).to(dtype) @ vd[0, 0]
        additive = torch.zeros(3, dtype=dtype).masked_fill(hidden, fmin)  # [3]: 0 keep, finfo.min hide
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            qd[:, :, :1], kd, vd, attn_mask=additive[None, None, None, :])[0, 0, 0]
        low_unmasked = torch.softmax(low.float(), dim=-1).to(dtype) @ vd[0, 0]
        out[str(dtype).replace("torch.", "")] = {
            "masked_fill": _row_kind(torch.softmax(scores.masked_fill(hidden, fmin), dim=-1) @ vd[0, 0], mean, unmasked),
            "added": _row_kind(torch.softmax(scores + additive, dim=-1) @ vd[0, 0], mean, unmasked),
            "added, scores <= -16": _row_kind(torch.softmax(low + additive, dim=-1) @ vd[0, 0], mean, low_unmasked),
            "SDPA additive": _row_kind(sdpa, mean, unmasked),
        }
    return out


def sdpa_fully_masked_paths(dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.bfloat16,
                                                               torch.float16),
                            device: torch.device | str = "cpu") -> list[dict[str, Any]]:
    """What ``F.scaled_dot_product_attention`` returns for a query whose keys are all hidden, on every path a
    reader can take on one device: each kernel it may pick there (``SDPBackend.MATH`` and the fused
    ``FLASH_ATTENTION`` kernel), a bool or an additive ``-inf`` mask, with and without gradients, in each dtype.

    Returns one dict per path: ``dtype``, ``backend``, ``mask``, ``grad`` and ``row`` ("zeros", "NaN" or
    "other", the output row that may see nothing), ``grad_finite`` (``None`` without gradients), or
    ``row = "not run"`` where the kernel refuses the inputs.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    may_see = torch.tensor([[True, False, False], [False, False, False], [True, True, True]], device=device)
    rows: list[dict[str, Any]] = []
    for dtype in dtypes:
        for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
            for form in ("bool", "additive -inf"):
                for grad in (False, True):
                    gens = [torch.Generator().manual_seed(i) for i in range(3)]
                    q, k, v = (torch.randn(1, 1, 3, 4, generator=g).to(device, dtype).requires_grad_(grad)
                               for g in gens)  # [B, H, S, D_k] each
                    mask = may_see if form == "bool" else torch.zeros(3, 3, dtype=dtype, device=device).masked_fill(
                        ~may_see, float("-inf"))
                    record: dict[str, Any] = {"dtype": str(dtype).replace("torch.", ""), "backend": backend.name,
                                              "mask": form, "grad": grad, "grad_finite": None}
                    try:
                        with sdpa_kernel([backend]):
                            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                    except RuntimeError:  # this kernel does not take these inputs on this device
                        rows.append({**record, "row": "not run"})
                        continue
                    row = out[0, 0, 1].detach()
                    record["row"] = "zeros" if bool((row == 0).all()) else "NaN" if bool(row.isnan().any()) else "other"
                    if grad:
                        out.float().sum().backward()
                        record["grad_finite"] = all(bool(t.grad.isfinite().all()) for t in (q, k, v))
                    rows.append(record)
    return rows


# ---- diagrams ------------------------------------------------------------------------------------

#: The padded batch of the padding-mask section: three sentences of 8, 5 and 3 tokens.
PADDED_BATCH: list[list[str]] = [list(BOOKS_SENTENCE), ["The", "books", "are", "old", "."], ["Old", "books", "."]]

#: The sizes of the encoder / decoder / cross-attention example: batch, heads, head width,
#: source length S and target length T.
ENCODER_DECODER: dict[str, int] = {"B": 2, "H": 4, "D_k": 8, "S": 7, "T": 5}


#: The next-token diagram of section 4.1: a window of characters, the text's next character after it,
#: and the position whose label is drawn among its keys.
NEXT_TOKEN_TEXT, NEXT_TOKEN_QUERY = "The dogs", 4


@diagram
def next_token_diagram() -> Diagram:
    """Next-token training: position i is scored on token i+1, which sits among its keys without a mask."""
    text, i = NEXT_TOKEN_TEXT, NEXT_TOKEN_QUERY
    S, cell, x0, y0 = len(text) - 1, 44, 76, 44
    shown = [c if c != " " else "\u2423" for c in text]
    y1 = y0 + cell + 56
    d = Diagram("ch04_next_token", x0 + S * cell + 14, y1 + cell + 76,
                title="Next-token training",
                alt=f"Two rows of {S} cells for the text '{text}' (a space drawn as an open box): the input "
                    f"characters '{text[:S]}' at positions 0 to {S - 1}, and below them the label of each position, "
                    f"the next character, '{text[1:]}', so the labels are the input shifted left by one. Position "
                    f"{i}, '{text[i]}', is scored on '{text[i + 1]}', and an arrow shows that '{text[i + 1]}' is "
                    f"the input at position {i + 1}: without a mask it is among position {i}'s keys, and a causal "
                    "mask hides it.")
    for j in range(S):
        xc = x0 + j * cell + cell / 2
        d.text(xc, y0 - 10, str(j), size=14, color=MUTED)
        d.rect(x0 + j * cell, y0, cell, cell, fill="orange" if j == i + 1 else "sky", tint=True, rx=0,
               width=2.5 if j == i else 1)
        d.text(xc, y0 + cell / 2 + 6, shown[j], size=17)
        d.rect(x0 + j * cell, y1, cell, cell, fill="orange" if j == i else "grey", tint=True, rx=0,
               width=2.5 if j == i else 1)
        d.text(xc, y1 + cell / 2 + 6, shown[j + 1], size=17)
    d.text(x0 - 8, y0 + cell / 2 + 5, "input", size=14, anchor="end")
    d.text(x0 - 8, y1 + cell / 2 + 5, "label", size=14, anchor="end")
    d.text(8, y0 - 10, "position", size=14, anchor="start", color=MUTED)
    xa = x0 + i * cell + cell / 2
    d.arrow(xa + 8, y1 - 2, x0 + (i + 1) * cell + cell / 2 - 4, y0 + cell + 8, color="vermillion")
    yt = y1 + cell + 28
    d.text(8, yt, f"position {i} is scored on '{text[i + 1]}', which is its key {i + 1}:", size=14,
           anchor="start")
    d.text(8, yt + 24, "visible without a mask, hidden by a causal one", size=14, anchor="start")
    return d


@diagram
def causal_mask_diagram() -> Diagram:
    """The causal mask of the book's sentence: query rows, key columns, the future hidden."""
    tokens = list(BOOKS_SENTENCE)
    S, cell, x0, y0 = len(tokens), 42, 62, 64
    allowed = causal_mask(S)
    d = Diagram("ch04_causal_mask", x0 + S * cell + 14, y0 + S * cell + 44,
                title="The causal mask",
                alt=f"An {S} by {S} grid for the sentence '{' '.join(tokens)}': rows are queries, columns are "
                    "keys. The cells on and below the diagonal are shaded (may attend); every cell above it, a "
                    "later key, holds minus infinity (hidden).")
    d.text(x0 + S * cell / 2, 20, "keys: the tokens looked at", size=14, color=MUTED)
    d.text(8, 42, "queries \u2193", size=14, anchor="start", color=MUTED)
    fills = [["sky" if allowed[i, j] else "grey" for j in range(S)] for i in range(S)]
    labels = [["" if allowed[i, j] else "\u2212\u221e" for j in range(S)] for i in range(S)]
    d.grid(x0, y0, fills, cell=cell, labels=labels, row_labels=tokens, col_labels=tokens, size=13)
    yl = y0 + S * cell + 30
    d.rect(x0, yl - 14, 18, 18, fill="sky", tint=True, rx=0, width=1)
    d.text(x0 + 26, yl, "may attend (j \u2264 i)", size=14, anchor="start")
    d.rect(x0 + 190, yl - 14, 18, 18, fill="grey", tint=True, rx=0, width=1)
    d.text(x0 + 216, yl, "hidden (j > i)", size=14, anchor="start")
    return d


@diagram
def padding_mask_diagram() -> Diagram:
    """The padded batch and its padding mask: one row per sequence, shared by every head and query."""
    B, S = len(PADDED_BATCH), max(len(s) for s in PADDED_BATCH)
    cw, ch, x0, y0 = 50, 34, 66, 40
    d = Diagram("ch04_padding_mask", x0 + S * cw + 12, y0 + B * ch + 290,
                title="The padding mask",
                alt=f"The batch of {B} sentences padded to {S} tokens, one row each: real tokens are shaded, "
                    "the padding cells are grey and hidden. The mask has one row per sequence, of shape "
                    f"(B, 1, 1, S) = ({B}, 1, 1, {S}), shared by every head and every query: below, sequence {B - 1}'s "
                    f"row is repeated down its {S} query rows and behind for the H heads, (1, 1, 1, {S}) to "
                    f"(1, H, {S}, {S}).")
    d.text(x0 + S * cw / 2, 22, "keys of each sequence", size=15, color=MUTED)
    for b, sent in enumerate(PADDED_BATCH):
        for j in range(S):
            real = j < len(sent)
            x, y = x0 + j * cw, y0 + b * ch
            d.rect(x, y, cw, ch, fill="sky" if real else "grey", tint=True, rx=0, width=1)
            if real:
                d.text(x + cw / 2, y + ch / 2 + 5, sent[j], size=15)
        d.text(x0 - 8, y0 + b * ch + ch / 2 + 5, f"seq {b}", size=15, anchor="end")
    yl = y0 + B * ch + 30
    d.text(8, yl, f"mask [B, 1, 1, S] = [{B}, 1, 1, {S}]; grey: <pad>, hidden", size=15, anchor="start")
    # inset: sequence 2's row, broadcast down the S_q query rows and behind for the H heads
    last = PADDED_BATCH[-1]
    sc, yi, xi, heads = 18, yl + 72, 150, 3
    d.text(8, yl + 36, f"broadcast for seq {B - 1}: its row, repeated", size=15, anchor="start")
    for h in reversed(range(heads)):
        ox, oy = xi + 12 * h, yi - 10 * h
        for i in range(S):
            for j in range(S):
                d.rect(ox + j * sc, oy + i * sc, sc, sc, fill="sky" if j < len(last) else "grey", tint=True,
                       rx=0, width=0.6 if h else 1)
    d.text(xi - 8, yi + 4 * sc + 5, f"{S} queries", size=15, anchor="end")
    d.text(xi + S * sc + 12 * heads + 8, yi - 10 * (heads - 1) + 12, "H heads", size=15, anchor="start")
    d.text(xi + S * sc / 2, yi + S * sc + 20, f"[1, 1, 1, {S}] \u2192 [1, H, {S}, {S}]", size=15)
    return d


@diagram
def combined_mask_diagram() -> Diagram:
    """Causal AND padding for a left-padded sequence: two rows are left with nothing to see."""
    tokens, am = LEFT_PADDED_TOKENS, LEFT_PADDED_MASK[0].bool()
    S, cell, x0, y0 = len(tokens), 52, 62, 46
    causal = causal_mask(S)
    d = Diagram("ch04_combined_mask", x0 + S * cell + 120, y0 + S * cell + 96,
                title="Causal and padding masks combined",
                alt=f"A {S} by {S} grid for a left-padded sequence, two padding tokens and then "
                    f"'{' '.join(tokens[2:])}': rows are queries, "
                    "columns keys. Cells are shaded where the query may attend, grey where the key is in its "
                    "future and orange where the key is padding. The two padding rows at the top have no "
                    "visible key at all.")
    d.text(x0 + S * cell / 2, 16, "keys", size=14, color=MUTED)
    fills = [["sky" if causal[i, j] and am[j] else ("grey" if not causal[i, j] else "orange") for j in range(S)]
             for i in range(S)]
    d.grid(x0, y0, fills, cell=cell, row_labels=tokens, col_labels=tokens, size=14)
    xa = x0 + S * cell + 10
    d.line(xa, y0 + 3, xa + 10, y0 + 3)
    d.line(xa + 10, y0 + 3, xa + 10, y0 + 2 * cell - 3)
    d.line(xa, y0 + 2 * cell - 3, xa + 10, y0 + 2 * cell - 3)
    d.line(xa + 10, y0 + cell, xa + 18, y0 + cell)
    d.text(xa + 24, y0 + cell - 8, "nothing", size=14, anchor="start")
    d.text(xa + 24, y0 + cell + 10, "to see", size=14, anchor="start")
    yl = y0 + S * cell + 30
    for n, (fill, what) in enumerate((("sky", "may attend"), ("grey", "future"), ("orange", "padding key"))):
        x = x0 - 54 + n * 132
        d.rect(x, yl - 14, 18, 18, fill=fill, tint=True, rx=0, width=1)
        d.text(x + 26, yl, what, size=14, anchor="start")
    d.text(8, yl + 30, "a query may attend where both masks allow it (AND)", size=14, anchor="start", color=MUTED)
    return d


@diagram
def encoder_decoder_diagram() -> Diagram:
    """Where queries, keys and values come from in encoder, decoder and cross-attention."""
    B, H, S, T = (ENCODER_DECODER[n] for n in ("B", "H", "S", "T"))
    w, x1, x2 = 190, 14, 216
    d = Diagram("ch04_encoder_decoder", 420, 404,
                title="Encoder, decoder and cross-attention",
                alt=f"Two columns. Left, the encoder: the {S} source tokens go into self-attention without a "
                    f"causal mask, scores of shape ({B}, {H}, {S}, {S}). Right, the decoder: the {T} target tokens "
                    f"written so far go into causal self-attention, scores ({B}, {H}, {T}, {T}). Below it, "
                    "cross-attention takes its queries from the decoder and its keys and values from the "
                    f"encoder's output, scores ({B}, {H}, {T}, {S}).")

    def attention_box(x: float, y: float, label: str, axes: str, shape: tuple[int, ...], color: str) -> None:
        d.rect(x, y, w, 74, fill=color, tint=True, stroke=color, width=2)
        d.text(x + w / 2, y + 22, label, size=15)
        d.text(x + w / 2, y + 44, f"scores [{axes}]", size=14, color=MUTED)
        d.text(x + w / 2, y + 63, "= [" + ", ".join(map(str, shape)) + "]", size=14, color=MUTED)

    d.text(x1 + w / 2, 24, "encoder", size=16, weight="bold")
    d.text(x2 + w / 2, 24, "decoder", size=16, weight="bold")
    d.box(x1, 40, w, 48, "source tokens", sub=f"S = {S}, all given", color="grey")
    d.box(x2, 40, w, 48, "target tokens", sub=f"T = {T}, written so far", color="grey")
    d.arrow(x1 + w / 2, 88, x1 + w / 2, 120)
    d.arrow(x2 + w / 2, 88, x2 + w / 2, 120)
    attention_box(x1, 122, "self-attention", "B, H, S, S", (B, H, S, S), "sky")
    attention_box(x2, 122, "causal self-attention", "B, H, T, T", (B, H, T, T), "orange")
    attention_box(x2, 262, "cross-attention", "B, H, T, S", (B, H, T, S), "green")
    d.line(x1 + w / 2, 196, x1 + w / 2, 299)
    d.arrow(x1 + w / 2, 299, x2 - 2, 299, label="keys, values", size=14)
    d.arrow(x2 + w / 2, 196, x2 + w / 2, 260, label=None)
    d.text(x2 + w / 2 + 10, 234, "queries", size=14, anchor="start")
    d.text(8, 364, "one output row per query: the decoder's T positions", size=14, anchor="start", color=MUTED)
    d.text(8, 388, "each may read the whole source (only its padding hidden)", size=14, anchor="start",
           color=MUTED)
    return d


#: The KV-cache example of section 4.11: S_q new queries against S_k keys (the cache and the new tokens).
KV_CACHE_QUERIES, KV_CACHE_KEYS = 2, 5


@diagram
def kv_cache_alignment_diagram() -> Diagram:
    """The same S_q x S_k causal mask aligned top-left (is_causal=True) and bottom-right (a KV cache)."""
    S_q, S_k = KV_CACHE_QUERIES, KV_CACHE_KEYS
    cell, x1, y0, gap = 30, 64, 76, 52
    x2 = x1 + S_k * cell + gap
    d = Diagram("ch04_kv_cache_alignment", x2 + S_k * cell + 14, y0 + S_q * cell + 86,
                title="A causal mask with fewer queries than keys",
                alt=f"Two grids of {S_q} query rows (the new tokens, positions {S_k - S_q} to {S_k - 1}) by {S_k} key "
                    f"columns (positions 0 to {S_k - 1}). Left, is_causal=True aligns the triangle with the top-left "
                    f"corner: the first new token sees only key 0 and the last only keys 0 and 1, so most of the past "
                    "is hidden. Right, aligned with the bottom-right corner (attnlib.causal_mask(S_q, S_k=...), "
                    f"causal_lower_right): the last new token sees all {S_k} keys and the one before it every key but "
                    "the last, as in a full pass.")
    keys = [str(j) for j in range(S_k)]
    rows = [f"pos {S_k - S_q + i}" for i in range(S_q)]
    top_left = torch.ones(S_q, S_k, dtype=torch.bool).tril()
    bottom_right = causal_mask(S_q, S_k=S_k)
    for x, allowed, label, sub in ((x1, top_left, "is_causal=True", "top-left: wrong here"),
                                   (x2, bottom_right, "bottom-right", "right for a KV cache")):
        d.text(x + S_k * cell / 2, 20, label, size=15, weight="bold")
        d.text(x + S_k * cell / 2, 40, sub, size=14, color=MUTED)
        fills = [["sky" if allowed[i, j] else "grey" for j in range(S_k)] for i in range(S_q)]
        d.grid(x, y0, fills, cell=cell, row_labels=rows, col_labels=keys, size=14)
    yl = y0 + S_q * cell + 30
    d.text(8, yl, f"rows: the {S_q} new tokens; columns: all {S_k} keys", size=14, anchor="start",
           color=MUTED)
    d.rect(8, yl + 22, 18, 18, fill="sky", tint=True, rx=0, width=1)
    d.text(34, yl + 36, "may attend", size=14, anchor="start")
    d.rect(150, yl + 22, 18, 18, fill="grey", tint=True, rx=0, width=1)
    d.text(176, yl + 36, "hidden", size=14, anchor="start")
    return d


#: The position-leak example of section 4.10: a distinct first token, then identical tokens.
POSITION_LEAK_TOKENS: list[str] = ["BOS", "a", "a", "a", "a"]


@diagram
def position_leak_diagram() -> Diagram:
    """Uniform attention under a causal mask: the weight on the first token is 1/(i+1), a position signal."""
    tokens = POSITION_LEAK_TOKENS
    S, cell, x0, y0 = len(tokens), 46, 62, 62
    allowed = causal_mask(S)
    d = Diagram("ch04_position_leak", x0 + S * cell + 150, y0 + S * cell + 40,
                title="A causal mask leaks position",
                alt=f"A {S} by {S} causal grid for the tokens '{' '.join(tokens)}', a distinct first token and "
                    "identical others, with a head that spreads its weight evenly over the keys it may see: query i "
                    "gives each of its i+1 keys the weight 1/(i+1). The weight on the first token, listed on the "
                    "right, falls from 1 to 1/" + str(S) + " down the rows, so each position's output differs and "
                    "reveals the position, though no positional encoding was added.")
    d.text(x0 + S * cell / 2, 18, "keys", size=14, color=MUTED)
    fills = [["sky" if allowed[i, j] else "grey" for j in range(S)] for i in range(S)]
    labels = [[("1" if i == 0 else f"1/{i + 1}") if allowed[i, j] else "" for j in range(S)] for i in range(S)]
    d.grid(x0, y0, fills, cell=cell, labels=labels, row_labels=tokens, col_labels=tokens, size=14)
    xr = x0 + S * cell + 14
    d.text(xr, y0 - 10, f"on {tokens[0]}", size=14, anchor="start", weight="bold")
    for i in range(S):
        d.text(xr, y0 + i * cell + cell / 2 + 5, "1" if i == 0 else f"1/{i + 1}", size=14, anchor="start")
    d.text(8, y0 + S * cell + 28, "even weights over the visible keys: each row differs", size=14, anchor="start",
           color=MUTED)
    return d


#: The dropout diagram of section 4.9: one row of weights, the keys dropped in it and the rate p.
DROPOUT_ROW, DROPOUT_DROPPED, DROPOUT_P = (0.30, 0.10, 0.20, 0.15, 0.05, 0.20), (1, 4), 0.25


@diagram
def attention_dropout_diagram() -> Diagram:
    """One row of attention weights before and after dropout: zeros, and the survivors scaled by 1/(1-p)."""
    row, p = DROPOUT_ROW, DROPOUT_P
    after = [0.0 if j in DROPOUT_DROPPED else w / (1 - p) for j, w in enumerate(row)]
    n, cell, x0 = len(row), 46, 70
    d = Diagram("ch04_attention_dropout", x0 + n * cell + 76, 250,
                title="Attention dropout on one row of weights",
                alt=f"One row of {n} attention weights, {', '.join(f'{w:.2f}' for w in row)}, summing to "
                    f"{sum(row):.2f}. After dropout with p = {p:g} in training, keys "
                    f"{' and '.join(str(j) for j in DROPOUT_DROPPED)} are set to 0 and the survivors are divided by "
                    f"1 - p = {1 - p:g}: {', '.join(f'{w:.2f}' for w in after)}, summing to {sum(after):.2f}. "
                    "The sum is 1 only on average over many rows; in eval mode the row is left alone.")
    d.text(x0 + n * cell / 2, 20, "keys", size=14, color=MUTED)
    for r, (label, values, total) in enumerate((("before", row, sum(row)), ("after", after, sum(after)))):
        y = 34 + r * 124
        fills = [["grey" if r and j in DROPOUT_DROPPED else "sky" for j in range(n)]]
        d.grid(x0, y, fills, cell=cell, labels=[[f"{w:.2f}" for w in values]], size=14)
        d.text(x0 - 8, y + cell / 2 + 5, label, size=14, anchor="end", weight="bold")
        d.text(x0 + n * cell + 8, y + cell / 2 + 5, f"sum {total:.2f}", size=14, anchor="start")
    d.arrow(x0 + 10, 34 + cell + 4, x0 + 10, 156)
    d.text(x0 + 22, 106, f"training: each weight dropped with p = {p:g},", size=14, anchor="start", color=MUTED)
    d.text(x0 + 22, 126, f"the survivors divided by 1 - p = {1 - p:g}", size=14, anchor="start", color=MUTED)
    d.text(8, 240, "eval mode: no dropout, the row stays as it is", size=14, anchor="start", color=MUTED)
    return d


#: The prefix-pass diagram of section 4.4: a short sequence, so that every pass fits on a phone.
PREFIX_PASSES_S = 5


@diagram
def prefix_passes_diagram() -> Diagram:
    """One masked pass next to the S prefix passes it replaces: row i of the masked grid is pass 0..i."""
    S, cell = PREFIX_PASSES_S, 30
    x1, y0, x2 = 44, 84, 236
    allowed = causal_mask(S)
    redone = S * (S + 1) // 2 - S
    d = Diagram("ch04_prefix_passes", x2 + S * cell + 54, y0 + S * cell + 108,
                title="One masked pass equals S prefix passes",
                alt=f"Left, one masked pass over {S} positions: a {S} by {S} grid in which row i, query i, may "
                    f"attend to keys 0 to i. Right, the {S} prefix passes that give the same outputs, one beside "
                    f"each row: pass i runs on positions 0 to i and keeps only the output of position i. The "
                    "positions before it are computed again in every pass and thrown away (shaded orange): "
                    f"{S * (S + 1) // 2} positions in all, {redone} of them repeated, against {S} for the masked pass.")
    d.text(x1 + S * cell / 2, 22, "one masked pass", size=15, weight="bold")
    d.text(x1 + S * cell / 2, 42, "row i: query i", size=14, color=MUTED)
    d.text(x2 + S * cell / 2 + 20, 22, f"{S} prefix passes", size=15, weight="bold")
    d.text(x2 + S * cell / 2 + 20, 42, "pass i: positions 0..i", size=14, color=MUTED)
    fills = [["sky" if allowed[i, j] else "grey" for j in range(S)] for i in range(S)]
    keys = [str(j) for j in range(S)]
    d.grid(x1, y0, fills, cell=cell, row_labels=keys, col_labels=keys, size=14)
    for i in range(S):
        y = y0 + i * cell
        d.text((x1 + S * cell + x2) / 2, y + cell / 2 + 5, "=", size=15)
        for j in range(i + 1):
            kept = j == i
            d.rect(x2 + j * cell, y, cell, cell, fill="sky" if kept else "orange", tint=True, rx=0,
                   width=2 if kept else 1)
        d.text(x2 + (i + 1) * cell + 6, y + cell / 2 + 5, f"0..{i}", size=14, anchor="start", color=MUTED)
    yl = y0 + S * cell + 30
    d.rect(8, yl - 14, 18, 18, fill="sky", tint=True, rx=0, width=1)
    d.text(34, yl, "used", size=14, anchor="start")
    d.rect(90, yl - 14, 18, 18, fill="grey", tint=True, rx=0, width=1)
    d.text(116, yl, "hidden", size=14, anchor="start")
    d.rect(186, yl - 14, 18, 18, fill="orange", tint=True, rx=0, width=1)
    d.text(212, yl, "computed again", size=14, anchor="start")
    d.text(8, yl + 34, f"masked pass: {S} positions", size=14, anchor="start")
    d.text(8, yl + 58, f"prefix passes: {S * (S + 1) // 2} positions, {redone} of them repeated", size=14,
           anchor="start")
    return d


@diagram
def nan_spread_diagram() -> Diagram:
    """How one fully masked row spreads: all -inf scores, NaN weights, NaN outputs, then every real row."""
    tokens, am = LEFT_PADDED_TOKENS, LEFT_PADDED_MASK[0].bool()
    S, cell, x0 = len(tokens), 56, 124
    n_pad = int((~am).sum())
    d = Diagram("ch04_nan_spread", x0 + S * cell + 14, 590,
                title="One row with nothing to see spreads NaN",
                alt=f"A left-padded sequence of {n_pad} padding tokens and then '{' '.join(tokens[n_pad:])}', one "
                    "column per position. Layer 1: the query at position 0, a padding token, has every key hidden, "
                    f"so its {S} scores are all minus "
                    f"infinity and a plain softmax gives {S} NaN weights; its output is NaN, and so is that of the "
                    f"other padding position. Layer 2: those {n_pad} NaN outputs are among the values, and a real "
                    "query gives them weight 0, but 0 times NaN is NaN, so the output of every position is NaN, "
                    "and so is a loss over the real positions only.")
    d.text(x0 + S * cell / 2, 20, "positions (keys)", size=14, color=MUTED)
    d.text(8, 50, "layer 1, query 0 (a padding token)", size=14, anchor="start", weight="bold")
    mid = x0 + S * cell / 2
    y1 = 78
    d.grid(x0, y1, [["grey"] * S], cell=cell, labels=[["\u2212\u221e"] * S], col_labels=tokens, size=14)
    d.text(x0 - 8, y1 + cell / 2 + 5, "scores", size=14, anchor="end")
    d.arrow(mid, y1 + cell + 2, mid, y1 + cell + 40)
    d.text(mid + 10, y1 + cell + 26, "softmax", size=14, anchor="start", color=MUTED)
    d.text(mid - 10, y1 + cell + 26, "\u2212\u221e \u2212 (\u2212\u221e) = NaN", size=14, anchor="end",
           color=MUTED)
    y2 = y1 + cell + 44
    d.grid(x0, y2, [["vermillion"] * S], cell=cell, labels=[["NaN"] * S], size=14)
    d.text(x0 - 8, y2 + cell / 2 + 5, "weights", size=14, anchor="end")
    d.arrow(mid, y2 + cell + 2, mid, y2 + cell + 40)
    d.text(mid + 10, y2 + cell + 26, "weights @ V", size=14, anchor="start", color=MUTED)
    y3 = y2 + cell + 44
    fills = [["vermillion" if not am[j] else "sky" for j in range(S)]]
    d.grid(x0, y3, fills, cell=cell, labels=[["NaN" if not am[j] else "ok" for j in range(S)]], size=14)
    d.text(x0 - 8, y3 + cell / 2 + 5, "layer 1 out", size=14, anchor="end")
    d.arrow(mid, y3 + cell + 2, mid, y3 + cell + 40)
    d.text(mid + 10, y3 + cell + 26, "layer 2", size=14, anchor="start", color=MUTED)
    d.text(8, y3 + cell + 64, "the NaN outputs are layer 2's values: a real", size=14, anchor="start", color=MUTED)
    d.text(8, y3 + cell + 84, "query gives them weight 0, but 0 \u00d7 NaN = NaN", size=14, anchor="start",
           color=MUTED)
    y4 = y3 + cell + 100
    d.grid(x0, y4, [["vermillion"] * S], cell=cell, labels=[["NaN"] * S], size=14)
    d.text(x0 - 8, y4 + cell / 2 + 5, "layer 2 out", size=14, anchor="end")
    d.text(8, y4 + cell + 30, "a loss on the real positions only: NaN", size=14, anchor="start", weight="bold")
    yl = y4 + cell + 46
    d.rect(8, yl, 18, 18, fill="vermillion", tint=True, rx=0, width=1)
    d.text(34, yl + 14, "NaN", size=14, anchor="start")
    d.rect(90, yl, 18, 18, fill="sky", tint=True, rx=0, width=1)
    d.text(116, yl + 14, "finite", size=14, anchor="start")
    d.rect(186, yl, 18, 18, fill="grey", tint=True, rx=0, width=1)
    d.text(212, yl + 14, "hidden key", size=14, anchor="start")
    return d


#: The packed-document and prefix-LM examples of section 4.8: two documents of 3 and 2 tokens packed
#: into one sequence, and a prefix of 2 positions in a sequence of 5.
PACKED_LENGTHS, PREFIX_LM = [3, 2], (2, 5)


@diagram
def packed_prefix_masks_diagram() -> Diagram:
    """A document (block-diagonal) mask and a prefix-LM mask side by side."""
    docs, (prefix, S) = document_mask(PACKED_LENGTHS), PREFIX_LM
    pre = prefix_lm_mask(prefix, S)
    n, cell, x1, y0, gap = docs.shape[0], 30, 40, 84, 56
    x2 = x1 + n * cell + gap
    d = Diagram("ch04_packed_prefix_masks", x2 + S * cell + 14, y0 + max(n, S) * cell + 88,
                title="A packed-document mask and a prefix-LM mask",
                alt=f"Two {n} by {n} grids, rows queries and columns keys. Left, the document mask of "
                    f"{len(PACKED_LENGTHS)} documents of {' and '.join(map(str, PACKED_LENGTHS))} tokens packed into "
                    "one sequence: a causal triangle inside each document, and every cell between the documents "
                    f"hidden, a block diagonal. Right, the prefix-LM mask with a prefix of {prefix} positions: the "
                    f"top-left {prefix} by {prefix} block is all visible, so the prefix positions see each other in "
                    "both directions, and the rows after it are causal.")
    doc_id = [b for b, length in enumerate(PACKED_LENGTHS) for _ in range(length)]
    for x, allowed, label, sub, colour in (
            (x1, docs, "packed documents", f"lengths {', '.join(map(str, PACKED_LENGTHS))}", None),
            (x2, pre, "prefix LM", f"prefix of {prefix}", "green")):
        size = allowed.shape[0]
        d.text(x + size * cell / 2, 20, label, size=15, weight="bold")
        d.text(x + size * cell / 2, 40, sub, size=14, color=MUTED)
        fills = [["grey" if not allowed[i, j] else
                  (colour if colour and i < prefix and j < prefix and j > i else
                   ("sky" if colour or doc_id[j] == 0 else "orange")) for j in range(size)] for i in range(size)]
        d.grid(x, y0, fills, cell=cell, row_labels=[str(i) for i in range(size)],
               col_labels=[str(j) for j in range(size)], size=14)
    yl = y0 + max(n, S) * cell + 30
    d.rect(8, yl - 14, 18, 18, fill="sky", tint=True, rx=0, width=1)
    d.text(34, yl, "doc 0 / causal", size=14, anchor="start")
    d.rect(160, yl - 14, 18, 18, fill="orange", tint=True, rx=0, width=1)
    d.text(186, yl, "doc 1", size=14, anchor="start")
    d.rect(8, yl + 16, 18, 18, fill="green", tint=True, rx=0, width=1)
    d.text(34, yl + 30, "prefix sees ahead", size=14, anchor="start")
    d.rect(186, yl + 16, 18, 18, fill="grey", tint=True, rx=0, width=1)
    d.text(212, yl + 30, "hidden", size=14, anchor="start")
    return d
