"""The chapter 8 checkers accept right answers and name the usual mistakes."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook.ch08 import (
    _MERGE_MISTAKES,
    _TILE_MISTAKES,
    check_merge_partials,
    check_online_softmax_update,
    check_tile_weights,
    causal_tile_counts,
    flash_v1_io,
    fused_forward_io,
    reference_merge_partials,
    reference_online_update,
    reference_tile_weights,
    standard_attention_io,
    tile_frame,
    TILE_FMT,
    TILE_LEGEND,
    loop_order_figure,
    TRITON_INTERPRETER_RUN,
    GPUS,
    exp_per_s,
    lazy_online_softmax,
    tile_grid_html,
    steady_median_ms,
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
    # M = 16 numbers: B_c = ceil(16 / 8) = 2, T_c = 4 key blocks; O, l, m initialised first (N d + 2N)
    assert flash_v1_io(N, d, 16) == (8 * 2 + 2 * 8) + 2 * 8 * 2 + 4 * (3 * 8 * 2 + 4 * 8)
    assert flash_v1_io(N, d, block_k=2) == flash_v1_io(N, d, 16)
    assert flash_v1_io(N, d, block_k=8) == (8 * 2 + 2 * 8) + 2 * 8 * 2 + 1 * (3 * 8 * 2 + 4 * 8)


def test_io_grows_like_n_squared_d_squared_over_m() -> None:
    """Theta(N^2 d^2 / M): doubling N quadruples it, doubling M about halves it."""
    a, b, c = flash_v1_io(4096, 64, 2**14), flash_v1_io(8192, 64, 2**14), flash_v1_io(4096, 64, 2**15)
    assert 3.9 < b / a < 4.1 and 1.9 < a / c < 2.1


def test_tile_frame_counts_the_causal_tiles() -> None:
    frame = tile_frame(256)  # S = 1024: 4 x 4 tiles, 10 computed, 4 on the diagonal
    assert frame.caption.startswith("10 of 16 tiles computed (4 on the diagonal)")
    assert int(frame.panels[0].masked.sum()) == 6


def test_tile_frame_intensity_counts_the_computed_tiles() -> None:
    """At block 512 three tiles run: 1.5x the useful causal FLOPs, and the caption divides those by the bytes."""
    S, d, block = 1024, 64, 512
    computed = 3 * 4 * block * block * d
    assert computed == 1.5 * 4 * d * S * S / 2
    caption = tile_frame(block, S, d).caption
    assert f"about {computed / (2 * fused_forward_io(S, d, block, causal=True)):.0f}." in caption
    # FlashAttention-2's order: about block FLOPs per float16 byte, whatever d is, once K/V re-reads dominate
    for d_ in (64, 128):
        flops = 4 * 8192 * 8192 * d_
        assert abs(flops / (2 * fused_forward_io(8192, d_, 128)) / 128 - 1) < 0.05


def test_loop_order_figure_shows_both_orders() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = loop_order_figure()
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["FlashAttention-1: key blocks outside", "FlashAttention-2: query blocks outside"]
    # FA-1 numbers down the columns, FA-2 along the rows: tile (row 0, column 1) is step 5 and step 2
    steps = [[t.get_text() for t in ax.texts][:16] for ax in fig.axes]
    assert steps[0][1] == "5" and steps[1][1] == "2"
    plt.close(fig)


def test_flash_v1_io_needs_exactly_one_block_rule() -> None:
    with pytest.raises(ValueError, match="exactly one of M and block_k"):
        flash_v1_io(64, 8)
    with pytest.raises(ValueError, match="exactly one of M and block_k"):
        flash_v1_io(64, 8, 256, block_k=8)


@pytest.mark.parametrize("N, d", [(4096, 64), (2048, 128), (1000, 40)])
@pytest.mark.parametrize("block", [32, 64, 128, 328])
def test_fa2_order_moves_about_a_third_less_at_equal_blocks(N: int, d: int, block: int) -> None:
    """Per block, FA-1's order streams Q in and O in and out (3Nd), FA-2's streams K and V in (2Nd)."""
    ratio = flash_v1_io(N, d, block_k=block) / fused_forward_io(N, d, block)
    assert 1.4 < ratio < 1.6


def test_exp_throughput_from_the_datasheet_numbers() -> None:
    a100, h100 = GPUS["A100 SXM4 80GB"], GPUS["H100 SXM5 80GB"]
    assert exp_per_s(a100) == 108 * 16 * 1.41e9
    # the boost clocks are the ones at which the tensor cores give the datasheet's dense fp16 rate
    assert abs(a100["fp16_flops"] / (108 * 2048 * a100["boost_hz"]) - 1) < 0.01  # 1024 FMA per clock per SM
    assert abs(h100["fp16_flops"] / (132 * 4096 * h100["boost_hz"]) - 1) < 0.01  # 2048 FMA per clock per SM
    # with d = 64 an H100 spends as long on the N^2 exponentials as on the 4 N^2 d matmul FLOPs
    assert abs((4 * 64 / h100["fp16_flops"]) / (1 / exp_per_s(h100)) - 1) < 0.01


@pytest.mark.parametrize("seed, S_q, S_k, block", [(0, 5, 64, 16), (1, 7, 100, 32), (2, 3, 33, 8)])
def test_lazy_online_softmax_equals_softmax(seed: int, S_q: int, S_k: int, block: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(S_q, S_k, generator=gen, dtype=torch.float64) * 3 + torch.linspace(0, 30, S_k, dtype=torch.float64)
    v = torch.randn(S_k, 4, generator=gen, dtype=torch.float64)
    for threshold in (0.0, 2.0, 8.0, 100.0):
        out, lazy, exact = lazy_online_softmax(s, v, block, threshold)
        torch.testing.assert_close(out, torch.softmax(s, dim=-1) @ v)
        assert 0 <= lazy <= exact
    # threshold 0: rescale whenever the maximum grows, like the exact online softmax
    assert lazy_online_softmax(s, v, block, 0.0)[1] == lazy_online_softmax(s, v, block, 0.0)[2]
    assert lazy_online_softmax(s, v, block, 100.0)[1] == 0  # never moves: exp(s - m) stays below e^100


def test_lazy_online_softmax_stays_finite_in_float32() -> None:
    s = torch.linspace(0, 80, 256).repeat(2, 1)  # exp(80) overflows float32 without a moving reference
    v = torch.ones(256, 3)
    out, lazy, exact = lazy_online_softmax(s, v, block=16, threshold=8.0)
    assert torch.isfinite(out).all() and lazy > 0 and lazy < exact
    torch.testing.assert_close(out, torch.ones(2, 3))


def test_live_and_static_tile_grids_format_alike() -> None:
    import re

    from attnbook.slider import static_slider, unpack_slider_data

    live = tile_grid_html(128).data
    static = static_slider(tile_frame, [dict(block=128)], slider_label="block", title="t", alt="a", fmt=TILE_FMT).data
    values = unpack_slider_data(static)["f"][0]["p"][0]["v"]
    assert set(values) == {"", "1", "2"}
    assert ">2<" in live and ">1<" in live and "2.00" not in live
    assert TILE_LEGEND in live and TILE_LEGEND in static
    assert re.search(r"HBM traffic per head", live)


def test_stored_triton_run_matches_a_real_interpreter_run() -> None:
    """The lines shown to readers without Triton are what the interpreter really prints."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[1]
    code = "from attnbook.ch08 import triton_demo_lines; print(repr(tuple(triton_demo_lines('cpu'))))"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr(TRITON_INTERPRETER_RUN)


def test_steady_median_ms_uses_one_thread_and_restores_the_setting() -> None:
    before = torch.get_num_threads()
    seen = []
    ms = steady_median_ms({"a": lambda: seen.append(torch.get_num_threads()), "b": lambda: sum(range(20000))},
                          repeats=3, warmup=1)
    assert set(ms) == {"a", "b"} and all(v >= 0 for v in ms.values())
    assert seen and set(seen) == {1} and torch.get_num_threads() == before
    assert ms["b"] > ms["a"]  # CPU time of real work exceeds that of an append


def test_steady_median_ms_restores_threads_when_a_call_fails() -> None:
    before = torch.get_num_threads()
    with pytest.raises(ZeroDivisionError):
        steady_median_ms({"bad": lambda: 1 / 0}, repeats=1)
    assert torch.get_num_threads() == before


def test_review_items_of_chapter_8_checkers() -> None:
    """Review items ch8 #20, #21: no traceback, overflow-prone forms fail."""
    from attnbook.ch08 import check_tile_weights

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


def test_merge_names_an_overflowed_lse_and_wrong_types_or_shapes() -> None:
    def naive_lse(oa, la, ob, lb):  # finite out (weights 0) once lse is inf: the lse must be checked first
        lse = torch.log(torch.exp(la) + torch.exp(lb))
        return torch.exp(la - lse)[..., None] * oa + torch.exp(lb - lse)[..., None] * ob, lse

    fb = check_merge_partials(naive_lse)
    assert fb.status == "wrong" and "lse overflows" in fb.message and "torch.logaddexp" in fb.message, fb
    fb = check_merge_partials(lambda *p: (reference_merge_partials(*p)[0], reference_merge_partials(*p)[1][..., None]))
    assert "lse has shape" in fb.message and "differs" not in fb.message, fb
    fb = check_merge_partials(lambda *p: (reference_merge_partials(*p)[0].numpy(), reference_merge_partials(*p)[1]))
    assert "torch.Tensor" in fb.message and "differs" not in fb.message, fb


def test_merge_tries_scores_near_300_in_float32() -> None:
    from attnbook.ch08 import MERGE_CASES, _merge_case

    assert any(c[6] == 300.0 and c[7] == torch.float32 for c in MERGE_CASES)
    parts = _merge_case(next(i for i, c in enumerate(MERGE_CASES) if c[6] == 300.0))[0]
    assert 250 < float(parts[1].min()) and float(parts[1].max()) < 350
    assert not torch.isfinite(torch.exp(parts[1])).all()  # exp(lse) overflows float32 there


def test_tile_weights_name_the_type_and_the_dtype() -> None:
    import numpy as np

    from attnbook.ch08 import check_tile_weights

    right = lambda s, lse: torch.exp(s - lse[:, None])  # noqa: E731
    for wrong_type in (lambda s, lse: right(s, lse).tolist(), lambda s, lse: np.float64(0.5), lambda s, lse: right(s, lse).numpy()):
        fb = check_tile_weights(wrong_type)
        assert "torch.Tensor" in fb.message and "differ" not in fb.message, fb
    fb = check_tile_weights(lambda s, lse: right(s, lse).half())
    assert fb.status == "wrong" and "float16" in fb.message and "differ" not in fb.message, fb


def test_online_update_names_a_stale_maximum_and_an_infinite_first_tile() -> None:
    from attnbook.ch08 import check_online_softmax_update

    def stale(m, l, acc, s, v):  # keeps the first tile's maximum for ever
        m_new = m if torch.isfinite(m).all() else s.amax(-1, keepdim=True)
        p, a = torch.exp(s - m_new), torch.exp(m - m_new)
        return m_new, l * a + p.sum(-1, keepdim=True), acc * a + p @ v

    fb = check_online_softmax_update(stale)
    assert "running maximum" in fb.message and "max(m_old, tile max)" in fb.message, fb

    def tile_max_only(m, l, acc, s, v):
        m_new = s.amax(-1, keepdim=True)
        p, a = torch.exp(s - m_new), torch.exp(m - m_new)
        return m_new, l * a + p.sum(-1, keepdim=True), acc * a + p @ v

    assert "tile max alone" in check_online_softmax_update(tile_max_only).message

    def against_old(m, l, acc, s, v):  # exp(s - m_old) with m_old = -inf on the first tile
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, a = torch.exp(s - m), torch.exp(m - m_new)
        return m_new, l * a + p.sum(-1, keepdim=True), acc * a + p @ v

    fb = check_online_softmax_update(against_old)
    assert "inf" in fb.message and "-inf - (-inf)" not in fb.message, fb


# --- a right answer in half precision is named as such ------------------------------------------


def _online_in(dtype: torch.dtype):
    def update(m, l, acc, s, v):
        m_new, l_new, acc_new = reference_online_update(m, l, acc, s, v)
        return m_new.to(dtype), l_new.to(dtype), acc_new.to(dtype)
    return update


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_online_update_returned_in_half_precision_is_told_its_dtype(dtype: torch.dtype) -> None:
    fb = check_online_softmax_update(_online_in(dtype))
    assert fb.status == "wrong" and str(dtype) in fb.message and "larger of" not in fb.message, fb

    def acc_only(m, l, acc, s, v):  # only the running output is rounded
        m_new, l_new, acc_new = reference_online_update(m, l, acc, s, v)
        return m_new, l_new, acc_new.to(dtype)

    fb = check_online_softmax_update(acc_only)
    assert fb.status == "wrong" and fb.message.startswith("acc_new is " + str(dtype)), fb


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_merge_returned_in_half_precision_is_told_its_dtype(dtype: torch.dtype) -> None:
    fb = check_merge_partials(lambda *p: tuple(t.to(dtype) for t in reference_merge_partials(*p)))
    assert fb.status == "wrong" and str(dtype) in fb.message and "differs" not in fb.message, fb
    fb = check_merge_partials(lambda *p: (reference_merge_partials(*p)[0].to(dtype), reference_merge_partials(*p)[1]))
    assert fb.status == "wrong" and fb.message.startswith("out is " + str(dtype)), fb


def test_a_wrong_answer_in_half_precision_still_gets_its_own_hint() -> None:
    """The dtype hint is for right answers only: a known mistake rounded to float16 keeps its hint."""
    fb = check_tile_weights(lambda s, lse: torch.softmax(s, dim=-1).half())
    assert "whole row's denominator" in fb.message, fb
    fb = check_merge_partials(lambda oa, la, ob, lb: (((oa + ob) / 2).half(), torch.logaddexp(la, lb)))
    assert "not worth the same" in fb.message, fb


# --- the tiles of a causal pass -----------------------------------------------------------------


@pytest.mark.parametrize("S, bq, bk", [(2048, 256, 256), (1000, 128, 96), (300, 64, 128), (50, 16, 16), (7, 8, 3)])
def test_causal_tile_counts_match_a_brute_force_count_and_attnlib(S: int, bq: int, bk: int) -> None:
    from attnlib.flash import _blocks, _sees, _mask_future

    c = causal_tile_counts(S, bq, bk)
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    computed = masked_tiles = scores = masked = 0
    for rows in _blocks(S, bq):  # attnlib's own walk
        for cols in _blocks(S, bk):
            if not _sees(rows, cols, True, 0):
                continue
            tile = torch.zeros(rows.stop - rows.start, cols.stop - cols.start)
            _mask_future(tile, rows, cols, True, 0)
            computed, scores = computed + 1, scores + tile.numel()
            hidden = int(torch.isinf(tile).sum())
            masked_tiles, masked = masked_tiles + (hidden > 0), masked + hidden
            assert hidden == int((j[:, cols] > i[rows]).sum())
    assert c == dict(tiles=len(_blocks(S, bq)) * len(_blocks(S, bk)), computed=computed, masked_tiles=masked_tiles,
                     scores=scores, masked_scores=masked)
    assert scores - masked == S * (S + 1) // 2  # every visible score is computed exactly once


def test_causal_tile_counts_at_the_chapters_length() -> None:
    c = causal_tile_counts(2048, 256, 256)
    assert (c["computed"], c["tiles"], c["scores"], c["masked_tiles"], c["masked_scores"]) == (36, 64, 2_359_296, 8, 261_120)
    assert c["masked_scores"] == 8 * 256 * 255 // 2


# --- the Triton demo's float32 check ------------------------------------------------------------


def test_full_float32_matmuls_turns_tf32_off_and_restores_it() -> None:
    from attnbook.ch08 import full_float32_matmuls

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        with full_float32_matmuls():
            assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        with pytest.raises(ZeroDivisionError), full_float32_matmuls():
            1 / 0
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_triton_demo_checks_float32_on_cuda_and_only_float32_elsewhere() -> None:
    from attnbook.ch08 import triton_demo_runs

    assert triton_demo_runs("cuda") == [(torch.float16, 2e-3, 2e-3), (torch.float32, 1e-5, 1e-5)]
    assert triton_demo_runs("cpu") == [(torch.float32, 1e-5, 1e-5)]
    assert triton_demo_runs(torch.device("cpu")) == [(torch.float32, 1e-5, 1e-5)]


def _float16_kernel_model(q, k, v, mask):  # type: ignore[no-untyped-def]
    """What the Triton kernel computes in float16, up to float32 rounding: inputs rounded to float16,
    scores in float32, the weights p rounded to float16 before p @ v, the output rounded to float16."""
    q, k, v = (t.half().float() for t in (q, k, v))
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))  # [B, H, S_q, S_k]
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))  # [B, H, S_q, S_k], each row's largest weight is 1
    return ((p.half().float() @ v) / p.sum(dim=-1, keepdim=True)).half().float()  # [B, H, S_q, D_v]


def test_triton_demo_float16_tolerance_covers_the_roundings_and_still_fails_a_wrong_mask() -> None:
    """The demo's float16 check, on its own shape ([1, 2, 50, 32], causal) over many seeds: a model of
    the kernel's three float16 roundings (inputs, p, output) passes it, though the output's rounding
    alone reaches about 1e-3; an answer whose mask lets each query see one key too many fails it."""
    import torch.nn.functional as F

    from attnbook.ch08 import triton_demo_runs
    from attnlib import causal_mask

    (dtype, atol, rtol), _ = triton_demo_runs("cuda")
    assert dtype == torch.float16
    mask, one_too_many = causal_mask(50), causal_mask(50, S_k=51)[:, :50]  # query i sees keys j <= i, j <= i + 1
    for seed in range(100):
        gen = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(1, 2, 50, 32, generator=gen) for _ in range(3))
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [1, 2, 50, 32]
        assert torch.allclose(_float16_kernel_model(q, k, v, mask), ref, atol=atol, rtol=rtol), seed
        assert not torch.allclose(_float16_kernel_model(q, k, v, one_too_many), ref, atol=atol, rtol=rtol), seed


# --- the quiz: every reasonable rounding of a right answer is right --------------------------------


def _numeric_questions() -> list:
    from attnbook.quiz import load_quiz

    return [(n, q) for n, q in enumerate(load_quiz("08_cost_and_flash_attention"), 1) if q["type"] == "numeric"]


@pytest.mark.parametrize("number, question", _numeric_questions(), ids=lambda x: str(x) if isinstance(x, int) else "")
def test_quiz_accepts_every_rounding_of_the_right_answer(number: int, question: dict) -> None:
    from test_attnbook import _grade

    exact = {1: 384, 7: 6144, 8: 1 / (1 + math.exp(-2)), 10: 2}[number]  # worked out by hand
    assert _grade(question, repr(exact))[0], question["question"]
    digits = 2 if exact != round(exact) else len(str(round(exact)))
    for d in range(digits, 7):
        typed = f"{exact:.{d}g}"
        ok, feedback = _grade(question, typed)
        assert ok, (typed, feedback)


def test_quiz_merge_weight_names_the_other_chunk_and_refuses_a_coarse_guess() -> None:
    from test_attnbook import _grade

    question = dict(_numeric_questions())[8]
    for typed in ("0.87", "0.89", "0.75", "0.5", "1"):
        assert not _grade(question, typed)[0], typed
    ok, feedback = _grade(question, "0.9")
    assert not ok and "two significant digits" in feedback, feedback
    ok, feedback = _grade(question, "0.1192")
    assert not ok and "O_b" in feedback, feedback


def test_quiz_merge_weight_as_a_percentage_gets_its_own_hint() -> None:
    from test_attnbook import _grade

    question = dict(_numeric_questions())[8]
    for typed in ("88", "88.08"):
        ok, feedback = _grade(question, typed)
        assert not ok and "percentage" in feedback and "fraction of 1" in feedback, (typed, feedback)
    ok, feedback = _grade(question, "12")
    assert not ok and "O_b" in feedback and "percentage" in feedback, feedback


# --- the online-update checker names the axis and the shape --------------------------------------


def _online_with(m_new_of, sum_of=lambda p: p.sum(dim=-1, keepdim=True), transpose_acc=False):
    def update(m, l, acc, s, v):
        m_new = m_new_of(m, s)
        p = torch.exp(s - m_new)
        alpha = torch.exp(m - m_new)
        acc_new = acc * alpha + p @ v
        return m_new, l * alpha + sum_of(p), acc_new.T if transpose_acc else acc_new
    return update


def _right_max(m, s):
    return torch.maximum(m, s.amax(dim=-1, keepdim=True))


def test_online_update_sum_over_the_wrong_axis_is_named() -> None:
    fb = check_online_softmax_update(_online_with(_right_max, sum_of=lambda p: p.sum(dim=0, keepdim=True)))
    assert fb.status == "wrong" and "l_new has one column per key" in fb.message and "dim=-1" in fb.message, fb.message
    assert "keep dims" not in fb.message


def test_online_update_transposed_acc_is_named() -> None:
    fb = check_online_softmax_update(_online_with(_right_max, transpose_acc=True))
    assert fb.status == "wrong" and "acc_new is transposed" in fb.message and "keepdim" not in fb.message, fb.message


@pytest.mark.parametrize("m_new_of", [lambda m, s: torch.maximum(m, s.amax(0, keepdim=True)),
                                      lambda m, s: torch.maximum(m, s.amax(-1))], ids=["amax over dim 0", "no keepdim"])
def test_online_update_broadcast_errors_name_the_axis_and_keepdim(m_new_of) -> None:
    fb = check_online_softmax_update(_online_with(m_new_of))
    assert fb.status == "wrong" and fb.message.startswith("your code raised RuntimeError"), fb.message
    assert "the last axis" in fb.message and "keepdim=True" in fb.message, fb.message


def test_online_update_missing_keepdim_on_the_sum_is_named() -> None:
    fb = check_online_softmax_update(lambda m, l, acc, s, v: (lambda r: (r[0], r[1].squeeze(-1), r[2]))(
        reference_online_update(m, l, acc, s, v)))
    assert fb.status == "wrong" and "keepdim=True" in fb.message and "l_new" in fb.message, fb.message


# --- the tile-weights checker: its second case, and its wording -----------------------------------


def test_tile_weights_hard_coded_sizes_are_explained() -> None:
    fb = check_tile_weights(lambda s, lse: torch.exp(s - lse.reshape(3, 1)))
    assert fb.status == "wrong" and "[5, 7] tile" in fb.message and "lse[:, None]" in fb.message, fb.message


def test_tile_weights_half_precision_hint_reads_as_english() -> None:
    fb = check_tile_weights(lambda s, lse: torch.exp(s - lse[:, None]).half())
    assert fb.status == "wrong" and fb.message.startswith("your weights tensor is torch.float16"), fb.message


def test_tile_weights_transposed_result_is_named_as_such() -> None:
    for transposed in (lambda s, lse: torch.exp(s.T - lse), lambda s, lse: torch.softmax(s, dim=-1).T):
        fb = check_tile_weights(transposed)
        assert fb.status == "wrong" and "transpose" in fb.message and "lse[:, None]" not in fb.message, fb.message
    fb = check_tile_weights(lambda s, lse: torch.exp(s - lse[:, None]).T)
    assert "the values are right" in fb.message, fb.message


# --- the online-softmax checker: FlashAttention-1's normalised accumulator ------------------------


def _normalised_each_step(m, l, acc, s, v):  # type: ignore[no-untyped-def]
    m_new, l_new, acc_new = reference_online_update(m, l, acc, s, v)
    return m_new, l_new, acc_new / l_new


def _flash_v1_output(m, l, acc, s, v):  # type: ignore[no-untyped-def]  acc holds the normalised output
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
    p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
    l_new = l * alpha + p.sum(dim=-1, keepdim=True)
    return m_new, l_new, (acc * l * alpha + p @ v) / l_new


@pytest.mark.parametrize("fn", [_normalised_each_step, _flash_v1_output], ids=["acc / l_new", "FlashAttention-1"])
def test_online_update_normalised_acc_is_told_that_acc_stays_unnormalised(fn) -> None:
    fb = check_online_softmax_update(fn)
    assert fb.status == "wrong" and "l_new is right" in fb.message and "unnormalised" in fb.message, fb.message
    assert "l_new should be" not in fb.message


def test_online_update_wrong_l_or_acc_on_the_first_tile_names_the_one_that_is_wrong() -> None:
    def wrong_l(m, l, acc, s, v):  # type: ignore[no-untyped-def]
        m_new, l_new, acc_new = reference_online_update(m, l, acc, s, v)
        return m_new, l_new + 1, acc_new

    def wrong_acc(m, l, acc, s, v):  # type: ignore[no-untyped-def]
        m_new, l_new, acc_new = reference_online_update(m, l, acc, s, v)
        return m_new, l_new, acc_new + 1

    assert "l_new should be" in check_online_softmax_update(wrong_l).message
    fb = check_online_softmax_update(wrong_acc)
    assert "l_new is right, but acc_new is not" in fb.message and "unnormalised" not in fb.message, fb.message


def test_merge_exercise_names_both_overflow_cases_of_the_checker() -> None:
    import json
    from pathlib import Path

    from attnbook.ch08 import MERGE_CASES

    cells = json.loads((Path(__file__).resolve().parents[1] / "book" / "08_cost_and_flash_attention.ipynb").read_text())["cells"]
    text = next("".join(c["source"]) for c in cells if ":label: ex-08-merge" in "".join(c["source"]))
    for *_, shift, dtype in MERGE_CASES[1:]:
        assert f"near {shift:.0f} in {str(dtype).removeprefix('torch.')}" in text, (shift, dtype)
