"""Chapter 10, *Generating text with a KV cache*: counts, measurements, the slider and checkers.

* exact counts per token for prefill and decode (:func:`layer_flops`, :func:`layer_bytes`), and
  for the two paths of multi-head latent attention (:func:`mla_decode_counts`);
* measurements: the cache's growth policy (:func:`append_times`) and the toy decoder's time per
  generated token with and without the cache (:func:`time_per_token`);
* published configurations of real models (:data:`MODELS`) and their cache sizes;
* the generation slider's frame function (:func:`generation_frame`);
* checkers: :func:`check_append_and_attend` and :func:`check_window_cache_bytes`, each with a
  table of known mistakes (:class:`attnbook.feedback.Mistake`).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlib import (
    KVCache,
    MultiHeadSelfAttention,
    causal_mask,
    kv_cache_bytes,
    repeat_kv,
)

from .feedback import (
    ATOL,
    HALF_TOL,
    RTOL,
    Feedback,
    Mistake,
    MistakeTable,
    call_reader,
    check_number_cases,
    as_cpu_float64,
    as_number,
    close,
    computed_narrower,
    correct,
    describe,
    diagnose,
    exercise,
    mismatched_sizes,
    not_a_tensor,
    run_reader_code,
    wrong,
)
from .measure import interleaved_median_ms
from .slider import Frame, Panel

__all__ = [
    "layer_flops", "layer_bytes", "mlp_flops_bytes", "decode_step_intensity", "cache_vs_context_figure", "mla_decode_counts", "mla_attention_flops", "append_times", "copied_positions", "time_per_token",
    "toy_step_flops", "full_causal_pass", "chunked_decoding_error",
    "ModelConfig", "MODELS", "DEEPSEEK_V2", "generation_frame", "GENERATION_TOKENS",
    "reference_append_and_attend", "APPEND_MISTAKES", "check_append_and_attend",
    "reference_window_cache_bytes", "WINDOW_MISTAKES", "check_window_cache_bytes",
    "reference_decode_intensity", "INTENSITY_MISTAKES", "check_decode_intensity",
    "reference_mla_cache", "MLA_MISTAKES", "check_mla_cache",
    "reference_merge_partials", "MERGE_MISTAKES", "check_merge_partials",
]


# ---- exact counts ---------------------------------------------------------------------------------

def layer_flops(D: int, H: int, H_kv: int, S_new: int, S_k: int) -> int:
    """Matmul FLOPs of one attention *sublayer* for ``S_new`` queries against ``S_k`` keys.

    Multiply-add = 2 FLOPs, as ``FlopCounterMode`` counts: projections ``2 S_new D (2 D + 2 H_kv D_k)``
    and the two attention matmuls ``2 * 2 H S_new S_k D_k`` (masked entries included, as a
    materialising kernel computes them; a flash kernel skips the fully masked tiles). The MLP of the
    same transformer layer is not included: see :func:`mlp_flops_bytes`.
    """
    d_k = D // H
    return 2 * S_new * D * (2 * D + 2 * H_kv * d_k) + 4 * H * S_new * S_k * d_k


def layer_bytes(D: int, H: int, H_kv: int, S_new: int, S_k: int, dtype_bytes: int = 2, activations: bool = True) -> int:
    """Bytes one attention sublayer must move for ``S_new`` new positions against ``S_k`` keys.

    Every weight is read once per call (``2 D^2 + 2 D H_kv D_k`` numbers), the cached keys and values
    of the ``S_k - S_new`` earlier positions are read, and the new positions' keys and values written.
    With ``activations``, each new position also moves ``8 D`` numbers: its input read, its queries
    written and read, its keys and values read back by the attention, its attention output written
    and read, and the sublayer's output written. For a prefill that is the same order as the cache
    write; for a decode step it is negligible.
    """
    d_k = D // H
    weights = 2 * D * D + 2 * D * H_kv * d_k
    acts = 8 * S_new * D if activations else 0
    return (weights + 2 * H_kv * d_k * S_k + acts) * dtype_bytes


def mlp_flops_bytes(D: int, intermediate: int, S_new: int = 1, dtype_bytes: int = 2) -> dict[str, int]:
    """FLOPs and weight bytes of a SwiGLU MLP (gate, up and down projections) for ``S_new`` positions.

    Llama-style layers have one after every attention sublayer: ``3 D I`` weights, ``6 D I`` FLOPs per position.
    """
    return {"flops": 6 * D * intermediate * S_new, "weight_bytes": 3 * D * intermediate * dtype_bytes}


def decode_step_intensity(D: int, H: int, H_kv: int, S: int, batch: int, intermediate: int = 0, dtype_bytes: int = 2) -> float:
    """FLOPs per byte of one decode step of one transformer layer for ``batch`` sequences at context ``S``.

    The weights (attention sublayer, plus a SwiGLU MLP of width ``intermediate`` when given) are read
    once for the whole batch; every sequence reads its own cached keys and values. Activations are
    left out (a few ``D``-vectors per sequence).
    """
    d_k = D // H
    mlp = mlp_flops_bytes(D, intermediate, dtype_bytes=dtype_bytes) if intermediate else {"flops": 0, "weight_bytes": 0}
    flops = batch * (layer_flops(D, H, H_kv, 1, S) + mlp["flops"])
    weights = (2 * D * D + 2 * D * H_kv * d_k) * dtype_bytes + mlp["weight_bytes"]
    cache = batch * 2 * H_kv * d_k * S * dtype_bytes
    return flops / (weights + cache)


def mla_decode_counts(D: int, H: int, L: int, S_k: int, dtype_bytes: int = 2, d_k: int | None = None) -> dict[str, dict[str, int]]:
    """FLOPs and bytes of one decoded token (one query, ``S_k`` cached latents) on both MLA paths.

    ``decompress`` rebuilds ``[H, S_k, D_k]`` keys and values from all cached latents every step;
    ``absorbed`` maps the query into latent space and attends to the latents. Both read the weights
    and the ``S_k L`` cached latents; the decompress path also writes and reads the rebuilt keys and
    values. ``d_k`` defaults to ``D // H``, as in :class:`attnlib.MultiHeadLatentAttention`, whose
    ``count_flops`` it matches.
    """
    d_k = D // H if d_k is None else d_k
    common = 2 * D * H * d_k + 2 * D * L + 2 * H * d_k * D  # w_q, w_dkv, w_o for the new token
    weights = (2 * D * H * d_k + D * L + 2 * L * H * d_k) * dtype_bytes  # w_q, w_o, w_dkv, w_uk, w_uv
    latents = S_k * L * dtype_bytes
    return {
        "decompress": {
            "flops": common + 2 * 2 * S_k * L * H * d_k + 4 * H * S_k * d_k,
            "bytes": weights + latents + 2 * 2 * H * S_k * d_k * dtype_bytes,
        },
        "absorbed": {
            "flops": common + 2 * H * d_k * L + 4 * H * S_k * L + 2 * H * L * d_k,
            "bytes": weights + latents,
        },
    }


def mla_attention_flops(H: int, L: int, d_k: int, S_new: int, S_k: int) -> dict[str, int]:
    """FLOPs of MLA's attention part (the projections both paths share left out), ``S_new`` queries, ``S_k`` latents.

    Decompressing rebuilds keys and values from every latent, ``4 S_k L H D_k``, then attends
    ``D_k``-wide, ``4 H S_new S_k D_k``. Absorbing maps each query into and out of latent space,
    ``4 S_new H D_k L``, then attends ``L``-wide, ``4 H S_new S_k L``. Absorption pays when
    ``L D_k (S_k - S_new) > S_new S_k (L - D_k)``: never for a prefill (``S_new = S_k``), always for
    decoding one token against two or more latents.
    """
    return {
        "decompress": 4 * S_k * L * H * d_k + 4 * H * S_new * S_k * d_k,
        "absorbed": 4 * S_new * H * d_k * L + 4 * H * S_new * S_k * L,
    }


# ---- chunked decoding against one causal pass ----------------------------------------------------

def chunked_decoding_error(d_model: int, num_heads: int, num_kv_heads: int, *, seed: int,
                           chunks: tuple[int, ...] = (4, 1, 1, 1, 3), dtype: torch.dtype = torch.float32,
                           pad: int = 3, window: int | None = None) -> float:
    """Largest difference, outputs and weights, between decoding ``chunks`` with a cache and one causal pass.

    A seeded layer (batch of 2, the first sequence left-padded by ``pad``, a sliding ``window`` if given)
    runs once over all positions and once chunk by chunk with a :class:`attnlib.KVCache`; the generator is
    local, so the global seed is left as it was. With a window, a chunk's weights cover only the positions
    the cache still holds, so they are compared with the last columns of the full pass's rows (the columns
    left out are zero there).
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = MultiHeadSelfAttention(d_model, num_heads, num_kv_heads=num_kv_heads, window=window).to(dtype)
    S = sum(chunks)
    x = torch.randn(2, S, d_model, generator=gen, dtype=dtype)  # [B, S, D]
    mask = torch.ones(2, S, dtype=torch.long)
    mask[0, :pad] = 0
    error, pos, cache = 0.0, 0, KVCache()
    with torch.no_grad():
        full = layer(x, mask, causal=True)
        for n in chunks:
            out = layer(x[:, pos : pos + n], mask[:, : pos + n], causal=True, cache=cache)
            w = out.attention_weights  # [B, H, n, S_k]: S_k = pos + n, or fewer once a window drops positions
            rows = full.attention_weights[:, :, pos : pos + n, : pos + n]  # [B, H, n, pos + n]
            dropped = rows[..., : pos + n - w.shape[-1]]  # columns of positions the cache no longer holds
            error = max(error,
                        (out.hidden_states - full.hidden_states[:, pos : pos + n]).abs().max().item(),
                        (w - rows[..., pos + n - w.shape[-1]:]).abs().max().item(),
                        dropped.abs().max().item() if dropped.numel() else 0.0)
            pos += n
    return error


# ---- measurements ---------------------------------------------------------------------------------

def append_times(n_tokens: int, H_kv: int = 8, D_k: int = 64, repeats: int = 3) -> dict[str, float]:
    """Milliseconds to append ``n_tokens`` positions one at a time: ``torch.cat`` vs :class:`KVCache`.

    Timed on one thread by the thread's CPU time. A measurement (print it with ``~``). Returns ``{"torch.cat": ms, "KVCache": ms}``.
    """
    new = torch.randn(1, H_kv, 1, D_k)  # [B, H_kv, 1, D_k]

    def with_cat() -> None:
        keys = values = new[:, :, :0]
        for _ in range(n_tokens):
            keys, values = torch.cat([keys, new], dim=2), torch.cat([values, new], dim=2)  # [B, H_kv, S + 1, D_k]

    @torch.no_grad()  # decoding: with gradients enabled a KVCache keeps the autograd graph by concatenating
    def with_cache() -> None:
        cache = KVCache()
        for _ in range(n_tokens):
            cache.update(new, new)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread, timed by its own CPU time: little disturbed by other programs
    try:
        return interleaved_median_ms({"torch.cat": with_cat, "KVCache": with_cache}, repeats=repeats, warmup=1,
                                     clock=time.thread_time)
    finally:
        torch.set_num_threads(threads)


def copied_positions(n_tokens: int) -> dict[str, int]:
    """Positions copied per tensor while appending ``n_tokens`` one at a time (exact counts)."""
    doubling, capacity = 0, 1
    for length in range(1, n_tokens):
        if length == capacity:
            doubling += length  # the kept positions move to a buffer twice as large
            capacity *= 2
    return {"torch.cat": n_tokens * (n_tokens + 1) // 2, "KVCache": n_tokens + doubling}


@torch.no_grad()
def window_moves(window: int, steps: int, layer: bool = False) -> dict[str, int]:
    """Positions a windowed ``KVCache`` moves to fresh buffers over ``steps`` one-token steps (exact).

    A move is seen from outside: the cached keys' storage changes, so the positions held before the
    step were copied. ``layer=True`` decodes through ``MultiHeadSelfAttention(32, 4, num_kv_heads=2)``.
    Returns the moves, the positions moved in all and after the window first filled, and those steps.
    """
    torch.manual_seed(0)
    attention = MultiHeadSelfAttention(32, 4, num_kv_heads=2, window=window) if layer else None
    cache, counts = KVCache(), {"moves": 0, "moved": 0, "moved_full": 0, "steps_full": 0}
    for _ in range(steps):
        held = 0 if cache.keys is None else cache.keys.shape[2]
        before = None if cache.keys is None else cache.keys.untyped_storage().data_ptr()
        if attention is not None:
            attention(torch.randn(1, 1, 32), causal=True, need_weights=False, cache=cache)
        else:
            cache.update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8), window=window)
        moved = held if before is not None and cache.keys.untyped_storage().data_ptr() != before else 0
        counts["moves"] += moved > 0
        counts["moved"] += moved
        if held == window:  # the window was full before this step
            counts["moved_full"] += moved
            counts["steps_full"] += 1
    return counts


@torch.no_grad()
def time_per_token(model: Any, positions: list[int], *, repeats: int = 7, threads: int = 1) -> dict[str, list[float]]:
    """Milliseconds to generate one token at each context length, with and without the cache.

    Without the cache a step runs the model over all ``P + 1`` tokens; with it, one token against a
    cache holding ``P`` positions (each timed step appends one, so the cache grows by ``repeats + 1``
    during the measurement). Timed with ``torch`` on ``threads`` threads and the CPU time of this
    thread, so load from other programs barely changes the result. A measurement: print with ``~``.
    """
    model.eval()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    vocab = model.head.out_features
    out: dict[str, list[float]] = {"no cache": [], "cache": []}
    try:
        for P in positions:
            ids = torch.randint(0, vocab, (1, P + 1), generator=gen)  # [1, P + 1]
            cache = KVCache()
            model(ids[:, :P], causal=True, cache=cache)  # prefill P positions
            token = ids[:, P:]  # [1, 1]
            times = interleaved_median_ms(
                {"no cache": lambda: model(ids, causal=True), "cache": lambda: model(token, causal=True, cache=cache)},
                repeats=repeats, warmup=1, clock=time.thread_time if threads == 1 else None,
            )
            for name in out:
                out[name].append(times[name])
    finally:
        torch.set_num_threads(old_threads)
    return out


@torch.no_grad()
def toy_step_flops(model: Any, P: int) -> dict[str, int]:
    """Exact matmul FLOPs of generating the token at position ``P`` with the toy model (counted).

    ``FlopCounterMode`` does not count PyTorch's fused CPU attention kernel, so the attention layer
    is counted on its explicit path (``need_weights=True``, the same matmuls) plus the output head.
    """
    from attnlib.cost import count_flops

    x = torch.randn(1, P + 1, model.attention.d_model)  # [1, P + 1, D]
    cache = KVCache()
    model.attention(x[:, :P], causal=True, cache=cache)  # prefill P positions
    head = count_flops(model.head, x[:, :1])  # per position
    return {
        "no cache": count_flops(lambda: model.attention(x, causal=True)) + (P + 1) * head,
        "cache": count_flops(lambda: model.attention(x[:, P:], causal=True, cache=cache)) + head,
    }


# ---- real configurations --------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelConfig:
    """A published decoder configuration (from each model's config.json / paper).

    ``context`` is the longest sequence the model was released for (``max_position_embeddings``);
    ``intermediate`` the width of its SwiGLU MLP.
    """

    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    params: float  # total parameters
    context: int
    window: int | None = None
    intermediate: int = 0

    def cache_bytes(self, seq_len: int, batch: int = 1, dtype_bytes: int = 2) -> int:
        kept = seq_len if self.window is None else min(seq_len, self.window)
        return kv_cache_bytes(self.layers, self.kv_heads, self.head_dim, kept, batch, dtype_bytes)

    def weight_bytes(self, dtype_bytes: int = 2) -> float:
        return self.params * dtype_bytes

    def with_kv_heads(self, kv_heads: int) -> "ModelConfig":
        """The same model with ``kv_heads`` key/value heads: the cache changes, and so do ``W_K`` and ``W_V``
        (``[D, kv_heads * head_dim]`` each, ``D = heads * head_dim``), so ``params`` moves by
        ``layers * 2 * D * head_dim * (kv_heads - self.kv_heads)``."""
        D = self.heads * self.head_dim
        extra = self.layers * 2 * D * self.head_dim * (kv_heads - self.kv_heads)
        return replace(self, kv_heads=kv_heads, params=self.params + extra)

    def crossover(self, batch: int = 1) -> int | None:
        """The shortest context at which the cache (16-bit) outgrows the 16-bit weights, or None
        when a window caps the cache below the weights. Compare with ``context``: beyond it the
        model was not made to run."""
        per_token = self.cache_bytes(1, batch)
        S = int(self.weight_bytes() // per_token) + 1
        if self.window is not None and S > self.window:
            return None
        return S


MODELS = [
    ModelConfig("Llama 2 7B (MHA)", 32, 32, 32, 128, 6.74e9, context=4096, intermediate=11008),
    ModelConfig("Llama 2 70B (GQA, 8 KV heads)", 80, 64, 8, 128, 68.98e9, context=4096, intermediate=28672),
    ModelConfig("Llama 3.1 8B (GQA, 8 KV heads)", 32, 32, 8, 128, 8.03e9, context=131072, intermediate=14336),
    ModelConfig("Llama 3.1 70B (GQA, 8 KV heads)", 80, 64, 8, 128, 70.55e9, context=131072, intermediate=28672),
    ModelConfig("Mistral 7B v0.1 (GQA + window 4096)", 32, 32, 8, 128, 7.24e9, context=32768, window=4096, intermediate=14336),
]

#: DeepSeek-V2 (236B parameters): 60 layers, 128 heads of 128 dims, kv_lora_rank 512 and a 64-dim
#: decoupled RoPE key per token and layer, both cached.
DEEPSEEK_V2 = dict(layers=60, heads=128, head_dim=128, kv_lora_rank=512, rope_dim=64, params=236e9)


# ---- the generation slider ------------------------------------------------------------------------

GENERATION_TOKENS = ["The", "robot", "fixed", "the", "lamp", "and", "the", "lamp", "lit", "up", "again", "."]


def _generation_weights(window: int | None) -> list[Tensor]:
    """The newest query's head-averaged weights over the cache at every step (seeded layer)."""
    from .examples import toy_hidden_states

    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(16, 2, window=window)
    x = toy_hidden_states(GENERATION_TOKENS, d_model=16, seed=0)  # [1, S, 16]
    cache, rows = KVCache(), []
    with torch.no_grad():
        for t in range(x.shape[1]):
            w = layer(x[:, t : t + 1], causal=True, cache=cache).attention_weights  # [1, H, 1, S_k]
            rows.append(w[0].mean(0)[0])  # [S_k]
    return rows


_ROWS = {w: _generation_weights(w) for w in (None, 4)}  # the windows the slider shows


def _generation_panel(step: int, window: int | None) -> tuple[Panel, str]:
    S = len(GENERATION_TOKENS)
    row = _ROWS[window][step - 1]  # [S_k]: cached keys before this step, then the new token's own key
    weights = np.zeros(S)
    weights[step - row.numel() : step] = row.numpy()
    first = 0 if window is None else max(0, step - window)  # the oldest position it may see
    hidden = np.array([i < first or i >= step for i in range(S)])[None]  # [1, S]
    name = "full cache" if window is None else f"window W = {window}"
    span = lambda a, b: f"position {a}" if a == b else f"positions {a}-{b}"  # never "positions 0-0"
    held = row.numel() - 1
    caption = (
        f"{name[0].upper() + name[1:]}: the cache held {held} position{'' if held == 1 else 's'} before this step, "
        f"afterwards {span(first, step - 1)}"
        + (f" ({span(0, first - 1)} {'has' if first == 1 else 'have'} left the rolling buffer)." if first else ".")
    )
    title = f"{name}: weights of the newest query (hatched: not generated yet" + ("" if window is None else ", or outside the window") + ")"
    return Panel(weights, [GENERATION_TOKENS[step - 1]], GENERATION_TOKENS, title=title, vmin=0.0, vmax=1.0, masked=hidden), caption


def generation_frame(step: int, window: int = 4) -> Frame:
    """Step ``step`` (1-based) of generation: the newest token's weights over what the cache holds,
    once with a full cache and once with a sliding window of ``window`` (4 or None)."""
    panels, captions = zip(*(_generation_panel(step, w) for w in (None, window)))
    intro = f"The token at position {step - 1} ({GENERATION_TOKENS[step - 1]!r}) is the newest query; it attends to the cached keys and to itself."
    return Frame(label=f"step {step}", panels=list(panels), caption=" ".join((intro, *captions)))


# ---- exercise 1: append and attend ----------------------------------------------------------------

def reference_append_and_attend(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_new: Tensor, v_new: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Append the new keys/values to the cache, then let the new queries attend (bottom-right causal).

    ``q [B, H, S_new, D_k]``; caches ``[B, H_kv, S_past, D_k]``; new ``[B, H_kv, S_new, D_k]``.
    Returns ``(output [B, H, S_new, D_k], keys [B, H_kv, S_k, D_k], values [B, H_kv, S_k, D_k])``.
    """
    keys = torch.cat([k_cache, k_new], dim=2)  # [B, H_kv, S_k, D_k]
    values = torch.cat([v_cache, v_new], dim=2)  # [B, H_kv, S_k, D_k]
    H, S_new, S_k = q.shape[1], q.shape[2], keys.shape[2]
    mask = causal_mask(S_new, S_k=S_k)  # [S_new, S_k], bottom-right
    out = F.scaled_dot_product_attention(q, repeat_kv(keys, H), repeat_kv(values, H), attn_mask=mask)
    return out, keys, values


#: The append checker's cases ``(B, H, H_kv, S_past, S_new, D_k, dtype)``: GQA with two new tokens,
#: then a case that differs in every size (MQA, a chunk of five new tokens) and in the dtype.
APPEND_CASES: tuple[tuple[int, int, int, int, int, int, torch.dtype], ...] = (
    (2, 4, 2, 5, 2, 8, torch.float64),
    (3, 6, 1, 4, 5, 7, torch.float32),
)

#: 16-bit cases, tried after the full-precision ones: a cache is usually held in float16 or bfloat16, so
#: the step must work there too (the output is compared with float64 attention to HALF_TOL).
HALF_APPEND_CASES: tuple[tuple[int, int, int, int, int, int, torch.dtype], ...] = (
    (2, 4, 2, 6, 3, 8, torch.float16),
    (1, 4, 1, 5, 2, 8, torch.bfloat16),
)


def _append_case(case: int = 0) -> tuple[Tensor, ...]:
    B, H, H_kv, S_past, S_new, D_k, dtype = (APPEND_CASES + HALF_APPEND_CASES)[case]
    gen = torch.Generator().manual_seed(9 + case)
    q = torch.randn(B, H, S_new, D_k, generator=gen, dtype=torch.float64)
    k_cache, v_cache = (torch.randn(B, H_kv, S_past, D_k, generator=gen, dtype=torch.float64) for _ in range(2))
    k_new, v_new = (torch.randn(B, H_kv, S_new, D_k, generator=gen, dtype=torch.float64) for _ in range(2))
    return tuple(t.to(dtype) for t in (q, k_cache, v_cache, k_new, v_new))


def _attend(q: Tensor, keys: Tensor, values: Tensor, **kwargs: Any) -> Tensor:
    H = q.shape[1]
    return F.scaled_dot_product_attention(q, repeat_kv(keys, H), repeat_kv(values, H), **kwargs)


def _cat(*case: Tensor) -> tuple[Tensor, Tensor]:
    return torch.cat([case[1], case[3]], 2), torch.cat([case[2], case[4]], 2)


#: Outputs of the usual wrong answers on the checker's case, each with its hint.
_WRONG_SIGN = (
    "your diagonal's offset has the wrong sign: tril(S_new - S_k) moves the diagonal left, so the new queries see "
    "few or no keys (a query that sees none gets zeros from scaled_dot_product_attention, or NaN from a softmax over "
    "scores that are all -inf). The new queries are the last positions: shift the diagonal the other way.")

_SOFTMAX_OVER_HEADS = (
    "your softmax runs over the heads axis (dim=1 of the scores [B, H, S_new, S_k]): each query's weights "
    "must sum to 1 over the keys, the last axis (softmax(dim=-1)).")


APPEND_MISTAKES = (
    Mistake("top-left alignment", lambda *c: _attend(c[0], *_cat(*c), is_causal=True),
            "your mask is aligned top-left (is_causal=True, or tril without the offset): the first new query then sees "
            "only the first cached key. The new queries are the LAST S_new positions: use causal_mask(S_new, S_k=S_k), "
            "which shifts the diagonal by S_k - S_new."),
    Mistake("no mask", lambda *c: _attend(c[0], *_cat(*c)),
            "the first new query also sees the second new key, which lies in its future (no mask, or a mask whose "
            "diagonal sits one position too far right): with more than one new token a causal mask is needed, "
            "aligned bottom-right (causal_mask(S_new, S_k=S_k))."),
    Mistake("mask inverted", lambda *c: _attend(c[0], *_cat(*c), attn_mask=~_bottom_right(c)),
            "your mask is inverted: in F.scaled_dot_product_attention a boolean True means 'may attend' (nn.MultiheadAttention "
            "uses the opposite convention, True = masked). Pass causal_mask(S_new, S_k=S_k) as it is, without ~; an "
            "additive mask is 0 where a query may attend and -inf elsewhere, not the other way round."),
    Mistake("upper triangle kept", lambda *c: _attend(c[0], *_cat(*c), attn_mask=torch.ones(
                c[0].shape[2], c[1].shape[2] + c[3].shape[2], dtype=torch.bool).triu(c[1].shape[2])),
            "your mask keeps the upper triangle (triu): each new query then sees itself and the keys AFTER it. A query "
            "may see the keys up to its own position, the lower triangle: causal_mask(S_new, S_k=S_k), which is "
            "tril(S_k - S_new) of a [S_new, S_k] matrix of ones."),
    Mistake("no 1/sqrt(D_k)", lambda *c: _attend(c[0], *_cat(*c), attn_mask=_bottom_right(c), scale=1.0),
            "the scores are not divided by sqrt(D_k): scaled_dot_product_attention does it by default, so leave its "
            "scale argument alone (or divide q @ k^T by math.sqrt(D_k) if you compute the scores yourself)."),
    Mistake("new keys not appended", lambda *c: _attend(c[0], c[1], c[2]),
            "the new queries attend only to the old cache: append k_new and v_new first, so every token also sees itself."),
    Mistake("new before old", lambda *c: _attend(c[0], torch.cat([c[3], c[1]], 2), torch.cat([c[4], c[2]], 2),
                                                  attn_mask=causal_mask(c[0].shape[2], S_k=c[1].shape[2] + c[3].shape[2])),
            "you put the new positions before the cached ones: concatenate [k_cache, k_new] along the position axis (dim 2)."),
    Mistake("heads tiled with .repeat", lambda *c: _tiled_attend(c[0], *_cat(*c), attn_mask=_bottom_right(c)),
            "your key/value heads are tiled (0, 1, 0, 1, ...), as .repeat(1, G, 1, 1) gives: grouped-query attention "
            "gives consecutive query heads the same key/value head (0, 0, 1, 1), as attnlib.repeat_kv (or "
            "repeat_interleave on dim 1) does."),
    Mistake("softmax over the queries", lambda *c: _manual_attend(c, softmax_dim=-2),
            "your softmax runs over dim=-2, the new queries: each query's weights must sum to 1 over the keys, "
            "so normalise along the last axis (softmax(dim=-1)) of the [B, H, S_new, S_k] scores."),
    Mistake("scaled by sqrt(H * D_k)", lambda *c: _attend(c[0], *_cat(*c), attn_mask=_bottom_right(c),
                                                           scale=1 / math.sqrt(c[0].shape[1] * c[0].shape[3])),
            "you divided the scores by sqrt(H * D_k), the model width: each head's scores are dot products of "
            "D_k-wide vectors, so divide by sqrt(D_k), the head width (q.shape[-1])."),
    Mistake("new keys only", lambda *c: _attend(c[0], c[3], c[4], is_causal=True),
            "your queries see only the new keys: the caches were appended, but the attention ran over k_new and "
            "v_new alone. Attend over the whole updated cache, the keys and values after the torch.cat."),
    Mistake("scaled by 1/D_k", lambda *c: _attend(c[0], *_cat(*c), attn_mask=_bottom_right(c), scale=1 / c[0].shape[3]),
            "you divided the scores by D_k: divide by sqrt(D_k) (math.sqrt(q.shape[-1])), which keeps the scores' "
            "spread near 1 whatever the head width."),
    Mistake("keys and values swapped in the attention", lambda *c: _attend(c[0], *reversed(_cat(*c)), attn_mask=_bottom_right(c)),
            "the scores use the values and the weighted sum the keys: the queries are compared with the KEYS "
            "(q @ k^T), and the weights average the VALUES."),
    Mistake("own key hidden", lambda *c: _attend(c[0], *_cat(*c), attn_mask=_bottom_right(c, shift=-1)),
            "your mask is off by one: each new query is hidden from its own key (and the first one from the newest "
            "cached key too). causal_mask(S_new, S_k=S_k) lets query i see keys 0 .. S_k - S_new + i, itself included."),
    Mistake("output transposed to [B, S_new, H, D_k]", lambda *c: reference_append_and_attend(*c)[0].transpose(1, 2),
            "your output comes back as [B, S_new, H, D_k]: the head axis and the position axis are swapped. "
            "scaled_dot_product_attention already returns [B, H, S_new, D_k], the shape of q, "
            "so leave out the .transpose(1, 2) (it belongs before merging the heads, not here)."),
    Mistake("reshape for transpose", lambda *c: _reshaped_as_transposed(reference_append_and_attend(*c)[0]),
            "your output has the right shape but its numbers are scrambled across heads and positions: "
            ".reshape (or .view) to [B, H, S_new, D_k] keeps the numbers in memory order, so after a .transpose it "
            "mixes heads and positions; it never swaps axes. The attention's output is already [B, H, S_new, D_k]: "
            "no transpose and no reshape are needed."),
    Mistake("last query only", lambda *c: reference_append_and_attend(*c)[0][:, :, -1:],
            "your output has one row per head, the last new query's: that is the output of an ordinary one-token "
            "decode step, but here all S_new new tokens are queries (q is [B, H, S_new, D_k]; S_new can be more than "
            "1, as for a prompt or a chunk). Let every new query attend, q as it is and not q[:, :, -1:], with the "
            "bottom-right causal mask, and return [B, H, S_new, D_k]."),
    Mistake("0/1 mask added to the scores", lambda *c: _attend(c[0], *_cat(*c), attn_mask=_bottom_right(c).to(c[0].dtype)),
            "your mask was turned into numbers (.to(q.dtype), .float()): a float attn_mask is ADDED to the scores, so "
            "a 1 where a query may attend and a 0 elsewhere masks nothing. Pass the boolean mask as it is (True = "
            "may attend), or an additive one with 0 and float('-inf')."),
    Mistake("mask after the softmax, not renormalised", lambda *c: _manual_attend(c, mask_after=True),
            "you masked the weights after the softmax (zeroing the hidden keys) without renormalising: each row then "
            "sums to less than 1. Mask the scores BEFORE the softmax (fill with float('-inf')), so the softmax spreads "
            "each row's weight over the keys the query may see."),
    Mistake("cache plus only itself", lambda *c: _attend(c[0], *_cat(*c), attn_mask=_cache_and_self(c)),
            "each new query sees the cache and only itself among the new tokens: a new query also sees the new tokens "
            "BEFORE it (they come earlier in the text). The mask over the new keys is a lower triangle, not the "
            "diagonal: causal_mask(S_new, S_k=S_k)."),
    Mistake("heads merged to [B, S_new, H * D_k]", lambda *c: _merged_heads(reference_append_and_attend(*c)[0]),
            "your output has the heads merged, [B, S_new, H * D_k], as a layer returns it before W_O: return the "
            "attention's output per head, [B, H, S_new, D_k], without the transpose and reshape."),
    Mistake("softmax over the heads axis", lambda *c: _manual_attend(c, softmax_dim=1, fill=-1e9),
            _SOFTMAX_OVER_HEADS),
    Mistake("diagonal offset with the wrong sign", lambda *c: _attend(c[0], *_cat(*c), attn_mask=_wrong_sign(c)),
            _WRONG_SIGN),
)


def _cache_and_self(case: tuple[Tensor, ...]) -> Tensor:
    """Every cached key plus only the query's own new key: [S_new, S_k]."""
    S_new, S_past = case[0].shape[2], case[1].shape[2]
    if S_new == 1:
        raise ValueError("with one new token this is the right mask")
    return torch.cat([torch.ones(S_new, S_past, dtype=torch.bool), torch.eye(S_new, dtype=torch.bool)], 1)


def _merged_heads(out: Tensor) -> Tensor:
    B, H, S, D = out.shape
    return out.transpose(1, 2).reshape(B, S, H * D)  # [B, S_new, H * D_k]


def _reshaped_as_transposed(out: Tensor) -> Tensor:
    """``out`` [B, H, S, D] transposed to [B, S, H, D], then reshaped back to [B, H, S, D]: a scramble."""
    if out.shape[1] == 1 or out.shape[2] == 1:
        raise ValueError("with one head or one position a reshape is a transpose")
    return out.transpose(1, 2).reshape(out.shape)


def _bottom_right(case: tuple[Tensor, ...], shift: int = 0) -> Tensor:
    S_new, S_k = case[0].shape[2], case[1].shape[2] + case[3].shape[2]
    return torch.ones(S_new, S_k, dtype=torch.bool).tril(S_k - S_new + shift)  # [S_new, S_k]


def _wrong_sign(case: tuple[Tensor, ...]) -> Tensor:
    """The bottom-right mask with its diagonal offset negated, tril(S_new - S_k): [S_new, S_k]."""
    S_new, S_k = case[0].shape[2], case[1].shape[2] + case[3].shape[2]
    return torch.ones(S_new, S_k, dtype=torch.bool).tril(S_new - S_k)  # [S_new, S_k]


def _manual_attend(case: tuple[Tensor, ...], softmax_dim: int = -1, mask_after: bool = False,
                   fill: float | None = None, mask: Tensor | None = None) -> Tensor:
    """Attention written out; with ``mask`` given, filled with -inf there and NaN left where a row sees no key."""
    q, (keys, values) = case[0], _cat(*case)
    H = q.shape[1]
    scores = q @ repeat_kv(keys, H).transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, H, S_new, S_k]
    if mask_after:  # softmax over all keys, then the hidden weights zeroed: rows sum to less than 1
        return (scores.softmax(-1) * _bottom_right(case)) @ repeat_kv(values, H)
    if mask is not None:
        return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ repeat_kv(values, H)
    scores = scores.masked_fill(~_bottom_right(case), float("-inf") if fill is None else fill)
    weights = scores.softmax(dim=softmax_dim)
    return (weights if fill is not None else weights.nan_to_num(0.0)) @ repeat_kv(values, H)


_FILLED_WHERE_TRUE = (
    "your output has NaN in the last new query's row: every score of that row became -inf. "
    "causal_mask is True where a query MAY attend, so fill the other places: "
    "scores.masked_fill(~mask, float('-inf')) (or pass the mask to scaled_dot_product_attention as it is). "
    "Filling where it is True hides exactly the keys each query should see."
)


def _dtype_hint(got: Any, expected: Tensor) -> Feedback | None:
    """A specific hint when ``got`` has the right shape and values but a dtype narrower than the inputs'
    (or not a floating dtype); a floating output at least as wide as the inputs is fine."""
    if (isinstance(got, Tensor) and tuple(got.shape) == tuple(expected.shape) and got.dtype != expected.dtype
            and close(got, expected, atol=1e-4, rtol=1e-4)):
        if got.is_floating_point() and got.element_size() >= expected.element_size():
            return None  # computed and returned wider than the inputs: allowed
        return wrong(f"your output is {got.dtype}, narrower than the inputs' {expected.dtype}: compute and return it "
                     "in the inputs' dtype or wider (leave out the .float(), .half() or .to(...) cast that narrows it).")
    return None


def _tuple_order(result: Sequence[Any], expected: tuple[Tensor, Tensor, Tensor], half: bool) -> str | None:
    """The order of ``(output, keys, values)`` that ``result`` holds, e.g. ``"(keys, values, output)"``,
    when it holds all three in an order other than the right one; ``None`` otherwise."""
    names = ("output", "keys", "values")
    tol = 2 * HALF_TOL if half else ATOL
    found = []
    for got in result:
        match = [n for n, e in zip(names, expected) if close(got, e, atol=tol, rtol=tol)]
        if len(match) != 1:
            return None
        found.append(match[0])
    if sorted(found) != sorted(names) or tuple(found) == names:
        return None
    return f"({', '.join(found)})"


def _tiled_attend(q: Tensor, keys: Tensor, values: Tensor, **kwargs: Any) -> Tensor:
    G = q.shape[1] // keys.shape[1]
    if G == 1 or keys.shape[1] == 1:
        raise ValueError("with one key/value head (or one group) tiling and grouping agree")
    return F.scaled_dot_product_attention(q, keys.repeat(1, G, 1, 1), values.repeat(1, G, 1, 1), **kwargs)


_NO_REPEAT = (
    "the query heads and the key/value heads do not line up ({error}): with grouped-query attention there are "
    "H = {H} query heads but H_kv = {H_kv} key/value heads. Store the H_kv heads in the cache, and repeat them "
    "to H only for the attention itself: attnlib.repeat_kv(keys, H) (or enable_gqa=True in SDPA)."
)


_MASK_WIDTH = (
    "the mask does not fit the scores ({error}): the scores are [B, H, S_new, S_k], here S_new = {S_new} and "
    "S_k = {S_k}, one column per cached or new key, so the mask must be [S_new, S_k], not square. Build it with "
    "causal_mask(S_new, S_k=S_k), which also aligns its diagonal bottom-right."
)


_MASK_NEW_ONLY = (
    "the mask does not fit the scores ({error}): your mask is [S_new, S_new], as torch.tril(torch.ones(S_new, "
    "S_new)) builds, one column per NEW key only. The scores are [B, H, S_new, S_k], here S_new = {S_new} and "
    "S_k = {S_k}: the mask needs a column for every cached key too (all visible) before the lower triangle of the "
    "new ones, aligned bottom-right: causal_mask(S_new, S_k=S_k)."
)


_MASK_SQUARE = (
    "the mask does not fit the scores ({error}): your mask is square, one row per key, as causal_mask(S_k) "
    "builds for a full pass, but here only the S_new = {S_new} new tokens are queries, over S_k = {S_k} keys. "
    "The scores are [B, H, S_new, S_k], so the mask must be [S_new, S_k], with the new queries as its LAST rows "
    "(aligned bottom-right): causal_mask(S_new, S_k=S_k)."
)


_KEYS_TRANSPOSED = (
    "the heads meet the positions ({error}): your keys were transposed on the wrong axes. .transpose(1, 2) "
    "swaps the head axis and the position axis, [B, H, S_k, D_k] -> [B, S_k, H, D_k], so the S_k = {S_k} "
    "positions land where the H = {H} heads should be. For q @ k^T, swap the LAST two axes, the positions and "
    "the features, so the batch and head axes stay in place."
)


_HALF_FILL = (
    "{error}: in {dtype} the largest number is {top:,.0f}, so a fill value such as -1e9 (or "
    "torch.finfo(torch.float32).min) does not fit. Fill with float('-inf'), or torch.finfo(scores.dtype).min, "
    "or pass the boolean mask to scaled_dot_product_attention."
)

_HALF_NAN = (
    "your output has inf or NaN with {dtype} inputs (the float64 and float32 cases were right): something "
    "overflows {dtype}, whose largest number is {top:,.0f}. A fill value of -1e9 added to the scores, or "
    "exp() of unshifted scores, does; use float('-inf') and softmax (or scaled_dot_product_attention)."
)


def _append_one(fn: Callable[..., Any], case: tuple[Tensor, ...]) -> Feedback | None:
    H, H_kv = case[0].shape[1], case[1].shape[1]
    dtype = case[0].dtype
    half = dtype in (torch.float16, torch.bfloat16)
    result, fb = run_reader_code(fn, *(t.clone() for t in case))
    if fb is not None and half and "without overflow" in fb.message:
        return wrong(_HALF_FILL.format(error=fb.message.removeprefix("your code raised ").rstrip("."), dtype=dtype,
                                       top=torch.finfo(dtype).max))
    S_new, S_k = case[0].shape[2], case[1].shape[2] + case[3].shape[2]
    if fb is not None and re.search(r"causal_mask\(\) takes 1 positional argument", fb.message):
        return wrong(f"{fb.message.rstrip('.')}: causal_mask takes the number of keys by keyword, "
                     "causal_mask(S_new, S_k=...); its only positional argument is the number of queries.")
    if fb is not None and "must match the size of tensor" in fb.message:
        error = fb.message.removeprefix("your code raised ")
        sizes = set(mismatched_sizes(fb.message) or ())
        if "dimension 1" in fb.message and H != H_kv and S_k in sizes and H_kv not in sizes:  # heads met positions
            return wrong(_KEYS_TRANSPOSED.format(error=error, H=H, S_k=S_k))
        if "dimension 1" in fb.message and H != H_kv:  # the head axis
            return wrong(_NO_REPEAT.format(error=error, H=H, H_kv=H_kv))
        if "dimension 2" in fb.message and sizes == {S_new, S_k}:  # a square [S_k, S_k] mask against S_new queries
            return wrong(_MASK_SQUARE.format(error=error, S_new=S_new, S_k=S_k))
        if "dimension 3" in fb.message and sizes == {S_new, S_k}:  # a square [S_new, S_new] mask, tril(S_new)
            return wrong(_MASK_NEW_ONLY.format(error=error, S_new=S_new, S_k=S_k))
        if "dimension 3" in fb.message:  # the key axis of the scores: a mask of the wrong width
            return wrong(_MASK_WIDTH.format(error=error, S_new=S_new, S_k=S_k))
    cat_dim = re.search(r"must match except in dimension (-?\d+)", fb.message) if fb is not None else None
    if cat_dim is not None and int(cat_dim.group(1)) % 4 != 2:  # torch.cat along another axis than S
        return wrong(f"torch.cat joined the cache and the new tokens along dimension {cat_dim.group(1)}: the new "
                     "positions go after the cached ones along the sequence axis, dim=2 of [B, H_kv, S, D_k] "
                     "(torch.cat([k_cache, k_new], dim=2)).")
    if fb is not None and "object has no attribute 'append'" in fb.message:
        return wrong("k_cache and v_cache are tensors, not Python lists, so they have no .append "
                     f"({fb.message.removeprefix('your code raised ')}): a tensor cannot grow in place. Build a new, "
                     "longer tensor that joins the cache and the new tokens along the sequence axis, dim=2 of "
                     "[B, H_kv, S, D_k] (torch.cat), and return it as the updated cache.")
    if fb is not None:
        return fb
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        return wrong(f"return three tensors (output, keys, values), got {describe(result)}.")
    out, keys, values = result
    ref_out, ref_k, ref_v = reference_append_and_attend(*case)
    if half:  # the right output of these 16-bit inputs, computed in float64
        ref_out = reference_append_and_attend(*(t.double() for t in case))[0]
    if close(keys, ref_v) and close(values, ref_k):
        return wrong("your keys and values come back swapped: return (output, keys, values), the keys first.")
    order = _tuple_order(result, (reference_append_and_attend(*case)[0], ref_k, ref_v), half)
    if order is not None:
        return wrong(f"your three tensors come back in another order, {order}: return (output, keys, values), the "
                     "attention's output first, then the updated key and value caches.")
    for name, got, exp in (("keys", keys, ref_k), ("values", values, ref_v)):
        if close(got, repeat_kv(exp, H)) and H != H_kv:
            return wrong(f"your cached {name} have the H = {H} repeated heads: store the H_kv = {H_kv} key/value "
                         f"heads and repeat them only for the attention itself; the repeated copy costs {H // H_kv}x the memory.")
        if not close(got, exp):
            cached, new = (case[1], case[3]) if name == "keys" else (case[2], case[4])
            if isinstance(got, Tensor) and tuple(got.shape) == tuple(exp.shape) and close(got, torch.cat([new, cached], 2)):
                return wrong(f"your returned {name} hold the new positions BEFORE the cached ones: the cache keeps the "
                             "positions in the order of the text, oldest first, so each step's new positions belong at "
                             "its end, after the last cached one (the queries' causal mask assumes that order too).")
            if isinstance(got, Tensor) and tuple(got.shape) == tuple(exp.shape):
                return wrong(f"the returned {name} have the right shape but other numbers: they should be the cache "
                             f"with the new positions appended after the cached ones, [B, H_kv, S_past + S_new, D_k].")
            shape = tuple(got.shape) if isinstance(got, Tensor) else describe(got)
            return wrong(f"the returned {name} should be the cache with the new positions appended, shape {tuple(exp.shape)} "
                         f"([B, H_kv, S_past + S_new, D_k]); got {shape}.")
    for name, got in (("keys", keys), ("values", values)):
        if got.dtype != dtype:
            size = "twice" if got.element_size() == 2 * case[1].element_size() else (
                "half" if 2 * got.element_size() == case[1].element_size() else f"{got.element_size()}/{case[1].element_size()} of")
            return wrong(f"your cached {name} come back as {got.dtype}, but the cache is {dtype}: the cache is stored, "
                         f"and a {got.dtype} copy takes {size} its memory"
                         + (" and loses digits" if got.element_size() < case[1].element_size() else "")
                         + ". Keep the cache in its own dtype (append without .float() or .to(...)); compute the "
                         "attention in another dtype if you like, but not the stored keys and values.")
    if half:
        tol = HALF_TOL if dtype == torch.float16 else 2 * HALF_TOL
        if isinstance(out, Tensor) and out.is_floating_point() and close(out, ref_out, atol=tol, rtol=tol):
            return None  # in 16 bits, or wider (a wider output of 16-bit inputs is fine)
        if (isinstance(out, Tensor) and out.is_floating_point() and tuple(out.shape) == tuple(ref_out.shape)
                and not bool(torch.isfinite(out).all()) and not bool(out[..., :-1, :].isnan().all())):
            return wrong(_HALF_NAN.format(dtype=dtype, top=torch.finfo(dtype).max))
    dtype_problem = None if half else _dtype_hint(out, ref_out)
    if dtype_problem is not None:
        return dtype_problem
    if dtype == torch.float64:  # the dtype rule: float32 inside, cast back, is refused even where it fits ATOL
        narrow = reference_append_and_attend(*(t.float() for t in case))[0].double()
        narrower = computed_narrower(out, ref_out, narrow, name="your output")
        if narrower is not None:
            return narrower
    if close(out, ref_out):
        return None
    if isinstance(out, Tensor) and out.is_floating_point() and bool(out.isnan().any()):
        wrong_sign = _manual_attend(case, mask=_wrong_sign(case))  # NaN in the rows that see no key
        if tuple(out.shape) == tuple(wrong_sign.shape) and bool(torch.allclose(
                as_cpu_float64(out), as_cpu_float64(wrong_sign), atol=ATOL, rtol=RTOL, equal_nan=True)):
            return wrong(_WRONG_SIGN)
        row_nan = out.isnan().any(-1)  # [B, H, S_new]
        if bool(row_nan[..., -1].all()):
            return wrong(_FILLED_WHERE_TRUE)
        over_heads = _manual_attend(case, softmax_dim=1, fill=float("-inf"))  # NaN where a row had a masked key
        if tuple(out.shape) == tuple(over_heads.shape) and bool(torch.allclose(
                as_cpu_float64(out), as_cpu_float64(over_heads), atol=ATOL, rtol=RTOL, equal_nan=True)):
            return wrong(_SOFTMAX_OVER_HEADS)
    hint = diagnose(out, APPEND_MISTAKES, *case)
    if hint is not None:
        return hint
    if not isinstance(out, Tensor):
        return wrong(f"output should be a torch.Tensor, got {describe(out)}.")
    return wrong(f"output differs from the last rows of a causal pass over all positions (expected shape "
                 f"{tuple(ref_out.shape)} = [B, H, S_new, D_k]).")


def _solution_append(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_new: Tensor, v_new: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    keys, values = torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)  # [B, H_kv, S_k, D_k]
    H, S_new, S_k = q.shape[1], q.shape[2], keys.shape[2]
    out = F.scaled_dot_product_attention(q, repeat_kv(keys, H), repeat_kv(values, H), attn_mask=causal_mask(S_new, S_k=S_k))
    return out, keys, values


@exercise(solution=_solution_append,
          tables=(MistakeTable(APPEND_MISTAKES, lambda: [_append_case(c) for c in range(len(APPEND_CASES))],
                               lambda *c: reference_append_and_attend(*c)[0]),),
          not_generic={"float64": "the returned keys and values are the stored cache, which keeps its own dtype (the "
                                  "output may be wider)"})
def check_append_and_attend(fn: Callable[..., Any]) -> Feedback:
    """Check ``fn(q, k_cache, v_cache, k_new, v_new) -> (output, keys, values)`` on the cases of
    :data:`APPEND_CASES` (GQA with two new tokens; MQA with five, in float32), then on the 16-bit
    cases of :data:`HALF_APPEND_CASES` (float16 and bfloat16)."""
    for c in range(len(APPEND_CASES) + len(HALF_APPEND_CASES)):
        problem = _append_one(fn, _append_case(c))
        if problem is not None:
            return problem
    return correct("the new tokens get exactly the last rows of one causal pass over all positions (checked for GQA "
                   "with two new tokens and MQA with five, and in float16 and bfloat16).")


def full_causal_pass(case: tuple[Tensor, ...]) -> Tensor:
    """The last ``S_new`` rows of one causal pass over all positions (what the cache must reproduce)."""
    q_new, keys, values = case[0], *_cat(*case)
    S_new = q_new.shape[2]
    q_all = torch.cat([torch.zeros_like(keys[:, :1, :-S_new]).expand(-1, q_new.shape[1], -1, -1), q_new], 2)
    return _attend(q_all, keys, values, is_causal=True)[:, :, -S_new:]  # S_q == S_k: top-left is bottom-right


# ---- exercise 2: a windowed cache's size ----------------------------------------------------------

#: 12 query heads, not 16: with 16 the group size H / H_kv = 4 would equal H_kv and hide that confusion
_WINDOW_MODEL = dict(layers=24, heads=12, kv_heads=4, head_dim=96, window=2048, dtype_bytes=2)


def reference_window_cache_bytes(seq_len: int) -> int:
    """Bytes of the described model's cache for one sequence of ``seq_len`` tokens."""
    m = _WINDOW_MODEL
    kept = min(seq_len, m["window"])
    return 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * kept * m["dtype_bytes"]


def _bytes(kept: Callable[[int], int], heads: str | int = "kv_heads", factor: int = 2, layers: bool = True) -> Callable[[int], int]:
    m = _WINDOW_MODEL
    n_layers = m["layers"] if layers else 1
    n_heads = m[heads] if isinstance(heads, str) else heads
    return lambda S: factor * n_layers * n_heads * m["head_dim"] * kept(S) * m["dtype_bytes"]


_W = _WINDOW_MODEL["window"]
_H, _H_KV = _WINDOW_MODEL["heads"], _WINDOW_MODEL["kv_heads"]
WINDOW_MISTAKES = (
    Mistake("window + 1", _bytes(lambda S: min(S, _W + 1)),
            "off by one: a query sees the last `window` positions itself included, so the rolling buffer keeps "
            "window = 2048 positions, not window + 1 (the paper's 'i - W to i' would be W + 1)."),
    Mistake("window - 1", _bytes(lambda S: min(S, _W - 1)),
            "off by one: the buffer keeps window = 2048 positions; the newest token is one of them."),
    Mistake("min(seq_len - 1, window)", _bytes(lambda S: min(S - 1, _W)),
            "you kept seq_len - 1 positions: the cache also holds the newest token's key and value (they are "
            "written before its query attends), so a sequence of seq_len tokens caches min(seq_len, window) positions."),
    Mistake("no window", _bytes(lambda S: S),
            "beyond 2048 tokens the cache stops growing: it keeps only the last window positions (min(seq_len, window))."),
    Mistake("query heads", _bytes(lambda S: min(S, _W), heads="heads"),
            f"you cached the {_H} query heads: only the {_H_KV} key/value heads are stored; grouped-query attention "
            "repeats them at compute time."),
    Mistake("query heads per key/value head", _bytes(lambda S: min(S, _W), heads=_H // _H_KV),
            f"you counted H / H_kv = {_H // _H_KV} heads, the query heads that share each key/value head (the group "
            f"size): the cache stores every key/value head, H_kv = {_H_KV} of them."),
    Mistake("float32 and query heads", _bytes(lambda S: min(S, _W), heads="heads", factor=4),
            f"two slips at once: you cached the {_H} query heads (only the {_H_KV} key/value heads are stored), and "
            "you counted 4 bytes per number, as for float32 (a bfloat16 number takes 2 bytes)."),
    # In this model a number takes 2 bytes, so "K only" and "numbers, not bytes" give the same answer:
    # one entry names both.
    Mistake("half: K only, or numbers", _bytes(lambda S: min(S, _W), factor=1),
            "half the answer. Either you counted the keys only (the cache holds keys AND values), or you counted "
            "numbers instead of bytes (each bfloat16 number takes 2 bytes)."),
    Mistake("one key/value head", lambda S: reference_window_cache_bytes(S) / _WINDOW_MODEL["kv_heads"],
            "a quarter of the answer: your count holds 96 numbers per position, key or value, and layer, as if there "
            "were one key/value head, or as if 96 were the width of all heads together. 96 is the width of EACH "
            "head: count every key/value head the model caches."),
    Mistake("4 bytes per number", _bytes(lambda S: min(S, _W), factor=4),
            "twice the answer: a bfloat16 number takes 2 bytes, not 4 (4 is float32)."),
    Mistake("bits, not bytes", _bytes(lambda S: min(S, _W), factor=16),
            "eight times the answer: those are bits. A bfloat16 number takes 2 bytes (16 bits); the function "
            "returns bytes."),
    Mistake("one layer", _bytes(lambda S: min(S, _W), layers=False),
            "that is one layer's cache: each of the 24 layers keeps its own keys and values, so multiply by the layers."),
    Mistake("always the full window", _bytes(lambda S: _W),
            "you return the full window's cache for every length: a sequence shorter than the window keeps only "
            "its seq_len positions, min(seq_len, window)."),
    Mistake("max for min", _bytes(lambda S: max(S, _W)),
            "you took max(seq_len, window): a short sequence then gets a full window's cache and a long one keeps "
            "growing. The buffer keeps the window's positions at most and never more than the sequence has: the "
            "smaller of the two."),
    Mistake("half the window (two-sided)", _bytes(lambda S: min(S, _W // 2)),
            "you kept window / 2 = 1024 positions, as in Longformer's window of W/2 on each side: a decoder's sliding "
            "window is one-sided, so each query sees the last window = 2048 positions, and the cache keeps all 2048."),
    Mistake("MiB", lambda S: reference_window_cache_bytes(S) / 2**20,
            "those are MiB (you divided by 2**20): the function returns bytes."),
    Mistake("KiB", lambda S: reference_window_cache_bytes(S) / 2**10,
            "those are KiB (you divided by 2**10 = 1024): the function returns bytes."),
    Mistake("GiB", lambda S: reference_window_cache_bytes(S) / 2**30,
            "those are GiB (you divided by 2**30): the function returns bytes."),
    Mistake("decimal GB", lambda S: reference_window_cache_bytes(S) / 1e9,
            "those are decimal gigabytes (you divided by 10**9, where a GiB would be 2**30 bytes): the function "
            "returns bytes, unconverted; convert only where you print them."),
    Mistake("seq_len % window", _bytes(lambda S: S % _W),
            "you counted seq_len % window positions: that is the slot of the rolling buffer the next token is written "
            "to, not how many positions the buffer holds. A buffer that has wrapped around is full, and stays full."),
    Mistake("a 2W buffer's reserve", _bytes(lambda S: 2 * _W),
            f"you return, at every length, what a buffer of 2 x window = {2 * _W} positions reserves (as the compacting "
            "KVCache of section 10.6 does): this model keeps its window in a ring buffer of exactly window slots, and "
            "the question is what the cache holds, which for a sequence shorter than the window is only its "
            "seq_len positions."),
    Mistake("up to 2W positions", _bytes(lambda S: min(S, 2 * _W)),
            f"past the window your cache keeps growing, up to 2 x window = {2 * _W} positions, as a compacting buffer "
            "of 2W holds between two compactions: this model's ring buffer has exactly window slots and overwrites "
            "the oldest, so it never holds more than the window."),
    Mistake("query heads and no window", _bytes(lambda S: S, heads="heads"),
            f"two slips at once: you cached the {_H} query heads (only the {_H_KV} key/value heads are stored; grouped-query "
            "attention repeats them at compute time), and the cache keeps growing past the window (it keeps only the "
            "last window positions)."),
)


def _window_vector(f: Callable[[int], Any]) -> tuple[float, ...]:
    return tuple(float(f(S)) for S in WINDOW_LENGTHS)


#: The sequence lengths the window checker tries (short, around the window, far beyond it).
WINDOW_LENGTHS: tuple[int, ...] = (100, 2047, 2048, 2049, 10_000)


@exercise(solution=reference_window_cache_bytes,
          tables=(MistakeTable(tuple(Mistake(m.name, lambda m=m: _window_vector(m.compute), m.hint) for m in WINDOW_MISTAKES),
                               lambda: [()], lambda: _window_vector(reference_window_cache_bytes)),),
          not_generic={"float16": "the answer is a count"})
def check_window_cache_bytes(fn: Callable[[int], Any]) -> Feedback:
    """Check ``fn(seq_len) -> bytes`` for the model described in the exercise, at the lengths of
    :data:`WINDOW_LENGTHS`; any real-scalar form is accepted."""
    expected = list(_window_vector(reference_window_cache_bytes))

    def generic(got: list[float]) -> str:
        bad = next(i for i, (g, e) in enumerate(zip(got, expected)) if g != e)
        return (f"for seq_len = {WINDOW_LENGTHS[bad]} you return {got[bad]:,.6g} bytes; count 2 x layers x KV heads x "
                "head dim x cached positions x bytes per number.")

    return check_number_cases(
        fn, tuple((S,) for S in WINDOW_LENGTHS), reference_window_cache_bytes, WINDOW_MISTAKES, what="a number of bytes",
        same=lambda a, b: math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0), generic=generic,
        done=f"{expected[-1]:,.0f} bytes = {expected[-1] / 2**20:.0f} MiB per sequence, whatever the length beyond 2048.")


# ---- figure: cache against context ----------------------------------------------------------------

OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")


def cache_vs_context_figure(models: list[ModelConfig] | None = None) -> Any:
    """Cache GiB of one sequence (16-bit) against context, each model up to its context (solid), its weights dashed.

    Models whose caches coincide (Llama 2 70B and Llama 3.1 70B up to 4k) are told apart by line width
    and marker; the weight lines, which sit in two clusters a few GiB apart, are labelled on the plot
    by cluster, in fonts that stay legible when the figure is shown 358 px wide.
    """
    import matplotlib.pyplot as plt

    models = MODELS if models is None else models
    styles = [("o", 4.0), ("s", 1.8), ("^", 2.6), ("D", 1.8), ("v", 2.6), ("P", 1.8)]
    fig, ax = plt.subplots(figsize=(5.0, 5.8))
    for m, colour, (marker, lw) in zip(models, OKABE_ITO, styles):
        lengths = np.unique(np.geomspace(256, m.context, 60).astype(int))
        ax.plot(lengths, [m.cache_bytes(int(S)) / 2**30 for S in lengths], color=colour, lw=lw, ls="-",
                marker=marker, markevery=12, ms=7, label=m.name.split(" (")[0])
        ax.plot([m.context], [m.cache_bytes(m.context) / 2**30], marker, color=colour, ms=10)
        ax.axhline(m.weight_bytes() / 2**30, color=colour, lw=1.4, ls=(0, (5, 3)), alpha=0.9)
    ax.set_xscale("log", base=2)
    ticks = [256, 1024, 4096, 16384, 65536, 131072]
    ax.set_xticks(ticks, ["256", "1k", "4k", "16k", "64k", "128k"])
    ax.set_yscale("log")
    ax.set_xlim(200, 131072 * 1.15)
    # the weights cluster by model size: one label per cluster, written on its lines
    clusters: dict[bool, list[float]] = {}
    for m in models:
        clusters.setdefault(m.weight_bytes() > 50 * 2**30, []).append(m.weight_bytes() / 2**30)
    for big, gibs in clusters.items():
        text = (f"weights, {min(gibs):.1f}-{max(gibs):.1f} GiB" if len(gibs) > 1 else f"weights, {gibs[0]:.1f} GiB")
        ax.text(230, max(gibs) * 1.12, ("70B models: " if big else "7-8B models: ") + text, fontsize=12,
                color="#333333", va="bottom", ha="left")
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * 1.6)
    ax.tick_params(labelsize=12)
    ax.set_xlabel("context length (tokens, one sequence)", fontsize=12)
    ax.set_ylabel("GiB (16-bit)", fontsize=12)
    ax.set_title("KV cache of one sequence (solid)\nagainst the weights (dashed)", fontsize=12)
    ax.legend(fontsize=12, loc="upper center", bbox_to_anchor=(0.45, -0.16), ncol=2, frameon=False)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


# ---- exercise 3: decode intensity -----------------------------------------------------------------

def reference_decode_intensity(D: int, H: int, H_kv: int, S: int, batch: int) -> float:
    """FLOPs per byte of one decode step of an attention sublayer (16-bit, activations left out)."""
    d_k = D // H
    flops = batch * layer_flops(D, H, H_kv, 1, S)
    weights = (2 * D * D + 2 * D * H_kv * d_k) * 2
    return flops / (weights + batch * 2 * H_kv * d_k * S * 2)


def _intensity_ceiling(D: int, H: int, H_kv: int, S: int) -> float:
    """The limit of :func:`reference_decode_intensity` as the batch grows: one sequence's FLOPs over
    its cache bytes (the weight reads, shared by the batch, no longer count)."""
    return layer_flops(D, H, H_kv, 1, S) / (2 * H_kv * (D // H) * S * 2)


def _intensity(weights_per_seq: bool = False, cache_once: bool = False, nbytes: int = 2, cache_heads: str = "kv",
               kv: int = 2, mha_weights: bool = False, activations: bool = False, flops_batch: bool = True,
               cache_bytes: bool = True, prefill: bool = False, weights_kv: str = "D H_kv d_k",
               cache_width: str = "d_k") -> Callable[..., float]:
    def f(D: int, H: int, H_kv: int, S: int, batch: int) -> float:
        d_k = D // H
        flops = (batch if flops_batch else 1) * layer_flops(D, H, H_kv, S if prefill else 1, S)
        kv_weights = {"D H_kv d_k": 2 * D * H_kv * d_k, "none": 0, "D H_kv": 2 * D * H_kv}[weights_kv]
        weight_numbers = 4 * D * D if mha_weights else 2 * D * D + kv_weights
        d_k = D if cache_width == "D" else d_k
        weights = weight_numbers * nbytes * (batch if weights_per_seq else 1)
        heads = H_kv if cache_heads == "kv" else H
        cache = (1 if cache_once else batch) * kv * heads * d_k * S * nbytes * (1 if cache_bytes else 0)
        extra = 0
        if activations:  # the per-token activations that the exercise leaves out
            extra = batch * (layer_bytes(D, H, H_kv, 1, S) - layer_bytes(D, H, H_kv, 1, S, activations=False))
        return flops / (weights + cache + extra)
    return f


INTENSITY_CASES = ((256, 8, 2, 300, 4), (384, 12, 3, 1000, 16))  # (D, H, H_kv, S, batch): every size differs
INTENSITY_MISTAKES = (
    Mistake("weights read per sequence", _intensity(weights_per_seq=True),
            "you read the weights once per sequence: a batched decode step reads every weight once and applies it to "
            "all B new tokens; that sharing is what batching buys."),
    Mistake("one cache for the batch", _intensity(cache_once=True),
            "you read one cache for the whole batch: every sequence has its own cached keys and values, so the cache "
            "bytes grow with B."),
    Mistake("one byte per number", _intensity(nbytes=1),
            "you counted numbers, not bytes: in 16-bit each weight and cached number takes 2 bytes."),
    Mistake("query heads cached", _intensity(cache_heads="q"),
            "the cache holds the H_kv key/value heads, not the H query heads."),
    Mistake("keys only", _intensity(kv=1),
            "the cache holds keys AND values: 2 x H_kv x D_k numbers per position."),
    Mistake("multi-head weights", _intensity(mha_weights=True),
            "you counted 4 D^2 weights, as for multi-head attention: with grouped-query attention the key and value "
            "projections are D x (H_kv D_k) each, so the weights are 2 D^2 + 2 D H_kv D_k numbers."),
    Mistake("activations counted", _intensity(activations=True),
            "you counted the activations too (the input, query, attention output and output of every token): leave "
            "them out here; read only the weights and the caches."),
    Mistake("FLOPs of one sequence", _intensity(flops_batch=False),
            "your FLOPs are one sequence's: every sequence of the batch does its own projections and attention, "
            "so multiply the FLOPs by the batch (the weights are still read once)."),
    Mistake("cache left out", _intensity(cache_bytes=False),
            "you counted the weights' bytes only: each sequence also reads its own key/value cache, "
            "batch x 2 x H_kv x d_k x S numbers of 2 bytes."),
    Mistake("weights left out", lambda D, H, H_kv, S, batch: (
        batch * layer_flops(D, H, H_kv, 1, S) / (batch * 2 * H_kv * (D // H) * S * 2)),
            "you counted the caches' bytes only: the step also reads every weight once, 2 D^2 + 2 D H_kv D_k "
            "numbers of 2 bytes, shared by the whole batch (that shared read is what batching spreads out)."),
    Mistake("four bytes per number", _intensity(nbytes=4),
            "half the right intensity: either you counted 4 bytes per number, as for float32 (the step is in 16-bit, "
            "so each weight and cached number takes 2 bytes), or you counted a multiply-add as 1 FLOP (it is 2, as "
            "layer_flops counts)."),
    Mistake("cache of S + 1 positions", lambda D, H, H_kv, S, batch: (
        batch * layer_flops(D, H, H_kv, 1, S)
        / ((2 * D * D + 2 * D * H_kv * (D // H)) * 2 + batch * 2 * H_kv * (D // H) * (S + 1) * 2)),
            "S already includes the new token: each sequence's cache holds S positions, so count S, not S + 1."),
    Mistake("S + 1 positions", lambda D, H, H_kv, S, batch: reference_decode_intensity(D, H, H_kv, S + 1, batch),
            "S already includes the new token: the step attends over S positions and reads a cache of S positions, "
            "so do not add 1."),
    Mistake("FLOPs with H_kv = H", lambda D, H, H_kv, S, batch: (
        batch * layer_flops(D, H, H, 1, S)
        / ((2 * D * D + 2 * D * H_kv * (D // H)) * 2 + batch * 2 * H_kv * (D // H) * S * 2)),
            "your FLOPs project keys and values for all H heads, as in multi-head attention: here the key and value "
            "projections produce H_kv heads, so pass H_kv to layer_flops(D, H, H_kv, 1, S), not H."),
    Mistake("W_O left out", lambda D, H, H_kv, S, batch: (
        batch * (layer_flops(D, H, H_kv, 1, S) - 2 * D * D)
        / ((D * D + 2 * D * H_kv * (D // H)) * 2 + batch * 2 * H_kv * (D // H) * S * 2)),
            "you left out the output projection W_O: the sublayer ends with a D x D matmul, D^2 weights read once "
            "per step and 2 D^2 FLOPs per sequence."),
    Mistake("W_O left out of the weights", lambda D, H, H_kv, S, batch: (
        batch * layer_flops(D, H, H_kv, 1, S)
        / ((D * D + 2 * D * H_kv * (D // H)) * 2 + batch * 2 * H_kv * (D // H) * S * 2)),
            "your weights leave out the output projection W_O, D x D: the weights are W_Q and W_O (D^2 each) plus "
            "W_K and W_V (D x H_kv D_k each), 2 D^2 + 2 D H_kv D_k numbers."),
    Mistake("integer division", lambda D, H, H_kv, S, batch: float(batch * layer_flops(D, H, H_kv, 1, S)
                                                                    // ((2 * D * D + 2 * D * H_kv * (D // H)) * 2
                                                                        + batch * 2 * H_kv * (D // H) * S * 2)),
            "use / not //: the intensity is a fraction (FLOPs per byte), and // floors it to a whole number."),
    Mistake("S - 1 cached positions", lambda D, H, H_kv, S, batch: reference_decode_intensity(D, H, H_kv, S - 1, batch),
            "S already includes the new token: the step attends over S positions and reads a cache of S positions, "
            "so do not subtract 1."),
    Mistake("S - 1 positions in the cache", lambda D, H, H_kv, S, batch: (
        batch * layer_flops(D, H, H_kv, 1, S)
        / ((2 * D * D + 2 * D * H_kv * (D // H)) * 2 + batch * 2 * H_kv * (D // H) * (S - 1) * 2)),
            "S already includes the new token: each sequence's cache holds S positions, so count S, not S - 1."),
    Mistake("FLOPs per bit", _intensity(nbytes=16),
            "an eighth of the right intensity: you counted bits (16 per number) where the intensity counts bytes. "
            "In 16-bit each weight and cached number takes 2 bytes."),
    Mistake("bytes per FLOP", lambda *c: 1 / reference_decode_intensity(*c),
            "your ratio is upside down: that is bytes per FLOP. The intensity is FLOPs divided by bytes."),
    Mistake("prefill FLOPs", _intensity(prefill=True),
            "your FLOPs are a prefill's: layer_flops(D, H, H_kv, S, S) projects and attends S new positions. A decode "
            "step has ONE new position per sequence, which attends over the S cached ones: S_new = 1."),
    Mistake("layer_bytes as it is, times the batch", _intensity(weights_per_seq=True, activations=True),
            "B x layer_bytes(D, H, H_kv, 1, S) makes two slips at once: layer_bytes reads the weights for ONE call, so "
            "multiplying it by B reads them once per sequence, and its default activations=True counts the activations "
            "too. Read the weights once for the whole batch, add B caches, and pass activations=False."),
    Mistake("layer_bytes as it is, weights once", lambda D, H, H_kv, S, batch: (
        batch * layer_flops(D, H, H_kv, 1, S)
        / (layer_bytes(D, H, H_kv, 1, S) + (batch - 1) * 2 * H_kv * (D // H) * S * 2)),
            "your weights are read once and every sequence reads its cache, but the bytes come from "
            "layer_bytes(D, H, H_kv, 1, S) as it is: its default activations=True also counts one token's "
            "activations (input, query, attention output and output), which this exercise leaves out. Count only "
            "the weights and the caches (activations=False)."),
    Mistake("cache heads D wide", _intensity(cache_width="D"),
            "your cache counts D numbers per key/value head: D is the model width, and a head is D_k = D / H wide, "
            "so a position caches 2 x H_kv x D_k numbers."),
    Mistake("key and value projections left out", _intensity(weights_kv="none"),
            "you counted only the query and output projections, 2 D^2 weights: the key and value projections are "
            "read too, D x (H_kv D_k) weights each."),
    Mistake("key and value projections D x H_kv", _intensity(weights_kv="D H_kv"),
            "your key and value projections have D x H_kv weights each: each maps D inputs to H_kv heads of D_k "
            "outputs each, so it is D x (H_kv D_k)."),
    Mistake("rounded to a whole number", lambda *c: float(math.ceil(reference_decode_intensity(*c))),
            "the intensity is a ratio and stays fractional: do not round it (math.ceil, round or //)."),
    Mistake("rounded to 1 decimal", lambda *c: round(reference_decode_intensity(*c), 1),
            "close, but rounded: return the unrounded ratio (more digits); the checker compares to about one part "
            "in a million, and rounding belongs in the print, not in the function."),
    Mistake("rounded to 2 decimals", lambda *c: round(reference_decode_intensity(*c), 2),
            "close, but rounded: return the unrounded ratio (more digits); the checker compares to about one part "
            "in a million, and rounding belongs in the print, not in the function."),
)


def _number(value: Any) -> tuple[float | None, Feedback | None]:
    x = as_number(value)
    if x is None:
        return None, wrong(f"return a number, got {describe(value)}.")
    if not math.isfinite(x):
        return None, wrong(f"you return {x}: return a finite number.")
    return x, None


def _vector(f: Callable[..., Any], cases: tuple) -> tuple[Any, ...]:
    """``f`` on every case: the checkers compare a reader's answers on all cases together."""
    return tuple(f(*case) for case in cases)


def _solution_intensity(D: int, H: int, H_kv: int, S: int, batch: int) -> float:
    d_k = D // H
    flops = batch * layer_flops(D, H, H_kv, 1, S)
    return flops / ((2 * D * D + 2 * D * H_kv * d_k) * 2 + batch * 2 * H_kv * d_k * S * 2)


@exercise(solution=_solution_intensity,
          tables=(MistakeTable(tuple(Mistake(m.name, lambda m=m: _vector(m.compute, INTENSITY_CASES), m.hint)
                                     for m in INTENSITY_MISTAKES),
                               lambda: [()], lambda: _vector(reference_decode_intensity, INTENSITY_CASES)),),
          not_generic={"float16": "the answer is one number"})
def check_decode_intensity(fn: Callable[..., Any]) -> Feedback:
    """Check ``fn(D, H, H_kv, S, batch) -> FLOPs per byte`` on two configurations that differ in every size."""
    return check_number_cases(
        fn, INTENSITY_CASES, reference_decode_intensity, INTENSITY_MISTAKES,
        done="the batch shares the weight reads but not the caches, so the intensity rises with B towards a ceiling "
             "set by the cache: one sequence's FLOPs over its cache bytes, "
             + " and ".join(f"{_intensity_ceiling(*c[:4]):.2f}" for c in INTENSITY_CASES)
             + " FLOPs per byte on these two cases. Attention's own part of it is H / H_kv (here "
             + " and ".join(f"{c[1] // c[2]}" for c in INTENSITY_CASES)
             + "); the projections add their FLOPs, spread over each sequence's cache.",
        generic="FLOPs: B x layer_flops(D, H, H_kv, 1, S). Bytes: the weights (2 D^2 + 2 D H_kv D_k numbers) once, plus "
                "B caches of 2 x H_kv x D_k x S numbers, 2 bytes each.",
        what="FLOPs per byte")


# ---- exercise 4: MLA counts -----------------------------------------------------------------------

def reference_mla_cache(layers: int, latent: int, rope: int, head_dim: int) -> tuple[float, float]:
    """``(bytes per token over all layers in 16-bit, the GQA key/value heads of width head_dim with the same cache)``."""
    per_layer = latent + rope  # one latent and one shared rotary key per token and layer
    return float(per_layer * layers * 2), per_layer / (2 * head_dim)


MLA_CASES = ((60, 512, 64, 128), (27, 256, 32, 96))  # (layers, latent, rope, head_dim)
MLA_MISTAKES = (
    Mistake("no rotary key", lambda l, L, r, d: (float(L * l * 2), L / (2 * d)),
            "the decoupled rotary key is cached too: latent + rope numbers per token and layer."),
    Mistake("latent as keys and values", lambda l, L, r, d: (float(2 * (L + r) * l * 2), (L + r) / d),
            "the latent is stored once: keys and values are both rebuilt (or absorbed) from the same latent."),
    Mistake("one byte per number", lambda l, L, r, d: (float((L + r) * l), (L + r) / (2 * d)),
            "in 16-bit each number is 2 bytes."),
    # the same number comes from two slips: a GQA head counted as head_dim numbers, or MLA's side counted in bytes
    Mistake("GQA heads without V, or MLA's side in bytes", lambda l, L, r, d: (float((L + r) * l * 2), (L + r) / d),
            "your equivalent heads are twice too many, which one of two slips gives: either the GQA head was counted "
            "as head_dim numbers, but it caches a key AND a value per token and layer; or MLA's side was counted in "
            "bytes (2 per number) while the GQA head's side is in numbers. Compare numbers with numbers, both per "
            "token and layer."),
    Mistake("one layer", lambda l, L, r, d: (float((L + r) * 2), (L + r) / (2 * d)),
            "that is one layer's cache: every layer keeps its own latent and rotary key, so multiply by the layers."),
    Mistake("bits, not bytes", lambda l, L, r, d: (float((L + r) * l * 16), (L + r) / (2 * d)),
            "that first number is in bits: a 16-bit number takes 2 bytes, so multiply by 2, not by 16."),
    Mistake("the two numbers swapped", lambda l, L, r, d: ((L + r) / (2 * d), float((L + r) * l * 2)),
            "your two numbers come back swapped: return (bytes per token, equivalent GQA heads), the bytes first."),
    Mistake("heads rounded down", lambda l, L, r, d: (float((L + r) * l * 2), float((L + r) // (2 * d))),
            "your equivalent heads are rounded down (// is floor division): the ratio is a fraction, "
            "(latent + rope) / (2 x head_dim); use /."),
    Mistake("heads rounded with round()", lambda l, L, r, d: (float((L + r) * l * 2), float(round((L + r) / (2 * d)))),
            "you rounded the equivalent heads with round(): it is a ratio of bytes, (latent + rope) / (2 head_dim), and "
            "stays fractional; return it unrounded."),
    Mistake("heads rounded to one decimal", lambda l, L, r, d: (float((L + r) * l * 2), round((L + r) / (2 * d), 1)),
            "your equivalent heads are rounded to one decimal (round(x, 1)): the ratio (latent + rope) / (2 x head_dim) "
            "can need more digits than that (and round() sends a final 5 to the even digit, so it may round down); "
            "return it unrounded."),
    Mistake("rotary key once for all layers", lambda l, L, r, d: (float((L * l + r) * 2), (L + r) / (2 * d)),
            "your bytes count the rotary key once for the whole model: like the latent, every layer computes and "
            "caches its own rotary key, so per token there are layers x (latent + rope) numbers."),
    Mistake("heads rounded up", lambda l, L, r, d: (float((L + r) * l * 2), float(math.ceil((L + r) / (2 * d)))),
            "your equivalent heads are rounded up: the ratio is a fraction, (latent + rope) / (2 x head_dim); "
            "leave it unrounded."),
    # bytes over all layers / (4 x head_dim) is the same number as all layers' numbers / (2 x head_dim)
    Mistake("heads over all layers", lambda l, L, r, d: (float((L + r) * l * 2), (L + r) * l / (2 * d)),
            "your equivalent heads count all layers (or divide the bytes over all layers by 4 x head_dim): "
            "compare one layer's numbers, (latent + rope) / (2 x head_dim), because a GQA head is counted per layer too."),
    Mistake("rotary key counted twice", lambda l, L, r, d: (float((L + 2 * r) * l * 2), (L + 2 * r) / (2 * d)),
            "you counted the rotary key twice: it is one vector of rope numbers per token and layer, shared by all "
            "heads (a key has no rotary value), so the cache holds latent + rope numbers."),
    # 4 bytes per number and a latent and rotary key stored twice (for keys and for values) give the same bytes
    Mistake("four bytes per number, or everything cached twice", lambda l, L, r, d: (float((L + r) * l * 4), (L + r) / (2 * d)),
            "your bytes are twice the answer, which one of two slips gives: either you counted 4 bytes per number, "
            "as for float32, but the cache is 16-bit (2 bytes); or you cached the latent and the rotary key twice, "
            "once for the keys and once for the values, but MLA stores them once and rebuilds (or absorbs) both "
            "from them."),
    Mistake("heads from the bytes over all layers", lambda l, L, r, d: (float((L + r) * l * 2), (L + r) * l / d),
            "your equivalent heads come from the bytes over all layers: a GQA head's 2 x head_dim numbers are per "
            "token AND per layer, so compare the numbers one token caches in ONE layer with a head's, leaving out the "
            "layers and the bytes."),
    Mistake("latent twice, rotary key once", lambda l, L, r, d: (float((2 * L + r) * l * 2), (2 * L + r) / (2 * d)),
            "you cached the latent twice, once for the keys and once for the values: MLA stores it once, and both "
            "are rebuilt (or absorbed) from that one latent."),
    Mistake("heads without the rotary key", lambda l, L, r, d: (float((L + r) * l * 2), L / (2 * d)),
            "your bytes are right, but your equivalent heads leave out the rotary key: compare everything MLA caches "
            "per token and layer, the rotary key included, with a GQA head's numbers."),
    Mistake("heads from the latent alone, per head_dim", lambda l, L, r, d: (float((L + r) * l * 2), L / d),
            "your bytes are right, but your equivalent heads make two slips: they leave out the rotary key, and a GQA "
            "head caches a key AND a value per token and layer, not head_dim numbers."),
    Mistake("heads upside down", lambda l, L, r, d: (float((L + r) * l * 2), 2 * d / (L + r)),
            "your ratio of heads is upside down: divide MLA's numbers per token and layer by a GQA head's 2 x head_dim."),
    Mistake("KiB, not bytes", lambda l, L, r, d: ((L + r) * l * 2 / 2**10, (L + r) / (2 * d)),
            "your first number is in KiB (you divided by 1024): the exercise asks for bytes, so leave the bytes "
            "unconverted; convert only where you print them."),
    Mistake("MiB, not bytes", lambda l, L, r, d: ((L + r) * l * 2 / 2**20, (L + r) / (2 * d)),
            "your first number is in MiB (you divided by 2**20): the exercise asks for bytes, so leave the bytes "
            "unconverted; convert only where you print them."),
    Mistake("GQA head in bytes, MLA in numbers", lambda l, L, r, d: (float((L + r) * l * 2), (L + r) / (4 * d)),
            "your equivalent heads are half the answer: you divided MLA's numbers per token and layer by "
            "4 x head_dim, a GQA head's BYTES (a key and a value of 2 bytes each), so one side is in numbers and "
            "the other in bytes. Compare numbers with numbers (2 x head_dim per GQA head), or bytes with bytes."),
)

#: Mistakes not tried one number at a time: their first number is the right second one, or the other way round.
_MLA_WHOLE_ONLY = ("the two numbers swapped",)


def _solution_mla(layers: int, latent: int, rope: int, head_dim: int) -> tuple[float, float]:
    return float((latent + rope) * layers * 2), (latent + rope) / (2 * head_dim)


@exercise(solution=_solution_mla,
          tables=(MistakeTable(tuple(Mistake(m.name, lambda m=m: _vector(m.compute, MLA_CASES), m.hint) for m in MLA_MISTAKES),
                               lambda: [()], lambda: _vector(reference_mla_cache, MLA_CASES)),),
          not_generic={"float16": "the answer is two numbers"})
def check_mla_cache(fn: Callable[..., Any]) -> Feedback:
    """Check ``fn(layers, latent, rope, head_dim) -> (bytes per token, equivalent GQA heads)``."""
    got = []
    for case in MLA_CASES:
        value, fb = run_reader_code(fn, *case)
        if fb is not None:
            return fb
        if isinstance(value, (Tensor, np.ndarray)):  # an array of two numbers is as good as a tuple
            if value.ndim != 1:
                return wrong(f"return two numbers (bytes per token, equivalent heads), got an array of shape {tuple(value.shape)}.")
            value = list(value)
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            what = f"{len(value)} numbers" if isinstance(value, (tuple, list)) else type(value).__name__
            return wrong(f"return two numbers (bytes per token, equivalent heads), got {what}.")
        pair = []
        for v in value:
            number, fb = _number(v)
            if fb is not None:
                return fb
            pair.append(number)
        got.append(tuple(pair))
    same = lambda a, b: all(abs(x - y) <= 1e-6 * max(1.0, abs(y)) for x, y in zip(a, b))
    if all(same(g, reference_mla_cache(*c)) for g, c in zip(got, MLA_CASES)):
        b, h = reference_mla_cache(*MLA_CASES[0])
        return correct(f"{b:,.0f} bytes per token for DeepSeek-V2's sizes, the cache of {h:.2f} GQA key/value heads of width 128.")
    for m in MLA_MISTAKES:
        if all(same(g, m.compute(*c)) for g, c in zip(got, MLA_CASES)):
            return wrong(m.hint)
    # no known pair: name the slip in the bytes alone (whatever the heads), or in the heads alone when the bytes
    # are right (a slip of the bytes, such as the latent counted twice, often comes with right heads, or the reverse)
    def number(i: int, f: Callable[..., tuple[float, float]]) -> list[float]:
        return [float(f(*c)[i]) for c in MLA_CASES]

    close_all = lambda a, b: same(tuple(a), tuple(b))
    right = [close_all([g[i] for g in got], number(i, reference_mla_cache)) for i in (0, 1)]
    stages = [(0, "your bytes per token are off", "your equivalent heads"), (1, "your equivalent heads are off", None)]
    for i, what, other in stages:
        if right[i] or (i == 1 and not right[0]):
            continue
        for m in MLA_MISTAKES:
            if m.name in _MLA_WHOLE_ONLY or close_all(number(i, m.compute), number(i, reference_mla_cache)):
                continue  # a mistake whose number i is right says nothing about a wrong one
            if close_all([g[i] for g in got], number(i, m.compute)):
                tail = f" ({other} {'are right' if right[1] else 'are off too'})" if other else " (your bytes are right)"
                return wrong(f"{what}: {m.hint.rstrip('.')}{tail}.")
    return wrong("per token and layer MLA caches latent + rope numbers; a GQA key/value head caches 2 x head_dim. "
                 "Multiply by the layers and by 2 bytes for the first number, divide for the second.")


# ---- exercise 5: merging split-KV results ---------------------------------------------------------

def reference_merge_partials(outs: list[Tensor], lses: list[Tensor]) -> Tensor:
    """Merge Flash-Decoding's partial results: ``outs[i] [B, H, 1, D_v]``, ``lses[i] [B, H, 1]`` -> ``[B, H, 1, D_v]``."""
    lse = torch.logsumexp(torch.stack(lses), dim=0)  # [B, H, 1]
    return sum(torch.exp(l - lse)[..., None] * o for o, l in zip(outs, lses))  # [B, H, 1, D_v]


def _merge_case(B: int, H: int, D: int, sizes: tuple[int, ...], shift: float, seed: int,
                dtype: torch.dtype = torch.float64) -> tuple[list[Tensor], list[Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, 1, D, generator=gen, dtype=torch.float64)
    outs, lses = [], []
    for n in sizes:
        k = torch.randn(B, H, n, D, generator=gen, dtype=torch.float64)
        v = torch.randn(B, H, n, D, generator=gen, dtype=torch.float64)
        s = q @ k.transpose(-2, -1) + shift  # [B, H, 1, n]; the shift makes exp overflow
        lses.append(torch.logsumexp(s, -1))  # [B, H, 1]
        outs.append(torch.softmax(s, -1) @ v)  # [B, H, 1, D]
    return [o.to(dtype) for o in outs], [l.to(dtype) for l in lses]


#: Two cases that differ in every size; the second has scores near 1000, where exp overflows even in float64.
MERGE_CASES = ((2, 3, 5, (7, 4, 9), 0.0, 1), (1, 4, 6, (3, 11), 1000.0, 2))
#: 16-bit cases, tried after those: Flash-Decoding's partial results are usually float16 or bfloat16. In
#: float16 the scores sit near 6, so e^lse is near e^8 ~ 3,000, not far from its largest number, 65,504
#: (e^11.1). bfloat16's scores stay near 0: it keeps 8 significant bits, so near 8 its lse values are 1/32 apart.
HALF_MERGE_CASES = ((2, 2, 4, (5, 8, 3), 6.0, 3, torch.float16), (1, 3, 4, (6, 2), 0.0, 4, torch.bfloat16))
MERGE_MISTAKES = (
    Mistake("logsumexp with keepdim=True", lambda outs, lses: _merge_keepdim(outs, lses),
            "your result is [1, B, H, 1, D_v], one axis too many: logsumexp(torch.stack(lses), 0, keepdim=True) keeps "
            "the chunk axis as a 1, so lse is [1, B, H, 1] and every weight exp(lse_i - lse) broadcasts the partial "
            "outputs to [1, B, H, 1, D_v]. Drop the chunk axis: logsumexp(torch.stack(lses), dim=0), without keepdim."),
    Mistake("mean over the chunks", lambda outs, lses: reference_merge_partials(outs, lses) / len(outs),
            "your weighted chunks are averaged (.mean(0), or / len(outs)): the weights exp(lse_i - lse) already sum "
            "to 1 over the chunks, so add the weighted outputs up (.sum(0), or sum(...))."),
    Mistake("plain average", lambda outs, lses: sum(outs) / len(outs),
            "a plain average gives every chunk the same weight; a chunk's weight is its share of the softmax "
            "denominator, exp(lse_i - lse) with lse = logsumexp of all the lse_i."),
    Mistake("weights by key count", lambda outs, lses: sum(o * _count_share(outs, i) for i, o in enumerate(outs)),
            "weighting by the number of keys in each chunk ignores the scores: use exp(lse_i - lse)."),
    Mistake("unnormalised", lambda outs, lses: sum(torch.exp(l)[..., None] * o for o, l in zip(outs, lses)),
            "the weights exp(lse_i) must be divided by their sum: use exp(lse_i - logsumexp(lses))."),
    Mistake("logsumexp over the head axis", lambda outs, lses: _merge_lse_dim(outs, lses, 2),
            "your logsumexp runs over the heads, dim=2 of torch.stack(lses) [chunks, B, H, 1]: take it over "
            "the chunks, dim=0, so each head gets its own total."),
    Mistake("max shift, not normalised", lambda outs, lses: _merge_weights(outs, lses, lambda s: s - s.max(0).values),
            "subtracting the largest lse_i keeps exp from overflowing but does not normalise: the weights "
            "exp(lse_i - max) must still be divided by their sum; subtract logsumexp(lses) instead."),
    Mistake("weights upside down", lambda outs, lses: _merge_weights(outs, lses, lambda s: torch.logsumexp(s, 0) - s),
            "your weights are upside down: chunk i's weight is exp(lse_i - lse), not exp(lse - lse_i)."),
    Mistake("lse_i / sum of lse", lambda outs, lses: _merge_weights(outs, lses, lambda s: torch.log(s / s.sum(0))),
            "lse_i / sum(lse_j) divides logarithms: the weights are exp(lse_i) / sum_j exp(lse_j), which is "
            "exp(lse_i - logsumexp(lses))."),
    Mistake("first two chunks only", lambda outs, lses: _merge_weights(outs[:2], lses[:2], lambda s: s - torch.logsumexp(s, 0)),
            "you merged only the first two chunks: loop over all of them (zip(outs, lses)); there can be any number."),
    Mistake("logsumexp over the batch of the first chunk",
            lambda outs, lses: _merge_weights(outs, lses, lambda s: s - torch.logsumexp(s, 1, keepdim=True)[0]),
            "your logsumexp runs over dim=1 of torch.stack(lses), which is [chunks, B, H, 1]: dim=1 is the batch (the "
            "stack put the chunk axis first), and [0] then keeps the first chunk's total only. Take it over the chunks, "
            "dim=0, so each sequence and head gets its own total over all chunks."),
    Mistake("total lse as the sum of the lse_i", lambda outs, lses: _merge_weights(outs, lses, lambda s: s - s.sum(0)),
            "the total of the chunks is not the sum of their lse_i: each lse_i is the logarithm of a sum of "
            "exponentials, so the chunks' totals combine as log(sum_i exp(lse_i)), a logsumexp over the chunks, "
            "and adding logarithms multiplies the sums instead."),
    Mistake("the chunk with the largest lse", lambda outs, lses: _merge_weights(
                outs, lses, lambda s: torch.where(s == s.amax(0, keepdim=True), 0.0, float("-inf")).to(s.dtype)),
            "you kept only the chunk with the largest lse_i: that is a hard max, and every other chunk's keys also "
            "carry softmax weight. Weight every chunk by its share exp(lse_i - lse), a softmax over the chunks."),
    Mistake("exp2 and log2 on natural logarithms", lambda outs, lses: _merge_weights(
                outs, lses, lambda s: (s - torch.logsumexp(s * math.log(2), 0) / math.log(2)) * math.log(2)),
            "you mixed bases: exp2 and log2 (as Triton kernels use them) need logarithms in base 2, but each lse_i "
            "here is a natural logarithm. Use torch.exp and torch.logsumexp (or multiply the lse_i by log2(e) first)."),
    Mistake("logsumexp over the single query axis", lambda outs, lses: _merge_lse_last_axis(outs, lses),
            "your logsumexp runs over the last axis of torch.stack(lses), [chunks, B, H, 1], which holds a single "
            "entry (the one query), so it changes nothing, and your result gained the chunk axis: "
            "[chunks, B, H, 1, D_v]. Each sequence and head needs one total over its chunks: reduce the axis "
            "that the stack added."),
    Mistake("weighted chunks not added up", lambda outs, lses: torch.stack(
                [torch.exp(l - torch.logsumexp(torch.stack(lses), 0))[..., None] * o for o, l in zip(outs, lses)]),
            "your weights are right, but you stacked the weighted chunks, [chunks, B, H, 1, D_v], instead of adding "
            "them up: the merged output is their sum over the chunks, [B, H, 1, D_v]."),
    Mistake("torch.cat for torch.stack", lambda outs, lses: _merge_weights(
                outs, lses, lambda s: s - torch.logsumexp(torch.cat(lses), 0)),
            "torch.cat(lses) joins the chunks along the batch axis, [chunks x B, H, 1], so your logsumexp adds up "
            "the chunks of every sequence of the batch together. torch.stack(lses) puts the chunks on a new axis of "
            "their own, [chunks, B, H, 1], which you can reduce on its own."),
    Mistake("last chunk only", lambda outs, lses: outs[-1],
            "you returned the last chunk's output alone: the merged output combines every chunk, each weighted by "
            "its share of the softmax denominator."),
    Mistake("summed, not weighted", lambda outs, lses: sum(outs),
            "you added the partial outputs with weight 1 each, but each outs[i] is a weighted average over its own "
            "chunk's keys only: weight chunk i by its share of all the keys, exp(lse_i - lse), with lse the logsumexp of the lse_i "
            "over the chunks (dim=0 of torch.stack(lses)). If your weights came out as 1, they were normalised over "
            "the last axis, which holds a single entry (the one query), instead of over the chunks."),
    Mistake("query axis dropped", lambda outs, lses: reference_merge_partials(outs, lses).squeeze(-2),
            "your values are right, but the single query axis is gone: [B, H, D_v] instead of [B, H, 1, D_v]. "
            "Summing the weighted chunks over their axis (.sum(dim)) removed it along with the chunk axis: keep "
            "the query axis (keepdim=True on a sum over an axis that held it, or sum over the chunk axis only)."),
)

_MERGE_SIZES: dict[int, tuple[int, ...]] = {}

#: The hint for math.exp / math.log (or float()) applied to a tensor of several numbers.
_MATH_ON_TENSORS = (
    "a function of the math module (math.exp, math.log) or float() got a tensor of several numbers ({error}): "
    "they work on ONE Python number. lse_i - lse is a [B, H, 1] tensor, one number per sequence and head: "
    "use torch.exp (torch.log), which works on every entry."
)


def _merge_weights(outs: list[Tensor], lses: list[Tensor], log_w: Callable[[Tensor], Tensor]) -> Tensor:
    """Sum of ``outs`` weighted by ``exp(log_w(torch.stack(lses)))``."""
    w = torch.exp(log_w(torch.stack(lses)))  # [chunks, B, H, 1]
    return sum(w[i][..., None] * o for i, o in enumerate(outs))


def _merge_keepdim(outs: list[Tensor], lses: list[Tensor]) -> Tensor:
    """The merge with lse = logsumexp(stack(lses), 0, keepdim=True): right values, shape [1, B, H, 1, D_v]."""
    lse = torch.logsumexp(torch.stack(lses), 0, keepdim=True)  # [1, B, H, 1]
    return sum(torch.exp(l - lse)[..., None] * o for o, l in zip(outs, lses))  # [1, B, H, 1, D_v]


def _merge_lse_last_axis(outs: list[Tensor], lses: list[Tensor]) -> Tensor:
    """The merge with lse = logsumexp(stack(lses), -1, keepdim=True): [chunks, B, H, 1], the stack itself."""
    lse = torch.logsumexp(torch.stack(lses), -1, keepdim=True)
    return sum(torch.exp(l - lse)[..., None] * o for o, l in zip(outs, lses))


def _merge_lse_over_last_axis(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``, which raised a size mismatch, is the merge with lse = logsumexp(stack(lses), -1): on a
    split where chunks = B = H that mistake broadcasts instead of failing, and gives [B, H, chunks, D_v]."""
    outs, lses = _merge_case(2, 2, 3, (4, 5), 0.0, 11)
    got, fb = run_reader_code(fn, [o.clone() for o in outs], [l.clone() for l in lses])
    if fb is not None or not isinstance(got, Tensor):
        return False
    lse = torch.logsumexp(torch.stack(lses), -1)  # [chunks, B, H]
    return close(got, sum(torch.exp(l - lse)[..., None] * o for o, l in zip(outs, lses)))


def _merge_lse_dim(outs: list[Tensor], lses: list[Tensor], dim: int) -> Tensor:
    stacked = torch.stack(lses)
    return _merge_weights(outs, lses, lambda s: s - torch.logsumexp(stacked, dim, keepdim=True))


def _count_share(outs: list[Tensor], i: int) -> float:
    sizes = _MERGE_SIZES[len(outs)]  # the checker's cases have different chunk counts
    return sizes[i] / sum(sizes)


for _case in MERGE_CASES:
    _MERGE_SIZES[len(_case[3])] = _case[3]


def _solution_merge(outs: list[Tensor], lses: list[Tensor]) -> Tensor:
    lse = torch.logsumexp(torch.stack(lses), dim=0)  # [B, H, 1]
    return sum(torch.exp(l - lse)[..., None] * o for o, l in zip(outs, lses))  # [B, H, 1, D_v]


@exercise(solution=_solution_merge,
          tables=(MistakeTable(MERGE_MISTAKES, lambda: [_merge_case(*c) for c in MERGE_CASES], reference_merge_partials),))
def check_merge_partials(fn: Callable[..., Any]) -> Feedback:
    """Check ``fn(outs, lses) -> merged [B, H, 1, D_v]`` on two splits that differ in every size, then on
    the 16-bit splits of :data:`HALF_MERGE_CASES` (float16 and bfloat16)."""
    for B, H, D, sizes, shift, seed, *dtype in MERGE_CASES + HALF_MERGE_CASES:
        outs, lses = _merge_case(B, H, D, sizes, shift, seed, *dtype)
        half = outs[0].dtype in (torch.float16, torch.bfloat16)
        got, fb = call_reader(fn, ([o.clone() for o in outs], [l.clone() for l in lses]), axes=("B", "H", "1", "D_v"))
        if fb is not None and "must match the size of tensor" in fb.message and _merge_lse_over_last_axis(fn):
            return wrong("your logsumexp runs over the last axis of torch.stack(lses), [chunks, B, H, 1], which holds "
                         "the single query: it does not add up the chunks, and it drops that axis, so lse no longer "
                         "lines up with each lse_i [B, H, 1]. The total needs one logsumexp over the chunks, the axis "
                         "the stack added. "
                         f"({fb.message.removeprefix('your code raised ')})")
        if fb is not None and "must match the size of tensor" in fb.message:
            return wrong("a weight exp(lse_i - lse) has shape [B, H, 1] and a partial output [B, H, 1, D_v]: keep a "
                         "trailing axis on the weight, exp(lse_i - lse)[..., None], so it broadcasts over D_v. "
                         f"({fb.message.removeprefix('your code raised ')})")
        if fb is not None and "only one element tensors can be converted to Python scalars" in fb.message:
            error = fb.message.removeprefix("your code raised ").split(" The math module's")[0].rstrip(".")
            return wrong(_MATH_ON_TENSORS.format(error=error))  # without the shared sentence, which it rewords
        if fb is not None:
            return fb
        expected = reference_merge_partials(outs, lses)
        if half:  # the right merge of these 16-bit partials, computed in float64
            expected = reference_merge_partials([o.double() for o in outs], [l.double() for l in lses])
        if half and isinstance(got, Tensor) and got.shape == expected.shape and not torch.isfinite(got).all():
            dtype = outs[0].dtype
            return wrong(f"your result has inf or NaN with {dtype} partials whose lse is near {shift + 2:.0f} (the "
                         f"float64 cases were right): {dtype}'s largest number is {torch.finfo(dtype).max:,.0f}, so "
                         "exp() overflows above about 11 (float16), and a sum of weights held in 16 bits can too. "
                         "Keep every exponent at most 0: exp(lse_i - lse) with lse = logsumexp(stack(lses), 0).")
        if isinstance(got, Tensor) and got.shape == expected.shape and not torch.isfinite(got).all():
            return wrong(f"your result has inf or NaN when the scores are near {shift:.0f}: exp(lse_i) overflows. "
                         "Subtract the overall logsumexp first: exp(lse_i - lse) is at most 1.")
        if half:
            tol = HALF_TOL if outs[0].dtype == torch.float16 else 2 * HALF_TOL
            if isinstance(got, Tensor) and got.is_floating_point() and close(got, expected, atol=tol, rtol=tol):
                continue  # in 16 bits, or wider
            return diagnose(got, MERGE_MISTAKES, outs, lses) or wrong(
                f"your merge is right in float64 but not with {outs[0].dtype} partials (expected shape "
                f"{tuple(expected.shape)}, compared to {tol:g}): compute the weights exp(lse_i - lse) in the partials' "
                "dtype or wider, without constants that do not fit in 16 bits.")
        dtype_problem = _dtype_hint(got, expected)
        if dtype_problem is not None:
            return dtype_problem
        if outs[0].dtype == torch.float64:  # the dtype rule: float32 inside, cast back, is refused even within ATOL
            narrow = reference_merge_partials([o.float() for o in outs], [l.float() for l in lses]).double()
            narrower = computed_narrower(got, expected, narrow, name="your merged output")
            if narrower is not None:
                return narrower
        if close(got, expected):
            continue
        return not_a_tensor(got, expected, name="your merged output") or diagnose(got, MERGE_MISTAKES, outs, lses) or wrong(
            f"the merged output differs from attention over all {sum(sizes)} keys (expected shape {tuple(expected.shape)}).")
    return correct("the merge is exact: the partial results of any split combine into attention over all keys "
                   "(in float16 and bfloat16 too, to their precision).")


# ---- diagrams (drawn from the chapter's constants; tools/build_diagrams.py writes them) ----------

from .diagrams import MUTED, Diagram, diagram  # noqa: E402

#: the decoding example of section 10.1: a prompt of 4 tokens, then one token per step
PROMPT_TOKENS, GQA_HEADS, GQA_KV_HEADS = 4, 8, 2
#: the sliding window of the generation slider
WINDOW = 4


@diagram
def cache_growth_diagram() -> Diagram:
    """The cache after the prefill and after two decode steps: one new key/value row per step."""
    steps = [("prefill", PROMPT_TOKENS, PROMPT_TOKENS), ("step 1", PROMPT_TOKENS + 1, 1),
             ("step 2", PROMPT_TOKENS + 2, 1)]
    d = Diagram("ch10_cache_growth", 440, 330, title="The KV cache grows by one row per step",
                alt=f"Three snapshots of one layer's KV cache. After the prefill it holds {PROMPT_TOKENS} rows, "
                    f"one key and value per prompt token, written in one pass by {PROMPT_TOKENS} queries. "
                    "Each decode step appends one new row (highlighted) and uses one new query, which "
                    "attends over every row in the cache; no query is kept.")
    row_h, w, top = 26, 110, 60
    for i, (name, held, new) in enumerate(steps):
        x = 20 + i * 150
        d.text(x + w / 2, 30, name, size=15, weight="bold")
        d.text(x + w / 2, 50, f"{new} new " + ("queries" if new > 1 else "query"), size=14, color=MUTED)
        for p in range(held):
            fresh = p >= held - new
            d.rect(x, top + p * row_h, w, row_h - 4, fill="orange" if fresh else "blue", tint=True,
                   stroke="orange" if fresh else "blue", width=2)
            d.text(x + w / 2, top + p * row_h + 16, f"k{p}, v{p}", size=14)
        d.text(x + w / 2, top + held * row_h + 20, f"[B, H_kv, {held}, D_k]", size=14, color=MUTED)
        if i < 2:
            d.arrow(x + w + 6, top + 40, x + 144, top + 40)
    d.rect(20, 290, 14, 14, fill="orange", tint=True, stroke="orange", width=2)
    d.text(40, 302, "written this step", size=14, anchor="start")
    d.rect(200, 290, 14, 14, fill="blue", tint=True, stroke="blue", width=2)
    d.text(220, 302, "cached, read every step", size=14, anchor="start")
    return d


@diagram
def gqa_heads_diagram() -> Diagram:
    """Grouped-query attention: H query heads share H_kv cached key/value heads."""
    H, H_kv = GQA_HEADS, GQA_KV_HEADS
    group = H // H_kv
    d = Diagram("ch10_gqa_heads", 440, 250, title="Grouped-query attention: query heads share cached heads",
                alt=f"{H} query heads in a row above {H_kv} key/value heads. Lines join each group of {group} "
                    f"query heads to the one key/value head they share. Only the {H_kv} key/value heads are "
                    f"cached, so the cache is {group} times smaller than with {H} key/value heads.")
    w, gap, x0 = 40, 10, 20
    d.text(x0, 28, f"H = {H} query heads (not cached)", size=14, anchor="start")
    for h in range(H):
        d.box(x0 + h * (w + gap), 40, w, 34, f"q{h}", color="sky", size=14)
    span = group * (w + gap) - gap
    for g in range(H_kv):
        gx = x0 + g * group * (w + gap)
        kx, kw = gx + span / 2 - 60, 120
        for h in range(group):
            cx = gx + h * (w + gap) + w / 2
            d.line(cx, 74, kx + kw / 2, 140, color=MUTED)
        d.box(kx, 140, kw, 44, f"k{g}, v{g}", color="orange", size=15)
    d.text(x0, 214, f"cached: H_kv = {H_kv} key/value heads,", size=14, anchor="start")
    d.text(x0, 234, f"{group}x smaller than one per query head", size=14, anchor="start")
    return d


@diagram
def sliding_window_diagram() -> Diagram:
    """A causal mask with a sliding window: each query sees itself and the W - 1 positions before it."""
    S, W = 8, WINDOW
    fills = [["green" if i - W < j <= i else ("grey" if j > i else "none") for j in range(S)] for i in range(S)]
    labels = [["" if i - W < j <= i or j > i else "x" for j in range(S)] for i in range(S)]
    d = Diagram("ch10_sliding_window", 440, 370, title=f"A sliding window of W = {W}",
                alt=f"An {S} by {S} grid of queries (rows) against keys (columns). Each row is shaded green over "
                    f"its own position and the {W - 1} before it; later keys are masked (grey) and keys more than "
                    f"{W - 1} positions back are crossed out, since they have left the window. The cache needs "
                    f"only the last {W} positions.")
    cell, x, y = 28, 96, 70
    d.text(x + S * cell / 2, 24, "keys (cached positions)", size=14)
    d.grid(x, y, fills, cell=cell, labels=labels, size=14,
           col_labels=[str(j) for j in range(S)], row_labels=[str(i) for i in range(S)])
    d.text(12, y - 6, "queries", size=14, anchor="start")
    lx = x + S * cell + 16
    d.text(lx, y + 20, "the cache", size=14, anchor="start")
    d.text(lx, y + 40, f"holds the", size=14, anchor="start")
    d.text(lx, y + 60, f"last W = {W}", size=14, anchor="start")
    d.text(lx, y + 80, "positions", size=14, anchor="start")
    ly = y + S * cell + 22
    for k, (c, s_) in enumerate((("green", "seen"), ("grey", "future (masked)"), ("none", "x dropped"))):
        lx_ = (20, 110, 300)[k]
        d.rect(lx_, ly, 16, 16, fill=c, tint=c != "none", stroke="#1A1A1A", width=1)
        d.text(lx_ + 22, ly + 13, s_, size=14, anchor="start")
    d.text(x + S * cell / 2, ly + 44, f"row i sees keys i - {W - 1} .. i", size=14)
    return d


@diagram
def latent_cache_diagram() -> Diagram:
    """Multi-head latent attention: one latent per token is cached; every head's key and value are rebuilt from it."""
    ds = DEEPSEEK_V2
    L, R, H, Dk = ds["kv_lora_rank"], ds["rope_dim"], ds["heads"], ds["head_dim"]
    d = Diagram("ch10_latent_cache", 440, 280, title="Latent attention caches one compressed vector per token",
                alt=f"A token's input x is compressed by W_DKV into a latent c of width {L}, which is cached "
                    f"together with a rotary key of width {R}. Every one of the {H} heads rebuilds its value and "
                    f"key from the latent with its own up-projections W_UV and W_UK; the rotary key joins every "
                    f"head's key, which is {Dk} + {R} = {Dk + R} wide. The cache holds {L + R} "
                    f"numbers per token and layer instead of 2 x {H} x {Dk} = {2 * H * Dk:,d}.")
    d.box(16, 70, 58, 50, "x", sub="[D]", color="sky", size=16)
    d.arrow(76, 95, 134, 95, label="W_{DKV}", size=17, label_side=-15)
    d.rect(138, 40, 118, 130, fill="none", stroke="orange", dash=True, width=2)
    d.text(197, 32, "cached", size=14, color="orange", weight="bold")
    d.box(148, 52, 98, 50, "latent c", sub=f"[{L}]", color="orange", size=16)
    d.box(148, 110, 98, 50, "rope key", sub=f"[{R}]", color="orange", size=16)
    d.arrow(258, 68, 306, 60, label="W_{UV}", size=17, label_side=-16)
    d.arrow(258, 90, 306, 124, label="W_{UK}", size=17, label_side=-16)
    d.arrow(258, 142, 306, 142)
    d.box(310, 36, 124, 48, "values", sub=f"[{H}, {Dk}]", color="blue", size=16)
    d.box(310, 108, 124, 48, "keys", sub=f"[{H}, {Dk} + {R}]", color="blue", size=16)
    d.text(372, 178, "rebuilt per head", size=14, color=MUTED)
    d.text(20, 222, f"cached per token and layer: {L} + {R} = {L + R} numbers,", size=14, anchor="start")
    d.text(20, 244, f"instead of 2 x {H} heads x {Dk} = {2 * H * Dk:,d} (MHA)", size=14, anchor="start")
    return d


#: the Flash-Decoding picture: one query against S_k cached keys, cut into chunks
FLASH_DECODING_CHUNKS, FLASH_DECODING_KEYS = 4, 16


@diagram
def flash_decoding_diagram() -> Diagram:
    """Flash-Decoding: one query, its keys cut into chunks computed in parallel, then a merge by logsumexp."""
    n, S = FLASH_DECODING_CHUNKS, FLASH_DECODING_KEYS
    per = S // n
    colours = ("blue", "orange", "green", "purple")
    d = Diagram("ch10_flash_decoding", 440, 330, title="Flash-Decoding splits the keys of one query",
                alt=f"One new query above a row of {S} cached keys cut into {n} chunks of {per}, each in its own "
                    f"colour. Each chunk is computed independently, in parallel, and gives a partial output O_i and "
                    f"its logsumexp lse_i. Arrows from the {n} partial results lead to one merge box: "
                    "lse = log of the sum of exp(lse_i), and O = the sum of exp(lse_i - lse) O_i.")
    d.box(150, 14, 140, 40, "one query q", sub=None, color="sky", size=15)
    cell, x0, y = 24, 28, 96
    d.text(300, 30, f"S_k = {S} cached", size=14, anchor="start")
    d.text(300, 48, "keys and values", size=14, anchor="start")
    d.grid(x0, y, [[colours[j // per] for j in range(S)]], cell=cell)
    for i in range(n):
        cx = x0 + (i * per + per / 2) * cell
        d.arrow(220, 56, cx, y - 2, color=MUTED)
        d.box(cx - 46, 156, 92, 50, f"chunk {i}", sub=f"O_{i}, lse_{i}", color=colours[i], size=16)
        d.arrow(cx, y + cell + 4, cx, 154)
        d.arrow(cx, 208, 220, 250)
    d.box(50, 252, 340, 64, "merge:  lse = log Σ exp(lse_i)", sub="O = Σ exp(lse_i - lse) · O_i", color="grey",
          size=16)
    return d


#: the left-padded batch of section 10.1: sequence 0 has this many pads on the left of a 4-token prompt
PADS = 3


@diagram
def padded_batch_diagram() -> Diagram:
    """The attention_mask of a left-padded batch grows by one column per decode step; the pads stay hidden."""
    steps = [("prefill", PROMPT_TOKENS), ("step 1", PROMPT_TOKENS + 1), ("step 2", PROMPT_TOKENS + 2)]
    d = Diagram("ch10_padded_batch", 440, 360, title="A left-padded batch: the attention_mask grows each step",
                alt=f"The attention_mask of a batch of two sequences at three moments. After the prefill it has "
                    f"{PROMPT_TOKENS} columns: sequence 0 has {PADS} pads (0, grey) on the left and one real "
                    f"token (1, green); sequence 1 has {PROMPT_TOKENS} real tokens. Each decode step appends one "
                    "column of 1s (outlined), one new token per sequence, so the mask covers every cached and new position and "
                    "the pads stay hidden from every later query. The new tokens of both sequences share a column.")
    cell, x0, top = 30, 150, 46
    for k, (name, S) in enumerate(steps):
        y = top + k * 100
        d.text(16, y + cell + 4, name, size=15, anchor="start", weight="bold")
        fills = [["grey" if (b == 0 and j < PADS) else "green" for j in range(S)] for b in range(2)]
        labels = [["0" if (b == 0 and j < PADS) else "1" for j in range(S)] for b in range(2)]
        d.grid(x0, y, fills, cell=cell, labels=labels, size=14, row_labels=["seq 0", "seq 1"])
        if k:  # the column this step appended
            d.rect(x0 + (S - 1) * cell, y, cell, 2 * cell, stroke="orange", width=3, rx=0)
        d.text(x0 + S * cell + 10, y + cell + 5, f"[2, {S}]", size=14, anchor="start", color=MUTED)
    d.text(16, top + 282, "0 = pad (hidden), 1 = token", size=14, anchor="start")
    d.text(16, top + 282 + 20, "outlined: the column this step appended", size=14, anchor="start", color="orange")
    return d


@diagram
def alignment_diagram() -> Diagram:
    """Bottom-right against top-left alignment of a causal mask with 3 cached and 2 new positions."""
    S_past, S_new = 3, 2
    S_k = S_past + S_new
    right = [["green" if j <= S_past + i else "grey" for j in range(S_k)] for i in range(S_new)]
    left = [["green" if j <= i else "grey" for j in range(S_k)] for i in range(S_new)]
    d = Diagram("ch10_alignment", 440, 300, title="Bottom-right against top-left alignment",
                alt=f"Two masks of {S_new} new queries (rows) against {S_k} keys (columns: {S_past} cached, "
                    f"then the {S_new} new ones). Bottom-right, as causal_mask(S_new, S_k=S_k) builds it: the "
                    f"diagonal ends in the bottom-right corner, so the first new query sees keys 0 to {S_past} "
                    f"and the second all {S_k}. Top-left, as is_causal=True builds it: the diagonal starts in the "
                    f"top-left corner, so the first new query sees only key 0 and the second keys 0 and 1, "
                    "though the cached keys are all in their past.")
    cell = 30
    for k, (name, sub, fills) in enumerate((("bottom-right", "causal_mask: right", right),
                                            ("top-left", "is_causal=True: wrong", left))):
        x, y = 70, 70 + k * 120
        d.text(16, y - 30, f"{name} ({sub})", size=15, anchor="start", weight="bold")
        d.grid(x, y, fills, cell=cell, size=14, labels=[["1" if f == "green" else "0" for f in r] for r in fills],
               row_labels=[f"q{S_past + i}" for i in range(S_new)])
        off = S_past if k == 0 else 0  # where the diagonal starts
        d.line(x + off * cell, y, x + (off + S_new) * cell, y + S_new * cell, color="orange", width=3)
        d.text(x + S_k * cell + 12, y + 20, f"keys 0..{S_k - 1}:", size=14, anchor="start", color=MUTED)
        d.text(x + S_k * cell + 12, y + 40, f"{S_past} cached, {S_new} new", size=14, anchor="start", color=MUTED)
    return d
