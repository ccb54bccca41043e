"""Serving benchmark (chapter 11): paged against contiguous KV cache, and quantised caches.

Run with ``.venv/bin/python benchmarks/bench_serving.py [--check]``. One attention layer with
Llama 3.1 8B's attention shape (H = 32 query heads, H_kv = 8 key/value heads, D_k = 128), batch 1,
float32, on the CPU, one thread, timed by the thread's CPU time (medians, calls interleaved).

A *decode step* appends one position's keys and values to the cache and lets one query attend over
every cached position (context P), then rolls the cache back to P, so every timed step sees the
same context:

* contiguous: ``attnlib.KVCache.update`` + SDPA over its view;
* paged, gathered: ``attnbook.ch11.PagedKVCache`` (blocks of 16 positions) + SDPA over the keys and
  values gathered through the block table (``ch11.paged_attention``: one copy of the cache per step);
* paged, in place: the same cache read without a copy (``ch11.paged_attention_in_place``): every run
  of consecutive blocks is a view of the pool, attended separately, the runs merged by logsumexp.

The paged cache's pool is shared with a second request whose prompt was prefilled in alternating
chunks of 128 tokens, so the block table is fragmented into runs of 8 blocks.

Quantised caches: the same step over a cache stored in int8 (one 16-bit scale per position and
head) or float8 e4m3, dequantised before the attention (what PyTorch ops can do; a GPU kernel
dequantises in registers), beside the float32 and 16-bit bytes.

Target: a paged decode step within 1.5x of the contiguous one at P = 1024. ``--check`` exits with
status 1 when it fails.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from attnbook import ch11
from attnbook.measure import interleaved_median_ms
from attnlib import KVCache

H, H_KV, D_K, BLOCK = 32, 8, 128, 16
CONTEXTS = (256, 1024, 4096)


@torch.no_grad()  # decoding: a KVCache appends in place only without autograd
def decode_steps(P: int) -> dict:
    gen = torch.Generator().manual_seed(P)
    k, v = (torch.randn(1, H_KV, P + 1, D_K, generator=gen) for _ in range(2))  # [1, H_kv, P + 1, D_k]
    q = torch.randn(H, 1, D_K, generator=gen)  # [H, 1, D_k]
    contiguous = KVCache()
    contiguous.update(k[:, :, :P], v[:, :, :P])
    pool = ch11.BlockPool(2 * -(-(P + 1) // BLOCK) + 1, BLOCK, H_KV, D_K)
    paged, other = ch11.PagedKVCache(pool), ch11.PagedKVCache(pool)
    for c in range(0, P, 128):  # chunked prefill of two requests, alternating: runs of 8 blocks
        paged.append(k[0, :, c : min(c + 128, P)], v[0, :, c : min(c + 128, P)])
        other.append(k[0, :, c : min(c + 128, P)], v[0, :, c : min(c + 128, P)])
    quantised = {s: [ch11.quantize(t[0, :, :P], s) for t in (k, v)] for s in ("int8-token", "fp8")}

    def step_contiguous() -> None:
        keys, values = contiguous.update(k[:, :, P:], v[:, :, P:])
        ch11.contiguous_attention(q, keys[0], values[0])
        contiguous.truncate(P)

    def step_paged() -> None:
        paged.append(k[0, :, P:], v[0, :, P:])
        ch11.paged_attention(q, paged)
        paged.truncate(P)

    def step_in_place() -> None:
        paged.append(k[0, :, P:], v[0, :, P:])
        ch11.paged_attention_in_place(q, paged)
        paged.truncate(P)

    def step_quantised(scheme: str):
        (kc, ks), (vc, vs) = quantised[scheme]

        def step() -> None:
            keys = torch.cat([ch11.dequantize(kc, ks), k[0, :, P:]], 1)  # [H_kv, P + 1, D_k]
            values = torch.cat([ch11.dequantize(vc, vs), v[0, :, P:]], 1)
            ch11.contiguous_attention(q, keys, values)
        return step

    fns = {"contiguous": step_contiguous, "paged": step_paged, "in place": step_in_place,
           "int8": step_quantised("int8-token"), "fp8": step_quantised("fp8")}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ms = interleaved_median_ms(fns, repeats=31, warmup=3, clock=time.thread_time)
    finally:
        torch.set_num_threads(threads)
    nbytes = {
        "float32": 2 * H_KV * P * D_K * 4,
        "16-bit": 2 * H_KV * P * D_K * 2,
        "int8": sum(ch11.quantized_bytes(c, s) for c, s in quantised["int8-token"]),
        "fp8": sum(ch11.quantized_bytes(c, s) for c, s in quantised["fp8"]),
    }
    return {"ms": ms, "bytes": nbytes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit with status 1 if the target fails")
    args = parser.parse_args()
    results = {P: decode_steps(P) for P in CONTEXTS}
    print("Decode step of one attention layer (H = 32, H_kv = 8, D_k = 128, float32, one thread), ms:\n")
    print("| P | contiguous KVCache | paged, gathered | paged, in place | gathered / contiguous | in place / contiguous "
          "| int8 cache | float8 cache |")
    print("|---|---|---|---|---|---|---|---|")
    for P, r in results.items():
        ms = r["ms"]
        print(f"| {P} | {ms['contiguous']:.3f} | {ms['paged']:.3f} | {ms['in place']:.3f} | {ms['paged'] / ms['contiguous']:.2f}x "
              f"| {ms['in place'] / ms['contiguous']:.2f}x | {ms['int8']:.3f} | {ms['fp8']:.3f} |")
    print("\nCache bytes of that layer (keys and values; int8 and float8 with one 16-bit scale per position and head):\n")
    print("| P | float32 | 16-bit | int8 | float8 |")
    print("|---|---|---|---|---|")
    for P, r in results.items():
        b = r["bytes"]
        print(f"| {P} | {b['float32']:,} | {b['16-bit']:,} | {b['int8']:,} ({b['16-bit'] / b['int8']:.2f}x smaller than 16-bit) "
              f"| {b['fp8']:,} |")
    ms = results[1024]["ms"]
    ratio = min(ms["paged"], ms["in place"]) / ms["contiguous"]
    ok = ratio <= 1.5
    print(f"\n{'PASS' if ok else 'FAIL'}: the faster paged decode step at P = 1024 is {ratio:.2f}x the contiguous one "
          "(target: at most 1.5x)")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
