"""Mistakes a user makes with attnlib, and exactly what each one gets back.

Every entry is one realistic mistake: the call, then the ``ValueError`` (or ``UserWarning``) and
the words it must contain. Nothing here may raise a bare AttributeError, IndexError, TypeError or
ZeroDivisionError, and nothing may pass silently. A new mistake is one more line in a table.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
import torch

import attnlib
from attnlib import (
    BlockPool,
    KVCache,
    MultiHeadLatentAttention,
    MultiHeadSelfAttention,
    PagedKVCache,
    causal_mask,
    combine_masks,
    from_additive_mask,
    from_key_padding_mask,
    get_device,
    kv_cache_bytes,
    merge_heads,
    padding_mask,
    paged_attention,
    paged_attention_in_place,
    repeat_kv,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)
from attnlib.numpy_reference import multi_head_attention as numpy_mha
from attnlib.numpy_reference import softmax as numpy_softmax

torch.manual_seed(0)
Q = K = V = torch.randn(2, 8, 5, 4)  # [B, H, S, D_k]
X = torch.randn(2, 5, 16)  # [B, S, D]
AM = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])  # Hugging Face: 1 = real token
LAYER = MultiHeadSelfAttention(16, 4)
POOL = BlockPool(8, 4, 2, 4)  # 8 blocks of 4 positions, H_kv = 2, D_k = 4
CONVERTERS = r"attnlib.padding_mask\(m\).*attnlib.from_key_padding_mask\(m\).*attnlib.from_additive_mask\(m\)"

MISTAKES: list[tuple[str, Callable[[], object], str]] = [
    # --- masks in another library's convention, or not a mask at all
    ("a Python list as the mask", lambda: scaled_dot_product_attention(Q, K, V, [[True] * 5] * 5),
     r"mask must be a torch.bool tensor \(True = may attend\), got list"),
    ("the tokenizer's 1/0 attention_mask straight into attention",
     lambda: scaled_dot_product_attention(Q, K, V, AM), r"mask must have dtype torch.bool .*got torch.int64; convert .*" + CONVERTERS),
    ("a Hugging Face additive float mask straight into attention",
     lambda: scaled_dot_product_attention(Q, K, V, torch.zeros(2, 1, 5, 5)), r"got torch.float32; .*from_additive_mask"),
    ("the [B, S] mask without padding_mask (it cannot broadcast)",
     lambda: scaled_dot_product_attention(Q, K, V, AM.bool()), r"mask shape \(2, 5\) cannot broadcast to scores \(2, 8, 5, 5\)"),
    ("a mask that would add a batch axis", lambda: scaled_dot_product_attention(Q[0], K[0], V[0], padding_mask(AM)),
     r"mask shape \(2, 1, 1, 5\) cannot broadcast to scores \(8, 5, 5\)"),
    ("a mask on another device", lambda: scaled_dot_product_attention(Q, K, V, torch.ones(5, 5, dtype=torch.bool, device="meta")),
     r"mask is on meta but the scores are on cpu"),
    ("token type ids (0/1/2) as the padding mask", lambda: padding_mask(torch.tensor([[0, 1, 2]])),
     r"attention_mask must hold only 0 and 1, found \[2.0\]"),
    ("a 4-D mask as the module's attention_mask", lambda: LAYER(X, padding_mask(AM)),
     r"attention_mask must be \[B, S\] = \(2, 5\) \(2 dims\), got shape \(2, 1, 1, 5\)"),
    ("the module's attention_mask for a different length", lambda: LAYER(X, AM[:, :4]),
     r"attention_mask shape \(2, 4\) does not match hidden_states \[B, S\] = \(2, 5\)"),
    ("a causal mask as the causal flag", lambda: LAYER(X, causal=causal_mask(5)),
     r"causal must be True or False, got Tensor; pass masks as attention_mask"),
    ("an integer key_padding_mask", lambda: from_key_padding_mask((AM == 0).int()),
     r"key_padding_mask must be bool \(True = ignore\) or an additive float mask, got torch.int32"),
    ("a relative-position bias as an additive mask", lambda: from_additive_mask(torch.tensor([[0.0, -0.5, -1.0]])),
     r"an additive mask must hold only 0 \(keep\) and -inf or values <= -10000 \(hide\), found \[-1.0, -0.5\]; a bias is not a mask: add it to the scores"),
    ("an additive mask as a combine_masks input", lambda: combine_masks(causal_mask(3), torch.zeros(3, 3)),
     r"mask 1 must have dtype torch.bool"),
    # --- scale and temperature
    ("scale as a string from a config file", lambda: scaled_dot_product_attention(Q, K, V, scale="0.5"),
     r"scale must be a real number \(int, float, NumPy scalar or 0-d tensor\), got str '0.5'"),
    ("scale = nan from a broken computation", lambda: scaled_dot_product_attention(Q, K, V, scale=float("nan")),
     r"scale must be finite and > 0, got nan"),
    ("scale = 1 / sqrt(D_k) computed as 1 // sqrt(D_k)", lambda: scaled_dot_product_attention(Q, K, V, scale=1 // 2.0),
     r"scale must be finite and > 0, got 0.0"),
    ("temperature 0 for 'greedy'", lambda: softmax(torch.randn(3), temperature=0), r"temperature must be finite and > 0, got 0.0"),
    ("a learnable temperature of shape [1]", lambda: softmax(torch.randn(3), temperature=torch.ones(1, requires_grad=True)),
     r"temperature must be a real 0-d tensor, got shape \(1,\) and dtype torch.float32"),
    ("softmax over an axis that does not exist", lambda: softmax(torch.randn(3, 4), dim=2),
     r"dim 2 is out of range for a tensor of shape \(3, 4\)"),
    # --- shapes and dtypes
    ("one sequence without the batch axis into the module", lambda: LAYER(X[0]),
     r"hidden_states must be \[B, S, D\] with D = 16 \(3 dims\), got shape \(5, 16\)"),
    ("token ids instead of embeddings into the module", lambda: LAYER(torch.randint(0, 9, (2, 5, 16))),
     r"hidden_states is torch.int64 on cpu but the module's weights are torch.float32 on cpu"),
    ("float16 inputs into a float32 module", lambda: LAYER(X.half()), r"hidden_states is torch.float16 .*use module.to"),
    ("a single query vector (1-D)", lambda: scaled_dot_product_attention(torch.randn(4), torch.randn(5, 4), torch.randn(5, 4)),
     r"q must have at least 2 dims, got shape \(4,\)"),
    ("keys with a different head width", lambda: scaled_dot_product_attention(Q, K[..., :3], V),
     r"q and k must have the same last dim D_k: got q \(2, 8, 5, 4\)"),
    ("values for fewer positions than keys", lambda: scaled_dot_product_attention(Q, K, V[..., :4, :]),
     r"k and v must have the same number of positions S_k"),
    ("numpy arrays into the torch function", lambda: scaled_dot_product_attention(Q.numpy(), K, V),
     r"q must be a torch.Tensor, got ndarray"),
    ("split_heads on a list", lambda: split_heads([[1.0, 2.0]], 2), r"split_heads input must be a torch.Tensor \[B, S, D\], got list"),
    ("split_heads with a head count that does not divide D", lambda: split_heads(X, 3),
     r"D = 16 is not divisible by num_heads = 3 \(shape \(2, 5, 16\)\)"),
    ("merge_heads on [B, S, D]", lambda: merge_heads(X), r"merge_heads input must be \[B, H, S, D_k\] \(4 dims\), got shape \(2, 5, 16\)"),
    ("repeat_kv to zero heads", lambda: repeat_kv(Q, 0), r"num_heads must be a positive int, got 0"),
    ("repeat_kv to a head count that is not a multiple", lambda: repeat_kv(Q[:, :2], 3),
     r"num_heads = 3 is not a multiple of the 2 key/value heads"),
    ("d_model as a float from a config", lambda: MultiHeadSelfAttention(64.0, 8), r"d_model must be a positive int, got 64.0"),
    ("num_heads = True", lambda: MultiHeadSelfAttention(64, True), r"num_heads must be a positive int, got True"),
    ("a head count that does not divide d_model", lambda: MultiHeadSelfAttention(64, 6),
     r"d_model = 64 is not divisible by num_heads = 6"),
    ("a causal mask length given as a float", lambda: causal_mask(5.0), r"S must be an int >= 0, got 5.0"),
    ("a KV-cache causal mask with fewer keys than queries", lambda: causal_mask(4, S_k=2), r"S_k must be an int >= 4, got 2"),
    ("the NumPy twin with a wrong projection shape", lambda: numpy_mha(np.zeros((1, 3, 8)), *[np.eye(8)] * 3, np.eye(4), 2),
     r"w_o must be \[D, D\] = \(8, 8\), got \(4, 4\)"),
    ("integer scores into the NumPy softmax", lambda: numpy_softmax(np.array([1, 2, 3], dtype=np.int64)),
     r"scores must be a floating-point array, got dtype int64"),
    ("the NumPy twin with zero heads", lambda: numpy_mha(np.zeros((1, 3, 8)), *[np.eye(8)] * 4, 0),
     r"num_heads must be a positive int, got 0"),
    ("bytes per number given as a float", lambda: kv_cache_bytes(32, 32, 128, dtype_bytes=2.0),
     r"dtype_bytes must be a positive int, got 2.0"),
    ("a device given as a number", lambda: get_device(1.5), r"prefer must be a device string such as 'cpu' or 'cuda:0', got float"),
    ("a device name PyTorch does not know", lambda: get_device("gpu"), r"unknown device 'gpu'"),
    ("keys and values of different lengths appended to a KVCache", lambda: KVCache().update(Q[:, :, :3], V),
     r"keys and values must share B, H_kv, S_new, dtype and device, got \['\(2, 8, 3, 4\) torch.float32 cpu', '\(2, 8, 5, 4\) torch.float32 cpu'\]"),
    ("a latent width of zero", lambda: MultiHeadLatentAttention(16, 4, latent_dim=0), r"latent_dim must be a positive int, got 0"),
    # --- the paged cache (one sequence per cache, [H_kv, S, D_k] without a batch axis)
    ("a block size of zero", lambda: BlockPool(8, 0, 2, 4), r"block_size must be a positive int, got 0"),
    ("releasing a block that was never allocated", lambda: BlockPool(8, 4, 2, 4).release(3),
     r"cannot release block 3: it is free \(never allocated, or released by every holder\)"),
    ("one key/value head appended to a pool of two", lambda: PagedKVCache(POOL).append(torch.randn(1, 5, 4), torch.randn(1, 5, 4)),
     r"k and v have shape \(1, 5, 4\) but the pool holds \[H_kv, S_new, D_k\] = \[2, S_new, 4\]"),
    ("a batch of two sequences in one paged cache", lambda: PagedKVCache(POOL).update(torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)),
     r"k has batch B = 2 \(shape \(2, 2, 5, 4\)\) but a paged cache holds one sequence: use one PagedKVCache per sequence"),
    ("a [B, H, S, D_k] query into paged attention", lambda: paged_attention(torch.randn(1, 4, 1, 4), PagedKVCache(POOL)),
     r"q must be \[H, S_new, D_k\] with H a multiple of H_kv = 2 and D_k = 4 \(3 dims\), got shape \(1, 4, 1, 4\)"),
    ("two new positions into the in-place decode kernel", lambda: paged_attention_in_place(torch.randn(4, 2, 4), PagedKVCache(POOL)),
     r"q shape \(4, 2, 4\) does not fit: expected \[H, 1, D_k\] with H a multiple of H_kv = 2 and D_k = 4"),
]


@pytest.mark.parametrize("call, message", [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_mistake_gets_a_clear_value_error(call: Callable[[], object], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTNLIB_DEVICE", raising=False)
    with pytest.raises(ValueError, match=message):
        call()


def test_no_error_message_suggests_mask_bool() -> None:
    """``mask.bool()`` turns an additive mask (0 = keep) upside down: True where it was hidden."""
    additive = torch.tensor([[0.0, float("-inf")]])
    assert additive.bool().tolist() == [[False, True]]  # the inversion the old hint led to
    with pytest.raises(ValueError) as err:
        scaled_dot_product_attention(Q, K, V, additive)
    assert ".bool()" not in str(err.value) and "from_additive_mask" in str(err.value)


WARNED: list[tuple[str, Callable[[], object], str]] = [
    ("nn.MultiheadAttention's key_padding_mask (True = ignore) as the module's attention_mask",
     lambda: LAYER(X, AM == 0), r"padding_mask: sequence\(s\) \[1\] have no key left to attend to.*from_key_padding_mask"),
    ("the same mistake through padding_mask", lambda: padding_mask(AM == 0), r"sequence\(s\) \[1\]"),
    ("a 1/0 Hugging Face mask given to from_key_padding_mask", lambda: from_key_padding_mask(AM.bool()),
     r"from_key_padding_mask: sequence\(s\) \[1\]"),
]


@pytest.mark.parametrize("call, message", [m[1:] for m in WARNED], ids=[m[0] for m in WARNED])
def test_inverted_padding_mask_is_announced(call: Callable[[], object], message: str) -> None:
    with pytest.warns(UserWarning, match=message):
        call()


def test_every_public_callable_appears_in_a_mistake_or_is_exempt() -> None:
    """Keeps the table growing with the API: a new public function needs a misuse line here."""
    exempt = {"AttentionOutput", "AttentionResult", "flash_attention"}  # results; flash has tests/test_flash.py
    used = {name for m in MISTAKES + WARNED for name in m[1].__code__.co_names}
    missing = [n for n in attnlib.__all__ if n not in exempt and n not in used]
    assert not missing, f"no misuse case for {missing}"
