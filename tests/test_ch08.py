"""The chapter 8 checkers accept right answers and name the usual mistakes; its counts and slider are exact."""

from __future__ import annotations

import pytest
import torch

from attnbook.ch08 import (
    _TILE_MISTAKES,
    check_online_softmax_update,
    check_tile_weights,
    causal_tile_counts,
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


def test_tile_frame_counts_the_masked_scores_of_the_diagonal_tiles() -> None:
    """At block 512 three tiles run, 786,432 scores; the causal pairs are 1024 * 1025 / 2, the rest is masked."""
    caption = tile_frame(512).caption
    assert "3 of 4 tiles computed (2 on the diagonal): 786,432 scores" in caption
    assert f"of which {786_432 - 1024 * 1025 // 2:,} (33%) are masked away" in caption
    assert "HBM" not in caption  # traffic belongs to chapter 9, next to its formulas


def test_live_and_static_tile_grids_format_alike() -> None:
    import re

    from attnbook.slider import static_slider, unpack_slider_data

    live = tile_grid_html(128).data
    static = static_slider(tile_frame, [dict(block=128)], slider_label="block", title="t", alt="a", fmt=TILE_FMT).data
    values = unpack_slider_data(static)["f"][0]["p"][0]["v"]
    assert set(values) == {"", "1", "2"}
    assert ">2<" in live and ">1<" in live and "2.00" not in live
    assert TILE_LEGEND in live and TILE_LEGEND in static
    assert re.search(r"scores, of which [\d,]+ \(\d+%\) are masked away", live)


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


# --- findings of the ch08-09 reading: hints that name the step at fault -------------------------

def _online(**change):
    """An online update with one of the reading's slips (none: the right update)."""
    import math

    def f(m, l, acc, s, v):
        if change.get("scaled_again"):
            s = s / math.sqrt(v.shape[-1])
        if change.get("minimum"):
            m_new = torch.minimum(m, s.amin(-1, keepdim=True))
        else:
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = (torch.exp2 if change.get("exp2") else torch.exp)(s - m_new)
        if change.get("softmax"):
            p = torch.softmax(s, -1)
        alpha = torch.exp(m - m_new)
        total = p.sum() if change.get("no_dim") else p.sum(-1, keepdim=True)
        pv = (p[..., None] * v).sum(-1) if change.get("summed_features") else p @ v
        out = (m_new, l * alpha + total, acc * alpha + pv)
        return (out[1], out[0], out[2]) if change.get("order") else out
    return f


@pytest.mark.parametrize("change, words", [
    ("order", "in the order (l_new, m_new, acc_new)"),
    ("scaled_again", "divided the scores by sqrt(d) again"),
    ("summed_features", "the matrix product p @ v"),
    ("softmax", "you normalised the tile"),
    ("exp2", "base 2"),
    ("no_dim", "the sum over the whole tile"),
    ("minimum", "torch.minimum (or amin) keeps -inf"),
])
def test_online_update_slips_of_the_reading_name_their_step(change: str, words: str) -> None:
    fb = check_online_softmax_update(_online(**{change: True}))
    assert fb.status == "wrong" and words in fb.message, fb.message
    assert check_online_softmax_update(_online()).passed


def test_online_update_scalar_idioms_of_section_8_3_are_translated() -> None:
    import math

    def python_max(m, l, acc, s, v):
        m_new = max(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        return m_new, l * torch.exp(m - m_new) + p.sum(-1, keepdim=True), acc * torch.exp(m - m_new) + p @ v

    def math_exp(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, a = torch.exp(s - m_new), math.exp(m - m_new)
        return m_new, l * a + p.sum(-1, keepdim=True), acc * a + p @ v

    def torch_max_pair(m, l, acc, s, v):
        m_new = torch.maximum(m, torch.max(s, -1, keepdim=True))
        p = torch.exp(s - m_new)
        return m_new, l * torch.exp(m - m_new) + p.sum(-1, keepdim=True), acc * torch.exp(m - m_new) + p @ v

    for fn in (python_max, math_exp, torch_max_pair):
        fb = check_online_softmax_update(fn)
        assert fb.status == "wrong" and "torch.maximum(m, s.amax(dim=-1, keepdim=True))" in fb.message, fn.__name__
        assert "torch.exp" in fb.message


@pytest.mark.parametrize("fn, words", [
    (lambda s, lse: torch.exp(s.float() - lse.float()[:, None]).to(s.dtype), "you computed in float32"),
    (lambda s, lse: torch.exp(s.float() - lse.float()[:, None]), "you computed in float32"),
    (lambda s, lse: torch.exp((s - lse[:, None]) / 8), "0.125 times s - lse"),
    (lambda s, lse: torch.exp(s - lse[:, None] - 1), "times e^-1"),
    (lambda s, lse: 2 ** (s - lse[:, None]), "base 2"),
    (lambda s, lse: torch.softmax(s, dim=0), "softmax over dim=0"),
])
def test_tile_weights_slips_of_the_reading_name_their_step(fn, words: str) -> None:
    fb = check_tile_weights(fn)
    assert fb.status == "wrong" and words in fb.message, fb.message


def test_tile_weights_upcasting_only_half_precision_still_passes() -> None:
    def upcast_half(s, lse):
        if s.dtype in (torch.float16, torch.bfloat16):
            return torch.exp(s.float() - lse.float()[:, None])
        return torch.exp(s - lse[:, None])

    assert check_tile_weights(upcast_half).passed


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
        assert re.fullmatch(rf"S = {S:>4} \({S / 64:.2f} D\): " + ", ".join(rf"{n} ~\d+\.\d\d ms" for n in names), line), line
    # exact: the scores, shifted scores, exponentials and weights exist at once, plus [S, 1] row statistics
    assert all(4 * 4 * 4 * S * S <= m <= 4.1 * 4 * 4 * S * S for m, S in zip(mem, sizes))
    assert re.fullmatch(r"growth from S = 512 to 512: projections ~\d+\.\dx \(FLOPs 1x\), attnlib core ~\d+\.\dx \(FLOPs 1x\)", lines[5])
    # CPU time of one thread: the S^2 core at S = 512 does 256x the work of S = 32; 4x holds on a busy machine
    assert times["attnlib core"][3] > 4 * times["attnlib core"][0]


# --- probe-ch08-09: the online step's common mistakes get named hints ---------------------------

def _p_against_tile_max(m, l, acc, s, v):
    tm = s.amax(-1, keepdim=True); m_new = torch.maximum(m, tm); p = torch.exp(s - tm); r = torch.exp(m - m_new)
    return m_new, l * r + p.sum(-1, keepdim=True), acc * r + p @ v


def _rescale_by_tile_max(m, l, acc, s, v):
    tm = s.amax(-1, keepdim=True); m_new = torch.maximum(m, tm); p = torch.exp(s - m_new); r = torch.exp(m - tm)
    return m_new, l * r + p.sum(-1, keepdim=True), acc * r + p @ v


def test_online_step_against_the_tile_max_is_named() -> None:
    fb = check_online_softmax_update(_p_against_tile_max)
    assert fb.status == "wrong" and "exp(s - tile max)" in fb.message and "its own maximum" in fb.message, fb
    fb = check_online_softmax_update(_rescale_by_tile_max)
    assert fb.status == "wrong" and "exp(m_old - tile max)" in fb.message and "exceeds 1" in fb.message, fb


def test_online_step_right_answers_through_the_tile_max_pass() -> None:
    def clamped(m, l, acc, s, v):  # exp(m - tile max) clamped at 1 is exp(m - m_new)
        tm = s.amax(-1, keepdim=True); m_new = torch.maximum(m, tm); p = torch.exp(s - m_new); r = torch.exp(m - tm).clamp(max=1)
        return m_new, l * r + p.sum(-1, keepdim=True), acc * r + p @ v

    def tile_stats(m, l, acc, s, v):  # the tile's own softmax statistics, both moved to m_new
        tm = s.amax(-1, keepdim=True); pt = torch.exp(s - tm)
        m_new = torch.maximum(m, tm); ra = torch.exp(m - m_new); rb = torch.exp(tm - m_new)
        return m_new, ra * l + rb * pt.sum(-1, keepdim=True), ra * acc + rb * (pt @ v)

    assert check_online_softmax_update(clamped).passed
    assert check_online_softmax_update(tile_stats).passed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_online_step_computed_in_half_precision_and_cast_back_is_named(dtype: torch.dtype) -> None:
    def f(m, l, acc, s, v):
        dt = s.dtype; m, l, acc, s, v = [t.to(dtype) for t in (m, l, acc, s, v)]
        m_new = torch.maximum(m, s.amax(-1, keepdim=True)); p = torch.exp(s - m_new); r = torch.exp(m - m_new)
        return m_new.to(dt), (l * r + p.sum(-1, keepdim=True)).to(dt), (acc * r + p @ v).to(dt)

    def g(m, l, acc, s, v):  # the probe's float16 variant: only the exponentials and sums in half
        m_new = torch.maximum(m, s.amax(-1, keepdim=True)); p = torch.exp((s - m_new).half()); r = torch.exp((m - m_new).half())
        return m_new, (l.half() * r + p.sum(-1, keepdim=True)).to(s.dtype), (acc.half() * r + p @ v.half()).to(s.dtype)

    for fn in (f, g) if dtype == torch.float16 else (f,):
        fb = check_online_softmax_update(fn)
        assert fb.status == "wrong" and "significant digits" in fb.message and "float16 or bfloat16" in fb.message, fb
        assert "torch.maximum" not in fb.message


def test_online_step_without_any_rescale_names_l_and_acc() -> None:
    def f(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True)); p = torch.exp(s - m_new)
        return m_new, l + p.sum(-1, keepdim=True), acc + p @ v

    assert check_online_softmax_update(f).message == (
        "you forgot to rescale the running sums l and acc by exp(m_old - m_new) before adding the new tile.")


def test_online_step_with_an_elementwise_max_is_named() -> None:
    def f(m, l, acc, s, v):
        m_new = torch.max(m, s); p = torch.exp(s - m_new); r = torch.exp(m - m_new)
        return m_new, l * r + p.sum(-1, keepdim=True), acc * r + p @ v

    fb = check_online_softmax_update(f)
    assert fb.status == "wrong" and "compares elementwise" in fb.message and "one value per score" in fb.message, fb


# ---- the learner probe of chapters 8-11: its raw errors and generic verdicts, each named ----


def _probe_step(product):
    """An online step whose new tile enters acc through ``product(p, v)``."""
    def f(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True)); p = torch.exp(s - m_new); r = torch.exp(m - m_new)
        return m_new, l * r + p.sum(-1, keepdim=True), acc * r + product(p, v)
    return f


@pytest.mark.parametrize("product", [lambda p, v: v @ p, lambda p, v: p @ v.T])
def test_probe_online_step_with_the_product_in_the_wrong_order_is_translated(product) -> None:
    fb = check_online_softmax_update(_probe_step(product))
    assert fb.status == "wrong" and "shapes cannot be multiplied" in fb.message, fb
    assert "p = exp(s - m_new) is [S_q, S_blk]" in fb.message and "order of the two operands" in fb.message, fb


def test_probe_tile_weights_math_exp_matmul_and_division_are_named() -> None:
    import math

    fb = check_tile_weights(lambda s_tile, lse: math.exp(s_tile - lse[:, None]))
    assert fb.status == "wrong" and "only one element tensors" in fb.message, fb
    assert "`s_tile` and `lse` hold many numbers" in fb.message and "torch.exp" in fb.message, fb
    fb = check_tile_weights(lambda s_tile, lse: torch.exp(s_tile @ lse))
    assert fb.status == "wrong" and "matrix product" in fb.message and "one number per query row, shape [3]" in fb.message, fb
    fb = check_tile_weights(lambda s_tile, lse: s_tile / lse[:, None])
    assert fb.message == ("you divided the scores by lse: lse is a logarithm, the log of the row's whole softmax "
                          "denominator, and a weight is an exponential. Dividing by the denominator is subtracting "
                          "its logarithm inside the exponent."), fb


def test_probe_tile_weights_follow_the_dtype_rule() -> None:
    """The one dtype rule (attnbook.feedback): float32 inside on float64 inputs is refused even when cast back;
    float16 inputs upcast to float32 pass, cast back or not."""
    fb = check_tile_weights(lambda s, lse: torch.exp(s.float() - lse.float()[:, None]).to(s.dtype))
    assert fb.status == "wrong" and "computed in float32" in fb.message and "casting back does not restore" in fb.message, fb
    wide = lambda s, lse: torch.exp(s.float() - lse.float()[:, None]) if s.dtype == torch.float16 else torch.exp(s - lse[:, None])
    assert check_tile_weights(wide).passed
    assert check_tile_weights(lambda s, lse: wide(s, lse).to(s.dtype)).passed


def test_exp_into_fresh_memory_costs_more_than_into_reused(capsys: pytest.CaptureFixture[str]) -> None:
    from attnbook.ch08 import time_exp_fresh_and_reused

    ms = time_exp_fresh_and_reused(8, [1024])
    line = capsys.readouterr().out.strip()
    assert line.startswith("[8, 1024, 1024] float32 (32 MiB): copy ~"), line
    assert set(ms[1024]) == {"copy", "exp, reused", "exp, fresh"}
    assert all(t > 0 for t in ms[1024].values())


# ---- probe 2 ----------------------------------------------------------------------------------

def _probe2_row_total_without_keepdim(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(-1, keepdim=True)); p = torch.exp(s - m_new); r = torch.exp(m - m_new)
    return m_new, l * r + p.sum(-1), acc * r + p @ v


def _probe2_old_sums_dropped(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(-1, keepdim=True)); p = torch.exp(s - m_new)
    return m_new, p.sum(-1, keepdim=True), p @ v


def _probe2_old_l_dropped(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(-1, keepdim=True)); p = torch.exp(s - m_new)
    return m_new, p.sum(-1, keepdim=True), acc * torch.exp(m - m_new) + p @ v


@pytest.mark.parametrize("fn, words, absent", [
    (_probe2_row_total_without_keepdim, "a row total taken without keepdim=True", None),
    (_probe2_old_sums_dropped, "your l_new (and acc_new) hold this tile alone", "l_new = l * exp"),
    (_probe2_old_l_dropped, "the running sum l of the earlier tiles was dropped", "l_new = l * exp"),
    (lambda m, l, acc, s: (m, l, acc), "keep the stub's parameters", None),
])
def test_probe2_online_update_names_keepdim_dropped_sums_and_a_changed_signature(fn, words: str, absent) -> None:
    fb = check_online_softmax_update(fn)
    assert fb.status == "wrong" and words in fb.message, fb
    assert absent is None or absent not in fb.message, fb


def test_quiz_names_6D_typed_for_the_whole_layer_crossover() -> None:
    """'6D' is read as the number 6, the factor of S = 6D: its feedback asks for S itself, not the default."""
    import math as _math

    from attnbook.quiz import load_quiz, read_answer

    question = next(q for q in load_quiz("08_attention_cost_and_tiling") if "(MLP) D -> 4D -> D" in q["question"])
    value, problem = read_answer(question, "6D")
    assert problem is None and value == 6
    matches = [a for a in question["answers"] if a["type"] == "value" and _math.isclose(a["value"], value)]
    assert len(matches) == 1 and not matches[0]["correct"] and "give S" in matches[0]["feedback"]


def test_quiz_speaks_of_main_memory_and_S_before_chapter_9_names_HBM_and_N() -> None:
    from attnbook.quiz import load_quiz

    text = str(load_quiz("08_attention_cost_and_tiling"))
    assert "HBM" not in text and "[N, N]" not in text and "N^2" not in text


def test_tile_weights_names_the_scale_applied_a_second_time() -> None:
    from attnbook.ch08 import check_tile_weights

    fb = check_tile_weights(lambda s, lse: torch.exp(s / 8 - lse[:, None]))
    assert fb.status == "wrong" and "again" in fb.message and "scaled scores" in fb.message, fb


def test_online_update_names_an_elementwise_acc_product_not_the_reductions_of_m_and_l() -> None:
    """m and l right, acc built as (p * v.T).sum(-1, keepdim=True): the hint is about acc's product."""
    from attnbook.ch08 import check_online_softmax_update

    def update(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
        return m_new, l * alpha + p.sum(-1, keepdim=True), acc * alpha + (p * v.T).sum(-1, keepdim=True)

    fb = check_online_softmax_update(update)
    assert fb.status == "wrong" and "m_new and l_new are right" in fb.message and "p @ v" in fb.message, fb
    assert "keepdim" not in fb.message


def test_online_update_float32_inside_cast_back_is_named_float32() -> None:
    """A step computed in float32 on the float64 case and cast back is told float32, not float16 or bfloat16
    (a learner probe's .float() answer was told it had used a 16-bit type)."""

    def fn(m, l, acc, s, v):
        return tuple(t.to(s.dtype) for t in reference_online_update(*(t.float() for t in (m, l, acc, s, v))))

    fb = check_online_softmax_update(fn)
    assert fb.status == "wrong"
    assert "float32" in fb.message and "float16 or bfloat16" not in fb.message, fb


def test_online_update_torch_max_with_two_tensors_and_a_dim_is_translated() -> None:
    """torch.max(m, tile_max, dim=-1) raises a TypeError whose text stops mid-sentence; it is explained."""

    def fn(m, l, acc, s, v):
        torch.max(m, s.amax(-1, keepdim=True), dim=-1)
        return reference_online_update(m, l, acc, s, v)

    fb = check_online_softmax_update(fn)
    assert fb.status == "wrong" and "two tensors and a dim" in fb.message and "torch.maximum" in fb.message, fb


def _probe3_update(p_of, l_add):
    """An online update whose tile weights come from ``p_of(s, m_new)`` and whose running sum adds
    ``l_add(p, m_new)`` (the right update: ``exp(s - m_new)`` and ``p.sum``)."""

    def f(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = p_of(s, m_new)
        alpha = torch.exp(m - m_new)
        return m_new, l * alpha + l_add(p, m_new), acc * alpha + p @ v

    return f


_EXP = lambda s, m_new: torch.exp(s - m_new)  # noqa: E731
_SUM = lambda p, m_new: p.sum(-1, keepdim=True)  # noqa: E731


@pytest.mark.parametrize("fn, words", [
    (_probe3_update(lambda s, m_new: s, _SUM), "the exponential is missing"),
    (_probe3_update(lambda s, m_new: s - m_new, _SUM), "the exponential is missing"),
    (_probe3_update(_EXP, lambda p, m_new: p.amax(-1, keepdim=True)), "you took the largest of the tile's exp(s - m_new)"),
    (_probe3_update(_EXP, lambda p, m_new: m_new), "l_new equals m_new, the running maximum"),
], ids=["raw scores", "scores minus max", "amax for sum", "max for sum"])
def test_probe3_online_update_names_a_missing_exp_and_a_max_where_the_sum_goes(fn, words: str) -> None:
    fb = check_online_softmax_update(fn)
    assert fb.status == "wrong" and words in fb.message, fb.message
    assert "you normalised the tile" not in fb.message
    assert check_online_softmax_update(_probe3_update(_EXP, _SUM)).passed


def test_probe3_online_update_softmax_in_the_tile_is_still_told_it_normalised() -> None:
    def softmax_tile(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.softmax(s, -1)
        alpha = torch.exp(m - m_new)
        return m_new, l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v

    fb = check_online_softmax_update(softmax_tile)
    assert fb.status == "wrong" and "you normalised the tile" in fb.message, fb.message


@pytest.mark.parametrize("fn", [
    lambda s, lse: torch.exp(s - lse.mean()),
    lambda s, lse: torch.exp(s) / torch.exp(lse.mean()),
], ids=["exp(s - lse.mean())", "exp(s) / exp(lse.mean())"])
def test_probe3_tile_weights_averaged_lse_is_named(fn) -> None:
    fb = check_tile_weights(fn)
    assert fb.status == "wrong" and "lse.mean()" in fb.message and "its own logsumexp" in fb.message, fb.message


def test_online_update_rescale_without_exp_is_named() -> None:
    """m_old - m_new used as the factor: NaN on the first tile comes from 0 * (-inf), and the hint says so."""

    def no_exp(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, alpha = torch.exp(s - m_new), m - m_new
        return m_new, l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v

    fb = check_online_softmax_update(no_exp)
    assert fb.status == "wrong" and "no exponential" in fb.message and "0 * (-inf)" in fb.message


def test_tensor_peaks_one_thread_counts_the_tiles_of_every_thread() -> None:
    """On several threads flash_attention's workers make the tiles; counted on one thread, they show."""
    import attnlib
    from attnbook.ch08 import tensor_peaks_one_thread

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 512, 16, generator=gen) for _ in range(3))
    threads = torch.get_num_threads()
    with torch.inference_mode():
        peaks = tensor_peaks_one_thread({"tiled": lambda: attnlib.flash_attention(q, k, v, causal=True, block_q=128, block_k=128)})
    assert torch.get_num_threads() == threads
    # at least the output, the scaled copy of q and one [4, 128, 128] float32 tile
    assert peaks["tiled"] >= 2 * q.nbytes + 4 * 128 * 128 * 4


def test_online_update_returning_the_old_maximum_is_named_not_the_max_call() -> None:
    """m_new computed right but the received m returned: the hint points at the return, not at torch.maximum."""

    def old_m_returned(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
        return m, l * alpha + p.sum(dim=-1, keepdim=True), acc * alpha + p @ v

    fb = check_online_softmax_update(old_m_returned)
    assert fb.status == "wrong" and "l_new and acc_new are right" in fb.message, fb.message
    assert "old running maximum" in fb.message and "torch.maximum" not in fb.message, fb.message

    def minimum(m, l, acc, s, v):  # still -inf because of the wrong reduction: the torch.maximum hint stays
        m_new = torch.minimum(m, s.amax(dim=-1, keepdim=True))
        p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
        return m_new, l * alpha + p.sum(dim=-1, keepdim=True), acc * alpha + p @ v

    fb = check_online_softmax_update(minimum)
    assert fb.status == "wrong" and "m_new is still -inf" in fb.message and "torch.minimum" in fb.message, fb.message


@pytest.mark.parametrize("fn, words", [
    (lambda s, lse: torch.exp(s - lse.sum()), "lse.sum()"),
    (lambda s, lse: torch.exp(s - lse.max()), "lse.max()"),
], ids=["exp(s - lse.sum())", "exp(s - lse.max())"])
def test_tile_weights_one_lse_for_the_whole_tile_is_named(fn, words: str) -> None:
    fb = check_tile_weights(fn)
    assert fb.status == "wrong" and words in fb.message and "its own logsumexp" in fb.message, fb.message


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
def test_tile_weights_computed_low_and_cast_back_is_named(low: torch.dtype) -> None:
    fb = check_tile_weights(lambda s, lse: torch.exp(s.to(low) - lse.to(low)[:, None]).to(s.dtype))
    assert fb.status == "wrong"
    assert f"computed in {str(low)[6:]} and cast back" in fb.message


def test_tile_weights_added_lse_is_named() -> None:
    fb = check_tile_weights(lambda s, lse: torch.exp(s + lse[:, None]))
    assert fb.status == "wrong" and "you added lse" in fb.message


def test_memory_levels_diagram_draws_the_sizes_it_names() -> None:
    from attnbook.ch08 import LEVELS_BYTES, LEVELS_S, memory_levels_diagram
    from attnlib.flash import BLOCK_Q

    d = memory_levels_diagram()
    svg = d.svg()
    full, tile = LEVELS_S * LEVELS_S * LEVELS_BYTES, BLOCK_Q * BLOCK_Q * LEVELS_BYTES
    assert (full, tile) == (64 * 2**20, 256 * 2**10)  # [4096, 4096] and [256, 256] float32 per head
    for text in ("64 MiB", "256 KiB"):
        assert text in svg and text in d.alt
    assert f"[{BLOCK_Q}, {BLOCK_Q}] tile" in svg and f"{BLOCK_Q} \u00d7 {BLOCK_Q} tile" in d.alt


def _tile_on_its_own(m, l, acc, s, v):
    tile_max = s.amax(-1, keepdim=True)
    p = torch.exp(s - tile_max)
    return torch.maximum(m, tile_max), l + p.sum(-1, keepdim=True), acc + p @ v


def _sums_against_tile_max(m, l, acc, s, v):
    tile_max = s.amax(-1, keepdim=True)
    p, alpha = torch.exp(s - tile_max), torch.exp(m - tile_max)
    return torch.maximum(m, tile_max), l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v


@pytest.mark.parametrize("fn, says", [(_tile_on_its_own, "exponentiated against its own maximum, to l and acc as they were"),
                                      (_sums_against_tile_max, "your l and acc are sums against the tile's own maximum")])
def test_online_update_tile_max_mixups_are_named(fn, says: str) -> None:
    fb = check_online_softmax_update(fn)
    assert fb.status == "wrong" and says in fb.message


def test_online_update_product_in_the_other_order_is_named() -> None:
    def other_order(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
        return m_new, l * alpha + p.sum(-1, keepdim=True), acc * alpha + v.T @ p.T

    fb = check_online_softmax_update(other_order)
    assert fb.status == "wrong" and "v.T @ p.T is [D_v, S_q]" in fb.message


def test_online_update_with_only_p_in_float16_names_half_precision() -> None:
    def half_p(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, alpha = torch.exp((s - m_new).half()).to(s.dtype), torch.exp(m - m_new)
        return m_new, l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v

    fb = check_online_softmax_update(half_p)
    assert fb.status == "wrong" and "as if computed in float16 or bfloat16" in fb.message
