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
from attnlib.cost import count_flops, mha_param_count


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


def test_changing_the_kv_heads_changes_the_weights() -> None:
    """W_K and W_V are D x H_kv D_k: a model with other KV heads has other weights, as MultiHeadSelfAttention counts them."""
    llama3_8b = ch10.MODELS[2]
    D, H, d_k = 4096, 32, 128
    for h_kv in (32, 8, 4, 1):
        m = llama3_8b.with_kv_heads(h_kv)
        per_layer = mha_param_count(D, H, bias=False, num_kv_heads=h_kv) - mha_param_count(D, H, bias=False, num_kv_heads=8)
        assert m.params - llama3_8b.params == 32 * per_layer and m.cache_bytes(1) == 2 * 32 * h_kv * d_k * 2
    assert llama3_8b.with_kv_heads(32).crossover() == 33_705  # 8.835e9 parameters
    assert llama3_8b.with_kv_heads(1).crossover() == 951_553  # 7.795e9 parameters


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


def test_append_checker_names_a_positional_S_k_and_a_wrong_sign_offset() -> None:
    """causal_mask(S_new, S_k) is a TypeError (S_k is keyword-only); tril(S_new - S_k) is the offset's sign,
    told whether SDPA zeroes the rows that see no key or a written-out softmax leaves them NaN."""
    import torch.nn.functional as F

    def attend(mask_of, manual=False):
        def fn(q, kc, vc, kn, vn):
            keys, values = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2)
            H, S_new, S_k = q.shape[1], q.shape[2], keys.shape[2]
            k, v, mask = ch10.repeat_kv(keys, H), ch10.repeat_kv(values, H), mask_of(S_new, S_k)
            if manual:
                scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
                return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v, keys, values
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), keys, values
        return fn

    fb = ch10.check_append_and_attend(attend(lambda s, k: ch10.causal_mask(s, k)))
    assert fb.status == "wrong" and "TypeError" in fb.message and "causal_mask(S_new, S_k=...)" in fb.message, fb
    assert ch10.check_append_and_attend(attend(lambda s, k: ch10.causal_mask(s, S_k=k))).passed
    for manual in (False, True):
        wrong_sign = attend(lambda s, k: torch.ones(s, k, dtype=torch.bool).tril(s - k), manual=manual)
        fb = ch10.check_append_and_attend(wrong_sign)
        assert fb.status == "wrong" and "wrong sign" in fb.message and "tril(S_k - S_new)" not in fb.message, fb
    # masked_fill where the mask is True still gets its own hint, not the offset's
    fb = ch10.check_append_and_attend(attend(lambda s, k: ~ch10.causal_mask(s, S_k=k), manual=True))
    assert fb.status == "wrong" and "wrong sign" not in fb.message, fb


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
    upcast = lambda *c: (lambda o, k, v: (o.double() if c[0].dtype in (torch.float16, torch.bfloat16) else o,
                                          k.to(c[1].dtype), v.to(c[2].dtype)))(
        *ch10._solution_append(*(t.double() for t in c)) if c[0].dtype in (torch.float16, torch.bfloat16)
        else ch10._solution_append(*c))
    # a 16-bit step computed in float64 is fine, its output returned in float64 too; the stored cache keeps its dtype
    assert ch10.check_append_and_attend(upcast).passed

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


def _probe_attend(q, kc, vc, kn, vn, *, mask=None):
    """The probe-ch10-11 reading's common start: append, then SDPA with the bottom-right mask."""
    import torch.nn.functional as F

    from attnlib import causal_mask, repeat_kv

    k = torch.cat([kc, kn], 2); v = torch.cat([vc, vn], 2); H = q.shape[1]
    m = causal_mask(q.shape[2], S_k=k.shape[2]) if mask is None else mask(q, k)
    return F.scaled_dot_product_attention(q, repeat_kv(k, H), repeat_kv(v, H), attn_mask=m), k, v


def test_probe_1011_append_order_shapes_masks_and_cache_dtype() -> None:
    """probe-ch10-11: (keys, values, output), a transposed or reshaped output, a 0/1 float mask and a
    float32 cache each get a hint that names the slip; the output may be wider than 16-bit inputs."""
    import torch.nn.functional as F

    from attnlib import causal_mask, repeat_kv

    def order(q, kc, vc, kn, vn):
        k = torch.cat([kc, kn], 2); v = torch.cat([vc, vn], 2); H = q.shape[1]
        o = F.scaled_dot_product_attention(q, repeat_kv(k, H), repeat_kv(v, H), attn_mask=causal_mask(q.shape[2], S_k=k.shape[2]))
        return k, v, o

    fb = ch10.check_append_and_attend(order)
    assert not fb.passed and "another order, (keys, values, output)" in fb.message, fb
    fb = ch10.check_append_and_attend(lambda *c: (lambda o, k, v: (o.transpose(1, 2), k, v))(*_probe_attend(*c)))
    assert not fb.passed and "[B, S_new, H, D_k]" in fb.message and "swapped" in fb.message, fb

    def reshaped(*c):
        o, k, v = _probe_attend(*c)
        B, H_, S, D = o.shape
        return o.transpose(1, 2).reshape(B, H_, S, D), k, v

    fb = ch10.check_append_and_attend(reshaped)
    assert not fb.passed and "scrambled" in fb.message and ".reshape" in fb.message, fb
    float_mask = lambda *c: _probe_attend(*c, mask=lambda q, k: causal_mask(q.shape[2], S_k=k.shape[2]).to(q.dtype))
    fb = ch10.check_append_and_attend(float_mask)
    assert not fb.passed and "ADDED to the scores" in fb.message, fb

    def float32_cache(q, kc, vc, kn, vn):  # P2: the stored cache comes back in float32
        k = torch.cat([kc, kn], 2).float(); v = torch.cat([vc, vn], 2).float(); H = q.shape[1]
        o = F.scaled_dot_product_attention(q.float(), repeat_kv(k, H), repeat_kv(v, H),
                                           attn_mask=torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(k.shape[2] - q.shape[2]))
        return o.to(q.dtype), k, v

    fb = ch10.check_append_and_attend(float32_cache)
    assert not fb.passed and "cached keys come back as torch.float32, but the cache is torch.float64" in fb.message, fb
    widened = lambda *c: (lambda o, k, v: (o, k.float(), v.float()) if c[0].dtype == torch.float16 else (o, k, v))(*_probe_attend(*c))
    fb = ch10.check_append_and_attend(widened)  # a float16 cache stored as float32
    assert not fb.passed and "torch.float32, but the cache is torch.float16" in fb.message and "twice" in fb.message, fb

    def float32_output(q, kc, vc, kn, vn):  # P1: kept, a wider output of 16-bit inputs passes
        k = torch.cat([kc, kn], 2); v = torch.cat([vc, vn], 2); H = q.shape[1]
        wide = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype  # upcast only 16 bits
        o = F.scaled_dot_product_attention(q.to(wide), repeat_kv(k, H).to(wide), repeat_kv(v, H).to(wide),
                                           attn_mask=causal_mask(q.shape[2], S_k=k.shape[2]))
        return o, k, v

    assert ch10.check_append_and_attend(float32_output).passed
    # right answers written otherwise still pass: an additive -inf mask, enable_gqa, a list for the tuple
    additive = lambda *c: _probe_attend(*c, mask=lambda q, k: torch.zeros(q.shape[2], k.shape[2], dtype=q.dtype).masked_fill(
        ~causal_mask(q.shape[2], S_k=k.shape[2]), float("-inf")))
    assert ch10.check_append_and_attend(additive).passed

    def gqa(q, kc, vc, kn, vn):
        k, v = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(q.shape[2], S_k=k.shape[2]), enable_gqa=True)
        return [o, k, v]

    assert ch10.check_append_and_attend(gqa).passed


def test_probe_1011_number_checkers_name_prefill_helper_bytes_and_windows() -> None:
    """probe-ch10-11: prefill FLOPs, B x layer_bytes as it is, float32 bytes in MLA, max for min and a
    two-sided window each get their own hint."""
    def prefill(D, H, Hk, S, b):
        dk = D // H
        return b * ch10.layer_flops(D, H, Hk, S, S) / ((2 * D * D + 2 * D * Hk * dk) * 2 + b * 2 * Hk * dk * S * 2)

    fb = ch10.check_decode_intensity(prefill)
    assert not fb.passed and "a prefill's" in fb.message, fb
    fb = ch10.check_decode_intensity(lambda D, H, Hk, S, b: b * ch10.layer_flops(D, H, Hk, 1, S) / (b * ch10.layer_bytes(D, H, Hk, 1, S)))
    assert not fb.passed and "two slips at once" in fb.message and "activations=False" in fb.message, fb
    fb = ch10.check_mla_cache(lambda L, lat, r, hd: ((lat + r) * 4 * L, (lat + r) / (2 * hd)))
    assert not fb.passed and "4 bytes per number, as for float32" in fb.message, fb
    fb = ch10.check_mla_cache(lambda L, lat, r, hd: ((lat + r) * 2 * L, (lat + r) * 2 * L / (2 * hd)))
    assert not fb.passed and "from the bytes over all layers" in fb.message, fb
    fb = ch10.check_window_cache_bytes(lambda s: 2 * 24 * 4 * 96 * max(s, 2048) * 2)
    assert not fb.passed and "max(seq_len, window)" in fb.message, fb
    fb = ch10.check_window_cache_bytes(lambda s: 2 * 24 * 4 * 96 * min(s, 1024) * 2)
    assert not fb.passed and "one-sided" in fb.message, fb
    # right answers written otherwise still pass: the helper used rightly, a Python loop over the layers
    helper = lambda D, H, Hk, S, b: b * ch10.layer_flops(D, H, Hk, 1, S) / (
        ch10.layer_bytes(D, H, Hk, 1, S, activations=False) + (b - 1) * 2 * Hk * (D // H) * S * 2)
    assert ch10.check_decode_intensity(helper).passed
    assert ch10.check_window_cache_bytes(lambda s: sum(2 * 4 * 96 * min(s, 2048) * 2 for _ in range(24))).passed


def test_probe_1011_merge_names_the_axis_math_exp_and_the_wrong_totals() -> None:
    """probe-ch10-11: logsumexp over dim=1, math.exp on tensors, a sum of lses, the argmax chunk and
    exp2 on natural logarithms each get their own hint."""
    def wrong_axis(outs, lses):
        lse = torch.logsumexp(torch.stack(lses), dim=1, keepdim=True)[0]
        return sum(torch.exp(l - lse)[..., None] * o for o, l in zip(outs, lses))

    def math_exp(outs, lses):
        lse = torch.logsumexp(torch.stack(lses), 0)
        return sum(math.exp(l - lse) * o for o, l in zip(outs, lses))

    def sum_lses(outs, lses):
        lse = sum(lses)
        return sum(torch.exp(l - lse)[..., None] * o for o, l in zip(outs, lses))

    def argmax_chunk(outs, lses):
        L = torch.stack(lses); i = L.argmax(0)
        O = torch.stack(outs)
        return torch.gather(O, 0, i[None, ..., None].expand(1, *O.shape[1:]))[0]

    def log2(outs, lses):
        L = torch.stack(lses); lse = torch.log2(torch.exp2(L - L.max(0).values).sum(0)) + L.max(0).values
        return sum(torch.exp2(l - lse)[..., None] * o for o, l in zip(outs, lses))

    for submission, words in ((wrong_axis, "dim=1 is the batch"), (math_exp, "use torch.exp"),
                              (sum_lses, "not the sum of their lse_i"), (argmax_chunk, "largest lse_i"),
                              (log2, "mixed bases")):
        fb = ch10.check_merge_partials(submission)
        assert not fb.passed and words in fb.message, (submission.__name__, fb)
    # right answers written otherwise still pass: a softmax over the stacked chunks, a pairwise logaddexp
    assert ch10.check_merge_partials(lambda outs, lses: (torch.softmax(torch.stack(lses), 0)[..., None] * torch.stack(outs)).sum(0)).passed

    def pairwise(outs, lses):
        o, l = outs[0], lses[0]
        for o2, l2 in zip(outs[1:], lses[1:]):
            new = torch.logaddexp(l, l2)
            o, l = torch.exp(l - new)[..., None] * o + torch.exp(l2 - new)[..., None] * o2, new
        return o

    assert ch10.check_merge_partials(pairwise).passed


# ---- the learner probe of chapters 8-11: generic verdicts and raw errors, each named ----


@pytest.mark.parametrize("fn, words", [
    (lambda seq_len: 2 * 24 * 4 * 96 * min(seq_len, 2048) * 2 / 2**30, "those are GiB"),
    (lambda seq_len: 2 * 24 * 4 * 96 * (seq_len % 2048) * 2, "seq_len % window positions"),
    (lambda seq_len: 2 * 24 * 12 * 96 * seq_len * 2, "two slips at once: you cached the 12 query heads"),
])
def test_probe_window_cache_slips_are_named(fn, words: str) -> None:
    fb = ch10.check_window_cache_bytes(fn)
    assert fb.status == "wrong" and words in fb.message, fb


@pytest.mark.parametrize("fn, words", [
    (lambda D, H, Hk, S, b: b * ch10.layer_flops(D, H, Hk, 1, S) / ((2 * D * D + 2 * D * Hk * (D // H)) * 2 + b * 4 * Hk * D * S),
     "your cache counts D numbers per key/value head"),
    (lambda D, H, Hk, S, b: b * ch10.layer_flops(D, H, Hk, 1, S) / ((2 * D * D) * 2 + b * 4 * Hk * (D // H) * S),
     "you counted only the query and output projections"),
    (lambda D, H, Hk, S, b: b * ch10.layer_flops(D, H, Hk, 1, S) / ((2 * D * D + 2 * D * Hk) * 2 + b * 4 * Hk * (D // H) * S),
     "your key and value projections have D x H_kv weights each"),
])
def test_probe_decode_intensity_slips_are_named(fn, words: str) -> None:
    fb = ch10.check_decode_intensity(fn)
    assert fb.status == "wrong" and words in fb.message, fb


@pytest.mark.parametrize("fn, words", [
    (lambda layers, latent, rope, head_dim: ((2 * latent + rope) * layers * 2, (2 * latent + rope) / (2 * head_dim)),
     "you cached the latent twice"),
    (lambda layers, latent, rope, head_dim: ((latent + rope) * layers * 2, latent / (2 * head_dim)),
     "your equivalent heads leave out the rotary key"),
    (lambda layers, latent, rope, head_dim: ((latent + rope) * layers * 2, latent / head_dim),
     "your equivalent heads make two slips"),
])
def test_probe_mla_slips_are_named(fn, words: str) -> None:
    fb = ch10.check_mla_cache(fn)
    assert fb.status == "wrong" and words in fb.message, fb


def _probe_last_axis(outs, lses):
    lse = torch.logsumexp(torch.stack(lses), -1, keepdim=True)
    return sum(torch.exp(l - lse)[..., None] * o for o, l in zip(outs, lses))


@pytest.mark.parametrize("fn, words", [
    (_probe_last_axis, "runs over the last axis of torch.stack(lses)"),
    (lambda outs, lses: outs[-1], "the last chunk's output alone"),
    (lambda outs, lses: torch.stack([torch.exp(l - torch.logsumexp(torch.stack(lses), 0))[..., None] * o
                                     for o, l in zip(outs, lses)]), "instead of adding them up"),
    (lambda outs, lses: sum(torch.exp(l - torch.logsumexp(torch.cat(lses), 0))[..., None] * o for o, l in zip(outs, lses)),
     "torch.cat(lses) joins the chunks along the batch axis"),
    (lambda outs, lses: sum(torch.exp(l - torch.logsumexp(lses, 0))[..., None] * o for o, l in zip(outs, lses)),
     "must be Tensor, not list. A Python list is not a tensor"),
])
def test_probe_merge_slips_are_named(fn, words: str) -> None:
    fb = ch10.check_merge_partials(fn)
    assert fb.status == "wrong" and words in fb.message, fb


def test_probe_merge_that_overwrites_the_callers_outs_is_refused() -> None:
    def overwrite(outs, lses):
        lse = torch.logsumexp(torch.stack(lses), 0)
        for i in range(len(outs)):
            outs[i] = torch.exp(lses[i] - lse)[..., None] * outs[i]
        return sum(outs)

    fb = ch10.check_merge_partials(overwrite)
    assert fb.status == "wrong" and "changed its input `outs`, a list of tensors, in place" in fb.message, fb


def test_probe_append_computed_in_float32_on_float64_is_refused_by_the_dtype_rule() -> None:
    import torch.nn.functional as F

    from attnlib import causal_mask, repeat_kv

    def float32_inside(q, kc, vc, kn, vn):
        k = torch.cat([kc, kn], 2); v = torch.cat([vc, vn], 2); H = q.shape[1]
        o = F.scaled_dot_product_attention(q.float(), repeat_kv(k, H).float(), repeat_kv(v, H).float(),
                                           attn_mask=causal_mask(q.shape[2], S_k=k.shape[2]))
        return o.to(q.dtype), k, v

    fb = ch10.check_append_and_attend(float32_inside)
    assert fb.status == "wrong" and "carries only float32's precision" in fb.message, fb
    assert "casting back does not restore the digits" in fb.message, fb


# ---- probe 2: learner-style slips that met a raw error, a misnamed hint or the full recipe ----------

def _probe2_square_mask(q, kc, vc, kn, vn):
    import torch.nn.functional as F

    from attnlib import causal_mask
    k = torch.cat([kc, kn], 2); v = torch.cat([vc, vn], 2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(k.shape[2]), enable_gqa=True), k, v


def _probe2_keys_transposed_1_2(q, kc, vc, kn, vn):
    k = torch.cat([kc, kn], 2); v = torch.cat([vc, vn], 2); g = q.shape[1] // k.shape[1]
    K, V = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scores = q @ K.transpose(1, 2) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, -1) @ V, k, v


def _probe2_no_repeat(q, kc, vc, kn, vn):
    k = torch.cat([kc, kn], 2); v = torch.cat([vc, vn], 2)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v, k, v


@pytest.mark.parametrize("fn, words, absent", [
    (_probe2_square_mask, "your mask is square, one row per key, as causal_mask(S_k) builds", "your code raised"),
    (lambda q, kc, vc, kn, vn: (kc.append(kn),), "are tensors, not Python lists, so they have no .append", "your code raised"),
    (_probe2_keys_transposed_1_2, "your keys were transposed on the wrong axes. .transpose(1, 2) swaps the head axis",
     "repeat_kv"),
    (_probe2_no_repeat, "repeat them to H only for the attention itself", "transposed on the wrong axes"),
])
def test_probe2_append_names_the_square_mask_the_list_append_and_the_transposed_keys(fn, words: str, absent: str) -> None:
    fb = ch10.check_append_and_attend(fn)
    assert fb.status == "wrong" and words in fb.message and absent not in fb.message, fb


def _probe2_lse_over_last_axis(outs, lses):
    lse = torch.logsumexp(torch.stack(lses), -1)  # over the single query, not the chunks
    return sum(torch.exp(l - lse)[..., None] * o for o, l in zip(outs, lses))


def _probe2_weight_without_trailing_axis(outs, lses):
    lse = torch.logsumexp(torch.stack(lses), 0)
    return sum(torch.exp(l - lse) * o for o, l in zip(outs, lses))


def _probe2_merge(outs, lses):
    lse = torch.logsumexp(torch.stack(lses), 0)
    return sum(torch.exp(l - lse)[..., None] * o for o, l in zip(outs, lses))


@pytest.mark.parametrize("fn, words, absent", [
    (_probe2_lse_over_last_axis, "your logsumexp runs over the last axis of torch.stack(lses)", "[..., None]"),
    (_probe2_weight_without_trailing_axis, "keep a trailing axis on the weight, exp(lse_i - lse)[..., None]",
     "runs over the last axis"),
    (lambda outs, lses: _probe2_merge(outs, lses).numpy(), "should be a torch.Tensor, got a numpy.ndarray", "differs"),
    (lambda outs, lses: _probe2_merge(outs, lses).double().numpy(), "its values are right", "differs"),
    (lambda outs, lses: sum(math.exp(l) * o for o, l in zip(outs, lses)), "they work on ONE Python number",
     "The math module's functions"),
])
def test_probe2_merge_names_the_reduced_axis_and_a_numpy_result(fn, words: str, absent: str) -> None:
    fb = ch10.check_merge_partials(fn)
    assert fb.status == "wrong" and words in fb.message and absent not in fb.message, fb


def test_probe2_merge_with_wrong_values_as_numpy_is_not_told_its_values_are_right() -> None:
    fb = ch10.check_merge_partials(lambda outs, lses: (sum(outs) / len(outs)).numpy())
    assert fb.status == "wrong" and "torch.Tensor" in fb.message and "values are right" not in fb.message, fb


@pytest.mark.parametrize("fn", [
    lambda L, lat, r, hd: ((lat + r) * L * 2, (lat + r) * 2 / (2 * hd)),  # MLA's side in bytes
    lambda L, lat, r, hd: ((lat + r) * L * 2, (lat + r) / hd),  # the GQA head without its value
])
def test_probe2_mla_heads_twice_too_many_names_both_causes(fn) -> None:
    fb = ch10.check_mla_cache(fn)
    assert fb.status == "wrong" and "a key AND a value" in fb.message and "counted in bytes" in fb.message, fb


@pytest.mark.parametrize("fn", [
    lambda n: 2 * 24 * 96 * min(n, 2048) * 2,  # the 4 key/value heads left out
    lambda n: 2 * 24 * 4 * 24 * min(n, 2048) * 2,  # 96 read as the width of all heads together
])
def test_probe2_window_cache_without_the_kv_heads_is_named(fn) -> None:
    fb = ch10.check_window_cache_bytes(fn)
    assert fb.status == "wrong" and "a quarter of the answer" in fb.message and "96 is the width of EACH" in fb.message, fb
    assert "count 2 x layers x KV heads" not in fb.message, fb


def test_probe2_decode_intensity_with_layer_bytes_default_names_activations() -> None:
    fb = ch10.check_decode_intensity(lambda D, H, H_kv, S, b: b * ch10.layer_flops(D, H, H_kv, 1, S) / (
        ch10.layer_bytes(D, H, H_kv, 1, S) + (b - 1) * 2 * H_kv * (D // H) * S * 2))
    assert fb.status == "wrong" and "its default activations=True" in fb.message and "Bytes: the weights" not in fb.message, fb


# ---- round fix-c10: the latent counted twice, units, the last query alone, the dtype rule in the merge ----------


@pytest.mark.parametrize("fn, words", [
    # the latent counted twice in the bytes only, the heads right or wrong
    (lambda L, lat, r, hd: ((2 * lat + r) * L * 2, (lat + r) / (2 * hd)), "your bytes per token are off: you cached the latent twice"),
    (lambda L, lat, r, hd: ((2 * lat + r) * L * 2, (2 * lat + r) / hd), "your bytes per token are off: you cached the latent twice"),
    # ... in the heads only
    (lambda L, lat, r, hd: ((lat + r) * L * 2, (2 * lat + r) / (2 * hd)), "your equivalent heads are off: you cached the latent twice"),
    # latent and rotary key both doubled, heads right: the same bytes as 4 bytes per number, both causes named
    (lambda L, lat, r, hd: (2 * (lat + r) * L * 2, (lat + r) / (2 * hd)), "cached the latent and the rotary key twice"),
    (lambda L, lat, r, hd: ((lat + r) * L * 2 / 1024, (lat + r) / (2 * hd)), "in KiB"),
    (lambda L, lat, r, hd: ((lat + r) * L * 2 / 2**20, (lat + r) / (2 * hd)), "in MiB"),
    (lambda L, lat, r, hd: ((lat + r) * L * 2, (lat + r) / (4 * hd)), "4 x head_dim, a GQA head's BYTES"),
])
def test_mla_latent_twice_units_and_4_head_dim_are_named(fn, words: str) -> None:
    fb = ch10.check_mla_cache(fn)
    assert fb.status == "wrong" and words in fb.message, fb
    assert "Multiply by the layers and by 2 bytes" not in fb.message, fb


def test_append_names_the_last_query_alone() -> None:
    import torch.nn.functional as F

    from attnlib import repeat_kv

    def last_query(q, kc, vc, kn, vn):
        k = torch.cat([kc, kn], 2); v = torch.cat([vc, vn], 2); H = q.shape[1]
        return F.scaled_dot_product_attention(q[:, :, -1:], repeat_kv(k, H), repeat_kv(v, H)), k, v

    fb = ch10.check_append_and_attend(last_query)
    assert fb.status == "wrong" and "all S_new new tokens are queries" in fb.message, fb


def test_merge_computed_in_float32_on_float64_is_refused_by_the_dtype_rule() -> None:
    def float32_inside(outs, lses):
        dtype = outs[0].dtype
        outs, lses = [o.float() for o in outs], [l.float() for l in lses]
        lse = torch.logsumexp(torch.stack(lses), 0)
        return sum(torch.exp(l - lse)[..., None] * o for o, l in zip(outs, lses)).to(dtype)

    fb = ch10.check_merge_partials(float32_inside)
    assert fb.status == "wrong" and "carries only float32's precision" in fb.message, fb
    assert "casting back does not restore the digits" in fb.message, fb
    # upcasting 16-bit partials to float32 (or wider) stays right
    def upcast(outs, lses):
        wide = [o.float() if o.dtype in (torch.float16, torch.bfloat16) else o for o in outs]
        wl = [l.float() if l.dtype in (torch.float16, torch.bfloat16) else l for l in lses]
        lse = torch.logsumexp(torch.stack(wl), 0)
        return sum(torch.exp(l - lse)[..., None] * o for o, l in zip(wide, wl))

    assert ch10.check_merge_partials(upcast).passed


@pytest.mark.parametrize("size, pad, window", [((32, 4, 4), 0, None), ((32, 4, 1), 3, 3), ((48, 6, 3), 3, 3)])
def test_chunked_decoding_equals_one_causal_pass_with_padding_and_a_window(size, pad, window) -> None:
    assert ch10.chunked_decoding_error(*size, seed=1, pad=pad, window=window) < 1e-6
    assert ch10.chunked_decoding_error(*size, seed=1, pad=pad, window=window, dtype=torch.float64) < 1e-12


# ---- the expert reading of December 2026 ----


def test_append_accepts_an_output_wider_than_the_inputs() -> None:
    """'Compute in the inputs' dtype or wider': a float64 output of float32 inputs is right."""
    def wide(q, kc, vc, kn, vn):
        out, keys, values = ch10.reference_append_and_attend(q.double(), kc.double(), vc.double(), kn.double(), vn.double())
        return out, keys.to(kc.dtype), values.to(vc.dtype)

    assert ch10.check_append_and_attend(wide).passed


def test_decode_intensity_success_states_the_real_ceiling() -> None:
    """The ceiling of the intensity as the batch grows is each sequence's FLOPs over its cache bytes
    (8.27 and 5.92 on the checker's cases), not H / H_kv = 4, which is attention's part only."""
    message = ch10.check_decode_intensity(ch10.reference_decode_intensity).message
    for D, H, H_kv, S, _ in ch10.INTENSITY_CASES:
        limit = ch10.reference_decode_intensity(D, H, H_kv, S, 10**12)
        assert f"{limit:.2f}" in message
    assert "8.27 and 5.92" in message and "about H / H_kv FLOPs per byte" not in message


def test_window_case_tells_the_group_size_from_the_kv_heads() -> None:
    m = ch10._WINDOW_MODEL
    assert m["heads"] // m["kv_heads"] != m["kv_heads"]  # else the group size passes for H_kv
    group = lambda seq_len: 2 * 24 * (m["heads"] // m["kv_heads"]) * 96 * min(seq_len, 2048) * 2
    fb = ch10.check_window_cache_bytes(group)
    assert fb.status == "wrong" and "H / H_kv" in fb.message, fb


@pytest.mark.parametrize("fn, words", [
    (lambda seq_len: 2 * 24 * 12 * 96 * min(seq_len, 2048) * 4, "4 bytes per number, as for float32"),
    (lambda seq_len: 2 * 24 * 4 * 96 * min(seq_len - 1, 2048) * 2, "seq_len - 1 positions"),
    (lambda seq_len: 2 * 24 * 4 * 96 * min(seq_len, 2048) * 2 / 1024, "those are KiB"),
])
def test_window_slips_of_the_expert_reading_are_named(fn, words: str) -> None:
    fb = ch10.check_window_cache_bytes(fn)
    assert fb.status == "wrong" and words in fb.message, fb


def _intensity_of(flops_scale=1.0, cache_extra=0, heads_for_flops=None, w_o=True):
    def fn(D, H, Hk, S, b):
        d_k = D // H
        flops = b * (ch10.layer_flops(D, H, heads_for_flops or Hk, 1, S) - (0 if w_o else 2 * D * D))
        weights = ((2 if w_o else 1) * D * D + 2 * D * Hk * d_k) * 2
        return flops_scale * flops / (weights + b * 2 * Hk * d_k * (S + cache_extra) * 2)
    return fn


@pytest.mark.parametrize("fn, words", [
    (_intensity_of(flops_scale=0.5), "a multiply-add as 1 FLOP"),
    (_intensity_of(cache_extra=1), "not S + 1"),
    (lambda D, H, Hk, S, b: _intensity_of(heads_for_flops=H)(D, H, Hk, S, b), "pass H_kv to layer_flops"),
    (_intensity_of(w_o=False), "you left out the output projection W_O"),
])
def test_decode_intensity_slips_of_the_expert_reading_are_named(fn, words: str) -> None:
    fb = ch10.check_decode_intensity(fn)
    assert fb.status == "wrong" and words in fb.message, fb


@pytest.mark.parametrize("fn, words", [
    (lambda layers, latent, rope, head_dim: ((latent + rope) * layers * 2, round((latent + rope) / (2 * head_dim))),
     "with round()"),
    (lambda layers, latent, rope, head_dim: ((latent * layers + rope) * 2, (latent + rope) / (2 * head_dim)),
     "rotary key once for the whole model"),
])
def test_mla_slips_of_the_expert_reading_are_named(fn, words: str) -> None:
    fb = ch10.check_mla_cache(fn)
    assert fb.status == "wrong" and words in fb.message, fb


def _merge_keepdim(outs, lses):
    lse = torch.logsumexp(torch.stack(lses), 0, keepdim=True)
    return sum(torch.exp(l - lse)[..., None] * o for o, l in zip(outs, lses))


def _merge_mean(outs, lses):
    lse = torch.logsumexp(torch.stack(lses), 0)
    return torch.stack([torch.exp(l - lse)[..., None] * o for o, l in zip(outs, lses)]).mean(0)


@pytest.mark.parametrize("fn, words", [
    (_merge_keepdim, "[1, B, H, 1, D_v]"),
    (_merge_mean, ".mean(0)"),
])
def test_merge_slips_of_the_expert_reading_are_named(fn, words: str) -> None:
    fb = ch10.check_merge_partials(fn)
    assert fb.status == "wrong" and words in fb.message, fb


def _append_variant(kind):
    def fn(q, kc, vc, kn, vn):
        keys, values = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2)
        H, S_new, S_k = q.shape[1], q.shape[2], keys.shape[2]
        mask = ch10.causal_mask(S_new, S_k=S_k)
        scores = q @ ch10.repeat_kv(keys, H).transpose(-2, -1) / math.sqrt(q.shape[-1])
        if kind == "after":
            weights = scores.softmax(-1) * mask
        elif kind == "self":
            own = torch.cat([torch.ones(S_new, S_k - S_new, dtype=torch.bool), torch.eye(S_new, dtype=torch.bool)], 1)
            weights = scores.masked_fill(~own, float("-inf")).softmax(-1)
        elif kind == "tril":
            weights = scores.masked_fill(~torch.tril(torch.ones(S_new, S_new, dtype=torch.bool)), float("-inf")).softmax(-1)
        else:
            weights = scores.masked_fill(~mask, float("-inf")).softmax(1 if kind == "heads" else -1)
        out = weights @ ch10.repeat_kv(values, H)
        if kind == "merged":
            out = out.transpose(1, 2).reshape(q.shape[0], S_new, -1)
        return out, keys, values
    return fn


@pytest.mark.parametrize("kind, words", [
    ("after", "after the softmax"),
    ("self", "only itself"),
    ("tril", "torch.tril(torch.ones(S_new, S_new))"),
    ("merged", "[B, S_new, H * D_k]"),
    ("heads", "over the heads axis"),
])
def test_append_slips_of_the_expert_reading_are_named(kind, words: str) -> None:
    fb = ch10.check_append_and_attend(_append_variant(kind))
    assert fb.status == "wrong" and words in fb.message, fb


def test_decode_intensity_without_the_weights_is_named() -> None:
    """A learner probe's bytes of the caches alone got the generic recipe; it is named now."""

    def caches_only(D, H, H_kv, S, batch):
        return batch * ch10.layer_flops(D, H, H_kv, 1, S) / (batch * 2 * H_kv * (D // H) * S * 2)

    fb = ch10.check_decode_intensity(caches_only)
    assert fb.status == "wrong" and "caches' bytes only" in fb.message, fb


def test_merge_that_drops_the_query_axis_is_named() -> None:
    """Softmax over concatenated lse values, then .sum(-2) without keepdim: right values, [B, H, D_v]."""

    def dropped(outs, lses):
        w = torch.softmax(torch.cat(lses, dim=-1), dim=-1)  # [B, H, chunks]
        return (w.unsqueeze(-1) * torch.cat(outs, dim=-2)).sum(-2)  # [B, H, D_v]

    fb = ch10.check_merge_partials(dropped)
    assert fb.status == "wrong" and "query axis is gone" in fb.message, fb


# ---- probe 3: hints that fit the reader's code (in-place items, plain sum, units) ----------------

def _merge_scaling_items_in_place(outs, lses):
    lse = torch.logsumexp(torch.stack(lses), 0)
    for o, l in zip(outs, lses):
        o.mul_(torch.exp(l - lse)[..., None])  # changes the caller's partial outputs
    return sum(o.clone() for o in outs)


def _merge_dividing_an_item(outs, lses):
    outs[0] /= 1.0001
    return ch10.reference_merge_partials(outs, lses)


@pytest.mark.parametrize("fn", [_merge_scaling_items_in_place, _merge_dividing_an_item])
def test_merge_in_place_on_items_of_the_list_gets_a_hint_for_a_list(fn) -> None:
    fb = ch10.check_merge_partials(fn)
    assert fb.status == "wrong" and "a tensor inside its input `outs`, a list of tensors" in fb.message, fb
    assert "outs = outs /" not in fb.message and "torch.exp(outs)" not in fb.message, fb
    assert "new list" in fb.message and "new tensor" in fb.message, fb


def test_in_place_hint_for_a_single_tensor_is_unchanged() -> None:
    from attnbook.feedback import in_place_message
    assert in_place_message("q") == (
        "your function changed its input `q` in place (an in-place operation such as `q /= ...`, `q.div_(...)`, "
        "`q.exp_()` or `q.unsqueeze_(0)`), which silently corrupts the caller's tensor. Compute on a new tensor "
        "instead: `q = q / ...`, `torch.exp(q)`, `q.unsqueeze(0)`.")


def test_merge_plain_sum_hint_does_not_talk_about_a_softmax() -> None:
    fb = ch10.check_merge_partials(lambda outs, lses: sum(outs))
    assert fb.status == "wrong" and "weight 1 each" in fb.message, fb
    assert "softmax" not in fb.message, fb


def test_window_bytes_in_decimal_gigabytes_are_named() -> None:
    fb = ch10.check_window_cache_bytes(lambda S: ch10.reference_window_cache_bytes(S) / 1e9)
    assert fb.status == "wrong" and "decimal gigabytes" in fb.message, fb


def test_intensity_in_flops_per_bit_is_named() -> None:
    fb = ch10.check_decode_intensity(lambda *c: ch10.reference_decode_intensity(*c) / 8)
    assert fb.status == "wrong" and "you counted bits" in fb.message, fb


@pytest.mark.parametrize("fn, words", [
    (lambda l, L, r, d: ((L + r) * l * 2, (L + r) * 2 / (2 * d)), "MLA's side was counted in bytes"),
    (lambda l, L, r, d: ((L + r) * l * 2, (L + r) / (4 * d)), "one side is in numbers and the other in bytes"),
])
def test_mla_heads_counted_in_mixed_units_are_named(fn, words: str) -> None:
    fb = ch10.check_mla_cache(fn)
    assert fb.status == "wrong" and words in fb.message, fb


def _append_new_first(q, kc, vc, kn, vn):
    """The new positions put in front of the cache, attended with the bottom-right mask."""
    keys, values = torch.cat([kn, kc], 2), torch.cat([vn, vc], 2)
    H, S_new, S_k = q.shape[1], q.shape[2], keys.shape[2]
    mask = ch10.causal_mask(S_new, S_k=S_k)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, ch10.repeat_kv(keys, H), ch10.repeat_kv(values, H), attn_mask=mask)
    return out, keys, values


def test_append_with_the_new_positions_first_is_named() -> None:
    fb = ch10.check_append_and_attend(_append_new_first)
    assert fb.status == "wrong" and "new positions BEFORE the cached ones" in fb.message, fb
    assert "right shape but other numbers" not in fb.message, fb


@pytest.mark.parametrize("fn, words", [
    (lambda S: 2 * 24 * 4 * 96 * 2 * 2048 * 2, "what a buffer of 2 x window"),
    (lambda S: 2 * 24 * 4 * 96 * min(S, 2 * 2048) * 2, "up to 2 x window"),
])
def test_window_cache_as_a_2w_buffer_is_named(fn, words: str) -> None:
    fb = ch10.check_window_cache_bytes(fn)
    assert fb.status == "wrong" and words in fb.message, fb


def test_mla_heads_rounded_to_one_decimal_are_named() -> None:
    fb = ch10.check_mla_cache(lambda l, L, r, d: ((L + r) * l * 2, round((L + r) / (2 * d), 1)))
    assert fb.status == "wrong" and "rounded to one decimal" in fb.message, fb
