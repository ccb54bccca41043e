"""Chapter 11: the paged cache equals the contiguous one exactly, attnlib decoding equals Hugging Face's
own cached decoding token by token, the serving experiments hold, the checkers name every known mistake."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook import ch11, toy_lm
import attnlib
from attnlib import KVCache

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_models() -> dict:
    return ch11.tiny_hf_models()


def test_attnlib_decoding_equals_hugging_face_generate_token_by_token(hf_models: dict) -> None:
    prompt = torch.randint(3, 97, (1, 5), generator=torch.Generator().manual_seed(1))
    for name, model in hf_models.items():
        ids, hf = ch11.hf_cached_logits(model, prompt, 14)  # 19 positions: past Mistral's window of 8
        ours = ch11.attnlib_cached_logits(model, ids[:, :-1], 5)
        assert ours.shape == hf.shape == (14, 97)
        assert torch.allclose(ours, hf, atol=1e-5), name
        assert torch.equal(ours.argmax(-1), ids[0, 5:])  # the same greedy tokens
        if "Llama" in name:  # the paged cache reads exactly the numbers the contiguous one holds
            assert torch.equal(ch11.attnlib_cached_logits(model, ids[:, :-1], 5, paged_block=4), ours)


def test_the_window_matters_in_the_mistral_check(hf_models: dict) -> None:
    mistral = [m for n, m in hf_models.items() if "window" in n][0]
    w = ch11.llama_weights(mistral)
    ids = torch.randint(3, 97, (1, 20), generator=torch.Generator().manual_seed(2))
    windowed = ch11.llama_decode_step(w, ids, [KVCache() for _ in range(w["layers"])])
    full = ch11.llama_decode_step({**w, "window": None}, ids, [KVCache() for _ in range(w["layers"])])
    assert torch.allclose(windowed[:, :8], full[:, :8], atol=1e-6) and not torch.allclose(windowed[:, 8:], full[:, 8:], atol=1e-3)


@pytest.mark.parametrize("block_size, n_prompt, n_new", [(16, 900, 100), (5, 3, 40), (1, 7, 7)])
def test_paged_attention_equals_the_contiguous_cache_exactly(block_size: int, n_prompt: int, n_new: int) -> None:
    torch.manual_seed(0)
    S = n_prompt + n_new
    pool = ch11.BlockPool(-(-S // block_size), block_size, 2, 16)
    seq, cache = ch11.PagedKVCache(pool), KVCache()
    k, v = torch.randn(2, 2, S, 16).unbind(0)  # [H_kv, S, D_k] each
    seq.append(k[:, :n_prompt], v[:, :n_prompt])
    keys, values = cache.update(k[None, :, :n_prompt], v[None, :, :n_prompt])
    for t in range(n_prompt, S):
        seq.append(k[:, t : t + 1], v[:, t : t + 1])
        keys, values = cache.update(k[None, :, t : t + 1], v[None, :, t : t + 1])
    assert pool.blocks_in_use == -(-S // block_size)
    for S_new in (1, 3):
        q = torch.randn(4, S_new, 16)
        assert torch.equal(ch11.paged_attention(q, seq), ch11.contiguous_attention(q, keys[0], values[0]))
    seq.truncate(n_prompt)  # rollback frees the blocks past the prompt
    assert pool.blocks_in_use == -(-n_prompt // block_size) and torch.equal(seq.gather()[0], k[:, :n_prompt])
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        ch11.PagedKVCache(ch11.BlockPool(1, 2, 1, 1)).append(torch.zeros(1, 3, 1), torch.zeros(1, 3, 1))


def test_copy_on_write_and_memory_policies() -> None:
    cow = ch11.cow_demo(prompt_len=50, samples=4, new_tokens=20, block_size=16)
    # 3 shared full prompt blocks; each sample copies the shared partial block (the first writer of it
    # too, since all four share it) and needs one more for tokens 64-69: 3 + 4 x 2
    assert cow == {"shared": 11, "private": 20, "copies": 3, "exact": True}
    waste = ch11.memory_waste([(10, 1)], max_len=64, block_size=4)
    assert waste == pytest.approx({"max-length": 1 - 11 / 64, "doubling": 1 - 11 / 16, "paged": 1 - 11 / 12})
    assert [ch11.reserved_positions("doubling", n) for n in (1, 2, 3, 1024, 1025)] == [1, 2, 4, 1024, 2048]


def test_prefix_cache_reuses_only_full_blocks_of_a_common_prefix() -> None:
    pc = ch11.PrefixCache(4)
    assert pc.admit(list(range(10))) == 0
    assert pc.admit(list(range(9)) + [99]) == 8  # two full blocks shared, the third differs
    assert pc.admit([5] + list(range(1, 10))) == 0  # a different first token changes every later hash
    assert pc.computed_tokens == 10 + 2 + 10 and len(pc.blocks) == 2 + 0 + 2  # full blocks only
    full = ch11.PrefixCache(16)  # a whole prompt in the cache still computes its last token
    assert full.admit(list(range(32))) == 0 and full.admit(list(range(32))) == 31 and full.computed_tokens == 33


def test_continuous_batching_beats_static_batching() -> None:
    reqs = ch11.poisson_arrivals(60, 4.0, ch11.request_mix(60, seed=1), seed=2)
    static, cont = ch11.simulate("static", reqs), ch11.simulate("continuous", reqs)
    assert cont["ttft_mean"] < static["ttft_mean"] and cont["tokens_per_s"] >= static["tokens_per_s"]
    one = [ch11.Request(0.0, 10, 3)]
    cost = ch11.StepCost(10.0, 1.0)
    assert ch11.simulate("static", one, cost=cost)["ttft_mean"] == 20.0  # one prefill step of 10 tokens
    assert ch11.simulate("continuous", one, cost=cost, chunk=4)["ttft_mean"] == 14 + 14 + 12  # prefill in chunks 4, 4, 2


def test_quantisation_round_trips() -> None:
    x = torch.randn(2, 3, 50, 16)
    for scheme, bound in (("int8-token", 0.5 / 127), ("int8-channel", 0.5 / 127), ("fp8", 2**-4)):
        codes, scale = ch11.quantize(x, scheme)
        err = (ch11.dequantize(codes, scale) - x).abs()
        ref = x.abs().amax(-1 if scheme != "int8-channel" else -2, keepdim=True)
        assert (err <= bound * ref + 1e-7).all(), scheme
    assert ch11.quantized_bytes(*ch11.quantize(x, "int8-token")) == x.numel() + 2 * 3 * 50 * 2


def test_speculative_decoding_gives_the_greedy_output() -> None:
    text = toy_lm.load_text()
    vocab = toy_lm.CharVocab(text)
    torch.manual_seed(0)
    target, draft = toy_lm.TinyLM(len(vocab), 32, 2, max_len=64), toy_lm.TinyLM(len(vocab), 16, 2, max_len=64)
    toy_lm.train_next_token(target, vocab.encode(text), causal=True, steps=20)
    prompt = vocab.encode("The dog ")
    for k in (1, 3, 5):
        ids, stats = ch11.speculative_generate(target, draft, prompt, 40, k=k)
        assert torch.equal(ids, target.generate(prompt, 40)), k
        assert stats["target_passes"] <= 1 + 40


def test_sink_attention() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 5, 8).unbind(0)
    sink = torch.tensor([0.5, -1.0])
    plain = ch11.sink_attention(q, k, v)
    assert torch.allclose(plain, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-6)
    very_negative = ch11.sink_attention(q, k, v, sink_logit=torch.tensor([-1e4, -1e4]))
    assert torch.allclose(very_negative, plain, atol=1e-6)
    scores = q @ k.transpose(-2, -1) / 8**0.5
    lse = ch11.sink_logsumexp(scores, sink.view(1, 2, 1))
    assert torch.allclose(lse, torch.log(scores.exp().sum(-1) + sink.view(1, 2, 1).exp()), atol=1e-6)


def test_paging_frame() -> None:
    frame = ch11.paging_frame(10, block_size=8)
    assert "blocks of 8" in frame.caption and frame.panels[0].matrix.shape == (4, 20)
    # the label names both settings, so a slider over steps and block sizes shows each frame apart
    labels = {ch11.paging_frame(s, block_size=b).label for b in (8, 16) for s in (0, 10)}
    assert labels == {"blocks of 8, step 0", "blocks of 8, step 10", "blocks of 16, step 0", "blocks of 16, step 10"}
    for b in (4, 8, 16):
        assert ch11.paging_frame(30, block_size=b).panels[0].matrix.shape == (4, 160 // b)
    # request 0 holds 37 + 10 = 47 positions: its prompt's 5 full blocks 0-4, then block 10, taken at
    # step 3 after requests 1 and 2 had taken 5-9, holding 7 of 8
    row = frame.panels[0].matrix[0]
    assert row[:5].tolist() == [1] * 5 and row[10] == 7 / 8 and (row > 0).sum() == 6
    # a frame depends only on its arguments
    assert ch11.paging_frame(15, block_size=8).caption == ch11.paging_frame(15, block_size=8).caption


@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_simulated_paging_never_moves_or_shares_blocks_and_reuses_freed_ones(block_size: int) -> None:
    previous = None
    for step in range(31):
        tables, lengths, states = ch11.simulate_paging(step, block_size)
        owned = [b for t in tables for b in t]
        assert len(owned) == len(set(owned)), f"a block has two owners at step {step}"
        for t, n, state in zip(tables, lengths, states):
            if state == "running":
                assert len(t) == -(-n // block_size)  # a new block only when the last one is full
        if previous is not None:
            for r, (t, state) in enumerate(zip(tables, states)):
                if state == "running" and previous[2][r] == "running":
                    assert t[: len(previous[0][r])] == previous[0][r], "blocks moved"
        previous = (tables, lengths, states)
    # request 0 finishes at step 12; request 3 arrives at step 14 and takes blocks request 0 held
    freed = set(ch11.simulate_paging(11, block_size)[0][0])
    assert set(ch11.simulate_paging(14, block_size)[0][3]) & freed
    assert ch11.simulate_paging(12, block_size)[2][0] == "finished"


@pytest.mark.parametrize("check, reference, mistakes", [
    (ch11.check_blocks_needed, ch11.reference_blocks_needed, ch11.BLOCKS_MISTAKES),
])
def test_number_checkers(check, reference, mistakes) -> None:
    assert check(reference).passed
    for m in mistakes:
        fb = check(m.compute)
        assert fb.status == "wrong" and fb.message == m.hint, m.name


def test_blocks_mistakes_are_distinct_on_the_cases() -> None:
    # no mistake gives the answer on every case, and no two mistakes give the same numbers on every case
    answer = [ch11.reference_blocks_needed(*c) for c in ch11.BLOCKS_CASES]
    got = {m.name: [m.compute(*c) for c in ch11.BLOCKS_CASES] for m in ch11.BLOCKS_MISTAKES}
    assert all(v != answer for v in got.values())
    assert len({tuple(v) for v in got.values()}) == len(got)
    message = ch11.check_blocks_needed(lambda p, n, b, s: -(-(p + n - s) // b)).message
    assert "prefix's tokens before counting blocks" in message
    assert "-(-" not in message and "shared_prefix // block_size" not in message  # names it, gives no formula


@pytest.mark.parametrize("wrong", [
    lambda p, n, b, s: -(-(p + n) // b) - (s - 1) // b,          # the prefix's blocks off by one
    lambda p, n, b, s: -(-(p + n) // b) - (-(-s // b) - 1),      # ceil(prefix / b) - 1
    lambda p, n, b, s: int((p + n) / b + 0.99) - s // b,         # an approximate ceil
], ids=["(s - 1) // b", "ceil(s / b) - 1", "int(x / b + 0.99)"])
def test_blocks_checker_refuses_answers_right_on_most_cases(wrong) -> None:
    assert ch11.check_blocks_needed(wrong).status == "wrong"


def test_tensor_checkers() -> None:
    assert ch11.check_int8_per_token(ch11.reference_int8_per_token).passed
    for m in ch11.INT8_MISTAKES:
        fb = ch11.check_int8_per_token(m.compute)
        assert fb.status == "wrong" and fb.message == m.hint, m.name
    assert ch11.check_sink_softmax(ch11.reference_sink_softmax).passed
    for m in ch11.SINK_MISTAKES:
        fb = ch11.check_sink_softmax(m.compute)
        assert fb.status == "wrong" and fb.message == m.hint, m.name
    naive = lambda s, k: s.exp() / (s.exp().sum(-1, keepdim=True) + k.view(-1, 1, 1).exp())
    assert "overflow" in ch11.check_sink_softmax(naive).message

    def stub(*a):
        raise NotImplementedError

    for check in (ch11.check_blocks_needed, ch11.check_int8_per_token, ch11.check_sink_softmax):
        assert check(stub).status == "todo"


def test_paged_attention_in_place_merges_runs_of_blocks() -> None:
    torch.manual_seed(0)
    pool = ch11.BlockPool(40, 4, 2, 8)
    a, b = ch11.PagedKVCache(pool), ch11.PagedKVCache(pool)
    k, v = torch.randn(2, 2, 70, 8).unbind(0)
    for c in range(0, 70, 12):  # two requests interleaved: the block table breaks into runs
        a.append(k[:, c : c + 12], v[:, c : c + 12])
        b.append(k[:, c : c + 12], v[:, c : c + 12])
    assert a.block_table[:4] == [0, 1, 2, 6]
    q = torch.randn(6, 1, 8)
    assert torch.allclose(ch11.paged_attention_in_place(q, a), ch11.paged_attention(q, a), atol=1e-6)


def test_sink_model_attention_weights_match_its_forward_pass() -> None:
    torch.manual_seed(0)
    for sink in (False, True):
        model = ch11.SinkLM(20, d_model=16, num_heads=2, layers=2, sink=sink)
        if sink:
            for block in model.blocks:
                block.sink.data.normal_()
        ids = torch.randint(0, 20, (1, 9))
        weights = model.attention_weights(ids)
        assert len(weights) == 2 and all(w.shape == (1, 2, 9, 9 + sink) for w in weights)
        for w in weights:
            assert torch.allclose(w.sum(-1), torch.ones(1, 2, 9))
            assert (w[..., :9].triu(1) == 0).all()  # causal
        # layer 0's weights, recomputed by hand, and the same weights reproduce the attention output
        x = model.embed(ids)
        q, k, v = model._qkv(model.blocks[0], x)
        pos = torch.arange(9)
        q, k = ch11.rope(q, pos, 10000.0), ch11.rope(k, pos, 10000.0)
        with torch.no_grad():
            att = ch11.sink_attention(q, k, v, attnlib.causal_mask(9), model.blocks[0].sink)
        assert torch.allclose(weights[0][..., :9] @ v.detach(), att, atol=1e-6)


def test_kivi_roundtrip_groups_keys_per_channel_and_keeps_the_residual() -> None:
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 2, 3, 37, 8, generator=gen).unbind(0)  # [B, H_kv, S, D_k] each
    k_hat, v_hat, nbytes = ch11.kivi_roundtrip(k, v, group=16)
    assert torch.equal(k_hat[..., 32:, :], k[..., 32:, :])  # the 5 newest positions stay unquantised
    for start in (0, 16):  # each complete group has its own per-channel scale
        g = k[..., start : start + 16, :]
        s = g.abs().amax(-2, keepdim=True) / 127
        assert torch.allclose(k_hat[..., start : start + 16, :], torch.round(g / s).clamp(-127, 127) * s)
    s = v.abs().amax(-1, keepdim=True) / 127  # values per token
    assert torch.allclose(v_hat, torch.round(v / s).clamp(-127, 127) * s)
    # int8 codes, one 16-bit scale per channel and group, the 16-bit residual; values: codes and per-token scales
    assert nbytes == 2 * 3 * 32 * 8 + 2 * 3 * 2 * 8 * 2 + 2 * 3 * 5 * 8 * 2 + 2 * 3 * 37 * 8 + 2 * 3 * 37 * 2


# ---------------------------------------------------------------- hazards found by independent tests


def _tiny_llama(**config: object) -> object:
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(vocab_size=11, hidden_size=8, intermediate_size=8, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=64)
    return LlamaForCausalLM(LlamaConfig(**{**kw, **config}))


@pytest.mark.parametrize("config, match", [
    (dict(attention_bias=True), "config.attention_bias = True"),
    (dict(mlp_bias=True), "config.mlp_bias = True"),
    (dict(hidden_act="gelu"), "config.hidden_act = 'gelu'"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}), "rope_type 'llama3'"),
])
def test_llama_decode_step_refuses_a_config_it_does_not_implement(config: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ch11.llama_weights(_tiny_llama(**config))
    with pytest.raises(ValueError, match=match):
        ch11.attnlib_cached_logits(_tiny_llama(**config), torch.tensor([[1, 2, 3]]), 2)


def test_llama_decode_step_requires_one_cache_per_layer() -> None:
    w = ch11.llama_weights(_tiny_llama())
    ids = torch.tensor([[1, 2, 3]])
    shared = KVCache()
    with pytest.raises(ValueError, match=r"caches\[1\] is the same object"):
        ch11.llama_decode_step(w, ids, [shared, shared])
    assert shared.length == 0
    with pytest.raises(ValueError, match="a list of 2 caches, one per layer"):
        ch11.llama_decode_step(w, ids, [KVCache()])
    with pytest.raises(ValueError, match=r"ids must be one sequence \[1, S_new\]"):
        ch11.llama_decode_step(w, torch.tensor([[1], [2]]), [KVCache(), KVCache()])
    with pytest.raises(ValueError, match="model must be a Hugging Face LlamaForCausalLM"):
        ch11.llama_weights(torch.nn.Linear(2, 2))


def test_static_batching_charges_no_empty_step_after_a_one_token_batch() -> None:
    cost = ch11.StepCost(10.0, 1.0)
    two = [ch11.Request(0.0, 10, 1), ch11.Request(0.0, 10, 1)]
    r = ch11.simulate("static", two, max_batch=1, cost=cost)
    assert r["ttft_mean"] == (20 + 40) / 2  # the second batch's prefill starts as soon as the first ends
    assert math.isnan(r["tpot_mean"]) and math.isnan(r["gap_max"])  # nobody has a second token


def test_simulate_refuses_what_cannot_finish() -> None:
    one = [ch11.Request(0.0, 10, 3)]
    with pytest.raises(ValueError, match="output must be a positive int, got 0"):
        ch11.Request(0.0, 10, 0)
    with pytest.raises(ValueError, match="prompt must be a positive int, got -3"):
        ch11.Request(0.0, -3, 2)
    with pytest.raises(ValueError, match="chunk must be a positive int, got 0"):
        ch11.simulate("continuous", one, chunk=0)
    with pytest.raises(ValueError, match="max_batch must be a positive int, got 0"):
        ch11.simulate("static", one, max_batch=0)
    with pytest.raises(ValueError, match="policy must be one of 'static', 'continuous'"):
        ch11.simulate("greedy", one)
    with pytest.raises(ValueError, match="requests must be a non-empty sequence"):
        ch11.simulate("static", [])
    with pytest.raises(ValueError, match="fixed_ms must be > 0"):
        ch11.StepCost(0.0, 1.0)


def test_poisson_arrivals_returns_n_requests_or_refuses() -> None:
    assert len(ch11.poisson_arrivals(5, 2.0, [(3, 2)] * 5, seed=0)) == 5
    with pytest.raises(ValueError, match=r"mix holds 3 \(prompt, output\) pairs but n = 5"):
        ch11.poisson_arrivals(5, 2.0, [(3, 2)] * 3, seed=0)
    with pytest.raises(ValueError, match="rate_per_s must be > 0"):
        ch11.poisson_arrivals(1, 0.0, [(3, 2)], seed=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_quantisation_computes_in_float32_whatever_the_cache_dtype(dtype: torch.dtype) -> None:
    x = (torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    for scheme in ("int8-token", "int8-channel", "fp8"):
        codes, scale = ch11.quantize(x, scheme)
        codes32, scale32 = ch11.quantize(x.float(), scheme)
        assert scale.dtype == torch.float32 and torch.equal(scale, scale32)
        assert torch.equal(codes.view(torch.int8), codes32.view(torch.int8))  # every code, not most of them
    zeros = torch.zeros(1, 2, 4, 8, dtype=torch.float16)  # a zero position: 0 / scale, never 0 / 0
    for scheme in ("int8-token", "int8-channel", "fp8"):
        assert torch.equal(ch11.dequantize(*ch11.quantize(zeros, scheme)), zeros.float())
    k_hat, v_hat, _ = ch11.kivi_roundtrip(x[..., :40, :], x[..., :40, :], group=16)
    assert k_hat.dtype == v_hat.dtype == torch.float32 and torch.isfinite(k_hat).all()


def test_float8_subnormals_round_to_zero_as_the_docstring_says() -> None:
    x = torch.tensor([[448.0, 1.0, 2.0**-6, 2.0**-11]], dtype=torch.float64)  # one position, scale 448 / 448 = 1
    back = ch11.dequantize(*ch11.quantize(x, "fp8"))[0]
    assert back[0] == 448.0 and back[2] == x[0, 2]  # the top and the smallest normal are exact
    assert back[3] == 0.0  # below 2^-10 of the scale: rounds to 0
    assert "subnormal" in ch11.quantize.__doc__ and "round to 0" in ch11.quantize.__doc__


@pytest.mark.parametrize("call, match", [
    (lambda: ch11.kivi_roundtrip(torch.ones(1, 4, 2), torch.ones(1, 4, 2), group=0), "group must be a positive int, got 0"),
    (lambda: ch11.quantize(torch.ones(2, 2), "int4"), "scheme must be one of"),
    (lambda: ch11.dequantize(torch.ones(2, 2), torch.ones(1)), "codes must be int8 or float8_e4m3fn"),
    (lambda: ch11.reserved_positions("paged", -3), "length must be an int >= 0, got -3"),
    (lambda: ch11.reserved_positions("paged", 5, block_size=0), "block_size must be a positive int, got 0"),
    (lambda: ch11.reserved_positions("paged", 3000), "length must be in 0..max_len = 2048"),
    (lambda: ch11.memory_waste([(10, -2)]), r"mix\[0\] must be \(prompt, output\) ints >= 1"),
    (lambda: ch11.memory_waste([(10, 2)], block_size=-16), "block_size must be a positive int, got -16"),
    (lambda: ch11.block_hashes([1, 2, 3], 0), "block_size must be a positive int, got 0"),
    (lambda: ch11.PrefixCache(0), "block_size must be a positive int, got 0"),
    (lambda: ch11.cow_demo(block_size=0), "block_size must be a positive int, got 0"),
    (lambda: ch11.simulate_paging(-1, 8), "steps must be an int >= 0, got -1"),
    (lambda: ch11.paging_frame(3, block_size=0), "block_size must be a positive int, got 0"),
    (lambda: ch11.request_mix(-5), "n must be an int >= 0, got -5"),
    (lambda: ch11.reference_blocks_needed(10, -1, 4, 0), "new_tokens must be an int >= 0, got -1"),
    (lambda: ch11.rope(torch.ones(1, 1, 3, 5), torch.arange(3), 10000.0), "D_k even"),
    (lambda: ch11.sink_attention(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), sink_logit=torch.ones(3)),
     r"sink_logit must be \[H\] = \[2\]"),
    (lambda: ch11.SinkLM(10, d_model=12, num_heads=4), "must be even for rotary positions"),
])
def test_nonsensical_arguments_are_refused_with_their_name(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_streaming_and_speculation_refuse_windows_and_k_that_cannot_be_right() -> None:
    model = ch11.SinkLM(10, d_model=8, num_heads=2, layers=1)
    ids = torch.arange(6)
    with pytest.raises(ValueError, match="window = 4 must be larger than sinks = 4"):
        ch11.stream_loss(model, ids, window=4, sinks=4)
    with pytest.raises(ValueError, match="sinks = 2 needs a window"):
        ch11.stream_loss(model, ids, window=None, sinks=2)
    assert ch11.stream_loss(model, ids, window=3, sinks=1).shape == (5,)
    target, draft = toy_lm.TinyLM(10, d_model=8, num_heads=2, max_len=16), toy_lm.TinyLM(10, d_model=8, num_heads=2, max_len=16)
    with pytest.raises(ValueError, match="k must be a positive int, got 0"):
        ch11.speculative_generate(target, draft, torch.tensor([1, 2, 3]), 4, k=0)
    with pytest.raises(ValueError, match="exceeds the models' max_len = 16"):
        ch11.speculative_generate(target, draft, torch.tensor([1, 2, 3]), 14)


def test_quantize_and_arrivals_refuse_what_they_cannot_represent() -> None:
    with pytest.raises(ValueError, match=r"x must be finite to be quantised; it holds 1 inf or NaN"):
        ch11.quantize(torch.tensor([[1.0, float("inf")]]), "int8-token")
    with pytest.raises(ValueError, match=r"rate_per_s = 1e-320 is too small"):
        ch11.poisson_arrivals(5, 1e-320, [(1, 1)] * 5, 0)


def test_cow_table_checker_accepts_the_reference_and_names_every_mistake() -> None:
    assert ch11.check_cow_table(ch11.reference_cow_table).passed
    for m in ch11.COW_MISTAKES:
        fb = ch11.check_cow_table(lambda *a, m=m: m.compute(*a))
        assert fb.status == "wrong" and fb.message == m.hint, (m.name, fb)
    as_tensor = lambda *a: torch.tensor(ch11.reference_cow_table(*a))
    assert ch11.check_cow_table(as_tensor).passed
    fb = ch11.check_cow_table(lambda *a: [float(x) for x in ch11.reference_cow_table(*a)])
    assert fb.status == "wrong" and "whole numbers" in fb.message


def test_cow_table_checker_is_not_fooled_by_a_reader_who_changes_the_lists() -> None:
    def pops(table, length, block_size, free, n):  # right, but changes its arguments as it goes
        free.sort()
        for p in range(length, length + n):
            i = p // block_size
            if i == len(table):
                table.append(free.pop(0))
            elif p == length:
                table[i] = free.pop(0)
        return table

    # the caller's table is shared with the other sample: changing it in place is named as a mistake
    fb = ch11.check_cow_table(pops)
    assert fb.status == "wrong" and "changed the caller's table and free list" in fb.message, fb
    assert ch11.COW_CASES[0][0] == [7, 2, 5]  # the checker's own cases are unchanged

    def pops_free_only(table, length, block_size, free, n):  # copies the table, sorts the pool in place
        free.sort()
        return ch11.reference_cow_table(table, length, block_size, free, n)

    fb = ch11.check_cow_table(pops_free_only)
    assert fb.status == "wrong" and "caller's free list" in fb.message, fb
    # one case hands over an unsorted free list
    assert any(list(c[3]) != sorted(c[3]) for c in ch11.COW_CASES)


def test_outlier_key_channels_hurt_per_token_scales_only() -> None:
    text = toy_lm.load_text()
    data = toy_lm.CharVocab(text).encode(text)
    tiny, _ = toy_lm.load_trained("target")
    outlier = ch11.with_key_outliers(tiny, channels=(5, 21), factor=20.0)
    with torch.no_grad():
        ids = data[None, :64]
        assert (outlier(ids, causal=True) - tiny(ids, causal=True)).abs().max() < 1e-4  # the same function
    err = {m: {s: ch11.quantized_cache_errors(model, data, s, batch=16)["attention_rel_error"]
               for s in ("int8-token", "int8-channel")} for m, model in (("plain", tiny), ("outlier", outlier))}
    assert err["outlier"]["int8-token"] > 2 * err["plain"]["int8-token"]
    assert abs(err["outlier"]["int8-channel"] / err["plain"]["int8-channel"] - 1) < 0.1
    with pytest.raises(ValueError, match="channels"):
        ch11.with_key_outliers(tiny, channels=(64,))


def test_a_sink_lets_a_head_attend_to_nothing() -> None:
    res = ch11.nothing_to_attend(trials=50)
    assert res["softmax"]["absent"] > 20 * res["sink token"]["absent"]
    assert abs(res["sink token"]["absent"] - res["sink logit"]["absent"]) < 1e-9
    assert res["softmax"]["present"] < res["sink token"]["present"] < 0.05  # the sink costs a little when the marker is there


def test_speculative_counts_the_draft_calls() -> None:
    text = toy_lm.load_text()
    vocab = toy_lm.CharVocab(text)
    tiny, _ = toy_lm.load_trained("target")
    draft, _ = toy_lm.load_trained("draft")
    _, stats = ch11.speculative_generate(tiny, draft, vocab.encode("The books "), 20, k=3)
    rounds = stats["target_passes"] - 1
    assert stats["draft_calls"] >= 1 + stats["proposed"] and stats["draft_calls"] <= 1 + stats["proposed"] + rounds


def test_sink_and_int8_checkers_name_the_leftover_mistakes() -> None:
    def wrong_axis(s, k):
        return torch.exp(s - torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), k.view(1, 1, -1)))

    assert "sink.view(-1, 1, 1)" in ch11.check_sink_softmax(wrong_axis).message

    def unshifted_sink(s, k):
        e = torch.exp(s - s.amax(-1, keepdim=True))
        return e / (e.sum(-1, keepdim=True) + torch.exp(k.view(-1, 1, 1)))

    assert "not from the sink" in ch11.check_sink_softmax(unshifted_sink).message

    def asymmetric(x):
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        step = (hi - lo) / 255
        return torch.round((x - lo) / step) * step + lo

    assert "asymmetric" in ch11.check_int8_per_token(asymmetric).message


def test_learner_probe_mistakes_are_named() -> None:
    """Mistakes written the way a learner writes them get their own hint, not a raw error or a restatement."""
    from fractions import Fraction

    frac = lambda p, n, b, s: Fraction(-(-(p + n) // b) - s // b)  # a Fraction of a whole number of blocks
    assert ch11.check_blocks_needed(frac).passed
    fb = ch11.check_blocks_needed(lambda p, n, b, s: Fraction(p + n, b) - Fraction(s, b))
    assert fb.status == "wrong" and "blocks are allocated whole" in fb.message, fb

    def no_keepdim(x):
        scale = x.abs().amax(dim=-1) / 127
        return torch.round(x / scale).clamp(-127, 127) * scale

    fb = ch11.check_int8_per_token(no_keepdim)
    assert fb.status == "wrong" and "keepdim=True" in fb.message, fb
    fb = ch11.check_int8_per_token(lambda x: ch11.reference_int8_per_token(x).float())
    assert fb.status == "wrong" and "torch.float32" in fb.message and "input's dtype" in fb.message, fb

    def sink_over_queries(s, k):
        return torch.exp(s - torch.logaddexp(torch.logsumexp(s, -2, keepdim=True), k.view(-1, 1, 1)))

    assert "over the queries" in ch11.check_sink_softmax(sink_over_queries).message
    # a tuple is as good as a list, like the other checkers' sequences
    assert ch11.check_cow_table(lambda *a: tuple(ch11.reference_cow_table(*a))).passed
    assert "position order" in ch11.check_cow_table(lambda *a: sorted(ch11.reference_cow_table(*a))).message


def _int8(x, guard=None, times=False, dtype=None):
    y = x.to(dtype) if dtype is not None else x
    amax = y.abs().amax(-1, keepdim=True)
    if guard == "clamp 1e-12":
        amax = amax.clamp_min(1e-12)
    if times:
        return torch.round(y * 127 / amax).clamp(-127, 127) * amax / 127
    scale = amax / 127
    if guard == "where":
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    if guard == "tiny":
        scale = scale.clamp_min(torch.finfo(y.dtype).tiny)
    return torch.round(y / scale).clamp(-127, 127) * scale


@pytest.mark.parametrize("submission, words", [
    (lambda x: _int8(x), "0 / 0"),  # the old solution: NaN at a position of zeros
    (lambda x: _int8(x, "clamp 1e-12"), "in torch.float16 only"),  # its guard rounds to 0 in float16
    (lambda x: _int8(x, "clamp 1e-12", times=True), "x * 127 exceeds"),  # overflows float16
    (lambda x: _int8(x, "where", dtype=torch.float16), "torch.float16, which keeps only about 3"),
    (lambda x: _int8(x, "where", dtype=torch.bfloat16), "torch.bfloat16, which keeps only about 2"),
])
def test_int8_checker_names_zero_positions_and_16_bit_slips(submission, words) -> None:
    fb = ch11.check_int8_per_token(submission)
    assert not fb.passed and words in fb.message, fb


@pytest.mark.parametrize("submission", [
    lambda x: _int8(x, "where"), lambda x: _int8(x, "tiny"),
    # a 16-bit cache computed in float32 and returned in its own dtype (the dtype rule allows the upcast)
    lambda x: _int8(x.float() if x.dtype in (torch.float16, torch.bfloat16) else x, "where").to(x.dtype),
    lambda x: _int8(x.double(), "where"),  # a 16-bit cache returned in float64 is fine
    lambda x: torch.round(x / torch.where(x.abs().amax(-1, keepdim=True) > 0, x.abs().amax(-1, keepdim=True) / 127, 1.0))
    .clamp(-127, 127).to(torch.int8).to(x.dtype) * torch.where(x.abs().amax(-1, keepdim=True) > 0, x.abs().amax(-1, keepdim=True) / 127, 1.0),
])
def test_int8_checker_accepts_zero_safe_answers_in_every_dtype(submission) -> None:
    assert ch11.check_int8_per_token(submission).passed


def test_int8_reference_is_zero_safe_and_the_checker_tries_16_bits() -> None:
    x = torch.zeros(1, 1, 2, 4, dtype=torch.float64)
    x[0, 0, 1] = torch.tensor([1.0, -2.0, 3.0, 0.0], dtype=torch.float64)
    got = ch11.checkers.reference_int8_per_token(x)
    assert torch.equal(got[0, 0, 0], torch.zeros(4, dtype=torch.float64))  # codes 0, not 0 / 0 = NaN
    assert torch.allclose(got[0, 0, 1], x[0, 0, 1], atol=3 / 127 / 2)
    assert {d for _, d, _ in ch11.checkers.INT8_MORE_CASES} == {torch.float64, torch.float16, torch.bfloat16}


def test_sink_checker_tries_16_bit_scores() -> None:
    def unshifted_in_float16(scores, sink):
        e, k = torch.exp(scores - (0 if scores.dtype == torch.float16 else scores.amax(-1, keepdim=True))), sink.view(-1, 1, 1)
        m = 0 if scores.dtype == torch.float16 else scores.amax(-1, keepdim=True)
        return e / (e.sum(-1, keepdim=True) + torch.exp(k - m))

    fb = ch11.check_sink_softmax(unshifted_in_float16)
    assert not fb.passed and "torch.float16" in fb.message and "overflows" in fb.message, fb
    assert ch11.check_sink_softmax(lambda s, k: ch11.checkers._solution_sink(s.double(), k.double())).passed


def test_blocks_and_cow_checkers_name_the_reading_slips() -> None:
    fb = ch11.check_blocks_needed(lambda p, n, b, s: (p + n) / b - s // b)
    assert not fb.passed and "fraction of blocks" in fb.message, fb
    fb = ch11.check_blocks_needed(lambda p, n, b, s: math.ceil((p + n - 1) / b) - s // b)
    assert not fb.passed and "prompt_len + new_tokens - 1" in fb.message, fb

    def fresh_first(table, length, b, free, n):
        free, out, copy_at = sorted(free), list(table), None
        for p in range(length, length + n):
            i = p // b
            if i >= len(out):
                out.append(free.pop(0))
            elif i < len(table) and copy_at is None:
                copy_at = i
        if copy_at is not None:
            out[copy_at] = free.pop(0)
        return out

    def copies_at_fork(table, length, b, free, n):
        free, out = sorted(free), list(table)
        if length % b:
            out[-1] = free.pop(0)
        for p in range(length, length + n):
            if p // b >= len(out):
                out.append(free.pop(0))
        return out

    fb = ch11.check_cow_table(fresh_first)
    assert not fb.passed and "each other's numbers" in fb.message, fb
    fb = ch11.check_cow_table(copies_at_fork)
    assert not fb.passed and "with n = 0" in fb.message, fb


def test_probe_1011_cow_sink_and_int8_slips_are_named() -> None:
    """probe-ch10-11: a copy at every write, a fresh block not owned, the sink on the S_q axis, the sink as
    1 + sink, exp(-sink), softmax x sigmoid(-sink) and asymmetric quantisation each get their own hint;
    the sink's float64 case refuses a float32 result, as the other checkers' float64 cases do."""
    def every_write(table, length, bs, free, n):
        t = list(table); fr = sorted(free)
        for p in range(length, length + n):
            i = p // bs
            if i == len(t): t.append(fr.pop(0))
            else: t[i] = fr.pop(0)
        return t

    def fresh_not_owned(table, length, bs, free, n):
        t = list(table); fr = sorted(free); own = set()
        for p in range(length, length + n):
            i = p // bs
            if i == len(t): t.append(fr.pop(0))  # forgot own.add(i)
            elif i not in own: t[i] = fr.pop(0); own.add(i)
        return t

    fb = ch11.check_cow_table(every_write)
    assert not fb.passed and "Copy a shared block once" in fb.message, fb
    fb = ch11.check_cow_table(fresh_not_owned)
    assert not fb.passed and "a fresh block from the pool" in fb.message, fb

    for submission, words in (
        (lambda s, k: torch.exp(s - torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), k.view(1, 1, -1, 1))), "query axis S_q"),
        (lambda s, k: torch.exp(s - torch.logsumexp(s, -1, keepdim=True)) / (1 + k.view(-1, 1, 1)), "as 1 + sink"),
        (lambda s, k: torch.exp(s - torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), -k.view(-1, 1, 1))), "sign is flipped"),
        (lambda s, k: torch.softmax(s, -1) * torch.sigmoid(-k).view(-1, 1, 1), "not sigmoid(-sink)"),
    ):
        fb = ch11.check_sink_softmax(submission)
        assert not fb.passed and words in fb.message, (words, fb)

    def float32_weights(s, k):  # P5: float32 weights of float64 scores
        s = s.float(); k = k.float()
        return torch.exp(s - torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), k.view(-1, 1, 1)))

    fb = ch11.check_sink_softmax(float32_weights)
    assert not fb.passed and "scores are torch.float64 and you return torch.float32" in fb.message, fb
    # computed in float32 and cast back to float64 is refused by the dtype rule (feedback.computed_narrower)
    fb = ch11.check_sink_softmax(lambda s, k: float32_weights(s, k).to(s.dtype))
    assert not fb.passed and "carries only float32's precision" in fb.message, fb
    # right answers written otherwise still pass: a sink column and a slice, and float32 weights of 16-bit
    # scores (wider than the scores)
    column = lambda s, k: torch.softmax(torch.cat([s, k.view(1, -1, 1, 1).expand(*s.shape[:-1], 1)], -1), -1)[..., :-1]
    assert ch11.check_sink_softmax(column).passed
    assert ch11.check_sink_softmax(lambda s, k: ch11.checkers._solution_sink(s, k) if s.dtype == torch.float64
                                   else float32_weights(s, k)).passed

    def asymmetric(x):
        mn, mx = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        s = torch.where(mx > mn, (mx - mn) / 254, torch.ones_like(mx)); return torch.round((x - mn) / s) * s + mn

    fb = ch11.check_int8_per_token(asymmetric)
    assert not fb.passed and "asymmetric quantisation" in fb.message, fb


def _probe_cow(copy_each_write=False, copy_appended=False):
    """The probe-ch10-11 script's copy-on-write submissions, as written there: its `while ...: ... else:` runs
    the else branch after every append too, so a fresh block is treated as shared at once."""
    def f(table, length, bs, free, n):
        t = list(table)
        fr = list(free)
        fr.sort()
        take = lambda: fr.pop(0)
        own = set()
        for p in range(length, length + n):
            i = p // bs
            while i >= len(t):
                t.append(take())
                if not copy_appended: own.add(len(t) - 1)
            else:
                if copy_each_write or i not in own:
                    t[i] = take(); own.add(i)
        return t
    return f


def test_probe_1011_cow_names_running_out_of_blocks_and_a_fresh_block_copied_at_once() -> None:
    fb = ch11.check_cow_table(_probe_cow(copy_each_write=True))
    assert not fb.passed and "ran out of free blocks" in fb.message and "pop from empty list" in fb.message, fb
    fb = ch11.check_cow_table(_probe_cow(copy_appended=True))
    assert not fb.passed and "copied again at once" in fb.message, fb


# ---- the learner probe of chapters 8-11: generic verdicts and raw errors, each named ----


@pytest.mark.parametrize("fn, words", [
    (lambda prompt_len, new_tokens, block_size, shared_prefix: prompt_len + new_tokens - shared_prefix,
     "you counted positions (tokens), not blocks"),
    (lambda prompt_len, new_tokens, block_size, shared_prefix:
     math.ceil((prompt_len - shared_prefix) / block_size) + math.ceil(new_tokens / block_size),
     "rounded the rest of the prompt and the new tokens up separately"),
])
def test_probe_blocks_slips_are_named(fn, words: str) -> None:
    fb = ch11.check_blocks_needed(fn)
    assert fb.status == "wrong" and words in fb.message, fb


def test_probe_cow_copy_appended_is_named() -> None:
    def appended(table, length, b, free, n):
        t = list(table); f = sorted(free)
        if n == 0:
            return t
        if length % b != 0:
            t.append(f.pop(0))  # the copy appended instead of replacing the shared last entry
        for _ in range(math.ceil((length + n) / b) - len(table)):
            t.append(f.pop(0))
        return t

    fb = ch11.check_cow_table(appended)
    assert fb.status == "wrong" and "you appended the copy of the shared last block" in fb.message, fb


def _probe_scale(x):
    s = x.abs().amax(-1, keepdim=True) / 127
    return torch.where(s > 0, s, torch.ones_like(s))


@pytest.mark.parametrize("fn, words", [
    (lambda x: (torch.round(x / _probe_scale(x)).clamp(-127, 127).to(torch.int8), _probe_scale(x)),
     "you returned the codes and the scale as a pair"),
    (lambda x: torch.round(x / _probe_scale(x)).clamp(-127, 127) * _probe_scale(x).mean(), "dequantised with their mean"),
    (lambda x: torch.max(x.abs(), -1, keepdim=True) / 127 * x,
     "returns a pair (values, indices), a torch.return_types.max, not a tensor"),
])
def test_probe_int8_slips_are_named(fn, words: str) -> None:
    fb = ch11.check_int8_per_token(fn)
    assert fb.status == "wrong" and words in fb.message, fb


@pytest.mark.parametrize("fn, words", [
    (lambda scores, sink: torch.exp(scores - scores.amax(-1, keepdim=True)) / (
        sink[None, :, None, None] + torch.exp(scores - scores.amax(-1, keepdim=True)).sum(-1, keepdim=True)),
     "its term in the denominator is exp(sink[h]), not sink[h]"),
    (lambda scores, sink: torch.exp(scores - torch.maximum(torch.logsumexp(scores, -1, keepdim=True), sink.view(-1, 1, 1))),
     "you combined the row's logsumexp and the sink with a maximum"),
    (lambda scores, sink: scores - torch.logaddexp(torch.logsumexp(scores, -1, keepdim=True), sink.view(-1, 1, 1)),
     "those are the logarithms of the weights"),
    (lambda scores, sink: torch.exp(scores - torch.logaddexp(torch.logsumexp(scores, -1, keepdim=True),
                                                             torch.tensor(float(sink[0]), dtype=scores.dtype))),
     "every head used head 0's sink logit"),
    (lambda scores, sink: torch.exp(scores) / (math.exp(sink) + torch.exp(scores).sum(-1, keepdim=True)),
     "take ONE Python number, and `scores` and `sink` hold many numbers"),
])
def test_probe_sink_slips_are_named(fn, words: str) -> None:
    fb = ch11.check_sink_softmax(fn)
    assert fb.status == "wrong" and words in fb.message, fb


def test_probe_plain_softmax_is_still_told_the_weights_sum_to_1() -> None:
    fb = ch11.check_sink_softmax(lambda scores, sink: torch.softmax(scores, -1))
    assert fb.message.startswith("the weights still sum to 1"), fb


# ---- probe 2 ----------------------------------------------------------------------------------

def _probe2_sink(sc, sink):
    lse = torch.logaddexp(torch.logsumexp(sc, -1, keepdim=True), sink.view(-1, 1, 1))
    return torch.exp(sc - lse)


def _probe2_int8(x):
    s = x.abs().amax(-1, keepdim=True) / 127
    s = torch.where(s > 0, s, torch.ones_like(s))
    return torch.round(x / s).clamp(-127, 127) * s


@pytest.mark.parametrize("fn, words, absent", [
    (lambda sc, sink: torch.exp(sc - torch.logaddexp(torch.logsumexp(sc, -1), sink.view(-1, 1))),
     "torch.logsumexp(scores, -1) without keepdim=True", "the sink lines up"),
    (lambda sc, sink: torch.exp(sc - torch.logaddexp(torch.logsumexp(sc, -1, keepdim=True), sink)),
     "the sink lines up with the key axis S_k", "without keepdim"),
    (lambda sc, sink: _probe2_sink(sc, sink).numpy(), "should be a torch.Tensor, got a numpy.ndarray", "differ"),
    (lambda sc, sink: _probe2_sink(sc, sink).double().numpy(), "its values are right", "differ"),
    (lambda sc, sink: (lambda m: torch.exp(sc - m) / (torch.exp(sc - m).sum(-1, keepdim=True)
                                                      + torch.exp(sink.view(-1, 1, 1))))(sc.amax(-1, keepdim=True)),
     "subtracted the row's max m from the scores but not from the sink", "torch.logaddexp("),
])
def test_probe2_sink_names_keepdim_and_a_numpy_result(fn, words: str, absent: str) -> None:
    fb = ch11.check_sink_softmax(fn)
    assert fb.status == "wrong" and words in fb.message and absent not in fb.message, fb


@pytest.mark.parametrize("fn, words", [
    (lambda x: _probe2_int8(x).numpy(), "its values are right"),
    (lambda x: _probe2_int8(x).double().numpy(), "should be a torch.Tensor, got a numpy.ndarray"),
    (lambda x, bits: _probe2_int8(x), "keep the stub's parameters"),
])
def test_probe2_int8_names_a_numpy_result_and_a_changed_signature(fn, words: str) -> None:
    fb = ch11.check_int8_per_token(fn)
    assert fb.status == "wrong" and words in fb.message and "differs" not in fb.message, fb


def test_probe2_blocks_needed_translates_math_ceil_with_a_divisor() -> None:
    fb = ch11.check_blocks_needed(lambda P, N, b, s: math.ceil(P + N, b))
    assert fb.status == "wrong" and "math.ceil rounds ONE number" in fb.message, fb


# ---- the rare slips, and the dtype rule ---------------------------------------------------------

@pytest.mark.parametrize("fn, words", [
    (lambda p, n, b, s: -(-(p + n) // b) - s, "shared_prefix counts TOKENS of the prompt, not blocks"),
    (lambda p, n, b, s: -(-(p + n) // b) + 1 - s // b, "keeps no spare empty block"),
    (lambda p, n, b, s: math.ceil((p + n) / b) - s // b + 1, "keeps no spare empty block"),
])
def test_blocks_needed_names_a_prefix_in_blocks_and_a_spare_block(fn, words: str) -> None:
    fb = ch11.check_blocks_needed(fn)
    assert fb.status == "wrong" and words in fb.message, fb


def _int8_over(x, dims):
    scale = x.abs().amax(dims, keepdim=True) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x / scale).clamp(-127, 127) * scale


@pytest.mark.parametrize("fn, words", [
    (lambda x: _int8_over(x, (1, 3)), "one scale covers a position in EVERY head"),
    (lambda x: _int8_over(x, 1), "your max runs over the head axis H_kv"),
])
def test_int8_names_scales_taken_across_the_heads(fn, words: str) -> None:
    fb = ch11.check_int8_per_token(fn)
    assert fb.status == "wrong" and words in fb.message, fb


def test_sink_added_to_every_numerator_is_named() -> None:
    def added(scores, sink):
        lse = torch.logaddexp(torch.logsumexp(scores, -1, keepdim=True), sink.view(-1, 1, 1))
        return torch.exp(scores - lse) + torch.exp(sink.view(-1, 1, 1) - lse)

    fb = ch11.check_sink_softmax(added)
    assert fb.status == "wrong" and "to each key's numerator too" in fb.message, fb


def test_int8_and_sink_computed_in_float32_on_float64_are_refused_by_the_dtype_rule() -> None:
    fb = ch11.check_int8_per_token(lambda x: _probe2_int8(x.float()).to(x.dtype))
    assert fb.status == "wrong" and "carries only float32's precision" in fb.message, fb
    fb = ch11.check_sink_softmax(lambda sc, sink: _probe2_sink(sc.float(), sink.float()).to(sc.dtype))
    assert fb.status == "wrong" and "carries only float32's precision" in fb.message, fb
    # upcasting stays right: float64 inside for a 16-bit input, cast back to its dtype
    assert ch11.check_int8_per_token(lambda x: _probe2_int8(x.double()).to(x.dtype)).passed
    assert ch11.check_sink_softmax(lambda sc, sink: _probe2_sink(sc.double(), sink.double()).to(sc.dtype)).passed


def test_float32_results_on_float64_get_a_hint_that_the_dtype_rule_agrees_with() -> None:
    """Returning float32 is told to compute in the input's dtype, not to cast back (which the dtype rule then
    refuses); float32 arithmetic on 16-bit inputs, cast back or not, is accepted, as exercise 11.4 says."""
    fb = ch11.check_int8_per_token(lambda x: _probe2_int8(x.float()))
    assert fb.status == "wrong" and "in x's dtype: leave out the .float() cast" in fb.message, fb
    assert ".to(x.dtype)" not in fb.message and "cast back" not in fb.message, fb
    fb = ch11.check_sink_softmax(lambda sc, sink: _probe2_sink(sc.float(), sink.float()))
    assert fb.status == "wrong" and "compute in the scores' dtype, not in float32" in fb.message, fb
    assert ".to(scores.dtype)" not in fb.message and "cast the result back" not in fb.message, fb

    def upcast_16_bit(f, back):
        def fn(*args):
            if args[0].dtype not in (torch.float16, torch.bfloat16):
                return f(*args)
            out = f(*(a.float() for a in args))
            return out.to(args[0].dtype) if back else out
        return fn

    for back in (True, False):
        assert ch11.check_int8_per_token(upcast_16_bit(_probe2_int8, back)).passed
        assert ch11.check_sink_softmax(upcast_16_bit(_probe2_sink, back)).passed


def _shifted_by_sink(scores, sink):
    e = torch.exp(scores - sink.view(-1, 1, 1))  # safe only while the sink is at least the scores
    return e / (e.sum(-1, keepdim=True) + 1)


def test_sink_checker_refuses_a_shift_by_the_sink() -> None:
    # right wherever the sink is near the scores, so only a case with the sink far below them tells it apart
    scores, sink = ch11.checkers._sink_case(*ch11.SINK_CASES[1])
    assert torch.allclose(_shifted_by_sink(scores, sink), ch11.reference_sink_softmax(scores, sink))
    fb = ch11.check_sink_softmax(_shifted_by_sink)
    assert fb.status == "wrong" and "not by the sink" in fb.message and "float64" in fb.message, fb

    def by_sink_in_float16(scores, sink):  # right in float64; shifts by the sink in 16 bits
        if scores.dtype == torch.float64:
            return ch11.reference_sink_softmax(scores, sink)
        return _shifted_by_sink(scores, sink)

    fb = ch11.check_sink_softmax(by_sink_in_float16)
    assert fb.status == "wrong" and "not by the sink" in fb.message and "float16" in fb.message, fb


def _int8_with(x, scale):
    return torch.round(x / scale).clamp(-127, 127) * scale


@pytest.mark.parametrize("fn, words", [
    (lambda p, n, b, s: p // b + math.ceil(n / b) - s // b, "rounded the prompt's blocks down"),
    (lambda p, n, b, s: (p + n - 1) // b - s // b, "INDEX of the block"),
    (lambda p, n, b, s: math.ceil((p + n) / b) - (s // b + 1), "not one more"),
    (lambda p, n, b, s: math.ceil((p + n) / b) - round(s / b), "round(shared_prefix / block_size)"),
])
def test_blocks_checker_names_the_off_by_one_slips(fn, words: str) -> None:
    fb = ch11.check_blocks_needed(fn)
    assert fb.status == "wrong" and words in fb.message, fb


def _cow_copy_unowned(table, length, b, free, n):  # every write into an entry held at the fork copies
    shared, table, free = len(table), list(table), sorted(free)
    for p in range(length, length + n):
        i = p // b
        if i == len(table):
            table.append(free.pop(0))
        elif i < shared:
            table[i] = free.pop(0)
    return table


def _cow_min_kept(table, length, b, free, n):  # min(free) handed out and never removed
    table, own = list(table), set()
    for p in range(length, length + n):
        i = p // b
        if i == len(table) or i not in own:
            table[i:i + 1] = [min(free)]
            own.add(i)
    return table


@pytest.mark.parametrize("fn, words", [
    (_cow_copy_unowned, "Decide by ownership"),
    (_cow_min_kept, "handed out more than once"),
])
def test_cow_checker_names_copies_and_the_free_list(fn, words: str) -> None:
    fb = ch11.check_cow_table(fn)
    assert fb.status == "wrong" and words in fb.message, fb


@pytest.mark.parametrize("fn, words", [
    (lambda x: _int8_with(x, x.abs().amax(-1, keepdim=True) / 127 + 1e-8), "Do not add an epsilon to the scale"),
    (lambda x: _int8_with(x, x.abs().amax(0, keepdim=True) / 127), "batch axis B"),
    (lambda x: _int8_with(x, 127 / x.abs().amax(-1, keepdim=True)), "inverse of the step"),
])
def test_int8_checker_names_scale_slips(fn, words: str) -> None:
    fb = ch11.check_int8_per_token(fn)
    assert fb.status == "wrong" and words in fb.message, fb


def test_sink_checker_names_scores_scaled_again() -> None:
    fb = ch11.check_sink_softmax(lambda s, k: ch11.reference_sink_softmax(s / math.sqrt(s.shape[-1]), k))
    assert fb.status == "wrong" and "already scaled" in fb.message, fb


def test_sink_diagram_draws_the_chapter_cache_and_the_exercise_example() -> None:
    from attnbook.ch11 import diagrams

    ex = diagrams.sink_cache_example()
    (r0, r1), (e0, e1) = ex["recent"], ex["evicted"]
    assert r1 - r0 + 1 == diagrams.SINK_WINDOW - diagrams.SINK_TOKENS and e0 == diagrams.SINK_TOKENS and e1 == r0 - 1
    w = ch11.reference_sink_softmax(torch.tensor([[[list(diagrams.SINK_SCORES)]]], dtype=torch.float64),
                                    torch.tensor([diagrams.SINK_LOGIT], dtype=torch.float64)).flatten().tolist()
    assert w == pytest.approx(ex["weights"]) and sum(w) + ex["sink_weight"] == pytest.approx(1.0)


def test_the_sink_quiz_question_has_its_own_example_and_right_ranges() -> None:
    """Question 11.7 asks about scores (1, 0) and a sink logit of 2, not the diagram's worked example; its
    ranges hold the first key's weight, the softmax without the sink and the sink's share, each to 2 digits."""
    import json
    from importlib.resources import files

    from attnbook.ch11 import diagrams

    question = json.loads((files("attnbook") / "quizzes" / "11_serving_attention.json").read_text())[6]
    assert "s = (1, 0)" in question["question"] and "sink logit of 2" in question["question"]
    assert (tuple(diagrams.SINK_SCORES), diagrams.SINK_LOGIT) != ((1, 0), 2)
    scores = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)
    w = ch11.reference_sink_softmax(scores, torch.tensor([2.0], dtype=torch.float64)).flatten().tolist()
    assert w[0] == pytest.approx(math.e / (math.e + 1 + math.e**2)) and round(w[0], 4) == 0.2447
    no_sink = torch.softmax(scores, -1).flatten()[0].item()
    sink_share = 1 - sum(w)
    in_range = lambda x, a: a["range"][0] <= float(f"{x:.2g}") < a["range"][1]
    right, plain, share = question["answers"][:3]
    assert right["correct"] and in_range(w[0], right) and not in_range(no_sink, right) and not in_range(sink_share, right)
    assert not plain["correct"] and in_range(no_sink, plain) and "without the sink" in plain["feedback"]
    assert not share["correct"] and in_range(sink_share, share) and "sink's own share" in share["feedback"]


# ---- probe 3: an index rounded up, and hints that do not write the solution line ------------------

def _cow_reader(table, length, block_size, free, n, *, round_up=False, extra=0):
    """A reader's loop, with the entry index rounded up or ``extra`` writes too many."""
    table, free, own = list(table), sorted(free), set()
    for p in range(length, length + n + extra):
        i = math.ceil(p / block_size) if round_up else p // block_size
        if i >= len(table):
            table.append(free.pop(0))
            own.add(i)
        elif i not in own:
            table[i] = free.pop(0)
            own.add(i)
    return table


def _cow_index_rounded_up(*case):
    return _cow_reader(*case, round_up=True)  # should be p // block_size


def test_cow_entry_index_rounded_up_is_named_not_taken_for_a_write_in_place() -> None:
    fb = ch11.check_cow_table(_cow_index_rounded_up)
    assert fb.status == "wrong" and "rounded the entry index up" in fb.message, fb


def test_cow_write_in_place_is_still_named_as_such() -> None:
    fb = ch11.check_cow_table(lambda *c: ch11.checkers._cow(*c, copy=False))
    assert fb.status == "wrong" and "writing into it in place" in fb.message, fb


def _sink_without_exp(scores, sink):
    e = torch.exp(scores - scores.amax(-1, keepdim=True))
    return e / (e.sum(-1, keepdim=True) + sink.view(-1, 1, 1))


def _sink_left_out_of_the_max(scores, sink):
    e = torch.exp(scores - scores.amax(-1, keepdim=True))
    return e / (e.sum(-1, keepdim=True) + torch.exp(sink.view(-1, 1, 1)))


@pytest.mark.parametrize("fn, words", [
    (_sink_without_exp, "its term in the denominator is exp(sink[h]), not sink[h]"),
    (_sink_left_out_of_the_max, "subtracted the row's max m from the scores but not from the sink"),
])
def test_sink_hints_name_the_slip_without_the_solution_line(fn, words: str) -> None:
    fb = ch11.check_sink_softmax(fn)
    assert fb.status == "wrong" and words in fb.message, fb
    assert "torch.logaddexp(torch.logsumexp(scores, -1, keepdim=True), sink.view(-1, 1, 1))" not in fb.message, fb


# ---- hints point at the mistake, not at the solution line ----

def _cow_one_token_too_many(*case):
    return _cow_reader(*case, extra=1)  # range(length, length + n + 1)


def test_cow_loop_one_token_too_long_is_named() -> None:
    fb = ch11.check_cow_table(_cow_one_token_too_many)
    assert fb.status == "wrong" and "one token more than n" in fb.message, fb


def test_blocks_and_sink_hints_give_no_formula() -> None:
    floor = ch11.check_blocks_needed(lambda p, n, b, s: (p + n) // b - s // b).message
    assert "partly filled last block" in floor and "-(-" not in floor, floor
    fallback = ch11.check_blocks_needed(lambda p, n, b, s: 7).message
    assert "20 positions in blocks of 8" in fallback and "ceil" not in fallback, fallback
    for m in ch11.BLOCKS_MISTAKES + ch11.INT8_MISTAKES:
        assert "-(-(prompt_len" not in m.hint and "amax(dim=-1, keepdim=True)" not in m.hint, m.name
    naive = lambda s, k: s.exp() / (s.exp().sum(-1, keepdim=True) + k.view(-1, 1, 1).exp())
    fb = ch11.check_sink_softmax(naive)
    assert "no exponent you compute is above 0" in fb.message and "logaddexp" not in fb.message, fb
    fb = ch11.check_sink_softmax(_shifted_by_sink)
    assert "torch.maximum" not in fb.message and "logaddexp" not in fb.message, fb


# ---- hints point at the fix without handing over its line -----------------------------------------

@pytest.mark.parametrize("fn, words", [
    (lambda p, n, b, s: (p + n) // b + 1 - s // b, "adds nothing when the positions fill their blocks exactly"),
    (lambda p, n, b, s: round((p + n) / b) - s // b, "round up instead"),
    (lambda p, n, b, s: (p + n - 1) // b - s // b, "INDEX of the block"),
])
def test_blocks_needed_rounding_hints_do_not_give_the_rounding_idiom(fn, words: str) -> None:
    fb = ch11.check_blocks_needed(fn)
    assert fb.status == "wrong" and words in fb.message and "-(-x // b)" not in fb.message, fb
    assert ch11.check_blocks_needed(lambda p, n, b, s: math.ceil((p + n) / b) - s // b).passed


@pytest.mark.parametrize("submission, words", [
    (lambda x: _int8(x), "any nonzero scale (only where the scale is 0)"),
    (lambda x: _int8(x, "clamp 1e-12"), "replace only the zero scales"),
    (lambda x: _int8_with(x, x.abs().amax(-1, keepdim=True) / 127 + 1e-8), "giving each of them any nonzero"),
])
def test_int8_zero_guard_hints_do_not_give_the_guard_line(submission, words: str) -> None:
    fb = ch11.check_int8_per_token(submission)
    assert fb.status == "wrong" and words in fb.message, fb
    assert "torch.where" not in fb.message and "ones_like" not in fb.message, fb
    assert ch11.check_int8_per_token(lambda x: _int8(x, "where")).passed
