"""Checkers for chapter 6, *Tensor reshaping*.

* :func:`check_split_heads`: a reusable test for any ``split_heads(x, H)``. It feeds
  position-tagged data (every number says which sequence, position and feature it came from), so
  a wrong split is not just "different" but explained: "head 0 row 1 holds features of position
  0: you reshaped without transposing".
* :func:`check_merge_heads`: the same for ``merge_heads(x)``.
* :func:`check_split_merge`: both of the reader's functions (exercise 1).
* :func:`check_transposed_strides`: the reader's strides of a transposed tensor (exercise 2).
* :func:`check_split_test`: the reader writes a *test* that must tell correct splits from buggy
  ones; it is run against a zoo of implementations (exercise 3).
* :func:`check_repeat_kv`: the reader expands key/value heads for grouped-query attention
  (exercise 4).
* :func:`pack_qkv`, :func:`split_blocks`, :func:`split_groups`, :func:`packed_split_is_right`:
  packed q/k/v projections (GPT-2's blocks, Falcon's groups) and a test that tells a right split
  from a wrong one.

Shapes: ``B`` batch, ``S`` positions, ``H`` heads, ``D_k`` per-head width, ``D = H * D_k``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from attnlib.heads import merge_heads, split_heads

from .diagrams import INK, MUTED, Diagram, diagram
from .feedback import (
    Feedback,
    Mistake,
    MistakeTable,
    as_index,
    close,
    correct,
    describe,
    diagnose,
    exercise,
    run_reader_code,
    todo,
    wrong,
)

__all__ = [
    "memory_layout",
    "memory_layout_alt",
    "tagged_tokens",
    "decode_tag",
    "check_split_heads",
    "check_merge_heads",
    "check_split_merge",
    "check_transposed_strides",
    "SPLIT_ZOO",
    "check_split_test",
    "check_repeat_kv",
    "REPEAT_KV_MISTAKES",
    "STRIDE_MISTAKES",
    "pack_qkv",
    "split_blocks",
    "split_groups",
    "packed_split_is_right",
    "OpLog",
]

#: The shapes each split/merge check runs on, ``(B, S, H, D_k)``. Within the first shape every size
#: differs (with ``H = D_k`` a split into ``[B, S, D_k, H]`` could not be told from ``[B, S, H, D_k]``;
#: the second has ``B = D_k``, which the first already tells apart), the second differs from the first in
#: every size and in the number of elements, so that the first's sizes written in cannot be reshaped to it,
#: and ``B >= 2`` in both so that mixing sequences of a batch shows.
CONFIGS: tuple[tuple[int, int, int, int], ...] = ((2, 3, 4, 5), (3, 5, 2, 3))


def tagged_tokens(B: int, S: int, D: int) -> Tensor:
    """``[B, S, D]`` float64 whose entry ``[b, s, f]`` is ``(b * S + s) * D + f``.

    Every number is distinct and :func:`decode_tag` recovers ``(b, s, f)`` from it, so after any
    reshape one can read off where each number came from.
    """
    return torch.arange(B * S * D, dtype=torch.float64).view(B, S, D)  # [B, S, D]


def decode_tag(value: float, S: int, D: int) -> tuple[int, int, int]:
    """``(b, s, f)`` of a number made by :func:`tagged_tokens` (sequence, position, feature)."""
    v = int(round(value))
    b, rest = divmod(v, S * D)
    s, f = divmod(rest, D)
    return b, s, f


_VIEW_AFTER_TRANSPOSE = (
    "your code raised RuntimeError: view size is not compatible with input tensor's size and stride. "
    "After transpose the tensor is not contiguous, so view cannot merge its axes: use reshape "
    "(which copies when it must) or call .contiguous() before view."
)
_HARD_CODED = (
    "your code raised RuntimeError: {error}. The sizes in your view/reshape do not fit this input (the checker "
    "tries two shapes): read B, S and D from x.shape, take H from the num_heads argument and use D_k = D // H "
    "(not numbers written in, nor another axis of x)."
)

_MERGE_HARD_CODED = (
    "your code raised RuntimeError: {error}. The sizes in your view/reshape do not fit this input (the checker "
    "tries two shapes): merge_heads receives [B, H, S, D_k] and has no num_heads argument, so read all four sizes "
    "from x.shape, in that order, and merge the heads back into one feature axis of H * D_k (not numbers written "
    "in, nor D_k alone)."
)


_FLOAT_SIZE = (
    "your code raised TypeError: a size you passed to view, reshape or expand is a float. `/` always gives a float "
    "in Python, even when it divides exactly (D / H, H / H_kv); use integer division, //."
)


def _call(fn: Callable[..., object], *args: object, view_hint: str = _VIEW_AFTER_TRANSPOSE,
          hard_coded: str = _HARD_CODED) -> tuple[object, Feedback | None]:
    """Like :func:`run_reader_code`, with hints for a ``view`` that cannot merge axes, for hard-coded sizes
    and for a size written with ``/``."""
    result, fb = run_reader_code(fn, *args)
    if fb is not None and "view size is not compatible" in fb.message:
        return None, wrong(view_hint)
    if fb is not None and "is invalid for input of size" in fb.message:
        error = fb.message.removeprefix("your code raised RuntimeError: ").rstrip(". ")
        return None, wrong(hard_coded.format(error=error))
    if fb is not None and "failed to unpack" in fb.message and "got float" in fb.message:
        return None, wrong(_FLOAT_SIZE)
    return result, fb


def _dtype_problem(got: Tensor, x: Tensor) -> str | None:
    """A reshape moves numbers and keeps their dtype: the diagnosis when ``got`` changed it."""
    if got.dtype in (torch.float16, torch.bfloat16) and x.dtype not in (torch.float16, torch.bfloat16):
        digits = 3 if got.dtype == torch.float16 else 2  # worded as feedback.low_precision words it
        return (f"the result is {got.dtype}, which keeps only about {digits} significant digits: return it in the "
                f"dtype of the input ({x.dtype}); a reshape must not change the dtype.")
    if got.dtype != x.dtype:
        return (f"the numbers are in the right places, but the result is {got.dtype} for a {x.dtype} input: a reshape "
                "must not change the dtype (no .float(), .half() or .to(...)).")
    return None


def _split_problem(got: Tensor, x: Tensor, H: int) -> str | None:
    """``None`` if ``got`` is the right split of the tagged ``x`` [B, S, D], else a diagnosis."""
    B, S, D = x.shape
    d_k = D // H
    expected = x.view(B, S, H, d_k).transpose(1, 2)  # [B, H, S, D_k]
    shape = tuple(got.shape)
    if shape != (B, H, S, d_k):
        if shape == (B, S, H, d_k):
            return (f"the result has shape {shape} = [B, S, H, D_k]: you split D into (H, D_k) but did not move "
                    "the head axis in front; add .transpose(1, 2) to get [B, H, S, D_k].")
        if shape == (B, H, d_k, S):
            return (f"the result has shape {shape} = [B, H, D_k, S]: positions and features are swapped; "
                    "transpose axes 1 and 2 of the [B, S, H, D_k] view, not the last two.")
        if shape == (B, S, d_k, H):
            return (f"the result has shape {shape} = [B, S, D_k, H]: you transposed the last two axes of the "
                    "[B, S, H, D_k] view (transpose(2, 3)); the head axis has to move in front of the positions, "
                    "transpose(1, 2).")
        if shape == (B, d_k, S, H):
            return (f"the result has shape {shape} = [B, D_k, S, H]: your view swapped the sizes H = {H} and "
                    f"D_k = {d_k}, view(B, S, D // H, H); each position's D features are H heads of D_k features, "
                    "view(B, S, H, D_k), then .transpose(1, 2).")
        return f"the result has shape {shape}, expected [B, H, S, D_k] = {(B, H, S, d_k)} for x of shape {tuple(x.shape)} and H = {H}."
    if got.is_complex():
        return f"the result is complex ({got.dtype}); split_heads only moves numbers."
    dtype = got.dtype
    got = got.detach().to("cpu", torch.float64)
    if torch.equal(got, expected):
        return _dtype_problem(got.to(dtype), x)
    if torch.equal(got, x.reshape(B, H, S, d_k)):
        positions = [decode_tag(got[0, 0, s, 0].item(), S, D)[1] for s in range(S)]
        for s in range(S):
            if positions[s] != s:
                break
        return (f"head 0 row {s} holds features of position {positions[s]}: you reshaped without transposing. "
                f"x.view(B, H, S, D_k) cuts each sequence's memory into H consecutive blocks, so head 0 gets "
                f"positions {positions} (expected {list(range(S))}). Use x.view(B, S, H, D_k).transpose(1, 2).")
    if torch.equal(got, x.transpose(1, 2).reshape(B, H, S, d_k)):
        return ("each row of head 0 holds one feature at several positions: you transposed [B, S, D] to [B, D, S] "
                "before splitting, so the reshape reads the numbers feature by feature. Cut each position's features "
                "into heads first, then move the head axis in front.")
    if torch.equal(got, x.view(B, S, d_k, H).permute(0, 3, 1, 2)):
        feats = [decode_tag(got[0, 0, 0, j].item(), S, D)[2] for j in range(d_k)]
        return (f"head 0 holds features {feats} of each position (every H-th feature): you split D as (D_k, H). "
                f"Head h owns the consecutive slice h*D_k .. (h+1)*D_k - 1, so view as (B, S, H, D_k).")
    for idx in torch.nonzero(got != expected).tolist():
        b, h, s, j = idx
        gb, gs, gf = decode_tag(got[b, h, s, j].item(), S, D)
        if gb != b:
            return (f"sequence {b}, head {h}, row {s} holds a number from sequence {gb} of the batch: your split mixes "
                    "the sequences of a batch. Keep B as the first axis throughout (view(B, S, H, D_k)).")
        return (f"sequence {b}, head {h}, row {s}, column {j} holds feature {gf} of position {gs}; expected feature "
                f"{h * d_k + j} of position {s}.")
    return "the values differ from the expected split."  # pragma: no cover - some index differs above


@exercise(solution=split_heads, not_generic={"no table": "the tagged data diagnose any split by where each number came from"})
def check_split_heads(fn: Callable[[Tensor, int], Tensor], *, configs: tuple[tuple[int, int, int, int], ...] = CONFIGS) -> Feedback:
    """Test any ``split_heads(x [B, S, D], H) -> [B, H, S, D_k]`` on position-tagged data.

    Head ``h`` must hold features ``h*D_k .. (h+1)*D_k - 1`` of every position, in order. The
    check runs on every ``(B, S, H, D_k)`` in ``configs`` (all with ``S > 1`` and ``H > 1``:
    with one position or one head the reshape-without-transpose bug is invisible).

    Returns:
        ``Feedback``: ``correct``, ``todo`` for a stub, or ``wrong`` with a diagnosis such as
        "head 0 row 1 holds features of position 0: you reshaped without transposing".
    """
    for B, S, H, d_k in configs:
        x = tagged_tokens(B, S, H * d_k)  # [B, S, D]
        result, fb = _call(fn, x.clone(), H)
        if fb is not None:
            return fb
        if not isinstance(result, Tensor):
            return wrong(f"split_heads should return a torch.Tensor, got {describe(result)}.")
        problem = _split_problem(result, x, H)
        if problem is not None:
            return wrong(f"(B, S, H, D_k) = {(B, S, H, d_k)}: {problem}")
    return correct("every head holds its own slice of features for every position, in order.")


@exercise(solution=merge_heads, not_generic={"no table": "the tagged data diagnose any merge by where each number came from"})
def check_merge_heads(fn: Callable[[Tensor], Tensor], *, configs: tuple[tuple[int, int, int, int], ...] = CONFIGS) -> Feedback:
    """Test any ``merge_heads(x [B, H, S, D_k]) -> [B, S, H * D_k]``.

    The input is a contiguous ``[B, H, S, D_k]`` tensor (as attention outputs are), so the
    merge-without-transposing bug ``x.view(B, S, D)`` runs without error; the check catches it.
    """
    for B, S, H, d_k in configs:
        D = H * d_k
        x = tagged_tokens(B, S, D)  # [B, S, D]: the answer, tagged with (b, s, f)
        heads = split_heads(x, H).contiguous()  # [B, H, S, D_k], contiguous like an attention output
        result, fb = _call(fn, heads.clone(), hard_coded=_MERGE_HARD_CODED)
        if fb is not None:
            return fb
        if not isinstance(result, Tensor):
            return wrong(f"merge_heads should return a torch.Tensor, got {describe(result)}.")
        shape = tuple(result.shape)
        where = f"(B, S, H, D_k) = {(B, S, H, d_k)}: "
        if shape != (B, S, D):
            if shape == (B, S, H, d_k):
                return wrong(where + f"the result has shape {shape} = [B, S, H, D_k]: merge the last two axes into D = H * D_k.")
            if shape == (B, H, S * d_k):
                return wrong(where + f"the result has shape {shape} = [B, H, S * D_k]: your code reads the input's axes "
                             "in the split's order, as if it were [B, S, H, D_k] (B, S, H, D_k = x.shape). merge_heads "
                             "receives [B, H, S, D_k], the heads on axis 1 and the positions on axis 2, so unpack "
                             "x.shape in that order.")
            return wrong(where + f"the result has shape {shape}, expected [B, S, D] = {(B, S, D)}.")
        if result.is_complex():
            return wrong(where + f"the result is complex ({result.dtype}); merge_heads only moves numbers.")
        got = result.detach().to("cpu", torch.float64)
        if torch.equal(got, x):
            problem = _dtype_problem(result, x)
            if problem is not None:
                return wrong(where + problem)
            continue
        if torch.equal(got, heads.reshape(B, S, D)):
            pos = sorted({decode_tag(v, S, D)[1] for v in got[0, 0].tolist()})
            return wrong(where + f"position 0 holds numbers of positions {pos}: you merged without transposing back. "
                         "The [B, H, S, D_k] memory is head after head; transpose(1, 2) to [B, S, H, D_k] first, then reshape.")
        if torch.equal(got, heads.transpose(2, 3).reshape(B, S, D)):
            return wrong(where + "you transposed the last two axes (transpose(2, 3), or (-2, -1) as for k in the scores): "
                         "in [B, H, S, D_k] the heads are axis 1 and the positions axis 2, and those are the two to swap "
                         "back before the reshape.")
        b, s, f = torch.nonzero(got != x)[0].tolist()
        gb, gs, gf = decode_tag(got[b, s, f].item(), S, D)
        return wrong(where + f"sequence {b}, position {s}, feature {f} holds feature {gf} of position {gs} (sequence {gb}); "
                     f"expected feature {f} of position {s}, which comes from head {f // d_k}.")
    return correct("the heads are put back side by side, position by position.")


_NO_EINOPS = (
    "{name} calls einops.rearrange: the exercise asks for view, transpose and reshape, so that you see which axes move "
    "(section 6.5 shows the einops one-liner). Write the same move with those three."
)


@contextmanager
def _einops_spy() -> Iterator[set[str]]:
    """Record a call of ``einops.rearrange`` (however it was imported) while the reader's code runs."""
    used: set[str] = set()
    try:
        import einops
        import einops.einops as einops_impl
    except ImportError:  # pragma: no cover - einops is a dependency of the book
        yield used
        return
    reduce, rearrange = einops_impl.reduce, einops.rearrange

    def spy_reduce(*args: Any, **kwargs: Any) -> Any:
        used.add("einops")
        return reduce(*args, **kwargs)

    def spy_rearrange(*args: Any, **kwargs: Any) -> Any:
        used.add("einops")
        return rearrange(*args, **kwargs)

    einops_impl.reduce, einops.rearrange = spy_reduce, spy_rearrange  # type: ignore[assignment]
    try:
        yield used
    finally:
        einops_impl.reduce, einops.rearrange = reduce, rearrange  # type: ignore[assignment]


@exercise(solution=(split_heads, merge_heads), kind="functions",
          not_generic={"no table": "the tagged data diagnose any split or merge by where each number came from"})
def check_split_merge(split_fn: Callable[[Tensor, int], Tensor], merge_fn: Callable[[Tensor], Tensor]) -> Feedback:
    """Exercise 1: check the reader's ``split_heads`` and ``merge_heads`` together.

    The exercise asks for ``view``, ``transpose`` and ``reshape``: a version that calls
    ``einops.rearrange`` is refused, with a hint that says so.
    """
    for name, fn, args in (("split_heads", split_fn, (tagged_tokens(2, 3, 20), 4)),
                           ("merge_heads", merge_fn, (split_heads(tagged_tokens(2, 3, 20), 4).contiguous(),))):
        with _einops_spy() as used:
            run_reader_code(fn, *args)
        if used:
            return wrong(_NO_EINOPS.format(name=name))
    for name, fb in (("split_heads", check_split_heads(split_fn)), ("merge_heads", check_merge_heads(merge_fn))):
        if fb.status == "todo":
            return todo(f"{name} is still the stub: replace `raise NotImplementedError` with your code.")
        if not fb.passed:
            return Feedback(fb.status, f"{name}: {fb.message}")
    return correct("split_heads and merge_heads are right (checked on position-tagged data, two shapes with B >= 2).")


def _as_ints(answer: object) -> tuple[int, ...] | None:
    """A tuple of ints from a tuple, list or ``torch.Size`` of Python or NumPy ints, or a 1-D integer
    NumPy array or tensor (``None`` otherwise)."""
    if isinstance(answer, np.ndarray) and answer.ndim == 1 and answer.dtype.kind in "iu":
        answer = answer.tolist()
    elif isinstance(answer, Tensor) and answer.dim() == 1 and not answer.is_floating_point() and not answer.is_complex() \
            and answer.dtype != torch.bool:
        answer = answer.tolist()
    if not isinstance(answer, (tuple, list)):
        return None
    try:
        if any(isinstance(a, bool) for a in answer):
            return None
        return tuple(as_index(a) for a in answer)
    except Exception:  # not an integer
        return None


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(torch.zeros(shape).stride())


def _transposed(shape: tuple[int, ...], dims: tuple[int, int]) -> tuple[int, ...]:
    return tuple(torch.zeros(shape).transpose(*dims).shape)


_SHAPE_NOT_STRIDES = ("that is a shape, not the strides: a stride counts the elements you skip in memory to move one "
                      "step along an axis, and the last axis of a contiguous tensor has stride 1.")

#: The known mistakes of :func:`check_transposed_strides`: ``compute(shape, dims)`` is the tuple such an answer gives.
STRIDE_MISTAKES: tuple[Mistake, ...] = (
    Mistake("strides before the transpose", lambda shape, dims: _strides(shape),
            "those are the strides before the transpose. transpose keeps the memory and swaps two strides."),
    Mistake("fresh contiguous tensor", lambda shape, dims: _strides(_transposed(shape, dims)),
            "those are the strides of a fresh contiguous tensor of the new shape. A transpose is a view: "
            "the numbers stay where they are, so the strides are the old ones, swapped."),
    Mistake("bytes", lambda shape, dims: tuple(4 * st for st in torch.zeros(shape).transpose(*dims).stride()),
            "those are bytes (float32 has 4 bytes per number); PyTorch counts strides in elements."),
    Mistake("the new shape", lambda shape, dims: _transposed(shape, dims), _SHAPE_NOT_STRIDES),
    Mistake("the old shape", lambda shape, dims: tuple(shape), _SHAPE_NOT_STRIDES),
)


@exercise(solution=(60, 3, 12, 1), kind="value",
          tables=(MistakeTable(STRIDE_MISTAKES, lambda: [((2, 5, 4, 3), (1, 2))], lambda shape, dims: tuple(torch.zeros(shape).transpose(*dims).stride())),),
          not_generic={"float16": "strides are whole numbers"})
def check_transposed_strides(answer: object, shape: tuple[int, ...] = (2, 5, 4, 3), dims: tuple[int, int] = (1, 2)) -> Feedback:
    """Exercise 2: the strides of ``torch.zeros(shape).transpose(*dims)``.

    The right answer swaps two entries of the contiguous strides; the hints recognise the
    strides before the transpose, the strides of a fresh contiguous tensor of the new shape, and
    strides in bytes instead of elements.
    """
    if answer is None:
        return todo("replace `None` with a tuple of four ints, then run the cell again.")
    ints = _as_ints(answer)
    if ints is None and isinstance(answer, (tuple, list)) and answer and all(isinstance(a, float) for a in answer):
        return wrong("the answer should be a tuple of ints, got a tuple of floats: strides are whole numbers of "
                     "elements, so write each as an int (7, not 7.0).")
    if ints is None and isinstance(answer, (tuple, list)) and any(isinstance(a, float) for a in answer):
        first = next(a for a in answer if isinstance(a, float))
        return wrong(f"the answer should be a tuple of ints, got a {type(answer).__name__} containing a float ({first!r}): "
                     "strides are whole numbers of elements, so write the strides as ints (7, not 7.0).")
    if ints is None:
        return wrong(f"the answer should be a tuple of ints like (1, 2, 3, 4), got {describe(answer)}.")
    base = torch.zeros(shape)
    right = tuple(base.transpose(*dims).stride())
    answer = ints
    if len(answer) != len(shape):
        return wrong(f"a tensor with {len(shape)} axes has {len(shape)} strides, you gave {len(answer)}.")
    if answer == right:
        return correct(f"{right}: transpose moved no data, it swapped strides {dims[0]} and {dims[1]} of {tuple(base.stride())}.")
    for m in STRIDE_MISTAKES:
        if answer == m.compute(shape, dims):
            return wrong(m.hint)
    if sorted(answer) == sorted(right):
        return wrong("the right numbers in the wrong order: which two axes did transpose swap?")
    return wrong("stride i is how many elements you skip in memory to move one step along axis i. "
                 f"Start from the contiguous strides of {shape} (the last is 1, each one before is the product of the sizes after it).")


# --- exercise 3: a test that tells correct splits from buggy ones ------------------------------


def _split_reshape_permute(x: Tensor, num_heads: int) -> Tensor:
    B, S, D = x.shape
    H = num_heads
    return x.reshape(B, S, H, D // H).permute(0, 2, 1, 3)  # [B, H, S, D_k]


def _split_contiguous_copy(x: Tensor, num_heads: int) -> Tensor:
    B, S, D = x.shape
    H = num_heads
    return x.view(B, S, H, D // H).transpose(1, 2).contiguous()  # [B, H, S, D_k], a contiguous copy


def _split_no_transpose(x: Tensor, num_heads: int) -> Tensor:
    B, S, D = x.shape
    H = num_heads
    return x.view(B, H, S, D // H)  # the classic bug: right shape, positions mixed across heads


def _split_features_interleaved(x: Tensor, num_heads: int) -> Tensor:
    B, S, D = x.shape
    H = num_heads
    return x.view(B, S, D // H, H).permute(0, 3, 1, 2)  # head h takes every H-th feature


def _split_mixes_batch(x: Tensor, num_heads: int) -> Tensor:
    B, S, D = x.shape
    H = num_heads
    return x.reshape(B * S, H, D // H).transpose(0, 1).reshape(B, H, S, D // H)  # right only when B = 1


def _split_wrong_shape(x: Tensor, num_heads: int) -> Tensor:
    B, S, D = x.shape
    H = num_heads
    return x.view(B, S, H, D // H)  # forgot the transpose: [B, S, H, D_k]


def _split_heads_reversed(x: Tensor, num_heads: int) -> Tensor:
    return split_heads(x, num_heads).flip(1)  # head h holds head H-1-h's features


def _split_features_permuted(x: Tensor, num_heads: int) -> Tensor:
    return split_heads(x, num_heads).flip(-1)  # each head's features in reverse order


def _split_other_heads_shifted(x: Tensor, num_heads: int) -> Tensor:
    y = split_heads(x, num_heads).clone()  # [B, H, S, D_k]
    y[:, 1:] = y[:, 1:].roll(1, dims=2)  # head 0 is right, the others hold the previous position's features
    return y


def _split_sequences_swapped(x: Tensor, num_heads: int) -> Tensor:
    return split_heads(x.flip(0), num_heads)  # right within a sequence, but the sequences of the batch reversed


def _split_first_sequence_everywhere(x: Tensor, num_heads: int) -> Tensor:
    B = x.shape[0]
    return split_heads(x[:1], num_heads).expand(B, -1, -1, -1)  # every sequence gets sequence 0's heads


def _split_last_position_wrong(x: Tensor, num_heads: int) -> Tensor:
    y = split_heads(x, num_heads).clone()  # [B, H, S, D_k]
    y[:, :, -1] += 1  # right everywhere but the last position
    return y


def _split_only_feature_0_right(x: Tensor, num_heads: int) -> Tensor:
    y = split_heads(x, num_heads).clone()  # [B, H, S, D_k]
    y[..., 1:] += 1  # each head's first feature right, the others off
    return y


#: name -> (split function, is it correct?, hint when the reader's test misjudges it)
SPLIT_ZOO: dict[str, tuple[Callable[[Tensor, int], Tensor], bool, str]] = {
    "attnlib.split_heads": (split_heads, True, "your test rejected attnlib.split_heads, which is correct."),
    "reshape + permute": (_split_reshape_permute, True,
                          "your test rejected x.reshape(B, S, H, D_k).permute(0, 2, 1, 3), which is correct."),
    "contiguous copy": (_split_contiguous_copy, True,
                        "your test rejected a correct split that returns a contiguous copy: compare values, "
                        "not strides, is_contiguous() or data_ptr."),
    "view without transpose": (_split_no_transpose, False,
                               "your test accepted x.view(B, H, S, D_k), the reshape-without-transpose bug. Its shape is "
                               "right, so compare values: head h at position s must equal x[:, s, h*D_k:(h+1)*D_k] "
                               "(and use S > 1 and H > 1: with one position or one head the bug is invisible)."),
    "features interleaved": (_split_features_interleaved, False,
                             "your test accepted a split that gives head h every H-th feature (view as (B, S, D_k, H)): "
                             "check which features each head holds, not only which positions."),
    "mixes the batch": (_split_mixes_batch, False,
                        "your test accepted a split that is right for B = 1 but mixes the sequences of a batch: "
                        "test with B >= 2 and compare each sequence's values separately (a sum or mean over the "
                        "batch, or over the heads, cannot see the sequences swapped)."),
    "sequences swapped": (_split_sequences_swapped, False,
                          "your test accepted a split that returns the sequences of the batch in reverse order (each "
                          "sequence split right): compare each sequence's values with its own (torch.equal on y[:, h] "
                          "against x[:, :, slice]); a mean or sum over the batch cannot see the sequences swapped."),
    "wrong shape": (_split_wrong_shape, False,
                    "your test accepted a result of shape [B, S, H, D_k]: check the shape too."),
    "heads in reverse order": (_split_heads_reversed, False,
                               "your test accepted a split whose heads come in reverse order (head 0 holds the last "
                               "head's features): compare every head with its own slice, not only one head or a sum."),
    "only head 0 right": (_split_other_heads_shifted, False,
                          "your test accepted a split in which only head 0 is right (every other head holds the "
                          "previous position's features): check every head, not only the first."),
    "features permuted within a head": (_split_features_permuted, False,
                                        "your test accepted a split that reverses the features inside each head: compare "
                                        "the values in order (torch.equal), not sums, sorted values or a single head."),
    "every sequence is the first": (_split_first_sequence_everywhere, False,
                                    "your test accepted a split that gives every sequence of the batch the heads of "
                                    "sequence 0: check every sequence, not only the first (y[:, h], not y[0, h])."),
    "last position wrong": (_split_last_position_wrong, False,
                            "your test accepted a split that is wrong only at the last position: check every "
                            "position, range(S) and not range(S - 1)."),
    "only feature 0 right": (_split_only_feature_0_right, False,
                             "your test accepted a split whose heads are right only in their first feature: compare "
                             "every feature of a head (the whole slice x[:, :, h*D_k:(h+1)*D_k]), not one column."),
}


def _solution_split_test(split_fn: Callable[[Tensor, int], Tensor]) -> bool:
    B, S, H, d_k = 2, 3, 2, 4
    x = torch.randn(B, S, H * d_k, generator=torch.Generator().manual_seed(0))  # [B, S, D]
    y = split_fn(x, H)
    return tuple(y.shape) == (B, H, S, d_k) and all(torch.equal(y[:, h], x[..., h * d_k:(h + 1) * d_k]) for h in range(H))


@exercise(solution=_solution_split_test,
          not_generic={"no table": "the zoo of splits is the table", "transposed": "the answer is True or False",
                       "rolled by one": "the answer is True or False"})
def check_split_test(test_fn: Callable[[Callable[[Tensor, int], Tensor]], bool]) -> Feedback:
    """Exercise 3: ``test_fn(split_fn)`` must return True for correct splits and False for buggy ones.

    It is called on every implementation in :data:`SPLIT_ZOO` (three correct, eleven buggy). A test
    that raises on a buggy split counts as rejecting it; raising on a correct one is a mistake.
    """
    for name, (split_fn, is_right, hint) in SPLIT_ZOO.items():
        sizes: list[tuple[int, int]] = []  # (D, H) of every call the reader's test makes
        distinct: list[int] = []  # how many different numbers each input of the reader's test holds (-1: all)

        def spied(x: Tensor, *args: Any, split_fn: Callable[..., Tensor] = split_fn, **kwargs: Any) -> Tensor:
            heads = args[0] if args else kwargs.get("num_heads", kwargs.get("H"))
            if isinstance(x, Tensor) and x.dim() == 3 and isinstance(heads, int):
                sizes.append((x.shape[-1], heads))
            if isinstance(x, Tensor) and x.numel() > 1:
                try:
                    n = int(x.detach().flatten().unique().numel())
                except Exception:  # a tensor unique() cannot sort (complex): leave it out
                    n = -1
                distinct.append(-1 if n == x.numel() else n)
            return split_fn(x, *args, **kwargs)

        try:
            verdict = test_fn(spied)
        except NotImplementedError:
            return todo()
        except Exception as err:  # a test that crashes on a buggy split has caught it
            if is_right:
                return wrong(f"your test raised {type(err).__name__} on the correct split '{name}': {err}")
            continue
        if verdict is None:
            return wrong("your test returned None: did you forget `return`? Return True (the split is right) or False (it is buggy).")
        if isinstance(verdict, Tensor) and verdict.numel() == 1 and verdict.dtype == torch.bool:
            verdict = bool(verdict.item())
        if not isinstance(verdict, (bool, np.bool_)):
            return wrong(f"your test should return True or False, got {describe(verdict)}.")
        if bool(verdict) != is_right:
            if name == "features interleaved" and sizes and all(h > 0 and d // h == 1 for d, h in sizes):
                return wrong("your test accepted a split that gives head h every H-th feature, but only because every "
                             "input it tried has D_k = D // H = 1: with one feature per head that split equals the "
                             "right one. Use D_k > 1.")
            if not is_right and name != "wrong shape" and distinct and -1 not in distinct:
                if set(distinct) == {1}:
                    return wrong("your test accepted a buggy split because your test data repeat one number (every "
                                 "entry is the same, as torch.ones or torch.zeros make it), so every split gives the "
                                 "same values: use distinct numbers, such as torch.arange or torch.randn.")
                return wrong("your test accepted a buggy split because your test data repeat numbers (the same number "
                             "in several places), so a split that moves a number onto an equal one looks right: use "
                             "distinct numbers, such as torch.arange or torch.randn.")
            return wrong(hint)
    n_right = sum(1 for _, ok, _ in SPLIT_ZOO.values() if ok)
    return correct(f"your test accepts all {n_right} correct splits and rejects all {len(SPLIT_ZOO) - n_right} buggy ones.")


# --- exercise 4: expand key/value heads for grouped-query attention -----------------------------


class _Used(set):
    """The names of the calls a reader's code made, and ``shapes``: ``(name, input shape, output shape)`` of each."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []


@contextmanager
def _calls(*names: str) -> Iterator[set[str]]:
    """Record which of ``torch.<name>`` / ``Tensor.<name>`` the code in the block calls (the originals still run)."""
    used = _Used()
    saved = [(owner, name, getattr(owner, name)) for name in names for owner in (torch, torch.Tensor) if hasattr(owner, name)]

    def spy(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            used.add(name)
            out = fn(*args, **kwargs)
            if args and isinstance(args[0], Tensor) and isinstance(out, Tensor):  # shapes in and out, for the hints
                used.shapes.append((name, tuple(args[0].shape), tuple(out.shape)))
            return out
        return wrapper

    try:
        for owner, name, fn in saved:
            setattr(owner, name, spy(name, fn))
        yield used
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def _only_if(condition: bool, t: Tensor) -> Tensor:
    if not condition:
        raise LookupError("this mistake needs another call")  # diagnose skips a mistake that cannot be computed
    return t


def _tiled(kv: Tensor, H: int) -> Tensor:
    return kv.repeat(1, H // kv.shape[1], 1, 1)  # [B, H, S, D_k], heads 0, 1, 0, 1, ...


#: The known mistakes of :func:`check_repeat_kv`: ``compute(kv [B, H_kv, S, D_k], H, used)`` is what
#: such an answer returns; ``used`` is the set of the calls it made (``repeat``, ``expand``, ...), so
#: that a hint names a call the reader made, and otherwise describes the symptom.
REPEAT_KV_MISTAKES: tuple[Mistake, ...] = (
    Mistake("tiled with .repeat", lambda kv, H, used: _only_if("repeat" in used, _tiled(kv, H)),
            "query head 1 got key/value head 1, expected 0: you tiled the heads with .repeat (0, 1, 0, 1, ...); "
            "grouped-query attention gives consecutive query heads the same key/value head (0, 0, 0, 1, 1, 1): "
            "expand on a new axis right after the head axis, kv[:, :, None]."),
    Mistake("group axis before the heads", lambda kv, H, used: _only_if(
                "repeat" not in used and "expand before the heads" in used, _tiled(kv, H)),
            "query head 1 got key/value head 1, expected 0: your copies sit on a new axis *before* the head axis (as "
            "kv[:, None].expand, or the einops pattern \"(g h)\", make them), and merging (G, H_kv) gives the heads 0, 1, "
            "0, 1, ... Put the group axis right after the head axis, kv[:, :, None].expand(B, H_kv, G, S, D_k), so that "
            "the G copies of a head are neighbours."),
    Mistake("merged in the wrong order", lambda kv, H, used: _only_if(
                "repeat" not in used and "expand after the heads" in used and "expand before the heads" not in used,
                _tiled(kv, H)),  # the numbers of tiling; a different cause, told apart by the calls made
            "query head 1 got key/value head 1, expected 0: you expanded the right axis, kv[:, :, None], but by the time "
            "you merged it with the head axis the group axis came first (a transpose, permute or movedim moved it), and "
            "merging (G, H_kv) gives the heads 0, 1, 0, 1, ... Reshape (B, H_kv, G, S, D_k) to (B, H, S, D_k) as it is, "
            "without moving an axis."),
    Mistake("expanded elsewhere, tiled", lambda kv, H, used: _only_if(
                "repeat" not in used and "expand" in used and not used & {"expand before the heads", "expand after the heads"},
                _tiled(kv, H)),
            "query head 1 got key/value head 1, expected 0: your heads come out tiled (0, 1, 0, 1, ...): where you merged "
            "the copies into the head axis, the group axis came before the key/value head axis. Put the group axis "
            "right after the head axis, kv[:, :, None], expand it, and reshape without moving an axis."),
    Mistake("tiled", lambda kv, H, used: _only_if(not used & {"repeat", "expand"}, _tiled(kv, H)),
            "query head 1 got key/value head 1, expected 0: your heads are tiled (0, 1, 0, 1, ...), as torch.cat([kv] * G, 1) "
            "or an index such as arange(H) % H_kv gives. Grouped-query attention gives consecutive query heads the same "
            "key/value head (0, 0, 0, 1, 1, 1): expand a new axis right after the head axis, kv[:, :, None]."),
    Mistake("group axis after the positions", lambda kv, H, used: kv[:, :, :, None].expand(
                *kv.shape[:3], H // kv.shape[1], kv.shape[3]).reshape(kv.shape[0], H, *kv.shape[2:]),
            "query head 0 gets position 0 several times: your copies sit along the positions axis (as "
            "kv[:, :, :, None].expand or repeat_interleave on dim 2 make them), and reshaping then mixes positions into "
            "the heads. Copy along a new axis right after the head axis: kv[:, :, None]."),
    Mistake("transposed, then reshaped back", lambda kv, H, used: kv.transpose(1, 2).repeat_interleave(
                H // kv.shape[1], dim=2).reshape(kv.shape[0], H, *kv.shape[2:]),
            "your heads mix positions: you made the copies in the [B, S, H, D_k] layout (after a transpose(1, 2)) and "
            "then reshaped to [B, H, S, D_k]. A reshape keeps the order of the numbers in memory, so it cannot swap "
            "two axes: go back with transpose(1, 2), or stay in [B, H_kv, S, D_k] and copy along a new axis right after "
            "the head axis, kv[:, :, None]."),
    Mistake("H copies of each", lambda kv, H, used: kv.repeat_interleave(H, dim=1)[:, :H],
            "every query head got key/value head 0 and the other key/value heads are missing: you made H copies of "
            "key/value head 0 (as kv[:, :1].expand, or repeat_interleave(H) cut to H heads, do) instead of "
            "G = H // H_kv copies of each key/value head."),
    Mistake("copies on the last axis", lambda kv, H, used: kv[..., None].expand(*kv.shape, H // kv.shape[1]).reshape(
                kv.shape[0], H, *kv.shape[2:]),
            "your copies sit on a new last axis (kv[..., None].expand(...)), so reshaping to [B, H, S, D_k] mixes "
            "positions and features into the heads. Copy along a new axis right after the head axis: kv[:, :, None]."),
)

_REPEAT_SIZES = (
    "your code raised RuntimeError: {error}. The sizes of your reshape do not fit this input (the checker tries two "
    "shapes): read B, H_kv, S and D_k from kv.shape and use G = num_heads // H_kv (not numbers written in)."
)
_EXPAND_SIZE_1 = (
    "your code raised RuntimeError: {error}. Your expand left the new group axis at size 1, so there is nothing "
    "to reshape into H heads: expand it to G = num_heads // H_kv."
)

_EXPAND_VIEW = (
    "your code raised RuntimeError: view size is not compatible with input tensor's size and stride. The expanded "
    "group axis has stride 0 (every copy reads the same memory), so view cannot merge it with the head axis: use "
    "reshape, which copies here."
)

#: The repeat-kv checker's cases ``(B, H_kv, S, D_k, H)``: every size differs within a case and between the two;
#: ``H // B``, ``H // S`` and ``H // D_k`` differ from ``G = H // H_kv``, so that a group size read from another
#: axis of ``kv`` gives the wrong number of heads; the first case has the section's G = 4, so that a G copied
#: from there passes it and is named as hard-coded on the second.
REPEAT_KV_CASES: tuple[tuple[int, int, int, int, int], ...] = ((2, 3, 5, 6, 12), (3, 2, 4, 5, 16))


def _repeat_kv_input(case: tuple[int, int, int, int, int]) -> Tensor:
    B, H_kv, S, d_k, _ = case
    return torch.arange(B * H_kv * S * d_k, dtype=torch.float64).view(B, H_kv, S, d_k)  # [B, H_kv, S, D_k], every number distinct


def _repeat_kv_one(fn: Callable[[Tensor, int], Tensor], case: tuple[int, int, int, int, int]) -> Feedback | None:
    B, H_kv, S, d_k, H = case
    kv = _repeat_kv_input(case)
    with _calls("repeat_interleave", "repeat", "expand", "index_select") as used:
        result, fb = _call(fn, kv.clone(), H, view_hint=_EXPAND_VIEW, hard_coded="\0{error}")
    expands = [(shape_in, shape_out) for name, shape_in, shape_out in used.shapes if name == "expand"]
    if (B, 1, H_kv, S, d_k) in (shape_in for shape_in, _ in expands):
        used.add("expand before the heads")
    if (B, H_kv, 1, S, d_k) in (shape_in for shape_in, _ in expands):
        used.add("expand after the heads")
    if fb is not None and fb.message.startswith("\0"):  # sizes that do not fit: worded by what the expand did
        stayed_1 = bool(expands) and all(math.prod(o) == math.prod(i) for i, o in expands)
        return wrong((_EXPAND_SIZE_1 if stayed_1 else _REPEAT_SIZES).format(error=fb.message[1:]))
    if fb is not None:
        if "expanded size" in fb.message and "must match" in fb.message:
            return wrong(f"{fb.message} expand can only stretch an axis of size 1 (or add new ones in front): insert a "
                         "group axis of size 1 right after the head axis, kv[:, :, None], expand it to G = H // H_kv, "
                         "then reshape (B, H_kv, G, S, D_k) to (B, H, S, D_k).")
        return fb
    if not isinstance(result, Tensor):
        return wrong(f"the function should return a torch.Tensor, got {describe(result)}.")
    if tuple(result.shape) == (B, H_kv, H // H_kv, S, d_k):
        return wrong(f"the result has shape {tuple(result.shape)}, which is [B, H_kv, G, S, D_k]: you expanded but did "
                     "not merge the key/value-head and group axes into one head axis. Finish with "
                     ".reshape(B, H, S, D_k).")
    if tuple(result.shape) != (B, H, S, d_k):
        first = REPEAT_KV_CASES[0]
        G_first = first[4] // first[1]  # the group size of the first case, right there
        if case != first and tuple(result.shape) == (B, H_kv * G_first, S, d_k):
            return wrong(f"the result has {H_kv * G_first} heads, expected H = {H}: your code was right for the first "
                         f"case (G = {G_first}) but gives each of these {H_kv} key/value heads {G_first} copies. Did "
                         "you hard-code G? Take it from the shapes: G = num_heads // H_kv, with H_kv read from "
                         "kv.shape.")
        if tuple(result.shape) == (B, H_kv * H_kv, S, d_k):
            return wrong(f"the result has {H_kv * H_kv} heads: you repeated each key/value head H_kv = {H_kv} times "
                         f"(repeat_interleave(H_kv)); the count is the group size G = H // H_kv = {H // H_kv}.")
        if H // B != H // H_kv and tuple(result.shape) == (B, H_kv * (H // B), S, d_k):
            return wrong(f"the result has {H_kv * (H // B)} heads, expected H = {H}: you took H_kv from axis 0, the batch "
                         f"(B = {B}). kv is [B, H_kv, S, D_k], so H_kv = kv.shape[1] and G = num_heads // H_kv.")
        if tuple(result.shape) == (B, H_kv, S * (H // H_kv), d_k):
            return wrong(f"the result has shape {tuple(result.shape)}: you repeated along dim=2, the positions. In "
                         "[B, H_kv, S, D_k] the key/value heads are dim=1, and each of them is what gets copied.")
        if tuple(result.shape) == (B, H_kv * H, S, d_k):
            return wrong(f"the result has {H_kv * H} heads: repeat each key/value head H // H_kv = {H // H_kv} times, not H times.")
        return wrong(f"the result has shape {tuple(result.shape)}, expected [B, H, S, D_k] = {(B, H, S, d_k)} for kv of "
                     f"shape {tuple(kv.shape)} and H = {H}.")
    expected = kv.repeat_interleave(H // H_kv, dim=1)  # [B, H, S, D_k]
    if close(result, expected):
        problem = _dtype_problem(result, kv)
        return None if problem is None else wrong(problem)
    hint = diagnose(result, REPEAT_KV_MISTAKES, kv, H, used)
    if hint is not None:
        return hint
    if result.is_complex():
        return wrong(f"the result is complex ({result.dtype}); repeating heads only copies numbers.")
    got = result.detach().to("cpu", torch.float64)
    for h in range(H):
        for g in range(H_kv):
            if torch.equal(got[:, h], kv[:, g]) and g != h // (H // H_kv):
                return wrong(f"query head {h} got key/value head {g}, expected {h // (H // H_kv)} = h // (H // H_kv).")
    return wrong("the result has the right shape but its heads are not copies of the key/value heads.")


def _solution_repeat_kv(kv: Tensor, num_heads: int) -> Tensor:
    B, H_kv, S, d_k = kv.shape
    G = num_heads // H_kv
    return kv[:, :, None].expand(B, H_kv, G, S, d_k).reshape(B, num_heads, S, d_k)  # [B, H, S, D_k]


def _repeat_kv_cases() -> list[tuple[Tensor, int, set[str]]]:
    return [(_repeat_kv_input(c), c[4], used) for c in REPEAT_KV_CASES
            for used in (set(), {"repeat"}, {"expand"}, {"expand", "expand before the heads"},
                         {"expand", "expand after the heads"})]


@exercise(solution=_solution_repeat_kv,
          tables=(MistakeTable(REPEAT_KV_MISTAKES, _repeat_kv_cases, lambda kv, H, used: kv.repeat_interleave(H // kv.shape[1], dim=1)),))
def check_repeat_kv(fn: Callable[[Tensor, int], Tensor]) -> Feedback:
    """Exercise 4: ``fn(kv [B, H_kv, S, D_k], H) -> [B, H, S, D_k]`` where query head ``h`` gets
    key/value head ``h // (H // H_kv)`` (consecutive query heads share a key/value head).

    Tried on the cases of :data:`REPEAT_KV_CASES`. The exercise asks for ``expand`` (then
    ``reshape``); right numbers from ``repeat_interleave`` or ``index_select`` pass, with a note
    that they copy at once.
    """
    copies: set[str] = set()
    for case in REPEAT_KV_CASES:
        problem = _repeat_kv_one(fn, case)
        if problem is not None:
            return problem
    with _calls("repeat_interleave", "repeat", "index_select", "expand") as used:
        run_reader_code(fn, _repeat_kv_input(REPEAT_KV_CASES[0]), REPEAT_KV_CASES[0][4])
    copies |= used - {"expand"}
    if not copies and "expand" not in used:
        return correct("the numbers are right. The exercise asks for expand (then reshape): without it (indexing with a "
                       "tensor of head numbers, kv[:, idx], or torch.cat/stack) every key/value head is copied at once, "
                       "while kv[:, :, None].expand(B, H_kv, G, S, D_k) is a view (no copy) until the reshape.")
    if copies:
        name = sorted(copies)[0]
        return correct(f"the numbers are right. The exercise asks for expand (then reshape): {name} copies every key/value "
                       "head at once, while kv[:, :, None].expand(B, H_kv, G, S, D_k) is a view (no copy) until the "
                       "reshape, which fused kernels can skip.")
    return correct("each group of H // H_kv consecutive query heads reads the same key/value head.")


# --- packed projections: one matmul for q, k and v ----------------------------------------------


def pack_qkv(w_q: Tensor, w_k: Tensor, w_v: Tensor, num_heads: int, num_kv_heads: int, layout: str) -> Tensor:
    """One ``[(H + 2 H_kv) D_k, D]`` weight (``nn.Linear``'s ``[out, in]``) holding ``W_Q``, ``W_K``, ``W_V``.

    ``layout="blocks"`` (GPT-2's ``c_attn``): all query features, then all key features, then all
    value features. ``layout="groups"`` (Falcon's ``query_key_value`` with the new decoder
    architecture): for each key/value head ``g``, its ``G = H / H_kv`` query heads, then key head
    ``g``, then value head ``g``.
    """
    if layout == "blocks":
        return torch.cat([w_q, w_k, w_v])  # [(H + 2 H_kv) D_k, D]
    if layout != "groups":
        raise ValueError(f"layout must be 'blocks' or 'groups', got {layout!r}")
    d_k = w_q.shape[0] // num_heads
    G, D = num_heads // num_kv_heads, w_q.shape[1]
    q = w_q.view(num_kv_heads, G * d_k, D)  # [H_kv, G D_k, D]: the query heads of each group
    k = w_k.view(num_kv_heads, d_k, D)  # [H_kv, D_k, D]
    v = w_v.view(num_kv_heads, d_k, D)  # [H_kv, D_k, D]
    return torch.cat([q, k, v], dim=1).reshape(-1, D)  # [H_kv (G + 2) D_k, D]


def split_blocks(fused: Tensor, num_heads: int, num_kv_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """Split ``[B, S, (H + 2 H_kv) D_k]`` packed as blocks (GPT-2): ``q [B, H, S, D_k]``, ``k, v [B, H_kv, S, D_k]``."""
    d_k = fused.shape[-1] // (num_heads + 2 * num_kv_heads)
    q, k, v = fused.split([num_heads * d_k, num_kv_heads * d_k, num_kv_heads * d_k], dim=-1)  # [B, S, H D_k], ...
    return split_heads(q, num_heads), split_heads(k, num_kv_heads), split_heads(v, num_kv_heads)


def split_groups(fused: Tensor, num_heads: int, num_kv_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """Split ``[B, S, (H + 2 H_kv) D_k]`` packed in groups (Falcon): ``q [B, H, S, D_k]``, ``k, v [B, H_kv, S, D_k]``."""
    B, S, F = fused.shape
    G = num_heads // num_kv_heads
    d_k = F // (num_heads + 2 * num_kv_heads)
    qkv = fused.view(B, S, num_kv_heads, G + 2, d_k)  # [B, S, H_kv, G + 2, D_k]
    q = qkv[:, :, :, :G].reshape(B, S, num_heads, d_k)  # [B, S, H, D_k], group after group
    k, v = qkv[:, :, :, G], qkv[:, :, :, G + 1]  # each [B, S, H_kv, D_k]
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, S, D_k], [B, H_kv, S, D_k] x 2


def packed_split_is_right(split: Callable[[Tensor, int, int], tuple[Tensor, Tensor, Tensor]], layout: str,
                          num_heads: int = 4, num_kv_heads: int = 2, d_k: int = 3, seed: int = 0) -> bool:
    """A test for a packed-QKV split: pack random ``W_Q, W_K, W_V`` in ``layout``, project once, split,
    and compare with the three separate projections (with ``H_kv > 1``: for ``H_kv = 1`` the two
    layouts coincide and a wrong split cannot show)."""
    gen = torch.Generator().manual_seed(seed)
    D = num_heads * d_k
    w_q, w_k, w_v = (torch.randn(h * d_k, D, generator=gen, dtype=torch.float64) for h in (num_heads, num_kv_heads, num_kv_heads))
    x = torch.randn(2, 5, D, generator=gen, dtype=torch.float64)  # [B, S, D]
    fused = x @ pack_qkv(w_q, w_k, w_v, num_heads, num_kv_heads, layout).T  # [B, S, (H + 2 H_kv) D_k]: one matmul
    got = split(fused, num_heads, num_kv_heads)
    want = (split_heads(x @ w_q.T, num_heads), split_heads(x @ w_k.T, num_kv_heads), split_heads(x @ w_v.T, num_kv_heads))
    return all(g.shape == w.shape and torch.allclose(g, w) for g, w in zip(got, want))


# --- the memory-layout figure ---------------------------------------------------------------


# Okabe-Ito colours (colour-blind safe), one per position in memory_layout.
_OKABE_ITO = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999"]
# memory_layout's hatching, one per head, with the name its alt text gives it.
_HATCHES = [("", "none"), ("///", "diagonal"), ("...", "dots"), ("xxx", "crosses"), ("\\\\\\", "back-diagonal"),
            ("ooo", "circles")]


def _runs(offsets: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0 to 2, 5"``: consecutive offsets written as ranges."""
    runs: list[list[int]] = []
    for o in offsets:
        if runs and o == runs[-1][-1] + 1:
            runs[-1].append(o)
        else:
            runs.append([o])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def memory_layout_alt(seq_len: int = 3, num_heads: int = 2, d_k: int = 2, tokens: Sequence[str] | None = None) -> str:
    """The alt text of :func:`memory_layout` with the same arguments, written from the same tensors and tokens."""
    import torch

    S, H = seq_len, num_heads
    D = H * d_k
    tokens = [f"pos {s}" for s in range(S)] if tokens is None else list(tokens)
    flat = torch.arange(S * D)  # [S * D], the memory
    shd = flat.view(S, H, d_k)  # [S, H, D_k]
    hsd = shd.transpose(0, 1)  # [H, S, D_k], a view
    bug = flat.view(H, S, d_k)  # [H, S, D_k], the bug
    colours = ", ".join(f"{tokens[s]}: {_runs(range(s * D, (s + 1) * D))}" for s in range(S))
    hatched = "; ".join(f"head {h}: {_runs(shd[:, h].reshape(-1).tolist())}" for h in range(1, H))
    transposed = " and ".join(f"{' '.join(map(str, hsd[h].reshape(-1).tolist()))} for head {h}" for h in range(H))
    cut = " and ".join(f"{_runs(bug[h].reshape(-1).tolist())} for head {h}" for h in range(H))
    bug0 = bug[0].reshape(-1).tolist()
    bug0_heads = sorted({(o % D) // d_k for o in bug0})
    bug0_tokens = [tokens[s] for s in sorted({o // D for o in bug0})]
    hatch_names = ", ".join(f"head {h} {_HATCHES[h % len(_HATCHES)][1]}" for h in range(H))
    mixes = ("hatched and unhatched cells" if len(bug0_heads) > 1 else "cells") + " of " + " and ".join(bug0_tokens)
    return (f"Four rows of {S * D} numbered cells. Row 1 is memory, offsets 0 to {S * D - 1}, coloured by position "
            f"({colours}) and hatched by head ({hatched}). Row 2, view(S, H, D_k), reads them in order in {S} groups, "
            f"one per position, strides {tuple(shd.stride())}. Row 3, the transpose, reads {transposed}, strides "
            f"{tuple(hsd.stride())}: one colour per row, jumps in memory. Row 4, the bug view(H, S, D_k), reads {cut}, "
            f"strides {tuple(bug.stride())}: head 0 mixes {mixes}. A legend below the rows names the {S} colours "
            f"({', '.join(tokens)}) and the {H} hatchings ({hatch_names}).")


def memory_layout(seq_len: int = 3, num_heads: int = 2, d_k: int = 2, tokens: Sequence[str] | None = None) -> Any:
    """How one ``[S, H * D_k]`` tensor sits in memory and how three shapes read it (returns the Figure).

    The numbers ``0 .. S*H*D_k - 1`` are memory offsets; colour = the position a number belongs
    to, hatching = the head it belongs to in the correct split. Row 1 is the memory itself. Rows
    2-4 list the elements of a view in its own index order (last index fastest), each cell showing
    which memory offset it reads, with gaps between the slices of its first axis:
    ``view(S, H, D_k)`` reads the memory in order (contiguous); its ``transpose(0, 1)``,
    ``[H, S, D_k]``, reads it with jumps (same memory, not contiguous) and each head holds one
    colour per row; the bug ``view(H, S, D_k)`` reads it in order but cuts it in the wrong place,
    so a head holds several positions. Shapes and strides in the labels come from real tensors.
    """
    import matplotlib.pyplot as plt
    import torch
    from matplotlib.patches import Rectangle

    S, H = seq_len, num_heads
    D = H * d_k
    if S > len(_OKABE_ITO):
        raise ValueError(f"memory_layout draws at most {len(_OKABE_ITO)} positions, got seq_len = {S}")
    tokens = [f"pos {s}" for s in range(S)] if tokens is None else list(tokens)
    if len(tokens) != S:
        raise ValueError(f"{len(tokens)} tokens for seq_len = {S}")
    flat = torch.arange(S * D)  # [S * D], the memory
    shd = flat.view(S, H, d_k)  # [S, H, D_k]
    hsd = shd.transpose(0, 1)  # [H, S, D_k], a view
    bug = flat.view(H, S, d_k)  # [H, S, D_k], the bug
    hatches = [pattern for pattern, _ in _HATCHES]
    rows = [
        ("memory", flat.view(1, -1), None, "offset 0, 1, 2, ... (one after another)"),
        (f"view(S, H, D_k)  {list(shd.shape)}", shd, "position", f"strides {tuple(shd.stride())}: contiguous"),
        (f".transpose(0, 1)  {list(hsd.shape)}", hsd, "head", f"strides {tuple(hsd.stride())}: not contiguous, no copy"),
        (f"bug: view(H, S, D_k)  {list(bug.shape)}", bug, "head", f"strides {tuple(bug.stride())}: contiguous, wrong"),
    ]
    gap = 0.6
    width = S * D + gap * (max(S, H) - 1)
    # phone-sized: 5.2 inches wide, every text at least 12 pt (attnbook.figures.PHONE_FIGURE_INCHES)
    fig, axes = plt.subplots(len(rows), 1, figsize=(5.2, 1.45 * len(rows) + 1.8))
    for ax, (label, t, outer, note) in zip(axes, rows):
        x = 0.0
        for i in range(t.shape[0]):
            if outer is not None:
                group = tokens[i] if outer == "position" else f"head {i}"
                n = t[i].numel()
                ax.text(x + n / 2, 1.12, group, ha="center", va="bottom", fontsize=12)
            for offset in t[i].reshape(-1).tolist():
                s, f = divmod(int(offset), D)
                ax.add_patch(Rectangle((x, 0), 1, 1, facecolor=_OKABE_ITO[s], edgecolor="black",
                                       hatch=hatches[(f // d_k) % len(hatches)], linewidth=1))
                ax.text(x + 0.5, 0.5, str(int(offset)), ha="center", va="center", fontsize=12, fontweight="bold",
                        bbox=dict(boxstyle="round,pad=0.1", facecolor="white", edgecolor="none", alpha=0.85))
                x += 1
            if outer is not None:
                x += gap
        ax.set_xlim(-0.1, width + 0.1)
        ax.set_ylim(-0.1, 1.6)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        ax.set_title(f"{label}\n{note}", fontsize=12, loc="left")
    fig.suptitle(f"One [S, D] = [{S}, {D}] tensor in memory (B = 1\ndropped) and three ways to read it (cell =\n"
                 f"memory offset read; colour = position;\nhatching = head)", fontsize=12)
    keys = [Rectangle((0, 0), 1, 1, facecolor=_OKABE_ITO[s], edgecolor="black") for s in range(S)]
    keys += [Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black", hatch=hatches[h % len(hatches)]) for h in range(H)]
    names = list(tokens) + [f"head {h}" + (" (no hatching)" if hatches[h % len(hatches)] == "" else "") for h in range(H)]
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.legend(keys, names, loc="lower center", ncol=3, fontsize=12, frameon=False, handlelength=1.6, handleheight=1.2)
    return fig


# --- diagrams ----------------------------------------------------------------------------------

#: The chapter's numbered example: three tokens, D = H * D_k = 2 * 2 features each (B = 1).
LAYOUT_TOKENS = ("books", "are", "old")
LAYOUT_HEADS, LAYOUT_DK = 2, 2
_POSITION_COLOURS = ("sky", "orange", "green")


def _layout_tensors() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    S, H, dk = len(LAYOUT_TOKENS), LAYOUT_HEADS, LAYOUT_DK
    x = torch.arange(S * H * dk).view(1, S, H * dk)  # [B, S, D]: position s holds its own numbers
    x4 = x.view(1, S, H, dk)  # [B, S, H, D_k]
    return x, x4, x4.transpose(1, 2), x.view(1, H, S, dk)  # ..., right heads, the bug's heads


def _fills(t: Tensor) -> list[list[str]]:
    width = LAYOUT_HEADS * LAYOUT_DK
    return [[_POSITION_COLOURS[int(v) // width] for v in row] for row in t.tolist()]


def _labels(t: Tensor) -> list[list[str]]:
    return [[str(int(v)) for v in row] for row in t.tolist()]


@diagram
def strides_diagram() -> Diagram:
    """One block of memory read three ways: x, its view with a head axis, and the transposed view."""
    x, x4, heads, _ = _layout_tensors()
    S, H, dk = len(LAYOUT_TOKENS), LAYOUT_HEADS, LAYOUT_DK
    D = H * dk
    d = Diagram(
        "ch06_strides", 420, 484, title="Strides: one block of memory read three ways",
        alt=(f"The numbers 0 to {S * D - 1} lie in memory in one row, coloured by the token they belong to "
             f"({', '.join(LAYOUT_TOKENS)}). x reads them as (1, {S}, {D}) with stride {x.stride()}; "
             f"x.view(1, {S}, {H}, {dk}) reads the same memory as (1, {S}, {H}, {dk}) with stride {x4.stride()}; "
             f"transpose(1, 2) reads it as (1, {H}, {S}, {dk}) with stride {heads.stride()}: head 0 holds "
             f"{', '.join(str(v) for v in heads[0, 0].flatten().tolist())}, offsets with jumps, so it is not "
             "contiguous, and nothing was copied."))
    cell = 28
    mem = list(range(S * D))
    d.text(14, 24, "memory", size=15, anchor="start", weight="bold")
    d.grid(14, 34, [[_POSITION_COLOURS[v // D] for v in mem]], cell=cell, labels=[[str(v) for v in mem]], size=14)
    for s, tok in enumerate(LAYOUT_TOKENS):
        d.text(14 + (s * D + D / 2) * cell, 34 + cell + 18, tok, size=14, color=MUTED)
    gx, tx = 84, 230
    # x
    y = 118
    d.grid(gx, y, _fills(x[0]), cell=cell, labels=_labels(x[0]), row_labels=list(LAYOUT_TOKENS), size=14)
    d.text(tx, y + 20, f"x [1, {S}, {D}]", size=15, anchor="start")
    d.text(tx, y + 42, f"stride {x.stride()}", size=14, anchor="start", color=MUTED)
    # view
    y = 226
    for s in range(S):
        for h in range(H):
            d.grid(gx + h * (dk * cell + 10), y + s * (cell + 4), _fills(x4[0, s, h][None]), cell=cell,
                   labels=_labels(x4[0, s, h][None]), size=14)
        d.text(gx - 6, y + s * (cell + 4) + cell / 2 + 5, LAYOUT_TOKENS[s], size=14, anchor="end")
    d.text(tx, y + 20, f".view(1, {S}, {H}, {dk})", size=15, anchor="start")
    d.text(tx, y + 42, f"stride {x4.stride()}", size=14, anchor="start", color=MUTED)
    # transpose
    y = 362
    for h in range(H):
        d.grid(gx + h * (dk * cell + 10), y, _fills(heads[0, h]), cell=cell, labels=_labels(heads[0, h]), size=14)
        d.text(gx + h * (dk * cell + 10) + dk * cell / 2, y - 6, f"head {h}", size=14)
    d.text(tx, y + 20, ".transpose(1, 2)", size=15, anchor="start")
    d.text(tx, y + 42, f"stride {heads.stride()}", size=14, anchor="start", color=MUTED)
    d.text(tx, y + 64, "not contiguous,", size=14, anchor="start", color=MUTED)
    d.text(tx, y + 84, "nothing copied", size=14, anchor="start", color=MUTED)
    return d


@diagram
def silent_bug_diagram() -> Diagram:
    """What each head holds after the right split and after x.view(B, H, S, D_k)."""
    _, _, heads, bug = _layout_tensors()
    S, H, dk = len(LAYOUT_TOKENS), LAYOUT_HEADS, LAYOUT_DK
    D = H * dk

    def owners(t: Tensor) -> str:
        return ", ".join(LAYOUT_TOKENS[int(r[0]) // D] for r in t.tolist())

    d = Diagram(
        "ch06_silent_bug", 420, 300, title="The silent bug: reshaping without transposing",
        alt=(f"Two ways to get a (1, {H}, {S}, {dk}) tensor from the numbers of x, coloured by token. With "
             f".view(1, {S}, {H}, {dk}).transpose(1, 2), row s of every head is token s: head 0's rows belong "
             f"to {owners(heads[0, 0])}. With .view(1, {H}, {S}, {dk}) the shape is the same and nothing fails, "
             f"but head 0's rows belong to {owners(bug[0, 0])} and head 1's to {owners(bug[0, 1])}."))
    cell = 30
    for col, (title1, title2, t, x0) in enumerate((
            (f".view(1, {S}, {H}, {dk})", ".transpose(1, 2)", heads, 72),
            (f".view(1, {H}, {S}, {dk})", "no transpose", bug, 282))):
        d.text(x0 + 64, 24, title1, size=15, color=INK)
        d.text(x0 + 64, 44, title2, size=15, color=INK, weight="bold")
        for h in range(H):
            gx = x0 + h * (dk * cell + 8)
            d.grid(gx, 84, _fills(t[0, h]), cell=cell, labels=_labels(t[0, h]), size=14)
            d.text(gx + dk * cell / 2, 76, f"head {h}", size=14)
        for s in range(S):
            d.text(x0 - 6, 84 + s * cell + cell / 2 + 5, f"row {s}", size=14, anchor="end")
    d.line(210, 16, 210, 200, color=MUTED, width=1, dash=True)
    for s, tok in enumerate(LAYOUT_TOKENS):
        d.rect(40 + s * 120, 222, 22, 22, fill=_POSITION_COLOURS[s], tint=True, stroke=INK, rx=0, width=1)
        d.text(68 + s * 120, 239, tok, size=14, anchor="start")
    d.text(210, 280, "same shape, no error: rows are no longer positions", size=14, color=MUTED)
    return d


#: The packing diagram's heads: H = 4 query heads sharing H_kv = 2 key/value heads (G = 2).
PACK_HEADS, PACK_KV_HEADS = 4, 2
_PACK_COLOURS = {"q": "sky", "k": "orange", "v": "green"}


def _packed_order(layout: str) -> list[str]:
    """Which head each output of a packed projection belongs to, read off :func:`pack_qkv` itself (D_k = 1)."""
    H, H_kv = PACK_HEADS, PACK_KV_HEADS
    tags = [torch.arange(n, dtype=torch.float64)[:, None] + 100 * i for i, n in enumerate((H, H_kv, H_kv))]
    packed = pack_qkv(*tags, num_heads=H, num_kv_heads=H_kv, layout=layout)  # [H + 2 H_kv, 1]
    return [f"{'qkv'[int(v) // 100]}{int(v) % 100}" for v in packed[:, 0].tolist()]


@diagram
def packing_diagram() -> Diagram:
    """The outputs of one packed q/k/v projection in the two layouts: blocks (GPT-2) and groups (Falcon)."""
    blocks, groups = _packed_order("blocks"), _packed_order("groups")
    alt = (f"The {len(blocks)} head-sized outputs of one packed projection with H = {PACK_HEADS} query heads and "
           f"H_kv = {PACK_KV_HEADS} key/value heads, in two layouts. Blocks (GPT-2): {', '.join(blocks)}, all queries, "
           f"then all keys, then all values. Groups (Falcon): {', '.join(groups)}, each key/value head after its "
           f"{PACK_HEADS // PACK_KV_HEADS} query heads. Splitting one layout as if it were the other runs and mixes "
           "queries, keys and values.")
    d = Diagram("ch06_packing", 420, 214, title="One packed projection, two layouts", alt=alt)
    cell = 44
    x0 = (420 - cell * len(blocks)) / 2
    for row, (name, order) in enumerate((("blocks (GPT-2 c_attn)", blocks), ("groups (Falcon query_key_value)", groups))):
        y = 34 + row * 88
        d.text(x0, y, name, size=15, anchor="start", weight="bold")
        labels = [f"{t[0]}_{{{t[1:]}}}" for t in order]
        d.grid(x0, y + 10, [[_PACK_COLOURS[t[0]] for t in order]], cell=cell, labels=[labels], size=17)
    d.text(210, 204, "same shapes: the split must follow the packing", size=14, color=MUTED)
    return d


# --- an operation log -------------------------------------------------------------------------

try:  # a private module, but the one PyTorch's own FLOP counter is built on
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:  # pragma: no cover - present in every torch this book supports
    TorchDispatchMode = object  # type: ignore[misc, assignment]


class OpLog(TorchDispatchMode):  # type: ignore[misc, valid-type]
    """Record the name of every operation PyTorch dispatches inside ``with OpLog() as log:`` in ``log.ops``.

    It sees the operators (``bmm``, ``clone``, ``_scaled_dot_product_flash_attention_for_cpu``, ...), not what a
    fused kernel does inside one of them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


#: The grouped-query diagram's heads: H = 4 query heads sharing H_kv = 2 key/value heads (G = 2).
GQA_HEADS, GQA_KV_HEADS = 4, 2


@diagram
def gqa_expand_diagram() -> Diagram:
    """Key/value heads for grouped-query attention: expand reads each block G times, reshape writes G copies."""
    H, H_kv = GQA_HEADS, GQA_KV_HEADS
    G = H // H_kv
    kv = torch.arange(H_kv * 3 * 2).view(1, H_kv, 3, 2)  # [B, H_kv, S, D_k], S = 3, D_k = 2
    expanded = kv[:, :, None].expand(1, H_kv, G, 3, 2)  # [B, H_kv, G, S, D_k], stride 0 on G
    flat = expanded.reshape(1, H, 3, 2)  # [B, H, S, D_k], a copy
    mqa = kv[:, :1, None].expand(1, 1, H, 3, 2).reshape(1, H, 3, 2)  # H_kv = 1: still a view
    assert expanded.stride()[2] == 0 and flat.data_ptr() != kv.data_ptr() and mqa.data_ptr() == kv.data_ptr()
    reads = [h // G for h in range(H)]  # the key/value head each query head reads
    colours = ("sky", "orange")
    d = Diagram(
        "ch06_gqa_expand", 420, 396, title="Grouped-query attention: expand shares, reshape copies",
        alt=(f"Key/value heads for {H} query heads and {H_kv} key/value heads (G = {G}). Top: memory holds "
             f"{H_kv} blocks, kv 0 and kv 1. Middle: expand on a new group axis right after the head axis is a view "
             f"with stride 0 on that axis (stride {expanded.stride()}); query heads 0 to {H - 1} point at blocks "
             f"{', '.join(str(r) for r in reads)}, so each block is read {G} times and nothing is copied. "
             f"Bottom: .reshape(B, H, S, D_k) cannot merge the group axis into one stride, so it writes new memory "
             f"holding {', '.join(f'kv {r}' for r in reads)}: {G} copies of each block, {G} times the memory. "
             "With one key/value head (multi-query attention) there is one block, and the reshape stays a view "
             "with stride 0 on the head axis."))
    bw, gap = 80, 12
    x0 = (420 - (H * bw + (H - 1) * gap)) / 2

    def hx(h: int) -> float:
        return x0 + h * (bw + gap)

    d.text(14, 26, f"kv in memory: {H_kv} blocks", size=15, anchor="start", weight="bold")
    mem_x = [hx(2 * j) + (bw + gap) / 2 for j in range(H_kv)]  # memory blocks centred over their groups
    for j in range(H_kv):
        d.box(mem_x[j], 40, bw, 40, f"kv {j}", color=colours[j])
    d.text(14, 132, f".expand: {H} heads, stride 0", size=15, anchor="start", weight="bold")
    for h in range(H):
        d.rect(hx(h), 150, bw, 36, stroke=colours[reads[h]], dash=True, width=2)
        d.text(hx(h) + bw / 2, 173, f"head {h}", size=14)
        d.arrow(hx(h) + bw / 2, 150, mem_x[reads[h]] + bw / 2, 84, color=MUTED)
    d.text(210, 210, f"each block read {G} times; nothing copied", size=14, color=MUTED)
    d.text(14, 254, ".reshape(B, H, S, D_k): new memory", size=15, anchor="start", weight="bold")
    for h in range(H):
        d.box(hx(h), 268, bw, 40, f"kv {reads[h]}", color=colours[reads[h]])
    d.text(210, 334, f"{G} copies of each block, {G} times the memory", size=14, color=MUTED)
    d.text(210, 374, "H_kv = 1: one block, the reshape stays a view", size=14, color=INK)
    return d
