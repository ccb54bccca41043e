"""The chapter 4 checkers: a right answer passes, and each typical mistake gets its own hint."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook import ch04
from attnbook.ch04 import (
    check_combined_mask,
    check_fully_masked_prediction,
    check_masking_order,
)
from attnlib import MultiHeadSelfAttention, causal_mask


def _tril(S: int) -> torch.Tensor:
    return torch.tril(torch.ones(S, S, dtype=torch.bool))


def right_mask(am: torch.Tensor) -> torch.Tensor:
    return _tril(am.shape[1]) & am.bool()[:, None, None, :]


def test_combined_mask_accepts_the_right_answer() -> None:
    fb = check_combined_mask(right_mask)
    assert fb.passed and fb.status == "correct"


@pytest.mark.parametrize("mistake", ch04.COMBINED_MASK_MISTAKES, ids=lambda m: m.name)
def test_combined_mask_names_each_mistake_of_its_table(mistake) -> None:
    fb = check_combined_mask(mistake.compute)
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda am: right_mask(am).int(), "dtype torch.int32"),
        (lambda am: right_mask(am)[None], "expected [B, 1, S, S]"),
        (lambda am: right_mask(am) & (torch.arange(5) != 0), "entries differ"),
        (lambda am: "mask", "torch.Tensor"),
        (lambda am: am.reshape(7), "RuntimeError"),
    ],
)
def test_combined_mask_fallbacks(fn, hint: str) -> None:
    fb = check_combined_mask(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


def test_combined_mask_stub() -> None:
    def stub(am: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    assert check_combined_mask(stub).status == "todo"


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def fixed(q, k, v):
    w = torch.softmax(_scores(q, k).masked_fill(~causal_mask(q.shape[-2]), float("-inf")), dim=-1)
    return w @ v, w


def test_masking_order_accepts_equivalent_variants() -> None:
    assert check_masking_order(fixed).passed

    def finfo_fill(q, k, v):
        w = torch.softmax(_scores(q, k).masked_fill(~causal_mask(q.shape[-2]), torch.finfo(q.dtype).min), dim=-1)
        return w @ v, w

    def renormalised(q, k, v):  # zero after softmax, then divide by the new row sums: the same weights
        w = torch.softmax(_scores(q, k), dim=-1).masked_fill(~causal_mask(q.shape[-2]), 0.0)
        w = w / w.sum(dim=-1, keepdim=True)
        return w @ v, w

    for fn in (finfo_fill, renormalised):
        assert check_masking_order(fn).passed, fn.__name__


@pytest.mark.parametrize("mistake", ch04.MASKING_ORDER_MISTAKES, ids=lambda m: m.name)
def test_masking_order_names_each_mistake_of_its_table(mistake) -> None:
    def reader(q, k, v):
        w = mistake.compute(q, k, v)
        w = torch.where(w < 0, torch.nan, w)  # the table writes NaN as -1; a reader's code returns NaN
        return w @ v, w

    fb = check_masking_order(reader)
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


def test_inverted_mask_mentions_the_nan_row() -> None:
    def inverted(q, k, v):
        w = torch.softmax(_scores(q, k).masked_fill(causal_mask(q.shape[-2]), float("-inf")), dim=-1)
        return w @ v, w

    fb = check_masking_order(inverted)
    assert "inverted" in fb.message and "NaN" in fb.message, fb


def test_masking_order_fallbacks_and_stub() -> None:
    def bad_output(q, k, v):
        return v, fixed(q, k, v)[1]

    def other_leak(q, k, v):
        w = fixed(q, k, v)[1].clone()
        w[..., 0, 1] = 0.3
        return w @ v, w

    cases = {
        bad_output: "output is `weights @ v`",
        other_leak: "future keys get weight (up to 3.0e-01)",
        (lambda q, k, v: fixed(q, k, v)[1]): "pair",
        (lambda q, k, v: (None, "w")): "shape (1, 2, 5, 5)",
    }
    for fn, hint in cases.items():
        fb = check_masking_order(fn)
        assert fb.status == "wrong" and hint in fb.message, (hint, fb.message)

    def stub(q, k, v):
        raise NotImplementedError

    assert check_masking_order(stub).status == "todo"


NAN = float("nan")
RIGHT = {
    "add -1e4": torch.softmax(ch04.FULLY_MASKED_SCORES, dim=-1).tolist(),
    "masked_fill -1e4": [0.25] * 4,
    "add finfo.min": [0.25] * 4,
}


def test_fully_masked_prediction_right_and_todo() -> None:
    assert check_fully_masked_prediction(RIGHT).passed
    assert check_fully_masked_prediction({k: None for k in RIGHT}).status == "todo"
    assert check_fully_masked_prediction({**RIGHT, "add finfo.min": None}).status == "todo"


def test_fully_masked_right_values_are_what_torch_computes() -> None:
    s, hidden = ch04.FULLY_MASKED_SCORES, torch.ones(4, dtype=torch.bool)
    got = {
        "add -1e4": torch.softmax(s + (-1e4), dim=-1),
        "masked_fill -1e4": torch.softmax(s.masked_fill(hidden, -1e4), dim=-1),
        "add finfo.min": torch.softmax(s + torch.finfo(torch.float32).min, dim=-1),
    }
    for case, value in got.items():
        torch.testing.assert_close(value, torch.tensor(RIGHT[case]), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("case", "mistake"),
    [(case, m) for case, table in ch04.FULLY_MASKED_MISTAKES.items() for m in table],
    ids=lambda x: x if isinstance(x, str) else x.name,
)
def test_fully_masked_names_each_mistake_of_its_table(case: str, mistake) -> None:
    value = torch.where(mistake.compute() < 0, torch.nan, mistake.compute()).tolist()
    fb = check_fully_masked_prediction({**RIGHT, case: value})
    assert fb.status == "wrong" and fb.message == f"{case!r}: {mistake.hint}", fb


@pytest.mark.parametrize(
    ("value", "hint"),
    [([0.1, 0.2, 0.3, 0.4], "is not right"), ([0.0] * 3, "4 numbers"), ("zeros", "list of 4 numbers")],
)
def test_fully_masked_prediction_fallbacks(value: object, hint: str) -> None:
    fb = check_fully_masked_prediction({**RIGHT, "add -1e4": value})
    assert fb.status == "wrong" and hint in fb.message, fb


def test_fully_masked_prediction_bad_container() -> None:
    assert "dict" in check_fully_masked_prediction([0.25] * 4).message
    assert "lacks the key" in check_fully_masked_prediction({"add -1e4": [NAN] * 4}).message


def test_causal_eval_stats_are_fractions() -> None:
    from attnbook import toy_lm

    torch.manual_seed(0)
    model = toy_lm.TinyLM(10, d_model=8, num_heads=2, max_len=8)
    stats = ch04.causal_eval_stats(model, torch.randint(0, 10, (200,)), seq_len=8, batch_size=4)
    assert set(stats) == {"accuracy", "copy_rate", "top_probability"}
    assert all(0.0 <= v <= 1.0 for v in stats.values())
    assert stats["top_probability"] >= 1 / 10


# --- the parallel pass against the prefix passes ------------------------------------------


def test_timing_returns_positive_seconds_and_restores_threads() -> None:
    attention = MultiHeadSelfAttention(8, 2).eval()
    threads = torch.get_num_threads()
    parallel, prefixes = ch04.time_parallel_and_prefixes(attention, torch.randn(1, 6, 8), repeats=2, cpu_threads=1)
    assert parallel > 0 and prefixes > 0
    assert torch.get_num_threads() == threads
    with pytest.raises(ValueError, match=r"\[B, S, D\]"):
        ch04.time_parallel_and_prefixes(attention, torch.randn(6, 8))


def test_prefix_outputs_equal_the_masked_parallel_pass() -> None:
    """The two computations the timing compares give the same numbers."""
    torch.manual_seed(0)
    attention = MultiHeadSelfAttention(8, 2).eval()
    x = torch.randn(2, 7, 8)
    with torch.no_grad():
        parallel = attention(x, causal=True).hidden_states
        prefixes = torch.stack([attention(x[:, :i]).hidden_states[:, -1] for i in range(1, 8)], dim=1)
    torch.testing.assert_close(prefixes, parallel)


def test_masking_order_refuses_a_small_finite_fill_and_names_a_hidden_diagonal() -> None:
    """Review items ch4 #21: a fill of -15 is inside the tolerance but leaks exp(-15); hiding the diagonal gives a NaN row."""
    def fill(value: float | None):
        def attend(q, k, v):
            S = q.shape[-2]
            fill_value = torch.finfo(q.dtype).min if value is None else value
            s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~causal_mask(S), fill_value)
            w = torch.softmax(s, dim=-1)
            return w @ v, w
        return attend

    fb = check_masking_order(fill(-15.0))
    assert fb.status == "wrong" and "exactly 0" in fb.message and "e-0" in fb.message, fb
    fb = check_masking_order(fill(-10.0))
    assert fb.status == "wrong" and "e-0" in fb.message and "0.000" not in fb.message, fb
    assert check_masking_order(fill(-1e9)).passed
    assert check_masking_order(fill(None)).passed  # finfo(dtype).min

    def diagonal_hidden(q, k, v):
        S = q.shape[-2]
        s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(torch.ones(S, S, dtype=torch.bool).triu(), float("-inf"))
        w = torch.softmax(s, dim=-1)
        return w @ v, w

    assert "diagonal" in check_masking_order(diagonal_hidden).message


def test_fully_masked_accepts_a_two_decimal_hand_prediction_and_names_one_hot() -> None:
    """Review item ch4 #20."""
    hand = {"add -1e4": [0.5, 0.17, 0.17, 0.17], "masked_fill -1e4": [0.25] * 4, "add finfo.min": (0.25, 0.25, 0.25, 0.25)}
    assert check_fully_masked_prediction(hand).passed
    fb = check_fully_masked_prediction({**hand, "add -1e4": [1, 0, 0, 0]})
    assert fb.status == "wrong" and "one-hot" in fb.message, fb
    assert not check_fully_masked_prediction({**hand, "add -1e4": [0.4, 0.2, 0.2, 0.2]}).passed


def test_combined_mask_tries_a_second_size() -> None:
    def hard_coded(am):
        past = torch.ones(5, 5, dtype=torch.bool).tril()
        return past & am.bool()[:, None, None, :]

    fb = check_combined_mask(hard_coded)
    assert fb.status == "wrong", fb


# --- chapter code beyond the checkers --------------------------------------------------------


def test_causal_explorer_copies_its_scores_and_shows_the_leak() -> None:
    scores = torch.zeros(3, 3)
    frame = ch04.causal_explorer(scores, ["a", "b", "c"])
    scores.fill_(100.0)                                   # a later change must not reach the frames
    f0 = frame(0)
    assert "0.67" in f0.caption
    weights = f0.panels[1].matrix                         # rows: fill 0, fill -inf
    assert weights[1].tolist() == [1.0, 0.0, 0.0]
    assert abs(weights[0].sum() - 1) < 1e-12 and abs(weights[0][0] - 1 / 3) < 1e-12
    assert "no future" in frame(2).caption
    with pytest.raises(ValueError, match="scores must be"):
        ch04.causal_explorer(torch.zeros(2, 3), ["a", "b"])


def test_mha_all_padding_is_nan_exactly_with_weights_or_on_the_fast_path() -> None:
    rows = ch04.mha_all_padding_outputs(head_counts=(1, 2, 3), d_model=6)
    assert len(rows) == 3 * 24
    for r in rows:
        # torch's conditions: eval, even heads, batch_first, and not (grad mode on and a parameter requires grad)
        fast = r["batch_first"] and r["heads"] % 2 == 0 and r["mode"] == "eval" and (not r["grad"] or r["frozen"])
        assert r["fast_path"] == fast, r
        assert r["output"] == ("NaN" if r["need_weights"] or fast else "bias"), r
    assert any(r["frozen"] and r["grad"] and r["fast_path"] for r in rows)   # a frozen model takes it with grad on


def test_mha_fast_path_sees_the_fused_operator_only_without_grad() -> None:
    mha = torch.nn.MultiheadAttention(6, 2, batch_first=True).eval()
    x = torch.randn(2, 4, 6)
    with torch.no_grad():
        (out_fast, _), fast = ch04.mha_fast_path(lambda: mha(x, x, x, need_weights=False))
    (out_slow, _), slow = ch04.mha_fast_path(lambda: mha(x, x, x, need_weights=False))
    assert fast and not slow
    assert torch.allclose(out_fast, out_slow, atol=1e-6)


def test_mask_seen_by_attention_reads_the_bool_mask_of_the_sdpa_path() -> None:
    transformers = pytest.importorskip("transformers")
    model = transformers.BertModel(transformers.BertConfig(
        vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        attn_implementation="sdpa")).eval()
    mask = ch04.mask_seen_by_attention(model, model.encoder.layer[0].attention.self,
                                       input_ids=torch.tensor([[5, 6, 0]]), attention_mask=torch.tensor([[1, 1, 0]]))
    assert mask.dtype == torch.bool and mask[0, 0, 0].tolist() == [True, True, False]
    unpadded = ch04.mask_seen_by_attention(model, model.encoder.layer[0].attention.self,
                                           input_ids=torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 3, dtype=torch.long))
    assert unpadded is None                                              # nothing padded: no mask at all


@pytest.mark.parametrize("lengths", [[1], [3, 2], [2, 1, 4]])
def test_document_mask_equals_separate_causal_passes(lengths) -> None:
    S = sum(lengths)
    mask = ch04.document_mask(lengths)
    assert mask.shape == (S, S) and mask.dtype == torch.bool
    start = 0
    for n in lengths:
        block = mask[start:start + n, start:start + n]
        assert torch.equal(block, causal_mask(n))
        assert mask[start:start + n].sum() == block.sum()   # nothing outside its own document
        start += n
    with pytest.raises(ValueError):
        ch04.document_mask([2, 0])


def test_prefix_lm_mask() -> None:
    m = ch04.prefix_lm_mask(3, 5)
    assert m[:3, :3].all() and not m[:3, 3:].any()
    assert torch.equal(m[3:], causal_mask(5)[3:])
    assert torch.equal(ch04.prefix_lm_mask(0, 4), causal_mask(4))
    with pytest.raises(ValueError):
        ch04.prefix_lm_mask(6, 5)


def test_combined_mask_fallback_names_the_first_wrong_cell() -> None:
    def key_or_query(am: torch.Tensor) -> torch.Tensor:  # a padded query hides its row as well
        return _tril(am.shape[1]) & (am.bool()[:, None, None, :] | am.bool()[:, None, :, None])

    fb = check_combined_mask(key_or_query)
    assert fb.status == "wrong" and "Rows are queries" in fb.message, fb
    assert "is padding" in fb.message, fb
    fb = check_combined_mask(lambda am: right_mask(am) & (torch.arange(5) != 0))
    assert "may not see key 0" in fb.message and "its own key" in fb.message, fb
    assert "left" not in fb.message, fb  # no longer always points at the left-padded sequence


def test_masking_order_names_a_swapped_return() -> None:
    fb = check_masking_order(lambda q, k, v: fixed(q, k, v)[::-1])
    assert fb.status == "wrong" and "(weights, output)" in fb.message, fb


def test_left_padded_stack_nan_reaches_the_loss_only_with_two_layers() -> None:
    one = ch04.left_padded_stack(1, "softmax, -inf written")
    two = ch04.left_padded_stack(2, "softmax, -inf written")
    assert one["pad_rows_nan"] and math.isfinite(one["loss"]) and not one["grad_finite"]
    assert two["pad_rows_nan"] and math.isnan(two["loss"]) and not two["real_finite"]
    losses = set()
    for fill in ch04.STACK_FILLS[1:]:
        r = ch04.left_padded_stack(2, fill)
        assert not r["pad_rows_nan"] and r["real_finite"] and r["grad_finite"], fill
        losses.add(round(r["loss"], 5))
    assert len(losses) == 1  # real queries never see padded keys: every defined row gives one loss
    with pytest.raises(ValueError):
        ch04.left_padded_stack(2, "zeros")


def test_fully_masked_row_by_dtype_separates_float16() -> None:
    rows = ch04.fully_masked_row_by_dtype()
    assert set(rows["float32"].values()) == {"mean of V"}
    assert set(rows["bfloat16"].values()) == {"mean of V"}
    assert rows["float16"]["SDPA additive"] == "as if unmasked"
    assert rows["float16"]["added, scores <= -16"] == "NaN"
    assert rows["float16"]["masked_fill"] == "mean of V"


def test_quiz_right_options_are_not_the_longest() -> None:
    from attnbook.quiz import load_quiz

    for n, q in enumerate(load_quiz("04_masks"), 1):
        if q["type"] != "multiple_choice":
            continue
        lengths = [len(a["answer"]) for a in q["answers"]]
        right = [len(a["answer"]) for a in q["answers"] if a["correct"]]
        assert not (max(right) == max(lengths) and lengths.count(max(lengths)) == 1), n


def test_masking_order_names_a_result_less_precise_than_its_inputs() -> None:
    def cast(q, k, v):
        return fixed(q.float(), k.float(), v.float())

    fb = check_masking_order(cast)
    assert fb.status == "wrong" and "torch.float32" in fb.message and "torch.float64" in fb.message, fb


def test_zeroed_after_softmax_shows_the_symptom_not_the_fix() -> None:
    hint = ch04.MASKING_ORDER_MISTAKES[0].hint
    assert "sum to [" in hint and "-inf" not in hint and "before softmax" not in hint, hint


def test_combined_mask_names_an_additive_float_mask() -> None:
    def additive(am):
        keep = torch.ones(am.shape[1], am.shape[1], dtype=torch.bool).tril() & am.bool()[:, None, None, :]
        return torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))

    fb = check_combined_mask(additive)
    assert fb.status == "wrong" and "from_additive_mask" in fb.message and "additive" in fb.message, fb


# --- the reading's wrong answers, as a reader would write them ---------------------------------

def test_combined_mask_names_inverted_padding() -> None:
    def f(am: torch.Tensor) -> torch.Tensor:
        S = am.shape[1]
        return torch.tril(torch.ones(S, S, dtype=torch.bool)) & ~am.bool()[:, None, None, :]

    fb = check_combined_mask(f)
    assert fb.status == "wrong" and "padding part is inverted" in fb.message and "diagonal" not in fb.message, fb
    assert check_combined_mask(lambda am: _tril(am.shape[1]) & (am == 1)[:, None, None, :]).passed


def test_combined_mask_names_a_transposed_mask_both_ways() -> None:
    def transposed(am: torch.Tensor) -> torch.Tensor:
        return (_tril(am.shape[1]) & am.bool()[:, None, None, :]).transpose(-1, -2)

    def swapped(am: torch.Tensor) -> torch.Tensor:
        return torch.triu(torch.ones(am.shape[1], am.shape[1], dtype=torch.bool)) & am.bool()[:, None, :, None]

    for f in (transposed, swapped):
        fb = check_combined_mask(f)
        assert fb.status == "wrong" and "rows and columns are swapped" in fb.message, fb


def _masked(q: torch.Tensor, k: torch.Tensor, *, divide: float | None = None, keep: torch.Tensor | None = None) -> torch.Tensor:
    S = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if divide is None else divide)
    return scores.masked_fill(~(causal_mask(S) if keep is None else keep), float("-inf"))


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda q, k, v: (lambda w: (w @ v, w))(torch.softmax(_masked(q, k), dim=-2)), "over the queries (dim=-2)"),
        (lambda q, k, v: (lambda w: (w @ v, w))(torch.softmax(_masked(q, k, divide=q.shape[-1]), dim=-1)),
         "you divided the scores by D_k"),
        (lambda q, k, v: (lambda w: (w @ v, w))(torch.softmax(_masked(q, k, divide=1 / math.sqrt(q.shape[-1])), dim=-1)),
         "multiplied the scores by sqrt(D_k)"),
        (lambda q, k, v: (lambda w: (w @ v, w.transpose(-2, -1)))(torch.softmax(_masked(q, k), dim=-1)),
         "weights are transposed"),
        (lambda q, k, v: (lambda w: (w @ v, w))(torch.softmax(_masked(
            q, k, keep=torch.tril(torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool), diagonal=1)), dim=-1)),
         "diagonal=1"),
    ],
    ids=["softmax over queries", "divided by D_k", "times sqrt(D_k)", "weights transposed", "tril diagonal=1"],
)
def test_masking_order_names_the_axis_the_scale_and_the_orientation(fn, hint: str) -> None:  # type: ignore[no-untyped-def]
    fb = check_masking_order(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


def test_masking_order_names_a_softmax_over_the_batch_and_future_nan() -> None:
    # the reading's case: a right mask, then softmax(0); NaN in the future cells is not a "leak up to inf"
    def over_batch(q, k, v):
        w = _masked(q, k).softmax(0)
        return w @ v, w

    fb = check_masking_order(over_batch)
    assert fb.status == "wrong" and "batch axis (dim=0)" in fb.message and "inf)" not in fb.message, fb

    def future_nan_only(q, k, v):  # no table entry: the NaN check speaks, not a leak "up to inf"
        w = torch.softmax(_masked(q, k), dim=-1).clone()
        w[..., 0, 1] = NAN
        return w @ v, w

    fb = check_masking_order(future_nan_only)
    assert "NaN in future cells only" in fb.message, fb


def test_masking_order_names_an_unassigned_masked_fill() -> None:
    def unassigned(q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores.masked_fill(~causal_mask(q.shape[-2]), float("-inf"))  # result dropped
        w = torch.softmax(scores, dim=-1)
        return w @ v, w

    fb = check_masking_order(unassigned)
    assert fb.status == "wrong" and "assign it, or use masked_fill_" in fb.message, fb


def test_masking_order_names_half_precision_in_good_grammar() -> None:
    def half(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.softmax(_masked(q, k), dim=-1)
        return w @ v, w.half()

    fb = check_masking_order(half)
    assert fb.status == "wrong" and "your weights tensor is torch.float16" in fb.message, fb


def test_fully_masked_names_the_three_to_one_slip() -> None:
    fb = check_fully_masked_prediction({**RIGHT, "add -1e4": [0.75, 1 / 12, 1 / 12, 1 / 12]})
    assert fb.status == "wrong" and "3 + 1 + 1 + 1" in fb.message and "Run" not in fb.message, fb


def test_combined_mask_names_a_float_triangle_anded_with_a_bool_mask() -> None:
    def float_tril(am):  # type: ignore[no-untyped-def]
        S = am.shape[1]
        return torch.tril(torch.ones(S, S)) & am.bool()[:, None, None, :]

    fb = check_combined_mask(float_tril)
    assert fb.status == "wrong" and "float by default" in fb.message and "stub" not in fb.message, fb


def _post_softmax(post):  # type: ignore[no-untyped-def]
    def reader(q, k, v):  # type: ignore[no-untyped-def]
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        w = post(w, ~causal_mask(q.shape[-2]))
        return w @ v, w

    return reader


def test_masking_order_names_minus_inf_written_into_the_weights() -> None:
    fb = check_masking_order(_post_softmax(lambda w, future: w.masked_fill(future, float("-inf"))))
    assert fb.status == "wrong" and "weights hold -inf" in fb.message and "1.8e+308" not in fb.message, fb


def test_masking_order_names_renormalising_without_keepdim_in_axis_names() -> None:
    fb = check_masking_order(_post_softmax(lambda w, future: (lambda z: z / z.sum(-1))(w.masked_fill(future, 0.0))))
    assert fb.status == "wrong" and "is S_q in [B, H, S_q, S_k]" in fb.message, fb
    assert "keepdim=True" in fb.message and "sized by D_k" not in fb.message, fb


def test_masking_order_names_a_mask_or_scores_sized_by_d_k() -> None:
    def mask_of_d_k(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, H, S, S]
        w = torch.softmax(scores.masked_fill(~causal_mask(q.shape[-1]), float("-inf")), dim=-1)  # mask [D_k, D_k]
        return w @ v, w

    def scores_of_d_k(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = q.transpose(-2, -1) @ k / math.sqrt(q.shape[-1])  # [B, H, D_k, D_k]
        w = torch.softmax(scores.masked_fill(~causal_mask(q.shape[-2]), float("-inf")), dim=-1)
        return w @ v, w

    B, H, S, D_k, _ = ch04.MASKING_ORDER_CASES[0]
    for fn in (mask_of_d_k, scores_of_d_k):
        fb = check_masking_order(fn)
        assert fb.status == "wrong", fb
        assert f"sized by D_k = {D_k} (q.shape[-1]) where the number of positions S = {S}" in fb.message, fb
        assert "keepdim" not in fb.message, fb


def test_lower_right_mask_accepts_right_answers_and_matches_attnlib() -> None:
    from attnbook.ch04 import LOWER_RIGHT_CASES, _lower_right, check_lower_right_mask

    for S_q, S_k in LOWER_RIGHT_CASES:
        assert torch.equal(_lower_right(S_q, S_k), causal_mask(S_q, S_k=S_k))
    assert check_lower_right_mask(lambda S_q, S_k: torch.ones(S_q, S_k, dtype=torch.bool).tril(S_k - S_q)).passed
    assert check_lower_right_mask(lambda S_q, S_k: torch.arange(S_k)[None, :] <= torch.arange(S_q)[:, None] + S_k - S_q).passed
    assert check_lower_right_mask(lambda S_q, S_k: causal_mask(S_q, S_k=S_k)).passed


@pytest.mark.parametrize("mistake", ch04.LOWER_RIGHT_MISTAKES, ids=lambda m: m.name)
def test_lower_right_mask_names_each_mistake_of_its_table(mistake) -> None:  # type: ignore[no-untyped-def]
    from attnbook.ch04 import check_lower_right_mask

    # the offset-S_q mistake is defined in the table only where it differs from every other mistake; the
    # reader's slip itself gives a mask on every case
    slips = {"offset S_q": lambda S_q, S_k: torch.ones(S_q, S_k, dtype=torch.bool).tril(S_q)}
    fb = check_lower_right_mask(slips.get(mistake.name, mistake.compute))
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


def test_lower_right_mask_fallbacks() -> None:
    from attnbook.ch04 import check_lower_right_mask

    fb = check_lower_right_mask(lambda S_q, S_k: torch.ones(S_q, S_k).tril(S_k - S_q))
    assert fb.status == "wrong" and "dtype torch.float32" in fb.message, fb
    fb = check_lower_right_mask(lambda S_q, S_k: torch.ones(S_q, S_k, dtype=torch.bool).triu(S_k - S_q))
    assert fb.status == "wrong" and "query 0 (position 4) may not see key 0" in fb.message, fb
    fb = check_lower_right_mask(lambda S_q, S_k: torch.ones(2, 5, dtype=torch.bool).tril(3))
    assert fb.status == "wrong" and "expected [S_q, S_k]" in fb.message, fb


def test_lower_right_mask_names_an_all_true_mask_as_hiding_nothing() -> None:
    from attnbook.ch04 import check_lower_right_mask

    fb = check_lower_right_mask(lambda S_q, S_k: torch.ones(S_q, S_k, dtype=torch.bool))
    assert fb.status == "wrong" and "hides nothing" in fb.message and "off by one" not in fb.message, fb
    # the one-key-of-the-future slip is still named as such, on the case where the two differ
    fb = check_lower_right_mask(lambda S_q, S_k: torch.ones(S_q, S_k, dtype=torch.bool).tril(S_k - S_q + 1))
    assert fb.status == "wrong" and fb.message.startswith("off by one: each query but the last sees one key"), fb


def test_fully_masked_exercise_is_float32_and_names_the_float16_answer() -> None:
    s = ch04.FULLY_MASKED_SCORES
    assert s.dtype == torch.float32
    # in float16 (and bfloat16) adding -1e4 erases the differences: the row is uniform
    for dtype in (torch.float16, torch.bfloat16):
        torch.testing.assert_close(torch.softmax(s.to(dtype) + (-1e4), dim=-1).float(), torch.full((4,), 0.25))
    fb = check_fully_masked_prediction({**RIGHT, "add -1e4": [0.25] * 4})
    assert fb.status == "wrong" and "float16" in fb.message and "float32" in fb.message, fb


def test_sdpa_gives_zero_rows_on_every_cpu_path() -> None:
    rows = ch04.sdpa_fully_masked_paths()
    assert len(rows) == 4 * 2 * 2 * 2
    assert {r["backend"] for r in rows} == {"MATH", "FLASH_ATTENTION"}
    assert all(r["row"] == "zeros" for r in rows), [r for r in rows if r["row"] != "zeros"]
    assert all(r["grad_finite"] is (True if r["grad"] else None) for r in rows)


def test_masking_order_refuses_float32_inside_cast_back_to_float64() -> None:
    # the dtype rule: an answer computed in float32 on the float64 case and cast back fits the tolerance
    # but is refused, for the weights and for the output
    def narrow(q, k, v):
        S = q.shape[-2]
        s = (q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
            ~causal_mask(S), float("-inf")
        )
        w = s.softmax(-1)
        return (w @ v.float()).to(q.dtype), w.to(q.dtype)

    fb = check_masking_order(narrow)
    assert fb.status == "wrong" and "float32's precision" in fb.message and "weights" in fb.message, fb

    def narrow_output(q, k, v):
        out, w = fixed(q, k, v)
        return (w.float() @ v.float()).to(q.dtype), w

    fb = check_masking_order(narrow_output)
    assert fb.status == "wrong" and "float32's precision" in fb.message and "output" in fb.message, fb


def test_lower_right_mask_names_s_q_used_for_the_offset() -> None:
    # tril(diagonal=S_q): on (3, 7) it is the own-key-hidden mask, on (2, 5) right, on (1, 4) a key hidden
    from attnbook.ch04 import check_lower_right_mask

    for fn in (
        lambda S_q, S_k: torch.ones(S_q, S_k, dtype=torch.bool).tril(S_q),
        lambda S_q, S_k: torch.arange(S_k)[None, :] <= torch.arange(S_q)[:, None] + S_q,
    ):
        fb = check_lower_right_mask(fn)
        assert fb.status == "wrong" and "S_k - S_q" in fb.message and "S_q instead" in fb.message, fb
        assert "no query sees its own key" not in fb.message, fb


def test_fully_masked_names_exponentials_and_percentages_and_never_shows_the_row() -> None:
    fb = check_fully_masked_prediction({**RIGHT, "add -1e4": [3, 1, 1, 1]})
    assert fb.status == "wrong" and "exponentials" in fb.message, fb
    fb = check_fully_masked_prediction({**RIGHT, "add -1e4": [50, 17, 17, 17]})
    assert fb.status == "wrong" and "percentages" in fb.message, fb
    fb = check_fully_masked_prediction({**RIGHT, "masked_fill -1e4": [25, 25, 25, 25]})
    assert fb.status == "wrong" and "percentages" in fb.message, fb
    fb = check_fully_masked_prediction({**RIGHT, "add -1e4": [0.1, 0.2, 0.3, 0.4]})
    assert fb.status == "wrong" and "is not right" in fb.message and "Run " not in fb.message, fb


def test_combined_mask_names_a_padding_part_with_the_batch_on_the_query_axis() -> None:
    fb = check_combined_mask(lambda am: _tril(am.shape[1]) & am.bool()[None, None, :, :])
    assert fb.status == "wrong" and "[B, 1, 1, S]" in fb.message and "query axis" in fb.message, fb


def test_mask_conventions_agree_and_an_inverted_mask_does_not() -> None:
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, num_heads=1, batch_first=True).eval()
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(7))
    hf_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    may_attend = hf_mask.bool()[:, None, None, :]
    additive = torch.zeros(2, 1, 1, 5).masked_fill(~may_attend, torch.finfo(torch.float32).min)
    agree = ch04.mask_conventions_agree(mha, x, hf_mask, hf_mask == 0, may_attend, additive)
    assert len(agree) == 5 and all(agree.values()), agree
    # each convention given the other one's meaning no longer agrees
    wrong = ch04.mask_conventions_agree(mha, x, hf_mask, hf_mask == 1, ~may_attend, additive.flip(-1))
    assert not any(wrong.values()), wrong


def test_bert_padding_equals_alone_leaves_the_global_random_state() -> None:
    torch.manual_seed(3)
    before = torch.rand(1)
    torch.manual_seed(3)
    assert ch04.bert_padding_equals_alone()
    assert torch.equal(torch.rand(1), before)


def test_prefix_passes_diagram_counts_the_repeated_positions() -> None:
    d = ch04.prefix_passes_diagram()
    S = ch04.PREFIX_PASSES_S
    assert f"{S * (S + 1) // 2} positions in all, {S * (S - 1) // 2} of them repeated" in d.alt


def test_nan_spread_diagram_matches_the_two_layer_experiment() -> None:
    # the diagram's claims are the experiment's results: NaN padded rows after layer 1, a NaN loss
    # after layer 2, and a finite loss after layer 1 alone
    one = ch04.left_padded_stack(1, "softmax, -inf written")
    two = ch04.left_padded_stack(2, "softmax, -inf written")
    assert one["pad_rows_nan"] and one["real_finite"] and math.isfinite(one["loss"])
    assert math.isnan(two["loss"]) and not two["real_finite"]
    d = ch04.nan_spread_diagram()
    n_pad = int((ch04.LEFT_PADDED_MASK == 0).sum())
    assert f"those {n_pad} NaN outputs" in d.alt and "<pad>" not in d.alt


def test_packed_prefix_masks_diagram_draws_the_chapter_masks() -> None:
    d = ch04.packed_prefix_masks_diagram()
    prefix, S = ch04.PREFIX_LM
    assert ch04.document_mask(ch04.PACKED_LENGTHS).shape == (S, S)
    assert " and ".join(map(str, ch04.PACKED_LENGTHS)) + " tokens" in d.alt
    assert f"prefix of {prefix} positions" in d.alt
    # the prefix block is visible both ways, the document blocks are disjoint
    assert ch04.prefix_lm_mask(prefix, S)[:prefix, :prefix].all()
    docs = ch04.document_mask(ch04.PACKED_LENGTHS)
    assert not docs[ch04.PACKED_LENGTHS[0]:, : ch04.PACKED_LENGTHS[0]].any()


# --- a second reading's wrong answers --------------------------------------------------------------


def _weights_of(weights):  # type: ignore[no-untyped-def]
    def reader(q, k, v):  # type: ignore[no-untyped-def]
        w = weights(q, k, ~causal_mask(q.shape[-2]))
        return w @ v, w

    return reader


@pytest.mark.parametrize(
    ("weights", "hint"),
    [
        (lambda q, k, future: (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(future, float("-inf")).softmax(1),
         "softmax runs over the head axis (dim=1)"),
        (lambda q, k, future: (k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(future, float("-inf")).softmax(-1),
         "`k @ q.transpose(-2, -1)` puts the keys on the rows"),
        (lambda q, k, future: (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(future, 0.0).softmax(-1)
         .masked_fill(future, 0.0),
         "only because you zeroed it after the softmax"),
        (lambda q, k, future: (lambda w: w / w.sum())(
            (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1).masked_fill(future, 0.0)),
         "you divided by `w.sum()`"),
        (lambda q, k, future: (lambda w: w / w.sum(-1))(
            (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1).masked_fill(future, 0.0)),
         "Keep the summed axis with keepdim=True"),
    ],
    ids=["softmax over heads", "k @ q^T", "0 fill then zeroed", "w / w.sum()", "w / w.sum(-1)"],
)
def test_masking_order_names_the_axis_the_orientation_and_the_sum(weights, hint: str) -> None:  # type: ignore[no-untyped-def]
    fb = check_masking_order(_weights_of(weights))
    assert fb.status == "wrong" and hint in fb.message, fb
    assert "scale the scores" not in fb.message and "future keys get weight" not in fb.message, fb


def test_lower_right_mask_names_an_additive_float_mask() -> None:
    from attnbook.ch04 import check_lower_right_mask

    def additive(S_q: int, S_k: int) -> torch.Tensor:
        keep = torch.ones(S_q, S_k, dtype=torch.bool).tril(S_k - S_q)
        return torch.zeros(S_q, S_k).masked_fill(~keep, float("-inf"))

    fb = check_lower_right_mask(additive)
    assert fb.status == "wrong" and "additive convention" in fb.message and "from_additive_mask" in fb.message, fb


def test_combined_mask_names_the_batch_size_taken_for_the_length() -> None:
    def first_size(am: torch.Tensor) -> torch.Tensor:
        S = am.shape[0]
        return torch.tril(torch.ones(S, S, dtype=torch.bool)) & am.bool()[:, None, None, :]

    fb = check_combined_mask(first_size)
    assert fb.status == "wrong" and "attention_mask.shape[0]" in fb.message and "is the batch" in fb.message, fb
    assert "[1, 1, B, S]" not in fb.message, fb


def test_next_token_diagram_shifts_the_labels_by_one() -> None:
    # the label of position i is the character at i + 1, drawn among position i's keys
    d = ch04.next_token_diagram()
    text, i = ch04.NEXT_TOKEN_TEXT, ch04.NEXT_TOKEN_QUERY
    S = len(text) - 1
    assert 0 <= i < S - 1
    # the alt text names the whole text: the input row shows all but its last character, the label row
    # all but its first
    assert f"Two rows of {S} cells for the text '{text}'" in d.alt
    assert f"the input characters '{text[:S]}' at positions 0 to {S - 1}" in d.alt
    assert f"the next character, '{text[1:]}'" in d.alt
    assert f"Position {i}, '{text[i]}', is scored on '{text[i + 1]}'" in d.alt
    assert f"the input at position {i + 1}" in d.alt


def _train_section_4_1() -> dict[str, list[float]]:
    """The two training curves of section 4.1, trained as its cell trains them."""
    from attnbook import toy_lm

    text = toy_lm.load_text()
    vocab = toy_lm.CharVocab(text)
    data = vocab.encode(text)
    train_data = data[: int(0.9 * len(data))]
    curves = {}
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for name, causal in (("no mask", False), ("causal mask", True)):
            torch.manual_seed(0)
            model = toy_lm.TinyLM(len(vocab), d_model=48, num_heads=1, max_len=32)
            curves[name] = toy_lm.train_next_token(model, train_data, causal=causal, steps=200, batch_size=16,
                                                   seq_len=32, lr=1e-2, seed=0)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    return curves


def test_loss_curve_alt_is_the_stored_alt_text_and_refuses_a_number_without_margin() -> None:
    import json
    from pathlib import Path

    curves = _train_section_4_1()
    alt = ch04.loss_curve_alt(curves)
    nb = json.loads((Path(__file__).parents[1] / "book" / "04_masks.ipynb").read_text())
    figure = [c for c in nb["cells"] if c["cell_type"] == "code" and 'curves["no mask"],' in "".join(c["source"])
              and "plt.show()" in "".join(c["source"])]
    assert len(figure) == 1
    assert figure[0]["metadata"]["mystnb"]["image"]["alt"] == alt
    # the numbers it states, read off the curves
    free, masked = curves["no mask"], curves["causal mask"]
    assert "below 1 by step 45" in alt and free[44] < 1 < free[39]
    assert "below 0.25 from step 60 on" in alt and max(free[59:]) < 0.25 < max(free[49:])
    assert "ends below 0.1" in alt and free[-1] < 0.1
    assert "for about 30 steps" in alt and max(m - f for f, m in zip(free[:30], masked[:30])) < 0.25
    # a curve that crosses a stated level too near a rounding boundary has no margin: refused
    near = dict(curves, **{"no mask": free[:44] + [0.95] + free[45:]})
    with pytest.raises(AssertionError, match="crosses 1"):
        ch04.loss_curve_alt(near)


def test_masking_order_names_scores_computed_in_half_precision_and_cast_back() -> None:
    def scores_in(dtype: torch.dtype):  # type: ignore[no-untyped-def]
        def reader(q, k, v):  # type: ignore[no-untyped-def]
            scores = (q.to(dtype) @ k.to(dtype).transpose(-2, -1)).to(q.dtype) / math.sqrt(q.shape[-1])
            w = torch.softmax(scores.masked_fill(~causal_mask(q.shape[-2]), float("-inf")), dim=-1)
            return w @ v, w

        return reader

    for dtype, name in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
        fb = check_masking_order(scores_in(dtype))
        assert fb.status == "wrong" and f"scores computed in {name} and cast back" in fb.message, fb
        assert "1/sqrt(D_k)" not in fb.message, fb
    # the same code in the inputs' own dtype is right
    assert check_masking_order(lambda q, k, v: scores_in(q.dtype)(q, k, v)).passed


def test_fully_masked_names_a_sum_one_term_short() -> None:
    fb = check_fully_masked_prediction({**RIGHT, "add -1e4": [0.6, 0.2, 0.2, 0.2]})
    assert fb.status == "wrong" and "one term too few" in fb.message, fb
    assert check_fully_masked_prediction(RIGHT).passed
