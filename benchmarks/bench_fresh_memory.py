"""Benchmark: one elementwise pass into a new tensor against the same pass into an existing one (chapter 8).

Run with ``make bench`` (or ``.venv/bin/python benchmarks/bench_fresh_memory.py [--check]``).
``torch.exp`` over ``[8, S, S]`` float32 scores, S in {512, 2048} (8 and 128 MiB), on one CPU thread,
each call timed by that thread's CPU time (:func:`attnbook.ch08.time_exp_fresh_and_reused`), three
ways: a copy into an existing tensor, ``torch.exp(x, out=y)`` into an existing tensor, and
``torch.exp(x)``, which allocates its result at every call as each step of attention that
materialises ``[S, S]`` tensors does. Chapter 8 prints the same timings with ``~`` and asserts
only the exact count behind them (each pass into a new tensor is handed ``x.nbytes`` of new
memory, the pass into an existing one none); the timing claim is this benchmark's target.

Beside the times, on Linux, the minor page faults of one call of each (``getrusage``,
``RUSAGE_THREAD``): the pages the operating system handed over, zeroed, while the pass ran. They
depend on the allocator and the kernel's settings (transparent huge pages, 2 MiB, can make them up to 512 times
fewer), so they are printed for information.

Target:
1. S = 2048 (128 MiB), one thread: ``exp`` into a new tensor takes more than 1.1x the time of
   ``exp`` into an existing one, measured while one busy process (``python -c "while True:
   pass"``, started by the benchmark) competes for the cores.
``--check`` makes the script exit with status 1 when the target fails.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch

from attnbook.ch08 import time_exp_fresh_and_reused

H = 8
TARGET_RATIO = 1.1


def minor_faults(fn) -> int | None:
    """Minor page faults of the calling thread during one ``fn()`` (Linux only; ``None`` elsewhere)."""
    try:
        import resource

        who = resource.RUSAGE_THREAD
    except (ImportError, AttributeError):
        return None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the faults of this thread are all of them
    try:
        before = resource.getrusage(who).ru_minflt
        result = fn()
        after = resource.getrusage(who).ru_minflt
        del result
    finally:
        torch.set_num_threads(threads)
    return after - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit with status 1 when the target fails")
    args = parser.parse_args()

    print(f"torch {torch.__version__}; one thread")
    for S in (512, 2048):
        x = torch.randn(H, S, S)
        y = torch.empty_like(x).fill_(0.0)
        faults = {name: [minor_faults(fn) for _ in range(3)][-1] for name, fn in (
            ("copy", lambda: y.copy_(x)), ("exp, reused", lambda: torch.exp(x, out=y)),
            ("exp, fresh", lambda: torch.exp(x)))}
        if all(f is not None for f in faults.values()):
            print(f"[{H}, {S}, {S}] float32, minor page faults of one call (the third): "
                  + ", ".join(f"{name} {f:,}" for name, f in faults.items())
                  + f" (the result is {x.nbytes // 4096:,} pages of 4 KiB)")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        print("CPU time per call (medians of 5, taken in turns), with one busy process on the cores:")
        ms = time_exp_fresh_and_reused(H, [2048])[2048]
    finally:
        busy.kill()
        busy.wait()
    ratio = ms["exp, fresh"] / ms["exp, reused"]
    ok = ratio > TARGET_RATIO
    print(f"target: S = 2048, exp into a new tensor > {TARGET_RATIO}x exp into an existing one: "
          f"{ratio:.2f}x -> {'PASS' if ok else 'FAIL'}")
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    raise SystemExit(main())
