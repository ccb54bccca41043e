"""Masks, head split/merge and device selection."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlib import (
    causal_mask,
    combine_masks,
    get_device,
    merge_heads,
    padding_mask,
    split_heads,
)
from attnlib.heads import repeat_kv


@pytest.mark.parametrize("S", [1, 2, 5, 17])
def test_causal_mask_is_lower_triangle_and_matches_is_causal(S: int) -> None:
    m = causal_mask(S)
    assert m.dtype == torch.bool and m.shape == (S, S)
    assert torch.equal(m, torch.tril(torch.ones(S, S, dtype=torch.bool)))
    assert torch.equal(~m, torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1))
    q, k, v = (torch.randn(2, 3, S, 8) for _ in range(3))
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, attn_mask=m), F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


def test_causal_mask_with_longer_keys_lets_the_last_query_see_everything() -> None:
    m = causal_mask(2, S_k=4)
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


@pytest.mark.parametrize("bad", [-3, 2.5, True, "4"])
def test_causal_mask_rejects_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError, match=r"S must be an int >= 0, got"):
        causal_mask(bad)  # type: ignore[arg-type]


def test_causal_mask_takes_everything_after_S_by_keyword() -> None:
    """causal_mask(4, 8) would otherwise read the number of keys as the device."""
    with pytest.raises(TypeError, match=r"takes 1 positional argument"):
        causal_mask(4, 8)  # type: ignore[misc]
    assert causal_mask(4, S_k=8, device="cpu").shape == (4, 8)


def test_causal_mask_of_no_positions_is_empty() -> None:
    assert causal_mask(0).shape == (0, 0) and causal_mask(0, S_k=3).shape == (0, 3)
    with pytest.raises(ValueError, match=r"S_k must be an int >= 2, got 1"):
        causal_mask(2, S_k=1)


def test_padding_mask_shape_and_values() -> None:
    am = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    m = padding_mask(am)
    assert m.shape == (2, 1, 1, 4) and m.dtype == torch.bool
    assert m[1, 0, 0].tolist() == [True, True, False, False]
    assert torch.equal(padding_mask(am.bool()), m)
    assert torch.equal(padding_mask(am.float()), m)


def test_padding_mask_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=r"\[B, S\].*\(4,\)"):
        padding_mask(torch.ones(4))
    with pytest.raises(ValueError, match=r"only 0 and 1.*2\.0"):
        padding_mask(torch.tensor([[1, 2, 0]]))


def test_combine_masks() -> None:
    am = torch.tensor([[1, 1, 0], [1, 1, 1]])
    both = combine_masks(causal_mask(3), padding_mask(am))
    assert both.shape == (2, 1, 3, 3)
    assert both[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 0]]
    assert both[1, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert combine_masks() is None and combine_masks(None, None) is None
    assert torch.equal(combine_masks(None, causal_mask(3)), causal_mask(3))


def test_combine_masks_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="torch.bool"):
        combine_masks(causal_mask(3), torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"\(3, 3\), \(2, 1, 1, 4\) cannot broadcast"):
        combine_masks(causal_mask(3), padding_mask(torch.ones(2, 4)))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3), st.integers(1, 7), st.integers(1, 6), st.integers(1, 6))
def test_split_then_merge_is_identity_and_head_h_gets_its_slice(B: int, S: int, H: int, d_k: int) -> None:
    x = torch.randn(B, S, H * d_k)
    heads = split_heads(x, H)
    assert heads.shape == (B, H, S, d_k)
    for h in range(H):
        assert torch.equal(heads[:, h], x[..., h * d_k : (h + 1) * d_k])
    assert torch.equal(merge_heads(heads), x)


def test_reshape_without_transpose_is_caught() -> None:
    """The classic bug: x.view(B, H, S, D_k) runs but mixes positions across heads."""
    B, S, H, d_k = 1, 4, 2, 3
    x = torch.arange(B * S * H * d_k, dtype=torch.float32).view(B, S, H * d_k)
    wrong = x.view(B, H, S, d_k)  # no error, wrong grouping
    right = split_heads(x, H)
    assert wrong.shape == right.shape
    assert not torch.equal(wrong, right)
    # head 0 of the wrong version holds features of positions 0 and 1 mixed together:
    assert torch.equal(wrong[0, 0, 0], x[0, 0, :d_k]) and torch.equal(wrong[0, 0, 1], x[0, 0, d_k:])


def test_split_heads_errors() -> None:
    with pytest.raises(ValueError, match=r"D = 10 is not divisible by num_heads = 4"):
        split_heads(torch.randn(1, 2, 10), 4)
    with pytest.raises(ValueError, match=r"\[B, S, D\].*\(2, 10\)"):
        split_heads(torch.randn(2, 10), 2)
    with pytest.raises(ValueError, match=r"\[B, H, S, D_k\].*\(2, 10\)"):
        merge_heads(torch.randn(2, 10))


def test_repeat_kv_matches_repeat_interleave() -> None:
    kv = torch.randn(2, 2, 5, 3)
    torch.testing.assert_close(repeat_kv(kv, 8), kv.repeat_interleave(4, dim=1))
    assert repeat_kv(kv, 2) is kv
    with pytest.raises(ValueError, match="not a multiple"):
        repeat_kv(kv, 3)


def test_get_device_default_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTNLIB_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    assert get_device().type == expected
    assert get_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("ATTNLIB_DEVICE", "cpu")
    assert get_device("cuda") == torch.device("cpu")  # the environment wins


def test_get_device_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTNLIB_DEVICE", raising=False)
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        get_device("gpu")
    if not torch.cuda.is_available():
        monkeypatch.setenv("ATTNLIB_DEVICE", "cuda")
        with pytest.raises(ValueError, match=r"'cuda' \(from ATTNLIB_DEVICE\) is not available"):
            get_device()


def test_gradcheck_through_split_merge_and_repeat_kv() -> None:
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: split_heads(t, 3), (x,))
    assert torch.autograd.gradcheck(lambda t: merge_heads(split_heads(t, 2) * 2.0), (x,))
    assert torch.autograd.gradcheck(lambda t: repeat_kv(t, 6), (kv,))  # each key/value head feeds 3 query heads
