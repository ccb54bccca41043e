"""Reproducer for PyTorch (CPU build with MKL): the first ``torch.exp`` that two threads compute at once
in a fresh process sometimes returns one thread's share with relative errors up to 1.5e-4.

Seen with torch 2.13.0+cpu (MKL 2024.2, OpenMP, CPU capability AVX512) on a 2-core machine. For float
tensors, ``torch.exp`` calls MKL's vector math, ``vmsExp(..., VML_HA | ...)``, inside ``at::parallel_for``,
so each OpenMP thread calls it on its own chunk. In a fresh process in which MKL has already run a matmul,
the first such exp gives, in about 1 process in 13, relative errors of up to 1.5e-4 on every element of one
thread's chunk (what a low-accuracy mode would give; high accuracy is within 1 ulp, 6e-8), and the second
call on the same input is right. Measured on 2026-12-01 in fresh processes: a matmul, then the first exp:
16 of 216 processes wrong; one single-threaded ``torch.exp`` of one element first (before or after the
matmul, or ``import attnlib``, which makes that call): 0 of 240; one thread (``OMP_NUM_THREADS=1``): 0 of 40. So the first concurrent entry into MKL's exp appears to race with its
one-time initialisation. attnlib makes that single-threaded call when it is imported.

Run: ``python tools/first_call_repro.py [processes]`` (default 40 per arm). Each process prints the largest
relative error of its first and second exp against float64.
"""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import sys, torch
g = torch.Generator().manual_seed(0)
x = -5 * torch.rand(8, 256, 256, generator=g)
if sys.argv[1] == "warm-up first":
    torch.exp(torch.zeros(1))  # one element: below the parallel grain size, so one thread
a = torch.randn(8, 256, 64, generator=g)
torch.bmm(a, a.transpose(1, 2))  # MKL runs a matmul first
first, second = torch.exp(x), torch.exp(x)  # 524,288 elements: both threads
ref = x.double().exp()
err = [float(((y.double() - ref) / ref).abs().max()) for y in (first, second)]
print(f"{err[0]:.1e} {err[1]:.1e}")
"""


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    import torch

    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads")
    for arm in ("matmul, then exp", "warm-up first"):
        wrong = [0, 0]
        for _ in range(runs):
            out = subprocess.run([sys.executable, "-c", CHILD, arm], capture_output=True, text=True, check=True).stdout
            for i, err in enumerate(out.split()):
                wrong[i] += float(err) > 1e-6
        print(f"{arm}: of {runs} fresh processes, {wrong[0]} gave a first exp more than 1e-6 off, {wrong[1]} a second")


if __name__ == "__main__":
    main()
