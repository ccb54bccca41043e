"""The chapter 8 checkers accept right answers and name the usual mistakes."""

from __future__ import annotations

import pytest
import torch

from attnbook.ch08 import (
    _MERGE_MISTAKES,
    _TILE_MISTAKES,
    check_kv_cache_size,
    check_merge_partials,
    check_online_softmax_update,
    check_tile_weights,
    flash_v1_io,
    fused_forward_io,
    reference_kv_cache_size,
    reference_merge_partials,
    reference_online_update,
    reference_tile_weights,
    standard_attention_io,
    tile_frame,
)


def test_online_update_reference_is_accepted() -> None:
    assert check_online_softmax_update(reference_online_update).status == "correct"


def test_online_update_stub_is_todo() -> None:
    def stub(m, l, acc, s, v):
        raise NotImplementedError

    assert check_online_softmax_update(stub).status == "todo"


def test_online_update_forgot_to_rescale_l() -> None:
    def no_rescale_l(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        alpha = torch.exp(m - m_new)
        return m_new, l + p.sum(-1, keepdim=True), acc * alpha + p @ v

    fb = check_online_softmax_update(no_rescale_l)
    assert fb.status == "wrong" and "rescale the running sum" in fb.message


def test_online_update_forgot_to_rescale_acc() -> None:
    def no_rescale_acc(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        alpha = torch.exp(m - m_new)
        return m_new, l * alpha + p.sum(-1, keepdim=True), acc + p @ v

    fb = check_online_softmax_update(no_rescale_acc)
    assert fb.status == "wrong" and "acc" in fb.message and "exp(m_old - m_new)" in fb.message


def test_online_update_tile_max_only() -> None:
    def tile_max(m, l, acc, s, v):
        m_new = s.amax(-1, keepdim=True)
        p = torch.exp(s - m_new)
        alpha = torch.exp(m - m_new)
        return m_new, l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v

    fb = check_online_softmax_update(tile_max)
    assert fb.status == "wrong" and "torch.maximum" in fb.message


def test_online_update_nan_on_first_tile() -> None:
    def nan_first(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        alpha = torch.exp(m - m)  # -inf - -inf = nan
        return m_new, l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v

    fb = check_online_softmax_update(nan_first)
    assert fb.status == "wrong" and "NaN" in fb.message


def test_online_update_old_max_for_new_tile() -> None:
    def old_max(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        ref = torch.where(torch.isfinite(m), m, m_new)
        p = torch.exp(s - ref)
        alpha = torch.exp(m - m_new)
        return m_new, l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v

    fb = check_online_softmax_update(old_max)
    assert fb.status == "wrong" and "new maximum" in fb.message


def test_kv_reference_is_accepted_and_stub_is_todo() -> None:
    assert check_kv_cache_size(reference_kv_cache_size).status == "correct"

    def stub(*args):
        raise NotImplementedError

    assert check_kv_cache_size(stub).status == "todo"


def test_kv_mistakes_are_named() -> None:
    cases = {
        "counted K but not V": lambda L, H, Hkv, d, b: L * Hkv * d * b,
        "query heads": lambda L, H, Hkv, d, b: 2 * L * H * d * b,
        "multiply by the number of layers": lambda L, H, Hkv, d, b: 2 * Hkv * d * b,
        "bits, not bytes": lambda L, H, Hkv, d, b: 2 * L * Hkv * d * b * 8,
        "multiply by dtype_bytes": lambda L, H, Hkv, d, b: 2 * L * Hkv * d,
    }
    for hint, fn in cases.items():
        fb = check_kv_cache_size(fn)
        assert fb.status == "wrong" and hint in fb.message, (hint, fb)
    assert check_kv_cache_size(lambda *a: 12345).status == "wrong"
    assert check_kv_cache_size(lambda *a: "big").status == "wrong"


# --- the tile-weights exercise (backward pass) -------------------------------------------------

def test_tile_weights_reference_is_accepted() -> None:
    assert check_tile_weights(reference_tile_weights).status == "correct"


def test_tile_weights_stub_is_todo() -> None:
    def stub(s_tile, lse):
        raise NotImplementedError

    assert check_tile_weights(stub).status == "todo"


@pytest.mark.parametrize("mistake", _TILE_MISTAKES, ids=[m.name for m in _TILE_MISTAKES])
def test_tile_weights_mistakes_get_their_hint(mistake) -> None:
    fb = check_tile_weights(mistake.compute)
    assert fb.status == "wrong" and fb.message == mistake.hint


def test_tile_weights_unbroadcast_lse_is_explained() -> None:
    fb = check_tile_weights(lambda s, lse: torch.exp(s - lse))
    assert fb.status == "wrong" and "lse[:, None]" in fb.message


# --- the split-KV merge exercise (Flash-Decoding) ----------------------------------------------

def test_merge_reference_is_accepted() -> None:
    assert check_merge_partials(reference_merge_partials).status == "correct"


@pytest.mark.parametrize("mistake", _MERGE_MISTAKES, ids=[m.name for m in _MERGE_MISTAKES])
def test_merge_mistakes_get_their_hint(mistake) -> None:
    # a reader who weights by key counts hard-codes those of the first case, 12 and 8 of 20 keys
    fb = check_merge_partials(lambda oa, la, ob, lb: (mistake.compute(oa, la, ob, lb, 12, 8), torch.logaddexp(la, lb)))
    assert fb.status == "wrong" and fb.message == mistake.hint


def test_merge_without_subtracting_the_max_overflows_and_is_told() -> None:
    def naive(oa, la, ob, lb):
        ea, eb = torch.exp(la), torch.exp(lb)
        return (ea[..., None] * oa + eb[..., None] * ob) / (ea + eb)[..., None], torch.log(ea + eb)

    fb = check_merge_partials(naive)
    assert fb.status == "wrong" and "overflows" in fb.message


def test_merge_needs_the_lse_back() -> None:
    assert "return two tensors" in check_merge_partials(lambda oa, la, ob, lb: reference_merge_partials(oa, la, ob, lb)[0]).message
    fb = check_merge_partials(lambda oa, la, ob, lb: (reference_merge_partials(oa, la, ob, lb)[0], torch.maximum(la, lb)))
    assert fb.status == "wrong" and "logaddexp" in fb.message


# --- exact IO counts ---------------------------------------------------------------------------

def test_io_counts_by_hand() -> None:
    N, d = 8, 2
    assert standard_attention_io(N, d) == 4 * 8 * 2 + 4 * 64  # 320
    # block 4: two query blocks, each reads all 8 key rows of K and V (2 * 2 numbers per row)
    assert fused_forward_io(N, d, 4) == 2 * 8 * 2 + 8 + 2 * 2 * (8 + 8)
    assert fused_forward_io(N, d, 4, causal=True) == 2 * 8 * 2 + 8 + 2 * 2 * (4 + 8)
    # M = 16 numbers: B_c = ceil(16 / 8) = 2, T_c = 4 key blocks
    assert flash_v1_io(N, d, 16) == 2 * 8 * 2 + 4 * (3 * 8 * 2 + 4 * 8)


def test_io_grows_like_n_squared_d_squared_over_m() -> None:
    """Theta(N^2 d^2 / M): doubling N quadruples it, doubling M about halves it."""
    a, b, c = flash_v1_io(4096, 64, 2**14), flash_v1_io(8192, 64, 2**14), flash_v1_io(4096, 64, 2**15)
    assert 3.9 < b / a < 4.1 and 1.9 < a / c < 2.1


def test_tile_frame_counts_the_causal_tiles() -> None:
    frame = tile_frame(256)  # S = 1024: 4 x 4 tiles, 10 computed, 4 on the diagonal
    assert frame.caption.startswith("10 of 16 tiles computed (4 on the diagonal)")
    assert int(frame.panels[0].masked.sum()) == 6


def test_review_items_of_chapter_8_checkers() -> None:
    """Review items ch8 #19, #20, #21: NumPy counts, no traceback, no revealed answer, overflow-prone forms fail."""
    import numpy as np

    from attnbook.ch08 import check_kv_cache_size, check_tile_weights

    right = lambda L, H, H_kv, d, b: 2 * L * H_kv * d * b  # noqa: E731
    assert check_kv_cache_size(lambda *a: np.prod([2, a[0], a[2], a[3], a[4]])).passed
    assert check_kv_cache_size(lambda *a: torch.tensor(right(*a))).passed
    fb = check_kv_cache_size(lambda *a: torch.tensor([1, 2]))
    assert fb.status == "wrong" and "Traceback" not in fb.message
    fb = check_kv_cache_size(lambda *a: right(*a) + 3)
    assert fb.status == "wrong" and "1920" not in fb.message and "1,920" not in fb.message, fb

    def naive64(oa, la, ob, lb):
        la, lb, oa, ob = la.double(), lb.double(), oa.double(), ob.double()
        ea, eb = torch.exp(la), torch.exp(lb)
        return (ea[..., None] * oa + eb[..., None] * ob) / (ea + eb)[..., None], torch.log(ea + eb)

    assert check_merge_partials(naive64).status == "wrong"
    fb = check_merge_partials(lambda oa, la, ob, lb: (torch.exp(la - torch.logaddexp(la, lb)) * oa, la))
    assert "[..., None]" in fb.message, fb
    fb = check_tile_weights(lambda s, lse: torch.exp(s) / torch.exp(lse)[:, None])
    assert fb.status == "wrong" and "overflow" in fb.message, fb
    fb = check_tile_weights(lambda s, lse: torch.exp(s - lse[:, None]).numpy())
    assert "torch.Tensor" in fb.message and "differ" not in fb.message, fb
