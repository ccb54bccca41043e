"""Chapter 10, *Serving attention*: paged caches, prefix sharing, scheduling, quantised caches,
speculative verification, and a Llama-style decoder checked against Hugging Face.

* a paged KV cache (:class:`BlockPool`, :class:`PagedKVCache`): fixed-size blocks, a block table,
  reference counts, copy-on-write, and attention over it (:func:`paged_attention`);
* memory policies compared on a simulated mix of requests (:func:`request_mix`, :func:`memory_waste`);
* prefix sharing by chained block hashes (:class:`PrefixCache`);
* a scheduler simulation: static against continuous batching with chunked prefill (:func:`simulate`);
* quantised caches: int8 per token or per channel, float8 (:func:`quantize`, :func:`dequantize`);
* speculative decoding's verification with cache rollback (:func:`speculative_generate`);
* attention with sink tokens and a learned sink logit (:func:`sink_attention`);
* a Llama/Mistral decoder written with attnlib that takes a Hugging Face model's weights
  (:func:`llama_decode_step`), checked token by token against the model's own cache;
* the chapter's slider frame and checkers (Mistake tables run through :mod:`attnbook.feedback`).

Shapes: ``H`` query heads, ``H_kv`` key/value heads, ``S`` positions, ``D_k`` head width,
``N`` physical blocks, ``b`` positions per block.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlib import KVCache, causal_mask, repeat_kv

from .feedback import (Feedback, Mistake, MistakeTable, call_reader, check_number_cases, close, correct, diagnose, exercise,
                       wrong)
from .slider import Frame, Panel

__all__ = [
    "BlockPool", "PagedKVCache", "paged_attention", "paged_attention_in_place", "contiguous_attention",
    "request_mix", "reserved_positions", "memory_waste", "cow_demo",
    "block_hashes", "PrefixCache",
    "Request", "poisson_arrivals", "simulate", "StepCost",
    "quantize", "dequantize", "kivi_roundtrip", "quantized_bytes", "quantized_cache_errors",
    "speculative_generate",
    "sink_attention", "sink_logsumexp", "SinkLM", "stream_loss", "train_sink_lm", "load_sink_models",
    "llama_weights", "llama_decode_step", "rope", "hf_cached_logits", "attnlib_cached_logits", "tiny_hf_models",
    "simulate_paging", "paging_frame",
    "reference_blocks_needed", "BLOCKS_MISTAKES", "check_blocks_needed",
    "reference_int8_per_token", "INT8_MISTAKES", "check_int8_per_token",
    "reference_sink_softmax", "SINK_MISTAKES", "check_sink_softmax",
]


class _OneThread:
    """Run tiny operations on one thread: with many threads each of them waits for the slowest."""

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc: Any) -> None:
        torch.set_num_threads(self.threads)


# ==== 10.1 a paged KV cache ========================================================================

class BlockPool:
    """The physical memory of one layer's paged cache: ``num_blocks`` blocks of ``block_size`` positions.

    ``keys``, ``values``: ``[H_kv, N, b, D_k]``: block ``n`` is ``keys[:, n]``. Heads come first so
    that reading a sequence's blocks in table order is one gather that yields ``[H_kv, S, D_k]``
    without a second copy. Every block has a reference count: a block shared by several sequences
    (parallel samples, a common prefix) is freed when the last one lets it go.
    """

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32) -> None:
        if block_size < 1 or num_blocks < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.block_size = block_size
        self.keys = torch.zeros(num_kv_heads, num_blocks, block_size, head_dim, dtype=dtype)  # [H_kv, N, b, D_k]
        self.values = torch.zeros_like(self.keys)  # [H_kv, N, b, D_k]
        self.ref_count = [0] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self.copies = 0  # blocks copied on write

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError(f"out of KV blocks: all {len(self.ref_count)} are in use")
        block = self._free.pop()
        self.ref_count[block] = 1
        return block

    def share(self, block: int) -> int:
        self.ref_count[block] += 1
        return block

    def release(self, block: int) -> None:
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self._free.append(block)

    @property
    def blocks_in_use(self) -> int:
        return sum(1 for r in self.ref_count if r > 0)

    @property
    def block_bytes(self) -> int:
        return 2 * self.keys[:, 0].nbytes


class PagedKVCache:
    """One sequence's cache in one layer: a block table into a shared :class:`BlockPool`.

    Offers the :class:`attnlib.KVCache` calls a decoder uses (``update``, ``length``, ``truncate``)
    for a batch of one sequence, so the same decoding loop runs on either.
    """

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_table: list[int] = []
        self.length = 0

    def fork(self) -> "PagedKVCache":
        """A second sequence that shares every block (parallel sampling): no copy until one of them writes."""
        child = PagedKVCache(self.pool)
        child.block_table = [self.pool.share(b) for b in self.block_table]
        child.length = self.length
        return child

    def _writable_last_block(self) -> int:
        last = self.block_table[-1]
        if self.pool.ref_count[last] > 1:  # shared: copy on write
            fresh = self.pool.allocate()
            self.pool.keys[:, fresh] = self.pool.keys[:, last]
            self.pool.values[:, fresh] = self.pool.values[:, last]
            self.pool.release(last)
            self.pool.copies += 1
            self.block_table[-1] = last = fresh
        return last

    def append(self, k: Tensor, v: Tensor) -> None:
        """Write ``k``, ``v`` ``[H_kv, S_new, D_k]`` after the cached positions."""
        b, i, n = self.pool.block_size, 0, k.shape[-2]
        while i < n:
            slot = self.length % b
            block = self.pool.allocate() if slot == 0 else self._writable_last_block()
            if slot == 0:
                self.block_table.append(block)
            m = min(b - slot, n - i)
            self.pool.keys[:, block, slot : slot + m] = k[:, i : i + m]
            self.pool.values[:, block, slot : slot + m] = v[:, i : i + m]
            self.length += m
            i += m

    def gather(self) -> tuple[Tensor, Tensor]:
        """The cached keys and values in order, ``[H_kv, S, D_k]`` each (read through the block table)."""
        table = torch.tensor(self.block_table, dtype=torch.long)  # [n]
        out = []
        for store in (self.pool.keys, self.pool.values):
            blocks = store.index_select(1, table)  # [H_kv, n, b, D_k], one copy
            out.append(blocks.flatten(1, 2)[:, : self.length])  # [H_kv, n b, D_k] -> [H_kv, S, D_k], a view
        return out[0], out[1]

    def update(self, k: Tensor, v: Tensor, window: int | None = None) -> tuple[Tensor, Tensor]:
        """KVCache-style: append ``[1, H_kv, S_new, D_k]`` and return all keys and values ``[1, H_kv, S, D_k]``."""
        if window is not None:
            raise ValueError("this paged cache keeps every position; evict blocks explicitly instead of window=")
        self.append(k[0], v[0])
        keys, values = self.gather()
        return keys[None], values[None]

    def truncate(self, length: int) -> None:
        """Forget positions ``>= length`` and free the blocks no longer needed."""
        if not 0 <= length <= self.length:
            raise ValueError(f"truncate length must be in 0..{self.length}, got {length}")
        keep = -(-length // self.pool.block_size)
        for block in self.block_table[keep:]:
            self.pool.release(block)
        self.block_table, self.length = self.block_table[:keep], length

    def free(self) -> None:
        self.truncate(0)


def contiguous_attention(q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """``q [H, S_new, D_k]`` against ``keys``, ``values`` ``[H_kv, S, D_k]``, bottom-right causal -> ``[H, S_new, D_k]``."""
    S_new, S = q.shape[1], keys.shape[1]
    mask = causal_mask(S_new, S_k=S) if S_new > 1 else None  # [S_new, S]; one query sees everything
    # enable_gqa (torch 2.5+): each key/value head serves its group of query heads without a repeat_kv copy
    return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, enable_gqa=True)[0]


def paged_attention(q: Tensor, cache: PagedKVCache) -> Tensor:
    """Attention of ``q [H, S_new, D_k]`` (the last ``S_new`` positions) over a paged cache -> ``[H, S_new, D_k]``.

    Reads the keys and values through the block table (a gather), then runs the same attention as a
    contiguous cache. A GPU kernel (vLLM's PagedAttention) reads the blocks in place instead.
    """
    keys, values = cache.gather()  # [H_kv, S, D_k] each
    return contiguous_attention(q, keys, values)


def paged_attention_in_place(q: Tensor, cache: PagedKVCache) -> Tensor:
    """Like :func:`paged_attention` for one query per head (``q [H, 1, D_k]``), without gathering the cache.

    Consecutive blocks of the table form runs that are views of the pool (no copy). The scores of
    every run are computed from its view and joined (one small row per head), one softmax runs
    over all of them, and each run's values are weighted by its share of the weights, as a kernel
    that reads the blocks in place would. Equal to the gathered version up to float rounding.
    """
    H, _, D_k = q.shape
    H_kv = cache.pool.keys.shape[0]
    qg = q.view(H_kv, H // H_kv, D_k) / math.sqrt(D_k)  # [H_kv, G, D_k]: each KV head's group of queries
    b, table, runs = cache.pool.block_size, cache.block_table, []
    start = 0
    while start < len(table):  # runs of consecutive blocks: (first block, last block + 1, positions held)
        end = start + 1
        while end < len(table) and table[end] == table[end - 1] + 1:
            end += 1
        runs.append((table[start], table[end - 1] + 1, min(cache.length - start * b, (end - start) * b)))
        start = end
    keys = [cache.pool.keys[:, first:last].flatten(1, 2)[:, :n] for first, last, n in runs]  # views [H_kv, n, D_k]
    values = [cache.pool.values[:, first:last].flatten(1, 2)[:, :n] for first, last, n in runs]
    scores = torch.cat([qg @ k.transpose(1, 2) for k in keys], -1)  # [H_kv, G, S]
    weights = torch.softmax(scores, -1).split([n for _, _, n in runs], -1)  # per run [H_kv, G, n]
    out = sum(w @ v for w, v in zip(weights, values))  # [H_kv, G, D_k]
    return out.reshape(H, 1, D_k)


# ---- memory policies on a simulated mix of requests -----------------------------------------------

def request_mix(n: int = 2000, *, max_len: int = 2048, seed: int = 0) -> list[tuple[int, int]]:
    """``n`` simulated requests ``(prompt_len, output_len)``: log-normal lengths (median prompt 256,
    median output 128, both long-tailed, as chat traffic is), capped so that the total fits ``max_len``."""
    rng = np.random.default_rng(seed)
    prompts = np.clip(rng.lognormal(math.log(256), 1.0, n), 4, max_len // 2).astype(int)
    outputs = np.clip(rng.lognormal(math.log(128), 1.0, n), 1, max_len - prompts).astype(int)
    return list(zip(prompts.tolist(), outputs.tolist()))


def reserved_positions(policy: str, length: int, *, max_len: int = 2048, block_size: int = 16) -> int:
    """Positions a cache reserves while holding ``length`` under ``policy``.

    ``"max-length"``: the longest allowed sequence, from the start; ``"doubling"``: the next power of two
    (attnlib's ``KVCache``); ``"paged"``: whole blocks of ``block_size``.
    """
    if policy == "max-length":
        return max_len
    if policy == "doubling":
        return 1 << max(0, (length - 1).bit_length())
    if policy == "paged":
        return -(-length // block_size) * block_size
    raise ValueError(f"policy must be 'max-length', 'doubling' or 'paged', got {policy!r}")


def memory_waste(mix: Sequence[tuple[int, int]], *, max_len: int = 2048, block_size: int = 16) -> dict[str, float]:
    """The share of reserved cache memory that holds no token, averaged over every decode step of every request.

    At each step a request holds ``prompt + generated`` positions and reserves what its policy gives.
    """
    held = 0
    reserved = {p: 0 for p in ("max-length", "doubling", "paged")}
    for prompt, output in mix:
        lengths = np.arange(prompt + 1, prompt + output + 1)  # held after each generated token
        held += int(lengths.sum())
        reserved["max-length"] += max_len * len(lengths)
        reserved["doubling"] += int((2 ** np.ceil(np.log2(lengths))).sum())
        reserved["paged"] += int((np.ceil(lengths / block_size) * block_size).sum())
    return {p: 1 - held / r for p, r in reserved.items()}


def cow_demo(prompt_len: int = 50, samples: int = 4, new_tokens: int = 20, *, block_size: int = 16,
             H_kv: int = 2, D_k: int = 8, seed: int = 0) -> dict[str, Any]:
    """Parallel sampling with copy-on-write: one prompt, ``samples`` continuations.

    Returns the blocks used when the samples share the prompt's blocks and when each has its own
    copy, the copies made, and whether every sample reads exactly what a private cache would hold.
    """
    gen = torch.Generator().manual_seed(seed)
    pool = BlockPool(64, block_size, H_kv, D_k)
    prompt_k, prompt_v = (torch.randn(H_kv, prompt_len, D_k, generator=gen) for _ in range(2))
    parent = PagedKVCache(pool)
    parent.append(prompt_k, prompt_v)
    children = [parent.fork() for _ in range(samples - 1)]
    seqs = [parent, *children]
    news = [[torch.randn(H_kv, new_tokens, D_k, generator=gen) for _ in range(2)] for _ in seqs]
    for seq, (k, v) in zip(seqs, news):
        for t in range(new_tokens):  # one token per step, as decoding writes them
            seq.append(k[:, t : t + 1], v[:, t : t + 1])
    exact = all(
        torch.equal(seq.gather()[0], torch.cat([prompt_k, k], 1)) and torch.equal(seq.gather()[1], torch.cat([prompt_v, v], 1))
        for seq, (k, v) in zip(seqs, news)
    )
    private = samples * -(-(prompt_len + new_tokens) // block_size)
    return {"shared": pool.blocks_in_use, "private": private, "copies": pool.copies, "exact": exact}


# ==== 10.2 prefix sharing ==========================================================================

def block_hashes(tokens: Sequence[int], block_size: int) -> list[str]:
    """One hash per *full* block: of the block's tokens and of the hash before it (so of the whole prefix)."""
    hashes, parent = [], ""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = ",".join(map(str, tokens[start : start + block_size]))
        parent = hashlib.sha256(f"{parent}|{block}".encode()).hexdigest()[:16]
        hashes.append(parent)
    return hashes


class PrefixCache:
    """Full blocks by the hash of their prefix: a new request reuses every leading block already cached.

    Counts blocks by token ids only (the keys and values are those of whatever model fills them).
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.blocks: dict[str, int] = {}  # hash -> reference count
        self.computed_tokens = 0  # positions whose keys and values had to be computed (prefill)
        self.requested_tokens = 0

    def admit(self, tokens: Sequence[int]) -> int:
        """Register a request's prompt; returns how many of its leading tokens were already cached."""
        hashes = block_hashes(tokens, self.block_size)
        hits = 0
        while hits < len(hashes) and hashes[hits] in self.blocks:  # chained hashes: a hit implies its prefix
            hits += 1
        for h in hashes:
            self.blocks[h] = self.blocks.get(h, 0) + 1
        reused = hits * self.block_size
        self.requested_tokens += len(tokens)
        self.computed_tokens += len(tokens) - reused
        return reused

    def blocks_in_use(self, partial_blocks: int) -> int:
        """Distinct full blocks plus the requests' own partial last blocks."""
        return len(self.blocks) + partial_blocks


# ==== 10.3 continuous batching and chunked prefill ================================================

@dataclass
class Request:
    arrival: float  # ms
    prompt: int
    output: int
    first_token: float | None = None
    done: float | None = None
    prefilled: int = 0
    generated: int = 0


@dataclass(frozen=True)
class StepCost:
    """Time of one forward step of a memory-bound decoder: a fixed part (reading the weights) plus
    a part per token processed in the step (prefill tokens and decoded tokens alike)."""

    fixed_ms: float = 20.0
    per_token_ms: float = 0.05

    def __call__(self, tokens: int) -> float:
        return self.fixed_ms + self.per_token_ms * tokens


def poisson_arrivals(n: int, rate_per_s: float, mix: Sequence[tuple[int, int]], seed: int) -> list[Request]:
    """``n`` requests arriving as a Poisson process of ``rate_per_s`` per second, with (prompt, output) lengths from ``mix``."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1000.0 / rate_per_s, n))
    return [Request(float(t), p, o) for t, (p, o) in zip(times, mix)]


def simulate(policy: str, requests: Sequence[Request], *, max_batch: int = 16, chunk: int = 256,
             cost: StepCost = StepCost()) -> dict[str, float]:
    """Run ``requests`` through a scheduler and return mean/p90 TTFT, mean TPOT, the longest gap
    between two tokens of a running request (ms) and the throughput (tokens/s).

    * ``"static"``: take up to ``max_batch`` waiting requests, prefill them all in one step, decode
      until the *longest* finishes, then take the next batch (finished ones idle in their slot).
    * ``"continuous"``: every step, fill free slots with waiting requests; a step decodes one token
      for every running request and spends at most ``chunk`` tokens on prefills (chunked prefill), so
      a long prompt never stalls the others' decoding for long.
    """
    reqs = [Request(r.arrival, r.prompt, r.output) for r in requests]
    waiting, running, now, i = [], [], 0.0, 0
    gaps: list[float] = []  # the time of every step that gave running requests their next token
    pending = sorted(reqs, key=lambda r: r.arrival)
    while i < len(pending) or waiting or running:
        while i < len(pending) and pending[i].arrival <= now:
            waiting.append(pending[i])
            i += 1
        if not waiting and not running:
            now = pending[i].arrival
            continue
        if policy == "static":
            if not running:
                running, waiting = waiting[:max_batch], waiting[max_batch:]
                now += cost(sum(r.prompt for r in running))  # one prefill step for the batch
                for r in running:
                    r.prefilled, r.first_token, r.generated = r.prompt, now, 1
                    if r.generated == r.output:
                        r.done = now
                continue
            active = [r for r in running if r.generated < r.output]
            now += cost(len(active))
            gaps.append(cost(len(active)))
            for r in active:
                r.generated += 1
                if r.generated == r.output:
                    r.done = now
            if all(r.generated == r.output for r in running):
                running = []
        elif policy == "continuous":
            while waiting and len(running) < max_batch:
                running.append(waiting.pop(0))
            decoding = [r for r in running if r.prefilled == r.prompt]
            budget, prefill_tokens, finishing = chunk, 0, []
            for r in running:
                if r.prefilled < r.prompt and budget > 0:
                    n = min(budget, r.prompt - r.prefilled)
                    r.prefilled += n
                    budget -= n
                    prefill_tokens += n
                    if r.prefilled == r.prompt:
                        finishing.append(r)  # the step that ends its prefill also gives its first token
            now += cost(len(decoding) + prefill_tokens)
            if decoding:
                gaps.append(cost(len(decoding) + prefill_tokens))
            for r in decoding:
                r.generated += 1
            for r in finishing:
                r.first_token, r.generated = now, 1
            for r in decoding + finishing:
                if r.generated == r.output:
                    r.done = now
            running = [r for r in running if r.done is None]
        else:
            raise ValueError(f"policy must be 'static' or 'continuous', got {policy!r}")
    ttft = np.array([r.first_token - r.arrival for r in reqs])
    tpot = np.array([(r.done - r.first_token) / (r.output - 1) for r in reqs if r.output > 1])
    span = max(r.done for r in reqs) - min(r.arrival for r in reqs)
    return {"ttft_mean": float(ttft.mean()), "ttft_p90": float(np.percentile(ttft, 90)),
            "tpot_mean": float(tpot.mean()), "gap_max": max(gaps), "tokens_per_s": sum(r.output for r in reqs) / span * 1000}


# ==== 10.4 quantised caches ========================================================================

_FP8_MAX = 448.0  # largest finite torch.float8_e4m3fn


def quantize(x: Tensor, scheme: str) -> tuple[Tensor, Tensor]:
    """Quantise a cache tensor ``x [..., S, D_k]``; returns ``(codes, scales)``.

    ``"int8-token"``: one scale per position (over ``D_k``); ``"int8-channel"``: one scale per
    channel over all the positions of ``x``, computed after the fact (a cache that grows cannot know
    its later positions; KIVI quantises keys per channel in groups of recent positions instead);
    ``"fp8"``: float8 e4m3 with one scale per position, rounded to the nearest float8 number by the
    cast. Symmetric: ``x ~ codes * scales``.
    """
    if scheme == "int8-token":
        scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 127  # [..., S, 1]
        return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale
    if scheme == "int8-channel":
        scale = x.abs().amax(dim=-2, keepdim=True).clamp_min(1e-12) / 127  # [..., 1, D_k]
        return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale
    if scheme == "fp8":
        scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / _FP8_MAX  # [..., S, 1]
        return (x / scale).to(torch.float8_e4m3fn), scale
    raise ValueError(f"scheme must be 'int8-token', 'int8-channel' or 'fp8', got {scheme!r}")


def dequantize(codes: Tensor, scale: Tensor) -> Tensor:
    return codes.to(scale.dtype) * scale


def kivi_roundtrip(keys: Tensor, values: Tensor, group: int = 16) -> tuple[Tensor, Tensor, int]:
    """Quantise a cache as KIVI does (in int8 here), and return ``(keys, values, bytes)`` after dequantising.

    Keys ``[..., S, D_k]``: one scale per channel for each complete group of ``group`` positions,
    computed when the group is complete; the newest ``S % group`` positions stay in 16-bit (the
    residual) until their group fills. Values: one scale per position (per token). Bytes count the
    int8 codes, the 16-bit scales and the 16-bit residual.
    """
    S, d = keys.shape[-2], keys.shape[-1]
    full = S - S % group
    grouped = keys[..., :full, :].unflatten(-2, (full // group, group))  # [..., S // group, group, D_k]
    k_codes, k_scale = quantize(grouped.transpose(-2, -1), "int8-token")  # per channel: amax over the group's positions
    k_hat = torch.cat([dequantize(k_codes, k_scale).transpose(-2, -1).flatten(-3, -2), keys[..., full:, :]], -2)  # [..., S, D_k]
    v_codes, v_scale = quantize(values, "int8-token")
    residual_bytes = keys[..., full:, :].numel() * 2
    return k_hat, dequantize(v_codes, v_scale), quantized_bytes(k_codes, k_scale) + residual_bytes + quantized_bytes(v_codes, v_scale)


def quantized_bytes(codes: Tensor, scale: Tensor, scale_bytes: int = 2) -> int:
    """Bytes of the codes plus the scales stored in 16-bit."""
    return codes.numel() * codes.element_size() + scale.numel() * scale_bytes


@torch.no_grad()
def quantized_cache_errors(model: Any, data: Tensor, scheme: str, *, context: int = 63, batch: int = 64, seed: int = 3) -> dict[str, float]:
    """Decode one token after ``context`` cached positions with the cache quantised by ``scheme``.

    For ``batch`` seeded windows of ``data`` (token ids) the toy model (:class:`attnbook.toy_lm.TinyLM`)
    prefills ``context`` tokens; the cache's keys and values are quantised and dequantised, and the
    next token is decoded against them. Returns the attention output's relative error (RMS over
    RMS), the KL divergence of the next-token distribution from the float32 one (nats), the share of
    windows whose most likely token is unchanged, and the cache's bytes with and without quantisation.
    """
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, data.numel() - context - 1, (batch,), generator=gen)
    ids = data[starts[:, None] + torch.arange(context + 1)]  # [B, context + 1]
    cache = KVCache()
    model(ids[:, :context], causal=True, cache=cache)
    exact = model(ids[:, context:], causal=True, cache=_copy_cache(cache.keys, cache.values))[:, -1]  # [B, V]
    if scheme.startswith("kivi"):  # "kivi-16": keys per channel in groups of 16 positions, values per token
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
    rel = float((outs[1] - outs[0]).pow(2).mean().sqrt() / outs[0].pow(2).mean().sqrt())
    logp, logq = torch.log_softmax(exact, -1), torch.log_softmax(approx, -1)
    kl = float((logp.exp() * (logp - logq)).sum(-1).mean())
    return {"attention_rel_error": rel, "kl": kl, "top1_same": float((exact.argmax(-1) == approx.argmax(-1)).float().mean()),
            "bytes": nbytes, "bytes_fp32": cache.nbytes, "bytes_fp16": cache.nbytes // 2}


def _copy_cache(keys: Tensor, values: Tensor) -> KVCache:
    fresh = KVCache()
    fresh.update(keys.clone(), values.clone())
    return fresh


# ==== 10.5 speculative decoding's verification ====================================================

@torch.no_grad()
def speculative_generate(target: Any, draft: Any, prompt: Tensor, max_new_tokens: int, k: int = 4) -> tuple[Tensor, dict[str, int]]:
    """Greedy speculative decoding with two :class:`attnbook.toy_lm.TinyLM` models sharing a vocabulary.

    Each round the draft proposes ``k`` tokens one by one; the target checks all of them in ONE
    cached pass (``k`` new queries, bottom-right causal mask), keeps the longest prefix it agrees
    with plus its own next token, and rolls both caches back with ``KVCache.truncate``. The output is
    exactly the target's greedy output.

    Returns ``(ids [S0 + max_new_tokens], stats)`` with the target's forward passes and the tokens accepted.
    """
    with _OneThread():
        return _speculative(target, draft, prompt, max_new_tokens, k)


def _speculative(target: Any, draft: Any, prompt: Tensor, max_new_tokens: int, k: int) -> tuple[Tensor, dict[str, int]]:
    target.eval(), draft.eval()
    t_cache, d_cache = KVCache(), KVCache()
    ids = prompt.clone()
    t_logits = target(ids[None, :-1], causal=True, cache=t_cache)  # prefill all but the last prompt token
    draft(ids[None, :-1], causal=True, cache=d_cache)
    stats = {"target_passes": 1, "accepted": 0, "proposed": 0}
    while ids.numel() - prompt.numel() < max_new_tokens:
        n = min(k, max_new_tokens - (ids.numel() - prompt.numel()))
        proposal, feed = [], ids[-1:]
        for _ in range(n):  # the draft's greedy guesses
            nxt = draft(feed[None], causal=True, cache=d_cache)[0, -1].argmax()[None]  # [1]
            proposal.append(nxt)
            feed = nxt
        proposal = torch.cat(proposal)  # [n]
        # verify: the last accepted token and the n proposals, one pass, n + 1 new queries
        t_logits = target(torch.cat([ids[-1:], proposal])[None], causal=True, cache=t_cache)[0]  # [n + 1, V]
        stats["target_passes"] += 1
        choice = t_logits.argmax(-1)  # [n + 1]: the target's own next token after each prefix
        agree = int((choice[:n] == proposal).long().cumprod(0).sum())
        stats["accepted"] += agree
        stats["proposed"] += n
        new = torch.cat([proposal[:agree], choice[agree : agree + 1]])[: max_new_tokens - (ids.numel() - prompt.numel())]
        ids = torch.cat([ids, new])
        # roll back: both caches keep every position before the newest token, which the next round feeds
        t_cache.truncate(ids.numel() - 1)
        d_cache.truncate(min(d_cache.length, ids.numel() - 1))
        if d_cache.length < ids.numel() - 1:  # the draft has not seen the target's correction yet
            draft(ids[None, d_cache.length : -1], causal=True, cache=d_cache)
    return ids, stats


# ==== 10.6 attention sinks =========================================================================

def sink_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, sink_logit: Tensor | None = None) -> Tensor:
    """Attention ``[B, H, S_q, D_k]`` whose softmax denominator has one more term per head, ``exp(sink_logit[h])``.

    The sink is a key every query sees with value zero: the weights over the real keys then sum to
    less than one, so a head can attend to "nothing". Without ``sink_logit``, ordinary attention.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, H, S_q, S_k]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sink_logit is None:
        return torch.softmax(scores, -1) @ v
    sink = sink_logit.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)  # [B, H, S_q, 1]
    weights = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]  # drop the sink's column
    return weights @ v  # [B, H, S_q, D_k]


def sink_logsumexp(scores: Tensor, sink_logit: Tensor) -> Tensor:
    """``log(exp(sink) + sum_j exp(s_j))`` per row, stably: the denominator with the sink term."""
    return torch.logaddexp(torch.logsumexp(scores, -1), sink_logit.expand(scores.shape[:-1]))


class SinkLM(torch.nn.Module):
    """A small character-level decoder with RoPE, for the attention-sink experiments.

    ``layers`` pre-norm blocks (RMSNorm, attention with rotary positions, a GELU MLP of width 4D).
    With ``sink=True`` each head has a learned sink logit, one extra term in its softmax denominator
    (as in gpt-oss). Rotary positions make the attention depend only on distances, so the model can
    run over streams longer than it was trained on, with any cache policy (:func:`stream_loss`).
    """

    def __init__(self, vocab_size: int, d_model: int = 64, num_heads: int = 4, layers: int = 2, sink: bool = False) -> None:
        super().__init__()
        self.H, self.D_k = num_heads, d_model // num_heads
        self.embed = torch.nn.Embedding(vocab_size, d_model)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            block = torch.nn.Module()
            block.norm1, block.norm2 = torch.nn.RMSNorm(d_model), torch.nn.RMSNorm(d_model)
            block.qkv = torch.nn.Linear(d_model, 3 * d_model, bias=False)
            block.out = torch.nn.Linear(d_model, d_model, bias=False)
            block.mlp = torch.nn.Sequential(torch.nn.Linear(d_model, 4 * d_model), torch.nn.GELU(), torch.nn.Linear(4 * d_model, d_model))
            block.sink = torch.nn.Parameter(torch.zeros(num_heads)) if sink else None
            self.blocks.append(block)
        self.norm = torch.nn.RMSNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab_size, bias=False)

    def _qkv(self, block: Any, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, S, _ = x.shape
        q, k, v = block.qkv(block.norm1(x)).view(B, S, 3, self.H, self.D_k).permute(2, 0, 3, 1, 4)  # 3 x [B, H, S, D_k]
        return q, k, v

    @torch.no_grad()
    def attention_weights(self, ids: Tensor) -> list[Tensor]:
        """Every layer's attention weights in one causal pass over ``ids [B, S]``.

        One ``[B, H, S, S]`` tensor per layer, with one more column (the learned sink's share) when the
        model has sink logits. The residual stream is computed as in :meth:`forward`.
        """
        x = self.embed(ids)  # [B, S, D]
        B, S = ids.shape
        pos = torch.arange(S)
        weights = []
        for block in self.blocks:
            q, k, v = self._qkv(block, x)
            q, k = rope(q, pos, 10000.0), rope(k, pos, 10000.0)
            scores = (q @ k.transpose(-2, -1) / math.sqrt(self.D_k)).masked_fill(~causal_mask(S), float("-inf"))  # [B, H, S, S]
            if block.sink is not None:  # the sink's column: one extra term per head
                scores = torch.cat([scores, block.sink.view(1, -1, 1, 1).expand(B, self.H, S, 1)], -1)  # [B, H, S, S + 1]
            weights.append(torch.softmax(scores, -1))
            att = sink_attention(q, k, v, causal_mask(S), block.sink)  # [B, H, S, D_k]
            x = x + block.out(att.transpose(1, 2).flatten(2))
            x = x + block.mlp(block.norm2(x))
        return weights

    def forward(self, ids: Tensor) -> Tensor:
        """Logits ``[B, S, V]`` of one causal pass over ``ids [B, S]`` (training and full-attention evaluation)."""
        x = self.embed(ids)  # [B, S, D]
        S = ids.shape[1]
        pos = torch.arange(S)
        for block in self.blocks:
            q, k, v = self._qkv(block, x)
            q, k = rope(q, pos, 10000.0), rope(k, pos, 10000.0)
            att = sink_attention(q, k, v, causal_mask(S), block.sink)  # [B, H, S, D_k]
            x = x + block.out(att.transpose(1, 2).flatten(2))
            x = x + block.mlp(block.norm2(x))
        return self.head(self.norm(x))


@torch.no_grad()
def stream_loss(model: SinkLM, ids: Tensor, *, window: int | None, sinks: int = 0) -> Tensor:
    """Per-token loss ``[S - 1]`` of decoding the stream ``ids [S]`` one token at a time with a bounded cache.

    The cache keeps the first ``sinks`` positions and the last ``window - sinks`` (``window=None``:
    every position). Positions are those of the cache's slots, as in StreamingLLM: the query sits in
    the last slot, the recent keys just before it, the sinks in the first slots, so no distance the
    model sees exceeds the cache's length. (Rotary scores depend only on distances, so the recent
    keys keep the rotation of their original positions; only the sinks are rotated again each step.)
    """
    model.eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny operations: one thread avoids waiting for the others
    try:
        return _stream_loss(model, ids, window, sinks)
    finally:
        torch.set_num_threads(threads)


@torch.no_grad()
def _stream_loss(model: SinkLM, ids: Tensor, window: int | None, sinks: int) -> Tensor:
    S, H, D_k = ids.numel(), model.H, model.D_k
    bufs = [{name: torch.zeros(1, H, S, D_k) for name in ("rotated", "raw", "values")} for _ in model.blocks]
    losses = []
    for t in range(S - 1):
        x = model.embed(ids[t : t + 1])[None]  # [1, 1, D]
        here = torch.tensor([t])
        for block, buf in zip(model.blocks, bufs):
            q, k, v = model._qkv(block, x)  # [1, H, 1, D_k] each
            buf["raw"][:, :, t : t + 1], buf["values"][:, :, t : t + 1] = k, v
            buf["rotated"][:, :, t : t + 1] = rope(k, here, 10000.0)
            if window is None or t < window:  # everything so far fits
                keys, values = buf["rotated"][:, :, : t + 1], buf["values"][:, :, : t + 1]  # [1, H, t + 1, D_k]
            else:
                start = t - (window - sinks) + 1  # the oldest recent position kept
                sink_pos = torch.arange(start - sinks, start)  # the sinks' slots, just before the recent keys
                keys = torch.cat([rope(buf["raw"][:, :, :sinks], sink_pos, 10000.0), buf["rotated"][:, :, start : t + 1]], 2)
                values = torch.cat([buf["values"][:, :, :sinks], buf["values"][:, :, start : t + 1]], 2)  # [1, H, window, D_k]
            att = sink_attention(rope(q, here, 10000.0), keys, values, None, block.sink)  # [1, H, 1, D_k]
            x = x + block.out(att.transpose(1, 2).flatten(2))
            x = x + block.mlp(block.norm2(x))
        logits = model.head(model.norm(x))[0, 0]  # [V]
        losses.append(F.cross_entropy(logits[None], ids[t + 1 : t + 2]))
    return torch.stack(losses)


def train_sink_lm(sink: bool, *, steps: int = 600, seq_len: int = 128, batch_size: int = 16, seed: int = 0) -> tuple[SinkLM, list[float]]:
    """Train a :class:`SinkLM` on the book's text (all but its last 1,000 characters), one thread, seeded."""
    from .toy_lm import CharVocab, load_text, sample_batch

    text = load_text()
    vocab = CharVocab(text)
    data = vocab.encode(text[:-1000])
    torch.manual_seed(seed)
    model = SinkLM(len(vocab), sink=sink)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    losses = []
    try:
        model.train()
        for _ in range(steps):
            x, y = sample_batch(data, batch_size, seq_len, gen)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return model.eval(), losses


SINK_CHECKPOINT = "sink_lm.pt"


def load_sink_models() -> dict[str, Any]:
    """The two shipped :class:`SinkLM` checkpoints (``tools/train_sink_lm.py`` reproduces them)."""
    from .toy_lm import DATA_DIR, CharVocab, load_text

    blob = torch.load(DATA_DIR / SINK_CHECKPOINT, weights_only=True)
    vocab = CharVocab(load_text())
    models = {}
    for name in ("plain", "sink"):
        m = SinkLM(len(vocab), sink=name == "sink")
        m.load_state_dict(blob[name])
        models[name] = m.eval()
    return {"models": models, "vocab": vocab, "losses": blob["losses"]}


# ==== 10.7 a Llama/Mistral decoder written with attnlib, checked against Hugging Face =============

def _rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None)  # transformers 5.x
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(config, "rope_theta", 10000.0))  # transformers 4.x


def llama_weights(model: Any) -> dict[str, Any]:
    """The weights of a Hugging Face ``LlamaForCausalLM``/``MistralForCausalLM`` as plain tensors."""
    cfg = model.config
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
    d = x.shape[-1]
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
    positions and the mask lets each query see only those.
    """
    sd, H, H_kv, D_k, window = w["sd"], w["H"], w["H_kv"], w["D_k"], w["window"]
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


@torch.no_grad()
def hf_cached_logits(model: Any, prompt: Tensor, new_tokens: int) -> tuple[Tensor, Tensor]:
    """The model's own cached path: greedy ``generate`` from ``prompt [1, S0]``.

    Returns ``(ids [1, S0 + new_tokens], logits [new_tokens, V])``: the raw logits from which each new
    token was chosen (``output_logits``, available in transformers 4.38 and later).
    """
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
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    kw = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    llama = LlamaForCausalLM(LlamaConfig(**kw)).eval()
    mistral = MistralForCausalLM(MistralConfig(sliding_window=window, **kw)).eval()
    return {"Llama (GQA 4:2, RoPE)": llama, f"Mistral (GQA 4:2, RoPE, window {window})": mistral}


# ==== the slider: a paged cache filling up =========================================================

# (arrival step, prompt, output) of four requests sharing a pool: request 3 arrives after request 0 has
# finished and reuses its freed blocks
_FRAME_REQUESTS = ((0, 37, 12), (0, 21, 34), (0, 9, 18), (14, 15, 20))


def simulate_paging(steps: int, block_size: int, requests: Sequence[tuple[int, int, int]] = _FRAME_REQUESTS,
                    num_blocks: int | None = None) -> tuple[list[list[int]], list[int], list[str]]:
    """Allocate blocks step by step, as a paged server does, and return the state after ``steps`` steps.

    At step ``a`` a request arriving then is prefilled (blocks for its prompt); at every later step each
    running request appends one token, taking a new block from the free list (the lowest-numbered free
    block) only when its last block is full; a request that has produced all its tokens returns its
    blocks to the free list, where later requests pick them up. Blocks never move. Returns
    ``(block tables, lengths, states)``, one entry per request; a finished or not yet arrived request
    has an empty table. Deterministic: the same arguments always give the same state.
    """
    num_blocks = 160 // block_size if num_blocks is None else num_blocks
    free = list(range(num_blocks))  # kept sorted: the lowest-numbered free block is taken first
    tables: list[list[int]] = [[] for _ in requests]
    lengths = [0] * len(requests)
    states = ["waiting"] * len(requests)

    def grow(r: int, new_length: int) -> None:
        while len(tables[r]) * block_size < new_length:
            if not free:
                raise ValueError(f"pool of {num_blocks} blocks of {block_size} is full at request {r}")
            tables[r].append(free.pop(0))
        lengths[r] = new_length

    for step in range(steps + 1):
        for r, (arrival, prompt, output) in enumerate(requests):
            if states[r] == "running" and step > arrival:
                grow(r, lengths[r] + 1)  # one decoded token
                if lengths[r] == prompt + output:  # done: its blocks go back to the pool
                    free = sorted(free + tables[r])
                    tables[r], states[r] = [], "finished"
            elif states[r] == "waiting" and step == arrival:
                states[r] = "running"
                grow(r, prompt)  # the prefill
    return tables, lengths, states


def paging_frame(step: int, block_size: int = 16) -> Frame:
    """The pool's blocks after ``step`` decode steps of four requests, and what each policy reserves.

    One heatmap row per request over the pool's physical blocks: the share of each of its blocks that
    holds tokens. The allocation is simulated from step 0 (:func:`simulate_paging`), so a frame
    depends only on its arguments.
    """
    tables, lengths, states = simulate_paging(step, block_size)
    n_blocks = 160 // block_size  # room for the requests at their longest, with any block size down to 4
    pool_owner = np.zeros((len(_FRAME_REQUESTS), n_blocks))
    labels, texts = [], []
    held = in_use = reserved_max = reserved_dbl = 0
    for r, (table, length, state) in enumerate(zip(tables, lengths, states)):
        for j, b in enumerate(table):
            pool_owner[r, b] = min(block_size, length - j * block_size) / block_size
        if state == "running":
            held += length
            in_use += len(table)
            reserved_max += 64
            reserved_dbl += reserved_positions("doubling", length)
            labels.append(f"request {r} ({length} tokens)")
            texts.append(f"request {r}: blocks {', '.join(map(str, table))}")
        else:
            labels.append(f"request {r} ({'finished, blocks freed' if state == 'finished' else 'not arrived'})")
    paged = in_use * block_size
    caption = (f"After {step} decode steps the running requests hold {held} positions in {in_use} blocks of "
               f"{block_size} ({paged} positions reserved, {paged - held} empty; {n_blocks - in_use} blocks free). "
               f"Preallocating the maximum length of 64 would reserve {reserved_max}; doubling buffers would reserve "
               f"{reserved_dbl}. " + "; ".join(texts) + ".")
    panel = Panel(pool_owner, labels, [str(b) for b in range(n_blocks)], vmin=0.0, vmax=1.0, masked=pool_owner == 0,
                  title=f"physical blocks of {block_size} positions: the share of each that holds tokens (hatched: not this request's)")
    return Frame(label=f"blocks of {block_size}, step {step}", panels=[panel], caption=caption)  # both vary in a slider


# ==== exercises ====================================================================================

# ---- exercise 1: blocks a request needs -----------------------------------------------------------

def reference_blocks_needed(prompt_len: int, new_tokens: int, block_size: int, shared_prefix: int) -> int:
    """New blocks a request allocates: its positions in whole blocks, minus the full blocks of a cached prefix."""
    total = -(-(prompt_len + new_tokens) // block_size)
    return total - shared_prefix // block_size


# (prompt, new tokens, block size, cached prefix tokens). Subtracting prefix tokens instead of prefix blocks
# agrees with the floor-division mistake when the last block's fill is at most the prefix's remainder
# (the first case) and with the answer when it is larger (the third): the cases together tell all three apart.
BLOCKS_CASES = ((100, 30, 16, 40), (250, 38, 32, 200), (61, 17, 8, 19), (100, 38, 16, 44))  # the last tells round from prefix tokens
BLOCKS_MISTAKES = (
    Mistake("floor division", lambda p, n, b, s: (p + n) // b - s // b,
            "a partly filled last block still has to be allocated: round the block count up, -(-(p + n) // b)."),
    Mistake("partial prefix block shared", lambda p, n, b, s: -(-(p + n) // b) - -(-s // b),
            "only FULL blocks of the prefix are shared (a block's hash covers all its tokens): the shared count is "
            "shared_prefix // block_size."),
    Mistake("no sharing", lambda p, n, b, s: -(-(p + n) // b),
            "the blocks of the cached prefix already exist: subtract the full blocks it covers."),
    Mistake("prompt only", lambda p, n, b, s: -(-p // b) - s // b,
            "the generated tokens need blocks too: count prompt_len + new_tokens positions."),
    Mistake("prefix tokens subtracted", lambda p, n, b, s: -(-(p + n - s) // b),
            "subtract full prefix blocks, not prefix tokens: the request's positions fill whole blocks from position 0, "
            "so count its blocks, -(-(prompt_len + new_tokens) // block_size), then subtract shared_prefix // block_size."),
    Mistake("ceil as // b + 1", lambda p, n, b, s: (p + n) // b + 1 - s // b,
            "`x // b + 1` rounds up only when b does not divide x: when the positions fill their blocks exactly it "
            "counts one block too many. Round up with -(-x // b)."),
    Mistake("round to nearest", lambda p, n, b, s: round((p + n) / b) - s // b,
            "round() goes to the nearest block count, so a last block filled less than half is dropped: round up, -(-x // b)."),
    Mistake("generated tokens only", lambda p, n, b, s: -(-n // b),
            "the prompt's positions need blocks too, and the cached prefix is part of the prompt: count "
            "prompt_len + new_tokens positions, then subtract the prefix's full blocks."),
)


def _vector(f: Callable[..., Any], cases: tuple) -> tuple[Any, ...]:
    """``f`` on every case: the checkers compare a reader's answers on all cases together."""
    return tuple(f(*case) for case in cases)


def _solution_blocks(prompt_len: int, new_tokens: int, block_size: int, shared_prefix: int) -> int:
    return -(-(prompt_len + new_tokens) // block_size) - shared_prefix // block_size


@exercise(solution=_solution_blocks,
          tables=(MistakeTable(tuple(Mistake(m.name, lambda m=m: _vector(m.compute, BLOCKS_CASES), m.hint) for m in BLOCKS_MISTAKES),
                               lambda: [()], lambda: _vector(reference_blocks_needed, BLOCKS_CASES)),),
          not_generic={"float16": "the answer is a count"})
def check_blocks_needed(fn: Callable[..., Any]) -> Feedback:
    """Check ``fn(prompt_len, new_tokens, block_size, shared_prefix) -> new blocks`` on three cases."""
    return check_number_cases(
        fn, BLOCKS_CASES, reference_blocks_needed, BLOCKS_MISTAKES, what="a number of blocks", same=lambda a, b: a == b,
        done="a request allocates its positions in whole blocks, less the full blocks a cached prefix already holds.",
        generic="count ceil((prompt_len + new_tokens) / block_size) blocks, then subtract the full blocks of the cached prefix.")


# ---- exercise 2: int8 per-token quantisation ------------------------------------------------------

def reference_int8_per_token(x: Tensor) -> Tensor:
    """Quantise ``x [..., S, D_k]`` to int8 with one symmetric scale per position, then dequantise."""
    scale = x.abs().amax(dim=-1, keepdim=True) / 127  # [..., S, 1]
    return torch.round(x / scale).clamp(-127, 127) * scale


INT8_CASES = ((2, 3, 5, 8, 1), (1, 2, 7, 6, 2))  # (B, H_kv, S, D_k, seed): every size differs


def _int8_case(B: int, H: int, S: int, D: int, seed: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, S, D, generator=gen, dtype=torch.float64) * torch.linspace(0.5, 4, D, dtype=torch.float64)


INT8_MISTAKES = (
    Mistake("per channel", lambda x: torch.round(x / (x.abs().amax(-2, keepdim=True) / 127)).clamp(-127, 127) * (x.abs().amax(-2, keepdim=True) / 127),
            "one scale per channel (over the positions) is the per-channel scheme: per token, take the max |x| over "
            "D_k, amax(dim=-1, keepdim=True)."),
    Mistake("per tensor", lambda x: torch.round(x / (x.abs().amax() / 127)) * (x.abs().amax() / 127),
            "one scale for the whole tensor wastes precision on small positions: one scale per position."),
    Mistake("truncation", lambda x: torch.trunc(x / (x.abs().amax(-1, keepdim=True) / 127)) * (x.abs().amax(-1, keepdim=True) / 127),
            "round to the nearest integer (torch.round), not towards zero: truncation biases every value towards 0."),
    Mistake("scale 128", lambda x: torch.round(x / (x.abs().amax(-1, keepdim=True) / 128)).clamp(-127, 127) * (x.abs().amax(-1, keepdim=True) / 128),
            "the symmetric int8 range is -127..127: divide the max by 127, or the largest value clips."),
    Mistake("not dequantised", lambda x: torch.round(x / (x.abs().amax(-1, keepdim=True) / 127)).clamp(-127, 127),
            "return the dequantised values, codes times scale, so they can be compared with x."),
    Mistake("scale without abs", lambda x: torch.round(x / (x.amax(-1, keepdim=True) / 127)).clamp(-127, 127) * (x.amax(-1, keepdim=True) / 127),
            "the scale comes from the largest |x|, not the largest x: a position whose biggest entry is negative "
            "clips it (or flips the sign of the scale). Use x.abs().amax(dim=-1, keepdim=True)."),
    Mistake("floor", lambda x: torch.floor(x / (x.abs().amax(-1, keepdim=True) / 127)).clamp(-127, 127) * (x.abs().amax(-1, keepdim=True) / 127),
            "floor rounds down, towards -inf, so every value moves down by up to a whole step: round to the nearest "
            "code with torch.round."),
)


def _solution_int8(x: Tensor) -> Tensor:
    scale = x.abs().amax(dim=-1, keepdim=True) / 127  # [..., S, 1]
    return torch.round(x / scale).clamp(-127, 127) * scale  # [..., S, D_k]


@exercise(solution=_solution_int8,
          tables=(MistakeTable(INT8_MISTAKES, lambda: [(_int8_case(*c),) for c in INT8_CASES], reference_int8_per_token),))
def check_int8_per_token(fn: Callable[[Tensor], Any]) -> Feedback:
    """Check ``fn(x) -> dequantised x`` (int8, one scale per position) on two caches of different sizes."""
    for case in INT8_CASES:
        x = _int8_case(*case)
        got, fb = call_reader(fn, (x.clone(),), axes=("B", "H_kv", "S", "D_k"))
        if fb is not None:
            return fb
        expected = reference_int8_per_token(x)
        if close(got, expected):
            continue
        return diagnose(got, INT8_MISTAKES, x) or wrong(
            f"the dequantised cache differs from codes x scale with one scale per position (shape {tuple(expected.shape)}).")
    x = _int8_case(*INT8_CASES[0])
    err = float((reference_int8_per_token(x) - x).abs().max())
    return correct(f"the largest error is {err:.4f}, at most half a step of each position's scale.")


# ---- exercise 3: softmax with a sink logit --------------------------------------------------------

def reference_sink_softmax(scores: Tensor, sink: Tensor) -> Tensor:
    """Weights ``[..., H, S_q, S_k]`` with one extra denominator term ``exp(sink[h])`` per head (stable)."""
    lse = torch.logaddexp(torch.logsumexp(scores, -1, keepdim=True), sink.view(-1, 1, 1))  # [..., H, S_q, 1]
    return torch.exp(scores - lse)


SINK_CASES = ((2, 3, 4, 0.0, 1), (4, 2, 9, 800.0, 2))  # (H, S_q, S_k, shift, seed); exp(800) overflows float64


def _sink_case(H: int, S_q: int, S_k: int, shift: float, seed: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(1, H, S_q, S_k, generator=gen, dtype=torch.float64) * 2 + shift
    sink = torch.randn(H, generator=gen, dtype=torch.float64) + shift
    return scores, sink


SINK_MISTAKES = (
    Mistake("ordinary softmax", lambda s, k: torch.softmax(s, -1),
            "the weights still sum to 1: the sink adds exp(sink[h]) to every row's denominator, so they sum to less."),
    Mistake("sink as a shared scalar", lambda s, k: torch.exp(s - torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), k.mean())),
            "each head has its own sink logit: reshape sink to [H, 1, 1] so it lines up with the head axis."),
    Mistake("sink in the numerator", lambda s, k: torch.exp(s + k.view(-1, 1, 1) - torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), k.view(-1, 1, 1))),
            "the sink only enlarges the denominator; the numerator of key j is exp(s_j)."),
    Mistake("sink column kept", lambda s, k: torch.softmax(torch.cat([s, k.view(1, -1, 1, 1).expand(*s.shape[:-1], 1)], -1), -1),
            "drop the sink's own column: return weights over the real keys only, [..., S_q, S_k]."),
)


def _solution_sink(scores: Tensor, sink: Tensor) -> Tensor:
    lse = torch.logaddexp(torch.logsumexp(scores, -1, keepdim=True), sink.view(-1, 1, 1))  # [..., H, S_q, 1]
    return torch.exp(scores - lse)  # [..., H, S_q, S_k]


@exercise(solution=_solution_sink,
          tables=(MistakeTable(SINK_MISTAKES, lambda: [_sink_case(*c) for c in SINK_CASES], reference_sink_softmax),))
def check_sink_softmax(fn: Callable[[Tensor, Tensor], Any]) -> Feedback:
    """Check ``fn(scores [1, H, S_q, S_k], sink [H]) -> weights`` on two cases, the second with scores near 800."""
    for case in SINK_CASES:
        scores, sink = _sink_case(*case)
        got, fb = call_reader(fn, (scores.clone(), sink.clone()), axes=("B", "H", "S_q", "S_k"))
        if fb is not None:
            return fb
        expected = reference_sink_softmax(scores, sink)
        if isinstance(got, Tensor) and got.shape == expected.shape and not torch.isfinite(got).all():
            return wrong(f"inf or NaN with scores near {case[3]:.0f}: exp overflows. Combine the row's logsumexp and the "
                         "sink with torch.logaddexp, then take exp(scores - lse).")
        if close(got, expected):
            continue
        return diagnose(got, SINK_MISTAKES, scores, sink) or wrong(
            f"the weights differ from exp(s_j) / (exp(sink_h) + sum_j exp(s_j)) (expected shape {tuple(expected.shape)}).")
    return correct("each row sums to 1 - sigmoid(sink - logsumexp(scores)): the rest goes to the sink.")
