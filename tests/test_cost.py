"""attnlib.cost: parameter, FLOP and byte counts against the real modules and PyTorch's counter."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnbook.measure import (
    interleaved_median_ms,
    median_seconds,
    peak_memory_bytes,
    saved_tensor_bytes,
)
from attnlib import MultiHeadSelfAttention, kv_cache_bytes, split_heads
from attnlib.cost import (
    attention_weights_bytes,
    count_flops,
    flops_by_op,
    mha_matmul_flops,
    mha_param_count,
)


@settings(max_examples=40, deadline=None)
@given(H_kv=st.sampled_from([1, 2, 4]), group=st.sampled_from([1, 2, 3]), d_k=st.integers(1, 8), bias=st.booleans())
def test_param_count_matches_module(H_kv: int, group: int, d_k: int, bias: bool) -> None:
    H = H_kv * group
    D = H * d_k
    with torch.device("meta"):
        m = MultiHeadSelfAttention(D, H, bias=bias, num_kv_heads=H_kv)
    assert mha_param_count(D, H, bias=bias, num_kv_heads=H_kv) == sum(p.numel() for p in m.parameters())


def test_param_count_known_values_and_independent_of_heads() -> None:
    assert mha_param_count(768, 12) == 2_362_368  # BERT-base: 4 * 768^2 + 4 * 768
    assert mha_param_count(768, 12, bias=False) == 4 * 768 * 768
    assert {mha_param_count(512, H) for H in (1, 2, 4, 8, 16, 32, 64)} == {4 * 512 * 512 + 4 * 512}
    assert mha_param_count(8192, 64, bias=False, num_kv_heads=8) == 2 * 8192**2 + 2 * 8192 * 1024


@pytest.mark.parametrize("args", [(0, 1), (10, 3), (12, 4, True, 3), (12, True)])
def test_param_count_rejects_bad_config(args: tuple) -> None:
    with pytest.raises(ValueError):
        mha_param_count(*args)


@pytest.mark.parametrize("H", [1, 2, 4, 8])
def test_flop_counter_sees_the_formula(H: int) -> None:
    torch.manual_seed(0)
    m = MultiHeadSelfAttention(32, H)
    x = torch.randn(2, 6, 32)
    by_op = flops_by_op(m, x)
    assert by_op == {"aten.addmm": 8 * 2 * 6 * 32 * 32, "aten.bmm": 4 * 2 * 6 * 6 * 32}
    assert count_flops(m, x) == mha_matmul_flops(2, 6, 32)


def test_count_flops_passes_kwargs() -> None:
    m = MultiHeadSelfAttention(16, 2)
    x = torch.randn(1, 3, 16)
    assert count_flops(m, x, causal=True) == mha_matmul_flops(1, 3, 16)
    assert count_flops(lambda t: t + 1, x) == 0  # elementwise work is not counted


def test_attention_weights_bytes_matches_tensor() -> None:
    for B, H, S, dtype in [(1, 12, 128, torch.float32), (2, 3, 5, torch.float16), (1, 1, 1, torch.float64)]:
        assert attention_weights_bytes(B, H, S, dtype) == torch.empty(B, H, S, S, dtype=dtype, device="meta").nbytes
    assert attention_weights_bytes(1, 2, 3, seq_len_k=5) == 1 * 2 * 3 * 5 * 4
    with pytest.raises(ValueError, match="dtype"):
        attention_weights_bytes(1, 1, 1, torch.int64)
    with pytest.raises(ValueError, match="num_heads"):
        attention_weights_bytes(1, 0, 4)


def test_saved_tensor_bytes_grow_with_heads_only_when_weights_are_materialised() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 16, 32)
    explicit = {H: saved_tensor_bytes(MultiHeadSelfAttention(32, H), x) for H in (1, 4)}
    # the materialised [B, H, S, S] weights are the largest saved activation once H * S > D
    assert explicit[4]["largest"] == attention_weights_bytes(1, 4, 16)
    assert explicit[4]["activations"] - explicit[1]["activations"] >= 3 * attention_weights_bytes(1, 3, 16)
    fused = {H: saved_tensor_bytes(lambda t, m=MultiHeadSelfAttention(32, H): m(t, need_weights=False), x)["activations"] for H in (1, 4)}
    assert fused[4] - fused[1] < attention_weights_bytes(1, 3, 16)


def test_saved_tensor_bytes_counts_shared_storage_once() -> None:
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(8, 8)

    def square_of_product(a: torch.Tensor) -> torch.Tensor:
        y = a * w  # saves a (for the gradient of w)
        return y * y  # saves y twice: one storage

    result = saved_tensor_bytes(square_of_product, x)
    assert result["count"] == 1 and result["activations"] == 8 * 8 * 4
    assert result["params_and_inputs"] == 8 * 8 * 4  # x, saved by the inner mul (w is not: x needs no grad)


def test_interleaved_median_ms() -> None:
    calls: list[str] = []
    out = interleaved_median_ms({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1)
    assert set(out) == {"a", "b"} and all(v >= 0 for v in out.values())
    assert calls == ["a", "b"] * 4  # warmup then round robin
    with pytest.raises(ValueError):
        interleaved_median_ms({"a": lambda: None}, repeats=0)


def test_interleaved_median_ms_reads_the_given_clock() -> None:
    ticks = iter(range(100))
    fake_clock = lambda: float(next(ticks))  # noqa: E731 - each reading advances one "second"
    got = interleaved_median_ms({"a": lambda: None}, repeats=3, warmup=0, clock=fake_clock)
    assert got == {"a": 1000.0}  # start and stop are consecutive readings: 1 s = 1000 ms


# === kv_cache_bytes ============================================================================
# attnlib.kv_cache_bytes: exact KV cache sizes, checked against published configurations and real tensors.

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
