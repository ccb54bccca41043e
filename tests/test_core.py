"""attnlib.softmax and attnlib.scaled_dot_product_attention against PyTorch as the oracle."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnlib import (
    causal_mask,
    combine_masks,
    padding_mask,
    scaled_dot_product_attention,
    softmax,
)

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


@st.composite
def attention_case(draw: st.DrawFn) -> dict:
    """Random shapes, dtypes and one of: no mask, causal, padding, both."""
    B = draw(st.integers(1, 3))
    H = draw(st.integers(1, 4))
    S_q = draw(st.integers(1, 9))
    kind = draw(st.sampled_from(["none", "causal", "padding", "both", "cross"]))
    S_k = draw(st.integers(1, 9)) if kind == "cross" else S_q
    D_k = draw(st.integers(1, 16))
    D_v = draw(st.integers(1, 16))
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S_q, D_k, generator=gen, dtype=dtype)
    k = torch.randn(B, H, S_k, D_k, generator=gen, dtype=dtype)
    v = torch.randn(B, H, S_k, D_v, generator=gen, dtype=dtype)
    lengths = [draw(st.integers(1, S_k)) for _ in range(B)]  # at least one real token per sequence
    am = torch.tensor([[1] * n + [0] * (S_k - n) for n in lengths])
    mask = None
    if kind == "causal":
        mask = causal_mask(S_q)
    elif kind == "padding":
        mask = padding_mask(am)
    elif kind == "both":
        mask = combine_masks(causal_mask(S_q), padding_mask(am))
    scale = draw(st.one_of(st.none(), st.floats(0.05, 2.0)))
    return dict(q=q, k=k, v=v, mask=mask, scale=scale, dtype=dtype)


@settings(max_examples=150, deadline=None)
@given(attention_case())
def test_sdpa_matches_torch(case: dict) -> None:
    q, k, v, mask, scale = case["q"], case["k"], case["v"], case["mask"], case["scale"]
    ours = scaled_dot_product_attention(q, k, v, mask, scale=scale)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    torch.testing.assert_close(ours.output, theirs, **TOL[case["dtype"]])
    assert ours.weights.shape == (*q.shape[:-1], k.shape[-2])
    # every row sums to 1 (no row is fully masked in these cases) and masked keys get exactly 0
    torch.testing.assert_close(ours.weights.sum(-1), torch.ones_like(ours.weights[..., 0]), **TOL[case["dtype"]])
    if mask is not None:
        assert torch.all(ours.weights.masked_select(~mask.expand_as(ours.weights)) == 0)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 8), st.floats(0.1, 10.0), st.integers(0, 1000))
def test_temperature_divides_scores(S: int, D: int, T: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, S, D, generator=gen, dtype=torch.float64) for _ in range(3))
    ours = scaled_dot_product_attention(q, k, v, temperature=T)
    expected = F.scaled_dot_product_attention(q, k, v, scale=1 / (math.sqrt(D) * T))
    torch.testing.assert_close(ours.output, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_matches_torch_and_is_stable(dtype: torch.dtype) -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [1000.0, 1001.0, 1002.0], [-1000.0, -1000.0, -999.0]], dtype=dtype)
    torch.testing.assert_close(softmax(x), torch.softmax(x, dim=-1))
    assert torch.isfinite(softmax(x)).all()
    torch.testing.assert_close(softmax(x, dim=0), torch.softmax(x, dim=0))
    torch.testing.assert_close(softmax(x, temperature=0.5), torch.softmax(x / 0.5, dim=-1))


def test_softmax_temperature_limits() -> None:
    x = torch.tensor([0.5, 2.0, 1.0])
    assert softmax(x, temperature=1e-3).argmax() == 1
    torch.testing.assert_close(softmax(x, temperature=1e-3), torch.tensor([0.0, 1.0, 0.0]))
    torch.testing.assert_close(softmax(x, temperature=1e6), torch.full((3,), 1 / 3), atol=1e-5, rtol=0)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_softmax_rejects_bad_temperature(bad: float) -> None:
    with pytest.raises(ValueError, match="temperature"):
        softmax(torch.zeros(3), temperature=bad)
    with pytest.raises(ValueError, match="temperature"):
        scaled_dot_product_attention(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), temperature=bad)


def test_fully_masked_row_gives_zero_weights_and_output_like_torch() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 3, 4, generator=gen) for _ in range(3))
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    ours = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(ours.weights[0, 1], torch.zeros(3))
    assert torch.equal(ours.output[0, 1], torch.zeros(4))
    torch.testing.assert_close(ours.output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    # and the gradient stays finite (no NaN leaking from the empty row)
    q.requires_grad_(True)
    scaled_dot_product_attention(q, k, v, mask).output.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_masked_keys_get_exactly_zero_weight() -> None:
    q = k = v = torch.randn(1, 2, 5, 4)
    w = scaled_dot_product_attention(q, k, v, causal_mask(5)).weights
    assert torch.all(w[..., torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)] == 0)


# ---- bad input --------------------------------------------------------------------------------


def _qkv(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


def test_mask_that_cannot_broadcast_names_both_shapes() -> None:
    q = k = v = _qkv(2, 8, 7, 4)
    with pytest.raises(ValueError, match=r"mask shape \(2, 5\) cannot broadcast to scores \(2, 8, 7, 7\)"):
        scaled_dot_product_attention(q, k, v, torch.ones(2, 5, dtype=torch.bool))


def test_mask_that_would_grow_the_scores_is_rejected() -> None:
    q = k = v = _qkv(1, 7, 4)
    with pytest.raises(ValueError, match=r"mask shape \(3, 1, 7, 7\) cannot broadcast to scores \(1, 7, 7\)"):
        scaled_dot_product_attention(q, k, v, torch.ones(3, 1, 7, 7, dtype=torch.bool))


def test_integer_mask_is_rejected_with_a_hint() -> None:
    q = k = v = _qkv(1, 3, 4)
    with pytest.raises(ValueError, match=r"dtype torch.bool.*got torch.int64.*padding_mask"):
        scaled_dot_product_attention(q, k, v, torch.ones(3, 3, dtype=torch.long))


def test_mismatched_head_width() -> None:
    with pytest.raises(ValueError, match=r"q \(1, 3, 4\).*k \(1, 3, 5\)"):
        scaled_dot_product_attention(_qkv(1, 3, 4), _qkv(1, 3, 5), _qkv(1, 3, 5))


def test_mismatched_key_value_lengths() -> None:
    with pytest.raises(ValueError, match=r"k \(1, 3, 4\).*v \(1, 2, 4\)"):
        scaled_dot_product_attention(_qkv(1, 3, 4), _qkv(1, 3, 4), _qkv(1, 2, 4))


def test_mismatched_batch_dims() -> None:
    with pytest.raises(ValueError, match="leading"):
        scaled_dot_product_attention(_qkv(2, 3, 4), _qkv(1, 3, 4), _qkv(1, 3, 4))


def test_mismatched_dtypes() -> None:
    with pytest.raises(ValueError, match=r"dtype.*float32.*float64"):
        scaled_dot_product_attention(_qkv(1, 3, 4), _qkv(1, 3, 4, dtype=torch.float64), _qkv(1, 3, 4))


def test_integer_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="floating-point"):
        scaled_dot_product_attention(torch.ones(3, 4, dtype=torch.long), _qkv(3, 4), _qkv(3, 4))


def test_meta_device_mismatch_is_reported() -> None:
    with pytest.raises(ValueError, match="one device"):
        scaled_dot_product_attention(_qkv(3, 4), torch.empty(3, 4, device="meta"), _qkv(3, 4))


def test_public_api_is_exported() -> None:
    for name in ["get_device", "softmax", "scaled_dot_product_attention", "AttentionResult", "causal_mask",
                 "padding_mask", "combine_masks", "split_heads", "merge_heads", "MultiHeadSelfAttention",
                 "AttentionOutput"]:
        assert hasattr(attnlib, name), name
