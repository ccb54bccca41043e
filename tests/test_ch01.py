"""Chapter 1's checkers: each passes a right answer and names each mistake of its table."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnbook.ch01 import (
    SHAPE_CONFIGS,
    SHAPE_MISTAKES,
    SHAPE_KEYS,
    SOFT_LOOKUP_MISTAKES,
    REACH_MISTAKES,
    check_attention_shapes,
    check_reach,
    check_soft_lookup,
    layers_until_linked,
    reference_shapes,
)


def stub(*args: object) -> None:
    raise NotImplementedError


# ---------------------------------------------------------------- soft lookup


def lookup_right(queries, keys, values):
    return torch.softmax(queries @ keys.T, dim=-1) @ values


def test_soft_lookup_accepts_the_right_answer() -> None:
    fb = check_soft_lookup(lookup_right)
    assert fb.passed, fb
    assert "weighted mix" in fb.message


def test_soft_lookup_stub_is_todo() -> None:
    assert check_soft_lookup(stub).status == "todo"


@pytest.mark.parametrize("mistake", SOFT_LOOKUP_MISTAKES, ids=lambda m: m.name)
def test_soft_lookup_names_each_mistake_of_its_table(mistake) -> None:
    fb = check_soft_lookup(mistake.compute)
    assert fb.status == "wrong", fb
    assert fb.message == mistake.hint, fb


def test_soft_lookup_missing_transpose_is_not_a_raw_exception() -> None:
    fb = check_soft_lookup(lambda q, k, v: torch.softmax(q @ k, dim=-1) @ v)
    assert "RuntimeError" not in fb.message and "keys.T" in fb.message


def test_soft_lookup_names_sqrt_d_v_and_refuses_a_dtype_change() -> None:
    fb = check_soft_lookup(lambda q, k, v: torch.softmax(q @ k.T / v.shape[1] ** 0.5, dim=-1) @ v)
    assert fb.status == "wrong" and "sqrt(D_v)" in fb.message, fb
    fb = check_soft_lookup(lambda q, k, v: lookup_right(q.float(), k.float(), v.float()))
    assert fb.status == "wrong" and "dtype" in fb.message, fb
    fb = check_soft_lookup(lambda q, k, v: lookup_right(q, k, v).T)
    assert fb.status == "wrong" and "one row per query" in fb.message, fb


def _mistake_hint(name: str) -> str:
    return next(m.hint for m in SOFT_LOOKUP_MISTAKES if m.name == name)


@pytest.mark.parametrize(
    "fn",
    [
        lambda q, k, v: torch.softmax(q @ k.T, dim=0) @ v,  # [M, N], normalised down a column
        lambda q, k, v: torch.softmax(k @ q.T, dim=-1).T @ v,  # [N, M], one row per key
    ],
    ids=["dim=0 on queries @ keys.T", "dim=-1 on keys @ queries.T"],
)
def test_soft_lookup_names_softmax_over_the_queries_in_both_layouts(fn) -> None:
    """Both ways of normalising over the queries get a hint that names the form the reader wrote."""
    fb = check_soft_lookup(fn)
    assert fb.status == "wrong" and fb.message == _mistake_hint("softmax over the queries"), fb
    assert "dim=-1 on keys @ queries.T" in fb.message and "dim=0 on queries @ keys.T" in fb.message


def test_soft_lookup_accepts_keys_at_queries_normalised_over_the_keys() -> None:
    assert check_soft_lookup(lambda q, k, v: torch.softmax(k @ q.T, dim=0).T @ v).passed


@pytest.mark.parametrize(
    ("fn", "right"),
    [
        (lambda q, k, v: (torch.softmax(q @ k.T, dim=-1)[..., None] * v[None]).sum(0), False),
        (lambda q, k, v: (torch.softmax(q @ k.T, dim=-1)[..., None] * v[None]).sum(1), True),
    ],
    ids=["summed over the queries", "summed over the keys"],
)
def test_soft_lookup_broadcast_sum_over_each_axis(fn, right: bool) -> None:
    fb = check_soft_lookup(fn)
    if right:
        assert fb.passed, fb
    else:
        assert fb.status == "wrong" and fb.message == _mistake_hint("weighted rows summed over the queries"), fb


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda q, k, v: lookup_right(q, k, v) + 0.1, "differs from the expected values"),
        (lambda q, k, v: q @ torch.ones(3), "your code raised RuntimeError"),
        (lambda q, k, v: [1.0], "torch.Tensor"),
        (lambda q, k, v: torch.zeros(5, dtype=q.dtype), "one mixed value per query"),
    ],
)
def test_soft_lookup_fallbacks(fn, hint: str) -> None:
    fb = check_soft_lookup(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


# ---------------------------------------------------------------- shapes


def test_shapes_accept_the_right_answer_as_tuples_or_sizes() -> None:
    assert check_attention_shapes(reference_shapes).passed
    as_sizes = lambda *a: {k: torch.Size(v) for k, v in reference_shapes(*a).items()}  # noqa: E731
    assert check_attention_shapes(as_sizes).passed


def test_shapes_stub_missing_keys_and_bad_values() -> None:
    assert check_attention_shapes(stub).status == "todo"
    partial = lambda *a: {"q": reference_shapes(*a)["q"]}  # noqa: E731
    assert "lacks the steps" in check_attention_shapes(partial).message
    bad = lambda *a: {**reference_shapes(*a), "scores": "S by S"}  # noqa: E731
    assert "tuple of ints" in check_attention_shapes(bad).message


def test_shapes_need_every_configuration() -> None:
    fixed = lambda *a: reference_shapes(*SHAPE_CONFIGS[0])  # noqa: E731
    assert check_attention_shapes(fixed).status == "wrong"


@pytest.mark.parametrize("mistake", SHAPE_MISTAKES, ids=lambda m: m.name)
def test_shapes_name_each_mistake_of_its_table(mistake) -> None:
    fb = check_attention_shapes(mistake.compute)
    B, S, D, D_k, D_v = SHAPE_CONFIGS[0]
    assert fb.status == "wrong", fb
    expected = reference_shapes(*SHAPE_CONFIGS[0])
    step = next(k for k, v in mistake.compute(*SHAPE_CONFIGS[0]).items() if v != expected[k])
    assert fb.message == mistake.hint.format(B=B, S=S, D=D, D_k=D_k, D_v=D_v, step=step), fb


def test_shapes_unknown_mistake_does_not_give_the_shape_away() -> None:
    other = lambda *a: {**reference_shapes(*a), "output": (1, 2, 3)}  # noqa: E731
    message = check_attention_shapes(other).message
    right_output = str(reference_shapes(*SHAPE_CONFIGS[0])["output"])
    assert "which is not its shape" in message and right_output not in message  # the answer is not given away


# ---------------------------------------------------------------- reach


def test_layers_until_linked_matches_the_reach_formula() -> None:
    assert layers_until_linked(3, 1, 5) == 4  # reach 1 per layer, distance 4
    assert layers_until_linked(5, 0, 7) == 4  # reach 2 per layer, ceil(7 / 2)
    assert layers_until_linked(3, 0, 7, dilation_growth=2) == 3  # reach 1 + 2 + 4 = 7
    with pytest.raises(ValueError, match="not linked"):
        layers_until_linked(1, 0, 7)  # a kernel of width 1 never widens the reach


def test_review_items_c1_c3_c4() -> None:
    """A loop that only works while D_v = D, dividing by 2 (not sqrt(D)), sigmoid, and shapes with non-integers."""
    def loop(q, k, v):
        w = torch.softmax(q @ k.T, dim=-1)
        out = torch.zeros_like(q)
        for i in range(k.shape[0]):
            out = out + w[:, i : i + 1] * v[i]
        return out

    fb = check_soft_lookup(loop)
    assert fb.status == "wrong" and "zeros_like(queries)" in fb.message, fb
    fb = check_soft_lookup(lambda q, k, v: torch.softmax(q @ k.T / 2, dim=-1) @ v)
    assert fb.status == "wrong" and "sqrt(D)" not in fb.message, fb
    assert "sigmoid" in check_soft_lookup(lambda q, k, v: torch.sigmoid(q @ k.T) @ v).message

    def fractional(B, S, D, D_k, D_v):
        shapes = reference_shapes(B, S, D, D_k, D_v)
        return {**shapes, "q": (B, S, D_k + 0.7)}

    fb = check_attention_shapes(fractional)
    assert fb.status == "wrong" and "whole number" in fb.message, fb


# ---------------------------------------------------------------- chapter code beyond the checkers


def test_layers_until_linked_leaves_the_global_generator_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    assert layers_until_linked(3, 1, 5) == 4
    assert torch.equal(torch.rand(3), expected)


def test_residual_path_keeps_the_token_its_own_input() -> None:
    from attnbook.ch01 import residual_gradient_norms

    torch.manual_seed(7)
    expected = torch.rand(2)
    torch.manual_seed(7)
    g = residual_gradient_norms(depth=12, D=32, S=8, position=5)
    assert torch.equal(torch.rand(2), expected)
    others_with = [v for i, v in enumerate(g["with"]) if i != 5]
    assert g["with"][5] > 3 * max(others_with)               # the identity path: its own input dominates
    assert max(g["without"]) < 2 * min(g["without"])         # without it, every input counts about the same


def test_minilm_are_row_matches_the_model(minilm) -> None:
    from attnbook.ch01 import MINILM_ARE, are_row_from_model

    assert are_row_from_model(*minilm) == MINILM_ARE


def test_the_head_diagram_is_drawn_from_the_notebook_constants() -> None:
    """The one-head diagram and the by-hand cell read the same constants, so their shapes agree."""
    import json
    from pathlib import Path

    from attnbook.ch01 import HEAD_B, HEAD_D, one_head_diagram
    from attnbook.examples import BOOKS_SENTENCE

    nb = json.loads((Path(__file__).resolve().parents[1] / "book" / "01_attention_at_a_glance.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "B, S, D = ch01.HEAD_B, len(BOOKS_SENTENCE), ch01.HEAD_D" in code
    sizes = f"{HEAD_B}, {len(BOOKS_SENTENCE)}, {HEAD_D}"
    assert f"({sizes})" in one_head_diagram().alt and f"[{sizes}]" in one_head_diagram().svg()


def test_tensors_page_prints_what_it_says() -> None:
    """book/tensors.md (linked from chapter 1) shows each example's printed result in a comment.

    Runs the page's code blocks in order; every ``print(...)`` and every bare expression must print
    (or evaluate to) text contained in its comment, and a comment that names an error must be raised.
    """
    import ast
    import contextlib
    import io
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "book" / "tensors.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) >= 7
    norm = lambda s: " ".join(s.split())  # noqa: E731
    namespace: dict[str, object] = {}
    torch.set_printoptions(precision=4, sci_mode=False)
    checked = 0
    try:
        for block in blocks:
            lines = block.splitlines()
            statements = ast.parse(block).body
            for i, st in enumerate(statements):
                end = statements[i + 1].lineno - 1 if i + 1 < len(statements) else len(lines)
                comments = [ln.split("#", 1)[1] for ln in lines[st.lineno - 1:end] if "#" in ln]
                expected = norm(" ".join(comments))
                code = "\n".join(lines[st.lineno - 1:st.end_lineno])
                code = "\n".join(ln.split("  #", 1)[0] for ln in code.splitlines())
                is_print = isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and \
                    getattr(st.value.func, "id", None) == "print"
                if expected.startswith("RuntimeError"):
                    with pytest.raises(RuntimeError) as err:
                        exec(code, namespace)
                    message = expected[len("RuntimeError: "):].split(" ...")[0]
                    assert norm(str(err.value)).startswith(message), (code, str(err.value))
                    checked += 1
                elif is_print and expected:
                    out = io.StringIO()
                    with contextlib.redirect_stdout(out):
                        exec(code, namespace)
                    assert norm(out.getvalue()) in expected, (code, out.getvalue(), expected)
                    checked += 1
                elif isinstance(st, ast.Expr) and expected:
                    value = eval(code, namespace)
                    assert norm(repr(value)) in expected, (code, repr(value), expected)
                    checked += 1
                else:
                    exec(code, namespace)
    finally:
        torch.set_printoptions(profile="default")
    assert checked >= 20, checked


def test_the_soft_lookup_diagram_draws_the_notebook_toy() -> None:
    """The diagram computes its weights from TOY_QUERY and TOY_KEYS; the toy cell must use the same numbers."""
    import json
    from pathlib import Path

    from attnbook.ch01 import TOY_KEYS, TOY_QUERY, soft_lookup_diagram

    nb = json.loads((Path(__file__).resolve().parents[1] / "book" / "01_attention_at_a_glance.ipynb").read_text())
    toy = next("".join(c["source"]) for c in nb["cells"] if "keys = torch.tensor(" in "".join(c["source"]))
    assert f"keys = torch.tensor({TOY_KEYS})" in toy and f"query = torch.tensor({TOY_QUERY})" in toy
    assert "weight 0.44" in soft_lookup_diagram().alt   # token 2's weight, printed by the toy cell


# ---------------------------------------------------------------- the fresh reading of chapters 1-2


def _shapes_with(**changes):
    """The right shapes with some steps replaced by shapes written with axis names."""

    def fn(B, S, D, D_k, D_v):
        env = {"B": B, "S": S, "D": D, "D_k": D_k, "D_v": D_v, "1": 1}
        out = reference_shapes(B, S, D, D_k, D_v)
        out.update({k: tuple(env[a] for a in v.split()) for k, v in changes.items()})
        return out

    return fn


@pytest.mark.parametrize(
    ("fn", "hint"),
    [  # only the weights wrong: the hint names 'weights', not the scores the reader got right
        (_shapes_with(weights="B S D_k"), "'weights' has the shape of 'q', but it holds one score for every pair"),
        (_shapes_with(scores="B S D_k"), "'scores' has the shape of 'q', but it holds one score for every pair"),
        (_shapes_with(weights="B 1 S S"), "'weights' has an axis of size 1 for the heads: this exercise has a single head"),
        (_shapes_with(weights="S S"), "'weights' has lost the batch axis: each sequence"),
        (_shapes_with(q="B S D_v", k="B S D_v", v="B S D_k", context="B S D_k"), "you swapped D_k and D_v"),
        (_shapes_with(k="B S D_v"), "'k' has the values' width D_v = 9"),
        (_shapes_with(v="B D_v S"), "nothing in attention transposes V"),
        (_shapes_with(q="S D_k", k="S D_k", v="S D_v"), "'q' has lost the batch axis"),
        (_shapes_with(v="S D_v"), "'v' has lost the batch axis"),
        (_shapes_with(scores="S S B", weights="S S B"), "'scores' puts the batch axis last"),
        (lambda *a: {**reference_shapes(*a), "q": (2.0, 5.0, 4.0)}, "a Python int (5, not 5.0"),
    ],
)
def test_shapes_name_the_step_and_the_slips_a_reader_made(fn, hint: str) -> None:
    fb = check_attention_shapes(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


def _stable_softmax_lookup(row_max):
    def fn(q, k, v):
        e = torch.exp(q @ k.T - row_max(q @ k.T))
        return (e / e.sum(dim=-1, keepdim=True)) @ v

    return fn


def _half_then_back(dtype):
    def fn(q, k, v):
        return (torch.softmax(q.to(dtype) @ k.to(dtype).T, dim=-1) @ v.to(dtype)).to(q.dtype)

    return fn


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (_half_then_back(torch.float16), "right only to about 3 significant digits"),
        (_half_then_back(torch.bfloat16), "run in float16 or bfloat16"),
        (lambda q, k, v: torch.softmax(q @ k.T / k.shape[0] ** 0.5, dim=-1) @ v, "the number of keys (keys.shape[0])"),
        (lambda q, k, v: torch.softmax(q @ k.T / q.shape[0] ** 0.5, dim=-1) @ v, "the number of queries"),
        (lambda q, k, v: torch.softmax(q @ k.T / 2, dim=-1) @ v, "a fixed temperature"),
        (lambda q, k, v: torch.softmax(q @ k[1:].T, dim=-1) @ v[1:], "left out the first key"),
        (lambda q, k, v: (torch.relu(q @ k.T) / torch.relu(q @ k.T).sum(-1, keepdim=True)) @ v, "inf or NaN"),
        (lambda q, k, v: (torch.exp(q @ k.T) / torch.exp(q @ k.T).sum()) @ v, "sum to 1 over the whole [M, N] matrix"),
        (_stable_softmax_lookup(lambda s: s.max(dim=0).values), "the maximum over a column, dim=0"),
        (_stable_softmax_lookup(lambda s: s.max(dim=0, keepdim=True).values), "the maximum over a column, dim=0"),
        (lambda q, k, v: torch.softmax(F.cosine_similarity(q[:, None], k[None], dim=-1), dim=-1) @ v, "cosine similarity"),
        (lambda q, k, v: torch.softmax(F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).T, -1) @ v, "cosine similarity"),
        (lambda q, k, v: torch.softmax(q @ k.T * q.shape[-1] ** 0.5, dim=-1) @ v, "multiplied the scores by sqrt(D)"),
        (lambda q, k, v: (torch.softmax(q[0] @ k.T, dim=-1) @ v).repeat(q.shape[0], 1), "the mix of the first query"),
    ],
)
def test_soft_lookup_names_the_reading_mistakes(fn, hint: str) -> None:
    fb = check_soft_lookup(fn)
    assert fb.status == "wrong" and hint in fb.message, fb
    assert "largest difference inf" not in fb.message


def test_soft_lookup_right_variants_still_pass() -> None:
    variants = [
        lambda q, k, v: torch.einsum("mn,nd->md", torch.softmax(torch.einsum("md,nd->mn", q, k), -1), v),
        lambda q, k, v: (lambda e: (e / e.sum(-1, keepdim=True)) @ v)(torch.exp(q @ k.T - (q @ k.T).amax(-1, keepdim=True))),
        lambda q, k, v: torch.stack([torch.softmax(k @ qi, 0) @ v for qi in q]),
    ]
    for fn in variants:
        assert check_soft_lookup(fn).passed


# ---------------------------------------------------------------- reach of dilated convolutions


@pytest.mark.parametrize("mistake", REACH_MISTAKES, ids=lambda m: m.name)
def test_reach_names_each_mistake_of_its_table(mistake) -> None:
    fb = check_reach(mistake.compute())
    assert fb.status == "wrong" and fb.message == mistake.hint, fb


@pytest.mark.parametrize(
    ("answer", "hint"),
    [
        ((2, 6, 1), "the first number, the dilated kernel-3 layers, is one short"),
        ((3, 3, 1), "the second number, the plain kernel-3 layers, counts two positions per layer"),
        ((3, 5, 1), "the second number, the plain kernel-3 layers, is one short"),
        ((3, 7, 1), "you counted the tokens from 'books' to '.', both ends included"),
        ((3, 4, 1), "the count section 1.6 measured for 'books' -> 'are'"),
        ((3, 6, 0), "the third number, the self-attention layers, cannot be 0"),
        ((5, 6, 1), "the first number, the dilated kernel-3 layers, is off (you wrote 5)"),
        ((3, 9, 1), "the second number, the plain kernel-3 layers, is off (you wrote 9)"),
        ((3, 6, 2), "the third number, the self-attention layers, is off (you wrote 2)"),
        (7, "three whole numbers in parentheses"),
        ((3, 6), "got a tuple of 2 items"),
        ((3.0, 6, 1), "an int (3, not 3.0)"),
    ],
)
def test_reach_names_the_wrong_count(answer, hint: str) -> None:
    fb = check_reach(answer)
    assert fb.status == "wrong" and hint in fb.message, fb


def test_reach_names_every_wrong_count_and_accepts_the_measured_answer() -> None:
    fb = check_reach((2, 9, 0))
    assert all(part in fb.message for part in ("first number", "second number", "third number")), fb
    assert check_reach(None).status == "todo"
    assert check_reach([3, 6, 1]).passed


def test_soft_lookup_computed_in_float32_on_float64_is_refused_by_the_dtype_rule() -> None:
    def float32_inside(queries, keys, values):
        return (torch.softmax(queries.float() @ keys.float().T, -1) @ values.float()).to(queries.dtype)

    fb = check_soft_lookup(float32_inside)
    assert fb.status == "wrong" and "carries only float32's precision" in fb.message, fb
    assert "casting back does not restore the digits" in fb.message, fb


def test_soft_lookup_upcast_to_float64_inside_is_still_right() -> None:
    def float64_inside(queries, keys, values):
        return (torch.softmax(queries.double() @ keys.double().T, -1) @ values.double()).to(queries.dtype)

    assert check_soft_lookup(float64_inside).passed


# ---------------------------------------------------------------- the second expert reading


def test_reach_names_the_window_centred_on_the_last_token() -> None:
    """(3, 3, 1) is 6 / 2: the window's width 2L + 1 taken as its reach towards 'books'."""
    fb = check_reach((3, 3, 1))
    assert fb.status == "wrong" and "centred on '.'" in fb.message, fb


def test_reach_asks_about_a_pair_whose_counts_the_chapter_does_not_print() -> None:
    """Section 1.6 prints 'books' -> 'are' (4 plain layers) and 'The' -> '.' (7): the exercise's pair is neither."""
    from attnbook.ch01 import REACH_DST, REACH_SRC, reach_answer

    assert (REACH_SRC, REACH_DST) == (1, 7)
    assert reach_answer() == (3, 6, 1)
    assert reach_answer()[1] not in (4, 7)


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda q, k, v: torch.exp(q @ k.T) @ v, "did not divide by their sum"),
        (lambda q, k, v: torch.exp(q @ k.T - (q @ k.T).max(dim=-1, keepdim=True).values) @ v,
         "did not divide by their sum"),
        (lambda q, k, v: torch.softmax(q @ k.T, dim=-1) @ v.T, "you multiplied the weights by values.T"),
    ],
)
def test_soft_lookup_names_exp_without_the_sum_and_values_transposed(fn, hint: str) -> None:
    fb = check_soft_lookup(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


@pytest.mark.parametrize(
    "fn",
    [
        _shapes_with(context="B S D_k", output="B S D_k"),
        _shapes_with(context="B S D_k", output="S B D"),
        _shapes_with(context="B S D_k", output="B S D_v"),
    ],
)
def test_shapes_blame_the_context_not_the_values_the_reader_got_right(fn) -> None:
    fb = check_attention_shapes(fn)
    assert fb.status == "wrong" and fb.message.startswith("'context'"), fb


# ---------------------------------------------------------------- the third expert reading


def test_soft_lookup_names_scores_built_as_a_float32_tensor() -> None:
    """torch.tensor of Python floats is float32: on float64 inputs the scores lose digits, named as such (not as a cast)."""
    def from_python_floats(queries, keys, values):
        scores = torch.tensor([[float(qi @ kj) for kj in keys] for qi in queries])
        weights = torch.softmax(scores, dim=-1)
        return (weights[..., None] * values).sum(dim=1)  # the product promotes back to float64

    fb = check_soft_lookup(from_python_floats)
    assert fb.status == "wrong" and "torch.tensor(...) of Python floats" in fb.message, fb
    assert "dtype=queries.dtype" in fb.message and ".float()" not in fb.message, fb

    def with_the_dtype(queries, keys, values):
        scores = torch.tensor([[float(qi @ kj) for kj in keys] for qi in queries], dtype=queries.dtype)
        return torch.softmax(scores, dim=-1) @ values

    assert check_soft_lookup(with_the_dtype).passed


@pytest.mark.parametrize("stop, start, row", [(1, 0, 2), (0, 1, 0)])
def test_soft_lookup_names_the_query_a_loop_skipped(stop: int, start: int, row: int) -> None:
    def loop(queries, keys, values):
        out = torch.zeros(queries.shape[0], values.shape[1], dtype=values.dtype)
        for i in range(start, queries.shape[0] - stop):
            out[i] = torch.softmax(keys @ queries[i], dim=-1) @ values
        return out

    fb = check_soft_lookup(loop)
    assert fb.status == "wrong" and f"row {row} of your result was never filled" in fb.message, fb


def test_soft_lookup_names_a_softmax_sum_without_keepdim() -> None:
    def no_keepdim(queries, keys, values):
        s = queries @ keys.T
        return (torch.exp(s) / torch.exp(s).sum(dim=-1)) @ values

    fb = check_soft_lookup(no_keepdim)
    assert fb.status == "wrong" and "drops the summed axis" in fb.message, fb


# ---------------------------------------------------------------- exercise 1.2: slips that got a generic hint


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (_shapes_with(q="S D_k", k="S D_k", v="S D_v", scores="S S", weights="S S", context="S D_v", output="S D"),
         "none of your shapes has the batch axis"),
        (_shapes_with(q="B S D", k="B S D", v="B S D", context="B S D"), "every width in your answer is the model width"),
        (_shapes_with(q="B D_k S", k="B D_k S", v="B D_v S", context="B D_v S", output="B D S"),
         "'q' puts the features before the positions"),
        (_shapes_with(q="B D_k S"), "'q' puts the features before the positions"),
        (_shapes_with(scores="B S", weights="B S"), "'scores' has one number per token"),
        (_shapes_with(weights="B S 1"), "'weights' ends in an axis of size 1, the shape of the row sums"),
        (_shapes_with(q="B 1 S D_k", k="B 1 S D_k", v="B 1 S D_v", scores="B 1 S S", weights="B 1 S S",
                      context="B 1 S D_v"), "'q' has an axis of size 1 for the heads"),
        (_shapes_with(q="B S 1 D_k", k="B S 1 D_k", v="B S 1 D_v", context="B S 1 D_v"),
         "'q' has an axis of size 1 for the heads after the positions"),
        (_shapes_with(q="D D_k", k="D D_k", v="D D_v"), "'q' is the shape of a weight matrix"),
        (_shapes_with(q="D_k D", k="D_k D", v="D_v D"), "'q' is the shape of nn.Linear's .weight"),
        (_shapes_with(q="B S D"), "'q' still has the model width D = 12"),
    ],
)
def test_shapes_name_the_common_slips(fn, hint: str) -> None:
    fb = check_attention_shapes(fn)
    assert fb.status == "wrong" and hint in fb.message, fb


def test_shape_hints_do_not_state_the_right_shape() -> None:
    """A hint names the slip and where to look; it never writes out a step's right shape, by name or in numbers."""
    for config in SHAPE_CONFIGS:
        B, S, D, D_k, D_v = config
        right = reference_shapes(*config)
        for m in SHAPE_MISTAKES:
            got = m.compute(*config)
            step = next(k for k in SHAPE_KEYS if got[k] != right[k])
            hint = m.hint.format(B=B, S=S, D=D, D_k=D_k, D_v=D_v, step=step)
            for k in SHAPE_KEYS:
                assert str(right[k]) not in hint, (m.name, k, hint)
            for named in ("[B, S, D_k]", "[B, S, D_v]", "[B, S, S]"):
                assert named not in hint, (m.name, named, hint)


def test_unfilled_rows_words_each_loop_that_stopped_early() -> None:
    """The one "never filled" check of chapters 1 and 2: a skipped query row, a skipped sequence, a skipped row of one."""
    from attnbook.ch01 import _SKIPPED_QUERY, unfilled_rows

    result = torch.ones(3, 4)
    result[2] = 0
    fb = unfilled_rows(result, name="your result", tail=_SKIPPED_QUERY, partial=True)
    assert fb.message == ("row 2 of your result was never filled: it is all 0, as in the zeros you started from, while "
                          "other rows hold a mix. Your loop over the queries stops early or starts late (range(M - 1), "
                          "range(1, M)): query 2 of the M = 3 queries was skipped, and every query needs its own row."), fb
    assert unfilled_rows(torch.zeros(3, 4), partial=True) is None  # nothing filled at all: not a loop that stopped early
    assert unfilled_rows(torch.ones(3, 4)) is None
    assert unfilled_rows(result).message.startswith("row 2 of your weights was never filled: it is all 0, as in the "
                                                    "zeros you started from. Your loop over the queries stops early")
    batch = torch.ones(2, 3, 3)
    batch[1] = 0
    assert unfilled_rows(batch).message.startswith("sequence 1 of the batch was never filled")
    batch = torch.ones(2, 3, 3)
    batch[1, 2] = 0
    assert unfilled_rows(batch).message.startswith("row 2 of sequence 1 was never filled")


def test_shape_configurations_keep_every_size_apart() -> None:
    """No size equals another or is another's +-1, in a configuration, so that S - 1 cannot pass for D_k; and the two
    configurations differ in every size."""
    for config in SHAPE_CONFIGS:
        for i, a in enumerate(config):
            for b in config[i + 1:]:
                assert abs(a - b) > 1, config
    assert all(a != b for a, b in zip(*SHAPE_CONFIGS))


def test_shapes_name_scores_that_leave_out_the_token_itself() -> None:
    def no_self(B, S, D, D_k, D_v):
        return {**reference_shapes(B, S, D, D_k, D_v), "scores": (B, S, S - 1), "weights": (B, S, S - 1)}

    fb = check_attention_shapes(no_self)
    assert fb.status == "wrong" and "its own included" in fb.message, fb
    assert "has the shape of 'q'" not in fb.message, fb


@pytest.mark.parametrize("kind", ["zeros buffer", "torch.tensor of lists"])
def test_soft_lookup_names_a_float32_tensor_made_without_dtype(kind: str) -> None:
    """A float32 result from float64 inputs that the reader did not cast names the default dtype of a new tensor."""
    def zeros_buffer(queries, keys, values):
        out = torch.zeros(queries.shape[0], values.shape[1])
        for i in range(queries.shape[0]):
            out[i] = torch.softmax(keys @ queries[i], dim=-1) @ values
        return out

    def from_lists(queries, keys, values):
        return torch.tensor([(torch.softmax(keys @ q, dim=-1) @ values).tolist() for q in queries])

    fb = check_soft_lookup(zeros_buffer if kind == "zeros buffer" else from_lists)
    assert fb.status == "wrong" and "made without dtype=" in fb.message and "dtype=queries.dtype" in fb.message, fb


def test_the_rope_diagram_claims_what_rope_does() -> None:
    """The RoPE diagram's two panels share one offset; ch01.rope gives their query-key pairs one score."""
    from attnbook.ch01 import ROPE_PANELS, rope, rope_diagram

    (offset,) = {j - i for i, j in ROPE_PANELS}
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(8, generator=g), torch.randn(8, generator=g)
    scores = [float(rope(q, i) @ rope(k, j)) for i, j in ROPE_PANELS]
    assert abs(scores[0] - scores[1]) < 1e-5
    assert float(rope(q, 0) @ rope(k, offset + 1)) != pytest.approx(scores[0], abs=1e-3)  # another offset differs
    assert f"the offset is {offset}" in rope_diagram().alt


# ---------------------------------------------------------------- the confirmation reading


def test_shapes_name_a_single_number_given_for_a_shape() -> None:
    """A step given as B * S * D (one int) is named as a single number, not as a size that is no int."""
    fb = check_attention_shapes(lambda B, S, D, D_k, D_v: {**reference_shapes(B, S, D, D_k, D_v), "output": B * S * D})
    assert fb.status == "wrong" and "got the single number" in fb.message and "one int per axis" in fb.message, fb
    assert "whole number" not in fb.message, fb


def test_shapes_sequence_first_hint_points_at_the_layout_section() -> None:
    hint = next(m.hint for m in SHAPE_MISTAKES if m.name == "sequence first")
    assert "section 1.10" in hint and "chapter 1 warns" not in hint
