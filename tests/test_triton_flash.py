"""attnlib.triton_flash_attention in Triton's interpreter (CPU tensors) against PyTorch's SDPA.

``TRITON_INTERPRET=1`` only takes effect if it is set before a kernel is decorated, and once set it
would switch every Triton kernel in the process (torch.compile's too) to the interpreter. So the
kernel runs in one child process, started once for this module: it runs this file as a script with
the variable set and prints every case's errors as JSON. The tests here check those numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (S_q, S_k, D_k, D_v, causal, block_q, block_k): lengths not multiples of the block, several widths
CASES = [
    (37, 37, 16, 16, False, 16, 16),
    (37, 37, 24, 24, True, 16, 16),
    (20, 45, 64, 64, True, 16, 32),  # S_q < S_k: bottom-right causal, as attnlib.causal_mask
    (50, 19, 8, 8, False, 32, 16),  # S_q > S_k, D_k = 8 padded to 16 inside the kernel
    (5, 5, 128, 128, True, 16, 16),  # one partial block
    (33, 40, 32, 48, False, 16, 16),  # D_v != D_k
]
HALF_CASES = [(40, 40, 32, 32, causal, 16, 16) for causal in (False, True)]  # float16


def _run_cases() -> dict:
    """In the child process: errors against SDPA for every case (needs TRITON_INTERPRET=1)."""
    import torch
    import torch.nn.functional as F

    from attnlib import causal_mask, triton_flash_attention

    results: dict = {"float32": [], "half": [], "grad": None}
    gen = torch.Generator().manual_seed(0)

    def inputs(S_q, S_k, D_k, D_v):  # type: ignore[no-untyped-def]
        return (torch.randn(2, 3, S, D, generator=gen) for S, D in ((S_q, D_k), (S_k, D_k), (S_k, D_v)))

    for S_q, S_k, D_k, D_v, causal, bq, bk in CASES:
        q, k, v = inputs(S_q, S_k, D_k, D_v)
        mask = causal_mask(S_q, S_k=S_k) if causal else None
        got = triton_flash_attention(q, k, v, causal=causal, block_q=bq, block_k=bk)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        results["float32"].append([list(got.shape) == list(want.shape), float((got - want).abs().max())])
    for S_q, S_k, D_k, D_v, causal, bq, bk in HALF_CASES:
        q, k, v = inputs(S_q, S_k, D_k, D_v)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # float32 reference
        row = {}
        for dtype in (torch.float16,):  # the interpreter cannot run bfloat16 (see the last test)
            qh, kh, vh = q.to(dtype), k.to(dtype), v.to(dtype)
            got = triton_flash_attention(qh, kh, vh, causal=causal, block_q=bq, block_k=bk)
            theirs = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
            row[str(dtype)] = [str(got.dtype), float((got.float() - want).abs().max()), float((theirs.float() - want).abs().max())]
        results["half"].append(row)
    q, k, v = (t.requires_grad_() for t in inputs(30, 30, 16, 16))
    triton_flash_attention(q, k, v, causal=True, block_q=16, block_k=16).square().sum().backward()
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum().backward()
    results["grad"] = [float((a - t.grad).abs().max()) for a, t in zip(ours, (q, k, v))]
    try:
        triton_flash_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    except ValueError as error:
        results["bfloat16_error"] = str(error)
    import numpy as np

    import attnlib.triton_flash as tf

    q, k, v = (t.detach() for t in inputs(20, 20, 16, 16))
    launches, kernel = [], tf._kernel

    class Spy:  # records the launch's compile-time arguments, then runs the kernel
        def __getitem__(self, grid):  # type: ignore[no-untyped-def]
            return lambda *args, **kwargs: (launches.append({k: str(v) for k, v in kwargs.items()}), kernel[grid](*args, **kwargs))

    tf._kernel = Spy()
    try:
        got = triton_flash_attention(q, k, v, block_q=np.int64(16), block_k=np.int32(16))  # NumPy block sizes
        triton_flash_attention(q.half(), k.half(), v.half(), block_q=16, block_k=16)
    finally:
        tf._kernel = kernel
    results["numpy_blocks"] = float((got - F.scaled_dot_product_attention(q, k, v)).abs().max())
    results["precision"] = [launch["PRECISION"] for launch in launches]
    results["degenerate"] = [list(triton_flash_attention(*(torch.randn(*s) for s in shapes)).shape) for shapes in
                             (((0, 4, 16),) * 3, ((1, 0, 16), (1, 4, 16), (1, 4, 16)), ((1, 3, 16), (1, 0, 16), (1, 0, 16)))]
    return results


@pytest.fixture(scope="module")
def interpreted() -> dict:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("index", range(len(CASES)), ids=[str(c) for c in CASES])
def test_float32_matches_sdpa(interpreted: dict, index: int) -> None:
    same_shape, error = interpreted["float32"][index]
    assert same_shape
    assert error < 1e-5, error


@pytest.mark.parametrize("index", range(len(HALF_CASES)), ids=["non-causal", "causal"])
def test_half_precision_is_no_worse_than_sdpa(interpreted: dict, index: int) -> None:
    """Against a float32 reference: the max error at most 2x SDPA's at the same dtype (the
    criterion of the FlashAttention repository's tests; p is rounded to float16 before p @ v)."""
    for dtype, (out_dtype, ours, theirs) in interpreted["half"][index].items():
        assert out_dtype == dtype
        assert ours <= 2 * theirs, (dtype, ours, theirs)


def test_backward_matches_sdpa(interpreted: dict) -> None:
    assert max(interpreted["grad"]) < 1e-4, interpreted["grad"]


def test_float32_products_are_ieee_not_tf32(interpreted: dict) -> None:
    """On GPUs of compute capability >= 8.0, tl.dot's default for float32 is TF32 (about 1e-3 off
    SDPA). The interpreter computes in full float32 whatever it is told, so what it can show is
    the launch: float32 asks for "ieee"; float16 passes None, each backend's default, since an
    explicit "tf32" does not compile on AMD GPUs other than gfx942 (and half products are exact)."""
    assert interpreted["precision"] == ["ieee", "None"]


def test_numpy_block_sizes_and_degenerate_shapes(interpreted: dict) -> None:
    assert interpreted["numpy_blocks"] < 1e-5
    assert interpreted["degenerate"] == [[0, 4, 16], [1, 0, 16], [1, 3, 16]]


def test_bfloat16_in_the_interpreter_raises_instead_of_returning_garbage(interpreted: dict) -> None:
    """Triton 3.9's interpreter multiplies bfloat16's raw bits in tl.dot (results near 1e9)."""
    assert "cannot run bfloat16" in interpreted.get("bfloat16_error", ""), interpreted


def _child(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False)


def test_import_attnlib_does_not_import_triton() -> None:
    done = _child("import sys, attnlib; print('triton' in sys.modules)")
    assert done.stdout.strip() == "False", done.stderr


def test_without_triton_the_error_names_the_install_command() -> None:
    code = (
        "import sys; sys.modules['triton'] = None\n"  # makes `import triton` raise ImportError
        "import attnlib\n"
        "q = __import__('torch').randn(1, 4, 16)\n"
        "try:\n    attnlib.triton_flash_attention(q, q, q)\nexcept ImportError as e:\n    print(e)\n"
    )
    done = _child(code)
    assert "pip install triton" in done.stdout, done.stderr


def test_a_failed_import_of_triton_is_retried_on_the_next_call() -> None:
    """A reader installs Triton after the first failure: the next call must find it, no restart."""
    pytest.importorskip("triton")
    code = (
        "import sys, torch, attnlib\n"
        "q = torch.randn(1, 4, 16)\n"
        "sys.modules['triton'] = None\n"  # as if Triton were not installed yet
        "try:\n    attnlib.triton_flash_attention(q, q, q)\nexcept ImportError as e:\n    print('first:', e)\n"
        "del sys.modules['triton']\n"  # ... and now it is
        "try:\n    attnlib.triton_flash_attention(q, q, q)\nexcept ValueError as e:\n    print('second:', e)\n"
    )
    done = _child(code)
    first, second = done.stdout.splitlines()
    assert first.startswith("first:") and "pip install triton" in first, done.stderr
    assert second.startswith("second: q is on the CPU"), done.stdout  # Triton was imported this time


def test_cpu_tensors_without_the_interpreter_raise_a_clear_error() -> None:
    pytest.importorskip("triton")
    code = (
        "import torch, attnlib\n"
        "q = torch.randn(1, 4, 16)\n"
        "try:\n    attnlib.triton_flash_attention(q, q, q)\nexcept ValueError as e:\n    print(e)\n"
    )
    done = _child(code)
    assert "TRITON_INTERPRET=1" in done.stdout, done.stderr


def test_the_gpu_benchmark_script_runs_in_the_interpreter(tmp_path: Path) -> None:
    """benchmarks/bench_gpu.py is only run for real on a GPU; this keeps it from rotting meanwhile."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    table = tmp_path / "table.md"
    args = ["--device", "cpu", "--sizes", "32", "--batch", "1", "--heads", "2", "--head-dim", "16",
            "--repeats", "1", "--dtypes", "float16", "--out", str(table)]
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), *args],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in table.read_text().splitlines() if line.startswith("| float16 | 32 |")]
    assert len(rows) == 4, table.read_text()  # causal and not, forward and forward + backward
    assert all(row.endswith("| flash (CPU) |") for row in rows), rows


if __name__ == "__main__":  # the child process of the `interpreted` fixture
    sys.path.insert(0, str(ROOT))
    print(json.dumps(_run_cases()))
