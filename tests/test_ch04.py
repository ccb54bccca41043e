"""The chapter 4 checkers: a right answer passes, and each typical mistake gets its own hint."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook import ch04
from attnbook.ch04 import (
    check_combined_mask,
    check_fully_masked_prediction,
    check_masking_order,
)
from attnlib import MultiHeadSelfAttention, causal_mask


def _tril(S: int) -> torch.Tensor:
    return torch.tril(torch.ones(S, S, dtype=torch.bool))


def right_mask(am: torch.Tensor) -> torch.Tensor:
    return _tril(am.shape[1]) & am.bool()[:, None, None, :]


def test_combined_mask_accepts_the_right_answer() -> None:
    fb = check_combined_mask(right_mask)
    assert fb.passed and fb.status == "correct"


def _stub(am: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda am: right_mask(am).int(), "dtype torch.int32"),
        (lambda am: right_mask(am)[:, 0], "lacks the head axis"),
        (lambda am: right_mask(am)[None], "expected [B, 1, S, S]"),
        (lambda am: ~right_mask(am), "inverted"),
        (lambda am: am.bool()[:, None, None, :].expand(-1, 1, am.shape[1], -1), "future is visible"),
        (lambda am: _tril(am.shape[1]).expand(am.shape[0], 1, -1, -1), "padding keys are visible"),
        (lambda am: torch.tril(torch.ones(5, 5, dtype=torch.bool), -1) & am.bool()[:, None, None, :], "diagonal is hidden"),
        (lambda am: torch.triu(torch.ones(5, 5, dtype=torch.bool)) & am.bool()[:, None, None, :], "triu"),
        (lambda am: _tril(5) & am.bool()[:, None, :, None], "padded *queries*"),
        (lambda am: _tril(5) & am.bool()[:, None, :, None] & am.bool()[:, None, None, :], "also hid the padded query rows"),
        (lambda am: right_mask(am) & (torch.arange(5) != 0), "entries differ"),
        (lambda am: "mask", "torch.Tensor"),
    ],
)
def test_combined_mask_hints(fn, hint: str) -> None:
    fb = check_combined_mask(fn)
    assert fb.status == "wrong"
    assert hint in fb.message


def test_combined_mask_stub_and_crash() -> None:
    assert check_combined_mask(_stub).status == "todo"
    fb = check_combined_mask(lambda am: am.reshape(7))
    assert fb.status == "wrong" and "RuntimeError" in fb.message


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def fixed(q, k, v):
    w = torch.softmax(_scores(q, k).masked_fill(~causal_mask(q.shape[-2]), float("-inf")), dim=-1)
    return w @ v, w


def test_masking_order_accepts_correct_variants() -> None:
    assert check_masking_order(fixed).passed

    def finfo_fill(q, k, v):
        w = torch.softmax(_scores(q, k).masked_fill(~causal_mask(q.shape[-2]), torch.finfo(q.dtype).min), dim=-1)
        return w @ v, w

    assert check_masking_order(finfo_fill).passed


def test_masking_order_hints() -> None:
    def after(q, k, v):
        w = torch.softmax(_scores(q, k), dim=-1).masked_fill(~causal_mask(q.shape[-2]), 0.0)
        return w @ v, w

    def zero_fill(q, k, v):
        w = torch.softmax(_scores(q, k).masked_fill(~causal_mask(q.shape[-2]), 0.0), dim=-1)
        return w @ v, w

    def no_mask(q, k, v):
        w = torch.softmax(_scores(q, k), dim=-1)
        return w @ v, w

    def unscaled(q, k, v):
        w = torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~causal_mask(q.shape[-2]), float("-inf")), dim=-1)
        return w @ v, w

    def bad_output(q, k, v):
        _, w = fixed(q, k, v)
        return v, w

    cases = {
        after: "rows no longer sum to 1",
        zero_fill: "exp(0) = 1",
        no_mask: "future keys get weight",
        unscaled: "1/sqrt(D_k)",
        bad_output: "output is `weights @ v`",
        (lambda q, k, v: fixed(q, k, v)[1]): "pair",
        (lambda q, k, v: (None, "w")): "shape (1, 2, 5, 5)",
    }
    for fn, hint in cases.items():
        fb = check_masking_order(fn)
        assert fb.status == "wrong", hint
        assert hint in fb.message, (hint, fb.message)


def test_masking_order_stub() -> None:
    def stub(q, k, v):
        raise NotImplementedError

    assert check_masking_order(stub).status == "todo"


NAN = float("nan")
RIGHT = {
    "torch.softmax with -inf": [NAN] * 4,
    "torch.softmax with -1e9": [0.25] * 4,
    "attnlib.softmax with -inf": [0.0] * 4,
}


def test_fully_masked_prediction_right_and_todo() -> None:
    assert check_fully_masked_prediction(RIGHT).passed
    assert check_fully_masked_prediction({k: None for k in RIGHT}).status == "todo"
    assert check_fully_masked_prediction({**RIGHT, "attnlib.softmax with -inf": None}).status == "todo"


@pytest.mark.parametrize(
    ("case", "value", "hint"),
    [
        ("torch.softmax with -inf", [0.0] * 4, "NaN"),
        ("torch.softmax with -inf", [0.25] * 4, "NaN"),
        ("torch.softmax with -1e9", [0.0] * 4, "1/4 each"),
        ("torch.softmax with -1e9", [NAN] * 4, "1/4 each"),
        ("attnlib.softmax with -inf", [NAN] * 4, "all-zero"),
        ("attnlib.softmax with -inf", [0.25] * 4, "all-zero"),
        ("attnlib.softmax with -inf", [0.0] * 3, "4 numbers"),
        ("attnlib.softmax with -inf", "zeros", "list of 4 numbers"),
    ],
)
def test_fully_masked_prediction_hints(case: str, value: object, hint: str) -> None:
    fb = check_fully_masked_prediction({**RIGHT, case: value})
    assert fb.status == "wrong"
    assert hint in fb.message


def test_fully_masked_prediction_bad_container() -> None:
    assert "dict" in check_fully_masked_prediction([0.25] * 4).message
    assert "lacks the key" in check_fully_masked_prediction({"torch.softmax with -inf": [NAN] * 4}).message


# --- the parallel pass against the prefix passes ------------------------------------------


def test_timing_returns_positive_seconds_and_restores_threads() -> None:
    attention = MultiHeadSelfAttention(8, 2).eval()
    threads = torch.get_num_threads()
    parallel, prefixes = ch04.time_parallel_and_prefixes(attention, torch.randn(1, 6, 8), repeats=2, cpu_threads=1)
    assert parallel > 0 and prefixes > 0
    assert torch.get_num_threads() == threads
    with pytest.raises(ValueError, match=r"\[B, S, D\]"):
        ch04.time_parallel_and_prefixes(attention, torch.randn(6, 8))


def test_prefix_outputs_equal_the_masked_parallel_pass() -> None:
    """The two computations the timing compares give the same numbers."""
    torch.manual_seed(0)
    attention = MultiHeadSelfAttention(8, 2).eval()
    x = torch.randn(2, 7, 8)
    with torch.no_grad():
        parallel = attention(x, causal=True).hidden_states
        prefixes = torch.stack([attention(x[:, :i]).hidden_states[:, -1] for i in range(1, 8)], dim=1)
    torch.testing.assert_close(prefixes, parallel)
