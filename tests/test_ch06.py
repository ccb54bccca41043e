"""Chapter 6 checkers: right answers pass, stubs say "your turn", typical mistakes get their hint."""

from __future__ import annotations

import einops
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from attnbook.ch06 import (
    REPEAT_KV_CASES,
    REPEAT_KV_MISTAKES,
    SPLIT_ZOO,
    STRIDE_MISTAKES,
    check_merge_heads,
    check_repeat_kv,
    check_split_heads,
    check_split_merge,
    check_split_test,
    check_transposed_strides,
    decode_tag,
    packed_split_is_right,
    split_blocks,
    split_groups,
    tagged_tokens,
)
from attnlib import (
    MultiHeadSelfAttention,
    merge_heads,
    repeat_kv,
    scaled_dot_product_attention,
    split_heads,
)
from attnlib.cost import mha_param_count


#: The group size of the repeat-kv checker's first case (the section's G = 4, which a reader may copy).
_G_FIRST = REPEAT_KV_CASES[0][4] // REPEAT_KV_CASES[0][1]


def stub(*args: object) -> Tensor:
    raise NotImplementedError


# --- exercise 1: split and merge -------------------------------------------------------------


def test_split_merge_right_and_stub() -> None:
    assert check_split_merge(split_heads, merge_heads).status == "correct"
    assert check_split_merge(stub, stub).status == "todo"
    assert check_split_merge(split_heads, stub).status == "todo"


@pytest.mark.parametrize(
    "split, merge, hint",
    [
        (lambda x, H: x.view(x.shape[0], H, x.shape[1], -1), merge_heads, "head 0 row 1 holds features of position 0"),
        (lambda x, H: x.view(x.shape[0], x.shape[1], H, -1), merge_heads, "add .transpose(1, 2)"),
        (lambda x, H: x.view(2, 3, 2, 2).transpose(1, 2), merge_heads, "RuntimeError"),  # hard-coded shape
        (split_heads, lambda x: x.reshape(x.shape[0], x.shape[2], -1), "merged without transposing back"),
        (split_heads, lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1), "use reshape"),
        (split_heads, lambda x: x.transpose(1, 2), "merge the last two axes"),
        (split_heads, lambda x: x.tolist(), "should return a torch.Tensor"),
    ],
)
def test_split_merge_hints(split: object, merge: object, hint: str) -> None:
    fb = check_split_merge(split, merge)  # type: ignore[arg-type]
    assert fb.status == "wrong" and hint in fb.message, fb.message


# --- exercise 2: strides of a transposed tensor ----------------------------------------------


def test_strides_right_and_stub() -> None:
    assert check_transposed_strides((60, 3, 12, 1)).status == "correct"
    assert check_transposed_strides([60, 3, 12, 1]).status == "correct"
    assert check_transposed_strides(None).status == "todo"


@pytest.mark.parametrize("mistake", STRIDE_MISTAKES, ids=lambda m: m.name)
def test_strides_gives_each_table_hint(mistake) -> None:  # type: ignore[no-untyped-def]
    fb = check_transposed_strides(mistake.compute((2, 5, 4, 3), (1, 2)))
    assert fb.status == "wrong" and fb.message == mistake.hint, fb.message


def test_stride_mistakes_are_the_expected_tuples() -> None:
    assert [m.compute((2, 5, 4, 3), (1, 2)) for m in STRIDE_MISTAKES] == [(60, 12, 3, 1), (60, 15, 3, 1), (240, 12, 48, 4), (2, 4, 5, 3), (2, 5, 4, 3)]


@pytest.mark.parametrize(
    "answer, hint",
    [
        ((3, 60, 12, 1), "wrong order"),
        ((60, 3, 12), "has 4 strides"),
        ("60, 3, 12, 1", "tuple of ints"),
        ((1, 1, 1, 1), "how many elements you skip"),
    ],
)
def test_strides_hints(answer: object, hint: str) -> None:
    fb = check_transposed_strides(answer)
    assert fb.status == "wrong" and hint in fb.message, fb.message


# --- exercise 3: write the test --------------------------------------------------------------


def good_test(split_fn: object) -> bool:
    B, S, H, d_k = 2, 3, 2, 4
    x = torch.randn(B, S, H * d_k)
    y = split_fn(x, H)  # type: ignore[operator]
    return tuple(y.shape) == (B, H, S, d_k) and all(
        torch.equal(y[:, h], x[..., h * d_k:(h + 1) * d_k]) for h in range(H)
    )


def test_split_test_right_and_stub() -> None:
    assert check_split_test(good_test).status == "correct"
    assert check_split_test(stub).status == "todo"
    assert "did you forget `return`" in check_split_test(lambda fn: None).message


def test_a_crash_on_a_buggy_split_counts_as_rejecting_it() -> None:
    def strict(split_fn: object) -> bool:
        assert good_test(split_fn)
        return True

    assert check_split_test(strict).status == "correct"


def only_batch_of_one(split_fn: object) -> bool:
    x = torch.randn(1, 3, 8)
    y = split_fn(x, 2)  # type: ignore[operator]
    return tuple(y.shape) == (1, 2, 3, 4) and all(torch.equal(y[:, h], x[..., h * 4:(h + 1) * 4]) for h in range(2))


def two_spots_no_shape(split_fn: object) -> bool:
    x = torch.randn(2, 3, 8)
    y = split_fn(x, 2)  # type: ignore[operator]
    return torch.equal(y[:, 0, 0], x[:, 0, :4]) and torch.equal(y[:, 1, 1], x[:, 1, 4:])


@pytest.mark.parametrize(
    "test_fn, hint",
    [
        (lambda fn: tuple(fn(torch.randn(2, 3, 8), 2).shape) == (2, 2, 3, 4), "reshape-without-transpose bug"),
        (lambda fn: not fn(torch.randn(2, 3, 8), 2).is_contiguous(), "returns a contiguous copy"),
        (only_batch_of_one, "mixes the sequences"),
        (two_spots_no_shape, "check the shape too"),
        (lambda fn: 1 / 0, "raised ZeroDivisionError on the correct split"),
        (lambda fn: "yes", "should return True or False"),
    ],
)
def test_split_test_hints(test_fn: object, hint: str) -> None:
    fb = check_split_test(test_fn)  # type: ignore[arg-type]
    assert fb.status == "wrong" and hint in fb.message, fb.message


def test_split_zoo_has_right_and_wrong_members() -> None:
    flags = [ok for _, ok, _ in SPLIT_ZOO.values()]
    assert flags.count(True) == 3 and flags.count(False) == 11  # as the exercise text says: three correct, eleven buggy


# --- exercise 4: expanding key/value heads ---------------------------------------------------


def test_repeat_kv_right_and_stub() -> None:
    assert check_repeat_kv(repeat_kv).status == "correct"
    assert check_repeat_kv(stub).status == "todo"


def test_repeat_kv_accepts_right_numbers_from_copying_calls_with_a_note() -> None:
    """Review item ch6 #16: the rule is applied consistently; right numbers pass, with a note on the copy."""
    for fn in (lambda kv, H: kv.repeat_interleave(H // kv.shape[1], dim=1),
               lambda kv, H: torch.repeat_interleave(kv, H // kv.shape[1], dim=1),
               lambda kv, H: kv.index_select(1, torch.arange(H) // (H // kv.shape[1]))):
        fb = check_repeat_kv(fn)
        assert fb.passed and "asks for expand" in fb.message, fb.message
    assert torch.Tensor.repeat_interleave.__name__ == "repeat_interleave"  # the spy is removed again


def _expand_at(axis: int):  # type: ignore[no-untyped-def]
    def fn(kv: Tensor, H: int) -> Tensor:
        B, H_kv, S, d_k = kv.shape
        shape = [B, H_kv, S, d_k]
        shape.insert(axis, H // H_kv)
        return kv.unsqueeze(axis).expand(*shape).reshape(B, H, S, d_k)
    return fn


def _merged_in_the_wrong_order(kv: Tensor, H: int) -> Tensor:
    B, H_kv, S, d_k = kv.shape
    x = kv[:, :, None].expand(B, H_kv, H // H_kv, S, d_k)  # [B, H_kv, G, S, D_k]: the right axis
    return x.transpose(1, 2).reshape(B, H, S, d_k)  # merges (G, H_kv): tiled


def _expanded_last_then_tiled(kv: Tensor, H: int) -> Tensor:
    B, H_kv, S, d_k = kv.shape
    x = kv[..., None].expand(B, H_kv, S, d_k, H // H_kv)  # [B, H_kv, S, D_k, G]
    return x.permute(0, 4, 1, 2, 3).reshape(B, H, S, d_k)  # merges (G, H_kv): tiled


def _transposed_then_reshaped_back(kv: Tensor, H: int) -> Tensor:
    B, H_kv, S, d_k = kv.shape
    x = kv.transpose(1, 2)[:, :, :, None].expand(B, S, H_kv, H // H_kv, d_k)  # [B, S, H_kv, G, D_k]
    return x.reshape(B, S, H, d_k).reshape(B, H, S, d_k)  # reshape where a transpose belongs


def test_repeat_kv_hints_name_the_step_that_went_wrong() -> None:
    """A right expand merged in the wrong order, an expand elsewhere, a reshape instead of a transpose and a
    hard-coded group size each get a hint about what that code did, not about a mistake it did not make."""
    for fn in (_merged_in_the_wrong_order, _expanded_last_then_tiled):
        fb = check_repeat_kv(fn)
        assert fb.status == "wrong" and "kv[:, None]" not in fb.message and "tiled with .repeat" not in fb.message, fb
        assert "torch.cat" not in fb.message, fb
    assert "you expanded the right axis" in check_repeat_kv(_merged_in_the_wrong_order).message
    assert "you expanded the right axis" not in check_repeat_kv(_expanded_last_then_tiled).message
    fb = check_repeat_kv(_transposed_then_reshaped_back)
    assert fb.status == "wrong" and "transpose(1, 2)" in fb.message and "not copies" not in fb.message, fb

    def hard_coded_group(kv: Tensor, H: int) -> Tensor:
        B, H_kv, S, d_k = kv.shape
        return kv[:, :, None].expand(B, H_kv, 3, S, d_k).reshape(B, H, S, d_k)  # G = 3 fits the first case only

    fb = check_repeat_kv(hard_coded_group)
    assert fb.status == "wrong" and "size 1" not in fb.message and "not numbers written in" in fb.message, fb


@pytest.mark.parametrize("mistake", REPEAT_KV_MISTAKES, ids=lambda m: m.name)
def test_repeat_kv_gives_each_table_hint(mistake) -> None:  # type: ignore[no-untyped-def]
    reader = {  # an answer a reader would write for each mistake
        "tiled with .repeat": lambda kv, H: kv.repeat(1, H // kv.shape[1], 1, 1),
        "group axis before the heads": _expand_at(1),
        "merged in the wrong order": _merged_in_the_wrong_order,
        "expanded elsewhere, tiled": _expanded_last_then_tiled,
        "transposed, then reshaped back": _transposed_then_reshaped_back,
        "tiled": lambda kv, H: torch.cat([kv] * (H // kv.shape[1]), 1),
        "group axis after the positions": _expand_at(3),
        "H copies of each": lambda kv, H: kv.repeat_interleave(H, dim=1)[:, :H],
        "copies on the last axis": lambda kv, H: kv[..., None].expand(*kv.shape, H // kv.shape[1]).reshape(
            kv.shape[0], H, *kv.shape[2:]),
    }[mistake.name]
    fb = check_repeat_kv(reader)
    assert fb.status == "wrong" and fb.message == mistake.hint, fb.message


@pytest.mark.parametrize(
    "fn, hint",
    [
        (lambda kv, H: kv.repeat_interleave(H, dim=1), "not H times"),
        (lambda kv, H: kv, "expected [B, H, S, D_k]"),
        # flipped: query head 0 reads the last key/value head of the first case
        (lambda kv, H: kv.repeat_interleave(H // kv.shape[1], dim=1).flip(1),
         f"query head 0 got key/value head {REPEAT_KV_CASES[0][1] - 1}, expected 0"),
        (lambda kv, H: torch.zeros(kv.shape[0], H, *kv.shape[2:], dtype=kv.dtype), "not copies"),
    ],
)
def test_repeat_kv_hints(fn: object, hint: str) -> None:
    fb = check_repeat_kv(fn)  # type: ignore[arg-type]
    assert fb.status == "wrong" and hint in fb.message, fb.message


def test_repeat_kv_names_the_missing_merge_after_expand() -> None:
    def no_merge(kv: Tensor, H: int) -> Tensor:
        B, H_kv, S, d_k = kv.shape
        return kv[:, :, None].expand(B, H_kv, H // H_kv, S, d_k)  # [B, H_kv, G, S, D_k]

    fb = check_repeat_kv(no_merge)
    assert fb.status == "wrong", fb.message
    assert "merge the key/value-head and group axes into one head axis" in fb.message, fb.message
    assert ".reshape(B, H, S, D_k)" in fb.message, fb.message


def test_transposed_strides_names_a_float_among_ints() -> None:
    fb = check_transposed_strides((60.0, 3, 12, 1))
    assert fb.status == "wrong", fb.message
    assert "containing a float (60.0)" in fb.message and "write the strides as ints" in fb.message, fb.message
    assert "4 items" not in fb.message


# === the reshape bug, views and copies, einops, GQA shapes ===================================
# Chapter 6: the reshape-bug check, views vs copies, einops as a second oracle, GQA/MQA shapes.
# The basic split/merge round trip and GQA against an explicit per-head loop live in
# ``test_masks_heads_device.py`` and ``test_multihead.py``; this file adds what they do not cover.

def view_without_transpose(x: Tensor, H: int) -> Tensor:
    """The classic bug: ``[B, S, D]`` straight to ``[B, H, S, D_k]``; no error, wrong grouping."""
    B, S, D = x.shape
    return x.view(B, H, S, D // H)


# --- the reusable check ----------------------------------------------------------------------


def test_check_split_heads_catches_the_reshape_bug() -> None:
    fb = check_split_heads(view_without_transpose)
    assert fb.status == "wrong"
    assert "head 0 row 1 holds features of position 0" in fb.message
    assert "you reshaped without transposing" in fb.message


def test_check_split_heads_passes_the_library() -> None:
    assert check_split_heads(split_heads).status == "correct"


@pytest.mark.parametrize("name", list(SPLIT_ZOO))
def test_check_split_heads_judges_every_zoo_member(name: str) -> None:
    fn, is_right, _ = SPLIT_ZOO[name]
    assert check_split_heads(fn).passed == is_right


def test_check_split_heads_explains_other_mistakes() -> None:
    assert "every H-th feature" in check_split_heads(SPLIT_ZOO["features interleaved"][0]).message
    assert "mixes the sequences of a batch" in check_split_heads(SPLIT_ZOO["mixes the batch"][0]).message
    assert "add .transpose(1, 2)" in check_split_heads(SPLIT_ZOO["wrong shape"][0]).message


def test_check_merge_heads_catches_merge_without_transpose() -> None:
    assert check_merge_heads(merge_heads).status == "correct"
    fb = check_merge_heads(lambda x: x.reshape(x.shape[0], x.shape[2], -1))  # runs, wrong order
    assert fb.status == "wrong" and "merged without transposing back" in fb.message
    fb = check_merge_heads(lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1))  # raises
    assert fb.status == "wrong" and "use reshape" in fb.message


def test_tags_decode() -> None:
    x = tagged_tokens(2, 3, 4)
    assert decode_tag(x[1, 2, 3].item(), 3, 4) == (1, 2, 3)
    assert decode_tag(x[0, 1, 0].item(), 3, 4) == (0, 1, 0)


# --- what the bug does to attention ----------------------------------------------------------


def _attention_with(split: object, merge: object, x: Tensor, H: int) -> Tensor:
    q, k, v = (split(t, H) for t in (x, x.flip(1), x * 0.5))  # type: ignore[operator]
    return merge(scaled_dot_product_attention(q, k, v).output)  # type: ignore[operator]


def test_the_bug_changes_attention_outputs_only_when_it_can() -> None:
    torch.manual_seed(0)

    def merge_without_transpose(x: Tensor) -> Tensor:
        B, H, S, d_k = x.shape
        return x.reshape(B, S, H * d_k)

    x = torch.randn(2, 5, 8, dtype=torch.float64)  # [B, S, D]
    right = _attention_with(split_heads, merge_heads, x, 4)
    wrong = _attention_with(view_without_transpose, merge_without_transpose, x, 4)
    assert (right - wrong).abs().max() > 0.1  # consistent split and merge do not cancel the bug
    # With one position or one head the bug is invisible: a test must use S > 1 and H > 1.
    for S, H in ((1, 4), (5, 1)):
        x = torch.randn(2, S, 8, dtype=torch.float64)
        assert torch.equal(view_without_transpose(x, H), split_heads(x, H))


# --- views and copies ------------------------------------------------------------------------


def test_split_heads_is_a_view_and_merge_heads_copies() -> None:
    x = torch.randn(2, 3, 8)
    heads = split_heads(x, 2)  # [B, H, S, D_k]
    assert heads.data_ptr() == x.data_ptr() and not heads.is_contiguous()
    assert heads.stride() == (24, 4, 8, 1)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        heads.view(2, 2, 12)
    out = torch.randn(2, 2, 3, 4)  # contiguous, like an attention output
    merged = merge_heads(out)
    assert merged.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()  # reshape had to copy
    assert merged.is_contiguous()


def test_expand_is_zero_copy_until_reshape() -> None:
    kv = torch.randn(2, 2, 5, 4)  # [B, H_kv, S, D_k]
    expanded = kv[:, :, None].expand(2, 2, 3, 5, 4)  # [B, H_kv, G, S, D_k]
    assert expanded.untyped_storage().nbytes() == kv.untyped_storage().nbytes() == kv.nbytes
    assert expanded.stride()[2] == 0 and expanded.data_ptr() == kv.data_ptr()
    full = repeat_kv(kv, 6)  # [B, H, S, D_k]
    assert full.untyped_storage().nbytes() == 3 * kv.nbytes
    assert torch.equal(full, kv.repeat_interleave(3, dim=1))


def test_repeat_kv_rejects_a_3d_tensor() -> None:
    with pytest.raises(ValueError, match=r"\[B, H_kv, S, D_k\].*\(2, 5, 4\)"):
        repeat_kv(torch.randn(2, 5, 4), 4)


# --- einops as a second oracle ---------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 5), st.integers(1, 4), st.integers(1, 4))
def test_split_merge_repeat_match_einops(B: int, S: int, H_kv: int, group: int, d_k: int) -> None:
    H = H_kv * group
    x = torch.randn(B, S, H * d_k)
    heads = split_heads(x, H)
    assert torch.equal(heads, einops.rearrange(x, "b s (h d) -> b h s d", h=H))
    assert torch.equal(merge_heads(heads), einops.rearrange(heads, "b h s d -> b s (h d)"))
    kv = torch.randn(B, H_kv, S, d_k)
    assert torch.equal(repeat_kv(kv, H), einops.repeat(kv, "b g s d -> b (g r) s d", r=group))


# --- grouped-query and multi-query attention -------------------------------------------------


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4, 8])
def test_num_kv_heads_sets_the_key_value_projection_sizes(num_kv_heads: int) -> None:
    D, H = 64, 8
    d_k = D // H
    layer = MultiHeadSelfAttention(D, H, num_kv_heads=num_kv_heads)
    for lin in (layer.w_k, layer.w_v):
        assert lin.weight.shape == (num_kv_heads * d_k, D)
        assert lin.bias.shape == (num_kv_heads * d_k,)
    for lin in (layer.w_q, layer.w_o):
        assert lin.weight.shape == (D, D)
    counted = sum(p.numel() for p in layer.parameters())
    assert counted == 2 * (D * D + D) + 2 * (D * num_kv_heads * d_k + num_kv_heads * d_k)
    assert counted == mha_param_count(D, H, num_kv_heads=num_kv_heads)
    out = layer(torch.randn(3, 5, D))
    assert out.hidden_states.shape == (3, 5, D)
    assert out.attention_weights.shape == (3, H, 5, 5)  # one map per *query* head


def test_fewer_kv_heads_means_fewer_parameters() -> None:
    counts = [sum(p.numel() for p in MultiHeadSelfAttention(64, 8, num_kv_heads=g).parameters()) for g in (8, 4, 2, 1)]
    assert counts == sorted(counts, reverse=True) and len(set(counts)) == 4


@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_gqa_equals_mha_with_key_value_heads_copied(num_kv_heads: int) -> None:
    """GQA is MHA whose key/value heads are tied in groups: copy each K/V head's rows to its group."""
    torch.manual_seed(3)
    D, H = 32, 8
    d_k, group = D // H, H // num_kv_heads
    gqa = MultiHeadSelfAttention(D, H, num_kv_heads=num_kv_heads).double()
    mha = MultiHeadSelfAttention(D, H).double()
    with torch.no_grad():
        mha.w_q.load_state_dict(gqa.w_q.state_dict())
        mha.w_o.load_state_dict(gqa.w_o.state_dict())
        for small, big in ((gqa.w_k, mha.w_k), (gqa.w_v, mha.w_v)):
            big.weight.copy_(small.weight.view(num_kv_heads, d_k, D).repeat_interleave(group, 0).reshape(D, D))
            big.bias.copy_(small.bias.view(num_kv_heads, d_k).repeat_interleave(group, 0).reshape(D))
    x = torch.randn(2, 6, D, dtype=torch.float64)
    a, b = gqa(x, causal=True), mha(x, causal=True)
    torch.testing.assert_close(a.hidden_states, b.hidden_states)
    torch.testing.assert_close(a.attention_weights, b.attention_weights)


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_repeat_kv_matches_torch_enable_gqa(num_kv_heads: int) -> None:
    if "enable_gqa" not in (F.scaled_dot_product_attention.__doc__ or ""):
        pytest.skip("this torch's scaled_dot_product_attention has no enable_gqa")
    torch.manual_seed(4)
    B, H, S, d_k = 2, 8, 7, 5
    q = torch.randn(B, H, S, d_k, dtype=torch.float64)
    k = torch.randn(B, num_kv_heads, S, d_k, dtype=torch.float64)
    v = torch.randn(B, num_kv_heads, S, d_k, dtype=torch.float64)
    fused = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ours = scaled_dot_product_attention(q, repeat_kv(k, H), repeat_kv(v, H),
                                        torch.ones(S, S, dtype=torch.bool).tril()).output
    torch.testing.assert_close(ours, fused)


# --- the memory-layout figure ------------------------------------------------------------------


def test_memory_layout_figure_shows_the_real_strides() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnbook.ch06 import memory_layout

    fig = memory_layout(3, 2, 2, tokens=["the", "cat", "sat"])
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert len(titles) == 4
    assert "strides (4, 2, 1): contiguous" in titles[1]
    assert "strides (2, 4, 1): not contiguous" in titles[2]
    assert "strides (6, 2, 1)" in titles[3]
    # the transposed row reads offsets 0 1 4 5 8 9 for head 0
    texts = [t.get_text() for t in fig.axes[2].texts if t.get_text().isdigit()]
    assert texts[:6] == ["0", "1", "4", "5", "8", "9"]
    plt.close(fig)
    with pytest.raises(ValueError, match="2 tokens for seq_len = 3"):
        memory_layout(3, 2, 2, tokens=["a", "b"])
    with pytest.raises(ValueError, match="at most 8 positions"):
        memory_layout(9, 2, 2)


# --- packed q/k/v projections -----------------------------------------------------------------


def test_packed_splits_are_right_for_their_own_layout_only() -> None:
    assert packed_split_is_right(split_blocks, "blocks") and packed_split_is_right(split_groups, "groups")
    assert not packed_split_is_right(split_blocks, "groups")  # Falcon's groups read as GPT-2 blocks: wrong, silently
    assert not packed_split_is_right(split_groups, "blocks")
    # with one key/value head (multi-query, Falcon-7B) the two layouts coincide, so the test must use H_kv > 1
    assert packed_split_is_right(split_blocks, "groups", num_kv_heads=1)


def test_split_groups_matches_transformers_falcon() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.falcon.modeling_falcon import FalconAttention

    cfg = transformers.FalconConfig(hidden_size=24, num_attention_heads=6, num_kv_heads=2, new_decoder_architecture=True)
    attn = FalconAttention(cfg)
    fused = torch.randn(2, 5, (6 + 2 * 2) * 4)
    q, k, v = split_groups(fused, 6, 2)
    q_hf, k_hf, v_hf = attn._split_heads(fused)  # [B, S, H, D_k] each (k, v broadcast to H heads)
    torch.testing.assert_close(q, q_hf.transpose(1, 2), rtol=0, atol=0)
    torch.testing.assert_close(repeat_kv(k, 6), k_hf.transpose(1, 2), rtol=0, atol=0)
    torch.testing.assert_close(repeat_kv(v, 6), v_hf.transpose(1, 2), rtol=0, atol=0)


def test_repeat_kv_hints_name_only_calls_the_reader_made() -> None:
    """Review items ch6 #12, #13."""
    fb = check_repeat_kv(lambda kv, H: torch.cat([kv] * (H // kv.shape[1]), 1))
    assert fb.status == "wrong" and "tiled" in fb.message and "kv[:, None]" not in fb.message, fb

    def expand_view(kv, H):
        B, H_kv, S, d_k = kv.shape
        return kv[:, :, None].expand(B, H_kv, H // H_kv, S, d_k).view(B, H, S, d_k)

    fb = check_repeat_kv(expand_view)
    assert "stride 0" in fb.message and "transpose" not in fb.message, fb
    fb = check_repeat_kv(lambda kv, H: kv.expand(kv.shape[0], H, *kv.shape[2:]))
    assert fb.status == "wrong" and "size 1" in fb.message, fb


def test_split_checks_tell_a_transpose_of_the_wrong_axes_from_a_missing_one() -> None:
    """Review item ch6 #11: H != D_k in every config."""
    from attnbook.ch06 import CONFIGS

    assert all(H != d_k for _, _, H, d_k in CONFIGS)
    fb = check_split_merge(lambda x, H: x.view(x.shape[0], x.shape[1], H, -1).transpose(2, 3), merge_heads)
    assert fb.status == "wrong" and "add .transpose(1, 2)" not in fb.message, fb


def test_split_test_accepts_numpy_bools_and_catches_incomplete_tests() -> None:
    """Review items ch6 #14, #15."""
    def numpy_verdict(split_fn):
        x = torch.randn(2, 3, 8)
        y = split_fn(x, 2)
        ref = x.view(2, 3, 2, 4).transpose(1, 2)
        return y.shape == ref.shape and (y.numpy() == ref.numpy()).all()

    assert check_split_test(numpy_verdict).passed

    def head_zero_only(split_fn):
        x = torch.randn(2, 3, 8)
        y = split_fn(x, 2)
        return tuple(y.shape) == (2, 2, 3, 4) and torch.equal(y[:, 0], x[..., :4])

    def sums_only(split_fn):
        x = torch.randn(2, 3, 8)
        y = split_fn(x, 2)
        return tuple(y.shape) == (2, 2, 3, 4) and all(torch.allclose(y[:, h].sum(-1), x[..., h * 4:(h + 1) * 4].sum(-1)) for h in range(2))

    assert not check_split_test(head_zero_only).passed
    assert not check_split_test(sums_only).passed


def test_strides_accept_numpy_ints() -> None:
    import numpy as np

    assert check_transposed_strides(tuple(np.int64(v) for v in (60, 3, 12, 1))).passed
    assert not check_transposed_strides((60.0, 3.0, 12.0, 1.0)).passed


def test_transposed_strides_read_numpy_and_tensor_integers() -> None:
    import numpy as np

    from attnbook.ch06 import check_transposed_strides

    for answer in (tuple(np.array([60, 3, 12, 1])), np.array([60, 3, 12, 1]), torch.tensor([60, 3, 12, 1]),
                   (np.int32(60), 3, np.uint8(12), 1)):
        assert check_transposed_strides(answer).passed, answer
    for answer in (np.array([60.0, 3.0, 12.0, 1.0]), np.array([[60, 3, 12, 1]]), torch.tensor([True, False, True, False])):
        assert not check_transposed_strides(answer).passed, answer


def test_layout_diagrams_show_real_strides_and_the_bug() -> None:
    from attnbook.ch06 import LAYOUT_TOKENS, silent_bug_diagram, strides_diagram

    x = torch.arange(12).view(1, 3, 4)
    assert str(x.view(1, 3, 2, 2).transpose(1, 2).stride()) in strides_diagram().alt
    bug_alt = silent_bug_diagram().alt
    assert f"head 0's rows belong to {LAYOUT_TOKENS[0]}, {LAYOUT_TOKENS[0]}, {LAYOUT_TOKENS[1]}" in bug_alt


def test_repeat_kv_by_indexing_gets_the_copy_note() -> None:
    from attnbook.ch06 import check_repeat_kv

    def by_index(kv: Tensor, num_heads: int) -> Tensor:
        return kv[:, torch.arange(num_heads) // (num_heads // kv.shape[1])]  # advanced indexing: a copy

    fb = check_repeat_kv(by_index)
    assert fb.passed and "copied at once" in fb.message, fb.message


def test_split_with_the_last_two_axes_transposed_is_named() -> None:
    from attnbook.ch06 import check_split_merge

    def split_23(x: Tensor, num_heads: int) -> Tensor:
        B, S, D = x.shape
        return x.view(B, S, num_heads, D // num_heads).transpose(2, 3)

    fb = check_split_merge(split_23, merge_heads)
    assert not fb.passed and "transpose(2, 3)" in fb.message, fb.message


# ---------------------------------------------------------------- readers' answers, by hand


def _split_by_slices(split_fn, x: Tensor, H: int, d_k: int) -> bool:
    y = split_fn(x, num_heads=H)
    return tuple(y.shape) == (x.shape[0], H, x.shape[1], d_k) and all(
        torch.equal(y[:, h], x[:, :, h * d_k:(h + 1) * d_k]) for h in range(H))


def test_split_test_may_pass_num_heads_by_keyword() -> None:
    assert check_split_test(lambda f: _split_by_slices(f, torch.randn(2, 3, 8), 2, 4)).passed


def test_split_test_comparing_batch_means_is_caught() -> None:
    def by_means(split_fn) -> bool:
        x = torch.randn(2, 3, 8)
        y = split_fn(x, 2)
        return tuple(y.shape) == (2, 2, 3, 4) and all(
            torch.allclose(y[:, h].mean(0), x[:, :, 4 * h:4 * h + 4].mean(0)) for h in range(2))

    fb = check_split_test(by_means)
    assert fb.status == "wrong" and "sequences of the batch in reverse order" in fb.message, fb


def test_split_test_with_one_feature_per_head_is_named() -> None:
    fb = check_split_test(lambda f: _split_by_slices(f, torch.randn(2, 3, 2), 2, 1))
    assert fb.status == "wrong" and "D_k > 1" in fb.message, fb
    fb = check_split_test(lambda f: f(torch.randn(2, 3, 4), 2) is not None)  # accepts anything, with D_k = 2
    assert fb.status == "wrong" and "D_k > 1" not in fb.message, fb


def _true_division_split(x: Tensor, num_heads: int) -> Tensor:
    B, S, D = x.shape
    return x.view(B, S, num_heads, D / num_heads).transpose(1, 2)


def test_true_division_is_named() -> None:
    fb = check_split_merge(_true_division_split, merge_heads)
    assert fb.status == "wrong" and "integer division, //" in fb.message, fb

    def expand_by_true_division(kv: Tensor, H: int) -> Tensor:
        B, H_kv, S, d_k = kv.shape
        return kv[:, :, None].expand(B, H_kv, H / H_kv, S, d_k).reshape(B, H, S, d_k)

    fb = check_repeat_kv(expand_by_true_division)
    assert fb.status == "wrong" and "integer division, //" in fb.message, fb


def test_repeat_kv_hints_name_only_what_the_reader_did() -> None:
    along_positions = lambda kv, H: kv.repeat_interleave(H // kv.shape[1], 2).reshape(kv.shape[0], H, *kv.shape[2:])  # noqa: E731
    fb = check_repeat_kv(along_positions)
    assert fb.status == "wrong" and "along the positions axis" in fb.message and "you expanded" not in fb.message, fb
    size_1 = lambda kv, H: kv[:, :, None].expand(-1, -1, -1, -1, -1).reshape(kv.shape[0], H, *kv.shape[2:])  # noqa: E731
    fb = check_repeat_kv(size_1)
    assert fb.status == "wrong" and "expand it to G" in fb.message and "x.shape" not in fb.message, fb


@pytest.mark.parametrize("cast", ["half", "float"])
def test_a_reshape_that_changes_the_dtype_is_refused(cast: str) -> None:
    fb = check_split_merge(lambda x, H: getattr(split_heads(x, H), cast)(), merge_heads)
    assert fb.status == "wrong", fb
    fb = check_split_merge(split_heads, lambda x: getattr(merge_heads(x), cast)())
    assert fb.status == "wrong", fb
    fb = check_repeat_kv(lambda kv, H: getattr(repeat_kv(kv, H), cast)())
    assert fb.status == "wrong", fb


def test_strides_given_as_floats_or_as_the_shape_are_named() -> None:
    assert "tuple of floats" in check_transposed_strides((60.0, 3.0, 12.0, 1.0)).message
    for shape in ((2, 4, 5, 3), (2, 5, 4, 3)):
        assert "that is a shape" in check_transposed_strides(shape).message


def test_repeat_kv_with_one_kv_head_is_a_view() -> None:
    kv = torch.randn(1, 1, 16, 8)  # multi-query: the reshape merges a size-1 axis, no copy
    r = repeat_kv(kv, 4)
    assert r.stride()[:2] == (0, 0) and r.data_ptr() == kv.data_ptr()
    kv = torch.randn(1, 2, 16, 8)  # with H_kv > 1 the reshape copies
    assert repeat_kv(kv, 4).untyped_storage().data_ptr() != kv.untyped_storage().data_ptr()


def test_repeat_kv_every_head_reading_head_0_is_named() -> None:
    fb = check_repeat_kv(lambda kv, H: kv[:, :1].expand(kv.shape[0], H, *kv.shape[2:]))
    assert fb.status == "wrong" and "every query head got key/value head 0" in fb.message, fb.message


@pytest.mark.parametrize("imported", ["module", "function"])
def test_split_merge_refuses_einops_as_the_exercise_asks(imported: str) -> None:
    rearrange = einops.rearrange if imported == "module" else __import__("einops").einops.rearrange

    def split(x: torch.Tensor, H: int) -> torch.Tensor:
        return rearrange(x, "b s (h d) -> b h s d", h=H)

    def merge(x: torch.Tensor) -> torch.Tensor:
        return rearrange(x, "b h s d -> b s (h d)")

    fb = check_split_merge(split, merge_heads)
    assert fb.status == "wrong" and "split_heads calls einops.rearrange" in fb.message, fb.message
    fb = check_split_merge(split_heads, merge)
    assert fb.status == "wrong" and "merge_heads calls einops.rearrange" in fb.message, fb.message
    assert einops.rearrange.__name__ == "rearrange"  # the spy is gone afterwards


def test_op_log_records_the_operators() -> None:
    from attnbook.ch06 import OpLog

    q = split_heads(torch.randn(2, 5, 8), 2)  # [B, H, S, D_k], a transposed view
    with OpLog() as log:
        q @ q.transpose(-2, -1)
    assert "bmm" in log.ops and "clone" in log.ops


def _partial_split_test(compare):
    """A learner's test of a split that compares only part of the result, through ``compare(y, x, H, d)``."""
    def test(split_fn):
        B, S, H, d = 2, 3, 2, 4
        x = torch.randn(B, S, H * d, generator=torch.Generator().manual_seed(1))  # [B, S, D]
        y = split_fn(x, H)
        return tuple(y.shape) == (B, H, S, d) and compare(y, x, H, d)
    return test


@pytest.mark.parametrize("compare, named", [
    (lambda y, x, H, d: all(torch.equal(y[0, h], x[0, :, h * d:(h + 1) * d]) for h in range(H)), "check every sequence"),
    (lambda y, x, H, d: all(torch.equal(y[:, h, s], x[:, s, h * d:(h + 1) * d]) for h in range(H) for s in range(x.shape[1] - 1)),
     "range(S) and not range(S - 1)"),
    (lambda y, x, H, d: all(torch.equal(y[:, h, :, 0], x[:, :, h * d]) for h in range(H)), "compare every feature of a head"),
])
def test_split_test_that_checks_only_part_of_the_result_is_refused(compare, named) -> None:
    fb = check_split_test(_partial_split_test(compare))
    assert fb.status == "wrong" and named in fb.message, fb


def test_split_with_h_and_dk_swapped_is_named() -> None:
    def swapped(x: Tensor, H: int) -> Tensor:
        B, S, D = x.shape
        return x.view(B, S, D // H, H).transpose(1, 2)  # [B, D_k, S, H]

    fb = check_split_merge(swapped, merge_heads)
    assert fb.status == "wrong" and "swapped the sizes H = 4 and D_k = 5" in fb.message, fb


def test_repeat_interleave_by_h_kv_is_named() -> None:
    fb = check_repeat_kv(lambda kv, H: kv.repeat_interleave(kv.shape[1], dim=1))
    assert fb.status == "wrong" and f"repeated each key/value head H_kv = {REPEAT_KV_CASES[0][1]} times" in fb.message, fb


def test_merge_that_unpacks_the_input_in_the_splits_order_is_named() -> None:
    def merge(x):
        B, S, H, d_k = x.shape  # the split's order, but the input is [B, H, S, D_k]
        return x.transpose(1, 2).reshape(B, S, H * d_k)

    fb = check_merge_heads(merge)
    assert fb.status == "wrong" and "[B, H, S * D_k]" in fb.message and "split's order" in fb.message, fb


def test_repeat_kv_with_the_group_axis_first_in_einops_is_told_by_its_symptom() -> None:
    fb = check_repeat_kv(lambda kv, H: einops.repeat(kv, "b h s d -> b (g h) s d", g=H // kv.shape[1]))
    assert fb.status == "wrong" and fb.message.startswith("query head 1 got key/value head 1, expected 0"), fb
    assert '"(g h)"' in fb.message and "you expanded" not in fb.message, fb


# --- hints that fit the exercise the reader is in ---------------------------------------------


def _merge_forgot_h(x: Tensor) -> Tensor:
    B, H, S, d_k = x.shape
    return x.transpose(1, 2).reshape(B, S, d_k)  # [B, S, D_k]: the H is missing


@pytest.mark.parametrize(
    "merge",
    [_merge_forgot_h, lambda x: x.transpose(1, 2).reshape(2, 3, 20)],  # the second: the first case's sizes written in
    ids=["B, S, D_k without H", "hard-coded sizes"],
)
def test_merge_with_sizes_that_do_not_fit_gets_the_merge_s_own_hint(merge) -> None:  # type: ignore[no-untyped-def]
    for fb in (check_merge_heads(merge), check_split_merge(split_heads, merge)):
        assert fb.status == "wrong" and "merge_heads receives [B, H, S, D_k]" in fb.message, fb.message
        assert "num_heads argument and use" not in fb.message  # the split's wording does not fit the merge
    assert "take H from the num_heads argument" in check_split_heads(lambda x, H: x.view(2, 3, 4, 5).transpose(1, 2)).message


def _test_on(data: Tensor):  # type: ignore[no-untyped-def]
    def test_fn(split_fn: object) -> bool:
        B, S, D = data.shape
        y = split_fn(data, 2)  # type: ignore[operator]
        return tuple(y.shape) == (B, 2, S, D // 2) and all(
            torch.equal(y[:, h], data[..., h * (D // 2):(h + 1) * (D // 2)]) for h in range(2))
    return test_fn


@pytest.mark.parametrize(
    "data, hint",
    [
        (torch.ones(2, 3, 8), "your test data repeat one number"),
        (torch.zeros(2, 3, 8), "your test data repeat one number"),
        (torch.arange(3.0)[None, :, None].expand(2, 3, 8).clone(), "your test data repeat numbers"),  # one number per position
    ],
    ids=["ones", "zeros", "one number per position"],
)
def test_split_test_on_repeated_data_is_told_to_use_distinct_numbers(data: Tensor, hint: str) -> None:
    fb = check_split_test(_test_on(data))
    assert fb.status == "wrong" and hint in fb.message and "use distinct numbers" in fb.message, fb.message
    assert "so compare values" not in fb.message
    assert check_split_test(_test_on(torch.arange(48.0).view(2, 3, 8))).passed  # the same test on distinct numbers


@pytest.mark.parametrize(
    "reader",
    [
        lambda kv, H: kv[:, :, None].expand(kv.shape[0], kv.shape[1], _G_FIRST, *kv.shape[2:]).reshape(
            kv.shape[0], -1, *kv.shape[2:]),
        lambda kv, H: kv.repeat_interleave(_G_FIRST, dim=1),
    ],
    ids=["expand with the first case's G", "repeat_interleave(G of the first case)"],
)
def test_repeat_kv_with_a_hard_coded_group_size_is_asked_about_it(reader) -> None:  # type: ignore[no-untyped-def]
    fb = check_repeat_kv(reader)
    assert fb.status == "wrong" and "Did you hard-code G? Take it from the shapes" in fb.message, fb.message


# --- the fourth confirmation reading ------------------------------------------------------------


def _repeat_kv_h_kv_from_axis_0(kv: Tensor, num_heads: int) -> Tensor:
    return kv.repeat_interleave(num_heads // kv.size(0), dim=1)


def _repeat_kv_unpacked_in_the_wrong_order(kv: Tensor, num_heads: int) -> Tensor:
    H_kv, B, S, d_k = kv.shape
    G = num_heads // H_kv
    return kv.unsqueeze(2).expand(-1, -1, G, -1, -1).flatten(1, 2)


@pytest.mark.parametrize("reader", [_repeat_kv_h_kv_from_axis_0, _repeat_kv_unpacked_in_the_wrong_order])
def test_repeat_kv_with_h_kv_read_from_the_batch_axis_is_named(reader) -> None:  # type: ignore[no-untyped-def]
    fb = check_repeat_kv(reader)
    assert fb.status == "wrong" and "you took H_kv from axis 0, the batch" in fb.message, fb.message


def test_repeat_kv_cases_tell_every_axis_from_the_group_size() -> None:
    for B, H_kv, S, d_k, H in REPEAT_KV_CASES:
        assert len({B, H_kv, S, d_k, H}) == 5 and H % H_kv == 0
        G = H // H_kv
        assert G not in (H // B, H // S, H // d_k)
    assert _G_FIRST == 4  # the G of section 6.6's example, so that a copied G passes the first case only
    first, second = REPEAT_KV_CASES
    assert all(a != b for a, b in zip(first, second))


def test_repeat_kv_note_names_repeat_when_the_reader_used_it() -> None:
    def with_repeat(kv: Tensor, num_heads: int) -> Tensor:
        B, H_kv, S, d_k = kv.shape
        return kv.unsqueeze(2).repeat(1, 1, num_heads // H_kv, 1, 1).reshape(B, num_heads, S, d_k)

    fb = check_repeat_kv(with_repeat)
    assert fb.passed and "repeat copies every key/value head at once" in fb.message, fb.message


def test_split_that_transposes_before_splitting_is_named() -> None:
    def transpose_first(x: Tensor, num_heads: int) -> Tensor:
        B, S, D = x.shape
        return x.transpose(1, 2).reshape(B, num_heads, S, D // num_heads)

    for fb in (check_split_heads(transpose_first), check_split_merge(transpose_first, merge_heads)):
        assert fb.status == "wrong" and "you transposed [B, S, D] to [B, D, S] before splitting" in fb.message, fb.message


def test_merge_copies_exactly_when_s_h_and_d_k_are_all_above_1() -> None:
    # the chapter's claim: merging a contiguous attention output copies for S, H, D_k > 1 and is a view otherwise
    for B in (1, 2):
        for H in (1, 2, 3):
            for S in (1, 2, 3):
                for d_k in (1, 2, 3):
                    out = torch.arange(B * H * S * d_k).view(B, H, S, d_k)  # [B, H, S, D_k], contiguous
                    merged = merge_heads(out)  # [B, S, D]
                    is_view = merged.data_ptr() == out.data_ptr()
                    assert is_view == (min(S, H, d_k) == 1), (B, H, S, d_k)
    out = torch.arange(24).view(2, 3, 4, 1)  # D_k = 1: (H, 1) merge with a single stride
    merged = merge_heads(out)
    assert merged.data_ptr() == out.data_ptr() and merged.stride() == (12, 1, 4) and not merged.is_contiguous()


def test_memory_layout_alt_text_is_the_stored_one_and_names_the_drawn_tokens() -> None:
    import json
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnbook.ch06 import LAYOUT_DK, LAYOUT_HEADS, LAYOUT_TOKENS, memory_layout, memory_layout_alt

    nb = json.loads((Path(__file__).resolve().parents[1] / "book" / "06_tensor_reshaping.ipynb").read_text())
    cells = [c for c in nb["cells"] if c["cell_type"] == "code" and "memory_layout(" in "".join(c["source"])]
    assert len(cells) == 1
    stored = cells[0]["metadata"]["mystnb"]["image"]["alt"]
    assert stored == memory_layout_alt(len(LAYOUT_TOKENS), LAYOUT_HEADS, LAYOUT_DK, LAYOUT_TOKENS)
    fig = memory_layout(len(LAYOUT_TOKENS), LAYOUT_HEADS, LAYOUT_DK, tokens=LAYOUT_TOKENS)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    plt.close(fig)
    drawn_tokens = legend[: len(LAYOUT_TOKENS)]
    assert drawn_tokens == list(LAYOUT_TOKENS)
    assert f"names the {len(drawn_tokens)} colours ({', '.join(drawn_tokens)})" in stored
    assert "(" + ", ".join(f"{tok}: {4 * s}-{4 * s + 3}" for s, tok in enumerate(drawn_tokens)) + ")" in stored
    assert f"cells of {drawn_tokens[0]} and {drawn_tokens[1]}" in stored


def test_merge_with_the_last_two_axes_swapped_is_named() -> None:
    def merge(x):
        B, H, S, d_k = x.shape
        return x.transpose(-2, -1).reshape(B, S, H * d_k)

    fb = check_merge_heads(merge)
    assert fb.status == "wrong" and "you transposed the last two axes" in fb.message


def test_repeat_kv_along_the_positions_is_named() -> None:
    fb = check_repeat_kv(lambda kv, H: kv.repeat_interleave(H // kv.shape[1], dim=2))
    assert fb.status == "wrong" and "you repeated along dim=2, the positions" in fb.message
