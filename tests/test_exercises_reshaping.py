"""Chapter 6 checkers: right answers pass, stubs say "your turn", typical mistakes get their hint."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from attnlib import merge_heads, repeat_kv, split_heads
from attnlib.exercises.reshaping import (
    SPLIT_ZOO,
    check_repeat_kv,
    check_split_merge,
    check_split_test,
    check_transposed_strides,
)


def stub(*args: object) -> Tensor:
    raise NotImplementedError


# --- exercise 1: split and merge -------------------------------------------------------------


def test_split_merge_right_and_stub() -> None:
    assert check_split_merge(split_heads, merge_heads).status == "correct"
    assert check_split_merge(stub, stub).status == "todo"
    assert check_split_merge(split_heads, stub).status == "todo"


@pytest.mark.parametrize(
    "split, merge, hint",
    [
        (lambda x, H: x.view(x.shape[0], H, x.shape[1], -1), merge_heads, "head 0 row 1 holds features of position 0"),
        (lambda x, H: x.view(x.shape[0], x.shape[1], H, -1), merge_heads, "add .transpose(1, 2)"),
        (lambda x, H: x.view(2, 3, 2, 2).transpose(1, 2), merge_heads, "RuntimeError"),  # hard-coded shape
        (split_heads, lambda x: x.reshape(x.shape[0], x.shape[2], -1), "merged without transposing back"),
        (split_heads, lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1), "use reshape"),
        (split_heads, lambda x: x.transpose(1, 2), "merge the last two axes"),
        (split_heads, lambda x: x.tolist(), "should return a torch.Tensor"),
    ],
)
def test_split_merge_hints(split: object, merge: object, hint: str) -> None:
    fb = check_split_merge(split, merge)  # type: ignore[arg-type]
    assert fb.status == "wrong" and hint in fb.message, fb.message


# --- exercise 2: strides of a transposed tensor ----------------------------------------------


def test_strides_right_and_stub() -> None:
    assert check_transposed_strides((60, 3, 12, 1)).status == "correct"
    assert check_transposed_strides([60, 3, 12, 1]).status == "correct"
    assert check_transposed_strides(None).status == "todo"


@pytest.mark.parametrize(
    "answer, hint",
    [
        ((60, 12, 3, 1), "before the transpose"),
        ((60, 15, 3, 1), "fresh contiguous tensor"),
        ((240, 12, 48, 4), "bytes"),
        ((3, 60, 12, 1), "wrong order"),
        ((60, 3, 12), "has 4 strides"),
        ("60, 3, 12, 1", "tuple of ints"),
        ((1, 1, 1, 1), "how many elements you skip"),
    ],
)
def test_strides_hints(answer: object, hint: str) -> None:
    fb = check_transposed_strides(answer)
    assert fb.status == "wrong" and hint in fb.message, fb.message


# --- exercise 3: write the test --------------------------------------------------------------


def good_test(split_fn: object) -> bool:
    B, S, H, d_k = 2, 3, 2, 4
    x = torch.randn(B, S, H * d_k)
    y = split_fn(x, H)  # type: ignore[operator]
    return tuple(y.shape) == (B, H, S, d_k) and all(
        torch.equal(y[:, h], x[..., h * d_k:(h + 1) * d_k]) for h in range(H)
    )


def test_split_test_right_and_stub() -> None:
    assert check_split_test(good_test).status == "correct"
    assert check_split_test(stub).status == "todo"
    assert check_split_test(lambda fn: None).status == "todo"


def test_a_crash_on_a_buggy_split_counts_as_rejecting_it() -> None:
    def strict(split_fn: object) -> bool:
        assert good_test(split_fn)
        return True

    assert check_split_test(strict).status == "correct"


def only_batch_of_one(split_fn: object) -> bool:
    x = torch.randn(1, 3, 8)
    y = split_fn(x, 2)  # type: ignore[operator]
    return tuple(y.shape) == (1, 2, 3, 4) and all(torch.equal(y[:, h], x[..., h * 4:(h + 1) * 4]) for h in range(2))


def two_spots_no_shape(split_fn: object) -> bool:
    x = torch.randn(2, 3, 8)
    y = split_fn(x, 2)  # type: ignore[operator]
    return torch.equal(y[:, 0, 0], x[:, 0, :4]) and torch.equal(y[:, 1, 1], x[:, 1, 4:])


@pytest.mark.parametrize(
    "test_fn, hint",
    [
        (lambda fn: tuple(fn(torch.randn(2, 3, 8), 2).shape) == (2, 2, 3, 4), "reshape-without-transpose bug"),
        (lambda fn: not fn(torch.randn(2, 3, 8), 2).is_contiguous(), "returns a contiguous copy"),
        (only_batch_of_one, "mixes the sequences"),
        (two_spots_no_shape, "check the shape too"),
        (lambda fn: 1 / 0, "raised ZeroDivisionError on the correct split"),
        (lambda fn: "yes", "should return True or False"),
    ],
)
def test_split_test_hints(test_fn: object, hint: str) -> None:
    fb = check_split_test(test_fn)  # type: ignore[arg-type]
    assert fb.status == "wrong" and hint in fb.message, fb.message


def test_split_zoo_has_right_and_wrong_members() -> None:
    flags = [ok for _, ok, _ in SPLIT_ZOO.values()]
    assert flags.count(True) == 3 and flags.count(False) == 4


# --- exercise 4: expanding key/value heads ---------------------------------------------------


def test_repeat_kv_right_and_stub() -> None:
    assert check_repeat_kv(repeat_kv).status == "correct"
    assert check_repeat_kv(lambda kv, H: kv.repeat_interleave(H // kv.shape[1], dim=1)).status == "correct"
    assert check_repeat_kv(stub).status == "todo"


@pytest.mark.parametrize(
    "fn, hint",
    [
        (lambda kv, H: kv.repeat(1, H // kv.shape[1], 1, 1), "you tiled the heads"),
        (lambda kv, H: kv.repeat_interleave(H, dim=1), "not H times"),
        (lambda kv, H: kv, "expected [B, H, S, D_k]"),
        (lambda kv, H: kv.repeat_interleave(H // kv.shape[1], dim=1).flip(1), "query head 0 got key/value head 1"),
        (lambda kv, H: torch.zeros(kv.shape[0], H, *kv.shape[2:], dtype=kv.dtype), "not copies"),
    ],
)
def test_repeat_kv_hints(fn: object, hint: str) -> None:
    fb = check_repeat_kv(fn)  # type: ignore[arg-type]
    assert fb.status == "wrong" and hint in fb.message, fb.message
