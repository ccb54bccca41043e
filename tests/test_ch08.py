"""The chapter 8 checkers accept right answers and name the usual mistakes."""

from __future__ import annotations

import torch

from attnbook.ch08 import (
    check_kv_cache_size,
    check_online_softmax_update,
    reference_kv_cache_size,
    reference_online_update,
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
