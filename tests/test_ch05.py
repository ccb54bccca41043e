"""Chapter 5 checkers: right answers pass, stubs say "your turn", typical mistakes get their hint."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from attnbook.ch05 import check_param_count, check_per_head_loop, check_weights_bytes
from attnlib import MultiHeadSelfAttention

# --- parameter count -------------------------------------------------------------------------

def test_param_count_right_and_stub() -> None:
    assert check_param_count(4 * 1024**2 + 4 * 1024).status == "correct"
    assert check_param_count(4 * 768**2, d_model=768, num_heads=12, bias=False).status == "correct"
    assert check_param_count(None).status == "todo"


@pytest.mark.parametrize(
    "answer, hint",
    [
        (4 * 1024**2, "bias"),
        (3 * 1024**2 + 3 * 1024, "W_O"),
        (3 * 1024**2, "W_O"),
        (16 * (4 * 1024**2 + 4 * 1024), "H does not multiply"),
        (4 * 1024 * 64, "one head"),
        ("many", "number"),
        (123, "not it"),
    ],
)
def test_param_count_hints(answer: object, hint: str) -> None:
    fb = check_param_count(answer)
    assert fb.status == "wrong" and hint in fb.message


# --- per-head loop ---------------------------------------------------------------------------

def loop(x: Tensor, m: MultiHeadSelfAttention, *, scale_by: str = "d_k", dim: int = -1, use_wo: bool = True,
         reverse: bool = False, columns: bool = False) -> Tensor:
    d_k = m.d_k
    outs = []
    for h in range(m.num_heads):
        sl = slice(h * d_k, (h + 1) * d_k)

        def proj(layer: torch.nn.Linear) -> Tensor:
            w = layer.weight[:, sl].T if columns else layer.weight[sl]
            return x @ w.T + layer.bias[sl]

        q, k, v = proj(m.w_q), proj(m.w_k), proj(m.w_v)
        div = {"d_k": math.sqrt(d_k), "D": math.sqrt(m.d_model), "none": 1.0, "d_k_plain": d_k}[scale_by]
        w = torch.softmax(q @ k.transpose(-2, -1) / div, dim=dim)
        outs.append(w @ v)
    if reverse:
        outs = outs[::-1]
    merged = torch.cat(outs, dim=-1)
    return m.w_o(merged) if use_wo else merged


def test_per_head_loop_right() -> None:
    assert check_per_head_loop(loop).status == "correct"


def test_per_head_loop_stub_and_crash() -> None:
    def stub(x: Tensor, m: MultiHeadSelfAttention) -> Tensor:
        raise NotImplementedError

    assert check_per_head_loop(stub).status == "todo"
    fb = check_per_head_loop(lambda x, m: m(x).hidden_states)
    assert fb.status == "wrong" and "per-head loop" in fb.message


@pytest.mark.parametrize(
    "kwargs, hint",
    [
        (dict(use_wo=False), "output projection"),
        (dict(scale_by="D"), "1/sqrt(D)"),
        (dict(scale_by="none"), "not scaled"),
        (dict(scale_by="d_k_plain"), "square root"),
        (dict(dim=-2), "dim=-1"),
        (dict(reverse=True), "reverse order"),
        (dict(columns=True), "columns"),
    ],
)
def test_per_head_loop_hints(kwargs: dict, hint: str) -> None:
    fb = check_per_head_loop(lambda x, m: loop(x, m, **kwargs))
    assert fb.status == "wrong" and hint in fb.message, fb.message


def test_per_head_loop_wrong_shapes() -> None:
    fb = check_per_head_loop(lambda x, m: torch.zeros(2, 3, 5, 4))
    assert fb.status == "wrong" and "concatenate" in fb.message
    fb = check_per_head_loop(lambda x, m: x[..., :4])
    assert fb.status == "wrong" and "expected [B, S, D]" in fb.message
    fb = check_per_head_loop(lambda x, m: x * 2)
    assert fb.status == "wrong" and "rows" in fb.message


def test_per_head_loop_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    check_per_head_loop(loop)
    assert torch.equal(torch.rand(1), before)


# --- weights bytes ---------------------------------------------------------------------------

def right_bytes(B: int, H: int, S: int, dtype: torch.dtype) -> int:
    return B * H * S * S * torch.empty((), dtype=dtype).element_size()


def test_weights_bytes_right_and_stub() -> None:
    assert check_weights_bytes(right_bytes).status == "correct"

    def stub(B: int, H: int, S: int, dtype: torch.dtype) -> int:
        raise NotImplementedError

    assert check_weights_bytes(stub).status == "todo"


@pytest.mark.parametrize(
    "fn, hint",
    [
        (lambda B, H, S, dt: B * H * S * S, "number of elements"),
        (lambda B, H, S, dt: B * H * S * S * 4, "not 4"),
        (lambda B, H, S, dt: B * S * S * torch.empty((), dtype=dt).element_size(), "multiply by H"),
        (lambda B, H, S, dt: B * H * S * torch.empty((), dtype=dt).element_size(), "S·S"),
        (lambda B, H, S, dt: H * S * S * torch.empty((), dtype=dt).element_size(), "multiply by B"),
        (lambda B, H, S, dt: 8 * right_bytes(B, H, S, dt), "bits"),
        (lambda B, H, S, dt: "big", "an int"),
        (lambda B, H, S, dt: right_bytes(B, H, S, dt) + 1, "expected"),
    ],
)
def test_weights_bytes_hints(fn, hint: str) -> None:  # type: ignore[no-untyped-def]
    fb = check_weights_bytes(fn)
    assert fb.status == "wrong" and hint in fb.message, fb.message
