"""Chapter 2's checkers: each passes a right answer and names every mistake of its tables."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook.ch02 import (
    OUTPUT_MISTAKES,
    S_K,
    WEIGHT_MISTAKES,
    check_cross_attention,
    check_self_attention,
    qkv_inputs,
    reference_attention,
)


def stub(*args: object) -> None:
    raise NotImplementedError


def self_right(x, w_q, w_k, w_v):
    return reference_attention(x, x, w_q, w_k, w_v)


def cross_right(x_q, x_kv, w_q, w_k, w_v):
    return reference_attention(x_q, x_kv, w_q, w_k, w_v)


def _applies(m, x_q, x_kv) -> bool:
    """A mistake applies to a test case when it can be computed there and differs from the right weights."""
    t = qkv_inputs()
    try:
        got = m.compute(x_q, x_kv, t["w_q"], t["w_k"], t["w_v"])
    except Exception:
        return False
    right = reference_attention(x_q, x_kv, t["w_q"], t["w_k"], t["w_v"])[1]
    return not (got.shape == right.shape and torch.allclose(got, right))


_T = qkv_inputs()
SELF_WEIGHT = [m for m in WEIGHT_MISTAKES if _applies(m, _T["x_batch"], _T["x_batch"])]
CROSS_WEIGHT = [m for m in WEIGHT_MISTAKES if _applies(m, _T["x_q"], _T["x"])]


def test_the_tables_cover_both_exercises() -> None:
    assert len(SELF_WEIGHT) >= 12 and len(CROSS_WEIGHT) >= 12
    assert {m.name for m in WEIGHT_MISTAKES} == {m.name for m in SELF_WEIGHT} | {m.name for m in CROSS_WEIGHT}


# ---------------------------------------------------------------- self-attention


def test_self_attention_accepts_the_right_answer_and_refuses_an_attention_function() -> None:
    assert check_self_attention(self_right).passed

    def sdpa(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        w = torch.softmax(q @ k.mT * q.shape[-1] ** -0.5, dim=-1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v), w

    fb = check_self_attention(sdpa)  # the exercise: "without calling any attention function"
    assert fb.status == "wrong" and "F.scaled_dot_product_attention" in fb.message, fb

    def library(x, w_q, w_k, w_v):
        import attnlib

        r = attnlib.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)
        return r.output, r.weights

    fb = check_self_attention(library)
    assert fb.status == "wrong" and "attnlib.scaled_dot_product_attention" in fb.message, fb


def test_self_attention_k_dot_t_on_a_batch_is_explained() -> None:
    def dot_t(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        w = torch.softmax(q @ k.T / math.sqrt(k.shape[-1]), dim=-1)
        return w @ v, w

    fb = check_self_attention(dot_t)
    assert fb.status == "wrong" and "k.transpose(-2, -1)" in fb.message, fb


def test_self_attention_names_new_mistakes_and_a_dtype_cast() -> None:
    def transposed(x, w_q, w_k, w_v):
        out, w = self_right(x, w_q, w_k, w_v)
        return out, w.mT

    assert "transposed" in check_self_attention(transposed).message
    times = lambda x, wq, wk, wv: (  # noqa: E731
        lambda w: (w @ (x @ wv), w)
    )(torch.softmax((x @ wq) @ (x @ wk).mT / (1 / wq.shape[1] ** 0.5), dim=-1))
    assert "multiplied the scores by sqrt(D_k)" in check_self_attention(times).message
    as_float = lambda x, wq, wk, wv: self_right(x.float(), wq.float(), wk.float(), wv.float())  # noqa: E731
    fb = check_self_attention(as_float)
    assert fb.status == "wrong" and "torch.float32" in fb.message, fb


def test_self_attention_stub_is_todo() -> None:
    assert check_self_attention(stub).status == "todo"


@pytest.mark.parametrize("mistake", SELF_WEIGHT, ids=lambda m: m.name)
def test_self_attention_names_each_weight_mistake(mistake) -> None:
    def reader(x, w_q, w_k, w_v):
        return self_right(x, w_q, w_k, w_v)[0], mistake.compute(x, x, w_q, w_k, w_v)

    fb = check_self_attention(reader)
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


@pytest.mark.parametrize("mistake", [m for m in OUTPUT_MISTAKES if m.name != "values from x_q"],  # x_q is x_kv here
                         ids=lambda m: m.name)
def test_self_attention_names_each_output_mistake(mistake) -> None:

    def reader(x, w_q, w_k, w_v):
        return mistake.compute(x, x, w_q, w_k, w_v), self_right(x, w_q, w_k, w_v)[1]

    fb = check_self_attention(reader)
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


def test_self_attention_divided_by_sqrt_d_v_has_its_own_hint() -> None:
    def reader(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        w = torch.softmax(q @ k.mT / math.sqrt(v.shape[-1]), dim=-1)
        return w @ v, w

    assert "sqrt(D_v)" in check_self_attention(reader).message


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda *a: self_right(*a)[::-1], "in that order"),
        (lambda *a: self_right(*a)[0], "return a pair"),
        (lambda *a: (self_right(*a)[0], "w"), "torch.Tensor"),
        (lambda *a: (self_right(*a)[0], self_right(*a)[1].roll(1, dims=-1)), "your weight matrix"),
        (lambda *a: (self_right(*a)[0], self_right(*a)[1] * 1.3), "your rows sum to 1.30"),
        (lambda *a: (self_right(*a)[0] + 0.1, self_right(*a)[1]), "your output"),
        (lambda x, *w: x @ torch.ones(2), "RuntimeError"),
    ],
)
def test_self_attention_fallbacks(fn, hint: str) -> None:
    fb = check_self_attention(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


# ---------------------------------------------------------------- cross-attention


def test_cross_attention_accepts_the_right_answer() -> None:
    fb = check_cross_attention(cross_right)
    assert fb.passed and "(3, 7)" in fb.message, fb


def test_cross_attention_rejects_a_self_attention_answer_and_stub() -> None:
    assert check_cross_attention(lambda x_q, x_kv, *w: self_right(x_kv, *w)).status == "wrong"
    assert check_cross_attention(stub).status == "todo"


@pytest.mark.parametrize("mistake", CROSS_WEIGHT, ids=lambda m: m.name)
def test_cross_attention_names_each_weight_mistake(mistake) -> None:
    def reader(x_q, x_kv, w_q, w_k, w_v):
        return cross_right(x_q, x_kv, w_q, w_k, w_v)[0], mistake.compute(x_q, x_kv, w_q, w_k, w_v)

    fb = check_cross_attention(reader)
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


@pytest.mark.parametrize("mistake", [m for m in OUTPUT_MISTAKES if m.name not in ("weights.T @ V", "output = V")],
                         ids=lambda m: m.name)
def test_cross_attention_names_each_output_mistake(mistake) -> None:
    def reader(x_q, x_kv, w_q, w_k, w_v):
        return mistake.compute(x_q, x_kv, w_q, w_k, w_v), cross_right(x_q, x_kv, w_q, w_k, w_v)[1]

    fb = check_cross_attention(reader)
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


def test_cross_attention_values_from_x_q_is_not_a_raw_exception() -> None:
    def reader(x_q, x_kv, w_q, w_k, w_v):
        w = torch.softmax((x_q @ w_q) @ (x_kv @ w_k).T / math.sqrt(w_k.shape[1]), dim=-1)
        return w @ (x_q @ w_v), w

    fb = check_cross_attention(reader)
    assert "RuntimeError" not in fb.message and "values from x_q" in fb.message, fb
    assert qkv_inputs(S_K)["x_q"].shape[0] == S_K


# ---------------------------------------------------------------- the head that learns


def test_marker_batch_targets_the_marked_token() -> None:
    from attnbook.ch02 import marker_batch

    x, target, marked = marker_batch(5, 7, 3, torch.Generator().manual_seed(0))
    assert x.shape == (5, 7, 5) and target.shape == (5, 7, 3) and marked.shape == (5,)
    assert torch.equal(x[..., 3].sum(dim=1), torch.ones(5)) and (x[..., 4] == 1).all()
    for b in range(5):
        assert torch.equal(x[b, marked[b], 3], torch.tensor(1.0))
        assert torch.equal(target[b], x[b, marked[b], :3].expand(7, 3))


def test_trained_head_finds_the_marked_token() -> None:
    from attnbook.ch02 import marker_batch, train_marker_head

    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    head, losses = train_marker_head(steps=300)
    assert torch.equal(torch.rand(2), expected)                    # the reader's generator is untouched
    assert losses[-1] < 0.01 * losses[0]
    x, _, marked = marker_batch(200, 8, 6, torch.Generator().manual_seed(9))
    with torch.no_grad():
        _, w = head(x)
    assert w[torch.arange(200), :, marked].mean() > 0.9


def _notebook_markdown() -> str:
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parents[1] / "book" / "02_queries_keys_values.ipynb").read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def test_exercise_texts_state_the_sizes_the_checkers_use() -> None:
    """The exercises tell the reader the checker's sizes; they must be the sizes of CASES."""
    from attnbook.ch02 import BATCHES, CASES

    text = _notebook_markdown()
    for (s_q, s_k, d, d_k, d_v, _), b in zip(CASES, BATCHES):
        assert f"({b}, {s_k}, {d}, {d_k}, {d_v})" in text, "self-attention exercise: (B, S, D, D_k, D_v) of a case"
        assert f"$S_q = {s_q}$" in text and f"$S_k = {s_k}$" in text, "cross-attention exercise: S_q and S_k"
