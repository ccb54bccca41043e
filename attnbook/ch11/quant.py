"""Chapter 11.4: quantised KV caches (int8 per token or per channel, float8 e4m3, KIVI-like) and their errors."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnlib import KVCache

from ._common import float_tensor, instance, one_of, positive_int, token_ids

_FP8_MAX = 448.0  # largest finite torch.float8_e4m3fn
_SCHEMES = {"int8-token": (-1, 127.0), "int8-channel": (-2, 127.0), "fp8": (-1, _FP8_MAX)}  # (axis of the amax, top code)


def quantize(x: Tensor, scheme: str) -> tuple[Tensor, Tensor]:
    """Quantise a cache tensor ``x [..., S, D_k]``; returns ``(codes, scales)``.

    ``"int8-token"``: one scale per position (over ``D_k``); ``"int8-channel"``: one scale per
    channel over all the positions of ``x``, computed after the fact (a cache that grows cannot know
    its later positions; KIVI quantises keys per channel in groups of recent positions instead);
    ``"fp8"``: float8 e4m3 with one scale per position, rounded to the nearest float8 number by the
    cast. Symmetric: ``x ~ codes * scales``. The arithmetic runs in float32 (float64 for a float64
    ``x``) whatever the cache's dtype, and the scales come back in that dtype: in 16 bits ``x / scale``
    would round before the codes do, and a zero position would give ``0 / 0``.

    float8 e4m3's relative error is at most 2^-4 only in its normal range: after scaling, values
    below 2^-6 (``|x|`` under ``amax / 28,672`` of their position) are subnormal, with an absolute
    error up to 2^-10 of the scale, and values below 2^-10 of the scale round to 0.
    """
    one_of("scheme", scheme, tuple(_SCHEMES))
    if float_tensor("x", x, min_dim=2).shape[-2] == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must be [..., S, D_k] with S, D_k >= 1, got shape {tuple(x.shape)}")
    if not torch.isfinite(x).all():  # one inf would make its whole group's scale, and codes, NaN
        raise ValueError(f"x must be finite to be quantised; it holds {int((~torch.isfinite(x)).sum())} inf or NaN")
    dim, top = _SCHEMES[scheme]
    x = x.to(torch.promote_types(x.dtype, torch.float32))  # float16/bfloat16 -> float32
    scale = x.abs().amax(dim=dim, keepdim=True).clamp_min(1e-12) / top  # [..., S, 1] or [..., 1, D_k]
    if scheme == "fp8":
        return (x / scale).to(torch.float8_e4m3fn), scale
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


def dequantize(codes: Tensor, scale: Tensor) -> Tensor:
    """``codes * scale`` in the scale's dtype: the cache tensor :func:`quantize` approximated."""
    instance("codes", codes, Tensor, "a torch.Tensor of int8 or float8_e4m3fn codes")
    if codes.dtype not in (torch.int8, torch.float8_e4m3fn):
        raise ValueError(f"codes must be int8 or float8_e4m3fn (from quantize), got dtype {codes.dtype}")
    float_tensor("scale", scale)
    try:
        torch.broadcast_shapes(codes.shape, scale.shape)
    except RuntimeError:
        raise ValueError(f"scale shape {tuple(scale.shape)} cannot broadcast to codes {tuple(codes.shape)}") from None
    return codes.to(scale.dtype) * scale


def kivi_roundtrip(keys: Tensor, values: Tensor, group: int = 16) -> tuple[Tensor, Tensor, int]:
    """Quantise a cache as KIVI does (in int8 here), and return ``(keys, values, bytes)`` after dequantising.

    Keys ``[..., S, D_k]``: one scale per channel for each complete group of ``group`` positions,
    computed when the group is complete; the newest ``S % group`` positions stay in 16-bit (the
    residual) until their group fills. Values: one scale per position (per token). Bytes count the
    int8 codes, the 16-bit scales and the 16-bit residual. Returns float32 (float64 for float64 input).
    """
    group = positive_int("group", group)
    float_tensor("keys", keys, min_dim=2), float_tensor("values", values, min_dim=2)
    S, d = keys.shape[-2], keys.shape[-1]
    full = S - S % group
    grouped = keys[..., :full, :].unflatten(-2, (full // group, group))  # [..., S // group, group, D_k]
    k_codes, k_scale = quantize(grouped.transpose(-2, -1), "int8-token")  # per channel: amax over the group's positions
    k_hat = torch.cat([dequantize(k_codes, k_scale).transpose(-2, -1).flatten(-3, -2), keys[..., full:, :].to(k_scale.dtype)], -2)  # [..., S, D_k]
    v_codes, v_scale = quantize(values, "int8-token")
    residual_bytes = keys[..., full:, :].numel() * 2
    return k_hat, dequantize(v_codes, v_scale), quantized_bytes(k_codes, k_scale) + residual_bytes + quantized_bytes(v_codes, v_scale)


def quantized_bytes(codes: Tensor, scale: Tensor, scale_bytes: int = 2) -> int:
    """Bytes of the codes plus the scales stored in ``scale_bytes`` bytes each (16-bit by default)."""
    instance("codes", codes, Tensor, "a torch.Tensor"), instance("scale", scale, Tensor, "a torch.Tensor")
    scale_bytes = positive_int("scale_bytes", scale_bytes)
    return codes.numel() * codes.element_size() + scale.numel() * scale_bytes


@torch.no_grad()
def quantized_cache_errors(model: Any, data: Tensor, scheme: str, *, context: int = 63, batch: int = 64, seed: int = 3) -> dict[str, float]:
    """Decode one token after ``context`` cached positions with the cache quantised by ``scheme``.

    For ``batch`` seeded windows of ``data`` (token ids) the toy model (:class:`attnbook.toy_lm.TinyLM`)
    prefills ``context`` tokens; the cache's keys and values are quantised and dequantised, and the
    next token is decoded against them. Returns the attention output's relative error (RMS over
    RMS), the KL divergence of the next-token distribution from the float32 one (nats), the share of
    windows whose most likely token is unchanged, and the cache's bytes with and without quantisation.
    ``scheme`` is one of :func:`quantize`'s or ``"kivi-G"`` (:func:`kivi_roundtrip` with groups of ``G``).
    """
    from ..toy_lm import TinyLM

    instance("model", model, TinyLM, "an attnbook.toy_lm.TinyLM")
    kivi = isinstance(scheme, str) and scheme.startswith("kivi-") and scheme[5:].isdigit() and int(scheme[5:]) > 0
    if not kivi:
        one_of("scheme", scheme, (*_SCHEMES, "kivi-G (G >= 1 positions per key group)"))
    context, batch = positive_int("context", context), positive_int("batch", batch)
    if token_ids("data", data, 1, "[N]").numel() < context + 2:
        raise ValueError(f"data must hold at least context + 2 = {context + 2} tokens, got {data.numel()}")
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, data.numel() - context - 1, (batch,), generator=gen)
    ids = data[starts[:, None] + torch.arange(context + 1)]  # [B, context + 1]
    cache = KVCache()
    model(ids[:, :context], causal=True, cache=cache)
    exact = model(ids[:, context:], causal=True, cache=_copy_cache(cache.keys, cache.values))[:, -1]  # [B, V]
    if kivi:  # "kivi-16": keys per channel in groups of 16 positions, values per token
        k_hat, v_hat, nbytes = kivi_roundtrip(cache.keys, cache.values, group=int(scheme.split("-")[1]))
    else:
        kq, ks = quantize(cache.keys, scheme)
        vq, vs = quantize(cache.values, scheme)
        k_hat, v_hat, nbytes = dequantize(kq, ks), dequantize(vq, vs), quantized_bytes(kq, ks) + quantized_bytes(vq, vs)
    approx = model(ids[:, context:], causal=True, cache=_copy_cache(k_hat, v_hat))[:, -1]  # [B, V]
    # the attention output of the new token alone, with exact and with quantised keys and values
    att = model.attention
    x = model.embed(ids[:, context:]) + model.pos(torch.tensor([context]))  # [B, 1, D]
    outs = [att(x, causal=True, need_weights=False, cache=_copy_cache(k, v)).hidden_states
            for k, v in ((cache.keys, cache.values), (k_hat, v_hat))]
    diff, ref = (outs[1] - outs[0]).double(), outs[0].double()  # float64: the error is ~1e-3 of the output
    rel = float(diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())
    # float64: a KL of 1e-5 nats sums differences of log-probabilities whose float32 rounding (~1e-6) is
    # not small beside it, and would move its printed digits from one CPU to another
    logp, logq = torch.log_softmax(exact.double(), -1), torch.log_softmax(approx.double(), -1)
    kl = float((logp.exp() * (logp - logq)).sum(-1).mean())
    return {"attention_rel_error": rel, "kl": kl, "top1_same": float((exact.argmax(-1) == approx.argmax(-1)).float().mean()),
            "bytes": nbytes, "bytes_fp32": cache.nbytes, "bytes_fp16": cache.nbytes // 2}


def _copy_cache(keys: Tensor, values: Tensor) -> KVCache:
    fresh = KVCache()
    fresh.update(keys.clone(), values.clone())
    return fresh


def with_key_outliers(model: Any, channels: tuple[int, ...] = (5, 21), factor: float = 20.0) -> Any:
    """A copy of the toy model whose keys have outlier channels, computing exactly the same function.

    Row ``c`` of the key projection (weight and bias) is multiplied by ``factor`` and row ``c`` of the
    query projection divided by it, so every score ``q . k`` is unchanged (up to float rounding) while
    channel ``c`` of every cached key is ``factor`` times larger: the pattern KIVI found in the keys of
    large models, which the toy model does not have by itself.
    """
    import copy

    from ..toy_lm import TinyLM

    instance("model", model, TinyLM, "an attnbook.toy_lm.TinyLM")
    d = model.attention.w_k.out_features
    if not channels or any(not isinstance(c, int) or not 0 <= c < d for c in channels):
        raise ValueError(f"channels must be key channels in 0..{d - 1}, got {channels!r}")
    if not factor > 0:
        raise ValueError(f"factor must be positive, got {factor!r}")
    out = copy.deepcopy(model)
    with torch.no_grad():
        for c in channels:
            for proj, f in ((out.attention.w_k, factor), (out.attention.w_q, 1 / factor)):
                proj.weight[c] *= f
                if proj.bias is not None:
                    proj.bias[c] *= f
    return out
