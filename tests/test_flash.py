"""attnlib.flash_attention against torch.nn.functional.scaled_dot_product_attention as the oracle."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnlib import causal_mask, flash_attention

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


@st.composite
def flash_case(draw: st.DrawFn) -> dict:
    """Random leading dims, lengths (often not a multiple of the block), widths, block sizes."""
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=3)))
    causal = draw(st.booleans())
    S_k = draw(st.integers(1, 40))
    S_q = draw(st.integers(1, S_k)) if causal else draw(st.integers(1, 40))
    D_k = draw(st.integers(1, 16))
    D_v = draw(st.integers(1, 16))
    block_size = draw(st.integers(1, 48))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    scale = draw(st.one_of(st.none(), st.floats(0.05, 2.0)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(*lead, S_q, D_k, generator=gen, dtype=dtype) * 2
    k = torch.randn(*lead, S_k, D_k, generator=gen, dtype=dtype) * 2
    v = torch.randn(*lead, S_k, D_v, generator=gen, dtype=dtype)
    return dict(q=q, k=k, v=v, causal=causal, block_size=block_size, scale=scale)


@settings(max_examples=200, deadline=None)
@given(flash_case())
def test_flash_matches_pytorch_sdpa(case: dict) -> None:
    q, k, v = case["q"], case["k"], case["v"]
    S_q, S_k = q.shape[-2], k.shape[-2]
    mask = causal_mask(S_q, S_k=S_k) if case["causal"] else None  # bottom-right aligned, explicit
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=case["scale"])
    got = flash_attention(q, k, v, causal=case["causal"], block_size=case["block_size"], scale=case["scale"])
    assert got.shape == expected.shape
    assert got.dtype == q.dtype
    torch.testing.assert_close(got, expected, **TOL[q.dtype])


@pytest.mark.parametrize("S", [1, 63, 64, 65, 200])
@pytest.mark.parametrize("causal", [False, True])
def test_square_causal_matches_is_causal(S: int, causal: bool) -> None:
    """With S_q == S_k the convention agrees with PyTorch's own ``is_causal``."""
    gen = torch.Generator().manual_seed(S)
    q, k, v = (torch.randn(2, 4, S, 32, generator=gen) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(flash_attention(q, k, v, causal=causal, block_size=64), expected, atol=1e-5, rtol=1e-5)


def test_causal_with_cache_is_bottom_right_aligned() -> None:
    """S_q < S_k: the last query sees every key (unlike PyTorch's top-left ``is_causal``)."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 3, 8, generator=gen)
    k = torch.randn(1, 2, 10, 8, generator=gen)
    v = torch.randn(1, 2, 10, 8, generator=gen)
    got = flash_attention(q, k, v, causal=True, block_size=4)
    full = F.scaled_dot_product_attention(q, k, v)  # no mask at all
    torch.testing.assert_close(got[..., -1, :], full[..., -1, :], atol=1e-5, rtol=1e-5)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(got, top_left, atol=1e-3)


def test_default_block_size_and_large_sequence() -> None:
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 1100, 16, generator=gen) for _ in range(3))
    for causal in (False, True):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(flash_attention(q, k, v, causal=causal), expected, atol=1e-5, rtol=1e-5)


def test_large_scores_do_not_overflow() -> None:
    """The running max keeps exp() finite even when scores are in the thousands."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 20, 4, generator=gen) * 300
    k = torch.randn(1, 1, 20, 4, generator=gen) * 300
    v = torch.randn(1, 1, 20, 4, generator=gen)
    got = flash_attention(q, k, v, block_size=3)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_accumulated_in_float32(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 50, 16, generator=gen) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # float32 reference
    got = flash_attention(q.to(dtype), k.to(dtype), v.to(dtype), causal=True, block_size=16)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=2e-2)


def test_exported_from_the_package() -> None:
    assert attnlib.flash_attention is flash_attention
    assert "flash_attention" in attnlib.__all__


def test_never_materialises_the_full_score_matrix() -> None:
    """No tensor with S_q * S_k elements per (batch, head) is allocated: record every bmm's output."""
    S, block = 96, 32
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, S, 8, generator=gen) for _ in range(3))
    shapes: list[tuple[int, ...]] = []
    real_bmm = torch.bmm

    def spy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = real_bmm(a, b)
        shapes.append(tuple(out.shape))
        return out

    torch.bmm = spy  # type: ignore[assignment]
    try:
        flash_attention(q, k, v, causal=True, block_size=block)
    finally:
        torch.bmm = real_bmm  # type: ignore[assignment]
    assert shapes, "flash_attention did not compute score tiles with torch.bmm"
    assert all(s[-2] <= block and s[-1] <= block for s in shapes), shapes
    # causal: 3 query blocks see 1, 2 and 3 key blocks -> 6 tiles, the 3 above the diagonal skipped
    assert len(shapes) == 6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(q=torch.randn(2, 5, 8), k=torch.randn(2, 5, 4), v=torch.randn(2, 5, 8)), "same last dim D_k"),
        (dict(q=torch.randn(2, 5, 8), k=torch.randn(2, 5, 8), v=torch.randn(2, 6, 8)), "number of positions S_k"),
        (dict(q=torch.randn(2, 5, 8), k=torch.randn(3, 5, 8), v=torch.randn(3, 5, 8)), "leading"),
        (dict(q=torch.randn(5, 8), k=torch.randn(5, 8).double(), v=torch.randn(5, 8)), "share a dtype"),
        (dict(q=torch.ones(5, 8, dtype=torch.long), k=torch.randn(5, 8), v=torch.randn(5, 8)), "floating-point"),
        (dict(q=torch.randn(8), k=torch.randn(5, 8), v=torch.randn(5, 8)), "at least 2 dims"),
        (dict(q=torch.randn(0, 8), k=torch.randn(5, 8), v=torch.randn(5, 8)), "at least one position"),
        (dict(q=torch.randn(6, 8), k=torch.randn(5, 8), v=torch.randn(5, 8), causal=True), "S_q <= S_k"),
        (dict(q=torch.randn(5, 8), k=torch.randn(5, 8), v=torch.randn(5, 8), block_size=0), "block_size"),
        (dict(q=torch.randn(5, 8), k=torch.randn(5, 8), v=torch.randn(5, 8), block_size=2.5), "block_size"),
    ],
)
def test_bad_input_raises_clear_value_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        flash_attention(**kwargs)
