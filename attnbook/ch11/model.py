"""Chapter 11.7: a Llama/Mistral decoder written with attnlib that takes a Hugging Face model's weights,
checked token by token against the model's own cache."""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlib import KVCache, causal_mask, repeat_kv
from attnlib.paged import BlockPool, PagedKVCache

from ._common import _OneThread, constant_scalar, float_tensor, instance, is_int, positive_int, token_ids

#: Values of the config fields this decoder implements; any other value is refused by :func:`llama_weights`.
SUPPORTED_CONFIG = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}


def _rope_type(config: Any) -> tuple[str, str]:
    """``(field, rope type)``: ``"default"`` unless the config scales RoPE (Llama 3.1+, YaRN, ...)."""
    for field in ("rope_parameters", "rope_scaling"):  # transformers 5.x, 4.x
        params = getattr(config, field, None)
        if isinstance(params, dict) and params.get("rope_type", params.get("type", "default")) != "default":
            return field, str(params.get("rope_type", params.get("type")))
    return "rope_parameters", "default"


def _rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None)  # transformers 5.x
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(config, "rope_theta", 10000.0))  # transformers 4.x


def llama_weights(model: Any) -> dict[str, Any]:
    """The weights of a Hugging Face ``LlamaForCausalLM``/``MistralForCausalLM`` as plain tensors.

    Refuses a model this decoder does not implement, naming the config field: another model type,
    scaled RoPE (``rope_type`` other than ``"default"``, e.g. Llama 3.1's ``"llama3"``), attention or
    MLP biases, an activation other than SiLU.
    """
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) not in ("llama", "mistral") or not hasattr(model, "state_dict"):
        raise ValueError(f"model must be a Hugging Face LlamaForCausalLM or MistralForCausalLM, got {type(model).__name__} "
                         f"(model_type {getattr(cfg, 'model_type', None)!r})")
    field, rope_type = _rope_type(cfg)
    if rope_type != "default":
        raise ValueError(f"config.{field} has rope_type {rope_type!r}: this decoder implements only unscaled RoPE ('default')")
    for field, supported in SUPPORTED_CONFIG.items():
        if getattr(cfg, field, supported) != supported:
            raise ValueError(f"config.{field} = {getattr(cfg, field)!r}: this decoder implements only {field} = {supported!r}")
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {"sd": sd, "layers": cfg.num_hidden_layers, "H": cfg.num_attention_heads, "H_kv": cfg.num_key_value_heads,
            "D_k": head_dim, "eps": cfg.rms_norm_eps, "theta": _rope_theta(cfg),
            "window": getattr(cfg, "sliding_window", None)}


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotate ``x [B, H, S, D_k]`` by its positions ``[S]`` (Llama's rotate-half convention)."""
    d = float_tensor("x", x, min_dim=2).shape[-1]
    if d % 2 or not isinstance(positions, Tensor) or positions.shape != x.shape[-2:-1]:
        raise ValueError(f"rope needs x [..., S, D_k] with D_k even and positions [S], got x {tuple(x.shape)} and "
                         f"positions {tuple(positions.shape) if isinstance(positions, Tensor) else type(positions).__name__}")
    theta = constant_scalar("theta", theta)
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)  # [D_k / 2]
    angles = positions.float()[:, None] * inv_freq[None]  # [S, D_k / 2]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()  # [S, D_k]
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)  # rotate_half
    return x * cos.to(x.dtype) + half * sin.to(x.dtype)


@torch.no_grad()
def llama_decode_step(w: dict[str, Any], ids: Tensor, caches: Sequence[Any]) -> Tensor:
    """Logits ``[1, S_new, V]`` for new tokens ``ids [1, S_new]`` after what ``caches`` (one per layer) hold.

    Each layer caches its keys *after* RoPE, as real models do, in an ``attnlib.KVCache`` or a
    :class:`PagedKVCache`; with a sliding window (Mistral) the KVCache keeps the last ``window``
    positions and the mask lets each query see only those. ``caches`` holds ``w["layers"]`` distinct
    caches of the same length, one per layer.
    """
    instance("w", w, dict, "the dict of llama_weights(model)")
    sd, H, H_kv, D_k, window = w["sd"], w["H"], w["H_kv"], w["D_k"], w["window"]
    token_ids("ids", ids, 2, "[1, S_new]")
    if ids.shape[0] != 1:
        raise ValueError(f"ids must be one sequence [1, S_new], got shape {tuple(ids.shape)}")
    _one_cache_per_layer(caches, w["layers"])
    start = caches[0].length
    S_new = ids.shape[1]
    positions = torch.arange(start, start + S_new)  # [S_new]
    x = sd["model.embed_tokens.weight"][ids]  # [1, S_new, D]
    for i, cache in enumerate(caches):
        p = f"model.layers.{i}."
        h = _rms_norm(x, sd[p + "input_layernorm.weight"], w["eps"])  # [1, S_new, D]
        q = (h @ sd[p + "self_attn.q_proj.weight"].T).view(1, S_new, H, D_k).transpose(1, 2)  # [1, H, S_new, D_k]
        k = (h @ sd[p + "self_attn.k_proj.weight"].T).view(1, S_new, H_kv, D_k).transpose(1, 2)  # [1, H_kv, S_new, D_k]
        v = (h @ sd[p + "self_attn.v_proj.weight"].T).view(1, S_new, H_kv, D_k).transpose(1, 2)  # [1, H_kv, S_new, D_k]
        q, k = rope(q, positions, w["theta"]), rope(k, positions, w["theta"])
        if window is not None and isinstance(cache, KVCache):
            keys, values = cache.update(k, v, window=window)  # [1, H_kv, S_kept + S_new, D_k]
        else:
            keys, values = cache.update(k, v)  # [1, H_kv, S, D_k]
        mask = causal_mask(S_new, S_k=keys.shape[2], window=window)  # [S_new, S_k], bottom-right
        att = F.scaled_dot_product_attention(q, repeat_kv(keys, H), repeat_kv(values, H), attn_mask=mask)  # [1, H, S_new, D_k]
        x = x + att.transpose(1, 2).reshape(1, S_new, H * D_k) @ sd[p + "self_attn.o_proj.weight"].T  # [1, S_new, D]
        h = _rms_norm(x, sd[p + "post_attention_layernorm.weight"], w["eps"])
        gate, up = h @ sd[p + "mlp.gate_proj.weight"].T, h @ sd[p + "mlp.up_proj.weight"].T  # [1, S_new, I]
        x = x + (F.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].T  # [1, S_new, D]
    x = _rms_norm(x, sd["model.norm.weight"], w["eps"])
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return x @ head.T  # [1, S_new, V]


def _one_cache_per_layer(caches: Sequence[Any], layers: int) -> None:
    if not isinstance(caches, (list, tuple)) or len(caches) != layers:
        raise ValueError(f"caches must be a list of {layers} caches, one per layer, got {caches!r:.80}")
    for i, cache in enumerate(caches):
        instance(f"caches[{i}]", cache, (KVCache, PagedKVCache), "an attnlib.KVCache or a PagedKVCache")
        if any(cache is other for other in caches[:i]):
            raise ValueError(f"caches[{i}] is the same object as an earlier cache: every layer needs its own cache")
        if cache.length != caches[0].length:
            raise ValueError(f"the caches hold different lengths ({[c.length for c in caches]}): one sequence, one per layer")


@torch.no_grad()
def hf_cached_logits(model: Any, prompt: Tensor, new_tokens: int) -> tuple[Tensor, Tensor]:
    """The model's own cached path: greedy ``generate`` from ``prompt [1, S0]``.

    Returns ``(ids [1, S0 + new_tokens], logits [new_tokens, V])``: the raw logits from which each new
    token was chosen (``output_logits``, available in transformers 4.38 and later).
    """
    token_ids("prompt", prompt, 2, "[1, S0]")
    new_tokens = positive_int("new_tokens", new_tokens)
    with _OneThread():
        out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, attention_mask=torch.ones_like(prompt))
    return out.sequences, torch.cat(out.logits)  # [1, S], [new_tokens, V]


@torch.no_grad()
def attnlib_cached_logits(model: Any, ids: Tensor, prompt_len: int, *, paged_block: int | None = None) -> Tensor:
    """Decode ``ids [1, S]`` with :func:`llama_decode_step`: the prompt in one call, then one token per call,
    with ``attnlib.KVCache`` (or a paged cache of ``paged_block`` positions per block).

    Returns the logits that predict positions ``prompt_len .. S``: ``[S - prompt_len + 1, V]``.
    """
    w = llama_weights(model)
    token_ids("ids", ids, 2, "[1, S]")
    if not 1 <= positive_int("prompt_len", prompt_len) <= ids.shape[1]:
        raise ValueError(f"prompt_len must be in 1..{ids.shape[1]} (the positions of ids), got {prompt_len!r}")
    paged_block = None if paged_block is None else positive_int("paged_block", paged_block)
    if paged_block is None:
        caches: list[Any] = [KVCache() for _ in range(w["layers"])]
    else:
        blocks = -(-ids.shape[1] // paged_block)
        caches = [PagedKVCache(BlockPool(blocks, paged_block, w["H_kv"], w["D_k"])) for _ in range(w["layers"])]
    with _OneThread():
        rows = [llama_decode_step(w, ids[:, :prompt_len], caches)[0, -1:]]
        for t in range(prompt_len, ids.shape[1]):
            rows.append(llama_decode_step(w, ids[:, t : t + 1], caches)[0])
    return torch.cat(rows)  # [S - prompt_len + 1, V]


def tiny_hf_models(seed: int = 0, window: int = 8) -> dict[str, Any]:
    """A randomly initialised Llama (GQA: 4 query heads, 2 key/value heads; RoPE) and a Mistral with a
    sliding window of ``window``, built locally: nothing is downloaded."""
    window = positive_int("window", window)
    if not is_int(seed):
        raise ValueError(f"seed must be an int, got {seed!r}")
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    kw = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    llama = LlamaForCausalLM(LlamaConfig(**kw)).eval()
    mistral = MistralForCausalLM(MistralConfig(sliding_window=window, **kw)).eval()
    return {"Llama (GQA 4:2, RoPE)": llama, f"Mistral (GQA 4:2, RoPE, window {window})": mistral}
