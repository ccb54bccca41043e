"""attnlib.kv_cache_bytes: exact KV cache sizes, checked against published configurations and real tensors."""

from __future__ import annotations

import pytest
import torch

import attnlib
from attnlib import MultiHeadSelfAttention, kv_cache_bytes, split_heads
from attnlib.cost import median_seconds, peak_memory_bytes


def test_llama2_7b_per_token() -> None:
    # 32 layers, 32 heads (MHA), head dim 128, float16: 2 * 32 * 32 * 128 * 2 bytes = 512 KiB per token
    assert kv_cache_bytes(32, 32, 128) == 524_288


def test_llama2_70b_gqa_per_token() -> None:
    # 80 layers, 8 KV heads (64 query heads), head dim 128, float16: 320 KiB per token
    assert kv_cache_bytes(80, 8, 128) == 327_680
    # the same model with one KV head per query head would need 8x as much
    assert kv_cache_bytes(80, 64, 128) == 8 * kv_cache_bytes(80, 8, 128)


def test_scales_linearly_in_every_argument() -> None:
    base = kv_cache_bytes(2, 3, 4, seq_len=5, batch=6, dtype_bytes=2)
    assert base == 2 * 2 * 3 * 4 * 5 * 6 * 2
    assert kv_cache_bytes(2, 3, 4, seq_len=10, batch=6, dtype_bytes=2) == 2 * base
    assert kv_cache_bytes(2, 3, 4, seq_len=5, batch=6, dtype_bytes=4) == 2 * base


def test_matches_the_tensors_a_module_would_cache() -> None:
    """The keys and values MultiHeadSelfAttention computes for S tokens take exactly that many bytes."""
    B, S, D, H, H_kv = 2, 7, 32, 8, 2
    m = MultiHeadSelfAttention(D, H, num_kv_heads=H_kv)
    x = torch.randn(B, S, D)
    k = split_heads(m.w_k(x), H_kv)  # [B, H_kv, S, D_k]
    v = split_heads(m.w_v(x), H_kv)  # [B, H_kv, S, D_k]
    cached = k.numel() * k.element_size() + v.numel() * v.element_size()
    assert cached == kv_cache_bytes(1, H_kv, D // H, seq_len=S, batch=B, dtype_bytes=4)


def test_exported_from_the_package() -> None:
    assert attnlib.kv_cache_bytes is kv_cache_bytes


@pytest.mark.parametrize("name", ["num_layers", "num_kv_heads", "head_dim", "seq_len", "batch", "dtype_bytes"])
@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_bad_arguments_raise(name: str, bad: object) -> None:
    args = dict(num_layers=1, num_kv_heads=1, head_dim=1, seq_len=1, batch=1, dtype_bytes=1)
    args[name] = bad
    with pytest.raises(ValueError, match=name):
        kv_cache_bytes(**args)


def test_peak_memory_sees_a_large_allocation_on_cpu() -> None:
    size = 256 * 2**20
    peak = peak_memory_bytes(lambda: torch.ones(size // 4))  # 256 MiB, every page written
    if peak is None:
        pytest.skip("no peak-memory measurement on this platform")
    assert 0.9 * size <= peak <= 1.5 * size


def test_median_seconds_is_positive_and_rejects_bad_repeats() -> None:
    assert median_seconds(lambda: sum(range(1000)), repeats=3) > 0
    with pytest.raises(ValueError, match="repeats"):
        median_seconds(lambda: None, repeats=0)
