"""Chapter 2's checkers: each passes a right answer and names every mistake of its tables."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook.ch02 import (
    OUTPUT_MISTAKES,
    PROBE_MISTAKES,
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


def _computable(m, x_q, x_kv) -> bool:
    """An output mistake applies where it can be computed (some are worded for a batch, some for 2-D inputs)."""
    t = qkv_inputs()
    try:
        m.compute(x_q, x_kv, t["w_q"], t["w_k"], t["w_v"])
    except Exception:
        return False
    return True


_T = qkv_inputs()
SELF_WEIGHT = [m for m in WEIGHT_MISTAKES if _applies(m, _T["x_batch"], _T["x_batch"])]
CROSS_WEIGHT = [m for m in WEIGHT_MISTAKES if _applies(m, _T["x_q"], _T["x"])]
SELF_OUTPUT = [m for m in OUTPUT_MISTAKES if _computable(m, _T["x_batch"], _T["x_batch"])]
CROSS_OUTPUT = [m for m in OUTPUT_MISTAKES if _computable(m, _T["x_q"], _T["x"])]


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


@pytest.mark.parametrize("mistake", [m for m in SELF_OUTPUT if m.name != "values from x_q"],  # x_q is x_kv here
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


@pytest.mark.parametrize("mistake", [m for m in CROSS_OUTPUT if m.name not in ("weights.T @ V", "output = V")],
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


# ---------------------------------------------------------------- the fresh reading of chapters 1-2


def _self_in(dtype, *, output_only: bool = False):
    def fn(x, w_q, w_k, w_v):
        low = (lambda t: t) if output_only else (lambda t: t.to(dtype))
        q, k, v = low(x) @ low(w_q), low(x) @ low(w_k), low(x) @ low(w_v)
        w = torch.softmax(q @ k.mT / math.sqrt(k.shape[-1]), dim=-1)
        out = w.to(dtype) @ v.to(dtype) if output_only else w @ v
        return out.to(x.dtype), w.to(x.dtype)

    return fn


def _cross_in(dtype):
    def fn(x_q, x_kv, w_q, w_k, w_v):
        q, k, v = x_q.to(dtype) @ w_q.to(dtype), x_kv.to(dtype) @ w_k.to(dtype), x_kv.to(dtype) @ w_v.to(dtype)
        w = torch.softmax(q @ k.T / math.sqrt(k.shape[-1]), dim=-1)
        return (w @ v).to(x_q.dtype), w.to(x_q.dtype)

    return fn


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision_cast_back_is_named_not_the_softmax_axis(dtype) -> None:
    for fb in (check_self_attention(_self_in(dtype)), check_cross_attention(_cross_in(dtype))):
        assert fb.status == "wrong" and "float16 or bfloat16" in fb.message, fb
        assert "rows sum to" not in fb.message
    fb = check_self_attention(_self_in(dtype, output_only=True))
    assert fb.status == "wrong" and fb.message.startswith("your output is right only to about 3"), fb


def _projected(q_map: str, k_map: str):
    def fn(x_q, x_kv, w_q, w_k, w_v):
        maps = {"q": w_q, "k": w_k}
        w = torch.softmax((x_q @ maps[q_map]) @ (x_kv @ maps[k_map]).mT / math.sqrt(w_q.shape[1]), dim=-1)
        return w @ (x_kv @ w_v), w

    return fn


def test_a_shared_projection_is_named() -> None:
    assert "your keys were projected with w_q" in check_cross_attention(_projected("q", "q")).message
    assert "your queries were projected with w_k" in check_cross_attention(_projected("k", "k")).message
    for q_map, named in (("q", "keys projected with w_q"), ("k", "queries projected with w_k")):
        self_shared = lambda x, w_q, w_k, w_v, m=q_map: _projected(m, m)(x, x, w_q, w_k, w_v)  # noqa: E731
        assert named in check_self_attention(self_shared).message  # Q @ Q.T in self-attention


def _batched(*, dim: int = -1, scale=lambda k: k.shape[-1], transpose=lambda k: k.transpose(-2, -1), only_first=False):
    def fn(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        w = torch.softmax(q @ transpose(k) / math.sqrt(scale(k)), dim=dim)
        out = w @ v
        return (out[0], w[0]) if only_first else (out, w)

    return fn


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (_batched(only_first=True), "expected [B, S, S] = (3, 7, 7)"),
        (_batched(transpose=lambda k: k.transpose(0, 1)), "a transpose of the wrong pair"),
        (_batched(transpose=lambda k: k.transpose(0, 2)), "a transpose of the wrong pair"),
        (_batched(dim=0), "the batch axis B"),
        (_batched(scale=lambda k: k.shape[0]), "the square root of the batch size B"),
        (_batched(scale=lambda k: k.shape[1]), "you divided by sqrt(S), the sequence length: x.shape[1]"),
        (_batched(scale=lambda k: k.shape[-2]), "for x of shape [B, S, D]"),
    ],
)
def test_batched_slips_get_batched_hints(fn, hint: str) -> None:
    fb = check_self_attention(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


def test_right_variants_still_pass() -> None:
    def with_mT(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        return (lambda w: (w @ v, w))(torch.softmax((q / k.shape[-1] ** 0.25) @ (k / k.shape[-1] ** 0.25).mT, -1))

    def loop(x, w_q, w_k, w_v):
        pairs = [reference_attention(xb, xb, w_q, w_k, w_v) for xb in x]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])

    assert check_self_attention(with_mT).passed and check_self_attention(loop).passed
    assert check_cross_attention(lambda x_q, x_kv, *w: list(cross_right(x_q, x_kv, *w))).passed


# ---------------------------------------------------------------- hand-written softmax and scale slips


def _by_hand(*, keepdim: bool = True, scale_after: bool = False, row_max: bool = False, transpose_q: bool = False):
    def fn(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        if transpose_q:
            s = q.transpose(-2, -1) @ k / math.sqrt(k.shape[-1])
        else:
            s = q @ k.transpose(-2, -1) / (1.0 if scale_after else math.sqrt(k.shape[-1]))
        e = torch.exp(s - s.amax(dim=-1, keepdim=True)) if row_max else torch.exp(s)
        weights = e / e.sum(dim=-1, keepdim=keepdim)
        if scale_after:
            weights = weights / math.sqrt(k.shape[-1])
        return weights @ v, weights

    return fn


def _cross_by_hand(*, keepdim: bool = True, scale_after: bool = False):
    def fn(x_q, x_kv, w_q, w_k, w_v):
        q, k, v = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
        e = torch.exp(q @ k.T / (1.0 if scale_after else math.sqrt(k.shape[-1])))
        weights = e / e.sum(dim=-1, keepdim=keepdim)
        if scale_after:
            weights = weights / math.sqrt(k.shape[-1])
        return weights @ v, weights

    return fn


@pytest.mark.parametrize(
    ("check", "fn", "hint"),
    [
        (check_self_attention, _by_hand(keepdim=False), "drops the summed axis"),
        (check_cross_attention, _cross_by_hand(keepdim=False), "drops the summed axis"),
        (check_self_attention, _by_hand(scale_after=True), "sums to 1/sqrt(D_k), not 1: you divided by sqrt(D_k) after softmax"),
        (check_cross_attention, _cross_by_hand(scale_after=True), "sums to 1/sqrt(D_k), not 1: you divided by sqrt(D_k) after softmax"),
        (check_self_attention, _by_hand(transpose_q=True), "The error is in the score product"),
    ],
)
def test_softmax_slips_are_named_not_blamed_on_the_transpose_or_axis(check, fn, hint: str) -> None:
    fb = check(fn)
    assert fb.status == "wrong" and hint in fb.message, fb
    assert "apply softmax over the keys" not in fb.message
    if "score product" not in hint:
        assert "transpose" not in fb.message, fb


def test_transpose_advice_only_for_an_error_in_the_score_product() -> None:
    fb = check_self_attention(_by_hand(keepdim=False, row_max=True))  # not a table mistake: the row max does not cancel
    assert fb.status == "wrong" and "raised RuntimeError" in fb.message, fb
    assert "score product" not in fb.message and "k.transpose" not in fb.message, fb


@pytest.mark.parametrize("mistake", PROBE_MISTAKES, ids=lambda m: m.name)
def test_probe_mistakes_are_named_by_both_checkers(mistake) -> None:
    assert check_self_attention(_by_hand(keepdim=False)).message == mistake.hint
    assert check_cross_attention(_cross_by_hand(keepdim=False)).message == mistake.hint


def test_output_from_unscaled_weights_is_named() -> None:
    def reader(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1)
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v, weights  # the output forgot the scale

    fb = check_self_attention(reader)
    assert fb.status == "wrong" and "without the division by sqrt(D_k)" in fb.message, fb


def _attention_in(dtype, x_q, x_kv, w_q, w_k, w_v):
    back = x_q.dtype
    x_q, x_kv, w_q, w_k, w_v = (t.to(dtype) for t in (x_q, x_kv, w_q, w_k, w_v))
    q, k, v = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return (weights @ v).to(back), weights.to(back)


@pytest.mark.parametrize("check, fn", [
    (check_self_attention, lambda x, w_q, w_k, w_v: _attention_in(torch.float32, x, x, w_q, w_k, w_v)),
    (check_cross_attention, lambda x_q, x_kv, w_q, w_k, w_v: _attention_in(torch.float32, x_q, x_kv, w_q, w_k, w_v)),
])
def test_attention_computed_in_float32_on_float64_is_refused_by_the_dtype_rule(check, fn) -> None:
    fb = check(fn)
    assert fb.status == "wrong" and "carries only float32's precision" in fb.message, fb


@pytest.mark.parametrize("check, fn", [
    (check_self_attention, lambda x, w_q, w_k, w_v: _attention_in(torch.float64, x, x, w_q, w_k, w_v)),
    (check_cross_attention, lambda x_q, x_kv, w_q, w_k, w_v: _attention_in(torch.float64, x_q, x_kv, w_q, w_k, w_v)),
])
def test_attention_upcast_to_float64_inside_is_still_right(check, fn) -> None:
    assert check(fn).passed, check(fn)


# ---------------------------------------------------------------- the second expert reading


def _self_scaled_by(width):
    def fn(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(width), dim=-1)
        return weights @ v, weights

    return fn


def _cross_scaled_by(width):
    def fn(x_q, x_kv, w_q, w_k, w_v):
        q, k, v = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
        weights = torch.softmax(q @ k.T / math.sqrt(width), dim=-1)
        return weights @ v, weights

    return fn


@pytest.mark.parametrize("check, make", [(check_self_attention, _self_scaled_by), (check_cross_attention, _cross_scaled_by)])
@pytest.mark.parametrize("width, hint", [(4, "the chapter's D_k = 4, a variable of the notebook"), (16, "the chapter's D = 16")])
def test_a_notebook_global_width_is_named(check, make, width: int, hint: str) -> None:
    """math.sqrt(D_k) with the notebook's D_k = 4 (or D = 16): the checker's heads have D_k = 5 and 3."""
    fb = check(make(width))
    assert fb.status == "wrong" and hint in fb.message, fb


# ---------------------------------------------------------------- the third expert reading


def _self_scale(scale):
    def fn(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        weights = torch.softmax(q @ k.transpose(-2, -1) / scale(k.shape[-1]), dim=-1)
        return weights @ v, weights

    return fn


def _cross_scale(scale):
    def fn(x_q, x_kv, w_q, w_k, w_v):
        q, k, v = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
        weights = torch.softmax(q @ k.T / scale(k.shape[-1]), dim=-1)
        return weights @ v, weights

    return fn


@pytest.mark.parametrize("check, make", [(check_self_attention, _self_scale), (check_cross_attention, _cross_scale)])
@pytest.mark.parametrize("scale", [
    lambda d_k: torch.sqrt(torch.tensor(d_k)),  # torch.sqrt of an int tensor is float32
    lambda d_k: torch.sqrt(torch.tensor(d_k, dtype=torch.float32)),
    lambda d_k: torch.tensor(d_k, dtype=torch.float32) ** 0.5,
], ids=["sqrt-int-tensor", "sqrt-float32-tensor", "float32-tensor-pow"])
def test_a_float32_scale_is_named_not_blamed_on_a_cast(check, make, scale) -> None:
    fb = check(make(scale))
    assert fb.status == "wrong" and "your scale is a float32 tensor" in fb.message, fb
    assert ".float()" not in fb.message and "math.sqrt(k.shape[-1])" in fb.message, fb


@pytest.mark.parametrize("check, make", [(check_self_attention, _self_scale), (check_cross_attention, _cross_scale)])
def test_a_float64_scale_tensor_passes(check, make) -> None:
    assert check(make(lambda d_k: torch.sqrt(torch.tensor(d_k, dtype=torch.float64)))).passed


def _batch_loop(first: int, stop_early: int):
    def fn(x, w_q, w_k, w_v):
        B, S = x.shape[:2]
        output = torch.zeros(B, S, w_v.shape[1], dtype=x.dtype)
        weights = torch.zeros(B, S, S, dtype=x.dtype)
        for b in range(first, B - stop_early):
            q, k, v = x[b] @ w_q, x[b] @ w_k, x[b] @ w_v
            weights[b] = torch.softmax(q @ k.T / math.sqrt(k.shape[-1]), dim=-1)
            output[b] = weights[b] @ v
        return output, weights

    return fn


@pytest.mark.parametrize("first, stop_early, seq", [(0, 1, 2), (1, 0, 0)])
def test_a_batch_loop_that_skips_a_sequence_is_named(first: int, stop_early: int, seq: int) -> None:
    fb = check_self_attention(_batch_loop(first, stop_early))
    assert fb.status == "wrong" and f"sequence {seq} of the batch was never filled" in fb.message, fb
    assert "apply softmax" not in fb.message, fb


def _zeros_like_x(x, w_q, w_k, w_v):
    output = torch.zeros_like(x)
    weights = torch.zeros(x.shape[0], x.shape[1], x.shape[1], dtype=x.dtype)
    for b in range(x.shape[0]):
        q, k, v = x[b] @ w_q, x[b] @ w_k, x[b] @ w_v
        w = torch.softmax(q @ k.T / math.sqrt(k.shape[-1]), dim=-1)
        weights[b] = w
        output[b] = w @ v
    return output, weights


def _values_transposed(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1)
    return weights @ v.transpose(-2, -1), weights


def _projection_reversed(x, w_q, w_k, w_v):
    q, k = x @ w_q, x @ w_k
    v = w_v @ x
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1)
    return weights @ v, weights


@pytest.mark.parametrize("fn, hint", [
    (_zeros_like_x, "Your buffer torch.zeros_like(x) has x's shape"),
    (_values_transposed, "The error is in the product with the values, which you transposed"),
    (_projection_reversed, "The line that raised, `v = w_v @ x`, projects x"),
])
def test_errors_outside_the_score_product_are_not_blamed_on_it(fn, hint: str) -> None:
    fb = check_self_attention(fn)
    assert fb.status == "wrong" and hint in fb.message, fb
    assert "score product" not in fb.message and "last two axes of k" not in fb.message, fb


def test_cross_attention_names_the_two_sequences_swapped() -> None:
    def swapped(x_q, x_kv, w_q, w_k, w_v):
        q, k, v = x_kv @ w_q, x_q @ w_k, x_q @ w_v
        weights = torch.softmax(q @ k.T / math.sqrt(k.shape[-1]), dim=-1)
        return weights @ v, weights

    fb = check_cross_attention(swapped)
    assert fb.status == "wrong" and "you swapped the two sequences" in fb.message, fb


def _projected_like_linear_on_one_line(x, w_q, w_k, w_v):  # the nn.Linear habit: x @ weight.T
    q, k, v = x @ w_q.T, x @ w_k.T, x @ w_v.T
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1)
    return weights @ v, weights


def _weight_first(x, w_q, w_k, w_v):
    q = w_q @ x
    k = w_k @ x
    v = w_v @ x
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1)
    return weights @ v, weights


def _weight_transposed_first(x, w_q, w_k, w_v):
    q, k, v = w_q.T @ x, w_k.T @ x, w_v.T @ x
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1)
    return weights @ v, weights


def _inline_score_product_transposed(x, w_q, w_k, w_v):
    weights = torch.softmax((x @ w_q) @ (x @ w_k).T / math.sqrt(w_k.shape[-1]), dim=-1)
    return weights @ (x @ w_v), weights


@pytest.mark.parametrize("fn, line", [
    (_projected_like_linear_on_one_line, "q, k, v = x @ w_q.T, x @ w_k.T, x @ w_v.T"),
    (_weight_first, "q = w_q @ x"),
    (_weight_transposed_first, "q, k, v = w_q.T @ x, w_k.T @ x, w_v.T @ x"),
])
def test_a_projection_slip_is_named_not_blamed_on_the_score_product(fn, line: str) -> None:
    """q, k on the left of a projection line, or D_k = 5 in the error text, do not make it a score product."""
    fb = check_self_attention(fn)
    assert fb.status == "wrong" and f"The line that raised, `{line}`, projects x" in fb.message, fb
    assert "[D, D_k]" in fb.message and "nn.Linear" in fb.message, fb
    assert "score product" not in fb.message and "last two axes of k" not in fb.message, fb
    assert "x @ w_q" not in fb.message.replace(line, ""), fb  # the hint does not write the answer line


def test_a_transposed_score_product_written_inline_still_gets_the_transpose_advice() -> None:
    fb = check_self_attention(_inline_score_product_transposed)
    assert fb.status == "wrong" and "The error is in the score product" in fb.message, fb


def test_a_float32_buffer_names_the_missing_dtype() -> None:
    """A loop that fills torch.zeros(...) (float32 by default) on float64 input is told about dtype=, not .float()."""
    def buffer_without_dtype(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        weights = torch.zeros(x.shape[0], x.shape[1], x.shape[1])
        output = torch.zeros(x.shape[0], x.shape[1], v.shape[-1])
        for b in range(x.shape[0]):
            w = torch.softmax(q[b] @ k[b].T / math.sqrt(k.shape[-1]), dim=-1)
            weights[b] = w
            output[b] = w @ v[b]
        return output, weights

    def mixed_with_the_buffer(x, w_q, w_k, w_v):  # the float32 buffer meets float64 values: PyTorch raises
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        weights = torch.zeros(x.shape[0], x.shape[1], x.shape[1])
        for b in range(x.shape[0]):
            weights[b] = torch.softmax(q[b] @ k[b].T / math.sqrt(k.shape[-1]), dim=-1)
        return weights @ v, weights

    fb = check_self_attention(buffer_without_dtype)
    assert fb.status == "wrong" and "torch.zeros(...)" in fb.message and "dtype=x.dtype" in fb.message, fb
    fb = check_self_attention(mixed_with_the_buffer)
    assert fb.status == "wrong" and "float64 case" in fb.message and "dtype=x.dtype" in fb.message, fb
    assert "score product" not in fb.message, fb


def test_batched_hints_name_the_batched_shapes() -> None:
    """The self-attention exercise takes x [B, S, D]: its hints name [B, S, S] and x.shape[1], not the 2-D S_q, S_k."""

    def forgot_v(x, w_q, w_k, w_v):
        w = self_right(x, w_q, w_k, w_v)[1]
        return w, w

    def by_sqrt_s(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        w = torch.softmax(q @ k.mT / math.sqrt(x.shape[1]), dim=-1)
        return w @ v, w

    def transposed(x, w_q, w_k, w_v):
        out, w = self_right(x, w_q, w_k, w_v)
        return out, w.transpose(-2, -1)

    for fn, named in ((forgot_v, "shape [B, S, S]"), (by_sqrt_s, "x.shape[1]"), (transposed, "[B, S, S]")):
        fb = check_self_attention(fn)
        assert fb.status == "wrong" and named in fb.message and "S_q" not in fb.message and "x_kv" not in fb.message, fb
    cross_forgot_v = lambda *a: (cross_right(*a)[1], cross_right(*a)[1])  # noqa: E731
    assert "shape [S_q, S_k]" in check_cross_attention(cross_forgot_v).message
