"""Chapter 11's exercises: blocks a request needs, a forked sequence's block table after copy-on-write,
int8 per-token quantisation, softmax with a sink logit."""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import torch
from torch import Tensor

from ..feedback import (HALF_TOL, Feedback, Mistake, MistakeTable, as_index, call_reader, check_number_cases, close,
                        computed_narrower, correct, describe, diagnose, exercise, low_precision, mismatched_sizes, not_a_tensor, wrong)
from ._common import float_tensor, positive_int

# ---- exercise 1: blocks a request needs -----------------------------------------------------------

def reference_blocks_needed(prompt_len: int, new_tokens: int, block_size: int, shared_prefix: int) -> int:
    """New blocks a request allocates: its positions in whole blocks, minus the full blocks of a cached prefix."""
    block_size = positive_int("block_size", block_size)
    prompt_len, new_tokens = positive_int("prompt_len", prompt_len, minimum=0), positive_int("new_tokens", new_tokens, minimum=0)
    if not 0 <= positive_int("shared_prefix", shared_prefix, minimum=0) <= prompt_len:
        raise ValueError(f"shared_prefix must be in 0..prompt_len = {prompt_len}, got {shared_prefix!r}")
    total = -(-(prompt_len + new_tokens) // block_size)
    return total - shared_prefix // block_size


# (prompt, new tokens, block size, cached prefix tokens). Subtracting prefix tokens instead of prefix blocks
# agrees with the floor-division mistake when the last block's fill is at most the prefix's remainder
# (the first case) and with the answer when it is larger (the third): the cases together tell all three apart.
# The fourth tells round() from prefix tokens; the fifth (a prefix of whole blocks) and sixth (no prefix)
# catch a prefix counted off by one; the seventh (one position past a large block) an approximate ceil; the
# eighth tells round() from a prompt rounded down and the new tokens rounded up separately.
BLOCKS_CASES = ((100, 30, 16, 40), (250, 38, 32, 200), (61, 17, 8, 19), (100, 38, 16, 44),
                (64, 10, 16, 32), (20, 5, 8, 0), (100, 29, 128, 0), (42, 1, 8, 16))
BLOCKS_MISTAKES = (
    Mistake("floor division", lambda p, n, b, s: (p + n) // b - s // b,
            "a partly filled last block still has to be allocated: your count drops it whenever the positions do not "
            "fill whole blocks."),
    Mistake("partial prefix block shared", lambda p, n, b, s: -(-(p + n) // b) - -(-s // b),
            "only FULL blocks of the prefix are shared (a block's hash covers all its tokens): the shared count is "
            "shared_prefix // block_size."),
    Mistake("no sharing", lambda p, n, b, s: -(-(p + n) // b),
            "the blocks of the cached prefix already exist: subtract the full blocks it covers."),
    Mistake("prompt only", lambda p, n, b, s: -(-p // b) - s // b,
            "the generated tokens need blocks too: count prompt_len + new_tokens positions."),
    Mistake("prefix tokens subtracted", lambda p, n, b, s: -(-(p + n - s) // b),
            "you subtracted the prefix's tokens before counting blocks: the request's positions fill whole blocks "
            "from position 0, shared prefix included, and what it shares is whole blocks of the prefix, not tokens. "
            "Count the request's blocks first, then take away the prefix's full blocks."),
    Mistake("ceil as // b + 1", lambda p, n, b, s: (p + n) // b + 1 - s // b,
            "`x // b + 1` rounds up only when b does not divide x: when the positions fill their blocks exactly it "
            "counts one block too many. Round up in a way that adds nothing when the positions fill their blocks exactly."),
    Mistake("round to nearest", lambda p, n, b, s: round((p + n) / b) - s // b,
            "round() goes to the nearest block count, so a last block filled less than half is dropped: round up instead."),
    Mistake("prefix blocks by /", lambda p, n, b, s: -(-(p + n) // b) - s / b,
            "shared_prefix / block_size is a fraction of blocks: only FULL blocks are shared, so count them with "
            "floor division, shared_prefix // block_size, and the answer stays a whole number."),
    Mistake("true division", lambda p, n, b, s: (p + n) / b - s / b,
            "(prompt_len + new_tokens) / block_size is a fraction of blocks: blocks are allocated whole, so round the "
            "count up, and subtract only the prefix blocks that are full."),
    Mistake("fraction of blocks, prefix by //", lambda p, n, b, s: (p + n) / b - s // b,
            "you returned a fraction of blocks ((prompt_len + new_tokens) / block_size with /): blocks are allocated "
            "whole, so round the count up before subtracting the prefix's full blocks."),
    Mistake("last position left out", lambda p, n, b, s: -(-(p + n - 1) // b) - s // b,
            "you counted prompt_len + new_tokens - 1 positions: this exercise counts every generated token as "
            "cached, prompt_len + new_tokens positions in all."),
    Mistake("prompt and new tokens rounded separately", lambda p, n, b, s: -(-p // b) + -(-n // b) - s // b,
            "the generated tokens continue in the prompt's last block: round up once, for all "
            "prompt_len + new_tokens positions, not for the prompt and the new tokens separately."),
    Mistake("positions, not blocks", lambda p, n, b, s: p + n - s,
            "you counted positions (tokens), not blocks: a block holds block_size positions, so count the blocks the "
            "request's positions fill, whole blocks, and take off the blocks of the prefix that are already full."),
    Mistake("prefix tokens off, the rest rounded in two parts", lambda p, n, b, s: -(-(p - s) // b) + -(-n // b),
            "you took the prefix's tokens off the prompt and rounded the rest of the prompt and the new tokens up "
            "separately: blocks are laid out from position 0, prefix included, so count the blocks all "
            "prompt_len + new_tokens positions fill, rounded up once, then take off the prefix's FULL blocks."),
    Mistake("prefix taken as a block count", lambda p, n, b, s: -(-(p + n) // b) - s,
            "shared_prefix counts TOKENS of the prompt, not blocks: the blocks it fills completely, and so already "
            "exist, are shared_prefix // block_size."),
    Mistake("one spare block", lambda p, n, b, s: -(-(p + n) // b) + 1 - s // b,
            "you added one block to the rounded-up count: rounding up already "
            "includes the partly filled last block, and a paged cache keeps no spare empty block (it takes a new "
            "block only when a write finds the last one full)."),
    Mistake("prompt floored, new tokens rounded up", lambda p, n, b, s: p // b + -(-n // b) - s // b,
            "you rounded the prompt's blocks down (prompt_len // block_size) and the new tokens' up, separately: the "
            "generated tokens continue in the prompt's partly filled last block, so add the positions first and "
            "round up once."),
    Mistake("one block too few", lambda p, n, b, s: (p + n - 1) // b - s // b,
            "one block too few: (prompt_len + new_tokens - 1) // block_size is the INDEX of the block holding the "
            "last position, counted from 0, not the number of blocks; and if "
            "you subtracted shared_prefix // block_size + 1, the prefix shares exactly shared_prefix // block_size "
            "full blocks, not one more."),
    Mistake("prefix blocks rounded to nearest", lambda p, n, b, s: -(-(p + n) // b) - round(s / b),
            "round(shared_prefix / block_size) counts a prefix block filled more than half as shared: only FULL "
            "blocks are shared (a partly filled block's hash would cover tokens the prefix does not have), so "
            "round the prefix down, shared_prefix // block_size."),
    Mistake("generated tokens only", lambda p, n, b, s: -(-n // b),
            "the prompt's positions need blocks too, and the cached prefix is part of the prompt: count "
            "prompt_len + new_tokens positions, then subtract the prefix's full blocks."),
)


def _vector(f: Callable[..., Any], cases: tuple) -> tuple[Any, ...]:
    """``f`` on every case: the checkers compare a reader's answers on all cases together."""
    return tuple(f(*case) for case in cases)


def _solution_blocks(prompt_len: int, new_tokens: int, block_size: int, shared_prefix: int) -> int:
    return -(-(prompt_len + new_tokens) // block_size) - shared_prefix // block_size


@exercise(solution=_solution_blocks,
          tables=(MistakeTable(tuple(Mistake(m.name, lambda m=m: _vector(m.compute, BLOCKS_CASES), m.hint) for m in BLOCKS_MISTAKES),
                               lambda: [()], lambda: _vector(reference_blocks_needed, BLOCKS_CASES)),),
          not_generic={"float16": "the answer is a count"})
def check_blocks_needed(fn: Callable[..., Any]) -> Feedback:
    """Check ``fn(prompt_len, new_tokens, block_size, shared_prefix) -> new blocks`` on every case of ``BLOCKS_CASES``."""
    return check_number_cases(
        fn, BLOCKS_CASES, reference_blocks_needed, BLOCKS_MISTAKES, what="a number of blocks", same=lambda a, b: a == b,
        done="a request allocates its positions in whole blocks, less the full blocks a cached prefix already holds.",
        generic="work out by hand the new blocks of a request of 20 positions in blocks of 8 with no prefix, then "
                "with a 16-token prefix, and compare them with what your function returns.")


# ---- exercise 2: int8 per-token quantisation ------------------------------------------------------

def reference_int8_per_token(x: Tensor) -> Tensor:
    """Quantise ``x [..., S, D_k]`` to int8 with one symmetric scale per position, then dequantise."""
    float_tensor("x", x, min_dim=2)
    scale = x.abs().amax(dim=-1, keepdim=True) / 127  # [..., S, 1]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a position of zeros: codes 0 whatever the scale
    return torch.round(x / scale).clamp(-127, 127) * scale


INT8_CASES = ((2, 3, 5, 8, 1), (1, 2, 7, 6, 2))  # (B, H_kv, S, D_k, seed): every size differs
#: Tried after those: (case, dtype, magnitude). A float64 cache with positions of zeros (padding, an unused
#: slot); then 16-bit caches, with zero positions too, whose largest values (28,384 in float16, 17,408 in
#: bfloat16) fit float16's range of 65,504 while x * 127 does not.
INT8_MORE_CASES = ((1, torch.float64, 1.0), (0, torch.float16, 2500.0), (1, torch.bfloat16, 2500.0))


def _int8_case(B: int, H: int, S: int, D: int, seed: int, dtype: torch.dtype = torch.float64, size: float = 1.0,
               zeros: bool = False) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, S, D, generator=gen, dtype=torch.float64) * torch.linspace(0.5, 4, D, dtype=torch.float64)
    if zeros:
        x[..., 0, 1, :] = 0  # head 0, position 1 of every sequence
        x[..., -1, -1, :] = 0
    return (x * size).to(dtype)


INT8_MISTAKES = (
    Mistake("per channel", lambda x: torch.round(x / (x.abs().amax(-2, keepdim=True) / 127)).clamp(-127, 127) * (x.abs().amax(-2, keepdim=True) / 127),
            "one scale per channel (over the positions) is the per-channel scheme: per token, take the max |x| over "
            "a position's D_k numbers."),
    Mistake("per tensor", lambda x: torch.round(x / (x.abs().amax() / 127)) * (x.abs().amax() / 127),
            "one scale for the whole tensor wastes precision on small positions: one scale per position."),
    Mistake("truncation", lambda x: torch.trunc(x / (x.abs().amax(-1, keepdim=True) / 127)) * (x.abs().amax(-1, keepdim=True) / 127),
            "round to the nearest integer (torch.round), not towards zero: truncation biases every value towards 0."),
    Mistake("scale 128", lambda x: torch.round(x / (x.abs().amax(-1, keepdim=True) / 128)).clamp(-127, 127) * (x.abs().amax(-1, keepdim=True) / 128),
            "the symmetric int8 range is -127..127: divide the max by 127, or the largest value clips."),
    Mistake("scale 255", lambda x: torch.round(x / (x.abs().amax(-1, keepdim=True) / 255)) * (x.abs().amax(-1, keepdim=True) / 255),
            "255 counts the codes of an asymmetric (min-to-max) range: with a symmetric scale the codes run from "
            "-127 to 127, so the step is max|x| / 127 (dividing by 255 gives codes up to 255, which int8 cannot hold)."),
    Mistake("scale 255, clamped", lambda x: torch.round(x / (x.abs().amax(-1, keepdim=True) / 255)).clamp(-127, 127) * (x.abs().amax(-1, keepdim=True) / 255),
            "255 counts the codes of an asymmetric (min-to-max) range: with a symmetric scale the codes run from "
            "-127 to 127, so the step is max|x| / 127; with max|x| / 255 every value above half the max clips."),
    Mistake("scale 128, range -128..127", lambda x: torch.round(x / (x.abs().amax(-1, keepdim=True) / 128)).clamp(-128, 127) * (x.abs().amax(-1, keepdim=True) / 128),
            "int8 reaches -128, but a symmetric scale maps the largest |x| to 127 so that +max and -max both fit: "
            "scale = max|x| / 127 and clamp to -127..127."),
    Mistake("scale rounded to float16", lambda x: torch.round(x / (x.abs().amax(-1, keepdim=True) / 127).half().to(x.dtype)).clamp(-127, 127) * (x.abs().amax(-1, keepdim=True) / 127).half().to(x.dtype),
            "your scale was rounded to float16: keep it in the input's dtype here (a real cache may store it in "
            "16 bits, but the exercise compares with an unrounded scale)."),
    Mistake("not dequantised", lambda x: torch.round(x / (x.abs().amax(-1, keepdim=True) / 127)).clamp(-127, 127),
            "return the dequantised values, codes times scale, so they can be compared with x."),
    Mistake("scale without abs", lambda x: torch.round(x / (x.amax(-1, keepdim=True) / 127)).clamp(-127, 127) * (x.amax(-1, keepdim=True) / 127),
            "the scale comes from the largest |x|, not the largest x: a position whose biggest entry is negative "
            "clips it (or flips the sign of the scale)."),
    Mistake("floor", lambda x: torch.floor(x / (x.abs().amax(-1, keepdim=True) / 127)).clamp(-127, 127) * (x.abs().amax(-1, keepdim=True) / 127),
            "floor rounds down, towards -inf, so every value moves down by up to a whole step: round to the nearest "
            "code with torch.round."),
    Mistake("ceil", lambda x: torch.ceil(x / (x.abs().amax(-1, keepdim=True) / 127)).clamp(-127, 127) * (x.abs().amax(-1, keepdim=True) / 127),
            "ceil rounds up, towards +inf, so every value moves up by up to a whole step: round to the nearest "
            "code with torch.round."),
    Mistake("asymmetric min/max", lambda x: torch.round((x - x.amin(-1, keepdim=True)) / ((x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / 255))
            * ((x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / 255) + x.amin(-1, keepdim=True),
            "that is asymmetric quantisation (a scale and a zero point from each position's min and max, as KIVI uses): "
            "this exercise asks for the symmetric form, s = max|x| / 127 and codes in -127..127 with no zero point."),
    Mistake("asymmetric min/max, 254 steps", lambda x: _asymmetric(x, 254),
            "that is asymmetric quantisation (a scale and a zero point from each position's min and max, as KIVI uses): "
            "this exercise asks for the symmetric form, s = max|x| / 127 and codes in -127..127 with no zero point."),
    Mistake("dequantised with the mean scale", lambda x: torch.round(x / _int8_scale(x)).clamp(-127, 127) * _int8_scale(x).mean(),
            "you quantised with one scale per position, but dequantised with their mean: multiply each position's "
            "codes by that position's own scale."),
    Mistake("per position across heads", lambda x: torch.round(x / _axes_scale(x, (-3, -1))).clamp(-127, 127) * _axes_scale(x, (-3, -1)),
            "one scale covers a position in EVERY head (your max runs over the head axis H_kv too): each head's keys "
            "have their own range, so take the max over D_k alone, one scale per position and head."),
    Mistake("max over the heads", lambda x: torch.round(x / _axes_scale(x, (-3,))).clamp(-127, 127) * _axes_scale(x, (-3,)),
            "your max runs over the head axis H_kv (dim=1 of [B, H_kv, S, D_k]), so each channel of a position gets a "
            "scale from the same channel of the other heads: the scale's group is a position's D_k numbers."),
    Mistake("max over the batch", lambda x: torch.round(x / _axes_scale(x, (-4,))).clamp(-127, 127) * _axes_scale(x, (-4,)),
            "your max runs over the batch axis B (amax(dim=0) of [B, H_kv, S, D_k]): each number then shares a scale "
            "with the same head, position and channel of the other sequences. One scale per position and head "
            "covers its D_k numbers."),
    Mistake("scale inverted", lambda x: torch.round(x * _int8_scale(x)).clamp(-127, 127) / _int8_scale(x),
            "your scale is 127 / max|x|, the inverse of the step: with it, x / scale shrinks the numbers instead of "
            "spreading them over -127..127. The scale is the size of one step, s = max|x| / 127, and the codes are "
            "round(x / s)."),
    Mistake("per head", lambda x: torch.round(x / (x.abs().amax((-2, -1), keepdim=True) / 127)) * (x.abs().amax((-2, -1), keepdim=True) / 127),
            "that is one scale per head, over all its positions and channels: per token, take the max |x| over "
            "D_k alone."),
)


def _int8_scale(x: Tensor) -> Tensor:
    """The right scale of every position, [..., S, 1] (1 where a position is all zeros)."""
    scale = x.abs().amax(-1, keepdim=True) / 127
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _axes_scale(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    """A scale over the axes ``dims`` instead of D_k alone (1 where those numbers are all zeros)."""
    scale = x.abs().amax(dims, keepdim=True) / 127
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _asymmetric(x: Tensor, steps: int) -> Tensor:
    """Min/max quantisation with a zero point and ``steps`` steps per position (a guarded constant row)."""
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)  # [..., S, 1]
    scale = torch.where(hi > lo, (hi - lo) / steps, torch.ones_like(hi))
    return torch.round((x - lo) / scale) * scale + lo


def _solution_int8(x: Tensor) -> Tensor:
    scale = x.abs().amax(dim=-1, keepdim=True) / 127  # [..., S, 1]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a position of zeros: codes 0
    return torch.round(x / scale).clamp(-127, 127) * scale  # [..., S, D_k]


def _int8_steps(got: Any, x: Tensor) -> bool:
    """True when ``got`` is a float tensor of ``x``'s shape within one quantisation step of every right value.

    A right answer computed in 16 bits (or computed wider and rounded to 16 bits) can round a code the
    other way where x / scale falls near a half, its scale is rounded (by up to 127 x eps steps at the
    largest code) and so is every value: 16-bit answers are compared to that, not to the bit; the
    full-precision cases have already told the wrong schemes apart.
    """
    if not (isinstance(got, Tensor) and got.is_floating_point() and tuple(got.shape) == tuple(x.shape)):
        return False
    eps = max(torch.finfo(got.dtype).eps, torch.finfo(x.dtype).eps)
    x64 = x.double()
    step = x64.abs().amax(-1, keepdim=True) / 127  # [..., S, 1]
    ref = reference_int8_per_token(x64)
    diff = (got.detach().double() - ref).abs()
    return bool((diff <= step * (1.01 + 127 * eps) + eps * ref.abs() + 1e-12).all())


_INT8_ZERO = (
    "your result has NaN at the positions whose numbers are all 0 (the rest is right): their scale is "
    "0 / 127 = 0, so x / scale is 0 / 0. Give such a position any nonzero scale (only where the scale is 0): "
    "its codes are 0 whatever the scale."
)

_INT8_HALF_ZERO = (
    "your result has NaN at the positions whose numbers are all 0, in {dtype} only: the guard against a zero "
    "scale (1e-12, 1e-8 or torch.finfo(torch.float32).tiny, added or clamped to) rounds to 0 in {dtype}, whose "
    "smallest positive number is about {tiny:.0e}. Use a guard that survives the dtype: replace only the zero "
    "scales by a nonzero number, or take the floor from x's own dtype."
)

_INT8_HALF_OVERFLOW = (
    "your result has inf or NaN with a {dtype} cache whose largest values are about {top:,.0f} (the float64 "
    "cases were right): {dtype} holds at most {max:,.0f}, and x * 127 exceeds it before the division brings it "
    "back. Divide by the scale instead, x / (amax / 127), whose codes never exceed 127."
)


_INT8_EPSILON = (
    "you added a small epsilon to every scale (such as max|x| / 127 + 1e-8): that changes the scale of every "
    "position, not only of the positions of zeros, so every value comes back slightly off. Do not add an epsilon to "
    "the scale; guard only the zero positions, giving each of them any nonzero scale."
)

#: Epsilons a reader may add to the scale. Such an answer is within the shared tolerance of the right one (its
#: codes move by at most 127 x epsilon), so it cannot be a row of INT8_MISTAKES, which are told apart at ATOL: it
#: is recognised to float64's precision instead, before the dtype rule would blame a float32 cast.
_EPSILONS = (1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10)


def _epsilon_in_scale(got: Any, x: Tensor) -> bool:
    """True when ``got`` (float64) is the dequantised cache with an epsilon of :data:`_EPSILONS` added to every
    scale (after or before the division by 127) and not the right one to float64's precision."""
    if not (isinstance(got, Tensor) and got.dtype == torch.float64 and x.dtype == torch.float64
            and tuple(got.shape) == tuple(x.shape)):
        return False
    if close(got, reference_int8_per_token(x), atol=1e-12, rtol=1e-10):
        return False
    amax = x.abs().amax(-1, keepdim=True)  # [..., S, 1]
    for eps in _EPSILONS:
        for scale in (amax / 127 + eps, (amax + eps) / 127):
            if close(got, torch.round(x / scale).clamp(-127, 127) * scale, atol=1e-12, rtol=1e-10):
                return True
    return False


def _nan_only_at_zeros(got: Any, x: Tensor) -> bool:
    """True when ``got`` is NaN exactly at the positions of ``x`` that are all zeros and right elsewhere."""
    if not (isinstance(got, Tensor) and got.is_floating_point() and tuple(got.shape) == tuple(x.shape)):
        return False
    zero = (x == 0).all(-1)  # [..., S]
    bad = ~torch.isfinite(got.detach()).all(-1)
    if not bool(zero.any()) or not bool((bad == zero).all()):
        return False
    return _int8_steps(torch.where(zero[..., None], torch.zeros_like(got), got), x)


@exercise(solution=_solution_int8,
          tables=(MistakeTable(INT8_MISTAKES, lambda: [(_int8_case(*c),) for c in INT8_CASES], reference_int8_per_token),))
def check_int8_per_token(fn: Callable[[Tensor], Any]) -> Feedback:
    """Check ``fn(x) -> dequantised x`` (int8, one scale per position) on two caches of different sizes,
    then on a cache with positions of zeros, and in float16 and bfloat16 (:data:`INT8_MORE_CASES`)."""
    for case, dtype, size in ((c, torch.float64, 1.0) for c in range(len(INT8_CASES))):
        problem = _int8_one(fn, _int8_case(*INT8_CASES[case]))
        if problem is not None:
            return problem
    for case, dtype, size in INT8_MORE_CASES:
        x = _int8_case(*INT8_CASES[case], dtype=dtype, size=size, zeros=True)
        got, fb = call_reader(fn, (x.clone(),), axes=("B", "H_kv", "S", "D_k"))
        if fb is not None:
            return fb
        half = dtype in (torch.float16, torch.bfloat16)
        if _nan_only_at_zeros(got, x):
            return wrong(_INT8_HALF_ZERO.format(dtype=dtype, tiny=float(torch.finfo(dtype).smallest_normal))
                         if half else _INT8_ZERO)
        if half and isinstance(got, Tensor) and got.is_floating_point() and not bool(torch.isfinite(got).all()):
            return wrong(_INT8_HALF_OVERFLOW.format(dtype=dtype, top=float(x.abs().max()), max=torch.finfo(dtype).max))
        if half and _int8_steps(got, x):
            continue  # in 16 bits, or wider: a wider result of a 16-bit cache is fine
        problem = _int8_one(fn, x, got)
        if problem is not None:
            return problem
    x = _int8_case(*INT8_CASES[0])
    err = float((reference_int8_per_token(x) - x).abs().max())
    return correct(f"the largest error is {err:.4f}, at most half a step of each position's scale (positions of zeros "
                   "and 16-bit caches included).")


def _int8_one(fn: Callable[[Tensor], Any], x: Tensor, got: Any = None) -> Feedback | None:
    """The verdict on one full-precision cache ``x`` (``got``: the reader's result, when already computed)."""
    if got is None:
        got, fb = call_reader(fn, (x.clone(),), axes=("B", "H_kv", "S", "D_k"))
    else:
        fb = None
    if fb is not None:  # a scale without its last axis does not broadcast; anything else is named as it is
        return fb if "must match the size of tensor" not in fb.message else wrong(
            "the scale lost its last axis: x.abs().amax(dim=-1) is [B, H_kv, S], which does not line up "
            "with x [B, H_kv, S, D_k]. Keep it with keepdim=True, [B, H_kv, S, 1], so one scale "
            f"broadcasts over each position's D_k numbers. ({fb.message.removeprefix('your code raised ')})")
    expected = reference_int8_per_token(x)
    if isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, Tensor) for t in got):
        try:
            parts = close(got[0].double() * got[1].double(), expected)
        except RuntimeError:  # the two do not broadcast: not codes and scales
            parts = False
        if parts:
            return wrong("you returned the codes and the scale as a pair: the exercise compares the dequantised "
                         "cache with x, so return one tensor like x, the codes multiplied back by their scale.")
    half = low_precision(got, expected)
    if half is None and isinstance(got, Tensor) and got.dtype in (torch.float16, torch.bfloat16) and _int8_steps(got, x):
        digits = 3 if got.dtype == torch.float16 else 2
        half = wrong(f"your result is {got.dtype}, which keeps only about {digits} significant digits (a code can "
                     f"round the other way, too): compute it and return it in the dtype of the input ({x.dtype}); "
                     "x.half() or x.bfloat16() belongs in a real 16-bit cache, not in this exercise's float64 one.")
    if half is not None:
        return half
    if isinstance(got, Tensor) and got.is_floating_point() and got.dtype != x.dtype and got.shape == x.shape:
        if close(got.to(x.dtype), expected):
            return wrong(f"the input is {x.dtype} and you return {got.dtype}: return the dequantised cache in "
                         "the input's dtype (compute the scale and the codes in x's dtype: leave out the .float() cast).")
    if _epsilon_in_scale(got, x):  # before the dtype rule, whose float32 hint it would otherwise earn
        return wrong(_INT8_EPSILON)
    if x.dtype == torch.float64:  # the dtype rule: float32 inside, cast back, is refused even where it fits ATOL
        narrower = computed_narrower(got, expected, reference_int8_per_token(x.float()).double(),
                                     name="your dequantised cache")
        if narrower is not None:
            return narrower
    if close(got, expected):
        return None
    return not_a_tensor(got, expected, name="your dequantised cache") or diagnose(got, INT8_MISTAKES, x) or wrong(
        f"the dequantised cache differs from codes x scale with one scale per position (shape {tuple(expected.shape)}).")


# ---- exercise 3: softmax with a sink logit --------------------------------------------------------

def reference_sink_softmax(scores: Tensor, sink: Tensor) -> Tensor:
    """Weights ``[..., H, S_q, S_k]`` with one extra denominator term ``exp(sink[h])`` per head (stable)."""
    float_tensor("scores", scores, min_dim=3)
    if float_tensor("sink", sink).shape != scores.shape[-3:-2]:
        raise ValueError(f"sink must be [H] = [{scores.shape[-3]}] for scores {tuple(scores.shape)}, got {tuple(sink.shape)}")
    lse = torch.logaddexp(torch.logsumexp(scores, -1, keepdim=True), sink.view(-1, 1, 1))  # [..., H, S_q, 1]
    return torch.exp(scores - lse)


#: (H, S_q, S_k, shift, seed[, dtype, sink centre]): scores near ``shift``, sinks near the sink centre (default:
#: ``shift`` too). exp(800) overflows float64. The third case puts the sinks near 0, far below scores near 800:
#: shifting by the sink alone, exp(scores - sink), overflows there, as it does not where the two are close.
SINK_CASES = ((2, 3, 4, 0.0, 1), (4, 2, 9, 800.0, 2), (3, 3, 5, 800.0, 5, torch.float64, 0.0))
#: 16-bit cases, tried after those. float16: scores near 8 (up to about 14), where exp already overflows
#: (65,504 = e^11.1), as attention scores often do; the second float16 case has sinks near -4, far below the
#: scores, where exp(scores - sink) overflows float16. bfloat16 has float32's range but 8 significant bits: its
#: scores stay near 0, because near 14 its numbers are 1/16 apart and exp(s - lse) would be 3% off.
HALF_SINK_CASES = ((3, 2, 6, 8.0, 3, torch.float16), (2, 3, 4, 8.0, 6, torch.float16, -4.0),
                   (2, 4, 5, 0.0, 4, torch.bfloat16))


def _sink_case(H: int, S_q: int, S_k: int, shift: float, seed: int, dtype: torch.dtype = torch.float64,
               sink_at: float | None = None) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(1, H, S_q, S_k, generator=gen, dtype=torch.float64) * 2 + shift
    sink = torch.randn(H, generator=gen, dtype=torch.float64) + (shift if sink_at is None else sink_at)
    return scores.to(dtype), sink.to(dtype)


_SINK_SHIFTED_BY_SINK = (
    "inf or NaN where the sink logit lies far below the scores (scores near {scores:.0f}, sinks near {sink:.0f}, "
    "{dtype}): you shifted the exponents by the sink, exp(scores - sink), which is safe only while the sink is at "
    "least as large as the scores. Shift by a number at least as large as every score of the row and the sink "
    "alike, so that no exponent is above 0, not by the sink."
)


def _by_sink_overflows(got: Any, scores: Tensor, sink: Tensor) -> bool:
    """True when ``got`` is inf or NaN exactly where shifting by the sink, exp(scores - sink), overflows in the
    scores' dtype, and that shift does overflow there."""
    if not (isinstance(got, Tensor) and got.is_floating_point() and tuple(got.shape) == tuple(scores.shape)):
        return False
    e = torch.exp(scores - sink.view(-1, 1, 1))  # in the scores' dtype, as the reader's code runs
    bad = ~torch.isfinite(e / (e.sum(-1, keepdim=True) + 1))
    return bool(bad.any()) and bool((bad == ~torch.isfinite(got.detach())).all())


def _sink_lse(s: Tensor, k: Tensor) -> Tensor:
    """The log of each row's denominator, exp(sink[h]) + sum_j exp(s_j): [..., H, S_q, 1]."""
    return torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), k.view(-1, 1, 1))


def _sink_without_exp(s: Tensor, k: Tensor) -> Tensor:
    """exp(s_j) / (sum_j exp(s_j) + sink): the sink logit added as it is, not as exp(sink)."""
    e = torch.exp(s)
    if not torch.isfinite(e).all():
        raise ValueError("exp(scores) overflows on this case")
    return e / (e.sum(-1, keepdim=True) + k.view(-1, 1, 1))


def _flipped_sink(s: Tensor, k: Tensor) -> Tensor:
    """The weights with exp(-sink): where that term vanishes next to the scores, it is a plain softmax."""
    out = reference_sink_softmax(s, -k)
    if close(out, torch.softmax(s, -1)):
        raise ValueError("exp(-sink) is negligible on this case: a plain softmax's hint speaks")
    return out


def _sigmoid_share(s: Tensor, k: Tensor) -> Tensor:
    """softmax(s) x sigmoid(-sink): where the sink is large, as exp(-sink) it is the "added to the logsumexp" answer."""
    out = torch.softmax(s, -1) * torch.sigmoid(-k).view(-1, 1, 1)
    if close(out, torch.exp(s - (torch.logsumexp(s, -1, keepdim=True) + k.view(-1, 1, 1)))):
        raise ValueError("sigmoid(-sink) equals exp(-sink) on this case")
    return out


def _unshifted_sink(s: Tensor, k: Tensor) -> Tensor:
    """The scores shifted by their max, the sink not: where exp(sink) overflows, the checker's overflow hint speaks."""
    e = torch.exp(s - s.amax(-1, keepdim=True))
    sink = torch.exp(k.view(-1, 1, 1))
    if not torch.isfinite(sink).all():
        raise ValueError("exp(sink) overflows on this case")
    return e / (e.sum(-1, keepdim=True) + sink)


def _scaled_again(s: Tensor, k: Tensor) -> Tensor:
    """The scores divided by sqrt(S_k) once more; where that leaves every weight negligible (a sink far above the
    shrunken scores), other mistakes that vanish too would look the same, and the first case names it."""
    out = reference_sink_softmax(s / math.sqrt(s.shape[-1]), k)
    if close(out, torch.zeros_like(out)):
        raise ValueError("every weight is negligible on this case")
    return out


_SINK_WITHOUT_EXP = (
    "the sink is a logit, like a score: its term in the denominator is exp(sink[h]), not sink[h] (and after you "
    "subtract the row's max m, exp(sink[h] - m)). Its term enters the denominator as an exponential, like "
    "every score's."
)

_SINK_BY_MAX = (
    "you combined the row's logsumexp and the sink with a maximum (torch.maximum or max): that keeps only the "
    "larger of the two terms, while the denominator is their sum, exp(lse) + exp(sink[h]). Where the scores "
    "dominate, your weights are a plain softmax that sums to 1; the log of a sum of two exponentials is "
    "torch.logaddexp."
)


def _sink_by_max(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes the maximum of the row's logsumexp and the sink instead of their logaddexp: it is
    tried on scores near 0 and sinks near 5, where the sink dominates and the two differ."""
    gen = torch.Generator().manual_seed(7)
    scores = torch.randn(1, 2, 3, 4, generator=gen, dtype=torch.float64)
    sink = torch.tensor([5.0, 6.0], dtype=torch.float64)
    got, fb = call_reader(fn, (scores.clone(), sink.clone()))
    lse = torch.logsumexp(scores, -1, keepdim=True)
    return fb is None and close(got, torch.exp(scores - torch.maximum(lse, sink.view(-1, 1, 1))))


SINK_MISTAKES = (
    Mistake("ordinary softmax", lambda s, k: torch.softmax(s, -1),
            "the weights still sum to 1: the sink adds exp(sink[h]) to every row's denominator, so they sum to less."),
    Mistake("sink as a shared scalar", lambda s, k: torch.exp(s - torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), k.mean())),
            "each head has its own sink logit: reshape sink to [H, 1, 1] so it lines up with the head axis."),
    Mistake("sink multiplied into the numerator", lambda s, k: torch.exp(s + k.view(-1, 1, 1) - _sink_lse(s, k)),
            "your numerator is exp(s_j + sink[h]), exp(s_j) multiplied by exp(sink[h]): the sink only enlarges the "
            "denominator; the numerator of key j is exp(s_j)."),
    Mistake("sink term added to every numerator", lambda s, k: torch.exp(s - _sink_lse(s, k)) + torch.exp(k.view(-1, 1, 1) - _sink_lse(s, k)),
            "you added the sink's term exp(sink[h]) to each key's numerator too: it belongs to the denominator only. "
            "The numerator of key j is exp(s_j) alone; exp(sink[h]) over the denominator is the sink's own weight, "
            "which the exercise leaves out."),
    Mistake("sink column kept", lambda s, k: torch.softmax(torch.cat([s, k.view(1, -1, 1, 1).expand(*s.shape[:-1], 1)], -1), -1),
            "drop the sink's own column: return weights over the real keys only, [..., S_q, S_k]."),
    Mistake("sink added to the logsumexp", lambda s, k: torch.exp(s - (torch.logsumexp(s, -1, keepdim=True) + k.view(-1, 1, 1))),
            "adding the sink to the logsumexp multiplies the denominator by exp(sink): the sink's term is added to "
            "the sum of exponentials, so combine the two with torch.logaddexp."),
    Mistake("sink left out of the max", lambda s, k: _unshifted_sink(s, k),
            "you subtracted the row's max m from the scores but not from the sink: in the shifted denominator its "
            "term is exp(sink - m), not exp(sink), so the sink's term is off by the factor exp(m). Shift the sink by "
            "the same m as the scores, and take m over the scores and the sink together, so no exponent is above 0."),
    Mistake("sink added without exp", _sink_without_exp,
            _SINK_WITHOUT_EXP),
    Mistake("sink added without exp to shifted scores", lambda s, k: _sink_without_exp(s - s.amax(-1, keepdim=True), k),
            _SINK_WITHOUT_EXP),
    Mistake("log of the weights", lambda s, k: s - torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), k.view(-1, 1, 1)),
            "those are the logarithms of the weights (scores - lse, all below 0): take exp of them."),
    Mistake("head 0's sink for every head", lambda s, k: torch.exp(s - torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), k[0])),
            "every head used head 0's sink logit: sink[h] belongs to head h, so reshape the whole sink to [H, 1, 1] "
            "(sink.view(-1, 1, 1)) and each head gets its own."),
    Mistake("softmax divided by 1 + sink", lambda s, k: torch.softmax(s, -1) / (1 + k.view(-1, 1, 1)),
            "the sink is not divided into a softmax afterwards as 1 + sink: it is one more term of the softmax's "
            "denominator, exp(sink[h]), next to the scores' exponentials, and the row's weights share that "
            "denominator. Combine them in log space with torch.logaddexp."),
    Mistake("sink with its sign flipped", lambda s, k: _flipped_sink(s, k),
            "the sink's sign is flipped: its term in the denominator is exp(+sink[h]), a logit like the scores, "
            "not exp(-sink[h]). A large sink takes weight away from the keys."),
    Mistake("softmax times sigmoid(-sink)", lambda s, k: _sigmoid_share(s, k),
            "the keys' share of the row is not sigmoid(-sink): it depends on the scores too, because exp(sink) "
            "competes with the row's sum of exp(scores), not with 1. Put exp(sink[h]) into the denominator with the "
            "scores, in log space."),
    Mistake("logsumexp over the queries", lambda s, k: torch.exp(s - torch.logaddexp(torch.logsumexp(s, -2, keepdim=True), k.view(-1, 1, 1))),
            "your logsumexp runs over the queries (dim=-2): each query's row has its own denominator, a sum over "
            "its keys, so take torch.logsumexp(scores, -1, keepdim=True)."),
    Mistake("scores scaled again", lambda s, k: _scaled_again(s, k),
            "you divided the scores by sqrt of their last size: they are already scaled, q . k / sqrt(D_k), before "
            "they reach this function (and their last axis is the keys, S_k, not D_k). Use them as they are."),
    Mistake("sinks in the wrong head order", lambda s, k: reference_sink_softmax(s, k.flip(0)),
            "each head uses another head's sink logit: sink[h] belongs to head h, the axis -3 of the scores. Reshape "
            "it with sink.view(-1, 1, 1) (not reversed, not transposed) so that it lines up with the heads in order."),
    Mistake("sink column first, last key dropped",
            lambda s, k: torch.softmax(torch.cat([k.view(1, -1, 1, 1).expand(*s.shape[:-1], 1), s], -1), -1)[..., :-1],
            "you put the sink's column first and then dropped the LAST column, a real key: drop the column you added "
            "(the first one, [..., 1:]), or put the sink last and drop it with [..., :-1]."),
)


def _solution_sink(scores: Tensor, sink: Tensor) -> Tensor:
    lse = torch.logaddexp(torch.logsumexp(scores, -1, keepdim=True), sink.view(-1, 1, 1))  # [..., H, S_q, 1]
    return torch.exp(scores - lse)  # [..., H, S_q, S_k]


@exercise(solution=_solution_sink,
          tables=(MistakeTable(SINK_MISTAKES, lambda: [_sink_case(*c) for c in SINK_CASES], reference_sink_softmax),))
def check_sink_softmax(fn: Callable[[Tensor, Tensor], Any]) -> Feedback:
    """Check ``fn(scores [1, H, S_q, S_k], sink [H]) -> weights`` on three cases, the second with scores near 800,
    the third with scores near 800 and sinks near 0, then in float16 and bfloat16 (:data:`HALF_SINK_CASES`)."""
    for case in SINK_CASES + HALF_SINK_CASES:
        scores, sink = _sink_case(*case)
        half = scores.dtype in (torch.float16, torch.bfloat16)
        got, fb = call_reader(fn, (scores.clone(), sink.clone()), axes=("B", "H", "S_q", "S_k"))
        if (fb is not None and "must match the size" in fb.message and "dimension 3" in fb.message
                and set(mismatched_sizes(fb.message) or ()) == {scores.shape[2], scores.shape[3]}):
            return wrong("your row totals lost their key axis: torch.logsumexp(scores, -1) without keepdim=True gives "
                         "one number per query, [B, H, S_q], which then lines up against the keys, S_k, when you "
                         "subtract it from the [B, H, S_q, S_k] scores. Keep the reduced axis (keepdim=True) so each "
                         "row's total stays a column, [B, H, S_q, 1], and shape the sink to broadcast against that. "
                         f"({fb.message.removeprefix('your code raised ')})")
        if fb is not None and "must match the size" in fb.message and "dimension 3" in fb.message:
            return wrong("the sink lines up with the key axis S_k, not the head axis H: one sink logit per head must "
                         "broadcast as [H, 1, 1] against [1, H, S_q, 1], so reshape it with sink.view(-1, 1, 1). "
                         f"({fb.message.removeprefix('your code raised ')})")
        if fb is not None and "must match the size" in fb.message and "dimension 2" in fb.message:
            return wrong("the sink lines up with the query axis S_q, not the head axis H: one sink logit per head must "
                         "broadcast as [H, 1, 1] against [1, H, S_q, 1] (the head axis is -3), so reshape it with "
                         f"sink.view(-1, 1, 1). ({fb.message.removeprefix('your code raised ')})")
        if fb is not None:
            return fb
        expected = reference_sink_softmax(scores, sink)
        if half:  # the right weights of these 16-bit scores, computed in float64
            expected = reference_sink_softmax(scores.double(), sink.double())
            dtype = scores.dtype
            if _by_sink_overflows(got, scores, sink):
                return wrong(_SINK_SHIFTED_BY_SINK.format(scores=case[3], sink=case[6] if len(case) > 6 else case[3], dtype=dtype))
            if isinstance(got, Tensor) and got.shape == expected.shape and not torch.isfinite(got).all():
                return wrong(f"inf or NaN with {dtype} scores near {case[3]:.0f} (the float64 cases were right): "
                             f"{dtype} holds at most {torch.finfo(dtype).max:,.0f} = e^{math.log(torch.finfo(dtype).max):.1f}, "
                             "so exp of an unshifted score or sink, or a fill value such as -1e9, overflows. Rewrite "
                             "the weights so that no exponent you compute is above 0.")
            tol = HALF_TOL if dtype == torch.float16 else 2 * HALF_TOL
            if isinstance(got, Tensor) and got.is_floating_point() and close(got, expected, atol=tol, rtol=tol):
                continue  # in 16 bits, or wider
            return diagnose(got, SINK_MISTAKES, scores, sink) or wrong(
                f"your weights are right in float64 but not with {dtype} scores (compared to {tol:g}): compute them "
                "in the scores' dtype or wider, without constants that do not fit in 16 bits.")
        if _by_sink_overflows(got, scores, sink):
            return wrong(_SINK_SHIFTED_BY_SINK.format(scores=case[3], sink=case[6] if len(case) > 6 else case[3], dtype=scores.dtype))
        if isinstance(got, Tensor) and got.shape == expected.shape and not torch.isfinite(got).all():
            return wrong(f"inf or NaN with scores near {case[3]:.0f}: exp({case[3]:.0f}) overflows even in float64. Rewrite "
                         "the weights so that no exponent you compute is above 0.")
        named = low_precision(got, expected, name="your weights")  # float16 / bfloat16: named as such
        if named is not None:
            return named
        if (isinstance(got, Tensor) and got.is_floating_point() and got.shape == expected.shape
                and got.element_size() < expected.element_size() and close(got, expected, atol=1e-3, rtol=1e-3)):
            return wrong(f"the scores are {expected.dtype} and you return {got.dtype}: return the weights in the scores' "
                         "dtype or wider (leave out .float() or .to(...) casts: compute in the scores' dtype, not in "
                         "float32).")
        if scores.dtype == torch.float64:  # the dtype rule: float32 inside, cast back, is refused even where it fits ATOL
            narrow = reference_sink_softmax(scores.float(), sink.float()).double()
            narrower = computed_narrower(got, expected, narrow)
            if narrower is not None:
                return narrower
        if close(got, expected):
            continue
        if close(got, torch.softmax(scores, -1)) and _sink_by_max(fn):
            return wrong(_SINK_BY_MAX)
        return not_a_tensor(got, expected, name="your weights") or diagnose(got, SINK_MISTAKES, scores, sink) or wrong(
            f"the weights differ from exp(s_j) / (exp(sink_h) + sum_j exp(s_j)) (expected shape {tuple(expected.shape)}).")
    return correct("each row sums to 1 - sigmoid(sink - logsumexp(scores)): the rest goes to the sink (in float16 and "
                   "bfloat16 too, to their precision).")


# ---- exercise 4: a forked sequence's block table after copy-on-write ------------------------------

def reference_cow_table(table: list[int], length: int, block_size: int, free: list[int], n: int) -> list[int]:
    """The block table of a forked sequence after it writes ``n`` tokens, one at a time.

    Every block of ``table`` is shared with the other sample of the fork (reference count 2); ``length``
    positions are held; the pool hands out the lowest-numbered block of ``free`` first. Writing into a
    shared block first copies it to a new block (copy-on-write); a full table gets a new block.
    """
    table, free, owned = list(table), sorted(free), set()
    for p in range(length, length + n):
        i = p // block_size
        if i == len(table):  # the last block is full: a fresh block
            table.append(free.pop(0))
            owned.add(i)
        elif i not in owned:  # the first write into a shared block copies it
            table[i] = free.pop(0)
            owned.add(i)
    return table


def _cow(table, length, b, free, n, *, copy=True, copy_all=False, every_write=False, pick=0, shift=0,
         copy_last=False, unsorted=False, fresh_owned=True, fresh_copied=False, copy_never_owned=False,
         min_kept=False, round_up=False):
    """The reference with one thing changed, for the table of mistakes."""
    table, free, owned = list(table), list(free) if unsorted else sorted(free), set()
    shared = len(table)  # entries below this held the fork's shared blocks
    if min_kept:  # min(free) read but never removed: every new block is the same one
        free = _KeptMin(free)
    if copy_all:
        table, owned = [free.pop(0) for _ in table], set(range(len(table)))
    if copy_last and length % b == 0 and table:
        table[-1], owned = free.pop(pick), owned | {len(table) - 1}
    for p in range(length, length + n):
        i = -(-(p + shift) // b) if round_up else (p + shift) // b  # round_up: ceil(p / b), the entry rounded up
        if i >= len(table):
            table.append(free.pop(pick))
            if fresh_copied:  # the fresh block, then treated as shared at once: copied again
                table[i] = free.pop(pick)
            if fresh_owned:
                owned.add(i)
        elif copy and (every_write or i not in owned or (copy_never_owned and i < shared)):
            table[i] = free.pop(pick)
            owned.add(i)
    return table


class _KeptMin(list):
    """A free list whose pop returns the block without removing it (``min(free)`` with no ``remove``)."""

    def pop(self, index: int = -1) -> int:
        return min(self) if index == 0 else self[index]


# (table, positions held, block size, free blocks, tokens written). The first has a partly filled shared
# last block; the second a full one (nothing to copy); the third is section 11.1's prompt of 50 tokens in
# blocks of 16; the fourth writes nothing; in the fifth the one token written lands in the shared last block;
# the sixth hands over its free blocks unsorted, so taking them in list order is not the lowest first.
COW_CASES = (([7, 2, 5], 10, 4, [0, 1, 3, 4, 6, 8, 9], 7), ([3, 1], 8, 4, [0, 2, 5, 6], 3),
             ([0, 1, 2, 3], 50, 16, [4, 5, 6, 7, 8, 9], 20), ([1, 0], 5, 4, [2, 3], 0), ([5, 2], 7, 4, [0, 1, 3], 1),
             ([4, 1], 6, 4, [9, 0, 7, 2, 3], 5))
COW_MISTAKES = (
    Mistake("written in place", lambda *c: _cow(*c, copy=False),
            "the last block is shared with the other sample: writing into it in place would change what the other "
            "sample reads. Copy it to a free block first (copy-on-write), and put the copy in this table."),
    Mistake("every block copied", lambda *c: _cow(*c, copy_all=True),
            "a fork shares every block, and only a block that is written is copied: the full blocks of the prompt are "
            "only read, so they stay shared and keep their numbers in the table."),
    Mistake("copy at every write", lambda *c: _cow(*c, every_write=True),
            "after the first copy the block is this sample's own (reference count 1): later writes into it go in "
            "place. Copy a shared block once, then remember that it is owned."),
    Mistake("copy never marked as the sample's own", lambda *c: _cow(*c, copy_never_owned=True),
            "every write into an entry that held a shared block made a new copy: after the first copy the entry holds "
            "this sample's own block (reference count 1), so mark it as owned and let later writes go in place. "
            "Decide by ownership, not by whether the entry was in the table at the fork."),
    Mistake("lowest free block never removed", lambda *c: _cow(*c, min_kept=True),
            "the same block was handed out more than once: you read min(free) but left it in the free list, so "
            "every copy and every new block got that number. Take it out as you hand it over (free.remove(b), or "
            "pop(0) from a sorted copy of free)."),
    Mistake("highest free block", lambda *c: _cow(*c, pick=-1),
            "the pool hands out the LOWEST-numbered free block first (free.pop(0) on the sorted list), not the last one."),
    Mistake("free list taken in its order", lambda *c: _cow(*c, unsorted=True),
            "the free list is not sorted: the pool hands out the LOWEST-numbered free block first, so take min(free) "
            "(or sort a copy first), not the first entry of the list."),
    Mistake("new block one position early", lambda *c: _cow(*c, shift=1),
            "position p goes to entry p // block_size: a new block is needed when p is a multiple of block_size, "
            "not one position before."),
    Mistake("entry index rounded up", lambda *c: _cow_rounded_up(*c),
            "you rounded the entry index up (math.ceil(p / block_size)): entry i holds positions i x block_size to "
            "(i + 1) x block_size - 1, so position p lands in entry p // block_size, rounded down. Rounded up, the "
            "first write into a partly filled shared last block takes a fresh block instead of copying it, and every "
            "new block is taken one position late."),
    Mistake("full last block copied", lambda *c: _cow(*c, copy_last=True),
            "a full last block is never written again: the next token goes to a fresh block, so nothing needs to "
            "be copied. Copy only a shared block that a write lands in."),
    Mistake("fresh block not owned", lambda *c: _cow(*c, fresh_owned=False),
            "a fresh block from the pool is this sample's own (reference count 1): mark it as owned, or the next "
            "write into it copies it again."),
    Mistake("fresh block copied at once", lambda *c: _cow_fresh_copied(*c),
            "each fresh block is copied again at once: a block just taken from the pool is this sample's own "
            "(reference count 1), so the token goes into it in place. Copy only a shared block, at the first write "
            "into it (an if/else: a fresh block OR a copy, never both for one write)."),
    Mistake("new block taken before the copy", lambda *c: _cow_fresh_first(*c),
            "the copy and the new block got each other's numbers: the first write lands in the shared last block, so "
            "its copy takes the lowest free block, before any new block the later writes need."),
    Mistake("last block copied when nothing is written", lambda t, l, b, f, n: _cow(t, l, b, f, 1)[:len(t)] if n == 0 and l % b
            else reference_cow_table(t, l, b, f, n),
            "with n = 0 the sample writes nothing, so nothing is copied: a shared block is copied at the first write "
            "into it, not at the fork. The table stays as it is."),
    Mistake("one token too many", lambda *c: _cow_one_more(*c),
            "your loop writes one token more than n: the n new tokens take positions length to length + n - 1, so "
            "a loop over them stops before length + n (with n = 0 it writes nothing)."),
    Mistake("copy appended", lambda *c: _cow_copy_appended(*c),
            "you appended the copy of the shared last block at the end of the table: the copy takes the place of "
            "the block it was copied from, in the same entry (the table is in position order), so the table does "
            "not grow by it."),
    Mistake("table sorted", lambda *c: sorted(reference_cow_table(*c)),
            "a block table is in position order (entry i holds positions i x block_size onwards), not sorted by "
            "block number: put each copy where the shared block was and append fresh blocks at the end."),
    Mistake("new blocks only", lambda t, *c: [x for i, x in enumerate(reference_cow_table(t, *c)) if i >= len(t) or x != t[i]],
            "return the whole block table of the sample, the shared blocks it keeps included, in position order."),
)


def _cow_copy_appended(table: list[int], length: int, b: int, free: list[int], n: int) -> list[int]:
    """The copy of a partly filled shared last block appended to the table instead of put in its entry; where
    that equals a new block taken one position early, that hint speaks."""
    out, spare = list(table), sorted(free)
    if n and length % b:
        out.append(spare.pop(0))
    for _ in range(-(-(length + n) // b) - len(table) if n else 0):
        out.append(spare.pop(0))
    if out == _cow(table, length, b, free, n, shift=1):
        raise ValueError("on this case the two slips give the same table")
    return out


def _cow_rounded_up(*case: Any) -> list[int]:
    """The entry index rounded up, ceil(p / b). Where that gives another mistake's table (on the first case a
    partly filled last block then gets a fresh block, as if written in place), this slip does not show on its
    own: it counts as right there, and :func:`_cow_rounds_index_up` names it from all the cases."""
    out = _cow(*case, round_up=True)
    if any(_cow_gives(m, case, out) for m in COW_MISTAKES if m.name != "entry index rounded up"):
        return reference_cow_table(*case)
    return out


def _cow_fresh_copied(*case: Any) -> list[int]:
    """A fresh block copied again at once; where that equals a fresh block copied at its next write, that hint speaks."""
    out = _cow(*case, fresh_copied=True)
    if out == _cow(*case, fresh_owned=False):
        raise ValueError("on this case the two slips give the same table")
    return out


def _cow_fresh_first(table: list[int], length: int, b: int, free: list[int], n: int) -> list[int]:
    """The reference with the blocks handed out in the wrong order: new blocks first, then the copy."""
    ref = reference_cow_table(table, length, b, free, n)
    new_at = [i for i in range(len(ref)) if i >= len(table) or ref[i] != table[i]]  # copy first, then new blocks
    copies = [i for i in new_at if i < len(table)]
    if not copies or len(new_at) < 2:
        return ref  # no copy and new block on this case: the order does not show
    order = [i for i in new_at if i >= len(table)] + copies
    out, lowest = list(ref), sorted(ref[i] for i in new_at)
    for i, blk in zip(order, lowest):
        out[i] = blk
    return out


def _solution_cow(table: list[int], length: int, block_size: int, free: list[int], n: int) -> list[int]:
    free, out = sorted(free), list(table)
    for i in range(length // block_size, (length + n - 1) // block_size + 1 if n else 0):  # the blocks written
        if i < len(out):
            out[i] = free.pop(0)  # a shared block is written: copy it (only a partly filled last one can be)
        else:
            out.append(free.pop(0))
    return out


def _as_table(value: Any) -> list[int] | None:
    """A reader's block table as a list of ints (list, tuple, 1-d tensor or array of whole numbers), or None."""
    if isinstance(value, Tensor):
        value = value.tolist() if value.dim() == 1 and not value.is_floating_point() else None
    elif hasattr(value, "tolist") and hasattr(value, "ndim"):  # a NumPy array
        value = value.tolist() if value.ndim == 1 else None
    if not isinstance(value, (list, tuple)):
        return None
    try:
        return [as_index(x) for x in value]
    except TypeError:
        return None


def _cow_gives(m: Mistake, case: tuple[Any, ...], blocks: list[int]) -> bool:
    """Whether mistake ``m`` gives ``blocks`` on ``case``."""
    try:
        return m.compute(*case) == blocks
    except (IndexError, ValueError):  # this mistake runs out of free blocks (or is not told apart) on this case
        return False


def _cow_one_more(table: list[int], length: int, b: int, free: list[int], n: int) -> list[int]:
    """The table after n + 1 writes. Where nothing is to be written into a partly filled last block, that equals
    the table of a block copied at the fork: :func:`_cow_writes_one_more` names it from the other cases."""
    if n == 0 and length % b:
        raise ValueError("on this case the two slips give the same table")
    return reference_cow_table(table, length, b, free, n + 1)


def _cow_writes_one_more(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` gives the tables of n + 1 writes on every case that writes something (where nothing is
    written into a partly filled last block, that slip gives the table of a block copied at the fork)."""
    for case in COW_CASES:
        if case[4] == 0:
            continue
        got, fb = call_reader(fn, (list(case[0]), case[1], case[2], list(case[3]), case[4]))
        if fb is not None or _as_table(got) != reference_cow_table(*case[:4], case[4] + 1):
            return False
    return True


def _cow_rounds_index_up(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` gives the tables of an entry index rounded up, ceil(p / b), on every case: on one case that
    slip gives the table of a write in place, and on others those of other slips, so it is named from all of them."""
    for case in COW_CASES:
        got, fb = call_reader(fn, (list(case[0]), case[1], case[2], list(case[3]), case[4]))
        if fb is not None or _as_table(got) != _cow(*case, round_up=True):
            return False
    return True


@exercise(solution=_solution_cow,
          tables=(MistakeTable(COW_MISTAKES, lambda: [tuple(c) for c in COW_CASES], reference_cow_table),),
          not_generic={"float16": "the answer is a list of block numbers"})
def check_cow_table(fn: Callable[..., Any]) -> Feedback:
    """Check ``fn(table, length, block_size, free, n) -> block table`` on every case of ``COW_CASES``."""
    for case in COW_CASES:
        table, length, b, free, n = case
        table_arg, free_arg = list(table), list(free)
        got, fb = call_reader(fn, (table_arg, length, b, free_arg, n))
        if fb is not None and re.search(r"IndexError: pop (from empty list|index out of range)", fb.message):
            return wrong(f"your code ran out of free blocks ({fb.message.removeprefix('your code raised ')}): with "
                         f"{length} positions held, {n} written and blocks of {b}, it took more blocks than the writes "
                         "need. A write needs a block only when the last block is full (a fresh block) or when it lands "
                         "in a block still shared with the other sample (one copy); a block copied or taken once is "
                         "this sample's own, and later writes into it go in place.")
        if (fb is not None or _as_table(got) != reference_cow_table(*case)) and _cow_writes_one_more(fn):
            return wrong(next(m.hint for m in COW_MISTAKES if m.name == "one token too many"))
        if fb is not None:
            return fb
        if table_arg != list(table) or free_arg != list(free):
            which = " and ".join(name for name, arg, orig in (("table", table_arg, table), ("free", free_arg, free))
                                 if arg != list(orig))
            return wrong(f"your function changed the caller's {which} list: the table is shared with the other sample "
                         "of the fork and the free list belongs to the pool, so work on copies (list(table), "
                         "sorted(free)) and return the new table.")
        blocks = _as_table(got)
        if blocks is None:
            return wrong(f"return the block table as a list of block numbers (whole numbers), got {describe(got)}.")
        expected = reference_cow_table(*case)
        if blocks == expected:
            continue
        if _cow_rounds_index_up(fn):
            return wrong(next(m.hint for m in COW_MISTAKES if m.name == "entry index rounded up"))
        for m in COW_MISTAKES:
            if _cow_gives(m, case, blocks):
                return wrong(m.hint)
        if len(blocks) != len(expected):
            return wrong(f"with {length} positions held, {n} written and blocks of {b}, the table should have one "
                         f"entry per block the {length + n} positions fill: ceil({length + n} / {b}) entries.")
        return wrong("the table has the right length but other blocks: keep the blocks that are only read, copy a "
                     "shared block to the lowest free block at the first write into it, and take the next lowest "
                     "free block whenever the last block is full.")
    return correct("only the block a write lands in is copied; the rest of the prompt stays shared.")
