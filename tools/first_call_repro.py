"""Reproducer for PyTorch (CPU): the first run of a tile of online-softmax steps in a fresh process
sometimes gives a different result from the second run on the same inputs.

Seen with torch 2.13.0+cpu on an AVX512 machine (2 cores, OpenMP, MKL), about 1 fresh process in
6 to 1 in 60 depending on the machine's load: one exponential of the first tile differs by about
1e-4 (relative 1.5e-4), while every later run in the process agrees with a float64 reference to
3e-8. No attnlib code is involved: the steps are bmm, masked_fill_, amax, maximum, sub_ and exp_.

Run: ``python tools/first_call_repro.py [processes]`` (default 30). It starts that many fresh
interpreters; each runs the steps twice and prints the largest difference between the runs.
"""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import torch
g = torch.Generator().manual_seed(1)
q, k = (torch.randn(8, 1000, 64, generator=g) for _ in range(2))
qs = q * 0.125

def tile():  # one [256, 256] tile on the diagonal, as in flash attention's first step
    s = torch.bmm(qs[:, :256], k[:, :256].transpose(1, 2))  # [8, 256, 256]
    i, j = torch.arange(256)[:, None], torch.arange(256)[None, :]
    s.masked_fill_(j > i, float("-inf"))
    m = torch.maximum(torch.full((8, 256, 1), float("-inf")), s.amax(dim=-1, keepdim=True))
    return s.sub_(m).exp_()  # in place, as attnlib 0.x did

first, second = tile(), tile()
diff = (first - second).abs()
idx = tuple(int(x) for x in (diff == diff.max()).nonzero()[0])
print(f"{diff.max().item():.2e} at {idx}: first {first[idx].item():.7f}, second {second[idx].item():.7f}, "
      f"{int((diff > 0).sum())} elements differ")
"""


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    differing = 0
    for _ in range(runs):
        line = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout.strip()
        differing += not line.startswith("0.00e+00")
        print(line, flush=True)
    import torch

    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}: "
          f"{differing} of {runs} fresh processes gave a first run that differs from the second")


if __name__ == "__main__":
    main()
