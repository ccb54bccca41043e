"""attnlib.softmax and attnlib.scaled_dot_product_attention against PyTorch as the oracle."""

from __future__ import annotations

import math

import numpy as np
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
    kind = draw(st.sampled_from(["none", "causal", "padding", "both", "cross", "random"]))
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
    elif kind == "random":  # may hide every key of some queries: torch 2.13 gives those rows zeros
        mask = torch.rand(B, 1, S_q, S_k, generator=gen) < draw(st.floats(0.0, 1.0))
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
    # every row sums to 1, or to 0 where the mask hides all its keys; masked keys get exactly 0
    visible = torch.ones_like(ours.weights[..., 0]) if mask is None else mask.expand_as(ours.weights).any(-1).to(q.dtype)
    torch.testing.assert_close(ours.weights.sum(-1), visible, **TOL[case["dtype"]])
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


def test_tiny_temperature_gives_one_hot_rows_not_nan() -> None:
    """Dividing first would turn every score into inf (1 / 1e-40 overflows float32) and the row into NaN."""
    x = torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.0, -1.0]])
    assert torch.isnan(torch.softmax(x / 1e-40, dim=-1)).all()  # the order this function avoids
    assert softmax(x, temperature=1e-40).tolist() == [[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]]
    q = k = v = torch.randn(1, 4, 3)
    assert torch.isfinite(scaled_dot_product_attention(q, k, v, temperature=1e-30).output).all()


SCALARS = [2, 0.5, np.float32(0.5), np.float64(2.0), np.int64(3), np.array(0.25), torch.tensor(0.5),
           torch.tensor(2, dtype=torch.int64), torch.tensor(0.5, dtype=torch.float64)]


@pytest.mark.parametrize("value", SCALARS, ids=lambda v: f"{type(v).__name__}({v})")
def test_temperature_and_scale_accept_any_real_scalar(value: object) -> None:
    x = torch.tensor([[0.5, 2.0, 1.0]], dtype=torch.float64)
    number = float(value)
    torch.testing.assert_close(softmax(x, temperature=value), torch.softmax(x / number, dim=-1))
    q, k, v = (torch.randn(2, 3, 4, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, scale=value).output, F.scaled_dot_product_attention(q, k, v, scale=number)
    )
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, temperature=value).output,
        F.scaled_dot_product_attention(q, k, v, scale=1 / (2 * number)),  # D_k = 4: 1 / sqrt(4) / T
    )


BAD_SCALARS = [
    (0, r"must be finite and > 0, got 0.0"),
    (-1.5, r"must be finite and > 0, got -1.5"),
    (float("nan"), r"must be finite and > 0, got nan"),
    (float("inf"), r"must be finite and > 0, got inf"),
    (torch.tensor(-2.0), r"must be finite and > 0, got -2.0"),
    (np.float32("nan"), r"must be finite and > 0, got nan"),
    (True, r"must be a real number \(int, float, NumPy scalar or 0-d tensor\), got bool True"),
    (np.bool_(True), r"must be a real number .*got bool"),
    ("0.5", r"must be a real number .*got str '0.5'"),
    (None, r"must be a real number .*got NoneType None"),
    (1 + 2j, r"must be a real number .*got complex"),
    (torch.tensor([0.5]), r"must be a real 0-d tensor, got shape \(1,\) and dtype torch.float32"),
    (torch.tensor(True), r"must be a real 0-d tensor, got shape \(\) and dtype torch.bool"),
]


@pytest.mark.parametrize("bad, message", BAD_SCALARS, ids=lambda v: repr(v)[:20])
def test_bad_temperature_and_scale_are_rejected_naming_the_argument(bad: object, message: str) -> None:
    q = k = v = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="temperature " + message):
        softmax(torch.zeros(3), temperature=bad)
    with pytest.raises(ValueError, match="temperature " + message):
        scaled_dot_product_attention(q, k, v, temperature=bad)
    if bad is not None:  # scale=None means 1 / sqrt(D_k)
        with pytest.raises(ValueError, match="scale " + message):
            scaled_dot_product_attention(q, k, v, scale=bad)


def test_learnable_temperature_and_scale_pass_gradcheck() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = causal_mask(3)
    T = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    scale = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: softmax(q, temperature=t), (T,))
    assert torch.autograd.gradcheck(
        lambda t, s: scaled_dot_product_attention(q, k, v, mask, temperature=t, scale=s).output, (T, scale)
    )
    T.grad = None
    scaled_dot_product_attention(q, k, v, temperature=T).output.sum().backward()
    assert T.grad is not None and torch.isfinite(T.grad)


def test_gradcheck_through_softmax_and_attention_with_a_fully_masked_row() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    assert torch.autograd.gradcheck(lambda x: softmax(x, dim=0, temperature=0.5), (q,))
    assert torch.autograd.gradcheck(lambda a, b, c: scaled_dot_product_attention(a, b, c, mask), (q, k, v))


# ---- degenerate shapes: the same as F.scaled_dot_product_attention (torch 2.13) -------------------

DEGENERATE = {  # name: (q, k, v) shapes
    "S_k = 0 (no keys: output all zeros)": ((2, 3, 4, 5), (2, 3, 0, 5), (2, 3, 0, 6)),
    "S_q = 0 (no queries)": ((2, 3, 0, 5), (2, 3, 4, 5), (2, 3, 4, 6)),
    "D_k = 0 (every score 0: mean of v)": ((2, 3, 4, 0), (2, 3, 4, 0), (2, 3, 4, 6)),
    "D_v = 0": ((2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 4, 0)),
    "B = 0": ((0, 3, 4, 5), (0, 3, 4, 5), (0, 3, 4, 6)),
    "H = 0": ((2, 0, 4, 5), (2, 0, 4, 5), (2, 0, 4, 6)),
}


@pytest.mark.parametrize("scale", [None, 0.5])
@pytest.mark.parametrize("shapes", DEGENERATE.values(), ids=DEGENERATE.keys())
def test_degenerate_shapes_match_torch(shapes: tuple, scale: float | None) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True) for s in shapes)
    ours = scaled_dot_product_attention(q, k, v, scale=scale)
    theirs = F.scaled_dot_product_attention(q, k, v, scale=scale)
    assert ours.output.shape == theirs.shape and ours.weights.shape == (*q.shape[:-1], k.shape[-2])
    torch.testing.assert_close(ours.output, theirs)
    if k.shape[-2] == 0:
        assert torch.equal(ours.output, torch.zeros_like(ours.output))
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask, scale=scale).output, theirs)
    ours.output.sum().backward()  # autograd works on empty tensors too
    assert q.grad is not None and q.grad.shape == q.shape


def test_softmax_of_empty_and_0d_tensors_matches_torch() -> None:
    for x, dim in ((torch.empty(3, 0), -1), (torch.empty(0, 3), -1), (torch.tensor(3.0), 0)):
        torch.testing.assert_close(softmax(x, dim=dim), torch.softmax(x, dim=dim))


# ---- float16 and bfloat16: no less accurate than PyTorch's fused kernel ------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("amplitude", [1.0, 10.0, 30.0, 100.0])
def test_half_precision_is_no_less_accurate_than_torch(dtype: torch.dtype, amplitude: float) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k = (amplitude * torch.randn(2, 4, 64, 64, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 4, 64, 64, generator=gen, dtype=torch.float64)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if dtype == torch.float16 and amplitude == 100.0:
        assert torch.isinf(q @ k.transpose(-2, -1)).any()  # q @ k^T before scaling overflows float16
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    ours = (scaled_dot_product_attention(q, k, v).output.double() - exact).abs()
    theirs = (F.scaled_dot_product_attention(q, k, v).double() - exact).abs()
    assert torch.isfinite(ours).all()
    assert ours.mean() <= theirs.mean()
    one_ulp = torch.finfo(dtype).eps * exact.abs().max()  # the outputs are rounded to dtype at the end
    assert ours.max() <= theirs.max() + one_ulp


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_softmax_is_no_less_accurate_than_torch(dtype: torch.dtype) -> None:
    x = (30 * torch.randn(64, 256, generator=torch.Generator().manual_seed(0))).to(dtype)
    exact = torch.softmax(x.double(), dim=-1)
    ours = (softmax(x).double() - exact).abs()
    theirs = (torch.softmax(x, dim=-1).double() - exact).abs()
    assert softmax(x).dtype == dtype and ours.max() <= theirs.max() and ours.mean() <= theirs.mean()


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


def test_float32_softmax_gradient_is_no_less_accurate_than_torch() -> None:
    """Peaked rows (unscaled dot products of 1024-wide vectors) make float32 gradients fragile."""
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2000, 1, 1024, generator=gen), torch.randn(2000, 8, 1024, generator=gen)
    scores, upstream = (q @ k.transpose(-2, -1)).squeeze(1), torch.randn(2000, 8, generator=gen)  # [N, 8]

    def grad(f: object, x: torch.Tensor) -> torch.Tensor:
        x = x.clone().requires_grad_(True)
        (f(x) * upstream.to(x.dtype)).sum().backward()  # type: ignore[operator]
        return x.grad

    exact = grad(lambda x: torch.softmax(x, dim=-1), scores.double())
    ours = (grad(softmax, scores).double() - exact).abs().mean()
    theirs = (grad(lambda x: torch.softmax(x, dim=-1), scores).double() - exact).abs().mean()
    assert ours <= theirs
