"""Chapter 10: the counts agree with FlopCounterMode, the checkers recognise every known mistake,
the slider's frames show what the cache holds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnbook import ch10, toy_lm
from attnbook.feedback import close
from attnlib import KVCache, MultiHeadLatentAttention, MultiHeadSelfAttention
from attnlib.cost import count_flops


@pytest.mark.parametrize("H_kv", [4, 2, 1])
def test_layer_flops_match_the_counter(H_kv: int) -> None:
    torch.manual_seed(0)
    layer, x, cache = MultiHeadSelfAttention(32, 4, num_kv_heads=H_kv), torch.randn(1, 10, 32), KVCache()
    layer(x[:, :7], causal=True, cache=cache)
    assert count_flops(lambda: layer(x[:, 7:], causal=True, cache=cache)) == ch10.layer_flops(32, 4, H_kv, 3, 10)
    assert count_flops(lambda: layer(x, causal=True)) == ch10.layer_flops(32, 4, H_kv, 10, 10)


@pytest.mark.parametrize("absorbed", [False, True])
def test_mla_counts_match_the_counter(absorbed: bool) -> None:
    torch.manual_seed(0)
    mla, x, cache = MultiHeadLatentAttention(64, 4, latent_dim=24), torch.randn(1, 38, 64), KVCache()
    mla(x[:, :37], causal=True, cache=cache)
    n = count_flops(lambda: mla(x[:, 37:], causal=True, cache=cache, absorbed=absorbed))
    assert n == ch10.mla_decode_counts(64, 4, 24, 38)["absorbed" if absorbed else "decompress"]["flops"]


def test_decode_is_memory_bound_and_prefill_is_not() -> None:
    D, S = 4096, 4096  # a Llama 2 7B layer
    decode = ch10.layer_flops(D, 32, 32, 1, S) / ch10.layer_bytes(D, 32, 32, 1, S)
    prefill = ch10.layer_flops(D, 32, 32, S, S) / ch10.layer_bytes(D, 32, 32, S, S)
    assert 0.9 < decode < 1.1 and prefill > 1000


def test_toy_step_flops_and_copied_positions() -> None:
    model = toy_lm.TinyLM(20, d_model=16, num_heads=2, max_len=40)
    f = ch10.toy_step_flops(model, 30)
    assert f["no cache"] == ch10.layer_flops(16, 2, 2, 31, 31) + 31 * 2 * 16 * 20
    assert f["cache"] == ch10.layer_flops(16, 2, 2, 1, 31) + 2 * 16 * 20
    assert ch10.copied_positions(9) == {"torch.cat": 45, "KVCache": 9 + 1 + 2 + 4 + 8}  # each append + each doubling


def test_cache_sizes_of_real_models() -> None:
    llama2_7b, llama2_70b, llama3_8b, llama3_70b, mistral = ch10.MODELS
    assert llama2_7b.cache_bytes(1) == 2**19  # 0.5 MiB per token
    assert llama3_8b.cache_bytes(1) == 2**17 and llama2_70b.cache_bytes(1) == 5 * 2**16
    assert mistral.cache_bytes(32_768) == mistral.cache_bytes(4096) == 2**29  # the window caps it
    assert mistral.crossover() is None and llama2_7b.crossover() > llama2_7b.context  # never within its context
    assert llama3_8b.crossover() == 122_529 < llama3_8b.context and llama3_70b.crossover() > llama3_70b.context


def test_append_and_attend_checker() -> None:
    assert ch10.check_append_and_attend(ch10.reference_append_and_attend).passed
    case = ch10._append_case()
    assert close(ch10.reference_append_and_attend(*case)[0], ch10.full_causal_pass(case))
    for m in ch10.APPEND_MISTAKES:  # every mistake gets its own hint
        fb = ch10.check_append_and_attend(lambda *a, m=m: (m.compute(*a), *ch10._cat(*a)))
        assert fb.status == "wrong" and fb.message == m.hint, m.name
    repeated = lambda *a: (lambda o, k, v: (o, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)))(*ch10.reference_append_and_attend(*a))
    assert "repeated heads" in ch10.check_append_and_attend(repeated).message

    def stub(*a):
        raise NotImplementedError

    assert ch10.check_append_and_attend(stub).status == "todo"


def test_append_checker_names_an_inverted_fill_and_a_cast() -> None:
    """masked_fill where the mask is True (it means 'may attend') leaves the last row all -inf; a cast
    to float32 of the float64 case is named, here and in the merge checker."""
    def manual(fill_where_true=False, dtype=None):
        def fn(q, kc, vc, kn, vn):
            keys, values = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2)
            H, S_new, S_k = q.shape[1], q.shape[2], keys.shape[2]
            mask = ch10.causal_mask(S_new, S_k=S_k)
            scores = q @ ch10.repeat_kv(keys, H).transpose(-2, -1) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(mask if fill_where_true else ~mask, float("-inf"))
            out = scores.softmax(-1) @ ch10.repeat_kv(values, H)
            return (out if dtype is None else out.to(dtype)), keys, values
        return fn

    assert ch10.check_append_and_attend(manual()).passed
    fb = ch10.check_append_and_attend(manual(fill_where_true=True))
    assert fb.status == "wrong" and "masked_fill(~mask" in fb.message, fb
    fb = ch10.check_append_and_attend(manual(dtype=torch.float32))
    assert fb.status == "wrong" and "torch.float32" in fb.message and "float64" in fb.message, fb

    def merge_cast(outs, lses):
        return ch10.reference_merge_partials(outs, lses).float()

    assert ch10._merge_case(*ch10.MERGE_CASES[0])[0][0].dtype == torch.float64  # the cast is a real change
    fb = ch10.check_merge_partials(merge_cast)
    assert fb.status == "wrong" and "torch.float32" in fb.message, fb


def test_window_cache_checker() -> None:
    assert ch10.check_window_cache_bytes(ch10.reference_window_cache_bytes).passed
    for m in ch10.WINDOW_MISTAKES:
        fb = ch10.check_window_cache_bytes(m.compute)
        assert fb.status == "wrong" and fb.message == m.hint, m.name
    assert "for seq_len = 100" in ch10.check_window_cache_bytes(lambda S: 1).message


def test_generation_frames() -> None:
    frame = ch10.generation_frame(12)
    full, windowed = frame.panels
    assert "Full cache: the cache held 11 positions before this step, afterwards positions 0-11." in frame.caption
    assert "Window W = 4: the cache held 4 positions before this step, afterwards positions 8-11 (positions 0-7 have left" in frame.caption
    for p in (full, windowed):
        assert abs(p.matrix.sum() - 1) < 1e-6
    assert windowed.masked[0, :8].all() and not windowed.masked[0, 8:].any() and not full.masked.any()
    assert "have left" not in ch10.generation_frame(4).caption


def test_absorption_pays_for_few_queries_against_many_latents() -> None:
    f = lambda S_new, S_k: ch10.mla_attention_flops(128, 512, 128, S_new, S_k)
    assert f(1, 4096)["absorbed"] < f(1, 4096)["decompress"]
    assert f(4096, 4096)["absorbed"] > f(4096, 4096)["decompress"]  # a prefill
    S_k = 10**6  # far from the prompt's start the break-even is close to L D_k / (L - D_k) = 170.7
    assert f(170, S_k)["absorbed"] < f(170, S_k)["decompress"] and f(171, S_k)["absorbed"] > f(171, S_k)["decompress"]


def test_review_items_of_chapter_9_checkers() -> None:
    """Review items ch9 #34, #35."""
    import torch.nn.functional as F

    def tiled(q, kc, vc, kn, vn):
        keys, values = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2)
        G = q.shape[1] // keys.shape[1]
        mask = ch10.causal_mask(q.shape[2], S_k=keys.shape[2])
        return F.scaled_dot_product_attention(q, keys.repeat(1, G, 1, 1), values.repeat(1, G, 1, 1), attn_mask=mask), keys, values

    assert "tiled" in ch10.check_append_and_attend(tiled).message

    def no_repeat(q, kc, vc, kn, vn):
        keys, values = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2)
        return F.scaled_dot_product_attention(q, keys, values), keys, values

    fb = ch10.check_append_and_attend(no_repeat)
    assert fb.status == "wrong" and "repeat_kv" in fb.message, fb
    fb = ch10.check_window_cache_bytes(lambda S: ch10.reference_window_cache_bytes(S) // 2)
    assert "keys only" in fb.message and "numbers instead of bytes" in fb.message
    fb = ch10.check_window_cache_bytes(lambda S: torch.tensor([1.0, 2.0]))
    assert fb.status == "wrong" and "Traceback" not in fb.message
    assert "MiB" in ch10.check_window_cache_bytes(lambda S: ch10.reference_window_cache_bytes(S) / 2**20).message
    fb = ch10.check_window_cache_bytes(lambda S: None if S < 2048 else ch10.reference_window_cache_bytes(S))
    assert "did you forget `return`" in fb.message


def test_new_checkers_accept_the_reference_and_name_every_mistake() -> None:
    for check, ref, mistakes in ((ch10.check_decode_intensity, ch10.reference_decode_intensity, ch10.INTENSITY_MISTAKES),):
        assert check(ref).passed
        for m in mistakes:
            fb = check(m.compute)
            assert fb.status == "wrong" and fb.message == m.hint, m.name
    assert ch10.check_mla_cache(ch10.reference_mla_cache).passed
    # any length-2 sequence or array of real numbers is accepted
    assert ch10.check_mla_cache(lambda *c: np.array(ch10.reference_mla_cache(*c))).passed
    assert ch10.check_mla_cache(lambda *c: torch.tensor(ch10.reference_mla_cache(*c), dtype=torch.float64)).passed
    assert ch10.check_mla_cache(lambda *c: list(ch10.reference_mla_cache(*c))).passed
    assert ch10.check_mla_cache(lambda *c: np.zeros(3)).status == "wrong"
    for m in ch10.MLA_MISTAKES:
        fb = ch10.check_mla_cache(m.compute)
        assert fb.status == "wrong" and fb.message == m.hint, m.name
    assert ch10.check_merge_partials(ch10.reference_merge_partials).passed
    for m in ch10.MERGE_MISTAKES:
        fb = ch10.check_merge_partials(m.compute)
        assert fb.status == "wrong" and fb.message == m.hint, m.name
    naive = lambda outs, lses: sum(torch.exp(l)[..., None] * o for o, l in zip(outs, lses)) / sum(torch.exp(l) for l in lses)[..., None]
    assert "overflows" in ch10.check_merge_partials(naive).message
    assert ch10.check_decode_intensity(lambda *a: torch.ones(2)).status == "wrong"

    def stub(*a):
        raise NotImplementedError

    for check in (ch10.check_decode_intensity, ch10.check_mla_cache, ch10.check_merge_partials):
        assert check(stub).status == "todo"


def test_decode_intensity_and_the_weight_read_batch() -> None:
    # weights only (no cache): the intensity of a decode step is about B FLOPs per byte
    assert abs(ch10.decode_step_intensity(4096, 32, 8, 1, 295, 14336) - 295) < 3
    # with a long GQA cache the intensity saturates below H / H_kv x (a little) whatever the batch
    assert 4 < ch10.decode_step_intensity(4096, 32, 8, 131072, 10**6, 14336) < 5  # saturates near H / H_kv
    assert ch10.mlp_flops_bytes(4096, 11008)["flops"] == 270_532_608


@pytest.mark.parametrize("cases, reference, mistakes", [
    (ch10.INTENSITY_CASES, ch10.reference_decode_intensity, ch10.INTENSITY_MISTAKES),
    (ch10.MLA_CASES, ch10.reference_mla_cache, ch10.MLA_MISTAKES),
], ids=["decode_intensity", "mla_cache"])
def test_number_checker_mistakes_are_distinct(cases, reference, mistakes) -> None:
    # on the checker's cases no mistake equals the answer and no two mistakes give the same numbers,
    # so every mistake gets its own hint
    def values(f):
        return [np.atleast_1d(np.asarray(f(*c), dtype=float)) for c in cases]
    same = lambda a, b: all(np.allclose(x, y, rtol=1e-6, atol=0) for x, y in zip(a, b))
    answer = values(reference)
    got = {m.name: values(m.compute) for m in mistakes}
    for name, v in got.items():
        assert not same(v, answer), f"mistake {name!r} gives the answer"
    names = list(got)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not same(got[a], got[b]), f"mistakes {a!r} and {b!r} collide"


def test_append_checker_names_the_mask_width_and_the_swapped_return() -> None:
    """A square mask is a mask mistake, not a grouped-heads one; a swapped return is named as such."""
    import torch.nn.functional as F

    def attend(mask_of, swap=False):
        def fn(q, kc, vc, kn, vn):
            keys, values = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2)
            H = q.shape[1]
            out = F.scaled_dot_product_attention(q, ch10.repeat_kv(keys, H), ch10.repeat_kv(values, H),
                                                 attn_mask=mask_of(q.shape[2], keys.shape[2]))
            return (out, values, keys) if swap else (out, keys, values)
        return fn

    fb = ch10.check_append_and_attend(attend(lambda s, k: ch10.causal_mask(s)))
    assert fb.status == "wrong" and "S_k=S_k" in fb.message and "repeat_kv" not in fb.message, fb
    fb = ch10.check_append_and_attend(attend(lambda s, k: ch10.causal_mask(s, S_k=k), swap=True))
    assert "swapped" in fb.message, fb
    fb = ch10.check_append_and_attend(attend(lambda s, k: ~ch10.causal_mask(s, S_k=k)))
    assert "inverted" in fb.message, fb


def test_learner_probe_mistakes_are_named() -> None:
    """Mistakes written the way a learner writes them get their own hint, not a raw error or a restatement."""
    def cat_on(dim):
        def fn(q, kc, vc, kn, vn):
            keys, values = torch.cat([kc, kn], dim), torch.cat([vc, vn], dim)
            return ch10.reference_append_and_attend(q, kc, vc, kn, vn)[0], keys, values
        return fn

    fb = ch10.check_append_and_attend(cat_on(1))
    assert fb.status == "wrong" and "dim=2 of [B, H_kv, S, D_k]" in fb.message, fb

    def no_trailing_axis(outs, lses):
        lse = torch.logsumexp(torch.stack(lses), dim=0)
        return sum(torch.exp(l - lse) * o for o, l in zip(outs, lses))

    fb = ch10.check_merge_partials(no_trailing_axis)
    assert fb.status == "wrong" and "[..., None]" in fb.message and "broadcasts over D_v" in fb.message, fb

    def max_shift(outs, lses):
        m = torch.stack(lses).max(0).values
        return sum(torch.exp(l - m)[..., None] * o for o, l in zip(outs, lses))

    assert ch10.check_merge_partials(max_shift).message == ch10.MERGE_MISTAKES[
        [m.name for m in ch10.MERGE_MISTAKES].index("max shift, not normalised")].hint

    def floor_heads(layers, latent, rope, head_dim):
        return (latent + rope) * layers * 2, (latent + rope) // (2 * head_dim)

    assert "rounded down" in ch10.check_mla_cache(floor_heads).message
    assert "bits" in ch10.check_window_cache_bytes(lambda S: 2 * 24 * 4 * 96 * min(S, 2048) * 16).message
    assert "one layer" in ch10.check_window_cache_bytes(lambda S: 2 * 4 * 96 * min(S, 2048) * 2).message


def test_reading_1011_slips_get_their_own_hints() -> None:
    """The fresh reading's submissions: new keys only, 1/D_k, integer division, 4 bytes, S - 1, the merge
    softmax over the wrong axis; and the 16-bit cases: a -1e9 fill that float16 cannot hold."""
    import torch.nn.functional as F

    from attnlib import causal_mask, repeat_kv

    def new_keys_only(q, kc, vc, kn, vn):
        H = q.shape[1]
        out = F.scaled_dot_product_attention(q, repeat_kv(kn, H), repeat_kv(vn, H), is_causal=True)
        return out, torch.cat([kc, kn], 2), torch.cat([vc, vn], 2)

    def manual(fill, scale):
        def f(q, kc, vc, kn, vn):
            k, v, H = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2), q.shape[1]
            s = q @ repeat_kv(k, H).transpose(-2, -1) / scale(q.shape[-1])
            s = s.masked_fill(~causal_mask(q.shape[2], S_k=k.shape[2]), fill)
            return s.softmax(-1) @ repeat_kv(v, H), k, v
        return f

    fb = ch10.check_append_and_attend(new_keys_only)
    assert not fb.passed and "only the new keys" in fb.message, fb
    fb = ch10.check_append_and_attend(manual(float("-inf"), lambda d: d))
    assert not fb.passed and "divided the scores by D_k" in fb.message, fb
    fb = ch10.check_append_and_attend(manual(-1e9, math.sqrt))  # right in float64 and float32, not in float16
    assert not fb.passed and "torch.float16" in fb.message and "-1e9" in fb.message, fb
    assert ch10.check_append_and_attend(manual(float("-inf"), math.sqrt)).passed  # the manual form, right
    upcast = lambda *c: (lambda o, k, v: (o.double() if c[0].dtype in (torch.float16, torch.bfloat16) else o, k, v))(
        *ch10._solution_append(*(t.double() for t in c)) if c[0].dtype in (torch.float16, torch.bfloat16)
        else ch10._solution_append(*c))
    assert ch10.check_append_and_attend(upcast).passed  # a 16-bit step computed in float64 is fine

    def intensity(nbytes=2, floor=False, minus=0):
        def f(D, H, H_kv, S, batch):
            d_k, S = D // H, S - minus
            flops = batch * ch10.layer_flops(D, H, H_kv, 1, S)
            total = (2 * D * D + 2 * D * H_kv * d_k) * nbytes + batch * 2 * H_kv * d_k * S * nbytes
            return flops // total if floor else flops / total
        return f

    for kwargs, words in (({"floor": True}, "use / not //"), ({"nbytes": 4}, "4 bytes"), ({"minus": 1}, "S already includes")):
        fb = ch10.check_decode_intensity(intensity(**kwargs))
        assert not fb.passed and words in fb.message, (kwargs, fb)

    fb = ch10.check_merge_partials(lambda outs, lses: sum(w[..., None] * o for w, o in
                                                         zip(torch.softmax(torch.stack(lses), dim=-1), outs)))
    assert not fb.passed and "a single entry (the one query)" in fb.message, fb


def test_merge_checker_tries_16_bit_partials() -> None:
    def float16_constant(outs, lses):  # right in float64; the -70000 floor is -inf in float16
        stacked = torch.stack(lses).clamp_min(torch.tensor(-7e4, dtype=lses[0].dtype))
        lse = torch.logsumexp(stacked, 0)
        return sum(torch.exp(l - lse)[..., None] * o for o, l in zip(outs, stacked))

    def naive_in_float16(outs, lses):  # overflows float16 at lse > 11 only when computed in 16 bits
        if lses[0].dtype != torch.float16:
            return ch10._solution_merge(outs, lses)
        w = [torch.exp(l + 4) for l in lses]
        return sum(x[..., None] * o for x, o in zip(w, outs)) / sum(w)[..., None]

    assert ch10.check_merge_partials(float16_constant).passed or "float16" in ch10.check_merge_partials(float16_constant).message
    fb = ch10.check_merge_partials(naive_in_float16)
    assert not fb.passed and "torch.float16" in fb.message and "overflow" in fb.message, fb
    wider = lambda outs, lses: ch10._solution_merge([o.double() for o in outs], [l.double() for l in lses])
    assert ch10.check_merge_partials(wider).passed


def test_reading_1011_triu_additive_and_rope_twice() -> None:
    import torch.nn.functional as F

    from attnlib import causal_mask, repeat_kv

    def with_mask(make):
        def f(q, kc, vc, kn, vn):
            k, v, H = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2), q.shape[1]
            m = causal_mask(q.shape[2], S_k=k.shape[2])
            return F.scaled_dot_product_attention(q, repeat_kv(k, H), repeat_kv(v, H), attn_mask=make(m, q)), k, v
        return f

    triu = with_mask(lambda m, q: torch.ones(m.shape, dtype=torch.bool).triu(m.shape[1] - m.shape[0]))
    fb = ch10.check_append_and_attend(triu)
    assert not fb.passed and "upper triangle" in fb.message, fb
    additive_flipped = with_mask(lambda m, q: torch.zeros(m.shape, dtype=q.dtype).masked_fill(m, float("-inf")))
    fb = ch10.check_append_and_attend(additive_flipped)
    assert not fb.passed and "additive mask is 0 where" in fb.message, fb
    additive = with_mask(lambda m, q: torch.zeros(m.shape, dtype=q.dtype).masked_fill(~m, float("-inf")))
    assert ch10.check_append_and_attend(additive).passed  # the additive form, right, in every dtype
    fb = ch10.check_mla_cache(lambda l, L, r, d: (float((L + 2 * r) * l * 2), (L + 2 * r) / (2 * d)))
    assert not fb.passed and "rotary key twice" in fb.message, fb
