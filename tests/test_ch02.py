"""Chapter 2's checkers: each passes a right answer and names each typical mistake."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook.ch02 import check_cross_attention, check_self_attention


def stub(*args: object) -> None:
    raise NotImplementedError


# ---------------------------------------------------------------- chapter 2: self-attention


def attention(x_q, x_kv, w_q, w_k, w_v, *, softmax_dim=-1, scale="sqrt_dk", kq=False, project=True,
              mix="v", transpose_weights=False):
    """Attention with one switchable mistake; the defaults give the right answer."""
    q, k, v = (x_q @ w_q, x_kv @ w_k, x_kv @ w_v) if project else (x_q, x_kv, x_kv @ w_v)
    raw = k @ q.T if kq else q @ k.T
    d_k = q.shape[-1]
    divisor = {"sqrt_dk": math.sqrt(d_k), "none": 1.0, "dk": d_k, "sqrt_d": math.sqrt(x_q.shape[-1])}[scale]
    weights = torch.softmax(raw / divisor, dim=softmax_dim)
    source = {"v": v, "x": x_kv, "k": k, "none": None}[mix]
    w = weights.T if transpose_weights else weights
    output = w if source is None else w @ source
    return output, weights


def self_attention_right(x, w_q, w_k, w_v):
    return attention(x, x, w_q, w_k, w_v)


def self_mistake(**kw):
    return lambda x, w_q, w_k, w_v: attention(x, x, w_q, w_k, w_v, **kw)


def raw_scores_as_weights(x, w_q, w_k, w_v):
    scores = (x @ w_q) @ (x @ w_k).T
    return scores @ (x @ w_v), scores


SELF_MISTAKES = {
    "softmax over dim 0": (self_mistake(softmax_dim=0), "did you apply softmax over the right axis?"),
    "no scale": (self_mistake(scale="none"), "you forgot to divide by sqrt(D_k): your weights are too peaked"),
    "scale by D_k": (self_mistake(scale="dk"), "instead of sqrt(D_k)"),
    "scale by sqrt(D)": (self_mistake(scale="sqrt_d"), "you divided by sqrt(D)"),
    "forgot V": (self_mistake(mix="none"), "did you forget to multiply by V?"),
    "K Q^T": (self_mistake(kq=True), "K @ Q.T"),
    "no projection": (self_mistake(project=False), "Project first"),
    "mixed x": (self_mistake(mix="x"), "you mixed the rows of x"),
    "mixed keys": (self_mistake(mix="k"), "you mixed the keys"),
    "weights.T @ V": (self_mistake(transpose_weights=True), "weights.T @ V"),
    "raw scores": (raw_scores_as_weights, "raw scores"),
    "swapped": (lambda *a: self_attention_right(*a)[::-1], "in that order"),
    "not a pair": (lambda *a: self_attention_right(*a)[0], "return a pair"),
    "output equals V": (lambda x, w_q, w_k, w_v: (x @ w_v, self_attention_right(x, w_q, w_k, w_v)[1]), "no mixing happened"),
    "other weights": (lambda *a: (self_attention_right(*a)[0], self_attention_right(*a)[1].roll(1, dims=-1)), "your weight matrix"),
    "other output": (lambda *a: (self_attention_right(*a)[0] + 0.1, self_attention_right(*a)[1]), "your output"),
}


def test_self_attention_accepts_the_right_answer() -> None:
    fb = check_self_attention(self_attention_right)
    assert fb.passed, fb


def test_self_attention_accepts_torch_sdpa_style() -> None:
    def sdpa(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        w = torch.softmax(q @ k.T * q.shape[-1] ** -0.5, dim=-1)
        return torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0], w

    assert check_self_attention(sdpa).passed


def test_self_attention_stub_is_todo() -> None:
    assert check_self_attention(stub).status == "todo"


@pytest.mark.parametrize("name", sorted(SELF_MISTAKES))
def test_self_attention_names_the_mistake(name: str) -> None:
    fn, hint = SELF_MISTAKES[name]
    fb = check_self_attention(fn)
    assert fb.status == "wrong", fb
    assert hint in fb.message, fb


def test_softmax_axis_hint_reports_the_row_sum() -> None:
    fb = check_self_attention(self_mistake(softmax_dim=0))
    assert fb.message.startswith("your rows sum to ") and "columns sum to 1" in fb.message
    value = float(fb.message.split("your rows sum to ")[1].split(" ")[0])
    assert abs(value - 1.0) > 0.05


# ---------------------------------------------------------------- chapter 2: cross-attention


def cross_right(x_q, x_kv, w_q, w_k, w_v):
    return attention(x_q, x_kv, w_q, w_k, w_v)


def cross_mistake(**kw):
    return lambda x_q, x_kv, w_q, w_k, w_v: attention(x_q, x_kv, w_q, w_k, w_v, **kw)


CROSS_MISTAKES = {
    "keys from x_q": (lambda x_q, x_kv, *w: attention(x_q, x_q, *w), "you took the keys from the query sequence"),
    "queries from x_kv": (lambda x_q, x_kv, *w: attention(x_kv, x_kv, *w), "you took the queries from x_kv"),
    "K Q^T": (cross_mistake(kq=True, mix="none"), "you computed K @ Q.T"),
    "forgot V": (cross_mistake(mix="none"), "did you forget to multiply by V?"),
    "softmax over dim 0": (cross_mistake(softmax_dim=0), "did you apply softmax over the right axis?"),
    "no scale": (cross_mistake(scale="none"), "you forgot to divide by sqrt(D_k)"),
    "no projection": (cross_mistake(project=False), "Project first"),
    "mixed x": (cross_mistake(mix="x"), "you mixed the rows of x"),
}


def test_cross_attention_accepts_the_right_answer() -> None:
    fb = check_cross_attention(cross_right)
    assert fb.passed, fb
    assert "(3, 5)" in fb.message


def test_cross_attention_rejects_a_self_attention_answer() -> None:
    assert check_cross_attention(lambda x_q, x_kv, *w: self_attention_right(x_kv, *w)).status == "wrong"


def test_cross_attention_stub_is_todo() -> None:
    assert check_cross_attention(stub).status == "todo"


@pytest.mark.parametrize("name", sorted(CROSS_MISTAKES))
def test_cross_attention_names_the_mistake(name: str) -> None:
    fn, hint = CROSS_MISTAKES[name]
    fb = check_cross_attention(fn)
    assert fb.status == "wrong", fb
    assert hint in fb.message, fb
