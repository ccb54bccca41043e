"""KVCache, cached/windowed MultiHeadSelfAttention and MultiHeadLatentAttention: decoding in
chunks with a cache gives what one causal forward over the whole sequence gives."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlib import (
    KVCache,
    MultiHeadLatentAttention,
    MultiHeadSelfAttention,
    causal_mask,
    kv_cache_bytes,
)

CHUNKS = (4, 1, 1, 1, 3, 1)  # a prefill of several tokens, single tokens, an uneven chunk
S = sum(CHUNKS)
TOL = {torch.float32: 2e-6, torch.float64: 1e-12}


def inputs(dtype: torch.dtype, left_pad: bool, D: int = 16) -> tuple[torch.Tensor, torch.Tensor | None]:
    x = torch.randn(3, S, D, dtype=dtype)
    if not left_pad:
        return x, None
    mask = torch.ones(3, S, dtype=torch.long)
    mask[0, :3] = 0  # three pads on the left
    mask[2, :1] = 0
    return x, mask


def decode_in_chunks(layer, x, mask, *, need_weights=True, **kwargs):
    cache, outs, weights, pos = KVCache(), [], [], 0
    for n in CHUNKS:
        m = None if mask is None else mask[:, : pos + n]
        out = layer(x[:, pos : pos + n], m, causal=True, need_weights=need_weights, cache=cache, **kwargs)
        outs.append(out.hidden_states)
        weights.append((pos, n, out.attention_weights))
        pos += n
    return torch.cat(outs, dim=1), weights, cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("left_pad", [False, True])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_chunked_decoding_equals_one_causal_pass(num_kv_heads, left_pad, window, dtype) -> None:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(16, 4, num_kv_heads=num_kv_heads, window=window).to(dtype)
    x, mask = inputs(dtype, left_pad)
    full = layer(x, mask, causal=True)
    for need_weights in (False, True):  # the weights of the last run are checked below
        out, weights, cache = decode_in_chunks(layer, x, mask, need_weights=need_weights)
        torch.testing.assert_close(out, full.hidden_states, atol=TOL[dtype], rtol=TOL[dtype])
    for pos, n, w in weights:  # the columns returned are the last S_k positions; older ones are 0
        S_k = w.shape[-1]
        assert S_k == (pos + n if window is None else min(pos, window) + n)
        rows = full.attention_weights[:, :, pos : pos + n]
        torch.testing.assert_close(w, rows[..., pos + n - S_k : pos + n], atol=TOL[dtype], rtol=TOL[dtype])
        assert rows[..., : pos + n - S_k].abs().sum() == 0
    kept = S if window is None else window
    assert cache.keys.shape == (3, num_kv_heads, kept, 4) and cache.length == S  # H_kv heads, not H
    assert cache.nbytes == kv_cache_bytes(1, num_kv_heads, 4, kept, batch=3, dtype_bytes=dtype.itemsize)


def test_window_matches_the_mask_and_mistral_semantics() -> None:
    m = causal_mask(5, window=2)
    assert m.sum(-1).tolist() == [1, 2, 2, 2, 2]  # itself and one earlier position
    assert torch.equal(causal_mask(2, S_k=5, window=5), causal_mask(2, S_k=5))
    torch.manual_seed(0)
    layer, x = MultiHeadSelfAttention(8, 2, window=2), torch.randn(1, 6, 8)
    w = layer(x, causal=True).attention_weights
    assert torch.equal(w[0, 0] > 0, causal_mask(6, window=2))


@pytest.mark.parametrize("num_kv_heads", [4, 1])
def test_fused_path_uses_a_bottom_right_mask(num_kv_heads) -> None:
    """The fused path must not behave like is_causal=True (top-left) when S_new < S_k."""
    torch.manual_seed(0)
    layer, cache = MultiHeadSelfAttention(16, 4, num_kv_heads=num_kv_heads), KVCache()
    x = torch.randn(1, 6, 16)
    layer(x[:, :4], causal=True, cache=cache)
    fused = layer(x[:, 4:], causal=True, need_weights=False, cache=cache).hidden_states
    full = layer(x, causal=True).hidden_states[:, 4:]
    torch.testing.assert_close(fused, full)
    q = torch.randn(1, 1, 2, 4); k = v = torch.randn(1, 1, 6, 4)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # torch 2.13: diagonal at top-left
    bottom_right = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(2, S_k=6))
    assert not torch.allclose(top_left, bottom_right)


@torch.no_grad()  # with gradients enabled the cache appends with torch.cat (tests/test_misuse_cache_flash.py)
def test_growth_policy_doubles_and_rolls() -> None:
    cache = KVCache()
    reserved = []
    for _ in range(9):
        cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
        reserved.append(cache.reserved_bytes // (2 * 2 * 4 * 4))  # positions reserved
    assert reserved == [1, 2, 4, 4, 8, 8, 8, 8, 16]
    rolling = KVCache()
    for i in range(20):
        k = torch.full((1, 1, 1, 1), float(i))
        keys, _ = rolling.update(k, k, window=4)
        assert keys[0, 0, :, 0].tolist() == list(map(float, range(max(0, i - 4), i + 1)))
        assert rolling.keys[0, 0, :, 0].tolist() == list(map(float, range(max(0, i - 3), i + 1)))
        assert rolling.reserved_bytes <= 8 * 2 * 4  # never more than 2 * window positions
    long = KVCache()  # a long prompt, then decoding: the buffer shrinks back to the window
    long.update(torch.zeros(1, 2, 300, 4), torch.zeros(1, 2, 300, 4), window=4)
    for _ in range(5):
        long.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), window=4)
        assert long.nbytes == 2 * 2 * 4 * 4 * 4 and long.reserved_bytes <= 2 * long.nbytes


def _window_moves(window: int, steps: int, layer: MultiHeadSelfAttention | None = None) -> tuple[int, int, int]:
    """(positions moved in all, moved once the window was full, steps with a full window), seen from
    outside: when the cached keys' storage changes, the positions held before the step were copied."""
    cache, moved, moved_full, steps_full = KVCache(), 0, 0, 0
    for _ in range(steps):
        held = 0 if cache.keys is None else cache.keys.shape[2]
        before = None if cache.keys is None else cache.keys.untyped_storage().data_ptr()
        if layer is None:
            cache.update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8), window=window)
        else:
            layer(torch.randn(1, 1, 32), causal=True, need_weights=False, cache=cache)
        step = held if before is not None and cache.keys.untyped_storage().data_ptr() != before else 0
        moved += step
        if held == window:
            moved_full, steps_full = moved_full + step, steps_full + 1
    return moved, moved_full, steps_full


@torch.no_grad()
@pytest.mark.parametrize("window", [63, 64, 1000, 1023, 1024])
def test_a_full_window_moves_at_most_once_per_window_steps(window: int) -> None:
    # a buffer of only window + 1 positions (the next power of two for 1023) moved the whole window
    # at almost every step: 848.6 positions per step for W = 1023, 34.8 for 1000, 62.3 for 63
    steps = 6000
    moved, moved_full, steps_full = _window_moves(window, steps)
    assert steps_full >= 4 * window or steps_full >= steps - 2 * window
    assert moved_full <= window * math.ceil(steps_full / window)  # one move of W per W steps: <= 1 per step
    assert moved <= 1.03 * steps  # the doublings while the window fills included


@torch.no_grad()
def test_a_windowed_layer_moves_its_cache_rarely() -> None:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(32, 4, num_kv_heads=2, window=63)  # 61.3 positions per step before
    moved, moved_full, steps_full = _window_moves(63, 300, layer)
    assert moved_full <= 63 * math.ceil(steps_full / 63) and moved <= 2 * 300


def test_bad_input_raises_clear_errors() -> None:
    torch.manual_seed(0)
    layer, cache = MultiHeadSelfAttention(16, 4, num_kv_heads=2), KVCache()
    layer(torch.randn(2, 3, 16), causal=True, cache=cache)
    with pytest.raises(ValueError, match="holds the keys and values of another layer"):
        MultiHeadSelfAttention(16, 4)(torch.randn(2, 1, 16), causal=True, cache=cache)
    with pytest.raises(ValueError, match="holds the keys and values of another layer"):
        MultiHeadSelfAttention(32, 8, num_kv_heads=4)(torch.randn(2, 1, 32), causal=True, cache=cache)
    with pytest.raises(ValueError, match="batch size changed mid-sequence: the cache holds B = 2"):
        layer(torch.randn(1, 1, 16), causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"does not match \[B, cache.length \+ S\] = \[2, 3 \+ 1\]"):
        layer(torch.randn(2, 1, 16), torch.ones(2, 1), causal=True, cache=cache)
    assert cache.length == 3  # a refused call leaves the cache as it was
    with pytest.raises(ValueError, match="needs causal=True"):
        MultiHeadSelfAttention(16, 4, window=2)(torch.randn(1, 3, 16))
    with pytest.raises(ValueError, match="must be an attnlib.KVCache"):
        layer(torch.randn(2, 1, 16), cache={})
    with pytest.raises(ValueError, match="do not match the cached"):
        cache.update(torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("left_pad", [False, True])
def test_latent_attention_paths_agree_and_decode_in_chunks(left_pad, dtype) -> None:
    torch.manual_seed(0)
    mla = MultiHeadLatentAttention(16, 4, latent_dim=6).to(dtype)
    x, mask = inputs(dtype, left_pad)
    full = mla(x, mask, causal=True)
    absorbed = mla(x, mask, causal=True, absorbed=True)
    torch.testing.assert_close(absorbed.hidden_states, full.hidden_states, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(absorbed.attention_weights, full.attention_weights, atol=TOL[dtype], rtol=TOL[dtype])
    for kwargs in (dict(absorbed=False), dict(absorbed=True), dict(absorbed=True, need_weights=False)):
        out, weights, cache = decode_in_chunks(mla, x, mask, **kwargs)
        torch.testing.assert_close(out, full.hidden_states, atol=TOL[dtype], rtol=TOL[dtype])
    assert cache.keys.shape == (3, 1, S, 6) and cache.values is None  # latents only
    assert cache.nbytes == 3 * S * 6 * dtype.itemsize


def test_latent_attention_matches_an_explicit_mha_with_low_rank_keys() -> None:
    """MLA is multi-head attention whose k and v projections factor through the latent."""
    torch.manual_seed(0)
    mla = MultiHeadLatentAttention(16, 4, latent_dim=6, bias=False)
    mha = MultiHeadSelfAttention(16, 4, bias=False)
    with torch.no_grad():
        mha.w_q.weight.copy_(mla.w_q.weight)
        mha.w_k.weight.copy_(mla.w_uk.weight @ mla.w_dkv.weight)
        mha.w_v.weight.copy_(mla.w_uv.weight @ mla.w_dkv.weight)
        mha.w_o.weight.copy_(mla.w_o.weight)
    x = torch.randn(2, 7, 16)
    torch.testing.assert_close(mla(x, causal=True).hidden_states, mha(x, causal=True).hidden_states)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=6),
    st.sampled_from([1, 2, 4]),
    st.one_of(st.none(), st.integers(1, 6)),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_any_chunking_equals_one_causal_pass(chunks, num_kv_heads, window, fused, seed) -> None:
    torch.manual_seed(seed)
    layer = MultiHeadSelfAttention(16, 4, num_kv_heads=num_kv_heads, window=window).to(torch.float64)
    x = torch.randn(2, sum(chunks), 16, dtype=torch.float64)
    full = layer(x, causal=True).hidden_states
    cache, outs, pos = KVCache(), [], 0
    for n in chunks:
        outs.append(layer(x[:, pos : pos + n], causal=True, need_weights=not fused, cache=cache).hidden_states)
        pos += n
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-12, rtol=1e-12)
    assert cache.keys.shape[2] == (pos if window is None else min(pos, window))


def test_truncate_rolls_back_to_a_length() -> None:
    torch.manual_seed(0)
    layer, x = MultiHeadSelfAttention(16, 4, num_kv_heads=2), torch.randn(1, 9, 16)
    cache = KVCache()
    layer(x[:, :5], causal=True, cache=cache)
    layer(torch.randn(1, 3, 16), causal=True, cache=cache)  # three drafted tokens ...
    cache.truncate(5)  # ... all rejected
    assert cache.length == 5 and cache.keys.shape[-2] == 5
    out = layer(x[:, 5:], causal=True, cache=cache).hidden_states
    torch.testing.assert_close(out, layer(x, causal=True).hidden_states[:, 5:])
    cache.truncate(0)
    assert cache.length == 0 and cache.nbytes == 0
    for bad in (-1, 1, 2.0, True, "1", None):
        with pytest.raises(ValueError, match=r"truncate length must be an int in 0\.\.0"):
            cache.truncate(bad)


@pytest.mark.parametrize("grad", [False, True])
def test_reserved_bytes_shrink_with_a_long_truncate(grad: bool) -> None:
    """After ``truncate`` the cache reserves at most twice what it holds (it kept 64 positions' room before)."""
    cache = KVCache()
    with torch.set_grad_enabled(grad):
        for _ in range(33):
            cache.update(torch.zeros(1, 2, 1, 4, requires_grad=grad), torch.zeros(1, 2, 1, 4))
        assert cache.reserved_bytes >= 33 * 64
        cache.truncate(5)
        assert cache.nbytes == 5 * 64 and cache.reserved_bytes <= 2 * cache.nbytes
        keys, _ = cache.update(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))  # still grows and reads right
    assert keys.shape == (1, 2, 6, 4) and keys[0, 0, :, 0].tolist() == [0.0] * 5 + [1.0]


def test_a_cache_pickles_and_its_copy_is_free_to_be_claimed() -> None:
    import pickle

    layer, other = MultiHeadSelfAttention(16, 4), MultiHeadSelfAttention(16, 4)
    cache = KVCache()
    with torch.no_grad():
        layer(torch.randn(1, 3, 16), causal=True, cache=cache)
        copy = pickle.loads(pickle.dumps(cache))
        assert torch.equal(copy.keys, cache.keys) and copy.length == 3
        other(torch.randn(1, 1, 16), causal=True, cache=copy)  # the owner (a live layer) is not pickled
        with pytest.raises(ValueError, match="another layer"):
            other(torch.randn(1, 1, 16), causal=True, cache=cache)  # the original keeps its owner
