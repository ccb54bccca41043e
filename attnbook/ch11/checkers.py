"""Chapter 11's exercises: blocks a request needs, int8 per-token quantisation, softmax with a sink logit."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from ..feedback import (Feedback, Mistake, MistakeTable, call_reader, check_number_cases, close, correct, diagnose, exercise,
                        wrong)
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
# catch a prefix counted off by one; the seventh (one position past a large block) an approximate ceil.
BLOCKS_CASES = ((100, 30, 16, 40), (250, 38, 32, 200), (61, 17, 8, 19), (100, 38, 16, 44),
                (64, 10, 16, 32), (20, 5, 8, 0), (100, 29, 128, 0))
BLOCKS_MISTAKES = (
    Mistake("floor division", lambda p, n, b, s: (p + n) // b - s // b,
            "a partly filled last block still has to be allocated: round the block count up, -(-(p + n) // b)."),
    Mistake("partial prefix block shared", lambda p, n, b, s: -(-(p + n) // b) - -(-s // b),
            "only FULL blocks of the prefix are shared (a block's hash covers all its tokens): the shared count is "
            "shared_prefix // block_size."),
    Mistake("no sharing", lambda p, n, b, s: -(-(p + n) // b),
            "the blocks of the cached prefix already exist: subtract the full blocks it covers."),
    Mistake("prompt only", lambda p, n, b, s: -(-p // b) - s // b,
            "the generated tokens need blocks too: count prompt_len + new_tokens positions."),
    Mistake("prefix tokens subtracted", lambda p, n, b, s: -(-(p + n - s) // b),
            "subtract full prefix blocks, not prefix tokens: the request's positions fill whole blocks from position 0, "
            "so count its blocks, -(-(prompt_len + new_tokens) // block_size), then subtract shared_prefix // block_size."),
    Mistake("ceil as // b + 1", lambda p, n, b, s: (p + n) // b + 1 - s // b,
            "`x // b + 1` rounds up only when b does not divide x: when the positions fill their blocks exactly it "
            "counts one block too many. Round up with -(-x // b)."),
    Mistake("round to nearest", lambda p, n, b, s: round((p + n) / b) - s // b,
            "round() goes to the nearest block count, so a last block filled less than half is dropped: round up, -(-x // b)."),
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
        generic="count ceil((prompt_len + new_tokens) / block_size) blocks, then subtract the full blocks of the cached prefix.")


# ---- exercise 2: int8 per-token quantisation ------------------------------------------------------

def reference_int8_per_token(x: Tensor) -> Tensor:
    """Quantise ``x [..., S, D_k]`` to int8 with one symmetric scale per position, then dequantise."""
    float_tensor("x", x, min_dim=2)
    scale = x.abs().amax(dim=-1, keepdim=True) / 127  # [..., S, 1]
    return torch.round(x / scale).clamp(-127, 127) * scale


INT8_CASES = ((2, 3, 5, 8, 1), (1, 2, 7, 6, 2))  # (B, H_kv, S, D_k, seed): every size differs


def _int8_case(B: int, H: int, S: int, D: int, seed: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, S, D, generator=gen, dtype=torch.float64) * torch.linspace(0.5, 4, D, dtype=torch.float64)


INT8_MISTAKES = (
    Mistake("per channel", lambda x: torch.round(x / (x.abs().amax(-2, keepdim=True) / 127)).clamp(-127, 127) * (x.abs().amax(-2, keepdim=True) / 127),
            "one scale per channel (over the positions) is the per-channel scheme: per token, take the max |x| over "
            "D_k, amax(dim=-1, keepdim=True)."),
    Mistake("per tensor", lambda x: torch.round(x / (x.abs().amax() / 127)) * (x.abs().amax() / 127),
            "one scale for the whole tensor wastes precision on small positions: one scale per position."),
    Mistake("truncation", lambda x: torch.trunc(x / (x.abs().amax(-1, keepdim=True) / 127)) * (x.abs().amax(-1, keepdim=True) / 127),
            "round to the nearest integer (torch.round), not towards zero: truncation biases every value towards 0."),
    Mistake("scale 128", lambda x: torch.round(x / (x.abs().amax(-1, keepdim=True) / 128)).clamp(-127, 127) * (x.abs().amax(-1, keepdim=True) / 128),
            "the symmetric int8 range is -127..127: divide the max by 127, or the largest value clips."),
    Mistake("not dequantised", lambda x: torch.round(x / (x.abs().amax(-1, keepdim=True) / 127)).clamp(-127, 127),
            "return the dequantised values, codes times scale, so they can be compared with x."),
    Mistake("scale without abs", lambda x: torch.round(x / (x.amax(-1, keepdim=True) / 127)).clamp(-127, 127) * (x.amax(-1, keepdim=True) / 127),
            "the scale comes from the largest |x|, not the largest x: a position whose biggest entry is negative "
            "clips it (or flips the sign of the scale). Use x.abs().amax(dim=-1, keepdim=True)."),
    Mistake("floor", lambda x: torch.floor(x / (x.abs().amax(-1, keepdim=True) / 127)).clamp(-127, 127) * (x.abs().amax(-1, keepdim=True) / 127),
            "floor rounds down, towards -inf, so every value moves down by up to a whole step: round to the nearest "
            "code with torch.round."),
    Mistake("ceil", lambda x: torch.ceil(x / (x.abs().amax(-1, keepdim=True) / 127)).clamp(-127, 127) * (x.abs().amax(-1, keepdim=True) / 127),
            "ceil rounds up, towards +inf, so every value moves up by up to a whole step: round to the nearest "
            "code with torch.round."),
    Mistake("per head", lambda x: torch.round(x / (x.abs().amax((-2, -1), keepdim=True) / 127)) * (x.abs().amax((-2, -1), keepdim=True) / 127),
            "that is one scale per head, over all its positions and channels: per token, take the max |x| over "
            "D_k alone, amax(dim=-1, keepdim=True)."),
)


def _solution_int8(x: Tensor) -> Tensor:
    scale = x.abs().amax(dim=-1, keepdim=True) / 127  # [..., S, 1]
    return torch.round(x / scale).clamp(-127, 127) * scale  # [..., S, D_k]


@exercise(solution=_solution_int8,
          tables=(MistakeTable(INT8_MISTAKES, lambda: [(_int8_case(*c),) for c in INT8_CASES], reference_int8_per_token),))
def check_int8_per_token(fn: Callable[[Tensor], Any]) -> Feedback:
    """Check ``fn(x) -> dequantised x`` (int8, one scale per position) on two caches of different sizes."""
    for case in INT8_CASES:
        x = _int8_case(*case)
        got, fb = call_reader(fn, (x.clone(),), axes=("B", "H_kv", "S", "D_k"))
        if fb is not None:
            return fb
        expected = reference_int8_per_token(x)
        if close(got, expected):
            continue
        return diagnose(got, INT8_MISTAKES, x) or wrong(
            f"the dequantised cache differs from codes x scale with one scale per position (shape {tuple(expected.shape)}).")
    x = _int8_case(*INT8_CASES[0])
    err = float((reference_int8_per_token(x) - x).abs().max())
    return correct(f"the largest error is {err:.4f}, at most half a step of each position's scale.")


# ---- exercise 3: softmax with a sink logit --------------------------------------------------------

def reference_sink_softmax(scores: Tensor, sink: Tensor) -> Tensor:
    """Weights ``[..., H, S_q, S_k]`` with one extra denominator term ``exp(sink[h])`` per head (stable)."""
    float_tensor("scores", scores, min_dim=3)
    if float_tensor("sink", sink).shape != scores.shape[-3:-2]:
        raise ValueError(f"sink must be [H] = [{scores.shape[-3]}] for scores {tuple(scores.shape)}, got {tuple(sink.shape)}")
    lse = torch.logaddexp(torch.logsumexp(scores, -1, keepdim=True), sink.view(-1, 1, 1))  # [..., H, S_q, 1]
    return torch.exp(scores - lse)


SINK_CASES = ((2, 3, 4, 0.0, 1), (4, 2, 9, 800.0, 2))  # (H, S_q, S_k, shift, seed); exp(800) overflows float64


def _sink_case(H: int, S_q: int, S_k: int, shift: float, seed: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(1, H, S_q, S_k, generator=gen, dtype=torch.float64) * 2 + shift
    sink = torch.randn(H, generator=gen, dtype=torch.float64) + shift
    return scores, sink


SINK_MISTAKES = (
    Mistake("ordinary softmax", lambda s, k: torch.softmax(s, -1),
            "the weights still sum to 1: the sink adds exp(sink[h]) to every row's denominator, so they sum to less."),
    Mistake("sink as a shared scalar", lambda s, k: torch.exp(s - torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), k.mean())),
            "each head has its own sink logit: reshape sink to [H, 1, 1] so it lines up with the head axis."),
    Mistake("sink in the numerator", lambda s, k: torch.exp(s + k.view(-1, 1, 1) - torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), k.view(-1, 1, 1))),
            "the sink only enlarges the denominator; the numerator of key j is exp(s_j)."),
    Mistake("sink column kept", lambda s, k: torch.softmax(torch.cat([s, k.view(1, -1, 1, 1).expand(*s.shape[:-1], 1)], -1), -1),
            "drop the sink's own column: return weights over the real keys only, [..., S_q, S_k]."),
    Mistake("sink added to the logsumexp", lambda s, k: torch.exp(s - (torch.logsumexp(s, -1, keepdim=True) + k.view(-1, 1, 1))),
            "adding the sink to the logsumexp multiplies the denominator by exp(sink): the sink's term is added to "
            "the sum of exponentials, so combine the two with torch.logaddexp."),
)


def _solution_sink(scores: Tensor, sink: Tensor) -> Tensor:
    lse = torch.logaddexp(torch.logsumexp(scores, -1, keepdim=True), sink.view(-1, 1, 1))  # [..., H, S_q, 1]
    return torch.exp(scores - lse)  # [..., H, S_q, S_k]


@exercise(solution=_solution_sink,
          tables=(MistakeTable(SINK_MISTAKES, lambda: [_sink_case(*c) for c in SINK_CASES], reference_sink_softmax),))
def check_sink_softmax(fn: Callable[[Tensor, Tensor], Any]) -> Feedback:
    """Check ``fn(scores [1, H, S_q, S_k], sink [H]) -> weights`` on two cases, the second with scores near 800."""
    for case in SINK_CASES:
        scores, sink = _sink_case(*case)
        got, fb = call_reader(fn, (scores.clone(), sink.clone()), axes=("B", "H", "S_q", "S_k"))
        if fb is not None:
            return fb
        expected = reference_sink_softmax(scores, sink)
        if isinstance(got, Tensor) and got.shape == expected.shape and not torch.isfinite(got).all():
            return wrong(f"inf or NaN with scores near {case[3]:.0f}: exp overflows. Combine the row's logsumexp and the "
                         "sink with torch.logaddexp, then take exp(scores - lse).")
        if close(got, expected):
            continue
        return diagnose(got, SINK_MISTAKES, scores, sink) or wrong(
            f"the weights differ from exp(s_j) / (exp(sink_h) + sum_j exp(s_j)) (expected shape {tuple(expected.shape)}).")
    return correct("each row sums to 1 - sigmoid(sink - logsumexp(scores)): the rest goes to the sink.")
