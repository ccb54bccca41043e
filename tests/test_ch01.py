"""Chapter 1's checkers: each passes a right answer and names each typical mistake."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook.ch01 import check_attention_shapes, check_soft_lookup, reference_shapes


def stub(*args: object) -> None:
    raise NotImplementedError


# ---------------------------------------------------------------- chapter 1: soft lookup


def lookup_right(query, keys, values):
    return torch.softmax(keys @ query, dim=-1) @ values


SOFT_LOOKUP_MISTAKES = {
    "hard lookup": (lambda q, k, v: v[(k @ q).argmax()], "single best-matching row"),
    "raw scores": (lambda q, k, v: (k @ q) @ v, "raw scores"),
    "uniform": (lambda q, k, v: v.mean(dim=0), "averaged all rows equally"),
    "scored values": (lambda q, k, v: torch.softmax(v @ q, dim=-1) @ v, "scored the query against the values"),
    "mixed keys": (lambda q, k, v: torch.softmax(k @ q, dim=-1) @ k, "you mixed the keys"),
    "returned weights": (lambda q, k, v: torch.softmax(k @ q, dim=-1), "one per row"),
    "no sum": (lambda q, k, v: torch.softmax(k @ q, dim=-1)[:, None] * v, "one row per key"),
    "scaled": (lambda q, k, v: torch.softmax(k @ q / math.sqrt(q.shape[0]), dim=-1) @ v, "divided the scores by sqrt(D)"),
    "other": (lambda q, k, v: lookup_right(q, k, v) + 0.1, "differs from the expected values"),
    "crash": (lambda q, k, v: q @ torch.ones(3), "your code raised RuntimeError"),
    "not a tensor": (lambda q, k, v: [1.0], "torch.Tensor"),
}


def test_soft_lookup_accepts_the_right_answer() -> None:
    fb = check_soft_lookup(lookup_right)
    assert fb.passed, fb
    assert "weighted mix" in fb.message


def test_soft_lookup_stub_is_todo() -> None:
    assert check_soft_lookup(stub).status == "todo"


@pytest.mark.parametrize("name", sorted(SOFT_LOOKUP_MISTAKES))
def test_soft_lookup_names_the_mistake(name: str) -> None:
    fn, hint = SOFT_LOOKUP_MISTAKES[name]
    fb = check_soft_lookup(fn)
    assert fb.status == "wrong", fb
    assert hint in fb.message, fb


# ---------------------------------------------------------------- chapter 1: shapes


def shapes_right(B, S, D, H):
    return reference_shapes(B, S, D, H)


def shapes_with(**changes):
    def fn(B, S, D, H):
        env = dict(B=B, S=S, D=D, H=H, d_k=D // H)
        shapes = reference_shapes(B, S, D, H)
        shapes.update({k: tuple(env[a] for a in v) for k, v in changes.items()})
        return shapes

    return fn


SHAPE_MISTAKES = {
    "no transpose": (shapes_with(heads=("B", "S", "H", "d_k")), "before transpose(1, 2)"),
    "d_k = D": (shapes_with(heads=("B", "H", "S", "D")), "D_k = D / H"),
    "scores like q": (shapes_with(scores=("B", "H", "S", "d_k")), "last two axes are both S"),
    "no head axis": (shapes_with(weights=("B", "S", "S")), "keep the head axis"),
    "context = weights": (shapes_with(context=("B", "H", "S", "S")), "it is weights @ V"),
    "not merged": (shapes_with(merged=("B", "H", "S", "d_k")), "merging concatenates"),
    "qkv per head": (shapes_with(qkv=("B", "H", "S", "d_k")), "heads exist only between split and merge"),
    "other": (shapes_with(output=("B", "D", "S")), "it should be"),
}


def test_shapes_accept_the_right_answer_as_tuples_or_sizes() -> None:
    assert check_attention_shapes(shapes_right).passed
    as_sizes = lambda *a: {k: torch.Size(v) for k, v in reference_shapes(*a).items()}  # noqa: E731
    assert check_attention_shapes(as_sizes).passed


def test_shapes_stub_missing_keys_and_bad_values() -> None:
    assert check_attention_shapes(stub).status == "todo"
    partial = lambda *a: {"qkv": reference_shapes(*a)["qkv"]}  # noqa: E731
    assert "lacks the steps" in check_attention_shapes(partial).message
    bad = lambda *a: {**reference_shapes(*a), "scores": "S by S"}  # noqa: E731
    assert "tuple of ints" in check_attention_shapes(bad).message


def test_shapes_need_both_configurations() -> None:
    # Hard-coding the first configuration's answer must not pass.
    fixed = lambda *a: reference_shapes(2, 5, 12, 3)  # noqa: E731
    assert check_attention_shapes(fixed).status == "wrong"


@pytest.mark.parametrize("name", sorted(SHAPE_MISTAKES))
def test_shapes_name_the_mistake(name: str) -> None:
    fn, hint = SHAPE_MISTAKES[name]
    fb = check_attention_shapes(fn)
    assert fb.status == "wrong", fb
    assert hint in fb.message, fb
