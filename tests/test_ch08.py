"""The chapter 8 checkers accept right answers and name the usual mistakes; its counts and slider are exact."""

from __future__ import annotations

import pytest
import torch

from attnbook.ch08 import (
    _TILE_MISTAKES,
    check_online_softmax_update,
    check_tile_weights,
    causal_tile_counts,
    fused_forward_io,
    reference_online_update,
    reference_tile_weights,
    tile_frame,
    TILE_FMT,
    TILE_LEGEND,
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


# --- the tile-schedule slider ------------------------------------------------------------------


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


# --- the quiz: every reasonable rounding of a right answer is right --------------------------------


def _numeric_questions() -> list:
    from attnbook.quiz import load_quiz

    return [(n, q) for n, q in enumerate(load_quiz("08_attention_cost_and_tiling"), 1) if q["type"] == "numeric"]


@pytest.mark.parametrize("number, question", _numeric_questions(), ids=lambda x: str(x) if isinstance(x, int) else "")
def test_quiz_accepts_every_rounding_of_the_right_answer(number: int, question: dict) -> None:
    from test_attnbook import _grade

    exact = {1: 384, 5: 6144}[number]  # worked out by hand
    assert _grade(question, repr(exact))[0], question["question"]
    digits = 2 if exact != round(exact) else len(str(round(exact)))
    for d in range(digits, 7):
        typed = f"{exact:.{d}g}"
        ok, feedback = _grade(question, typed)
        assert ok, (typed, feedback)


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




def test_rescaling_after_adding_and_an_inverted_factor_get_their_own_hints() -> None:
    """Two mistakes a reader makes in the online update: rescale the sums after adding the tile, and
    exp(m_new - m_old) for exp(m_old - m_new)."""
    from attnbook.ch08 import check_online_softmax_update

    def after(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
        return m_new, (l + p.sum(-1, keepdim=True)) * alpha, (acc + p @ v) * alpha

    def inverted(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, alpha = torch.exp(s - m_new), torch.exp(m_new - m)
        return m_new, l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v

    fb = check_online_softmax_update(after)
    assert fb.status == "wrong" and "after adding" in fb.message, fb
    fb = check_online_softmax_update(inverted)
    assert fb.status == "wrong" and "upside down" in fb.message, fb


# --- learner probe: the new tile rescaled too, the tile's own max, results cast down -------------


@pytest.mark.parametrize("form", ["rescale after adding", "both terms rescaled"])
def test_online_update_rescaling_the_new_tile_too_is_named(form) -> None:
    def fn(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
        acc_new = (acc + p @ v) * alpha if form == "rescale after adding" else acc * alpha + alpha * (p @ v)
        return m_new, l * alpha + p.sum(-1, keepdim=True), acc_new

    fb = check_online_softmax_update(fn)
    assert fb.status == "wrong"
    assert "new tile's exp(s - m_new) @ v by the rescale factor" in fb.message, fb
    assert "Only the old acc" in fb.message


def test_online_update_new_tile_rescaled_on_the_second_tile_only_is_named() -> None:
    """A version right on the first tile (alpha = 0 there, special-cased) still gets the hint on the second."""

    def fn(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
        if torch.isinf(m).all():
            return m_new, p.sum(-1, keepdim=True), p @ v
        return m_new, l * alpha + p.sum(-1, keepdim=True), (acc + p @ v) * alpha

    fb = check_online_softmax_update(fn)
    assert fb.status == "wrong" and "Only the old acc" in fb.message, fb


def test_tile_weights_against_the_tiles_own_max_is_named() -> None:
    fb = check_tile_weights(lambda s, lse: torch.exp(s - s.amax(dim=-1, keepdim=True)))
    assert fb.status == "wrong"
    assert "tile's own row maximum" in fb.message and "exp(s - lse[:, None])" in fb.message, fb


def test_tile_weights_cast_down_to_float32_is_refused_with_a_dtype_hint() -> None:
    """Case 1 is float64: a right answer returned as float32 equals the reference to 1e-5, but not in dtype."""
    fb = check_tile_weights(lambda s, lse: torch.exp(s - lse[:, None]).float())
    assert fb.status == "wrong"
    assert "torch.float32, but the inputs are torch.float64" in fb.message and "cast" in fb.message, fb


def test_tile_weights_in_float64_from_float32_inputs_is_accepted() -> None:
    assert check_tile_weights(lambda s, lse: torch.exp(s.double() - lse.double()[:, None])).passed


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_tile_weights_computed_in_16_bit_are_named(dtype) -> None:
    """A reader who computes in 16 bits (inputs cast down first) is told the dtype, not a mistake's hint."""
    fb = check_tile_weights(lambda s, lse: torch.exp(s.to(dtype) - lse.to(dtype)[:, None]))
    assert fb.status == "wrong"
    assert str(dtype) in fb.message and "significant digits" in fb.message, fb


@pytest.mark.parametrize("cast", ["float32", "float16", "bfloat16"])
def test_online_update_cast_down_is_refused_and_named(cast) -> None:
    dtype = getattr(torch, cast)

    def fn(m, l, acc, s, v):
        return tuple(t.to(dtype) for t in reference_online_update(m, l, acc, s, v))

    fb = check_online_softmax_update(fn)
    assert fb.status == "wrong"
    assert f"torch.{cast}" in fb.message, fb
    if cast == "float32":  # case 0 is float64: the float32 copy is right to 1e-5, but cast down
        assert "but the inputs are torch.float64" in fb.message
    else:
        assert "significant digits" in fb.message


def test_online_update_in_float64_from_float32_inputs_is_accepted() -> None:
    def fn(m, l, acc, s, v):
        return reference_online_update(*(t.double() for t in (m, l, acc, s, v)))

    assert check_online_softmax_update(fn).passed


def test_narrowed_dtype_leaves_wrong_values_to_the_mistake_tables() -> None:
    from attnbook.ch08 import narrowed_dtype

    ref = torch.tensor([[0.25, 1.5]], dtype=torch.float64)
    assert narrowed_dtype("out", (ref * 2).float(), ref) is None
    assert narrowed_dtype("out", ref.float(), ref) is not None
    assert narrowed_dtype("out", ref.double(), ref.float()) is None


def test_tile_weights_checks_a_float16_tile_and_accepts_a_right_float16_answer() -> None:
    """A float16 case (scores as a fused kernel holds them): the right answer computed in float16 passes,
    and the verdict says float16 was checked to its precision; a mistake still fails there."""
    from attnbook.ch08 import _tile_case, _tile_one

    s, lse, _, rows, cols = _tile_case(2)
    assert s.dtype == lse.dtype == torch.float16
    seen = []

    def right(s_tile, lse):
        seen.append(s_tile.dtype)
        out = torch.exp(s_tile - lse[:, None])
        assert out.dtype == s_tile.dtype
        return out

    fb = check_tile_weights(right)
    assert fb.passed and "float16" in fb.message, fb
    assert torch.float16 in seen
    assert _tile_one(lambda s_tile, lse: torch.exp(s_tile.float() - lse.float()[:, None]), 2) is None  # wider: fine
    fb = _tile_one(lambda s_tile, lse: torch.exp(s_tile - s_tile.amax(-1, keepdim=True)), 2)
    assert fb is not None and fb.status == "wrong" and "tile's own row maximum" in fb.message, fb
    fb = _tile_one(lambda s_tile, lse: torch.exp(s_tile - lse[:, None]) * 1.05, 2)  # 5% off: beyond float16's error
    assert fb is not None and fb.status == "wrong", fb


def test_online_update_without_the_max_subtracted_overflows_and_is_named() -> None:
    # exp(s), then a rescale by exp(-m_new): right in exact arithmetic, inf at scores near 800
    def no_max(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s)
        scale = torch.exp(m) * torch.exp(-m_new)
        down = torch.exp(-m_new)
        return m_new, l * scale + p.sum(-1, keepdim=True) * down, acc * scale + (p @ v) * down

    fb = check_online_softmax_update(no_max)
    assert fb.status == "wrong" and "subtracting the maximum" in fb.message, fb


def test_online_update_cast_to_float64_inside_is_told_the_dtype() -> None:
    def widened(m, l, acc, s, v):
        s = s.double()
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        alpha = torch.exp(m - m_new)
        return m_new, l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v

    fb = check_online_softmax_update(widened)
    assert fb.status == "wrong" and "inputs' dtype" in fb.message, fb


def test_time_projections_and_cores_prints_each_size_and_grows_with_s(capsys: pytest.CaptureFixture[str]) -> None:
    import re

    from attnbook.ch08 import time_projections_and_cores

    sizes = [32, 64, 128, 512]
    peak, times, mem = time_projections_and_cores(sizes, 64, 4)
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"one \[1024, 1024\] @ \[1024, 1024\] matmul, float32: ~\d+ GFLOP/s", lines[0]) and peak > 0
    names = ["projections", "attnlib core", "torch.softmax core", "SDPA core"]
    assert list(times) == names and all(len(t) == len(sizes) for t in times.values()) and len(mem) == len(sizes)
    for line, S in zip(lines[1:5], sizes):
        assert re.fullmatch(rf"S = {S:>4} \({S / 64:.2f} D\): " + ", ".join(rf"{n} ~\d+\.\d\d ms" for n in names)
                            + r" \| attnlib core peak extra memory (~\d+ MiB|n/a)", line), line
    assert re.fullmatch(r"growth from S = 512 to 512: projections ~\d+\.\dx \(FLOPs 1x\), attnlib core ~\d+\.\dx \(FLOPs 1x\)", lines[5])
    # CPU time of one thread: the S^2 core at S = 512 does 256x the work of S = 32; 4x holds on a busy machine
    assert times["attnlib core"][3] > 4 * times["attnlib core"][0]
