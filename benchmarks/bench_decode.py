"""Decoding benchmark: the toy decoder's time per generated token with and without a KV cache.

Run with ``make bench`` (or ``.venv/bin/python benchmarks/bench_decode.py [--check]``). The model is
``attnbook.toy_lm.TinyLM`` (D = 64, H = 4, one attention layer, 1100 positions), untrained (speed
does not depend on the weights), on the CPU. Times are medians over several steps of the CPU time
of one thread (``torch.set_num_threads(1)``), so other programs on the machine barely move them.

Columns, per context length P (tokens already in the sequence):
* ms/token without the cache (the step re-runs all P + 1 tokens) and with it (one token against
  the P cached positions), and their ratio next to the exact FLOP ratio (P + 1);
* decode tokens/s (1000 / ms with the cache) and prefill tokens/s (a prompt of P tokens in one pass).

Everything runs under ``torch.inference_mode()``, as decoding does: with gradients enabled the
cache appends with ``torch.cat`` so that autograd sees every position (see ``attnlib.kv_cache``).

Target: a speedup of at least 13x at P = 1024 (so that the book's "about 10x" holds under ordinary
noise). ``--check`` exits with status 1 when it fails.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from attnbook import ch10, toy_lm
from attnbook.measure import interleaved_median_ms
from attnlib import KVCache

CONTEXTS = (128, 512, 1024)


@torch.inference_mode()
def prefill_tokens_per_s(model: toy_lm.TinyLM, P: int) -> float:
    ids = torch.randint(0, model.head.out_features, (1, P), generator=torch.Generator().manual_seed(1))
    torch.set_num_threads(1)
    ms = interleaved_median_ms({"prefill": lambda: model(ids, causal=True, cache=KVCache())}, repeats=5, clock=time.thread_time)
    return P / (ms["prefill"] / 1000)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit with status 1 if the target fails")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = toy_lm.TinyLM(60, d_model=64, num_heads=4, max_len=1100).eval()
    with torch.inference_mode():
        ms = ch10.time_per_token(model, list(CONTEXTS), repeats=15)
    threads = torch.get_num_threads()
    prefill = [prefill_tokens_per_s(model, P) for P in CONTEXTS]
    torch.set_num_threads(threads)

    print("| P | ms/token, no cache | ms/token, KV cache | speedup | FLOP ratio | decode tokens/s | prefill tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for i, P in enumerate(CONTEXTS):
        flops = ch10.toy_step_flops(model, P)
        print(f"| {P} | {ms['no cache'][i]:.3f} | {ms['cache'][i]:.3f} | {ms['no cache'][i] / ms['cache'][i]:.1f}x "
              f"| {flops['no cache'] / flops['cache']:.0f} | {1000 / ms['cache'][i]:,.0f} | {prefill[i]:,.0f} |")
    grow = {name: t[-1] / t[0] for name, t in ms.items()}
    print(f"\nfrom P = 128 to 1024 (8x the context) the time per token grows {grow['no cache']:.1f}x without the cache, "
          f"{grow['cache']:.1f}x with it")
    speedup = ms["no cache"][-1] / ms["cache"][-1]
    ok = speedup >= 13
    print(f"{'PASS' if ok else 'FAIL'}: speedup at P = 1024 is {speedup:.1f}x (target >= 13x)")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
