"""Chapter 5 checkers: right answers pass, stubs say "your turn", typical mistakes get their hint."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import Tensor

from attnbook import ch05
from attnbook.ch05 import (
    BYTES_MISTAKES,
    LOOP_MISTAKES,
    PARAM_EXERCISE,
    PARAM_MISTAKES,
    check_param_count,
    check_per_head_loop,
    check_weights_bytes,
)
from attnlib import MultiHeadSelfAttention

# --- parameter count -------------------------------------------------------------------------

def test_param_count_right_and_stub() -> None:
    assert check_param_count(4 * 1536**2 + 4 * 1536).status == "correct"
    assert check_param_count(4 * 768**2, d_model=768, num_heads=12, bias=False).status == "correct"
    assert check_param_count(None).status == "todo"


@pytest.mark.parametrize("mistake", PARAM_MISTAKES, ids=lambda m: m.name)
def test_param_count_gives_each_table_hint(mistake) -> None:  # type: ignore[no-untyped-def]
    fb = check_param_count(mistake.compute(*PARAM_EXERCISE))
    assert fb.status == "wrong" and fb.message == mistake.hint


def test_param_count_table_entries_are_distinct_and_wrong() -> None:
    values = [m.compute(*PARAM_EXERCISE) for m in PARAM_MISTAKES]
    assert len(set(values)) == len(values) and 4 * 1536**2 + 4 * 1536 not in values


@pytest.mark.parametrize(
    "answer, hint",
    [
        ("many", "number"),
        (1.5, "whole number"),
        (123, "not it"),
    ],
)
def test_param_count_hints(answer: object, hint: str) -> None:
    fb = check_param_count(answer)
    assert fb.status == "wrong" and hint in fb.message


# --- per-head loop ---------------------------------------------------------------------------

def loop(x: Tensor, m: MultiHeadSelfAttention, *, scale_by: str = "d_k", dim: int = -1, use_wo: bool = True,
         reverse: bool = False, columns: bool = False) -> Tensor:
    d_k = m.d_k
    outs = []
    for h in range(m.num_heads):
        sl = slice(h * d_k, (h + 1) * d_k)

        def proj(layer: torch.nn.Linear) -> Tensor:
            w = layer.weight[:, sl].T if columns else layer.weight[sl]
            return x @ w.T + layer.bias[sl]

        q, k, v = proj(m.w_q), proj(m.w_k), proj(m.w_v)
        div = {"d_k": math.sqrt(d_k), "D": math.sqrt(m.d_model), "none": 1.0, "d_k_plain": d_k}[scale_by]
        w = torch.softmax(q @ k.transpose(-2, -1) / div, dim=dim)
        outs.append(w @ v)
    if reverse:
        outs = outs[::-1]
    merged = torch.cat(outs, dim=-1)
    return m.w_o(merged) if use_wo else merged


def test_per_head_loop_right() -> None:
    assert check_per_head_loop(loop).status == "correct"


def test_per_head_loop_stub_and_crash() -> None:
    def stub(x: Tensor, m: MultiHeadSelfAttention) -> Tensor:
        raise NotImplementedError

    assert check_per_head_loop(stub).status == "todo"
    fb = check_per_head_loop(lambda x, m: m(x).hidden_states)
    assert fb.status == "wrong" and "per-head loop" in fb.message


@pytest.mark.parametrize("mistake", LOOP_MISTAKES, ids=lambda m: m.name)
def test_per_head_loop_gives_each_table_hint(mistake) -> None:  # type: ignore[no-untyped-def]
    fb = check_per_head_loop(lambda x, m: mistake.compute(m, x))
    assert fb.status == "wrong" and fb.message == mistake.hint, fb.message


def test_loop_mistakes_differ_from_the_right_answer_and_from_each_other() -> None:
    ref, x = ch05._reference_module()
    with torch.no_grad():
        results = [ref(x).hidden_states] + [m.compute(ref, x) for m in LOOP_MISTAKES]
        assert torch.allclose(ch05._loop(ref, x), results[0], atol=1e-5)
    for i in range(len(results)):
        for j in range(i):
            assert not torch.allclose(results[i], results[j], atol=1e-3), (i, j)


@pytest.mark.parametrize(
    "kwargs, hint",
    [
        (dict(use_wo=False), "output projection"),
        (dict(scale_by="D"), "1/sqrt(D)"),
        (dict(reverse=True), "reverse order"),
        (dict(columns=True), "columns"),
    ],
)
def test_per_head_loop_hints_for_an_independent_loop(kwargs: dict, hint: str) -> None:
    fb = check_per_head_loop(lambda x, m: loop(x, m, **kwargs))
    assert fb.status == "wrong" and hint in fb.message, fb.message


def test_per_head_loop_wrong_shapes() -> None:
    fb = check_per_head_loop(lambda x, m: torch.zeros(2, 3, 5, 4))
    assert fb.status == "wrong" and "concatenate" in fb.message
    fb = check_per_head_loop(lambda x, m: x[..., :4])
    assert fb.status == "wrong" and "expected [B, S, D]" in fb.message
    fb = check_per_head_loop(lambda x, m: x * 2)
    assert fb.status == "wrong" and "rows" in fb.message


def test_per_head_loop_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    check_per_head_loop(loop)
    assert torch.equal(torch.rand(1), before)


# --- weights bytes ---------------------------------------------------------------------------

def right_bytes(B: int, H: int, S: int, dtype: torch.dtype) -> int:
    return B * H * S * S * torch.empty((), dtype=dtype).element_size()


def test_weights_bytes_right_and_stub() -> None:
    assert check_weights_bytes(right_bytes).status == "correct"

    def stub(B: int, H: int, S: int, dtype: torch.dtype) -> int:
        raise NotImplementedError

    assert check_weights_bytes(stub).status == "todo"


@pytest.mark.parametrize("mistake", BYTES_MISTAKES, ids=lambda m: m.name)
def test_weights_bytes_gives_each_table_hint(mistake) -> None:  # type: ignore[no-untyped-def]
    fb = check_weights_bytes(mistake.compute)
    assert fb.status == "wrong" and fb.message.endswith(mistake.hint), fb.message


@pytest.mark.parametrize(
    "fn, hint",
    [
        (lambda B, H, S, dt: B * H * S * S * 2, "hard-coded 2 bytes"),
        (lambda B, H, S, dt: "big", "an int"),
        (lambda B, H, S, dt: right_bytes(B, H, S, dt) + 1, "not B·H·S·S"),
    ],
)
def test_weights_bytes_hints(fn, hint: str) -> None:  # type: ignore[no-untyped-def]
    fb = check_weights_bytes(fn)
    assert fb.status == "wrong" and hint in fb.message, fb.message


# --- the two-relation example and the three attention paths ----------------------------------


def test_best_single_head_leaves_half_the_target_for_any_rotation() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        U, Z = ch05.relation_subspaces(gen)
        assert torch.allclose(U.T @ Z, torch.zeros(6, 6, dtype=torch.float64), atol=1e-12)
        err, _ = ch05.best_single_head_error(U, Z, n=3000, generator=gen)
        assert 0.48 < err < 0.5  # in-sample least squares can only flatter the head, by about d / n


def test_two_heads_serve_both_relations_wherever_the_tokens_and_features_sit() -> None:
    gen = torch.Generator().manual_seed(1)
    S = 12
    for query, antecedent, predicate in ((8, 1, 10), (8, 10, 1), (0, 5, 6)):
        U, Z = ch05.relation_subspaces(gen)
        x = ch05.relation_batch(64, S, 12, gen)  # [n, S, S + d]
        with torch.no_grad():
            out = ch05.two_head_module(U, Z, S, query, antecedent, predicate)(x).hidden_states[:, query, S:]  # [n, d]
        target = x[:, antecedent, S:] @ U @ U.T + x[:, predicate, S:] @ Z @ Z.T
        assert ch05.relative_error(out, target) < 1e-4


def test_the_three_core_paths_agree() -> None:
    q, k, v = (torch.randn(2, 4, 7, 8, dtype=torch.float64) for _ in range(3))
    results = [fn(q, k, v) for fn in ch05.core_paths().values()]
    for r in results[1:]:
        torch.testing.assert_close(r, results[0])


def test_weights_bytes_never_shows_the_expected_number_and_reads_any_integer() -> None:
    """Review item ch5 #39."""
    import numpy as np

    fb = check_weights_bytes(lambda B, H, S, dt: right_bytes(B, H, S, dt) + 1)
    assert "786,432" not in fb.message and "786432" not in fb.message
    assert check_weights_bytes(lambda B, H, S, dt: np.prod([B, H, S, S, torch.empty((), dtype=dt).element_size()])).passed
    assert check_weights_bytes(lambda B, H, S, dt: torch.tensor(right_bytes(B, H, S, dt))).passed
    hard_coded = check_weights_bytes(lambda B, H, S, dt: B * H * S * S * (2 if "16" in str(dt) else 4))
    assert hard_coded.status == "wrong" and "float64" in hard_coded.message
    assert "GiB" in check_weights_bytes(lambda B, H, S, dt: right_bytes(B, H, S, dt) / 2**30).message


def test_param_count_reads_numpy_and_tensors_and_never_raises() -> None:
    """Review item ch5 #37."""
    import numpy as np

    right = 4 * 1536**2 + 4 * 1536
    assert check_param_count(np.int64(right)).passed and check_param_count(torch.tensor(right)).passed
    assert check_param_count(float(right)).passed
    for bad in (float("nan"), float("inf"), -float("inf")):
        assert check_param_count(bad).status == "wrong"
    assert "output projection W_O has one" in check_param_count(4 * 1536**2 + 3 * 1536).message
    assert "every head its own bias" in check_param_count(4 * 1536**2 + 4 * 1536 * 12).message
    assert "D = 768" in check_param_count(2_362_368).message


# --- attnbook.measure.saved_tensor_bytes: what counts as an activation ------------------------


def test_saved_tensor_bytes_never_counts_parameters_of_a_lambda() -> None:
    """A lambda has no .parameters(); the weights it closes over (and their views) must still be left out."""
    from attnbook.measure import saved_tensor_bytes

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64)
    x = torch.randn(4, 64, requires_grad=True)
    direct = saved_tensor_bytes(lin, x)
    wrapped = saved_tensor_bytes(lambda t: lin(t), x)
    assert direct == wrapped
    assert direct["activations"] == 0  # linear saves x and weight.t(): both existed before the call
    assert direct["params_and_inputs"] == x.nbytes + lin.weight.nbytes
    relu = saved_tensor_bytes(lambda t: torch.relu(lin(t)), x)
    assert relu["activations"] == 4 * 64 * 4 and relu["count"] == 1  # only the new relu output


def test_saved_tensor_bytes_counts_tensors_made_inside_and_not_those_captured() -> None:
    from attnbook.measure import saved_tensor_bytes

    w = torch.randn(8, 8, requires_grad=True)
    captured = torch.randn(8, 8)  # exists before the call
    made = saved_tensor_bytes(lambda a: a * torch.ones(8, 8).exp(), w)  # the exp result is allocated by the call
    assert made["activations"] == 8 * 8 * 4
    closed = saved_tensor_bytes(lambda a: a * captured, w)
    assert closed["activations"] == 0 and closed["params_and_inputs"] == 8 * 8 * 4


def test_saved_tensors_order_fused_below_softmax_below_attnlib_at_every_head_count() -> None:
    """The chapter's table: no implementation keeping fewer [S, S] tensors may show more bytes (the H = 1 paradox)."""
    from attnbook.measure import saved_tensor_bytes

    torch.manual_seed(0)
    D, S = 32, 24
    x = torch.randn(1, S, D)
    for H in (1, 2, 4):
        m = MultiHeadSelfAttention(D, H)
        explicit = saved_tensor_bytes(m, x)["activations"]
        soft = saved_tensor_bytes(lambda t: ch05.softmax_block(m, t), x)["activations"]
        fused = saved_tensor_bytes(lambda t: m(t, need_weights=False), x)["activations"]
        assert fused < soft < explicit, (H, fused, soft, explicit)
        square, row = S * S * 4, S * 4  # bytes of one [S, S] and one [S] float32 tensor
        assert 2 * H * square <= explicit - soft < 2 * H * square + 4 * H * row  # two more [S, S] per head (+ row vectors)


def test_per_head_loop_refuses_the_module_forward_however_it_is_reached_and_sdpa() -> None:
    import torch.nn.functional as F

    from attnlib.multihead import MultiHeadSelfAttention

    fb = check_per_head_loop(lambda x, m: MultiHeadSelfAttention.forward(m, x).hidden_states)
    assert fb.status == "wrong" and "do not call the module itself" in fb.message, fb

    def sdpa_split(x, m):  # a view/transpose split and PyTorch's fused attention: right numbers, not the exercise
        B, S, D = x.shape
        H, d_k = m.num_heads, m.d_k
        q, k, v = (lin(x).view(B, S, H, d_k).transpose(1, 2) for lin in (m.w_q, m.w_k, m.w_v))  # [B, H, S, D_k]
        return m.w_o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, S, D))

    fb = check_per_head_loop(sdpa_split)
    assert fb.status == "wrong" and "scaled_dot_product_attention" in fb.message and "torch.softmax" in fb.message, fb
    # the guard is lifted afterwards: the module and F work as before
    m = MultiHeadSelfAttention(8, 2)
    x = torch.randn(1, 3, 8)
    assert m(x).hidden_states.shape == (1, 3, 8)
    assert F.scaled_dot_product_attention(x, x, x).shape == (1, 3, 8)
    assert check_per_head_loop(loop).passed


def test_per_head_loop_names_a_stack_reshape_without_transpose() -> None:
    def stacked(x: torch.Tensor, m) -> torch.Tensor:  # type: ignore[no-untyped-def]
        d_k, heads = m.d_k, []
        for h in range(m.num_heads):
            rows = slice(h * d_k, (h + 1) * d_k)
            q, k, v = (x @ lin.weight[rows].T + lin.bias[rows] for lin in (m.w_q, m.w_k, m.w_v))
            heads.append(torch.softmax(q @ k.transpose(-2, -1) / d_k**0.5, dim=-1) @ v)
        return m.w_o(torch.stack(heads, 1).reshape(x.shape))  # the head axis never moved back

    fb = check_per_head_loop(stacked)
    assert fb.status == "wrong" and "without moving the head axis back" in fb.message, fb.message


def test_opening_diagram_weights_match_the_hand_set_heads() -> None:
    one, two = ch05.opening_weights()
    assert abs(one - 0.4939) < 5e-5 and abs(two - 0.9735) < 5e-5  # the notebook's printed weights
    assert f"{one:.2f} each" in ch05.one_vs_two_heads_diagram().alt


# --- the reading's wrong answers, as a reader would write them ---------------------------------

def _reader_loop(x: Tensor, m: MultiHeadSelfAttention, *, same_slice: bool = False, transpose_weights: bool = False,
                 scale_after: bool = False, keys_from_w_q: bool = False) -> Tensor:
    d_k, outs = m.d_k, []
    for h in range(m.num_heads):
        sl = slice(0, d_k) if same_slice else slice(h * d_k, (h + 1) * d_k)
        q = x @ m.w_q.weight[sl].T + m.w_q.bias[sl]
        key_layer = m.w_q if keys_from_w_q else m.w_k
        k = x @ key_layer.weight[sl].T + key_layer.bias[sl]
        v = x @ m.w_v.weight[sl].T + m.w_v.bias[sl]
        if scale_after:
            outs.append(torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v / math.sqrt(d_k))
            continue
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1)
        outs.append((w.transpose(-2, -1) if transpose_weights else w) @ v)
    return m.w_o(torch.cat(outs, dim=-1))


@pytest.mark.parametrize(
    ("kwargs", "hint"),
    [
        (dict(same_slice=True), "every head uses the same slice"),
        (dict(transpose_weights=True), "transposed weights"),
        (dict(scale_after=True), "scaled after the softmax"),
        (dict(keys_from_w_q=True), "keys come from w_q"),
    ],
)
def test_per_head_loop_names_the_common_loop_slips(kwargs: dict, hint: str) -> None:
    fb = check_per_head_loop(lambda x, m: _reader_loop(x, m, **kwargs))
    assert fb.status == "wrong" and hint in fb.message, fb.message


def test_per_head_loop_refuses_a_float32_computation_of_the_float64_case() -> None:
    fb = check_per_head_loop(lambda x, m: _reader_loop(x.float(), m.float()))
    assert fb.status == "wrong" and "torch.float32, but x and the module are torch.float64" in fb.message, fb.message
    fb = check_per_head_loop(lambda x, m: _reader_loop(x.float(), m.float()).to(x.dtype))
    assert fb.status == "wrong" and "only as precise as float32" in fb.message, fb.message
    assert check_per_head_loop(lambda x, m: _reader_loop(x, m)).passed


def test_param_count_names_biases_of_one_head_width() -> None:
    fb = check_param_count(4 * 1536**2 + 4 * 128)
    assert fb.status == "wrong" and "not D_k" in fb.message, fb.message


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda B, H, S, dt: B * H * S * S * torch.empty((), dtype=dt).element_size() / 1e9, "GB"),
        (lambda B, H, S, dt: B * H * S * S * torch.empty((), dtype=dt).element_size() / 1024, "KiB"),
        (lambda B, H, S, dt: B * H * S * S * (4 if dt == torch.float32 else 2), "float64 (8 bytes)"),
    ],
    ids=["GB", "KiB", "float32 else 2"],
)
def test_weights_bytes_names_unit_and_dtype_slips(fn, hint: str) -> None:  # type: ignore[no-untyped-def]
    fb = check_weights_bytes(fn)
    assert fb.status == "wrong" and hint in fb.message, fb.message


# --- loops a reader writes: a causal mask, strided heads, split_heads, no loop ------------------

def _causal_loop(x: Tensor, m: MultiHeadSelfAttention) -> Tensor:
    d_k, S, outs = m.d_k, x.shape[1], []
    mask = torch.tril(torch.ones(S, S, dtype=torch.bool))  # chapter 4's habit
    for h in range(m.num_heads):
        rows = slice(h * d_k, (h + 1) * d_k)
        q, k, v = (x @ lin.weight[rows].T + lin.bias[rows] for lin in (m.w_q, m.w_k, m.w_v))
        scores = (q @ k.transpose(-2, -1) / math.sqrt(d_k)).masked_fill(~mask, float("-inf"))
        outs.append(torch.softmax(scores, dim=-1) @ v)
    return m.w_o(torch.cat(outs, dim=-1))


def _strided_loop(x: Tensor, m: MultiHeadSelfAttention) -> Tensor:
    H, d_k, outs = m.num_heads, m.d_k, []
    for h in range(H):
        q, k, v = (x @ lin.weight[h::H].T + lin.bias[h::H] for lin in (m.w_q, m.w_k, m.w_v))  # every H-th feature
        outs.append(torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1) @ v)
    return m.w_o(torch.cat(outs, dim=-1))


def _split_heads_loop(x: Tensor, m: MultiHeadSelfAttention) -> Tensor:
    from attnlib import split_heads

    q, k, v = (split_heads(lin(x), m.num_heads) for lin in (m.w_q, m.w_k, m.w_v))  # [B, H, S, D_k]
    outs = [torch.softmax(q[:, h] @ k[:, h].transpose(-2, -1) / math.sqrt(m.d_k), dim=-1) @ v[:, h]
            for h in range(m.num_heads)]
    return m.w_o(torch.cat(outs, dim=-1))


def _no_loop(x: Tensor, m: MultiHeadSelfAttention) -> Tensor:
    B, S, D = x.shape
    q, k, v = (lin(x).view(B, S, m.num_heads, m.d_k).transpose(1, 2) for lin in (m.w_q, m.w_k, m.w_v))
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(m.d_k), dim=-1)  # [B, H, S, S]
    return m.w_o((w @ v).transpose(1, 2).reshape(B, S, D))


def test_per_head_loop_names_a_causal_mask_and_every_h_th_feature() -> None:
    fb = check_per_head_loop(_causal_loop)
    assert fb.status == "wrong" and "causal mask" in fb.message and "unmasked" in fb.message, fb.message
    fb = check_per_head_loop(_strided_loop)
    assert fb.status == "wrong" and "every H-th feature" in fb.message, fb.message


def test_per_head_loop_refuses_split_heads_and_a_version_with_no_loop() -> None:
    fb = check_per_head_loop(_split_heads_loop)
    assert fb.status == "wrong" and "calls split_heads" in fb.message, fb.message
    fb = check_per_head_loop(_no_loop)
    assert fb.status == "wrong" and "all heads at once" in fb.message, fb.message
    import sys

    assert sys.getprofile() is None  # the watch on split_heads is lifted afterwards
    assert check_per_head_loop(_reader_loop).passed


def test_per_head_loop_names_q_and_k_each_scaled() -> None:
    def both_scaled(x: Tensor, m: MultiHeadSelfAttention) -> Tensor:
        d_k, outs = m.d_k, []
        for h in range(m.num_heads):
            rows = slice(h * d_k, (h + 1) * d_k)
            q, k, v = (x @ lin.weight[rows].T + lin.bias[rows] for lin in (m.w_q, m.w_k, m.w_v))
            q, k = q / math.sqrt(d_k), k / math.sqrt(d_k)
            outs.append(torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v)
        return m.w_o(torch.cat(outs, dim=-1))

    fb = check_per_head_loop(both_scaled)
    assert fb.status == "wrong" and "scaling both q and k by 1/sqrt(D_k)" in fb.message, fb.message


@pytest.mark.parametrize(("answer", "hint"), [(12 * 1536 * 1536, "a full D×D matrix"),
                                              (2 * 1536**2 + 2 * 1536, "two projections")])
def test_param_count_names_a_full_matrix_per_head_and_two_matrices(answer: int, hint: str) -> None:
    fb = check_param_count(answer)
    assert fb.status == "wrong" and hint in fb.message, fb.message


def test_best_single_head_misses_min_over_sum_for_unequal_relations() -> None:
    gen = torch.Generator().manual_seed(0)
    for r_u, r_z in ((6, 6), (8, 4), (10, 2)):
        U, Z = ch05.relation_subspaces(gen, r=r_u, r_z=r_z)
        err, _ = ch05.best_single_head_error(U, Z, n=4000, generator=gen)
        assert abs(err - min(r_u, r_z) / (r_u + r_z)) < 0.01, (r_u, r_z, err)


# --- W_O's transpose, 16-bit arithmetic inside, the concatenation axis, MiB instead of bytes --------

def _heads(x: Tensor, m: MultiHeadSelfAttention) -> list[Tensor]:
    d_k, outs = m.d_k, []
    for h in range(m.num_heads):
        rows = slice(h * d_k, (h + 1) * d_k)
        q, k, v = (x @ lin.weight[rows].T + lin.bias[rows] for lin in (m.w_q, m.w_k, m.w_v))
        outs.append(torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1) @ v)  # [B, S, D_k]
    return outs


@pytest.mark.parametrize(
    "merge",
    [
        lambda heads, m: torch.cat(heads, dim=-1) @ m.w_o.weight + m.w_o.bias,  # no .T
        lambda heads, m: torch.nn.functional.linear(torch.cat(heads, dim=-1), m.w_o.weight.T, m.w_o.bias),  # .T too many
        lambda heads, m: sum(o @ m.w_o.weight[h * m.d_k:(h + 1) * m.d_k] for h, o in enumerate(heads)) + m.w_o.bias,
    ],
    ids=["matmul without .T", "F.linear with .T", "rows of W_O per head"],
)
def test_per_head_loop_names_w_o_applied_transposed(merge) -> None:  # type: ignore[no-untyped-def]
    fb = check_per_head_loop(lambda x, m: merge(_heads(x, m), m))
    assert fb.status == "wrong" and "applied W_O transposed" in fb.message, fb.message


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_per_head_loop_refuses_16_bit_arithmetic_cast_back(dtype: torch.dtype) -> None:
    """The dtype rule: a loop that computes in 16 bits and casts back to the inputs' dtype is named, not 'differs'."""
    fb = check_per_head_loop(lambda x, m: ch05._solution_loop(x.to(dtype), m.to(dtype)).to(x.dtype))
    assert fb.status == "wrong" and f"computed in {dtype} inside" in fb.message and "casting back" in fb.message, fb.message
    fb = check_per_head_loop(lambda x, m: ch05._solution_loop(x.to(dtype), m.to(dtype)))  # returned in 16 bits
    assert fb.status == "wrong" and str(dtype) in fb.message and "significant digits" in fb.message, fb.message
    assert check_per_head_loop(lambda x, m: ch05._solution_loop(x.double(), m.double())).passed  # wider is fine


@pytest.mark.parametrize(
    ("merge", "hint"),
    [
        (lambda heads: torch.cat(heads, dim=1), "along dim=1"),
        (lambda heads: torch.hstack(heads), "along dim=1"),
        (lambda heads: torch.cat(heads, dim=1).reshape(heads[0].shape[0], heads[0].shape[1], -1), "along dim=1"),
        (lambda heads: torch.cat(heads), "along dim=0"),
    ],
    ids=["cat dim=1", "hstack", "cat dim=1 then reshape", "cat default dim"],
)
def test_per_head_loop_names_the_concatenation_axis(merge, hint: str) -> None:  # type: ignore[no-untyped-def]
    fb = check_per_head_loop(lambda x, m: m.w_o(merge(_heads(x, m))))
    assert fb.status == "wrong" and hint in fb.message and "torch.cat(heads, dim=-1)" in fb.message, fb.message
    assert check_per_head_loop(lambda x, m: m.w_o(torch.cat(_heads(x, m), dim=2))).passed


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda B, H, S, dt: B * H * S * S * dt.itemsize // 2**20, "whole MiB, rounded down"),
        (lambda B, H, S, dt: int(B * H * S * S * dt.itemsize / 2**20), "whole MiB, rounded down"),
        (lambda B, H, S, dt: round(B * H * S * S * dt.itemsize / 2**20), "MiB rounded to a whole number"),
        (lambda B, H, S, dt: round(B * H * S * S * dt.itemsize / 2**20, 2), "MiB rounded to 2 decimals"),
        (lambda B, H, S, dt: B * H * S * S * dt.itemsize // 2**30, "whole GiB"),
    ],
    ids=["// 2**20", "int(/ 2**20)", "round MiB", "MiB 2 decimals", "// 2**30"],
)
def test_weights_bytes_names_rounded_and_floored_units(fn, hint: str) -> None:  # type: ignore[no-untyped-def]
    fb = check_weights_bytes(fn)
    assert fb.status == "wrong" and hint in fb.message and "exact number of bytes" in fb.message, fb.message


def _loop_with(x: Tensor, module: MultiHeadSelfAttention, *, d_k: int | None = None, heads: int | None = None,
               end: int = 0, root=math.sqrt) -> Tensor:  # type: ignore[no-untyped-def]
    """The per-head loop with D_k or H hard-coded, the slice end moved by ``end`` rows, or another square root."""
    d_k = module.d_k if d_k is None else d_k
    outs = []
    for h in range(module.num_heads if heads is None else heads):
        rows = slice(h * d_k, (h + 1) * d_k + end)
        q, k, v = (x @ lin.weight[rows].T + lin.bias[rows] for lin in (module.w_q, module.w_k, module.w_v))
        outs.append(torch.softmax(q @ k.transpose(-2, -1) / root(d_k), dim=-1) @ v)
    return module.w_o(torch.cat(outs, dim=-1))


def test_per_head_loop_names_a_slice_one_row_short() -> None:
    fb = check_per_head_loop(lambda x, m: _loop_with(x, m, end=-1))
    assert not fb.passed and "must hold D_k rows" in fb.message and "exclusive" in fb.message


@pytest.mark.parametrize("kwargs", [dict(d_k=4), dict(d_k=4, heads=3), dict(heads=3)])
def test_per_head_loop_names_a_hard_coded_width_or_head_count(kwargs: dict) -> None:
    fb = check_per_head_loop(lambda x, m: _loop_with(x, m, **kwargs))
    assert not fb.passed and "hard-code D_k or H" in fb.message and "module.d_k" in fb.message


def test_per_head_loop_names_a_rounded_square_root() -> None:
    fb = check_per_head_loop(lambda x, m: _loop_with(x, m, root=lambda d: int(math.sqrt(d))))
    assert not fb.passed and "int(math.sqrt(D_k))" in fb.message


@pytest.mark.parametrize("make", [
    lambda B, H, S, dt: torch.empty(B, H, S, S, dtype=dt),
    lambda B, H, S, dt: torch.zeros((B, H, S, S), dtype=dt),
    lambda B, H, S, dt: torch.ones(B * H * S * S, dtype=dt),
    lambda B, H, S, dt: torch.randn(B, H, S, S).to(dt),
    lambda B, H, S, dt: torch.empty(1, dtype=dt).new_empty((B, H, S, S)),
])
def test_weights_bytes_refuses_allocating_the_weights(make) -> None:  # type: ignore[no-untyped-def]
    fb = check_weights_bytes(lambda B, H, S, dt: make(B, H, S, dt).nbytes)
    assert not fb.passed and "without allocating it" in fb.message


def test_weights_bytes_accepts_a_meta_tensor_and_names_mb_and_a_missing_dtype() -> None:
    assert check_weights_bytes(lambda B, H, S, dt: torch.empty(B, H, S, S, dtype=dt, device="meta").nbytes).passed
    fb = check_weights_bytes(lambda B, H, S, dt: B * H * S * S * dt.itemsize / 1e6)
    assert not fb.passed and "MB" in fb.message and "1e6" in fb.message
    sizes = {torch.float32: 4, torch.float16: 2, torch.float64: 8}
    fb = check_weights_bytes(lambda B, H, S, dt: B * H * S * S * sizes[dt])
    assert not fb.passed and "KeyError for torch.bfloat16" in fb.message and "element_size" in fb.message


def _slip_loop(x: torch.Tensor, m: MultiHeadSelfAttention, *, weight_t: bool = True, k_t: str = "transpose",
               implicit_softmax: bool = False) -> torch.Tensor:
    """A reader's loop with one of three common slips: the weight rows not transposed, ``k.T`` on 3-D keys,
    ``F.softmax`` without ``dim``."""
    d_k, heads = m.d_k, []
    for h in range(m.num_heads):
        r = slice(h * d_k, (h + 1) * d_k)
        q, k, v = ((x @ lin.weight[r].T if weight_t else x @ lin.weight[r]) + lin.bias[r] for lin in (m.w_q, m.w_k, m.w_v))
        s = (q @ (k.T if k_t == "T" else k.transpose(-2, -1))) / math.sqrt(d_k)  # [B, S, S]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # F.softmax's warning about the implicit dim
            w = torch.nn.functional.softmax(s) if implicit_softmax else torch.softmax(s, dim=-1)
        heads.append(w @ v)  # [B, S, D_k]
    return m.w_o(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("kwargs, hint", [
    (dict(weight_t=False), "[out, in]"),
    (dict(k_t="T"), "transpose(-2, -1)"),
    (dict(implicit_softmax=True), "without dim picks dim 0"),
])
def test_per_head_loop_names_weight_layout_3d_transpose_and_softmax_without_dim(kwargs: dict, hint: str) -> None:
    fb = check_per_head_loop(lambda x, m: _slip_loop(x, m, **kwargs))
    assert fb.status == "wrong" and hint in fb.message and "raised" not in fb.message, fb.message
    assert "weight[rows].T" not in fb.message and "dim=-1)" not in fb.message  # the hint never hands over the line
    assert check_per_head_loop(_slip_loop).passed


@pytest.mark.parametrize("as_float", [float, lambda n: torch.tensor(float(n)), lambda n: __import__("numpy").float64(n)])
def test_weights_bytes_refuses_a_right_count_as_a_float(as_float) -> None:  # type: ignore[no-untyped-def]
    fb = check_weights_bytes(lambda B, H, S, dt: as_float(B * H * S * S * torch.empty((), dtype=dt).element_size()))
    assert fb.status == "wrong" and "an int" in fb.message, fb.message
    assert check_weights_bytes(lambda B, H, S, dt: torch.tensor(B * H * S * S * dt.itemsize)).passed  # an integer tensor


def test_heads_cost_diagram_says_what_the_code_computes() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    S, D = ch05.HEADS_COST_SIZES
    alt = ch05.heads_cost_diagram().alt
    for H in ch05.HEADS_COST_COUNTS:
        macs, sheets = ch05.score_cost(H)
        q = k = torch.zeros(1, H, S, D // H)  # [B, H, S, D_k]
        with FlopCounterMode(display=False) as counter:
            scores = q @ k.transpose(-2, -1)  # [B, H, S, S]
        assert counter.get_total_flops() == 2 * macs  # a multiply-add counts as 2 FLOPs
        with torch.device("meta"):
            block = MultiHeadSelfAttention(D, H)
        weights = block(torch.empty(1, S, D, device="meta")).attention_weights
        assert tuple(scores.shape) == tuple(weights.shape) == (1, sheets, S, S)
        assert f"{macs:,} multiply-adds" in alt and f"H = {H} head" in alt
    assert ch05.score_cost(1)[0] == ch05.score_cost(4)[0]


# --- slips of the per-head loop that PyTorch answers with a raw error, and a loop that changes the module ---

def _bias_loop(x: Tensor, m: MultiHeadSelfAttention, *, form: str) -> Tensor:
    d_k, outs = m.d_k, []
    for h in range(m.num_heads):
        rows = slice(h * d_k, (h + 1) * d_k)
        if form == "matmul":  # the weight's rows, the whole bias
            q, k, v = (x @ lin.weight[rows].T + lin.bias for lin in (m.w_q, m.w_k, m.w_v))
        elif form == "bias first":
            q, k, v = (lin.bias + x @ lin.weight[rows].T for lin in (m.w_q, m.w_k, m.w_v))
        else:  # F.linear with the weight's rows and the whole bias
            q, k, v = (torch.nn.functional.linear(x, lin.weight[rows], lin.bias) for lin in (m.w_q, m.w_k, m.w_v))
        outs.append(torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1) @ v)  # [B, S, D_k]
    return m.w_o(torch.cat(outs, dim=-1))


@pytest.mark.parametrize("form", ["matmul", "bias first", "F.linear"])
def test_per_head_loop_names_the_whole_bias_added_to_a_head(form: str) -> None:
    fb = check_per_head_loop(lambda x, m: _bias_loop(x, m, form=form))
    assert fb.status == "wrong" and "you added the whole bias (D numbers)" in fb.message, fb.message
    assert "take the same slice of the bias as of the weight" in fb.message and "raised" not in fb.message


@pytest.mark.parametrize(
    "piece",
    [lambda m, rows: m.w_o.weight[rows].T, lambda m, rows: m.w_o.weight[:, rows]],
    ids=["rows of W_O, transposed", "columns of W_O without .T"],
)
def test_per_head_loop_names_a_d_by_d_k_piece_of_w_o(piece) -> None:  # type: ignore[no-untyped-def]
    def loop_(x: Tensor, m: MultiHeadSelfAttention) -> Tensor:
        d_k = m.d_k
        return sum(o @ piece(m, slice(h * d_k, (h + 1) * d_k)) for h, o in enumerate(_heads(x, m))) + m.w_o.bias

    fb = check_per_head_loop(loop_)
    assert fb.status == "wrong" and "[D, D_k] piece of W_O" in fb.message and "raised" not in fb.message, fb.message
    right = lambda x, m: sum(  # noqa: E731 - the sum over heads through W_O's columns is right
        o @ m.w_o.weight[:, h * m.d_k:(h + 1) * m.d_k].T for h, o in enumerate(_heads(x, m))) + m.w_o.bias
    assert check_per_head_loop(right).passed


def test_per_head_loop_refuses_a_loop_that_changes_the_module() -> None:
    def folds_the_scale(x: Tensor, m: MultiHeadSelfAttention) -> Tensor:
        with torch.no_grad():  # the scale folded into W_Q in place: right numbers, a corrupted module
            m.w_q.weight /= math.sqrt(m.d_k)
            m.w_q.bias /= math.sqrt(m.d_k)
        d_k, outs = m.d_k, []
        for h in range(m.num_heads):
            rows = slice(h * d_k, (h + 1) * d_k)
            q, k, v = (x @ lin.weight[rows].T + lin.bias[rows] for lin in (m.w_q, m.w_k, m.w_v))
            outs.append(torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v)
        return m.w_o(torch.cat(outs, dim=-1))

    def replaces_w_q(x: Tensor, m: MultiHeadSelfAttention) -> Tensor:
        out = ch05._solution_loop(x, m)
        m.w_q = torch.nn.Linear(m.d_model, m.d_model).to(x.dtype)
        return out

    for fn, name in ((folds_the_scale, "module.w_q.bias, module.w_q.weight"), (replaces_w_q, "module.w_q")):
        fb = check_per_head_loop(fn)
        assert fb.status == "wrong" and "changed the module itself" in fb.message and name in fb.message, fb.message
    # a loop that only reads the module, also one that widens its dtype, is not refused for it
    assert check_per_head_loop(ch05._solution_loop).passed
    assert check_per_head_loop(lambda x, m: ch05._solution_loop(x.double(), m.double())).passed


@pytest.mark.parametrize("answer", ["9443328", "9,443,328"])
def test_param_count_says_set_a_number_not_a_string(answer: str) -> None:
    fb = check_param_count(answer)
    assert fb.status == "wrong" and fb.message.startswith("set `answer` to a number (an int), not a string"), fb.message
    fb = check_param_count([9443328])
    assert fb.status == "wrong" and fb.message.startswith("set `answer` to a number of parameters"), fb.message


def test_param_count_times_h_hint_speaks_of_output_features() -> None:
    fb = check_param_count(12 * (4 * 1536**2 + 4 * 1536))
    assert fb.status == "wrong" and "D_k of their output features" in fb.message, fb.message


def test_param_count_exercise_is_not_a_row_of_the_chapter_table() -> None:
    """Exercise 5.1's block is not one the chapter prints, so its count cannot be copied from the table."""
    D, H = PARAM_EXERCISE
    table = {(512, 8), (768, 12), (1024, 16), (4096, 32)}
    assert (D, H) not in table and D % H == 0
    assert check_param_count(4 * D**2 + 4 * D).passed
    # BERT-large's printed count is the answer to another block
    fb = check_param_count(4 * 1024**2 + 4 * 1024)
    assert fb.status == "wrong", fb.message


def test_loop_names_a_slice_one_row_too_long() -> None:
    def one_long(x: Tensor, m: MultiHeadSelfAttention) -> Tensor:
        d_k, heads = m.d_k, []
        for h in range(m.num_heads):
            rows = slice(h * d_k, (h + 1) * d_k + 1)  # one row too many (the last head is cut back to D_k)
            q, k, v = (x @ lin.weight[rows].T + lin.bias[rows] for lin in (m.w_q, m.w_k, m.w_v))
            heads.append(torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1) @ v)
        return m.w_o(torch.cat(heads, dim=-1))

    fb = check_per_head_loop(one_long)
    assert fb.status == "wrong" and "has 5 features, not D_k = 4" in fb.message and "+ 1" in fb.message, fb.message
    assert "cannot be multiplied" not in fb.message, fb.message


def test_weights_bytes_takes_integers_in_any_form_and_refuses_floats_in_any_form() -> None:
    """The exercise asks for an integer: a Python, NumPy or 0-d tensor integer passes, a float of any kind does not."""
    import numpy as np

    assert check_weights_bytes(lambda B, H, S, dt: torch.tensor(right_bytes(B, H, S, dt))).passed
    assert check_weights_bytes(lambda B, H, S, dt: np.int64(right_bytes(B, H, S, dt))).passed
    for as_float in (float, np.float64, lambda n: torch.tensor(n, dtype=torch.float64)):
        fb = check_weights_bytes(lambda B, H, S, dt, f=as_float: f(right_bytes(B, H, S, dt)))
        assert fb.status == "wrong" and "come back as floats" in fb.message, fb.message
