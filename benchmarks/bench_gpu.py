"""GPU benchmark: triton_flash_attention vs attnlib.flash_attention vs PyTorch's SDPA.

Run on a CUDA machine: ``.venv/bin/python benchmarks/bench_gpu.py [--out table.md]``.
``B = 2, H = 16, D_k = 64`` (``--head-dim``), float16 and bfloat16 (``--dtypes`` replaces that list, e.g.
``--dtypes float16 bfloat16 float32``), S in {1024, ..., 16384},
causal and not, forward and forward + backward. Prints one Markdown table, labelled with the GPU,
the date and the versions, that can be pasted into the README and chapter 9 as it is.

Columns: median milliseconds (CUDA-synchronised), TFLOP/s and peak extra memory (MiB, from
``torch.cuda.max_memory_allocated``). FLOPs are the matmul FLOPs of the attended pairs:
``4 * B * H * D_k`` per query-key pair forward (``Q K^T`` and ``P V``), about half the pairs when
causal, and 2.5x that again for the backward pass (five matmuls instead of two; the convention of
the FlashAttention-2 paper). ``sdpa backend`` is the kernel ``F.scaled_dot_product_attention``
really ran, read from the ATen operator it dispatched to. ``max err`` is the largest absolute
difference of the forward output from SDPA in float64 on the first (batch, head), for S <= 8192:
in float32 it shows whether Triton's ``tl.dot`` ran in TF32 (about 1e-3) or full float32.

Target (issue 15): the Triton forward within 2x of SDPA's flash backend at S = 4096, float16. On a
GPU where SDPA has no flash backend (compute capability below 8.0, e.g. a T4) the target is n/a.
``--device cpu`` runs the same code on the CPU (tiny sizes only; the Triton rows need
``TRITON_INTERPRET=1`` and ``--dtypes float16``), which is how the tests check that it still runs.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import torch
import torch.nn.functional as F

import attnlib
from attnbook.measure import aten_ops_called, interleaved_median_ms, peak_memory_bytes

BACKENDS = {  # ATen operator -> SDPA backend name
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cuDNN",
}


def sdpa_backend(fn) -> str:  # type: ignore[no-untyped-def]
    ops = [op.split(".")[1] for op in aten_ops_called(fn)]
    return next((BACKENDS[op] for op in ops if op in BACKENDS), "math")


def flops(B: int, H: int, S: int, D: int, causal: bool, backward: bool) -> float:
    pairs = S * (S + 1) / 2 if causal else S * S
    return 4 * B * H * D * pairs * (3.5 if backward else 1.0)


def max_errors(impls, q, k, v, causal: bool) -> str:  # type: ignore[no-untyped-def]
    """Largest |output - float64 SDPA| of SDPA and Triton on the first (batch, head), e.g. ``'2e-04 / 1e-03'``."""
    q1, k1, v1 = (t[:1, :1] for t in (q, k, v))  # [1, 1, S, D]
    ref = F.scaled_dot_product_attention(q1.double(), k1.double(), v1.double(), is_causal=causal)
    errs = [(impls[key](q1, k1, v1).double() - ref).abs().max().item() for key in ("sdpa", "triton")]
    return " / ".join(f"{e:.0e}" for e in errs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"], choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("No CUDA GPU here: this benchmark needs one (see make bench for the CPU table).")
        return 1
    B, H, D = args.batch, args.heads, args.head_dim
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    import triton

    lines = [
        f"**{name}**, {datetime.date.today().isoformat()}; torch {torch.__version__}, triton {triton.__version__}; "
        f"B = {B}, H = {H}, D_k = {D}",
        "",
        "| dtype | S | causal | pass | SDPA ms | Triton ms | attnlib ms | SDPA TFLOP/s | Triton TFLOP/s | attnlib TFLOP/s "
        "| SDPA MiB | Triton MiB | attnlib MiB | Triton / SDPA | max err SDPA / Triton | sdpa backend |",
        "|" + "---|" * 16,
    ]
    print("\n".join(lines), flush=True)
    verdicts: dict[bool, tuple[float, str]] = {}
    for dtype in [getattr(torch, name) for name in args.dtypes]:
        for S in args.sizes:
            gen = torch.Generator().manual_seed(S)
            q, k, v, d_out = (torch.randn(B, H, S, D, generator=gen).to(device, dtype) for _ in range(4))
            for causal in (False, True):
                impls = {
                    "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                    "triton": lambda q, k, v: attnlib.triton_flash_attention(q, k, v, causal=causal),
                    "attnlib": lambda q, k, v: attnlib.flash_attention(q, k, v, causal=causal),
                }
                backend = sdpa_backend(lambda: impls["sdpa"](q, k, v))
                err = max_errors(impls, q, k, v, causal) if S <= 8192 else "-"
                for backward in (False, True):
                    grads = [t.detach().requires_grad_(backward) for t in (q, k, v)]

                    def call(fn):  # type: ignore[no-untyped-def]
                        def run():  # type: ignore[no-untyped-def]
                            out = fn(*grads)
                            if backward:
                                out.backward(d_out)
                            return out
                        return run

                    fns = {key: call(fn) for key, fn in impls.items()}
                    ms = interleaved_median_ms(fns, repeats=args.repeats, warmup=2, device=device)
                    peak = {key: peak_memory_bytes(fn, device) for key, fn in fns.items()}
                    tflops = {key: flops(B, H, S, D, causal, backward) / (ms[key] / 1e3) / 1e12 for key in fns}
                    ratio = ms["triton"] / ms["sdpa"]
                    if dtype == torch.float16 and S == 4096 and not backward:
                        verdicts[causal] = (ratio, backend)
                    mib = {key: "-" if peak[key] is None else f"{peak[key] / 2**20:.0f}" for key in fns}
                    row = (
                        f"| {str(dtype).split('.')[1]} | {S} | {causal} | {'fwd+bwd' if backward else 'fwd'} "
                        f"| {ms['sdpa']:.2f} | {ms['triton']:.2f} | {ms['attnlib']:.2f} "
                        f"| {tflops['sdpa']:.1f} | {tflops['triton']:.1f} | {tflops['attnlib']:.1f} "
                        f"| {mib['sdpa']} | {mib['triton']} | {mib['attnlib']} | {ratio:.2f}x "
                        f"| {err if not backward else '-'} | {backend} |"
                    )
                    lines.append(row)
                    print(row, flush=True)
            del q, k, v, d_out
    # torch 2.13's flash backend: compute capability in [sm80, sm121]
    has_flash = device.type == "cuda" and (8, 0) <= torch.cuda.get_device_capability(device) <= (12, 1)
    for causal, (ratio, backend) in verdicts.items():
        if not has_flash and backend != "flash":
            lines += ["", f"Target, Triton forward within 2x of SDPA's flash backend at S = 4096 float16, causal={causal}: "
                      f"n/a (SDPA has no flash backend on this device; it ran {backend}; Triton / SDPA {ratio:.2f}x)"]
            print(lines[-1])
            continue
        result = "PASS" if ratio <= 2 and backend == "flash" else "FAIL"
        lines += ["", f"Target, Triton forward within 2x of SDPA's flash backend at S = 4096 float16, causal={causal}: "
                  f"{result} ({ratio:.2f}x; SDPA ran {backend})"]
        print(lines[-1])
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
