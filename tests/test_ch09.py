"""The chapter 9 counts, figures and Triton demo are exact, and its checkers name the usual mistakes."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook.ch08 import check_tile_weights
from attnbook.ch09 import (
    _MERGE_MISTAKES,
    GPUS,
    TRITON_INTERPRETER_RUN,
    check_merge_partials,
    exp_per_s,
    flash_v1_io,
    fused_forward_io,
    lazy_online_softmax,
    loop_order_figure,
    reference_merge_partials,
    standard_attention_io,
)


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


def test_loop_order_figure_shows_both_orders() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = loop_order_figure()
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["FlashAttention-1: key blocks outside",
                      "FlashAttention-2: query blocks outside,\nrows run in parallel"]
    # FA-1 numbers down the columns, 1 to 16; FA-2 runs its rows in parallel and numbers each row 1 to 4
    steps = [[t.get_text() for t in ax.texts][:16] for ax in fig.axes]
    assert steps[0] == [str(j * 4 + i + 1) for i in range(4) for j in range(4)]
    assert steps[1] == [str(j + 1) for i in range(4) for j in range(4)]
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


def test_stored_triton_run_matches_a_real_interpreter_run() -> None:
    """The lines shown to readers without Triton are what the interpreter really prints."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[1]
    code = "from attnbook.ch09 import triton_demo_lines; print(repr(tuple(triton_demo_lines('cpu'))))"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr(TRITON_INTERPRETER_RUN)


# --- the merge checker: overflow, shapes, dtypes --------------------------------------------------


def test_review_items_of_the_merge_and_tile_checkers() -> None:
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
    from attnbook.ch09 import MERGE_CASES, _merge_case

    assert any(c[6] == 300.0 and c[7] == torch.float32 for c in MERGE_CASES)
    parts = _merge_case(next(i for i, c in enumerate(MERGE_CASES) if c[6] == 300.0))[0]
    assert 250 < float(parts[1].min()) and float(parts[1].max()) < 350
    assert not torch.isfinite(torch.exp(parts[1])).all()  # exp(lse) overflows float32 there


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_merge_returned_in_half_precision_is_told_its_dtype(dtype: torch.dtype) -> None:
    fb = check_merge_partials(lambda *p: tuple(t.to(dtype) for t in reference_merge_partials(*p)))
    assert fb.status == "wrong" and str(dtype) in fb.message and "differs" not in fb.message, fb
    fb = check_merge_partials(lambda *p: (reference_merge_partials(*p)[0].to(dtype), reference_merge_partials(*p)[1]))
    assert fb.status == "wrong" and fb.message.startswith("out is " + str(dtype)), fb


def test_merge_with_upside_down_weights_is_named() -> None:
    def upside_down(oa, la, ob, lb):
        lse = torch.logaddexp(la, lb)
        return torch.exp(lse - la)[..., None] * oa + torch.exp(lse - lb)[..., None] * ob, lse

    fb = check_merge_partials(upside_down)
    assert fb.status == "wrong" and fb.message.startswith("your weights are upside down"), fb
    assert "exp(lse_part - lse_total)" in fb.message


def test_merge_cast_down_to_float32_is_refused_and_float64_from_float32_accepted() -> None:
    """Case 1 is float64: a right answer returned as float32 matches to 1e-4 but throws digits away."""
    fb = check_merge_partials(lambda *p: tuple(t.float() for t in reference_merge_partials(*p)))
    assert fb.status == "wrong" and "torch.float32, but the inputs are torch.float64" in fb.message, fb
    assert check_merge_partials(lambda *p: tuple(t.double() for t in reference_merge_partials(*p))).passed
    assert check_merge_partials(lambda *p: reference_merge_partials(*(t.double() for t in p))).passed


def test_a_wrong_answer_in_half_precision_still_gets_its_own_hint() -> None:
    """The dtype hint is for right answers only: a known mistake rounded to float16 keeps its hint."""
    fb = check_tile_weights(lambda s, lse: torch.softmax(s, dim=-1).half())
    assert "whole row's denominator" in fb.message, fb
    fb = check_merge_partials(lambda oa, la, ob, lb: (((oa + ob) / 2).half(), torch.logaddexp(la, lb)))
    assert "not worth the same" in fb.message, fb


# --- the Triton demo's float32 check ------------------------------------------------------------


def test_full_float32_matmuls_turns_tf32_off_and_restores_it() -> None:
    from attnbook.ch09 import full_float32_matmuls

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


def test_triton_demo_checks_float16_and_float32_on_cuda_and_in_the_interpreter() -> None:
    from attnbook.ch09 import triton_demo_runs

    both = [(torch.float16, 2e-3, 2e-3), (torch.float32, 1e-5, 1e-5)]
    assert triton_demo_runs("cuda") == triton_demo_runs("cpu") == triton_demo_runs(torch.device("cpu")) == both


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

    from attnbook.ch09 import triton_demo_runs
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

    return [(n, q) for n, q in enumerate(load_quiz("09_flash_attention_on_gpus"), 1) if q["type"] == "numeric"]


@pytest.mark.parametrize("number, question", _numeric_questions(), ids=lambda x: str(x) if isinstance(x, int) else "")
def test_quiz_accepts_every_rounding_of_the_right_answer(number: int, question: dict) -> None:
    from test_attnbook import _grade

    from attnbook.ch09 import reference_serial_cap

    h100 = GPUS["H100 SXM5 80GB"]
    exact = {3: 1 / (1 + math.exp(-2)), 5: 2,  # worked out by hand
             6: reference_serial_cap(256, h100["fp16_flops"], exp_per_s(h100))}[number]
    assert _grade(question, repr(exact))[0], question["question"]
    digits = 2 if exact != round(exact) else len(str(round(exact)))
    for d in range(digits, 7):
        typed = f"{exact:.{d}g}"
        ok, feedback = _grade(question, typed)
        assert ok, (typed, feedback)


def test_quiz_merge_weight_names_the_other_chunk_and_refuses_a_coarse_guess() -> None:
    from test_attnbook import _grade

    question = dict(_numeric_questions())[3]
    for typed in ("0.87", "0.89", "0.75", "0.5", "1"):
        assert not _grade(question, typed)[0], typed
    ok, feedback = _grade(question, "0.9")
    assert not ok and "two significant digits" in feedback, feedback
    ok, feedback = _grade(question, "0.1192")
    assert not ok and "O_b" in feedback, feedback


def test_quiz_merge_weight_as_a_percentage_gets_its_own_hint() -> None:
    from test_attnbook import _grade

    question = dict(_numeric_questions())[3]
    for typed in ("88", "88.08"):
        ok, feedback = _grade(question, typed)
        assert not ok and "percentage" in feedback and "fraction of 1" in feedback, (typed, feedback)
    ok, feedback = _grade(question, "12")
    assert not ok and "O_b" in feedback and "percentage" in feedback, feedback


def test_merge_exercise_names_both_overflow_cases_of_the_checker() -> None:
    import json
    from pathlib import Path

    from attnbook.ch09 import MERGE_CASES

    cells = json.loads((Path(__file__).resolve().parents[1] / "book" / "09_flash_attention_on_gpus.ipynb").read_text())["cells"]
    text = next("".join(c["source"]) for c in cells if ":label: ex-09-merge" in "".join(c["source"]))
    for *_, shift, dtype in MERGE_CASES[1:]:
        assert f"near {shift:.0f} in {str(dtype).removeprefix('torch.')}" in text, (shift, dtype)


# --- the serial-cap exercise ----------------------------------------------------------------------


def test_serial_cap_reference_matches_the_chapters_table() -> None:
    from attnbook.ch09 import check_serial_cap, reference_serial_cap

    h100 = GPUS["H100 SXM5 80GB"]
    for d, cap in ((64, 0.5), (128, 2 / 3), (256, 0.8)):
        assert math.isclose(reference_serial_cap(d, h100["fp16_flops"], exp_per_s(h100)), cap, rel_tol=1e-3)
    assert check_serial_cap(reference_serial_cap).status == "correct"


def test_serial_cap_mistakes_get_their_own_hint() -> None:
    from attnbook.ch09 import CAP_MISTAKES, check_serial_cap

    hints = set()
    for m in CAP_MISTAKES:
        fb = check_serial_cap(m.compute)
        assert fb.status == "wrong" and fb.message.endswith(m.hint), (m.name, fb.message)
        hints.add(fb.message)
    assert len(hints) == len(CAP_MISTAKES)
    generic = check_serial_cap(lambda *a: 0.3).message
    assert "time per score of each part, work divided by rate" in generic, generic


def test_serial_cap_names_d_and_d_squared_flops_and_a_ratio_capped_at_1() -> None:
    """Learner probe: these forms got the generic hint."""
    from attnbook.ch09 import check_serial_cap

    def cap(flops):
        return lambda d, F, E: (flops(d) / F) / (flops(d) / F + 1 / E)

    fb = check_serial_cap(cap(lambda d: d))
    assert fb.status == "wrong" and fb.message.startswith("you counted d FLOPs per score"), fb
    fb = check_serial_cap(cap(lambda d: d ** 2))
    assert fb.status == "wrong" and fb.message.startswith("you counted d^2 FLOPs per score"), fb
    fb = check_serial_cap(cap(lambda d: 4 * d * d))
    assert fb.status == "wrong" and fb.message.startswith("you counted 4 d^2 FLOPs"), fb
    fb = check_serial_cap(lambda d, F, E: min(1, (4 * d / F) / (1 / E)))
    assert fb.status == "wrong" and fb.message.startswith("you capped the ratio t_matmul / t_exp at 1"), fb


# --- the sliding-window exercise: Triton kernel, PyTorch twin, mistakes -------------------------------

from attnbook.ch09 import (  # noqa: E402
    FIRST_KEY_MISTAKES,
    VISIBLE_MISTAKES,
    WINDOW_RUNS,
    check_sliding_window,
    reference_first_key,
    reference_visible,
    sram_bytes_per_s,
    windowed_tiled_attention,
)


def test_sliding_window_solution_passes_and_reports_the_tiles_the_text_quotes() -> None:
    fb = check_sliding_window(reference_visible, reference_first_key)
    assert fb.status == "correct", fb
    assert "computed 41 tiles where a causal kernel computes 66" in fb.message  # quoted in the solution's prose
    assert "PyTorch" in fb.message  # no TRITON_INTERPRET in this process: the PyTorch twin ran, and says so


def test_sliding_window_also_accepts_a_clamped_first_key() -> None:
    assert check_sliding_window(reference_visible, lambda q0, w: max(0, q0 - w + 1)).passed


@pytest.mark.parametrize("mistake", VISIBLE_MISTAKES, ids=[m.name for m in VISIBLE_MISTAKES])
def test_sliding_window_mask_mistakes_get_their_hint(mistake) -> None:
    fb = check_sliding_window(mistake.compute, reference_first_key)
    assert fb.status == "wrong" and fb.message == mistake.hint


@pytest.mark.parametrize("mistake", FIRST_KEY_MISTAKES, ids=[m.name for m in FIRST_KEY_MISTAKES])
def test_sliding_window_first_key_mistakes_get_their_hint(mistake) -> None:
    fb = check_sliding_window(reference_visible, mistake.compute)
    assert fb.status == "wrong" and fb.message == mistake.hint


def _visible_with_and(rows, cols, window):
    return (cols <= rows) and (rows - cols < window)


def _visible_with_or(rows, cols, window):
    return (cols <= rows) or (rows - cols < window)


def _visible_chained_on_keys(rows, cols, window):
    return rows - window < cols <= rows


def _visible_chained_on_distance(rows, cols, window):
    return 0 <= rows - cols < window


@pytest.mark.parametrize(
    "visible",
    [_visible_with_and, _visible_with_or, _visible_chained_on_keys, _visible_chained_on_distance],
    ids=["and", "or", "chained-keys", "chained-distance"],
)
def test_sliding_window_python_and_is_translated_into_a_hint(visible) -> None:
    fb = check_sliding_window(visible, reference_first_key)
    assert fb.status == "wrong"
    assert "combines two boolean tiles element by element" in fb.message and "Python's `and`" in fb.message, fb
    assert "chained comparison such as `a < b <= c`" in fb.message, fb
    assert "raised" not in fb.message


def test_sliding_window_refuses_a_float_mask_and_a_torch_function_in_pytorch_too() -> None:
    fb = check_sliding_window(lambda r, c, w: ((c <= r) & (r - c < w)).float(), reference_first_key)
    assert fb.status == "wrong" and "torch.bool" in fb.message
    # the probe: without Triton the PyTorch twin runs `visible`, and refuses a torch function as Triton does
    def where(rows, cols, window):
        return torch.where(cols <= rows, rows - cols < window, False)

    for visible, name in ((lambda r, c, w: torch.logical_and(c <= r, r - c < w), "logical_and"), (where, "where")):
        fb = check_sliding_window(visible, reference_first_key)
        assert fb.status == "wrong" and f"`visible` calls {name} (torch.{name}" in fb.message, fb
        assert "Triton tiles, which torch functions cannot take" in fb.message, fb


def test_sliding_window_accepts_pythons_abs_which_the_exercise_counts_as_arithmetic() -> None:
    def visible(rows, cols, window):
        return (cols <= rows) & (abs(rows - cols) < window)

    assert check_sliding_window(visible, reference_first_key).passed


def test_windowed_twin_skips_the_tiles_before_the_window_and_equals_sdpa() -> None:
    import torch.nn.functional as F

    from attnlib import causal_mask

    S, D, W, bq, bk = WINDOW_RUNS[0]
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, S, D, generator=gen) for _ in range(3))
    out, tiles = windowed_tiled_attention(q, k, v, reference_visible, reference_first_key, W, bq, bk)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(S, window=W)))
    # query block i starts at the key block holding i * bq - W + 1 and ends after its own last row
    assert tiles == [math.ceil((min(S, q0 + bq) - max(0, q0 - W + 1) // bk * bk) / bk) for q0 in range(0, S, bq)]
    _, every = windowed_tiled_attention(q, k, v, reference_visible, lambda q0, w: 0, W, bq, bk)
    assert sum(tiles) < sum(every)


def test_sliding_window_in_the_triton_interpreter(tmp_path) -> None:
    """The same checker in a process with TRITON_INTERPRET=1 runs the Triton kernel, and names a `visible`
    that Triton cannot compile."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[1]
    code = ("import torch\nfrom attnbook.ch09 import check_sliding_window, reference_visible, reference_first_key\n"
            "print(check_sliding_window(reference_visible, reference_first_key).message)\n"
            "def torch_fn(r, c, w):\n    return torch.logical_and(c <= r, r - c < w)\n"
            "print(check_sliding_window(torch_fn, reference_first_key).message)\n"
            "def with_abs(rows, cols, window):\n    return (cols <= rows) & (abs(rows - cols) < window)\n"
            "print(check_sliding_window(with_abs, reference_first_key).message)\n"
            "print(check_sliding_window(lambda r, c, w: (c <= r) & (r - c < w), reference_first_key))\n"
            "visible = lambda rows, cols, window: (cols <= rows) & (rows - cols < window)\n"
            "print(check_sliding_window(visible, lambda q, w: max(0, q - w + 1)))\n")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    script = tmp_path / "window_in_triton.py"  # a file, as a notebook cell is: Triton reads a function's source
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr
    right, torch_fn, with_abs, *lambdas = done.stdout.strip().splitlines()
    assert "in Triton's interpreter" in right and "41 tiles" in right
    # a torch function is named before the kernel runs, as in the PyTorch loop; Python's abs runs in Triton too
    assert torch_fn.startswith("`visible` calls logical_and (torch.logical_and") and "Triton tiles" in torch_fn
    assert "in Triton's interpreter" in with_abs and "41 tiles" in with_abs
    # a right `visible` written as a lambda, which Triton cannot compile, is accepted in the PyTorch loop, and told so
    assert len(lambdas) == 2
    for line in lambdas:
        assert line.startswith("[Correct] the windowed kernel ran in the same tiled loop written in PyTorch"), line
        assert "41 tiles" in line and "Triton cannot compile a lambda: write `visible` with def" in line
    assert "RuntimeWarning" not in done.stderr  # the padding rows are guarded: no 0 / 0


def test_sram_bandwidth_is_the_figure_the_text_quotes() -> None:
    assert round(sram_bytes_per_s(GPUS["A100 SXM4 80GB"]) / 1e12, 1) == 19.5  # FlashAttention-1 paper: ~19 TB/s


def test_quiz_serial_cap_and_total_traffic_answers_get_their_own_feedback() -> None:
    from test_attnbook import _grade

    cap = dict(_numeric_questions())[6]
    for typed, words in (("0.667", "one matmul"), ("0.2", "exponentials"), ("4", "t_mat / t_exp"),
                         ("80", "percentage")):
        ok, feedback = _grade(cap, typed)
        assert not ok and words in feedback, (typed, feedback)
    traffic = dict(_numeric_questions())[5]
    ok, feedback = _grade(traffic, f"{34_082_816 / 17_305_600:.2f}")  # the total traffic's ratio, 1.97
    assert not ok and "total traffic" in feedback, feedback


@pytest.mark.parametrize("digits", [2, 3])
def test_serial_cap_rounded_is_told_not_to_round(digits: int) -> None:
    from attnbook.ch09 import check_serial_cap, reference_serial_cap

    fb = check_serial_cap(lambda d, F, E: round(reference_serial_cap(d, F, E), digits))
    assert fb.status == "wrong" and "unrounded" in fb.message, fb


# --- findings of the ch08-09 reading: hints that name the step at fault -------------------------

def test_sliding_window_accepts_a_first_key_rounded_down_to_a_key_block_and_says_so() -> None:
    from attnbook.ch09 import check_sliding_window, reference_visible

    fb = check_sliding_window(reference_visible, lambda q0, w: max(0, (q0 - w + 1) // 16 * 16))
    assert fb.passed, fb
    assert "computed 41 tiles" in fb.message and "rounds the first key down" in fb.message
    # one block too early is still refused: it computes a tile the window does not need
    late = check_sliding_window(reference_visible, lambda q0, w: max(0, (q0 - w + 1) // 16 * 16 - 16))
    assert not late.passed


def test_serial_cap_inverse_ratio_8d_3d_and_integer_division_get_their_own_hints() -> None:
    from attnbook.ch09 import check_serial_cap

    def cap(flops: int):
        return lambda d, mf, e: (flops * d / mf) / (flops * d / mf + 1 / e)

    assert "upside down" in check_serial_cap(lambda d, mf, e: mf / (4 * d * e)).message
    assert "8 d FLOPs" in check_serial_cap(cap(8)).message
    assert "3 d FLOPs" in check_serial_cap(cap(3)).message
    assert "integer division" in check_serial_cap(lambda d, mf, e: int(4 * d / mf) // 1).message
    assert check_serial_cap(lambda d, mf, e: 1 / (1 + mf / (4 * d * e))).passed  # another right form


def test_serial_cap_6d_flops_is_named_as_a_backward_matmul() -> None:
    from attnbook.ch09 import check_serial_cap

    fb = check_serial_cap(lambda d, mf, e: (6 * d / mf) / (6 * d / mf + 1 / e))
    assert fb.status == "wrong" and "6 d FLOPs per score, as if a backward matmul ran too" in fb.message, fb
    assert check_serial_cap(lambda d, mf, e: (4 * d / mf) / (4 * d / mf + 1 / e)).passed


def test_merge_unnormalised_max_subtraction_sum_and_swapped_return_get_their_own_hints() -> None:
    def max_only(oa, la, ob, lb):
        m = torch.maximum(la, lb)
        return torch.exp(la - m)[..., None] * oa + torch.exp(lb - m)[..., None] * ob, torch.logaddexp(la, lb)

    assert "do not sum to 1" in check_merge_partials(max_only).message
    assert "plain sum" in check_merge_partials(lambda oa, la, ob, lb: (oa + ob, torch.logaddexp(la, lb))).message
    unnormalised = check_merge_partials(
        lambda oa, la, ob, lb: (torch.exp(la)[..., None] * oa + torch.exp(lb)[..., None] * ob, torch.logaddexp(la, lb)))
    assert "not their shares" in unnormalised.message

    def swapped(oa, la, ob, lb):
        out, lse = reference_merge_partials(oa, la, ob, lb)
        return lse, out

    assert "you returned (lse, out)" in check_merge_partials(swapped).message


def test_causal_traffic_table_counts_the_computed_tiles_per_byte() -> None:
    """At block 512 three tiles run: 1.5x the useful causal FLOPs, and the table divides those by the bytes."""
    from attnbook.ch09 import causal_traffic_lines

    S, d, block = 1024, 64, 512
    computed = 3 * 4 * block * block * d
    assert computed == 1.5 * 4 * d * S * S / 2
    line = causal_traffic_lines(S, d, (block,))[2].split()
    assert line[:2] == ["512", "3"] and int(line[-1]) == round(computed / (2 * fused_forward_io(S, d, block, causal=True)))
    assert "4.46 M" in causal_traffic_lines(S, d, (block,))[0]  # 4 S d + 4 S^2
    # FlashAttention-2's order: about block FLOPs per float16 byte, whatever d is, once K/V re-reads dominate
    for d_ in (64, 128):
        flops = 4 * 8192 * 8192 * d_
        assert abs(flops / (2 * fused_forward_io(8192, d_, 128)) / 128 - 1) < 0.05


def test_cudnn_first_follows_the_rule_of_sdp_utils() -> None:
    """torch 2.10-2.13's check_prefer_cudnn_attention: capability 9.x/10.x (9.0, 10.0, 10.3 with CUDA 12),
    cuDNN > 9.15.0 at run time, and not switched off by the environment."""
    from attnbook.ch09 import cudnn_first

    assert cudnn_first((9, 0), 92000, "13.0", {}) and cudnn_first((10, 0), 91501, "12.9", {})
    assert cudnn_first((10, 3), 92000, "12.9", {}) and cudnn_first((10, 1), 92000, "13.0", {})
    assert not cudnn_first((10, 1), 92000, "12.9", {})  # CUDA 12 builds: minor 0 or 3 only
    assert not cudnn_first((9, 0), 91500, "13.0", {})  # 9.15.0 itself is too old
    assert not cudnn_first((8, 0), 92000, "13.0", {}) and not cudnn_first((12, 0), 92000, "13.0", {})
    assert not cudnn_first((9, 0), 92000, "13.0", {"TORCH_CUDNN_SDPA_DEPRIORITIZED": "1"})
    assert not cudnn_first((9, 0), 92000, "13.0", {"TORCH_CUDNN_SDPA_PREFERRED": "0"})


def test_sdpa_priority_line_names_the_machine_and_expects_nothing_without_a_gpu() -> None:
    from attnbook.ch09 import sdpa_priority_line

    line, order, expected = sdpa_priority_line()
    assert order[0] in line.replace(", ", " ").split() and line.endswith(", ".join(order))
    if not torch.cuda.is_available():
        assert line.startswith("This machine has no CUDA GPU") and expected is None
        assert order[:4] == ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION"]
    elif expected is not None:
        assert order[0] == expected


# --- probe-ch08-09: the merge's lse and the window's mask and first key get named hints ---------

from attnbook.ch09 import _LSE_MISTAKES  # noqa: E402


def _merge_from_lse(lse_of):
    def merge(oa, la, ob, lb):
        lse = lse_of(la, lb)
        return torch.exp(la - lse)[..., None] * oa + torch.exp(lb - lse)[..., None] * ob, lse
    return merge


@pytest.mark.parametrize("mistake", _LSE_MISTAKES, ids=[m.name for m in _LSE_MISTAKES])
def test_merge_lse_mistakes_get_their_hint_whether_out_follows_or_not(mistake) -> None:
    fb = check_merge_partials(_merge_from_lse(lambda la, lb: mistake.compute(None, la, None, lb, 0, 0)))
    # weights exp(lse_part - max) are a mistake of out's own table, which is asked first
    own = {m.name: m.hint for m in _MERGE_MISTAKES}["max subtracted, not normalised"] if mistake.name == "the larger lse" else mistake.hint
    assert fb.status == "wrong" and fb.message == own, fb
    fb = check_merge_partials(lambda oa, la, ob, lb: (reference_merge_partials(oa, la, ob, lb)[0], mistake.compute(oa, la, ob, lb, 0, 0)))
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


def test_merge_probe_lse_sum_and_forgotten_max_name_the_lse() -> None:
    fb = check_merge_partials(_merge_from_lse(lambda la, lb: la + lb))
    assert fb.status == "wrong" and "logs of sums do not add" in fb.message, fb

    def forgot_m(la, lb):
        m = torch.maximum(la, lb)
        return torch.log(torch.exp(la - m) + torch.exp(lb - m))

    fb = check_merge_partials(_merge_from_lse(forgot_m))
    assert fb.status == "wrong" and "without the m you subtracted" in fb.message, fb


def test_merge_out_that_follows_a_wrong_lse_blames_the_lse() -> None:
    fb = check_merge_partials(_merge_from_lse(lambda la, lb: torch.logaddexp(la, lb) + 0.5))
    assert fb.status == "wrong" and "the error is in lse" in fb.message, fb


def test_merge_logsumexp_over_the_wrong_axis_of_a_stack_is_named() -> None:
    fb = check_merge_partials(_merge_from_lse(lambda la, lb: torch.logsumexp(torch.stack([la, lb]), dim=-1)))
    assert fb.status == "wrong" and "wrong axis of the stacked" in fb.message and "weight[..., None]" not in fb.message, fb
    # the weight without its axis (or on the wrong one) keeps the [..., None] hint
    for merge in (lambda oa, la, ob, lb: (torch.exp(la - torch.logaddexp(la, lb)).unsqueeze(0) * oa
                                          + torch.exp(lb - torch.logaddexp(la, lb)).unsqueeze(0) * ob, torch.logaddexp(la, lb)),
                  lambda oa, la, ob, lb: (torch.exp(la - torch.logaddexp(la, lb)) * oa
                                          + torch.exp(lb - torch.logaddexp(la, lb)) * ob, torch.logaddexp(la, lb))):
        fb = check_merge_partials(merge)
        assert fb.status == "wrong" and "write weight[..., None]" in fb.message, fb


def test_merge_right_answers_written_differently_pass() -> None:
    def max_trick(oa, la, ob, lb):
        m = torch.maximum(la, lb); wa, wb = torch.exp(la - m), torch.exp(lb - m); den = wa + wb
        return (wa[..., None] * oa + wb[..., None] * ob) / den[..., None], m + torch.log(den)

    def stacked(oa, la, ob, lb):
        L = torch.stack([la, lb], 0)
        return (torch.softmax(L, 0).unsqueeze(-1) * torch.stack([oa, ob], 0)).sum(0), torch.logsumexp(L, 0)

    assert check_merge_partials(max_trick).passed and check_merge_partials(stacked).passed


def test_sliding_window_probe_precedence_and_symmetric_window_are_named() -> None:
    from attnbook.ch09 import check_sliding_window, reference_first_key

    fb = check_sliding_window(lambda rows, cols, window: cols <= rows & (rows - cols < window), reference_first_key)
    assert fb.status == "wrong" and "& binds tighter" in fb.message, fb
    for visible in (lambda rows, cols, window: abs(rows - cols) < window,
                    lambda rows, cols, window: (rows - cols < window) & (cols - rows < window)):
        fb = check_sliding_window(visible, reference_first_key)
        assert fb.status == "wrong" and "reaches both ways" in fb.message, fb
    # a product of boolean tiles stays torch.bool: right
    assert check_sliding_window(lambda rows, cols, window: (cols <= rows) * (rows - cols < window), reference_first_key).passed


def test_sliding_window_first_key_rounded_to_the_window_is_not_told_it_starts_at_0() -> None:
    from attnbook.ch09 import check_sliding_window, reference_visible

    fb = check_sliding_window(reference_visible, lambda q_start, window: (q_start - window + 1) // window * window)
    assert fb.status == "wrong" and "multiples of window" in fb.message and "key 0" not in fb.message, fb


# --- the learner probe of chapters 8-11: generic verdicts and raw errors, each named --------------

def test_probe_serial_cap_slips_are_named() -> None:
    from attnbook.ch09 import check_serial_cap

    two_d = lambda d, matmul_flops, exps_per_s: (lambda t: t / (t + 1 / exps_per_s))(2 * d / matmul_flops)
    fb = check_serial_cap(two_d)  # one matmul, or both with a multiply-add counted as one FLOP: both named
    assert "either one matmul only, or both with a multiply-add counted as one FLOP" in fb.message, fb
    for fn, words in ((lambda d, mf, e: (lambda t: t / (t + 1 / mf))(4 * d / e), "you swapped the two rates"),
                      (lambda d, mf, e: (4 * d / mf) / (4 * d / mf + 4 * d / e), "a score has ONE exponential"),
                      (lambda d, mf, e: 1 / (1 + int(mf) // int(4 * d * e)), "floored the ratio of the two times")):
        fb = check_serial_cap(fn)
        assert fb.status == "wrong" and words in fb.message, fb


def test_probe_merge_with_math_log_on_tensors_is_translated() -> None:
    import math as m

    fb = check_merge_partials(lambda out_a, lse_a, out_b, lse_b: (out_a, m.log(m.exp(lse_a) + m.exp(lse_b))))
    assert fb.status == "wrong" and "only one element tensors" in fb.message, fb
    assert "take ONE Python number" in fb.message and "`lse_a`" in fb.message and "torch.logaddexp" in fb.message, fb


def test_probe2_merge_logsumexp_without_dim_is_translated() -> None:
    def no_dim(oa, la, ob, lb):
        lse = torch.logsumexp(torch.stack([la, lb]))
        return torch.exp(la - lse)[..., None] * oa + torch.exp(lb - lse)[..., None] * ob, lse

    fb = check_merge_partials(no_dim)
    assert fb.status == "wrong" and "torch.logsumexp has no default axis: it needs dim=" in fb.message, fb


# --- named slips: an inverted mask, rates for times, weights without exp, float32 inside ----------------

def test_sliding_window_inverted_mask_is_named() -> None:
    """True where the key is hidden (masked_fill's convention) got the generic 'your tile differs'."""
    def hidden(rows, cols, window):
        return ~((cols <= rows) & (rows - cols < window))

    def hidden_spelled_out(rows, cols, window):
        return (cols > rows) | (rows - cols >= window)

    for visible in (hidden, hidden_spelled_out):
        fb = check_sliding_window(visible, reference_first_key)
        assert fb.status == "wrong" and fb.message.startswith("your tile is the opposite of the mask"), fb
        assert "NOT see" in fb.message and "masked_fill" in fb.message, fb


def test_serial_cap_rates_used_where_times_belong_are_named() -> None:
    from attnbook.ch09 import check_serial_cap

    def both_rates(d, matmul_flops, exps_per_s):
        r_matmul = matmul_flops / (4 * d)  # scores per second, not seconds per score
        r_exp = exps_per_s
        return r_matmul / (r_matmul + r_exp)

    fb = check_serial_cap(both_rates)
    assert fb.status == "wrong" and "rates where the times belong" in fb.message, fb
    fb = check_serial_cap(lambda d, F, E: (F / (4 * d)) / (F / (4 * d) + 1 / E))
    assert fb.status == "wrong" and "your t_matmul is not a time" in fb.message, fb
    fb = check_serial_cap(lambda d, F, E: (4 * d * F) / (4 * d * F + 1 / E))  # a time times a rate: neither
    assert fb.status == "wrong" and "your t_matmul is not a time" in fb.message, fb
    fb = check_serial_cap(lambda d, F, E: (4 * d / F) / (4 * d / F + E))
    assert fb.status == "wrong" and "your t_exp is exps_per_s, a rate" in fb.message, fb


def test_merge_weights_without_exp_are_named() -> None:
    def log_weights(oa, la, ob, lb):
        lse = torch.logaddexp(la, lb)
        return (la - lse)[..., None] * oa + (lb - lse)[..., None] * ob, lse

    fb = check_merge_partials(log_weights)
    assert fb.status == "wrong" and fb.message.startswith("your weights are lse_part - lse_total without exp"), fb
    fb = check_merge_partials(lambda oa, la, ob, lb: (la[..., None] * oa + lb[..., None] * ob, torch.logaddexp(la, lb)))
    assert fb.status == "wrong" and "themselves as the weights, without exp" in fb.message, fb


def test_merge_computed_in_float32_and_cast_back_is_refused_on_the_float64_case() -> None:
    """The dtype rule: float32 inside a float64 merge fits the checker's 1e-4 but loses the digits; refuse and name it."""
    def float32_inside(oa, la, ob, lb):
        out, lse = reference_merge_partials(oa.float(), la.float(), ob.float(), lb.float())
        return out.to(oa.dtype), lse.to(la.dtype)

    fb = check_merge_partials(float32_inside)
    assert fb.status == "wrong" and "float32's precision" in fb.message and "casting back does not restore" in fb.message, fb
    assert fb.message.startswith("your out"), fb
    # float16 inputs are not among the cases; float64 computed wider than float32 inputs still passes
    assert check_merge_partials(lambda *p: tuple(t.to(p[0].dtype) for t in reference_merge_partials(*(x.double() for x in p)))).passed


def test_window_tile_kinds_match_flex_attentions_block_mask_and_the_diagram() -> None:
    from attnbook.ch09 import FLEX_BLOCK, FLEX_S, FLEX_WINDOW, window_block_mask_diagram, window_tile_kinds

    assert (FLEX_S, FLEX_WINDOW, FLEX_BLOCK) == (1024, 256, 128)  # the sizes of section 9.8's cell
    kinds = window_tile_kinds(FLEX_S, FLEX_WINDOW, FLEX_BLOCK)
    partial = [row.count("partial") for row in kinds]
    full = [row.count("full") for row in kinds]
    assert partial == [1, 1, 2, 2, 2, 2, 2, 2] and full == [0, 1, 1, 1, 1, 1, 1, 1]  # the cell's printed block mask
    assert "21 of the 64 tiles are computed, 7 in full and 14 with a mask inside" in window_block_mask_diagram().alt
    with pytest.raises(ValueError, match="not a multiple of block"):
        window_tile_kinds(1000, 256, 128)


def test_execution_hierarchy_diagram_draws_the_a100() -> None:
    from attnbook.ch09 import execution_hierarchy_diagram

    d = execution_hierarchy_diagram()
    assert "108 SMs" in d.alt and "warps of 32 threads" in d.alt and "164 KB of shared memory" in d.alt, d.alt
    d.svg()  # legible on a phone


W_GLOBAL = 256  # the notebook's FlexAttention cell sets a global W = 256 that a reader may pick up


def _visible_with_global_window(rows, cols, window):
    return (cols <= rows) & (rows - cols < W_GLOBAL)


def _first_key_with_global_window(q_start, window):
    return q_start - W_GLOBAL + 1


def test_sliding_window_names_a_visible_that_ignores_its_window_argument() -> None:
    fb = check_sliding_window(_visible_with_global_window, reference_first_key)
    assert fb.status == "wrong"
    assert "ignores its `window` argument" in fb.message and "a window of 256 keys" in fb.message, fb
    assert fb.message != VISIBLE_MISTAKES[0].hint


def test_sliding_window_names_a_first_key_that_ignores_its_window_argument() -> None:
    fb = check_sliding_window(reference_visible, _first_key_with_global_window)
    assert fb.status == "wrong"
    assert "`first_key`" in fb.message and "ignores its `window` argument" in fb.message, fb
    assert fb.message != FIRST_KEY_MISTAKES[0].hint


def test_serial_cap_names_two_exponentials_per_score_in_the_one_matmul_hint() -> None:
    """Two exponentials per score give the same share as 2 d FLOPs with one: the hint names both readings."""
    from attnbook.ch09 import check_serial_cap

    fb = check_serial_cap(lambda d, mf, e: (4 * d / mf) / (4 * d / mf + 2 / e))
    assert fb.status == "wrong" and "two exponentials per score" in fb.message, fb


def test_sliding_window_names_both_slips_when_visible_and_first_key_are_both_wrong() -> None:
    """A learner probe: one slip in each function got the hint of the `visible` slip alone."""
    too_many = next(m for m in VISIBLE_MISTAKES if m.name == "one key too many")
    early = next(m for m in FIRST_KEY_MISTAKES if m.name == "one key early")
    fb = check_sliding_window(too_many.compute, early.compute)
    assert fb.status == "wrong" and "more than one thing differs" in fb.message, fb
    assert too_many.hint in fb.message and early.hint in fb.message, fb


def test_sliding_window_still_names_one_slip_when_first_key_is_the_stub() -> None:
    too_many = next(m for m in VISIBLE_MISTAKES if m.name == "one key too many")

    def stub(q_start, window):
        raise NotImplementedError

    fb = check_sliding_window(too_many.compute, stub)
    assert fb.status == "wrong" and fb.message == too_many.hint, fb


@pytest.mark.parametrize(
    "visible, says",
    [
        (lambda r, c, w: (c < r) & (r - c <= w), ("the query itself", "one key more")),
        (lambda r, c, w: (c < r) & (r - c < w - 1), ("the query itself", "one key fewer")),
    ],
    ids=["strict and one too many", "strict and one too few"],
)
def test_sliding_window_two_slips_in_visible_are_named_as_two(visible, says) -> None:
    fb = check_sliding_window(visible, reference_first_key)
    assert fb.status == "wrong" and "two differences" in fb.message, fb
    assert all(s in fb.message for s in says), fb


def test_sliding_window_a_single_slip_is_not_called_two() -> None:
    """The causal part the wrong way round with a right window part is one slip; it must not be named as two."""
    fb = check_sliding_window(lambda r, c, w: (r <= c) & (r - c < w - 1), reference_first_key)
    assert fb.status == "wrong" and "two differences" not in fb.message, fb


def test_serial_cap_d_exponentials_per_score_is_named_without_giving_the_count() -> None:
    """A learner probe: d exponentials per score fell through to the recipe (t_exp = 1 / exps_per_s ...)."""
    from attnbook.ch09 import check_serial_cap

    fb = check_serial_cap(lambda d, mf, e: (4 * d / mf) / (4 * d / mf + d / e))
    assert fb.status == "wrong" and "d exponentials" in fb.message, fb
    for recipe in ("1 / exps_per_s", "one exponential", "ONE", "4 d", "t_matmul / (t_matmul + t_exp)"):
        assert recipe not in fb.message, (recipe, fb.message)


def test_lazy_rescale_diagram_counts_what_lazy_online_softmax_counts() -> None:
    from attnbook.ch09 import LAZY_MAXIMA, LAZY_THRESHOLD, lazy_reference_points, lazy_rescale_diagram

    s = torch.tensor([LAZY_MAXIMA], dtype=torch.float64)  # [1, S_k]: one key per block, its score the maximum
    v = torch.randn(len(LAZY_MAXIMA), 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    _, lazy, exact = lazy_online_softmax(s, v, block=1, threshold=float(LAZY_THRESHOLD))
    refs = lazy_reference_points()
    moves = sum(a != b for a, b in zip(refs, refs[1:]))
    assert (lazy, exact) == (moves, len(LAZY_MAXIMA) - 1) == (2, 9)
    alt = lazy_rescale_diagram().alt
    assert f"rescales {exact} times" in alt and f"the lazy one {lazy} times" in alt, alt
    assert LAZY_THRESHOLD == 8  # the threshold of the chapter's lazy_online_softmax cell


# --- hints end at the diagnosis; the softmax over the wrong axis; the new diagrams -------------

_ANSWERS = ("(cols <= rows) & (rows - cols < window)", "t_matmul / (t_matmul + t_exp)", "4 d / matmul_flops",
            "t_exp = 1 / exps_per_s", "exp(lse_a - lse) * out_a", "= torch.logaddexp(lse_a, lse_b)")


def test_hints_that_used_to_hand_over_the_answer_end_at_the_diagnosis() -> None:
    from attnbook.ch09 import check_serial_cap, reference_serial_cap

    fbs = [check_sliding_window(_visible_with_and, reference_first_key),
           check_serial_cap(lambda d, F, E: (4 * d / F) / (1 / E)),  # the ratio of the times
           check_serial_cap(lambda d, F, E: min(1, (4 * d / F) / (1 / E))),
           check_serial_cap(lambda d, F, E: (1 / E) / (4 * d / F)),
           check_serial_cap(lambda d, F, E: reference_serial_cap(d, E, F)),
           check_serial_cap(lambda d, F, E: (4 * d / F) / (4 * d / F + E)),
           check_serial_cap(lambda d, F, E: (F / (4 * d)) / (F / (4 * d) + 1 / E)),
           check_serial_cap(lambda *a: 0.3),
           check_merge_partials(lambda oa, la, ob, lb: (0.3 * oa + 0.7 * ob, torch.logaddexp(la, lb))),
           check_merge_partials(lambda oa, la, ob, lb: (reference_merge_partials(oa, la, ob, lb)[0], la + 2 * lb))]
    for fb in fbs:
        assert fb.status == "wrong", fb
        for answer in _ANSWERS:
            assert answer not in fb.message, (answer, fb.message)
    assert "what share of the total is the matmul time?" in fbs[1].message, fbs[1]
    assert "work divided by rate" in fbs[7].message, fbs[7]
    assert "share of the whole softmax denominator" in fbs[8].message, fbs[8]


def test_merge_softmax_over_the_wrong_axis_is_named() -> None:
    def queries(oa, la, ob, lb):
        w = torch.softmax(torch.stack([la, lb]), dim=-1)
        return w[0][..., None] * oa + w[1][..., None] * ob, torch.logaddexp(la, lb)

    def heads(oa, la, ob, lb):
        w = torch.softmax(torch.stack([la, lb]), dim=1)
        return w[0][..., None] * oa + w[1][..., None] * ob, torch.logaddexp(la, lb)

    def parts(oa, la, ob, lb):
        w = torch.softmax(torch.stack([la, lb]), dim=0)
        return w[0][..., None] * oa + w[1][..., None] * ob, torch.logaddexp(la, lb)

    fb = check_merge_partials(queries)
    assert fb.status == "wrong" and fb.message.startswith("your softmax runs over the queries"), fb
    assert "the axis that stack added" in fb.message
    fb = check_merge_partials(heads)
    assert fb.status == "wrong" and fb.message.startswith("your softmax runs over the heads"), fb
    assert check_merge_partials(parts).passed


def _chapter_text() -> str:
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parents[1] / "book" / "09_flash_attention_on_gpus.ipynb").read_text())
    return " ".join(" ".join("".join(c["source"]).split()) for c in nb["cells"] if c["cell_type"] == "markdown")


def test_split_diagram_draws_what_section_9_3_says() -> None:
    from attnbook.ch09 import SPLIT_WARPS, split_k_split_q_diagram

    text = _chapter_text()
    assert SPLIT_WARPS == 4 and "split the key/value block between its four warps" in text
    assert "write partial results to shared memory, synchronise and add them up" in text
    assert "gives each warp its own query rows against the whole key/value block" in text
    d = split_k_split_q_diagram()
    svg = d.svg()
    assert all(f">W{k + 1}<" in svg for k in range(SPLIT_WARPS)) and ">W5<" not in svg
    assert "split-K (FlashAttention-1)" in svg and "split-Q (FlashAttention-2)" in svg
    assert "its own slice of the key/value columns" in d.alt and "through shared memory" in d.alt
    assert "its own slice of the query rows against the whole key/value block" in d.alt


def test_sdpa_diagram_states_the_rules_the_chapter_states_and_torch_follows() -> None:
    from attnbook.ch09 import (CUDNN_FRONT_AFTER, FLASH_CAPABILITIES, FLASH_MAX_HEAD, SDPA_ORDER, SDPA_TORCH,
                               cudnn_first, sdpa_backends_diagram)
    from torch.nn.attention import SDPBackend

    text = _chapter_text()
    d = sdpa_backends_diagram()
    (lo, hi) = FLASH_CAPABILITIES
    assert f"in torch {SDPA_TORCH}" in text
    assert f"compute capability {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]} in torch {SDPA_TORCH}" in text
    assert f"at most {FLASH_MAX_HEAD}" in text and f"`[sm{lo[0]}{lo[1]}, sm{hi[0]}{hi[1]}]`" in text
    assert f"The default order is {', '.join(SDPA_ORDER[:-1])}, {SDPA_ORDER[-1]}." in text
    assert f"`torch.backends.cudnn.version() > {CUDNN_FRONT_AFTER}`" in text and "newer than 9.15.0" in text
    assert "newer than 9.15.0" in d.alt and f"by default {', '.join(SDPA_ORDER)}" in d.alt
    assert f"outside {lo[0]}.{lo[1]}\u2013{hi[0]}.{hi[1]}" in d.alt and f"exceed {FLASH_MAX_HEAD}" in d.alt
    # the cuDNN rule the diagram draws is the one cudnn_first encodes
    assert cudnn_first((9, 0), CUDNN_FRONT_AFTER + 1, "13.0", {}) and not cudnn_first((9, 0), CUDNN_FRONT_AFTER, "13.0", {})
    assert not cudnn_first((9, 0), CUDNN_FRONT_AFTER + 1, "13.0", {"TORCH_CUDNN_SDPA_DEPRIORITIZED": "1"})
    # and the order is torch's own where the named version runs
    if torch.__version__.startswith(SDPA_TORCH + "."):
        names = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "memory-efficient", "MATH": "math",
                 "CUDNN_ATTENTION": "cuDNN"}
        order = [names[SDPBackend(i).name] for i in torch._C._get_sdp_priority_order() if SDPBackend(i).name in names]
        if not torch.cuda.is_available():
            assert tuple(order) == SDPA_ORDER, order


def test_triton_compiles_the_kernel_for_a_t4_without_tensor_cores() -> None:
    """Section 9.4's dropdown on Colab: Triton compiles the kernel for compute capability 7.5 (Colab's T4) in
    float16, bfloat16 and float32, with `tl.dot` on the ordinary units (no `mma` instruction), and uses the
    tensor cores' `mma` for float16 and bfloat16 from 8.0 on. Compiled for the target, no GPU needed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    triton = pytest.importorskip("triton")
    if not hasattr(triton, "compile") or not Path(triton.__file__).with_name("backends").joinpath("nvidia").is_dir():
        pytest.skip("this Triton has no NVIDIA backend")
    root = Path(__file__).resolve().parents[1]
    code = (
        "import triton\nfrom triton.compiler import ASTSource\nfrom triton.backends.compiler import GPUTarget\n"
        "import attnlib.triton_flash as tf\ntf._import_triton()\n"
        "for cc in (75, 80):\n"
        "    for dtype, precision in (('fp16', None), ('bf16', None), ('fp32', 'ieee')):\n"
        "        ptr = '*' + dtype\n"
        "        sig = dict(Q=ptr, K=ptr, V=ptr, Out='*fp32', Lse='*fp32', S_q='i32', S_k='i32', D_k='i32',\n"
        "                   D_v='i32', scale='fp32', CAUSAL='constexpr', BLOCK_Q='constexpr', BLOCK_K='constexpr',\n"
        "                   BLOCK_DK='constexpr', BLOCK_DV='constexpr', PRECISION='constexpr')\n"
        "        const = dict(CAUSAL=True, BLOCK_Q=16, BLOCK_K=16, BLOCK_DK=32, BLOCK_DV=32, PRECISION=precision)\n"
        "        src = ASTSource(fn=tf._kernel, signature=sig,\n"
        "                        constexprs={(list(sig).index(n),): v for n, v in const.items()})\n"
        "        ptx = triton.compile(src, target=GPUTarget('cuda', cc, 32)).asm['ptx']\n"
        "        print(cc, dtype, f'.target sm_{cc}' in ptx, 'mma.sync' in ptx)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:-1] == [
        "75 fp16 True False", "75 bf16 True False", "75 fp32 True False",
        "80 fp16 True True", "80 bf16 True True", "80 fp32 True False",
    ], done.stdout
