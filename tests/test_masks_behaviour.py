"""How masks behave inside attention, beyond mask construction (tests/test_masks_heads_device.py)
and the core fully-masked-row check (tests/test_core.py)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlib import (
    MultiHeadSelfAttention,
    causal_mask,
    combine_masks,
    from_additive_mask,
    from_key_padding_mask,
    padding_mask,
    scaled_dot_product_attention,
    softmax,
)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 9), st.integers(0, 8), st.booleans(), st.integers(0, 2**16))
def test_causal_output_does_not_depend_on_the_future(S: int, cut: int, fused: bool, seed: int) -> None:
    cut = cut % S  # positions 0..cut keep their inputs; everything after changes
    torch.manual_seed(seed)
    mha = MultiHeadSelfAttention(8, 2).eval()
    x = torch.randn(2, S, 8)
    y = x.clone()
    y[:, cut + 1 :] = torch.randn_like(y[:, cut + 1 :])
    with torch.no_grad():
        a = mha(x, causal=True, need_weights=not fused).hidden_states
        b = mha(y, causal=True, need_weights=not fused).hidden_states
    torch.testing.assert_close(a[:, : cut + 1], b[:, : cut + 1])


def test_zero_fill_leaks_and_minus_inf_does_not() -> None:
    scores = torch.tensor([[0.3, 1.2, -0.4]])  # one query, keys 1 and 2 are its future
    future = ~causal_mask(3)[:1]
    leaked = torch.softmax(scores.masked_fill(future, 0.0), dim=-1)
    assert float(leaked[0, 1:].sum()) > 0.3
    exact = softmax(scores.masked_fill(future, float("-inf")))
    assert exact[0].tolist() == [1.0, 0.0, 0.0]


def test_fill_values_on_a_fully_masked_row() -> None:
    row = torch.full((1, 4), float("-inf"))
    assert torch.isnan(torch.softmax(row, dim=-1)).all()  # plain softmax: NaN
    torch.testing.assert_close(torch.softmax(torch.full((1, 4), -1e9), dim=-1), torch.full((1, 4), 0.25))
    assert torch.equal(softmax(row), torch.zeros(1, 4))  # attnlib: zeros
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        finite = torch.full((1, 4), torch.finfo(dtype).min, dtype=dtype)
        torch.testing.assert_close(softmax(finite).float(), torch.full((1, 4), 0.25))  # finite fill: uniform


def test_minus_1e9_does_not_fit_in_float16() -> None:
    assert torch.tensor(-1e9, dtype=torch.float16).item() == -math.inf
    assert torch.finfo(torch.float16).min == -65504.0
    scores = torch.randn(3, 3, dtype=torch.float16)
    try:
        scores.masked_fill(~causal_mask(3), -1e9)
    except RuntimeError as err:  # current PyTorch refuses the overflow
        assert "overflow" in str(err)
    safe = scores.masked_fill(~causal_mask(3), torch.finfo(torch.float16).min)
    assert torch.isfinite(safe).all()
    w = softmax(safe.float())
    assert torch.all(w[~causal_mask(3)] == 0)


def test_padded_keys_get_zero_weight_in_every_head_and_query() -> None:
    torch.manual_seed(0)
    mha = MultiHeadSelfAttention(12, 3).eval()
    am = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with torch.no_grad():
        w = mha(torch.randn(2, 4, 12), attention_mask=am).attention_weights
    assert w.shape == (2, 3, 4, 4)
    assert torch.all(w[1, :, :, 2:] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 4))


def test_real_positions_ignore_what_is_in_the_padding_and_match_the_short_sequence() -> None:
    torch.manual_seed(0)
    mha = MultiHeadSelfAttention(8, 2).eval()
    am = torch.tensor([[1, 1, 1, 0, 0]])
    x = torch.randn(1, 5, 8)
    y = x.clone()
    y[:, 3:] = 1e3 * torch.randn(1, 2, 8)
    for causal in (False, True):
        with torch.no_grad():
            a = mha(x, attention_mask=am, causal=causal).hidden_states
            b = mha(y, attention_mask=am, causal=causal).hidden_states
            short = mha(x[:, :3], causal=causal).hidden_states
        torch.testing.assert_close(a[:, :3], b[:, :3])
        torch.testing.assert_close(a[:, :3], short)
        assert torch.isfinite(a[:, 3:]).all()  # padded query rows are computed, just not used


def test_left_padding_with_causal_mask_gives_fully_masked_rows_that_stay_finite() -> None:
    torch.manual_seed(0)
    am = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    mask = combine_masks(causal_mask(4), padding_mask(am))  # [2, 1, 4, 4]
    assert mask is not None and not mask[0, 0, :2].any()  # rows 0 and 1 of sequence 0 see nothing
    mha = MultiHeadSelfAttention(8, 2)
    x = torch.randn(2, 4, 8, requires_grad=True)
    out = mha(x, attention_mask=am, causal=True)
    w = out.attention_weights
    assert torch.all(w[0, :, :2] == 0)
    # a fully masked row's attention output is zero, so the module returns just the output bias
    torch.testing.assert_close(out.hidden_states[0, :2], mha.w_o.bias.expand(2, 8))
    fused = mha(x, attention_mask=am, causal=True, need_weights=False).hidden_states
    torch.testing.assert_close(fused, out.hidden_states)
    out.hidden_states.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in mha.parameters())


def test_plain_softmax_on_a_fully_masked_row_poisons_the_gradients() -> None:
    """Why attnlib defines the fully masked row: the NaN reaches the gradients of the real rows."""
    torch.manual_seed(0)
    q = torch.randn(1, 3, 4, requires_grad=True)
    mask = torch.tensor([[False, False, False], [True, True, False], [True, True, True]])
    scores = q @ q.transpose(-2, -1)
    out = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ q
    out[:, 1:].sum().backward()  # the loss ignores the fully masked row 0
    assert torch.isnan(q.grad).any()
    q.grad = None
    scaled_dot_product_attention(q, q, q, mask).output[:, 1:].sum().backward()
    assert torch.isfinite(q.grad).all()


def test_cross_attention_shapes_with_source_padding() -> None:
    B, H, T, S, D_k = 2, 3, 4, 6, 5
    dec, enc = torch.randn(B, H, T, D_k), torch.randn(B, H, S, D_k)
    src_pad = padding_mask(torch.tensor([[1] * 6, [1] * 4 + [0] * 2]))  # [B, 1, 1, S]
    res = scaled_dot_product_attention(dec, enc, enc, src_pad)
    assert res.weights.shape == (B, H, T, S) and res.output.shape == (B, H, T, D_k)
    assert torch.all(res.weights[1, :, :, 4:] == 0)
    torch.testing.assert_close(res.output, F.scaled_dot_product_attention(dec, enc, enc, attn_mask=src_pad))


# ---- the conventions table of attnlib.masks, each row checked against its library -------------


def _mha_and_ours(seed: int = 0) -> tuple[torch.nn.MultiheadAttention, MultiHeadSelfAttention, torch.Tensor]:
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    return ref, MultiHeadSelfAttention.from_torch(ref), torch.randn(2, 4, 8)


def test_key_padding_mask_row_true_means_ignore_in_nn_multihead_attention() -> None:
    ref, ours, x = _mha_and_ours()
    key_padding_mask = torch.tensor([[False, False, False, True], [False, False, False, False]])
    expected, expected_w = ref(x, x, x, key_padding_mask=key_padding_mask, average_attn_weights=False)
    assert torch.all(expected_w[0, :, :, 3] == 0)  # True = this key is ignored
    keep = from_key_padding_mask(key_padding_mask)  # [B, 1, 1, S]
    assert keep.shape == (2, 1, 1, 4)
    torch.testing.assert_close(ours(x, keep[:, 0, 0]).hidden_states, expected)
    torch.testing.assert_close(ours(x, ~key_padding_mask).hidden_states, expected)  # what forward's docstring says
    additive = torch.zeros(2, 4).masked_fill(key_padding_mask, float("-inf"))  # nn.MHA's float form: added
    assert torch.equal(from_key_padding_mask(additive), keep)
    torch.testing.assert_close(ref(x, x, x, key_padding_mask=additive)[0], expected)


def test_bool_attn_mask_row_true_means_blocked_in_nn_multihead_attention() -> None:
    ref, ours, x = _mha_and_ours()
    blocked = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
    expected, _ = ref(x, x, x, attn_mask=blocked)
    assert torch.equal(~blocked, causal_mask(4))
    torch.testing.assert_close(ours(x, causal=True).hidden_states, expected)


def test_additive_mask_row_and_sdpa_bool_row() -> None:
    q, k, v = (torch.randn(2, 3, 4, 5) for _ in range(3))
    keep = torch.rand(4, 4, generator=torch.Generator().manual_seed(0)) > 0.3
    keep[:, 0] = True
    additive = torch.zeros(4, 4).masked_fill(~keep, float("-inf"))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # SDPA bool: True = may attend
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=additive), expected)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, from_additive_mask(additive)).output, expected)
    for hide in (-1e4, -1e9, torch.finfo(torch.float32).min):
        assert torch.equal(from_additive_mask(torch.zeros(4, 4).masked_fill(~keep, hide)), keep)


def test_hugging_face_rows_against_transformers() -> None:
    masking_utils = pytest.importorskip("transformers.masking_utils")
    am = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])  # Hugging Face: 1 = real token, 0 = padding
    ours = combine_masks(causal_mask(4), padding_mask(am)).expand(2, 1, 4, 4)
    # transformers turns the 1/0 mask into bool (1 -> True) before building its masks
    kwargs = dict(batch_size=2, q_length=4, kv_length=4, attention_mask=am.bool(), allow_is_causal_skip=False)
    hf_bool = masking_utils.sdpa_mask(mask_function=masking_utils.causal_mask_function, **kwargs)
    hf_additive = masking_utils.eager_mask(mask_function=masking_utils.causal_mask_function, dtype=torch.float16, **kwargs)
    assert hf_bool.dtype == torch.bool and torch.equal(hf_bool, ours)
    assert hf_additive.dtype == torch.float16 and torch.equal(from_additive_mask(hf_additive), ours)


# ---- the wrong convention is announced; the check stays out of traced code --------------------


def test_inverted_masks_warn_and_converted_ones_do_not() -> None:
    am = torch.tensor([[1, 1, 0], [1, 1, 1]])
    key_padding_mask = am == 0
    with pytest.warns(UserWarning, match=r"padding_mask: sequence\(s\) \[1\] have no key left"):
        padding_mask(key_padding_mask)  # the longest sequence has no padding, so inverted it hides all
    with pytest.warns(UserWarning, match=r"from_key_padding_mask: sequence\(s\) \[1\]"):
        from_key_padding_mask(am.bool())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(padding_mask(am), from_key_padding_mask(key_padding_mask))
        causal_attention_with_left_padding = combine_masks(causal_mask(3), padding_mask(torch.tensor([[0, 1, 1]])))
        assert not causal_attention_with_left_padding[0, 0, 0].any()  # fully masked rows alone do not warn


def test_value_checks_are_skipped_while_compiling() -> None:
    def f(m: torch.Tensor) -> torch.Tensor:
        return padding_mask(m)

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(compiled(torch.tensor([[0, 0], [1, 0]])), torch.tensor([[0, 0], [1, 0]]).bool()[:, None, None])


def test_fully_masked_query_conventions_differ_between_torch_apis() -> None:
    """torch 2.13.0: F.scaled_dot_product_attention gives a query that sees nothing a zero output,
    nn.MultiheadAttention gives it NaN; attnlib follows the former on both of its paths."""
    ref, ours, x = _mha_and_ours()
    key_padding_mask = torch.tensor([[True] * 4, [False] * 4])  # sequence 0: every key ignored
    expected, _ = ref(x, x, x, key_padding_mask=key_padding_mask)
    assert torch.isnan(expected[0]).all() and torch.isfinite(expected[1]).all()
    q = k = v = torch.randn(1, 2, 3, 4)
    assert torch.equal(F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(3, 3, dtype=torch.bool)), torch.zeros(1, 2, 3, 4))
    with pytest.warns(UserWarning, match=r"sequence\(s\) \[0\]"):
        for need_weights in (True, False):
            got = ours(x, ~key_padding_mask, need_weights=need_weights).hidden_states
            torch.testing.assert_close(got[0], ours.w_o.bias.expand(4, 8))  # zero attention output, then w_o
            torch.testing.assert_close(got[1], expected[1])
