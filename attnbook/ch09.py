"""Counts, figures and checkers for chapter 9, *FlashAttention on a GPU*.

* :data:`GPUS`: datasheet numbers of two GPUs (not measurements), with their sources.
* :func:`standard_attention_io`, :func:`flash_v1_io`, :func:`fused_forward_io`: exact HBM traffic
  (the first and the last are chapter 8's, re-exported here).
* :func:`loop_order_figure`: the tile orders of FlashAttention-1 and -2, and what each keeps on chip.
* :func:`exp_per_s`: exponentials per second of a GPU's special-function units (datasheet-derived).
* :func:`triton_demo_lines`, :data:`TRITON_INTERPRETER_RUN`: the Triton example, live or as stored;
  :func:`triton_demo_runs` (the dtypes it checks) and :class:`full_float32_matmuls` (TF32 off).
* :func:`lazy_online_softmax`: the online softmax that rescales only when the maximum grows a lot.
* :func:`check_serial_cap`: the share of the matmul peak a kernel reaches when it runs its matmuls
  and its exponentials in turn.
* :func:`check_merge_partials`: Flash-Decoding's merge of two partial results through their logsumexps.

The checkers diagnose the usual mistakes: one matmul counted instead of two, the exponentials'
share or a ratio of times returned instead of the matmuls' share; partial results averaged or
weighted by their key counts, ``exp(lse)`` overflowing; and a right answer returned in float16 or
bfloat16 (:func:`attnbook.feedback.low_precision`).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from .ch08 import fused_forward_io, standard_attention_io
from .feedback import (
    Feedback,
    Mistake,
    MistakeTable,
    check_number,
    close,
    correct,
    describe,
    diagnose,
    exercise,
    low_precision,
    run_reader_code,
    wrong,
)

__all__ = [
    "GPUS",
    "standard_attention_io",
    "flash_v1_io",
    "fused_forward_io",
    "loop_order_figure",
    "exp_per_s",
    "lazy_online_softmax",
    "TRITON_INTERPRETER_RUN",
    "triton_demo_lines",
    "triton_demo_runs",
    "full_float32_matmuls",
    "reference_serial_cap",
    "check_serial_cap",
    "reference_merge_partials",
    "check_merge_partials",
]


#: Vendor datasheet figures (not measurements): HBM bandwidth in bytes/s, shared memory an SM can
#: give one kernel (its L1/shared total in brackets), SM count, dense float16/bfloat16 tensor-core FLOP/s.
GPUS: dict[str, dict[str, Any]] = {
    "A100 SXM4 80GB": dict(
        hbm_bytes_per_s=2039e9, smem_kib=164, l1_smem_kib=192, sms=108, fp16_flops=312e12, boost_hz=1.41e9,
        source="NVIDIA A100 Tensor Core GPU datasheet (2,039 GB/s; FP16 and BF16 Tensor Core 312 TFLOPS, "
               "624 with sparsity); NVIDIA Ampere GPU Architecture Tuning Guide (up to 164 KB shared memory "
               "of a 192 KB L1/shared memory per SM; 108 SMs; boost clock 1,410 MHz)",
    ),
    "H100 SXM5 80GB": dict(
        hbm_bytes_per_s=3.35e12, smem_kib=228, l1_smem_kib=256, sms=132, fp16_flops=989.4e12, boost_hz=1.83e9,
        source="NVIDIA H100 Tensor Core GPU datasheet (3.35 TB/s; FP16 and BF16 Tensor Core 1,979 TFLOPS "
               "with sparsity, i.e. 989.4 dense, the figure of the NVIDIA H100 architecture whitepaper); "
               "NVIDIA Hopper Tuning Guide (up to 228 KB shared memory of a 256 KB L1/shared memory per SM; 132 SMs); "
               "boost clock 1,830 MHz (the clock at which 132 SMs give 989.4 TFLOP/s)",
    ),
}

#: Exponentials (``exp2``, the special-function units' ``MUFU.EX2``) per clock per SM on compute
#: capability 8.0 and 9.0: the arithmetic-instruction throughput table of the CUDA C++ Programming Guide.
SFU_OPS_PER_CLOCK_PER_SM = 16


def exp_per_s(gpu: dict[str, Any]) -> float:
    """Exponentials per second of a GPU's special-function units: SMs x 16 per clock x boost clock.

    A datasheet-derived bound, not a measurement.

    >>> round(exp_per_s(GPUS["H100 SXM5 80GB"]) / 1e12, 2)
    3.86
    """
    return gpu["sms"] * SFU_OPS_PER_CLOCK_PER_SM * gpu["boost_hz"]


def flash_v1_io(N: int, d: int, M: int | None = None, *, block_k: int | None = None) -> int:
    """HBM numbers of FlashAttention's forward (Algorithm 1 of Dao et al., 2022), per (batch, head).

    The loop order of FlashAttention-1: key/value blocks outside, query blocks inside. Line 2
    initialises ``O``, ``l`` and ``m`` in HBM (``Nd + 2N``). Key/value blocks of ``B_c`` rows are
    loaded once (``2Nd`` in all); for each of the ``T_c = ceil(N / B_c)`` of them every query block
    is loaded and the output and the statistics ``l, m`` are read and written back
    (``3Nd + 4N`` per key block). Total ``3Nd + 2N + T_c (3Nd + 4N)``: Theta(N^2 d^2 / M).

    Args:
        N, d: sequence length and head width.
        M: on-chip memory in numbers; the paper's key block is then ``B_c = ceil(M / 4d)``.
        block_k: the key block ``B_c`` directly (to compare loop orders at equal block sizes).
    """
    if (M is None) == (block_k is None):
        raise ValueError(f"give exactly one of M and block_k, got M = {M!r}, block_k = {block_k!r}")
    B_c = math.ceil(M / (4 * d)) if block_k is None else block_k
    T_c = math.ceil(N / B_c)
    return (N * d + 2 * N) + 2 * N * d + T_c * (3 * N * d + 4 * N)


def loop_order_figure() -> Any:
    """Two panels: the order in which FlashAttention-1 and FlashAttention-2 visit a 4 x 4 grid of tiles.

    Each tile is numbered by the step that computes it; the orange tiles are the first four steps,
    during which one block stays in on-chip SRAM, and the text under each grid says what stays
    and what moves through HBM. Returns the matplotlib ``Figure``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n = 4
    fig, axes = plt.subplots(1, 2, figsize=(7.2, 4.9))
    orders = (
        ("FlashAttention-1: key blocks outside", lambda i, j: j * n + i, lambda i, j: j == 0,
         "steps 1-4: K1, V1 stay in SRAM\nevery step: read Q_i, and read and\nwrite back O_i, l_i, m_i in HBM"),
        ("FlashAttention-2: query blocks outside", lambda i, j: i * n + j, lambda i, j: i == 0,
         "steps 1-4: Q1, its acc, l and m stay\nin SRAM; every step: read K_j, V_j;\nO1 written once, after step 4"),
    )
    for ax, (title, step, first, text) in zip(axes, orders):
        for i in range(n):
            for j in range(n):
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor="#E69F00" if first(i, j) else "#FFFFFF",
                                       edgecolor="#555555", lw=1))
                ax.text(j + 0.5, i + 0.5, str(step(i, j) + 1), ha="center", va="center", fontsize=12)
        ax.set(xlim=(0, n), ylim=(n, 0), aspect="equal")
        ax.set_title(title, fontsize=10)
        ax.set_xticks([j + 0.5 for j in range(n)], [f"K{j + 1}" for j in range(n)], fontsize=9)
        ax.set_yticks([i + 0.5 for i in range(n)], [f"Q{i + 1}" for i in range(n)], fontsize=9)
        ax.set_xlabel("key/value blocks", fontsize=9)
        ax.set_ylabel("query blocks", fontsize=9)
        ax.tick_params(length=0)
        ax.text(0.0, -0.2, text, ha="left", va="top", fontsize=9.5, transform=ax.transAxes)
    fig.suptitle("Tiles numbered in the order computed (orange: steps 1-4)", fontsize=11)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.88, bottom=0.27, wspace=0.3)
    return fig


def lazy_online_softmax(s: Tensor, v: Tensor, block: int, threshold: float = 8.0) -> tuple[Tensor, int, int]:
    """Online softmax over key blocks that rescales only when the maximum grows by more than ``threshold``.

    The reference point ``m`` of the running sums ``l`` and ``acc`` need not be the true maximum:
    any ``m`` gives the same ``acc / l``, because the common factor ``exp(-m)`` cancels. It only
    has to keep ``exp(s - m)`` from overflowing. So a row keeps its stale ``m`` while every new score
    stays below ``m + threshold`` (``exp(8) ~ 2981``, far from float32's limit), and is rescaled only
    when a score climbs higher. FlashAttention-4 skips rescales this way.

    Args:
        s: ``[S_q, S_k]`` scores.
        v: ``[S_k, D_v]`` values.
        block: keys per block.
        threshold: how far a new score may exceed the row's reference point before it is moved.

    Returns:
        ``(out [S_q, D_v], rescales, max_changes)``: the output, how many (row, block) steps
        rescaled, and how many the exact online softmax would rescale (the row maximum grew).

    >>> s, v = torch.randn(4, 64, dtype=torch.float64), torch.randn(64, 3, dtype=torch.float64)
    >>> out, lazy, exact = lazy_online_softmax(s, v, block=16)
    >>> torch.allclose(out, torch.softmax(s, dim=-1) @ v), lazy <= exact
    (True, True)
    """
    S_q = s.shape[0]
    m = torch.full((S_q, 1), float("-inf"), dtype=s.dtype)  # [S_q, 1] reference point, possibly stale
    m_true = m.clone()  # [S_q, 1] the true running maximum, only to count what the exact version does
    l = torch.zeros(S_q, 1, dtype=s.dtype)  # [S_q, 1]
    acc = torch.zeros(S_q, v.shape[1], dtype=s.dtype)  # [S_q, D_v]
    rescales = max_changes = 0
    for k0 in range(0, s.shape[1], block):
        s_blk, v_blk = s[:, k0:k0 + block], v[k0:k0 + block]  # [S_q, bk], [bk, D_v]
        blk_max = s_blk.amax(dim=-1, keepdim=True)  # [S_q, 1]
        grew = blk_max > m_true  # [S_q, 1] the exact online softmax rescales these rows
        max_changes += int(grew[torch.isfinite(m_true)].sum())  # the first block is not a rescale
        m_true = torch.maximum(m_true, blk_max)
        move = blk_max > m + threshold  # [S_q, 1] rows whose reference point must move
        rescales += int(move[torch.isfinite(m)].sum())
        m_new = torch.where(move, blk_max, m)  # [S_q, 1]
        alpha = torch.exp(m - m_new)  # [S_q, 1]: 1 for the rows that keep m, 0 on the first block
        p = torch.exp(s_blk - m_new)  # [S_q, bk], at most exp(threshold)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ v_blk
        m = m_new
    return acc / l, rescales, max_changes


#: What :func:`triton_demo_lines` printed in Triton's interpreter on a CPU (float32), for readers without Triton.
TRITON_INTERPRETER_RUN: tuple[str, ...] = (
    "grid of program instances: (4, 2) | output (1, 2, 50, 32) torch.float32",
    "equal to SDPA within 1e-05: True",
    "float32, (S_q, S_k, D_k) = (20, 45, 8, causal), (33, 33, 128), (17, 40, 40): equal to SDPA within 1e-05: True",
)


#: Further shapes :func:`triton_demo_lines` checks in float32: ``(S_q, S_k, D_k, causal)``.
TRITON_DEMO_SHAPES: tuple[tuple[int, int, int, bool], ...] = ((20, 45, 8, True), (33, 33, 128, False), (17, 40, 40, False))


class full_float32_matmuls:
    """A ``with`` block in which PyTorch's CUDA matmuls and cuDNN use full float32, not TF32.

    Sets ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` to
    ``False`` and restores both on exit, also after an error. On a CPU it changes nothing that runs.
    """

    def __enter__(self) -> "full_float32_matmuls":
        self._saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        return self

    def __exit__(self, *exc: object) -> None:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self._saved


def triton_demo_runs(device: torch.device | str) -> list[tuple[torch.dtype, float, float]]:
    """The dtypes :func:`triton_demo_lines` runs on ``device``, each with ``(atol, rtol)`` for
    ``torch.allclose`` against SDPA in float32.

    On CUDA: float16, and float32, whose products ``input_precision="ieee"`` keeps in full float32
    (within ``1e-5`` of SDPA with TF32 off). Elsewhere (Triton's interpreter): float32 only. The
    float16 tolerance covers three roundings to float16: the inputs, the weights ``p`` before
    ``p @ v`` and the output itself (float16 numbers in [2, 4) lie 2**-9 ~ 2e-3 apart), so it is
    relative as well as absolute: ``2e-3 + 2e-3 * |reference|``, about four units of float16's
    relative rounding error 2**-11.
    """
    if torch.device(device).type == "cuda":
        return [(torch.float16, 2e-3, 2e-3), (torch.float32, 1e-5, 1e-5)]
    return [(torch.float32, 1e-5, 1e-5)]


def triton_demo_lines(device: torch.device | str) -> list[str]:
    """Run :func:`attnlib.triton_flash_attention` on a tiny causal example and describe the result.

    ``[1, 2, 50, 32]`` inputs with 16-blocks: a grid of ``(ceil(50 / 16), 1 * 2) = (4, 2)`` program
    instances, in each dtype of :func:`triton_demo_runs` (float32 on the CPU, in Triton's
    interpreter, ``TRITON_INTERPRET=1``; float16 and float32 on CUDA). Each result is compared with
    ``F.scaled_dot_product_attention`` in float32, computed with TF32 off
    (:class:`full_float32_matmuls`). Then, in float32, the shapes of :data:`TRITON_DEMO_SHAPES`: partial
    blocks, ``S_q != S_k`` with the bottom-right causal mask, and head widths 8, 40 and 128. Raises
    ``AssertionError`` if any result differs.
    """
    import torch.nn.functional as F
    from attnlib.triton_flash import triton_flash_attention

    device = torch.device(device)
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 50, 32, generator=gen).to(device) for _ in range(3))  # [B, H, S, D_k], float32
    with full_float32_matmuls():
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, S, D_k]
    lines = []
    for dtype, atol, rtol in triton_demo_runs(device):
        out = triton_flash_attention(*(t.to(dtype) for t in (q, k, v)), causal=True, block_q=16, block_k=16)
        worst = (out.float() - ref).abs().max().item()
        same = torch.allclose(out.float(), ref, atol=atol, rtol=rtol)
        assert same, f"triton_flash_attention in {dtype} differs from SDPA by {worst:.2e}"
        if not lines:
            lines.append(f"grid of program instances: {(math.ceil(50 / 16), 1 * 2)} | output {tuple(out.shape)} {out.dtype}")
        if len(triton_demo_runs(device)) == 1:
            lines.append(f"equal to SDPA within {atol:g}: {same}")
        else:
            lines.append(f"{str(dtype).removeprefix('torch.')}: equal to SDPA (float32, TF32 off) within "
                         f"{atol:g} + {rtol:g} x |SDPA|: {same}")
    from attnlib import causal_mask

    shapes = []
    for S_q, S_k, D_k, causal in TRITON_DEMO_SHAPES:  # partial blocks, S_q != S_k (bottom-right), narrow and wide heads
        q, k, v = (torch.randn(1, 2, n, D_k, generator=gen).to(device) for n in (S_q, S_k, S_k))
        with full_float32_matmuls():
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(S_q, S_k=S_k, device=device) if causal else None)
        out = triton_flash_attention(q, k, v, causal=causal, block_q=16, block_k=16)
        assert torch.allclose(out, ref, atol=1e-5), f"triton_flash_attention differs from SDPA for {(S_q, S_k, D_k, causal)}"
        shapes.append(f"({S_q}, {S_k}, {D_k}{', causal' if causal else ''})")
    lines.append(f"float32, (S_q, S_k, D_k) = {', '.join(shapes)}: equal to SDPA within 1e-05: True")
    return lines


def reference_merge_partials(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """Merge attention over two disjoint key sets from their outputs ``[.., S_q, D_v]`` and logsumexps ``[.., S_q]``."""
    lse = torch.logaddexp(lse_a, lse_b)  # [.., S_q] log of the total denominator
    out = torch.exp(lse_a - lse)[..., None] * out_a + torch.exp(lse_b - lse)[..., None] * out_b  # [.., S_q, D_v]
    return out, lse


#: The merge checker's cases ``(H, S_q, S_k, keys in part a, D, D_v, lse shift, dtype)``: the second
#: differs in every size and the dtype, and adds 800 to every score (its logsumexps are near 800), so
#: ``exp(lse)`` overflows even in float64; the third adds 300 in float32 (the scores the exercise
#: names), where ``exp(lse)`` overflows float32. Only a merge that subtracts the maximum survives.
MERGE_CASES: tuple[tuple[int, int, int, int, int, int, float, torch.dtype], ...] = (
    (2, 3, 20, 12, 8, 4, 0.0, torch.float32),
    (3, 2, 15, 9, 5, 6, 800.0, torch.float64),
    (4, 1, 11, 4, 6, 3, 300.0, torch.float32),
)


def _merge_case(case: int) -> tuple[list[Tensor], Tensor, Tensor]:
    from attnlib import flash_attention

    H, S_q, S_k, split, D, D_v, shift, dtype = MERGE_CASES[case]
    gen = torch.Generator().manual_seed(82 + case)
    q = torch.randn(H, S_q, D, generator=gen, dtype=torch.float64).to(dtype)  # [H, S_q, D] (a decoder step has S_q = 1)
    k = torch.randn(H, S_k, D, generator=gen, dtype=torch.float64).to(dtype)  # [H, S_k, D]
    v = torch.randn(H, S_k, D_v, generator=gen, dtype=torch.float64).to(dtype)  # [H, S_k, D_v]
    out_a, lse_a = flash_attention(q, k[:, :split], v[:, :split], return_lse=True)  # keys 0 .. split-1
    out_b, lse_b = flash_attention(q, k[:, split:], v[:, split:], return_lse=True)  # the other keys
    out, lse = flash_attention(q, k, v, return_lse=True)  # all keys at once
    # adding `shift` to every score leaves every output as it is and adds `shift` to every logsumexp
    return [out_a, lse_a + shift, out_b, lse_b + shift], out, lse + shift


def _merge_by_counts(oa: Tensor, la: Tensor, ob: Tensor, lb: Tensor, na: int, nb: int) -> Tensor:
    return (na * oa + nb * ob) / (na + nb)


_MERGE_MISTAKES = (
    Mistake("mean", lambda oa, la, ob, lb, na, nb: (oa + ob) / 2,
            "the two parts are not worth the same: weight each by its share of the softmax denominator, "
            "exp(lse_part - lse_total)."),
    Mistake("weights by lse", lambda oa, la, ob, lb, na, nb: (la[..., None] * oa + lb[..., None] * ob) / (la + lb)[..., None],
            "you weighted by lse itself; the denominators are exp(lse), so weight by exp(lse_part - lse_total)."),
    Mistake("weights by key counts", _merge_by_counts,
            "you weighted the parts by how many keys each has: what matters is how much of the softmax denominator "
            "each part holds, exp(lse_part - lse_total), which depends on the scores, not on the counts."),
)

_NO_BROADCAST = (
    "lse has one number per query, shape [.., S_q], and out is [.., S_q, D_v]: write weight[..., None] so that the "
    "weight lines up with the query rows (not the value features)."
)


def _merge_one(fn: Callable[..., Any], case: int) -> Feedback | None:
    parts, out, lse = _merge_case(case)
    split, S_k = MERGE_CASES[case][3], MERGE_CASES[case][2]
    got, fb = run_reader_code(fn, *[t.clone() for t in parts])
    if fb is not None and "must match the size of tensor" in fb.message:
        return wrong(_NO_BROADCAST)
    if fb is not None:
        return fb
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return wrong(f"return two tensors (out, lse), got {describe(got)}: the merged lse is needed "
                     "to merge the result again with a third part.")
    got_out, got_lse = got
    for name, t, exp in (("out", got_out, out), ("lse", got_lse, lse)):
        if not isinstance(t, Tensor) or t.is_complex():
            return wrong(f"{name} should be a real torch.Tensor, got {describe(t)}.")
        if tuple(t.shape) != tuple(exp.shape):
            what = "[H, S_q, D_v], like out_a" if name == "out" else "[H, S_q], like lse_a (no trailing axis of size 1)"
            return wrong(f"{name} has shape {tuple(t.shape)}; it should be {what}.")
    if not torch.isfinite(got_lse).all():
        return wrong(f"your lse overflows to inf or NaN with logsumexps near {MERGE_CASES[case][6]:.0f}: exp(lse_a) is "
                     "inf there, so log(exp(lse_a) + exp(lse_b)) is too. Use torch.logaddexp(lse_a, lse_b), which "
                     "subtracts the larger one first.")
    if not torch.isfinite(got_out).all():
        return wrong("with large scores exp(lse) overflows to inf (float32 above about 88, even float64 above about "
                     "709) and the result is inf or NaN: subtract the larger lse first (torch.logaddexp does), "
                     "i.e. weight by exp(lse_part - lse_total).")
    for name, t, exp in (("out", got_out, out), ("lse", got_lse, lse)):
        half = low_precision(t, exp, name=name)
        if half is not None:
            return half
    if not close(got_out, out, atol=1e-4, rtol=1e-4):
        hint = diagnose(got_out, _MERGE_MISTAKES, *parts, split, S_k - split)
        return hint or wrong("the merged output differs from attention over all keys: "
                             "out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b.")
    if not close(got_lse, lse, atol=1e-4, rtol=1e-4):
        if close(got_lse, torch.maximum(parts[1], parts[3])):
            return wrong("the total lse is log(exp(lse_a) + exp(lse_b)) (torch.logaddexp), not the larger of the two.")
        return wrong("the output is right but lse is not: lse = log(exp(lse_a) + exp(lse_b)) = torch.logaddexp(lse_a, lse_b).")
    return None


def _solution_merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse)[..., None] * out_a + torch.exp(lse_b - lse)[..., None] * out_b, lse


def _merge_table_cases() -> list[tuple[Any, ...]]:
    out = []
    for c in range(len(MERGE_CASES)):
        parts = _merge_case(c)[0]
        split, S_k = MERGE_CASES[c][3], MERGE_CASES[c][2]
        out.append((*parts, split, S_k - split))
    return out


@exercise(solution=_solution_merge,
          tables=(MistakeTable(_MERGE_MISTAKES, _merge_table_cases, lambda oa, la, ob, lb, na, nb: reference_merge_partials(oa, la, ob, lb)[0],
                               same=lambda a, b: close(a, b, atol=1e-4, rtol=1e-4)),))
def check_merge_partials(fn: Callable[..., Any]) -> Feedback:
    """Check ``fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``: the split-KV merge of Flash-Decoding.

    The partial results come from :func:`attnlib.flash_attention` over two disjoint sets of keys;
    the answer must equal attention over all keys. The cases are :data:`MERGE_CASES`; in the second
    every logsumexp is near 800, where ``exp(lse)`` overflows even float64.
    """
    for case in range(len(MERGE_CASES)):
        problem = _merge_one(fn, case)
        if problem is not None:
            return problem
    return correct("two partial results merge exactly through their logsumexps: Flash-Decoding splits the KV cache "
                   "across many programs this way and merges at the end.")


# ---- exercise: the serial cap ----------------------------------------------------------------------

def reference_serial_cap(d: int, matmul_flops: float, exps_per_s: float) -> float:
    """The largest share of the matmul peak a forward kernel reaches when it runs matmuls and exponentials in turn.

    Per query row and key, the forward pass does ``4 d`` matmul FLOPs (``Q K^T`` and ``P V``) and one
    exponential, so ``t_matmul = 4 d / matmul_flops`` and ``t_exp = 1 / exps_per_s`` per score, and the
    tensor cores are busy ``t_matmul / (t_matmul + t_exp)`` of the time.

    >>> round(reference_serial_cap(64, GPUS["H100 SXM5 80GB"]["fp16_flops"], exp_per_s(GPUS["H100 SXM5 80GB"])), 2)
    0.5
    """
    t_matmul, t_exp = 4 * d / matmul_flops, 1 / exps_per_s
    return t_matmul / (t_matmul + t_exp)


def _cap(flops_per_score: int = 4, share_of: str = "matmul") -> Callable[[int, float, float], float]:
    def f(d: int, matmul_flops: float, exps_per_s: float) -> float:
        t_matmul, t_exp = flops_per_score * d / matmul_flops, 1 / exps_per_s
        if share_of == "ratio":
            return t_matmul / t_exp
        return (t_matmul if share_of == "matmul" else t_exp) / (t_matmul + t_exp)
    return f


#: The serial-cap checker's cases ``(d, matmul FLOP/s, exponentials per second)``: the A100 at d = 64,
#: the H100 at d = 128 (datasheet-derived) and a made-up GPU at d = 96; every size differs.
CAP_CASES: tuple[tuple[int, float, float], ...] = (
    (64, GPUS["A100 SXM4 80GB"]["fp16_flops"], exp_per_s(GPUS["A100 SXM4 80GB"])),
    (128, GPUS["H100 SXM5 80GB"]["fp16_flops"], exp_per_s(GPUS["H100 SXM5 80GB"])),
    (96, 500e12, 1e12),
)
CAP_MISTAKES = (
    Mistake("one matmul", _cap(flops_per_score=2),
            "you counted one matmul, 2 d FLOPs per score: the forward pass runs two, Q K^T and P V, so 4 d FLOPs "
            "per score."),
    Mistake("share of the exponentials", _cap(share_of="exp"),
            "that is the share of the time spent on exponentials; the cap is the other share, the time the tensor "
            "cores are busy: t_matmul / (t_matmul + t_exp)."),
    Mistake("ratio of the times", _cap(share_of="ratio"),
            "you divided the matmul time by the exponential time; the kernel spends both in turn, so divide by "
            "their sum: t_matmul / (t_matmul + t_exp)."),
    Mistake("a percentage", lambda d, F, E: 100 * reference_serial_cap(d, F, E),
            "return a fraction of 1 (0.5 for half the peak), not a percentage."),
)


def _cap_vector(f: Callable[..., Any]) -> tuple[Any, ...]:
    return tuple(f(*case) for case in CAP_CASES)


def _cap_same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(math.isclose(float(x), float(y), rel_tol=1e-6) for x, y in zip(a, b))


def _solution_cap(d: int, matmul_flops: float, exps_per_s: float) -> float:
    t_matmul = 4 * d / matmul_flops  # Q K^T and P V: 4 d FLOPs per score
    t_exp = 1 / exps_per_s  # one exponential per score
    return t_matmul / (t_matmul + t_exp)


@exercise(solution=_solution_cap,
          tables=(MistakeTable(tuple(Mistake(m.name, lambda m=m: _cap_vector(m.compute), m.hint) for m in CAP_MISTAKES),
                               lambda: [()], lambda: _cap_vector(reference_serial_cap), same=_cap_same),),
          not_generic={"float16": "the answer is one number"})
def check_serial_cap(fn: Callable[[int, float, float], float]) -> Feedback:
    """Check ``fn(d, matmul_flops, exps_per_s) -> fraction`` on the cases of :data:`CAP_CASES`.

    The answers on all cases together identify a known mistake (:data:`CAP_MISTAKES`).
    """
    answers = []
    for case in CAP_CASES:
        got, fb = run_reader_code(fn, *case)
        if fb is not None:
            return fb
        value, problem = check_number(got, reference_serial_cap(*case), rel=1e-6, what="a fraction of the peak")
        if value is None or not math.isfinite(value):
            return problem  # type: ignore[return-value]
        answers.append(value)
    if _cap_same(tuple(answers), _cap_vector(reference_serial_cap)):
        return correct("a kernel that takes turns keeps the tensor cores busy only while no exponential runs: on an "
                       "H100 at d = 128, two thirds of the peak at best. Overlapping the two (FlashAttention-3) lifts "
                       "that cap.")
    for m in CAP_MISTAKES:
        if _cap_same(tuple(answers), _cap_vector(m.compute)):
            return wrong(m.hint)
    return wrong("per score the forward pass does 4 d matmul FLOPs and one exponential: t_matmul = 4 d / matmul_flops, "
                 "t_exp = 1 / exps_per_s, and the cap is t_matmul / (t_matmul + t_exp).")
