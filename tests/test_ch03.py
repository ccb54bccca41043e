"""Chapter 3 checkers: a right answer passes, each typical wrong answer gets its own hint."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from attnbook.ch03 import check_entropy, check_scaled_weights, entropy


def _raw(q: Tensor, k: Tensor) -> Tensor:
    return q @ k.transpose(-2, -1)


def right_weights(q: Tensor, k: Tensor, temperature: float = 1.0) -> Tensor:
    return torch.softmax(_raw(q, k) / math.sqrt(q.shape[-1]) / temperature, dim=-1)


def test_right_weights_pass() -> None:
    fb = check_scaled_weights(right_weights)
    assert fb.status == "correct", fb


def test_right_weights_via_attnlib_pass() -> None:
    import attnlib

    def via_library(q: Tensor, k: Tensor, temperature: float = 1.0) -> Tensor:
        return attnlib.scaled_dot_product_attention(q, k, k, temperature=temperature).weights

    assert check_scaled_weights(via_library).passed


def test_weights_stub_is_todo() -> None:
    def stub(q: Tensor, k: Tensor, temperature: float = 1.0) -> Tensor:
        raise NotImplementedError

    assert check_scaled_weights(stub).status == "todo"


WRONG_WEIGHTS = {
    "no scaling": (lambda q, k, t=1.0: torch.softmax(_raw(q, k) / t, -1), "did not scale"),
    "divide by D_k": (lambda q, k, t=1.0: torch.softmax(_raw(q, k) / q.shape[-1] / t, -1), "divided by D_k instead of sqrt(D_k)"),
    "multiply by sqrt": (lambda q, k, t=1.0: torch.softmax(_raw(q, k) * math.sqrt(q.shape[-1]) / t, -1), "multiplied by sqrt(D_k)"),
    "scale after softmax": (lambda q, k, t=1.0: torch.softmax(_raw(q, k) / t, -1) / math.sqrt(q.shape[-1]), "scaled after the softmax"),
    "sqrt(S_k)": (lambda q, k, t=1.0: torch.softmax(_raw(q, k) / math.sqrt(k.shape[-2]) / t, -1), "sqrt(S_k)"),
    "sqrt(S_q)": (lambda q, k, t=1.0: torch.softmax(_raw(q, k) / math.sqrt(q.shape[-2]) / t, -1), "sqrt(S_q)"),
    "wrong axis": (lambda q, k, t=1.0: torch.softmax(_raw(q, k) / math.sqrt(q.shape[-1]) / t, -2), "wrong axis"),
    "k q^T": (lambda q, k, t=1.0: torch.softmax(k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1]) / t, -1), "not k @ q^T"),
    "k.T": (lambda q, k, t=1.0: torch.softmax((q @ k.T) / math.sqrt(q.shape[-1]) / t, -1), "k.transpose(-2, -1)"),
    "ignores T": (lambda q, k, t=1.0: right_weights(q, k), "ignores the temperature"),
    "multiplies by T": (lambda q, k, t=1.0: torch.softmax(_raw(q, k) / math.sqrt(q.shape[-1]) * t, -1), "multiplied by the temperature"),
    "T after softmax": (lambda q, k, t=1.0: right_weights(q, k) / t, "temperature after the softmax"),
    "T squared": (lambda q, k, t=1.0: right_weights(q, k, t * t), "divided by T twice"),
    "rows not normalised": (lambda q, k, t=1.0: torch.exp(_raw(q, k) / math.sqrt(q.shape[-1]) / t), "should each sum to 1"),
}


@pytest.mark.filterwarnings("ignore:The use of `x.T`")  # the "k.T" mistake triggers PyTorch's deprecation warning
@pytest.mark.parametrize("name", WRONG_WEIGHTS)
def test_wrong_weights_get_their_hint(name: str) -> None:
    fn, hint = WRONG_WEIGHTS[name]
    fb = check_scaled_weights(fn)
    assert fb.status == "wrong", (name, fb)
    assert hint in fb.message, (name, fb.message)


def test_weights_not_a_tensor_or_crash() -> None:
    assert "torch.Tensor" in check_scaled_weights(lambda q, k, t=1.0: [1.0]).message
    fb = check_scaled_weights(lambda q, k, t=1.0: q @ k)  # shape mismatch inside the reader's code
    assert fb.status == "wrong" and "RuntimeError" in fb.message


def test_entropy_reference() -> None:
    w = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]])
    assert torch.allclose(entropy(w), torch.tensor([0.0, math.log(4), math.log(2)]))


def right_entropy(w: Tensor) -> Tensor:
    return -(w * torch.log(w.clamp_min(1e-30))).sum(dim=-1)


def test_right_entropy_passes() -> None:
    assert check_entropy(right_entropy).status == "correct"
    assert check_entropy(lambda w: -torch.special.xlogy(w, w).sum(-1)).passed


def test_entropy_stub_is_todo() -> None:
    def stub(w: Tensor) -> Tensor:
        raise NotImplementedError

    assert check_entropy(stub).status == "todo"
    assert check_entropy(lambda w: None).status == "todo"


WRONG_ENTROPY = {
    "log2": (lambda w: -(w * torch.log2(w.clamp_min(1e-30))).sum(-1), "log2"),
    "log10": (lambda w: -(w * torch.log10(w.clamp_min(1e-30))).sum(-1), "log10"),
    "no minus": (lambda w: (w * torch.log(w.clamp_min(1e-30))).sum(-1), "minus sign"),
    "normalised": (lambda w: right_entropy(w) / math.log(w.shape[-1]), "divided by ln S"),
    "nan at zeros": (lambda w: -(w * torch.log(w)).sum(-1), "0 * ln 0"),
    "per entry": (lambda w: -(w * torch.log(w.clamp_min(1e-30))), "one number per weight"),
    "wrong axis": (lambda w: -(w * torch.log(w.clamp_min(1e-30))).sum(0), "dim=-1"),
    "unweighted": (lambda w: -torch.log(w.clamp_min(1e-30)).sum(-1), "without weighting"),
}


@pytest.mark.parametrize("name", WRONG_ENTROPY)
def test_wrong_entropy_gets_its_hint(name: str) -> None:
    fn, hint = WRONG_ENTROPY[name]
    fb = check_entropy(fn)
    assert fb.status == "wrong", (name, fb)
    assert hint in fb.message, (name, fb.message)


def test_entropy_wrong_only_at_zeros() -> None:
    def off_at_zeros(w: Tensor) -> Tensor:
        return torch.where((w == 0).any(-1), torch.full(w.shape[:-1], 0.3), right_entropy(w))

    fb = check_entropy(off_at_zeros)
    assert fb.status == "wrong" and "where a weight is 0" in fb.message


def test_unrecognised_wrong_answers_are_not_marked_correct() -> None:
    """Answers that match no known mistake fall through to the generic comparison: still wrong."""

    def off_only_for_other_temperatures(q: Tensor, k: Tensor, temperature: float = 1.0) -> Tensor:
        w = right_weights(q, k, temperature)
        return w if temperature == 1.0 else (w + 0.05) / (1 + 0.05 * w.shape[-1])

    fb = check_scaled_weights(off_only_for_other_temperatures)
    assert fb.status == "wrong" and "T = 2.5" in fb.message, fb
    fb = check_entropy(lambda w: right_entropy(w) + 0.1)
    assert fb.status == "wrong" and "the entropy" in fb.message, fb
    fb = check_entropy(lambda w: [0.0] * w.shape[0])
    assert fb.status == "wrong" and "torch.Tensor" in fb.message, fb
