"""MultiHeadSelfAttention against torch.nn.MultiheadAttention, GQA against an explicit per-head loop."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlib import MultiHeadSelfAttention, split_heads
from attnlib.numpy_reference import multi_head_attention as numpy_mha

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 3),
    S=st.integers(1, 8),
    H=st.sampled_from([1, 2, 4]),
    d_k=st.integers(1, 6),
    bias=st.booleans(),
    masking=st.sampled_from(["none", "padding", "causal", "both"]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    need_weights=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_matches_torch_multihead_attention(
    B: int, S: int, H: int, d_k: int, bias: bool, masking: str, dtype: torch.dtype, need_weights: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    D = H * d_k
    ref = torch.nn.MultiheadAttention(D, H, bias=bias, batch_first=True, dtype=dtype).eval()
    ours = MultiHeadSelfAttention.from_torch(ref)
    x = torch.randn(B, S, D, dtype=dtype)
    lengths = torch.randint(1, S + 1, (B,))
    am = (torch.arange(S)[None, :] < lengths[:, None]).long()  # [B, S], at least one real token
    use_pad = masking in ("padding", "both")
    causal = masking in ("causal", "both")
    kwargs = {}
    if use_pad:
        kwargs["key_padding_mask"] = am == 0  # PyTorch: True means "ignore"
    if causal:
        kwargs["attn_mask"] = torch.triu(torch.ones(S, S, dtype=torch.bool), 1)
    expected, expected_w = ref(x, x, x, need_weights=True, average_attn_weights=False, **kwargs)
    got = ours(x, am if use_pad else None, causal=causal, need_weights=need_weights)
    # PyTorch leaves NaN in rows where every key is masked (causal + padding can leave none here,
    # since each sequence keeps position 0), so a direct comparison is valid.
    torch.testing.assert_close(got.hidden_states, expected, **TOL[dtype])
    if need_weights:
        torch.testing.assert_close(got.attention_weights, expected_w, **TOL[dtype])
    else:
        assert got.attention_weights is None


def test_output_shapes_and_rows_sum_to_one() -> None:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(d_model=512, num_heads=8)
    out = layer(torch.randn(1, 8, 512))
    assert out.hidden_states.shape == (1, 8, 512)
    assert out.attention_weights.shape == (1, 8, 8, 8)
    torch.testing.assert_close(out.attention_weights.sum(-1), torch.ones(1, 8, 8))


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4, 8])
def test_grouped_query_attention_matches_explicit_per_head_loop(num_kv_heads: int) -> None:
    torch.manual_seed(1)
    D, H, S = 32, 8, 6
    layer = MultiHeadSelfAttention(D, H, num_kv_heads=num_kv_heads).double()
    assert layer.w_k.out_features == num_kv_heads * (D // H)
    x = torch.randn(2, S, D, dtype=torch.float64)
    out = layer(x, causal=True)
    d_k = D // H
    q = layer.w_q(x)
    k = layer.w_k(x)
    v = layer.w_v(x)
    heads = []
    for h in range(H):
        g = h // (H // num_kv_heads)  # the key/value head that query head h shares
        qh = q[..., h * d_k : (h + 1) * d_k]
        kh = k[..., g * d_k : (g + 1) * d_k]
        vh = v[..., g * d_k : (g + 1) * d_k]
        scores = qh @ kh.transpose(-2, -1) / math.sqrt(d_k)
        scores = scores.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool), 1), float("-inf"))
        w = scores.softmax(-1)
        torch.testing.assert_close(out.attention_weights[:, h], w)
        heads.append(w @ vh)
    expected = layer.w_o(torch.cat(heads, dim=-1))
    torch.testing.assert_close(out.hidden_states, expected)
    fused = layer(x, causal=True, need_weights=False)
    torch.testing.assert_close(fused.hidden_states, expected)


def test_numpy_twin_matches_torch_module() -> None:
    rng = np.random.default_rng(0)
    B, S, D, H = 2, 5, 8, 2
    x = rng.standard_normal((B, S, D))
    w_q, w_k, w_v, w_o = (rng.standard_normal((D, D)) * 0.3 for _ in range(4))
    out_np, weights_np = numpy_mha(x, w_q, w_k, w_v, w_o, H, causal=True)
    layer = MultiHeadSelfAttention(D, H, bias=False).double()
    with torch.no_grad():
        for lin, w in ((layer.w_q, w_q), (layer.w_k, w_k), (layer.w_v, w_v), (layer.w_o, w_o)):
            lin.weight.copy_(torch.from_numpy(w.T))  # nn.Linear computes x @ W^T
    out = layer(torch.from_numpy(x), causal=True)
    np.testing.assert_allclose(out.hidden_states.detach().numpy(), out_np, atol=1e-12)
    np.testing.assert_allclose(out.attention_weights.detach().numpy(), weights_np, atol=1e-12)
    non_causal, _ = numpy_mha(x, w_q, w_k, w_v, w_o, H, causal=False)
    np.testing.assert_allclose(layer(torch.from_numpy(x)).hidden_states.detach().numpy(), non_causal, atol=1e-12)


def test_numpy_twin_errors() -> None:
    with pytest.raises(ValueError, match=r"w_k must be \[D, D\] = \(8, 8\), got \(8, 4\)"):
        eye = np.eye(8)
        numpy_mha(np.zeros((1, 3, 8)), eye, np.zeros((8, 4)), eye, eye, 2)


def test_constructor_errors() -> None:
    with pytest.raises(ValueError, match="d_model = 10 is not divisible by num_heads = 4"):
        MultiHeadSelfAttention(10, 4)
    with pytest.raises(ValueError, match="num_heads = 8 is not a multiple of num_kv_heads = 3"):
        MultiHeadSelfAttention(16, 8, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_heads must be a positive int"):
        MultiHeadSelfAttention(16, 0)


def test_forward_errors() -> None:
    layer = MultiHeadSelfAttention(16, 4)
    with pytest.raises(ValueError, match=r"last dim is 8 but d_model = 16 \(got shape \(1, 3, 8\)\)"):
        layer(torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match=r"\[B, S, D\].*\(3, 16\)"):
        layer(torch.randn(3, 16))
    with pytest.raises(ValueError, match=r"attention_mask shape \(1, 4\) does not match hidden_states \[B, S\] = \(1, 3\)"):
        layer(torch.randn(1, 3, 16), torch.ones(1, 4))
    with pytest.raises(ValueError, match="float64.*float32"):
        layer(torch.randn(1, 3, 16, dtype=torch.float64))


def test_from_torch_rejects_unsupported_modules() -> None:
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadSelfAttention.from_torch(torch.nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="kdim/vdim"):
        MultiHeadSelfAttention.from_torch(torch.nn.MultiheadAttention(8, 2, kdim=4, vdim=4))
    with pytest.raises(ValueError, match="expects torch.nn.MultiheadAttention"):
        MultiHeadSelfAttention.from_torch(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


# ---- degenerate shapes, fully masked sequences, autograd, compile and export ------------------


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B, S", [(0, 3), (2, 0), (0, 0)])
def test_empty_batch_or_sequence_matches_torch_on_both_paths(B: int, S: int, causal: bool, need_weights: bool) -> None:
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    ours = MultiHeadSelfAttention.from_torch(ref)
    x = torch.randn(B, S, 8)
    expected, _ = ref(x, x, x)  # nn.MultiheadAttention: [B, S, D], weights [B, S, S]
    got = ours(x, torch.ones(B, S), causal=causal, need_weights=need_weights)
    assert got.hidden_states.shape == expected.shape == (B, S, 8)
    if need_weights:
        assert got.attention_weights.shape == (B, 2, S, S)


@pytest.mark.parametrize("need_weights", [True, False])
def test_fully_padded_sequence_gives_the_output_bias_on_both_paths_and_a_warning(need_weights: bool) -> None:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(8, 2)
    x = torch.randn(2, 3, 8)
    with pytest.warns(UserWarning, match=r"sequence\(s\) \[0\] have no key left to attend to"):
        out = layer(x, torch.tensor([[0, 0, 0], [1, 1, 0]]), need_weights=need_weights).hidden_states
    torch.testing.assert_close(out[0], layer.w_o.bias.expand(3, 8))  # zero attention output, then w_o
    assert torch.isfinite(out).all()


def test_gradcheck_through_the_module_with_padding_and_causal_mask() -> None:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(6, 3, num_kv_heads=1).double()
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    am = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    for need_weights in (True, False):
        assert torch.autograd.gradcheck(lambda t: layer(t, am, causal=True, need_weights=need_weights).hidden_states, (x,))


def test_torch_export_with_attention_mask_and_causal() -> None:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(8, 2).eval()
    x, am = torch.randn(2, 4, 8), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    exported = torch.export.export(layer, (x, am), kwargs={"causal": True})
    got = exported.module()(x, am, causal=True)
    expected = layer(x, am, causal=True)
    torch.testing.assert_close(got.hidden_states, expected.hidden_states)
    torch.testing.assert_close(got.attention_weights, expected.attention_weights)
    S = torch.export.Dim("S", min=2, max=64)  # a symbolic length: the size checks must accept it
    dynamic = torch.export.export(
        layer, (x, am), kwargs={"causal": True}, dynamic_shapes={"hidden_states": {1: S}, "attention_mask": {1: S}, "causal": None}
    )
    x7, am7 = torch.randn(2, 7, 8), torch.ones(2, 7)
    torch.testing.assert_close(dynamic.module()(x7, am7, causal=True).hidden_states, layer(x7, am7, causal=True).hidden_states)


def test_torch_compile_with_attention_mask() -> None:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(8, 2).eval()
    x, am = torch.randn(2, 4, 8), torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    compiled = torch.compile(layer, backend="eager", fullgraph=True)  # fullgraph: no graph break allowed
    torch.testing.assert_close(compiled(x, am, causal=True).hidden_states, layer(x, am, causal=True).hidden_states)


def test_key_padding_mask_passed_as_attention_mask_warns() -> None:
    """nn.MultiheadAttention's key_padding_mask (True = ignore) inverts the padding here; in a batch
    padded to its longest sequence, that sequence then sees nothing, and the user is told."""
    layer = MultiHeadSelfAttention(8, 2)
    am = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.warns(UserWarning, match=r"\[1\] have no key.*from_key_padding_mask"):
        layer(torch.randn(2, 4, 8), am == 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer(torch.randn(2, 4, 8), ~(am == 0))  # the converted mask is silent


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(causal=torch.ones(3, 3, dtype=torch.bool)), r"causal must be True or False, got Tensor"),
        (dict(attention_mask=[[1, 1, 1]]), r"attention_mask must be a torch.Tensor \[B, S\] = \(1, 3\), got list"),
        (dict(attention_mask=torch.ones(1, 1, 3, 3)), r"attention_mask must be \[B, S\] = \(1, 3\) \(2 dims\), got shape \(1, 1, 3, 3\)"),
        (dict(attention_mask=torch.tensor([[1, 2, 0]])), r"attention_mask must hold only 0 and 1, found \[2.0\]"),
    ],
)
def test_forward_rejects_bad_masks(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MultiHeadSelfAttention(16, 4)(torch.randn(1, 3, 16), **kwargs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_module_with_large_activations_stays_finite_on_both_paths(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(64, 4).to(dtype)
    x = (300 * torch.randn(2, 16, 64)).to(dtype)
    q, k = split_heads(layer.w_q(x), 4), split_heads(layer.w_k(x), 4)
    if dtype == torch.float16:
        assert torch.isinf(q @ k.transpose(-2, -1)).any()  # unscaled q @ k^T overflows float16 here
    am = torch.tensor([[1] * 10 + [0] * 6, [1] * 16])
    for need_weights in (True, False):
        out = layer(x, am, causal=True, need_weights=need_weights).hidden_states
        assert out.dtype == dtype and torch.isfinite(out).all()
