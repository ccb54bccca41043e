"""Checkers for chapter 4 (masks).

* :func:`check_combined_mask`: build the padding + causal mask ``[B, 1, S, S]`` by hand.
* :func:`check_masking_order`: fix attention code that masks *after* softmax.
* :func:`check_fully_masked_prediction`: predict the weights of a row whose every key is masked.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
from torch import Tensor

from attnlib.core import scaled_dot_product_attention, softmax
from attnlib.masks import causal_mask, combine_masks, padding_mask
from attnlib.multihead import MultiHeadSelfAttention

from .feedback import Feedback, compare_tensors, correct, run_reader_code, todo, wrong
from .measure import interleaved_median_ms

__all__ = [
    "check_combined_mask", "check_masking_order", "check_fully_masked_prediction", "FULLY_MASKED_CASES",
    "time_parallel_and_prefixes",
]

#: The attention mask the combined-mask checker feeds in: ``[B, S] = [3, 5]``, 1 = real token.
#: Sequence 0 is padded on the right, sequence 2 on the left (its first two rows see nothing).
EXAMPLE_ATTENTION_MASK = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])


def check_combined_mask(fn: Callable[[Tensor], Any]) -> Feedback:
    """Check ``fn(attention_mask [B, S] of 0/1) -> bool [B, 1, S, S]`` (padding AND causal).

    The reference is ``combine_masks(causal_mask(S), padding_mask(attention_mask))``.
    """
    am = EXAMPLE_ATTENTION_MASK.clone()
    B, S = am.shape
    got, fb = run_reader_code(fn, am)
    if fb is not None:
        return fb
    if not isinstance(got, Tensor):
        return wrong(f"return a torch.Tensor, got {type(got).__name__}.")
    expected = combine_masks(causal_mask(S), padding_mask(am))  # [B, 1, S, S]
    assert expected is not None
    if got.dtype != torch.bool:
        return wrong(
            f"your mask has dtype {got.dtype}; attnlib's masks are torch.bool with True = may attend. "
            "Compare with 1 (`attention_mask == 1`) or call `.bool()`."
        )
    if tuple(got.shape) == (B, S, S):
        return wrong(
            f"shape {(B, S, S)} lacks the head axis. Against scores [B, H, S, S] it would line up B with H "
            "(broadcasting aligns shapes from the right), so insert an axis: `mask[:, None]` -> [B, 1, S, S]."
        )
    if tuple(got.shape) != (B, 1, S, S):
        return wrong(f"your mask has shape {tuple(got.shape)}; expected [B, 1, S, S] = {(B, 1, S, S)}.")
    if torch.equal(got, expected):
        return correct("each query sees itself and earlier real tokens, never the future or padding.")
    keys = am.bool()[:, None, None, :]  # [B, 1, 1, S]
    rows = am.bool()[:, None, :, None]  # [B, 1, S, 1]
    tril = torch.ones(S, S, dtype=torch.bool).tril()  # [S, S]
    if torch.equal(got, ~expected):
        return wrong("your mask is inverted: True must mean *may attend* (the visible, lower-left cells).")
    if torch.equal(got, keys.expand(B, 1, S, S)):
        return wrong("padding is hidden but the future is visible: AND in the causal part `torch.tril(...)`.")
    if torch.equal(got, tril.expand(B, 1, S, S)):
        return wrong("the future is hidden but padding keys are visible: AND in the padding part, shaped [B, 1, 1, S].")
    if torch.equal(got, keys & tril.tril(-1)):
        return wrong("the diagonal is hidden: a token may look at itself, so use `torch.tril(ones)` (diagonal=0).")
    if torch.equal(got, keys & tril.triu(1)) or torch.equal(got, keys & tril.T):
        return wrong("you kept the future and hid the past: `triu` marks the future. Use `tril`, or invert `triu(..., 1)`.")
    if torch.equal(got, rows & tril):
        return wrong(
            "you hid padded *queries* (rows) instead of padded *keys* (columns): put the padding axis last, "
            "`attention_mask[:, None, None, :]`."
        )
    if torch.equal(got, rows & keys & tril):
        return wrong(
            "you also hid the padded query rows. That leaves rows with nothing visible (a plain softmax turns them "
            "into NaN); the padding mask hides keys only, and the outputs at padded positions are simply ignored."
        )
    bad = int((got != expected).sum())
    return wrong(f"{bad} of {got.numel()} entries differ from padding AND causal; check sequence 2, which is padded on the left ({am[2].tolist()}).")


def _reference_attention(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    result = scaled_dot_product_attention(q, k, v, causal_mask(q.shape[-2]))
    return result.output, result.weights


def check_masking_order(fn: Callable[[Tensor, Tensor, Tensor], Any]) -> Feedback:
    """Check ``fn(q, k, v) -> (output [B, H, S, D_k], weights [B, H, S, S])``: causal attention.

    Inputs are ``[1, 2, 5, 4]``; the reference is ``attnlib.scaled_dot_product_attention`` with
    ``causal_mask(5)``.
    """
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=gen) for _ in range(3))  # [B, H, S, D_k]
    got, fb = run_reader_code(fn, q, k, v)
    if fb is not None:
        return fb
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return wrong("return a pair `(output, weights)`.")
    out, weights = got
    exp_out, exp_w = _reference_attention(q, k, v)
    if not isinstance(weights, Tensor) or tuple(weights.shape) != tuple(exp_w.shape):
        shape = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
        return wrong(f"weights should be a tensor of shape {tuple(exp_w.shape)} [B, H, S, S], got {shape}.")
    w = weights.detach().to(torch.float64)
    future = ~causal_mask(5)  # [S, S]
    leak = float(w[..., future].abs().max())
    if leak > 1e-6:
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(4)  # [B, H, S, S]
        zero_filled = torch.softmax(scores.masked_fill(future, 0.0), dim=-1)
        if torch.allclose(weights.detach().float(), zero_filled, atol=1e-5):
            return wrong(
                "the future gets weight because you filled it with 0: exp(0) = 1, so a 0 score is an ordinary "
                "score. Fill with -inf (or torch.finfo(dtype).min) so that exp gives 0."
            )
        return wrong(f"future keys get weight (up to {leak:.3f}); hide the upper triangle of the scores.")
    sums = w.sum(-1)  # [B, H, S]
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-5):
        first = float(sums[0, 0, 0])
        worst = float(sums.min())
        return wrong(
            f"the future is at 0 but the rows no longer sum to 1 (row 0 of head 0 sums to {first:.3f}, the "
            f"smallest row to {worst:.3f}): zeroing after softmax throws weight away. Mask the *scores* with "
            "-inf before softmax, so softmax shares the whole 1 among the visible keys."
        )
    mismatch = compare_tensors(weights, exp_w, name="weights", atol=1e-5)
    if mismatch is not None:
        return wrong(mismatch.message + " Did you scale the scores by 1/sqrt(D_k) and apply softmax over the last axis?")
    mismatch = compare_tensors(out, exp_out, name="output", atol=1e-5)
    if mismatch is not None:
        return wrong(mismatch.message + " The weights are right; the output is `weights @ v`.")
    return correct("the mask goes on the scores, before softmax, so each row shares all of its weight among the past.")


#: The three ways to treat a fully masked row that exercise 3 asks about, and what each gives.
FULLY_MASKED_CASES: dict[str, str] = {
    "torch.softmax with -inf": "torch.softmax(torch.full((4,), float('-inf')), dim=-1)",
    "torch.softmax with -1e9": "torch.softmax(torch.full((4,), -1e9), dim=-1)",
    "attnlib.softmax with -inf": "attnlib.softmax(torch.full((4,), float('-inf')))",
}

_HINTS: dict[str, str] = {
    "torch.softmax with -inf": (
        "every entry is -inf, so the row maximum is -inf and x - max = -inf - (-inf) = NaN; "
        "the result is NaN everywhere (0/0 without the max trick)."
    ),
    "torch.softmax with -1e9": (
        "-1e9 is a large but ordinary number. Four equal scores give four equal weights: 1/4 each. "
        "The row 'sees' every hidden key equally."
    ),
    "attnlib.softmax with -inf": (
        "attnlib (like PyTorch's fused attention) returns all-zero weights for a row with nothing visible, "
        "so the query's output is the zero vector."
    ),
}


def _actual(case: str) -> Tensor:
    row = torch.full((4,), float("-inf"))
    if case == "torch.softmax with -inf":
        return torch.softmax(row, dim=-1)
    if case == "torch.softmax with -1e9":
        return torch.softmax(torch.full((4,), -1e9), dim=-1)
    return softmax(row)


def check_fully_masked_prediction(prediction: Any) -> Feedback:
    """Check a dict ``{case: [4 numbers]}`` predicting the weights of a fully masked row of 4 keys.

    Keys are those of :data:`FULLY_MASKED_CASES`; write NaN as ``float("nan")``.
    """
    if not isinstance(prediction, dict):
        return wrong(f"prediction should be a dict with keys {list(FULLY_MASKED_CASES)}, got {type(prediction).__name__}.")
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
            got = torch.as_tensor(value, dtype=torch.float64).flatten()
        except (TypeError, ValueError, RuntimeError):
            return wrong(f"{case!r}: give a list of 4 numbers, got {value!r}.")
        if got.numel() != 4:
            return wrong(f"{case!r}: the row has 4 keys, so give 4 numbers (got {got.numel()}).")
        actual = _actual(case).to(torch.float64)
        if not torch.allclose(got, actual, atol=1e-3, equal_nan=True):
            return wrong(f"{case!r} is not right: {_HINTS[case]}")
    return correct(
        "-inf alone gives NaN, -1e9 gives a uniform row that leaks to hidden keys, and attnlib gives zeros. "
        "Run the three expressions in FULLY_MASKED_CASES to see it."
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
