"""Chapter 3 checkers: a right answer passes, every mistake of the tables gets its own hint."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from attnbook.ch03 import (
    ENTROPY_MISTAKES,
    WEIGHT_MISTAKES,
    check_entropy,
    check_scaled_weights,
    entropy,
)


def _raw(q: Tensor, k: Tensor) -> Tensor:
    return q @ k.transpose(-2, -1)


def right_weights(q: Tensor, k: Tensor, temperature: float = 1.0) -> Tensor:
    return torch.softmax(_raw(q, k) / math.sqrt(q.shape[-1]) / temperature, dim=-1)


def test_right_weights_pass_also_via_attnlib() -> None:
    fb = check_scaled_weights(right_weights)
    assert fb.status == "correct" and "with and without a batch axis" in fb.message, fb
    import attnlib

    def via_library(q: Tensor, k: Tensor, temperature: float = 1.0) -> Tensor:
        return attnlib.scaled_dot_product_attention(q, k, k, temperature=temperature).weights

    assert check_scaled_weights(via_library).passed


def test_weights_stub_is_todo() -> None:
    def stub(q: Tensor, k: Tensor, temperature: float = 1.0) -> Tensor:
        raise NotImplementedError

    assert check_scaled_weights(stub).status == "todo"


@pytest.mark.parametrize("mistake", WEIGHT_MISTAKES, ids=lambda m: m.name)
def test_each_weight_mistake_gets_its_hint(mistake) -> None:
    fb = check_scaled_weights(mistake.compute)
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


@pytest.mark.filterwarnings("ignore:The use of `x.T`")  # k.T on a 3-D tensor triggers PyTorch's deprecation warning
def test_batch_axis_mistakes() -> None:
    k_T = lambda q, k, t=1.0: torch.softmax((q @ k.T) / math.sqrt(q.shape[-1]) / t, -1)  # noqa: E731
    assert "k.transpose(-2, -1)" in check_scaled_weights(k_T).message
    batch_only = lambda q, k, t=1.0: torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]) / t, -1)  # noqa: E731
    fb = check_scaled_weights(batch_only)
    assert fb.status == "wrong" and "works with a batch axis but not without one" in fb.message, fb


@pytest.mark.parametrize("how", ["no dim", "dim=0"])
def test_softmax_over_dim_0_is_named(how: str) -> None:
    import torch.nn.functional as F

    def fn(q: Tensor, k: Tensor, t: float = 1.0) -> Tensor:
        scores = _raw(q, k) / math.sqrt(q.shape[-1]) / t
        return F.softmax(scores, dim=0) if how == "dim=0" else F.softmax(scores)  # no dim: dim 0 on 3-D input

    fb = check_scaled_weights(fn)
    assert fb.status == "wrong" and "F.softmax without dim picks dim 0" in fb.message and "dim=-1" in fb.message, fb


def test_weights_fallbacks() -> None:
    assert "torch.Tensor" in check_scaled_weights(lambda q, k, t=1.0: [1.0]).message
    fb = check_scaled_weights(lambda q, k, t=1.0: q @ k)  # shape mismatch inside the reader's code
    assert fb.status == "wrong" and "RuntimeError" in fb.message
    unnormalised = lambda q, k, t=1.0: torch.exp(_raw(q, k) / math.sqrt(q.shape[-1]) / t)  # noqa: E731
    assert "should each sum to 1" in check_scaled_weights(unnormalised).message

    def off(q: Tensor, k: Tensor, temperature: float = 1.0) -> Tensor:
        w = right_weights(q, k, temperature)
        return (w + 0.05) / (1 + 0.05 * w.shape[-1])

    fb = check_scaled_weights(off)
    assert fb.status == "wrong" and "T = 2.5" in fb.message, fb


# ---------------------------------------------------------------- entropy


def test_entropy_reference() -> None:
    w = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]])
    assert torch.allclose(entropy(w), torch.tensor([0.0, math.log(4), math.log(2)]))


def right_entropy(w: Tensor) -> Tensor:
    return -(w * torch.log(w.clamp_min(1e-30))).sum(dim=-1)


def test_right_entropy_passes_with_torch_log() -> None:
    assert check_entropy(right_entropy).status == "correct"
    assert check_entropy(lambda w: -torch.where(w > 0, w * torch.log(w), 0.0).sum(-1)).passed


@pytest.mark.parametrize("shortcut", [
    lambda w: torch.special.entr(w).sum(-1),
    lambda w: -torch.special.xlogy(w, w).sum(-1),
    lambda w: -torch.xlogy(w, w).sum(-1),
    lambda w: -w.xlogy(w).sum(-1),
])
def test_entropy_refuses_the_shortcuts_the_exercise_rules_out(shortcut) -> None:
    fb = check_entropy(shortcut)
    assert fb.status == "wrong" and "asks for torch.log" in fb.message, fb
    assert torch.special.entr(torch.tensor([0.5])).item() > 0  # restored afterwards


def test_entropy_stub_is_todo() -> None:
    def stub(w: Tensor) -> Tensor:
        raise NotImplementedError

    assert check_entropy(stub).status == "todo"
    assert "did you forget `return`" in check_entropy(lambda w: None).message


@pytest.mark.parametrize("mistake", ENTROPY_MISTAKES, ids=lambda m: m.name)
def test_each_entropy_mistake_gets_its_hint(mistake) -> None:
    fb = check_entropy(mistake.compute)
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda w: -(w * torch.log(w)).sum(-1), "0 * ln 0"),
        (lambda w: -(w * torch.log(w.clamp_min(1e-30))), "one number per weight"),
        (lambda w: -(w * torch.log(w.clamp_min(1e-30))).sum(0), "dim=-1"),
        (lambda w: torch.where((w == 0).any(-1), torch.full(w.shape[:-1], 0.3), right_entropy(w)), "where a weight is 0"),
        (lambda w: right_entropy(w) + 0.1, "the entropy"),
        (lambda w: [0.0] * w.shape[0], "torch.Tensor"),
    ],
)
def test_entropy_fallbacks(fn, hint: str) -> None:
    fb = check_entropy(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


def test_training_comparison_is_seeded_and_leaves_threads_alone() -> None:
    from attnbook.ch03 import train_marker_scaling

    threads = torch.get_num_threads()
    a = train_marker_scaling("Adam", False, seed=1, d_k=16, steps=20, every=10)
    b = train_marker_scaling("Adam", False, seed=1, d_k=16, steps=20, every=10)
    assert a == b and len(a) == 2 and torch.get_num_threads() == threads
    assert train_marker_scaling("SGD", True, seed=1, d_k=16, steps=20, every=10) != a


def test_training_comparison_takes_a_learning_rate() -> None:
    """The learning-rate control: ``lr`` overrides TRAIN_LR, and leaving it out is TRAIN_LR."""
    from attnbook.ch03 import TRAIN_LR, train_marker_scaling

    default = train_marker_scaling("Adam", False, seed=1, d_k=16, steps=20, every=10)
    assert train_marker_scaling("Adam", False, seed=1, d_k=16, steps=20, every=10, lr=TRAIN_LR["Adam"]) == default
    assert train_marker_scaling("Adam", False, seed=1, d_k=16, steps=20, every=10, lr=0.1) != default


def test_softmax_row_diagram_uses_the_real_softmax() -> None:
    from attnbook.ch03 import DIAGRAM_SCORES, _softmax_list, softmax_row_diagram

    expected = torch.softmax(torch.tensor(DIAGRAM_SCORES, dtype=torch.float64) / 8, dim=-1)
    assert torch.allclose(torch.tensor(_softmax_list(DIAGRAM_SCORES, 8.0), dtype=torch.float64), expected)
    assert ", ".join(f"{w:.2f}" for w in expected.tolist()) in softmax_row_diagram().alt


# ---------------------------------------------------------------- readers' answers, by hand


@pytest.mark.parametrize(
    "fn",
    [
        lambda q, k, t=1.0: torch.softmax(q @ k.transpose(-2, -1) / math.isqrt(q.shape[-1]) / t, -1),
        lambda q, k, t=1.0: torch.softmax(q @ k.transpose(-2, -1) / int(q.shape[-1] ** 0.5) / t, -1),
    ],
    ids=["math.isqrt", "int(d_k ** 0.5)"],
)
def test_whole_number_sqrt_is_named(fn) -> None:
    fb = check_scaled_weights(fn)
    assert fb.status == "wrong" and "whole number" in fb.message, fb


@pytest.mark.parametrize(
    "fn",
    [
        lambda q, k, t=1.0: torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5 / t, -1),
        lambda q, k, t=1.0: torch.softmax(q @ k.mT * torch.tensor(q.shape[-1], dtype=q.dtype).rsqrt() / t, -1),
        lambda q, k, t=1.0: torch.softmax(torch.einsum("...qd,...kd->...qk", q / t, k) / math.sqrt(k.shape[-1]), -1),
    ],
    ids=["** 0.5", "rsqrt", "einsum"],
)
def test_right_weights_written_differently_pass(fn) -> None:
    assert check_scaled_weights(fn).passed


def test_log_softmax_and_float32_weights_are_named() -> None:
    fb = check_scaled_weights(lambda q, k, t=1.0: torch.log_softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) / t, -1))
    assert fb.status == "wrong" and "log_softmax" in fb.message, fb
    as_float = lambda q, k, t=1.0: torch.softmax(q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1]) / t, -1)  # noqa: E731
    fb = check_scaled_weights(as_float)
    assert fb.status == "wrong" and "float32 for float64 inputs" in fb.message, fb


@pytest.mark.parametrize("eps", [1e-3, 1e-4, 1e-5])
def test_epsilon_inside_the_log_is_named(eps: float) -> None:
    fb = check_entropy(lambda w: -(w * torch.log(w + eps)).sum(-1))
    assert fb.status == "wrong" and "epsilon inside the log" in fb.message, fb


def test_float32_entropy_is_named() -> None:
    fb = check_entropy(lambda w: -(w.float() * torch.log(w.float().clamp_min(1e-30))).sum(-1))
    assert fb.status == "wrong" and "float32 for float64 inputs" in fb.message, fb
    where = lambda w: -torch.where(w > 0, w * torch.log(w), torch.zeros_like(w)).sum(-1)  # noqa: E731
    assert check_entropy(where).passed


def test_first_step_gradient_ratio_is_not_sqrt_dk() -> None:
    from attnbook.ch03 import marker_query_grad

    threads = torch.get_num_threads()
    ratio = marker_query_grad(False, seed=0, d_k=256) / marker_query_grad(True, seed=0, d_k=256)
    assert 1 < ratio < 16 and torch.get_num_threads() == threads


def test_softcap_diagram_draws_the_chapters_cap() -> None:
    from attnbook.ch03 import SOFTCAP, softcap_diagram

    assert SOFTCAP == 50.0  # the notebook asserts Gemma 2's attn_logit_softcapping is this value
    assert f"{50 * math.tanh(1):.1f} at s = 50" in softcap_diagram().alt


@pytest.mark.parametrize(
    "fn",
    [
        lambda w: -(w * torch.log(w.clamp_min(1e-3))).sum(-1),
        lambda w: -(w * torch.log(w.clamp_min(2.2e-3))).sum(-1),
        lambda w: -torch.where(w > 1e-3, w * torch.log(w), 0).sum(-1),
        lambda w: -torch.where(w > 1e-4, w * torch.log(w), 0).sum(-1),
    ],
    ids=["clamp_min(1e-3)", "clamp_min(2.2e-3)", "drop below 1e-3", "drop below 1e-4"],
)
def test_a_clamp_or_threshold_that_touches_small_weights_is_named(fn) -> None:
    """Right on the short rows (no non-zero weight there is below 0.0022), too low on the long rows."""
    fb = check_entropy(fn)
    assert fb.status == "wrong" and "too low on long rows" in fb.message and "1e-4 are ordinary" in fb.message, fb


def test_a_clamp_at_the_dtypes_tiny_passes_on_long_rows() -> None:
    assert check_entropy(lambda w: -(w * torch.log(w.clamp_min(torch.finfo(w.dtype).tiny))).sum(-1)).passed
    assert check_entropy(lambda w: -(w * torch.log(torch.where(w == 0, torch.ones_like(w), w))).sum(-1)).passed
    assert check_entropy(lambda w: -(w * torch.log(w)).nan_to_num(0.0).sum(-1)).passed


def test_categorical_entropy_is_refused() -> None:
    fb = check_entropy(lambda w: torch.distributions.Categorical(probs=w).entropy())
    assert fb.status == "wrong" and "Categorical(...).entropy()" in fb.message, fb


@pytest.mark.parametrize("eps", [1e-6, 1e-7, 1e-8, 1e-9, 1e-12])
def test_a_tiny_epsilon_inside_the_log_is_named(eps: float) -> None:
    """The float64 rows of 65,536 keys (one uniform, one of weights from 1e-9 to 1e-7) show any epsilon."""
    fb = check_entropy(lambda w: -(w * torch.log(w + eps)).sum(-1))
    assert fb.status == "wrong" and "epsilon inside the log" in fb.message, fb


@pytest.mark.parametrize(
    "fn",
    [
        lambda w: -(w * torch.log(w.clamp_min(1e-5))).sum(-1),
        lambda w: -(w * torch.log(w.clamp_min(1e-8))).sum(-1),
        lambda w: -torch.where(w > 1e-6, w * torch.log(w), 0).sum(-1),
    ],
    ids=["clamp_min(1e-5)", "clamp_min(1e-8)", "drop below 1e-6"],
)
def test_a_clamp_or_threshold_below_the_long_rows_weights_is_named(fn) -> None:
    fb = check_entropy(fn)
    assert fb.status == "wrong" and "1e-4 are ordinary" in fb.message and "1e-9" in fb.message, fb


@pytest.mark.parametrize("shift", [False, True])
def test_hand_written_softmax_without_keepdim_is_named(shift: bool) -> None:
    def weights(q: Tensor, k: Tensor, temperature: float = 1.0) -> Tensor:
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) / temperature  # [..., S_q, S_k]
        e = torch.exp(s - s.max(dim=-1).values) if shift else torch.exp(s)  # no keepdim: [..., S_q] does not broadcast
        return e / e.sum(dim=-1)

    fb = check_scaled_weights(weights)
    assert fb.status == "wrong" and "keepdim=True" in fb.message and "raised" not in fb.message, fb.message


# ---------------------------------------------------------------- the dtype rule and hard-coded divisors


@pytest.mark.parametrize(
    "fn",
    [
        lambda q, k, t=1.0: torch.softmax(q.float() @ k.float().mT / q.shape[-1] ** 0.5 / t, -1).to(q.dtype),
        lambda q, k, t=1.0: torch.softmax(q.float() @ k.float().mT / math.sqrt(q.shape[-1]) / t, -1).double(),
    ],
    ids=["float() ... to(q.dtype)", "float() ... double()"],
)
def test_weights_computed_in_float32_and_cast_back_are_refused(fn) -> None:
    """Off by about 5e-8 on the float64 case, inside ATOL: the exercise asks for at least the inputs' precision."""
    fb = check_scaled_weights(fn)
    assert fb.status == "wrong" and "carries only float32's precision" in fb.message, fb


@pytest.mark.parametrize(
    "fn",
    [
        lambda q, k, t=1.0: torch.softmax(q @ k.mT / torch.sqrt(torch.tensor(q.size(-1))) / t, -1),
        lambda q, k, t=1.0: torch.softmax(q @ k.mT * torch.rsqrt(torch.tensor(q.shape[-1])) / t, -1),
        lambda q, k, t=1.0: torch.softmax(q @ k.mT / torch.tensor(q.shape[-1]) ** 0.5 / t, -1),
        lambda q, k, t=1.0: torch.softmax(q @ k.mT / math.sqrt(q.shape[-1]) / torch.tensor(t), -1),
    ],
    ids=["sqrt(tensor(d_k))", "rsqrt(tensor(d_k))", "tensor(d_k) ** 0.5", "tensor(temperature)"],
)
def test_a_float32_divisor_is_named_not_blamed_on_a_cast(fn) -> None:
    fb = check_scaled_weights(fn)
    assert fb.status == "wrong" and "you divided by a float32 tensor" in fb.message, fb


def test_a_float64_divisor_tensor_passes() -> None:
    fn = lambda q, k, t=1.0: torch.softmax(  # noqa: E731
        q @ k.mT / torch.tensor(q.shape[-1], dtype=q.dtype).sqrt() / torch.tensor(t, dtype=q.dtype), -1)
    assert check_scaled_weights(fn).passed


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda q, k, t=1.0: torch.softmax(q @ k.mT / math.sqrt(64) / t, -1), "8 = sqrt(64)"),
        (lambda q, k, t=1.0: torch.softmax(q @ k.mT / 8 / t, -1), "8 = sqrt(64)"),
        (lambda q, k, t=1.0: torch.softmax(q @ k.mT / math.sqrt(8) / t, -1), "you divided by sqrt(8)"),
        (lambda q, k, t=1.0: torch.softmax(q @ k.mT / math.sqrt(q.shape[0]) / t, -1), "the batch size B"),
        (lambda q, k, t=1.0: torch.softmax(q @ k.mT / math.sqrt(k.shape[0]) / t, -1), "the batch size B"),
        (lambda q, k, t=1.0: torch.softmax(q @ k.mT / math.sqrt(q.shape[-1]) / t, -1).transpose(-2, -1), "Don't transpose"),
    ],
    ids=["sqrt(64)", "8", "sqrt(8)", "sqrt(q.shape[0])", "sqrt(k.shape[0])", "transposed"],
)
def test_hard_coded_divisors_and_a_transposed_result_are_named(fn, hint: str) -> None:
    fb = check_scaled_weights(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


def test_the_weight_cases_tell_the_hard_coded_divisors_apart() -> None:
    """No case has the chapter's D_k = 64 or a D_k of 8, and the batch size differs from D_k in every case."""
    from attnbook.ch03 import CHAPTER_D_K, WEIGHT_CASES

    for B, _s_q, _s_k, d_k, _t, _dtype in WEIGHT_CASES:
        assert d_k not in (CHAPTER_D_K, 8) and B != d_k


@pytest.mark.parametrize(
    "fn",
    [
        lambda w: -(w * torch.log(w.to(torch.float32).clamp_min(1e-30))).sum(-1),
        lambda w: -(w.float() * torch.log(w.float().clamp_min(1e-38))).sum(-1).to(w.dtype),
    ],
    ids=["float32 log", "float32 throughout, cast back"],
)
def test_entropy_computed_in_float32_is_named(fn) -> None:
    fb = check_entropy(fn)
    assert fb.status == "wrong" and "carries only float32's precision" in fb.message, fb
