"""Counts, figures and checkers for chapter 9, *FlashAttention on a GPU*.

* :data:`GPUS`: datasheet numbers of three GPUs (not measurements), with their sources;
  :func:`sram_bytes_per_s` and :func:`memory_hierarchy_diagram` (the A100's memory levels).
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
* :func:`execution_hierarchy_diagram`: a kernel's grid of thread blocks, warps and threads on the SMs;
  :func:`window_tile_kinds` and :func:`window_block_mask_diagram`: the tiles a sliding window computes or skips;
  :func:`split_k_split_q_diagram`: how FlashAttention-1 and -2 split a tile between warps;
  :func:`sdpa_backends_diagram`: the order in which SDPA (torch 2.13, CUDA) tries its backends, and what each refuses.
* :func:`check_sliding_window`: a sliding window added to a fused kernel (the mask inside a tile and
  the first key block a query block visits), run in Triton where it is installed, else in the same
  tiled loop in PyTorch (:func:`windowed_tiled_attention`).

The checkers diagnose the usual mistakes: one matmul counted instead of two (or d, d^2 FLOPs per
score), the exponentials' share or a ratio of times (capped at 1 or not) returned instead of the
matmuls' share, a rate (per second) used where a time belongs; partial results averaged, weighted by
their key counts, by a softmax over the queries or heads instead of the two parts, by upside-down weights
or by log-weights without ``exp``, ``exp(lse)`` overflowing;
an inverted ``visible`` mask (True where the key is hidden) and Python's ``and`` in it (a lambda runs
in the PyTorch loop, since Triton cannot compile one); and a right answer returned in float16 or
bfloat16, cast down from the inputs' dtype (:func:`attnbook.ch08.narrowed_dtype`), or computed in
float32 inside and cast back to float64 (:func:`attnbook.feedback.computed_narrower`).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from .ch08 import fused_forward_io, narrowed_dtype, standard_attention_io
from .diagrams import INK, MUTED, Diagram, diagram
from .feedback import (
    as_index,
    Feedback,
    Mistake,
    MistakeTable,
    check_number,
    close,
    computed_narrower,
    correct,
    describe,
    diagnose,
    exercise,
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
    "WINDOW_RUNS",
    "reference_visible",
    "reference_first_key",
    "windowed_tiled_attention",
    "triton_mode",
    "check_sliding_window",
    "sram_bytes_per_s",
    "causal_traffic_lines",
    "cudnn_first",
    "sdpa_priority_line",
    "FLEX_S",
    "FLEX_WINDOW",
    "FLEX_BLOCK",
    "window_tile_kinds",
]


#: Vendor datasheet figures (not measurements): HBM bandwidth in bytes/s, shared memory an SM can
#: give one kernel (its L1/shared total in brackets), SM count, dense float16/bfloat16 tensor-core FLOP/s.
GPUS: dict[str, dict[str, Any]] = {
    "A100 SXM4 80GB": dict(
        hbm_bytes_per_s=2039e9, smem_kib=164, l1_smem_kib=192, sms=108, fp16_flops=312e12, boost_hz=1.41e9,
        hbm_gb=80, l2_mb=40, regs_kib=256,
        source="NVIDIA A100 Tensor Core GPU datasheet (2,039 GB/s; FP16 and BF16 Tensor Core 312 TFLOPS, "
               "624 with sparsity); NVIDIA Ampere GPU Architecture Tuning Guide (up to 164 KB shared memory "
               "of a 192 KB L1/shared memory per SM; 108 SMs; boost clock 1,410 MHz; 40 MB of L2 cache; 64K 32-bit "
               "registers, 256 KB, per SM)",
    ),
    "H100 SXM5 80GB": dict(
        hbm_bytes_per_s=3.35e12, smem_kib=228, l1_smem_kib=256, sms=132, fp16_flops=989.4e12, boost_hz=1.83e9,
        hbm_gb=80, l2_mb=50, regs_kib=256,
        source="NVIDIA H100 Tensor Core GPU datasheet (3.35 TB/s; FP16 and BF16 Tensor Core 1,979 TFLOPS "
               "with sparsity, i.e. 989.4 dense, the figure of the NVIDIA H100 architecture whitepaper); "
               "NVIDIA Hopper Tuning Guide (up to 228 KB shared memory of a 256 KB L1/shared memory per SM; 132 SMs; "
               "50 MB of L2 cache; 64K 32-bit registers, 256 KB, per SM); "
               "boost clock 1,830 MHz (the clock at which 132 SMs give 989.4 TFLOP/s)",
    ),
    "B200": dict(
        hbm_bytes_per_s=8e12, smem_kib=228, l1_smem_kib=256, sms=148, fp16_flops=2.25e15, boost_hz=1.856e9,
        source="NVIDIA HGX B200 datasheet (HBM3e 8 TB/s per GPU; FP16 and BF16 Tensor Core 4.5 PFLOPS "
               "with sparsity, i.e. 2.25 dense, per GPU); NVIDIA Blackwell architecture (148 SMs); CUDA C++ "
               "Programming Guide, compute capability 10.0 (up to 228 KB shared memory of a 256 KB "
               "L1/shared memory per SM); boost clock 1,856 MHz (the clock at which 148 SMs, at twice the "
               "H100's 4,096 dense FLOP per clock, give 2.25 PFLOP/s)",
    ),
}

#: Exponentials (``exp2``, the special-function units' ``MUFU.EX2``) per clock per SM on compute
#: capability 8.0 and 9.0: the arithmetic-instruction throughput table of the CUDA C++ Programming Guide;
#: unchanged on the B200 (compute capability 10.0), as the FlashAttention-4 paper's analysis assumes.
SFU_OPS_PER_CLOCK_PER_SM = 16


def exp_per_s(gpu: dict[str, Any]) -> float:
    """Exponentials per second of a GPU's special-function units: SMs x 16 per clock x boost clock.

    A datasheet-derived bound, not a measurement.

    >>> round(exp_per_s(GPUS["H100 SXM5 80GB"]) / 1e12, 2)
    3.86
    """
    return gpu["sms"] * SFU_OPS_PER_CLOCK_PER_SM * gpu["boost_hz"]


#: Bytes each SM's shared memory delivers per clock (32 banks of 4 bytes), on compute capability 8.0 and 9.0.
SMEM_BYTES_PER_CLOCK_PER_SM = 128


def sram_bytes_per_s(gpu: dict[str, Any]) -> float:
    """Shared-memory bandwidth of all SMs together: SMs x 128 bytes per clock x boost clock (datasheet-derived).

    >>> round(sram_bytes_per_s(GPUS["A100 SXM4 80GB"]) / 1e12, 1)
    19.5
    """
    return gpu["sms"] * SMEM_BYTES_PER_CLOCK_PER_SM * gpu["boost_hz"]


#: The GPU the memory-hierarchy diagram draws.
DIAGRAM_GPU = "A100 SXM4 80GB"


@diagram
def memory_hierarchy_diagram() -> Diagram:
    """The A100's memory levels, fast and small on top, large and slow below, with datasheet sizes and bandwidths."""
    g = GPUS[DIAGRAM_GPU]
    name = " ".join(DIAGRAM_GPU.split()[:2]).replace("SXM4", "SXM")  # "A100 SXM": the figures are the SXM card's
    sram_tb, hbm_tb = sram_bytes_per_s(g) / 1e12, g["hbm_bytes_per_s"] / 1e12
    d = Diagram(
        "ch09_memory_hierarchy", 380, 430, title=f"The memory levels of an {name}",
        alt=(f"Three levels of memory on an {name}, fastest on top. Each of its {g['sms']} SMs has its own SRAM: up to "
             f"{g['smem_kib']} KB of shared memory and {g['regs_kib']} KB of registers, about {sram_tb:.1f} TB/s for all "
             f"SMs together; the tiles of scores stay here. Below them an L2 cache of {g['l2_mb']} MB that all SMs "
             f"share. At the bottom {g['hbm_gb']} GB of HBM at {hbm_tb:.2f} TB/s, where Q, K, V and the output live."))
    d.text(190, 28, f"The memory levels of an {name}", size=16, weight="bold")
    d.rect(20, 44, 340, 150, fill="green", tint=True, stroke="green", width=2)
    d.text(34, 66, f"{g['sms']} SMs, each with its own SRAM", size=15, anchor="start", weight="bold")
    for k, label in enumerate(("SM 1", "SM 2", "\u2026", f"SM {g['sms']}")):
        x = 34 + k * 80
        if label == "\u2026":
            d.text(x + 33, 100, label, size=16)
            continue
        d.rect(x, 78, 66, 34, fill="#FFFFFF", stroke="green", width=1.5)
        d.text(x + 33, 100, label, size=14)
    d.text(34, 136, f"{g['smem_kib']} KB shared memory + {g['regs_kib']} KB registers", size=14, anchor="start")
    d.text(34, 158, f"per SM; about {sram_tb:.1f} TB/s for all SMs", size=14, anchor="start")
    d.text(34, 182, "tiles of scores, m, \u2113, acc stay here", size=14, anchor="start", color=MUTED, italic=True)
    d.arrow(190, 196, 190, 232)
    d.arrow(190, 232, 190, 196)
    d.box(20, 236, 340, 56, f"L2 cache: {g['l2_mb']} MB", sub="shared by all SMs", color="sky")
    d.arrow(190, 294, 190, 330)
    d.arrow(190, 330, 190, 294)
    d.text(200, 318, f"{hbm_tb:.2f} TB/s", size=14, anchor="start", color=MUTED)
    d.box(20, 334, 340, 80, f"HBM: {g['hbm_gb']} GB", sub="Q, K, V and the output live here", color="orange")
    return d


#: What the execution-hierarchy diagram draws: threads per warp, and at most threads per thread block.
WARP_THREADS, MAX_BLOCK_THREADS = 32, 1024


@diagram
def execution_hierarchy_diagram() -> Diagram:
    """How a kernel runs: a grid of thread blocks, each block on one SM, its threads in warps of 32, and the
    SM's shared memory on the chip against HBM off it (the A100's datasheet numbers)."""
    g = GPUS[DIAGRAM_GPU]
    name = " ".join(DIAGRAM_GPU.split()[:2]).replace("SXM4", "SXM")  # "A100 SXM": the figures are the SXM card's
    warps = MAX_BLOCK_THREADS // WARP_THREADS
    d = Diagram(
        "ch09_execution_hierarchy", 380, 560, title=f"How a kernel runs on an {name}",
        alt=(f"How a kernel runs on an {name}. At the top, a kernel is launched as a grid of thread blocks, B0 to "
             f"B13 here. Each block is sent to one SM; the {g['sms']} SMs run blocks at the same time and take new "
             f"ones as others finish. Inside an SM, a thread block of up to {MAX_BLOCK_THREADS:,} threads runs as "
             f"warps of {WARP_THREADS} threads (warp 0: threads 0 to {WARP_THREADS - 1}, warp 1: threads "
             f"{WARP_THREADS} to {2 * WARP_THREADS - 1}, up to {warps} warps), each warp executing one instruction "
             f"for its {WARP_THREADS} threads at a time. Each SM has up to {g['smem_kib']} KB of shared memory on the "
             f"chip, which the threads of a block share, beside {g['regs_kib']} KB of registers, the tensor cores "
             f"and the units for exp. Below the SMs, off the chip, {g['hbm_gb']} GB of HBM at "
             f"{g['hbm_bytes_per_s'] / 1e12:.2f} TB/s holds Q, K, V and the output, for all SMs."))
    d.text(190, 28, f"How a kernel runs on an {name}", size=16, weight="bold")
    d.text(20, 58, "a kernel: a grid of thread blocks", size=14, anchor="start", weight="bold")
    d.grid(34, 70, [["sky"] * 7] * 2, cell=38, gap=8, size=12,
           labels=[[f"B{r * 7 + c}" for c in range(7)] for r in range(2)])
    d.arrow(100, 160, 100, 196)
    d.text(112, 184, "each block runs on one SM", size=12, anchor="start", color=MUTED)
    d.rect(20, 202, 340, 240, fill="green", tint=True, stroke="green", width=2)
    d.text(34, 224, f"one SM (an {name} has {g['sms']})", size=14, anchor="start", weight="bold")
    d.rect(34, 234, 312, 106, fill="blue", tint=True, stroke="blue", width=1.5)
    d.text(46, 254, f"a thread block: up to {MAX_BLOCK_THREADS:,} threads", size=13, anchor="start")
    for k in range(2):
        d.rect(46, 264 + 26 * k, 288, 22, fill="#FFFFFF", stroke="blue", width=1)
        d.text(56, 280 + 26 * k, f"warp {k}: threads {k * WARP_THREADS}\u2013{(k + 1) * WARP_THREADS - 1}",
               size=12, anchor="start")
    d.text(46, 330, f"\u2026 up to {warps} warps, {WARP_THREADS} threads each", size=12, anchor="start", color=MUTED)
    d.box(34, 350, 312, 34, f"shared memory: up to {g['smem_kib']} KB", color="purple", size=14)
    d.text(34, 404, "on the chip; shared by a block's threads", size=12, anchor="start")
    d.text(34, 424, f"registers ({g['regs_kib']} KB), tensor cores, exp units", size=12, anchor="start")
    d.arrow(190, 446, 190, 478)
    d.arrow(190, 478, 190, 446)
    d.text(200, 468, f"{g['hbm_bytes_per_s'] / 1e12:.2f} TB/s", size=12, anchor="start", color=MUTED)
    d.box(20, 482, 340, 62, f"HBM: {g['hbm_gb']} GB, off the chip", sub="Q, K, V and the output, for all SMs",
          color="orange")
    return d


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

    Each tile is numbered by the step that computes it: FlashAttention-1 walks the grid column by column,
    1 to 16; FlashAttention-2 runs the rows in parallel, one thread block each, so each row is numbered 1
    to 4. The orange tiles are what one block keeps in on-chip SRAM during its first four steps, and the
    text under each grid says what stays and what moves through HBM. Returns the matplotlib ``Figure``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n = 4
    # one grid above the other: each keeps 12 pt text legible in a phone's column
    fig, axes = plt.subplots(2, 1, figsize=(4.6, 10.4))
    orders = (
        ("FlashAttention-1: key blocks outside", lambda i, j: j * n + i, lambda i, j: j == 0,
         "orange, steps 1-4: K1, V1 stay in SRAM;\nevery step: read Q_i, and read and\nwrite back O_i, l_i, m_i in HBM"),
        ("FlashAttention-2: query blocks outside,\nrows run in parallel", lambda i, j: j, lambda i, j: i == 0,
         "orange: Q1, its acc, l and m stay in\nSRAM; every step: read K_j, V_j;\nO1 written once, after step 4"),
    )
    for ax, (title, step, first, text) in zip(axes, orders):
        for i in range(n):
            for j in range(n):
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor="#E69F00" if first(i, j) else "#FFFFFF",
                                       edgecolor="#555555", lw=1))
                ax.text(j + 0.5, i + 0.5, str(step(i, j) + 1), ha="center", va="center", fontsize=13)
        ax.set(xlim=(0, n), ylim=(n, 0), aspect="equal")
        ax.set_title(title, fontsize=12)
        ax.set_xticks([j + 0.5 for j in range(n)], [f"K{j + 1}" for j in range(n)], fontsize=12)
        ax.set_yticks([i + 0.5 for i in range(n)], [f"Q{i + 1}" for i in range(n)], fontsize=12)
        ax.set_xlabel("key/value blocks", fontsize=12)
        ax.set_ylabel("query blocks", fontsize=12)
        ax.tick_params(length=0)
        ax.text(0.0, -0.16, text, ha="left", va="top", fontsize=12, transform=ax.transAxes)
    fig.suptitle("Tiles numbered in the order computed", fontsize=12)
    fig.subplots_adjust(left=0.16, right=0.97, top=0.91, bottom=0.12, hspace=0.7)
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
    "grid of program instances: (4, 2) | output (1, 2, 50, 32) torch.float16",
    "float16: equal to SDPA (float32, TF32 off) within 0.002 + 0.002 x |SDPA|: True",
    "float32: equal to SDPA (float32, TF32 off) within 1e-05 + 1e-05 x |SDPA|: True",
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

    float16, and float32, whose products ``input_precision="ieee"`` keeps in full float32 (within
    ``1e-5`` of SDPA with TF32 off), on CUDA and in Triton's interpreter alike (the interpreter has
    float16 ``tl.dot``; it lacks only bfloat16). The float16 tolerance covers three roundings to float16: the inputs, the weights ``p`` before
    ``p @ v`` and the output itself (float16 numbers in [2, 4) lie 2**-9 ~ 2e-3 apart), so it is
    relative as well as absolute: ``2e-3 + 2e-3 * |reference|``, about four units of float16's
    relative rounding error 2**-11.
    """
    torch.device(device)  # the same dtypes on every device; the argument is kept for callers
    return [(torch.float16, 2e-3, 2e-3), (torch.float32, 1e-5, 1e-5)]


def triton_demo_lines(device: torch.device | str) -> list[str]:
    """Run :func:`attnlib.triton_flash_attention` on a tiny causal example and describe the result.

    ``[1, 2, 50, 32]`` inputs with 16-blocks: a grid of ``(ceil(50 / 16), 1 * 2) = (4, 2)`` program
    instances, in each dtype of :func:`triton_demo_runs` (float16 and float32, in Triton's
    interpreter on the CPU, ``TRITON_INTERPRET=1``, or compiled on CUDA). Each result is compared with
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


def _softmax_merge(oa: Tensor, la: Tensor, ob: Tensor, lb: Tensor, dim: int) -> Tensor:
    """The merge with weights ``torch.softmax(torch.stack([lse_a, lse_b]), dim=dim)``: right for ``dim=0``, the
    axis the stack added; ``dim=-1`` (the queries) and ``dim=1`` (the heads) are the slips. Over an axis of size
    1 the slip gives the plain sum, named by its own mistake, so it is not computed there."""
    stacked = torch.stack([la, lb])  # [2, H, S_q]
    if stacked.shape[dim] == 1:
        raise ValueError(f"a softmax over an axis of size 1 is the plain sum; dim {dim} of {tuple(stacked.shape)}")
    w = torch.softmax(stacked, dim=dim)  # [2, H, S_q]
    return w[0][..., None] * oa + w[1][..., None] * ob  # [H, S_q, D_v]


_MERGE_MISTAKES = (
    Mistake("mean", lambda oa, la, ob, lb, na, nb: (oa + ob) / 2,
            "the two parts are not worth the same: weight each by its share of the softmax denominator, "
            "exp(lse_part - lse_total)."),
    Mistake("weights by lse", lambda oa, la, ob, lb, na, nb: (la[..., None] * oa + lb[..., None] * ob) / (la + lb)[..., None],
            "you weighted by lse itself; the denominators are exp(lse), so weight by exp(lse_part - lse_total)."),
    Mistake("weights swapped", lambda oa, la, ob, lb, na, nb: (
                torch.exp(lb - torch.logaddexp(la, lb))[..., None] * oa + torch.exp(la - torch.logaddexp(la, lb))[..., None] * ob),
            "the weights are swapped: out_a gets the share of its own part, exp(lse_a - lse), and out_b "
            "exp(lse_b - lse)."),
    Mistake("weights upside down", lambda oa, la, ob, lb, na, nb: (
                torch.exp(torch.logaddexp(la, lb) - la)[..., None] * oa + torch.exp(torch.logaddexp(la, lb) - lb)[..., None] * ob),
            "your weights are upside down: exp(lse_total - lse_part) is at least 1 and grows as the part's share shrinks. "
            "A part's weight is its share of the denominator, exp(lse_part) / exp(lse_total) = "
            "exp(lse_part - lse_total), at most 1, and the two weights sum to 1."),
    Mistake("max subtracted, not normalised", lambda oa, la, ob, lb, na, nb: (
                torch.exp(la - torch.maximum(la, lb))[..., None] * oa + torch.exp(lb - torch.maximum(la, lb))[..., None] * ob),
            "you subtracted the larger lse, which keeps exp from overflowing, but your two weights exp(lse_part - max) "
            "do not sum to 1: divide them by their sum, or (the same thing) subtract the total "
            "lse = torch.logaddexp(lse_a, lse_b) instead of the max: exp(lse_part - lse)."),
    Mistake("sum", lambda oa, la, ob, lb, na, nb: oa + ob,
            "each part is already an average over its own keys, so their plain sum counts the weight twice: weight "
            "each by its share of the softmax denominator, exp(lse_part - lse_total), two weights that sum to 1."),
    Mistake("weights exp(lse) unnormalised", lambda oa, la, ob, lb, na, nb: (
                torch.exp(la)[..., None] * oa + torch.exp(lb)[..., None] * ob),
            "exp(lse_a) and exp(lse_b) are the parts' denominators, not their shares: divide each by the total "
            "exp(lse_a) + exp(lse_b), i.e. weight by exp(lse_part - lse_total), where lse_total = torch.logaddexp(lse_a, lse_b)."),
    Mistake("weights without exp", lambda oa, la, ob, lb, na, nb: (
                (la - torch.logaddexp(la, lb))[..., None] * oa + (lb - torch.logaddexp(la, lb))[..., None] * ob),
            "your weights are lse_part - lse_total without exp: those are the logs of the parts' shares, negative "
            "numbers that do not sum to 1. A part's share of the softmax denominator is exp(lse_part) / "
            "exp(lse_total) = exp(lse_part - lse_total): take exp of the difference before weighting out_a and out_b."),
    Mistake("the lse values as weights", lambda oa, la, ob, lb, na, nb: la[..., None] * oa + lb[..., None] * ob,
            "you used lse_a and lse_b themselves as the weights, without exp: an lse is the log of a part's "
            "denominator, like a score before softmax. The weight of a part is its share of the total "
            "denominator, exp(lse_part - lse_total), where lse_total = torch.logaddexp(lse_a, lse_b)."),
    Mistake("softmax over the queries", lambda oa, la, ob, lb, na, nb: _softmax_merge(oa, la, ob, lb, -1),
            "your softmax runs over the queries, not over the two parts: each query's two weights must sum to 1. "
            "Normalise across the axis that stack added."),
    Mistake("softmax over the heads", lambda oa, la, ob, lb, na, nb: _softmax_merge(oa, la, ob, lb, 1),
            "your softmax runs over the heads, not over the two parts: each query's two weights must sum to 1. "
            "Normalise across the axis that stack added."),
    Mistake("weights by key counts", _merge_by_counts,
            "you weighted the parts by how many keys each has: what matters is how much of the softmax denominator "
            "each part holds, exp(lse_part - lse_total), which depends on the scores, not on the counts."),
)

_NO_BROADCAST = (
    "lse has one number per query, shape [.., S_q], and out is [.., S_q, D_v]: write weight[..., None] so that the "
    "weight lines up with the query rows (not the value features)."
)


def _lse_max_not_added_back(oa: Tensor, la: Tensor, ob: Tensor, lb: Tensor, na: int, nb: int) -> Tensor:
    m = torch.maximum(la, lb)
    return torch.log(torch.exp(la - m) + torch.exp(lb - m))


#: Known wrong merged logsumexps (the weights a reader computes from them follow them into out).
_LSE_MISTAKES = (
    Mistake("logs added", lambda oa, la, ob, lb, na, nb: la + lb,
            "your lse is lse_a + lse_b, but logs of sums do not add: lse_a + lse_b = log(exp(lse_a) * exp(lse_b)) is "
            "the log of the product of the two denominators. The merged denominator is their sum, so the merged lse "
            "is the log of exp(lse_a) + exp(lse_b) (torch.logaddexp computes it without overflowing)."),
    Mistake("max not added back", _lse_max_not_added_back,
            "your lse is log(exp(lse_a - m) + exp(lse_b - m)) without the m you subtracted: that is the merged lse "
            "minus m. Subtracting the larger lse keeps exp from overflowing, but the log must add it back "
            "(torch.logaddexp does both)."),
    Mistake("the larger lse", lambda oa, la, ob, lb, na, nb: torch.maximum(la, lb),
            "the total lse is log(exp(lse_a) + exp(lse_b)) (torch.logaddexp), not the larger of the two."),
)

_LSE_WRONG_AXIS = (
    "your lse is a logsumexp over the wrong axis of the stacked lse_a and lse_b: it sums over the queries (or the "
    "heads), not over the two parts, so it no longer has one number per query and the weights cannot line up. "
    "Reduce the axis the stack added; the merged lse keeps the shape of lse_a, [H, S_q]."
)

_NO_BROADCAST_UNKNOWN = (
    " The shapes did not line up: lse_a, lse_b and the merged lse have one number per query, [H, S_q], and "
    "out_a, out_b are [H, S_q, D_v]. Check that your lse keeps the shape [H, S_q], and write weight[..., None] so "
    "that each weight lines up with the query rows."
)


def _square_parts() -> list[Tensor]:
    """Two partial results with H = S_q = D_v = 2, where a weight without [..., None] or an lse reduced over
    the wrong axis still broadcasts, so that the checker can see what the reader's lse is."""
    gen = torch.Generator().manual_seed(89)
    oa, ob = (torch.randn(2, 2, 2, generator=gen, dtype=torch.float64) for _ in range(2))  # [H, S_q, D_v]
    la, lb = (torch.randn(2, 2, generator=gen, dtype=torch.float64) * 2 for _ in range(2))  # [H, S_q]
    return [oa, la, ob, lb]


def _broadcast_hint(fn: Callable[..., Any], message: str) -> Feedback:
    """The hint for a merge that raised a size mismatch: it looks at the lse the reader's code returns where
    the shapes happen to broadcast (:func:`_square_parts`)."""
    parts = _square_parts()
    got, fb = run_reader_code(fn, *[t.clone() for t in parts])
    lse = got[1] if fb is None and isinstance(got, (tuple, list)) and len(got) == 2 else None
    if isinstance(lse, Tensor) and tuple(lse.shape) == (2, 2) and close(lse, torch.logaddexp(parts[1], parts[3])):
        return wrong(_NO_BROADCAST)
    la, lb = parts[1], parts[3]
    for stack_dim in (0, -1):
        stacked = torch.stack([la, lb], dim=stack_dim)  # [2, H, S_q] or [H, S_q, 2]
        for dim in range(3):
            if dim != stack_dim % 3 and isinstance(lse, Tensor) and close(lse, torch.logsumexp(stacked, dim=dim)):
                return wrong(_LSE_WRONG_AXIS)
    return wrong(message.rstrip(".") + "." + _NO_BROADCAST_UNKNOWN)


def _merge_one(fn: Callable[..., Any], case: int) -> Feedback | None:
    parts, out, lse = _merge_case(case)
    split, S_k = MERGE_CASES[case][3], MERGE_CASES[case][2]
    got, fb = run_reader_code(fn, *[t.clone() for t in parts])
    if fb is not None and "must match the size of tensor" in fb.message:
        return _broadcast_hint(fn, fb.message)
    if fb is not None:
        return fb
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return wrong(f"return two tensors (out, lse), got {describe(got)}: the merged lse is needed "
                     "to merge the result again with a third part.")
    got_out, got_lse = got
    if (isinstance(got_out, Tensor) and isinstance(got_lse, Tensor) and tuple(got_out.shape) == tuple(lse.shape)
            and tuple(got_lse.shape) == tuple(out.shape)):
        return wrong("you returned (lse, out): return them in the order (out, lse), the merged output first.")
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
        half = narrowed_dtype(name, t, exp)
        if half is not None:
            return half
    if lse.dtype == torch.float64:  # the dtype rule: float32 inside, cast back, is refused though it fits 1e-4
        narrow = [t.double() for t in _solution_merge(*(p.float() for p in parts))]
        for name, t, exp, low in (("out", got_out, out, narrow[0]), ("lse", got_lse, lse, narrow[1])):
            narrower = computed_narrower(t, exp, low, name=f"your {name}")
            if narrower is not None:
                return narrower
    lse_hint = None if close(got_lse, lse, atol=1e-4, rtol=1e-4) else diagnose(got_lse, _LSE_MISTAKES, *parts, split, S_k - split)
    if not close(got_out, out, atol=1e-4, rtol=1e-4):
        hint = diagnose(got_out, _MERGE_MISTAKES, *parts, split, S_k - split) or lse_hint
        if hint is None and not close(got_lse, lse, atol=1e-4, rtol=1e-4):
            oa, la, ob, lb = parts
            own = torch.exp(la - got_lse)[..., None] * oa + torch.exp(lb - got_lse)[..., None] * ob  # out from the reader's lse
            if close(got_out, own, atol=1e-4, rtol=1e-4):
                hint = wrong("your out follows from your lse, weight exp(lse_part - lse), so the error is in lse: the "
                             "merged lse is the log of the total denominator, log(exp(lse_a) + exp(lse_b)).")
        return hint or wrong("the merged output differs from attention over all keys: each part is normalised over "
                             "its own keys, so weight it by its share of the whole softmax denominator, and check "
                             "that the two weights sum to 1 for every query.")
    if not close(got_lse, lse, atol=1e-4, rtol=1e-4):
        return lse_hint or wrong("the output is right but lse is not: the merged lse is the log of the whole "
                                 "softmax denominator, and each part's denominator is exp of its lse.")
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
                               same=lambda a, b: close(a, b, atol=1e-4, rtol=1e-4)),
                  MistakeTable(_LSE_MISTAKES, _merge_table_cases, lambda oa, la, ob, lb, na, nb: reference_merge_partials(oa, la, ob, lb)[1],
                               same=lambda a, b: close(a, b, atol=1e-4, rtol=1e-4))))
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


def _cap(flops_per_score: int = 4, share_of: str = "matmul", power: int = 1) -> Callable[[int, float, float], float]:
    def f(d: int, matmul_flops: float, exps_per_s: float) -> float:
        t_matmul, t_exp = flops_per_score * d ** power / matmul_flops, 1 / exps_per_s
        if share_of == "ratio":
            return t_matmul / t_exp
        if share_of == "capped ratio":
            return min(1.0, t_matmul / t_exp)
        if share_of == "inverse ratio":
            return t_exp / t_matmul
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
            "you counted 2 d FLOPs per score: either one matmul only, or both with a multiply-add counted as one "
            "FLOP, or (the same share) two exponentials per score where the forward pass runs one. The forward "
            "pass runs two matmuls per score, Q K^T and P V, each a dot product of length d, and a multiply-add is "
            "2 FLOPs (a multiply and an add): 4 d FLOPs per score, and one exponential."),
    Mistake("d FLOPs per score", _cap(flops_per_score=1),
            "you counted d FLOPs per score: a dot product of length d is d multiplies and d adds, 2 d FLOPs, and "
            "the forward pass runs two matmuls per score, Q K^T and P V, so 4 d FLOPs per score."),
    Mistake("d^2 FLOPs per score", _cap(flops_per_score=1, power=2),
            "you counted d^2 FLOPs per score: one score is one dot product of length d, 2 d FLOPs (d multiplies, "
            "d adds), and the forward pass runs two matmuls per score, Q K^T and P V, so 4 d FLOPs, not d^2."),
    Mistake("4 d^2 FLOPs per score", _cap(power=2),
            "you counted 4 d^2 FLOPs per score: each score costs a dot product of length d in Q K^T and one in "
            "P V, 4 d FLOPs in all, linear in d."),
    Mistake("share of the exponentials, or rates for times", _cap(share_of="exp"),
            "that is the share of the time spent on exponentials. You get it when you return t_exp / (t_matmul + "
            "t_exp), and also when you put rates where the times belong: matmul_flops / (4 d) and exps_per_s are "
            "scores per second, and the share of the faster rate is the share of the shorter time, the other one. "
            "A time per score is the work divided by the rate, and the cap is the share of the time that goes "
            "to the matmuls."),
    Mistake("ratio of the times", _cap(share_of="ratio"),
            "you divided the matmul time by the exponential time; the kernel spends the two times one after the "
            "other: what share of the total is the matmul time?"),
    Mistake("ratio capped at 1", _cap(share_of="capped ratio"),
            "you capped the ratio t_matmul / t_exp at 1: that treats the matmuls and the exponentials as if they ran "
            "at the same time. A kernel that takes turns spends both, one after the other: what share of that "
            "total is the matmul time? It stays below 1 even when the exponentials are fast."),
    Mistake("inverse ratio", _cap(share_of="inverse ratio"),
            "you divided the exponential time by the matmul time, t_exp / t_matmul: that is upside down, and "
            "it is not a share either. The kernel spends the two times one after the other: what share of the "
            "total is the matmul time?"),
    *(Mistake(f"{n} d FLOPs per score", _cap(flops_per_score=n), f"you counted {n} d FLOPs per score ({why}): "
              "Q K^T and P V are each one dot product of length d per score, d multiply-adds = 2 d FLOPs, so "
              "4 d FLOPs in all.")
      for n, why in ((8, "a multiply-add counted as 2 FLOPs twice over"), (3, "2 d for Q K^T but d for P V"))),
    Mistake("6 d FLOPs per score", _cap(flops_per_score=6),
            "you counted 6 d FLOPs per score, as if a backward matmul ran too: the forward pass runs two matmuls per "
            "score, Q K^T and P V, each a dot product of length d, 2 d FLOPs, so 4 d FLOPs in all."),
    Mistake("the two rates swapped", lambda d, F, E: reference_serial_cap(d, E, F),
            "you swapped the two rates: the matmul FLOPs run at matmul_flops per second and the exponentials at "
            "exps_per_s. Check which rate divides which work."),
    Mistake("4 d exponentials per score", lambda d, F, E: (4 * d / F) / (4 * d / F + 4 * d / E),
            "you gave each score 4 d exponentials, as many as its matmul FLOPs: a score has ONE exponential, "
            "exp(score - m), whatever d is, so t_exp = 1 / exps_per_s per score."),
    Mistake("d exponentials per score", lambda d, F, E: (4 * d / F) / (4 * d / F + d / E),
            "your exponential time grows with the head width d: you gave each score d exponentials, one per "
            "term of its dot product. The exponential is taken of the finished score, exp(score - m), not of "
            "the products that sum to it: count again how many one score needs, and whether d changes that."),
    Mistake("the ratio of the rates floored", lambda d, F, E: 1 / (1 + int(F) // int(4 * d * E)),
            "integer division (//, or int(...)) floored the ratio of the two times, matmul_flops / (4 d exps_per_s), "
            "to a whole number (0 or 1 here, where the two times are close): divide with / and keep the floats."),
    Mistake("a rate for the matmul time", lambda d, F, E: (F / (4 * d)) / (F / (4 * d) + 1 / E),
            "your fraction is 1 on every GPU, as if the exponentials took no time: your t_matmul is not a time. "
            "matmul_flops / (4 d) is a rate, scores per second (and 4 d * matmul_flops is neither). The time per "
            "score is the work divided by the rate."),
    Mistake("a rate for the exponential time", lambda d, F, E: (4 * d / F) / (4 * d / F + E),
            "your fraction is almost 0 on every GPU: your t_exp is exps_per_s, a rate (exponentials per second), "
            "not a time. How many seconds does one exponential take at exps_per_s exponentials per second?"),
    Mistake("a percentage", lambda d, F, E: 100 * reference_serial_cap(d, F, E),
            "return a fraction of 1 (0.5 for half the peak), not a percentage."),
)


def _cap_vector(f: Callable[..., Any]) -> tuple[Any, ...]:
    return tuple(f(*case) for case in CAP_CASES)


def _cap_same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(math.isclose(float(x), float(y), rel_tol=1e-6) for x, y in zip(a, b))


def _rounded(got: tuple[Any, ...], want: tuple[Any, ...]) -> bool:
    """Whether each of ``got`` is ``round(w, k)`` of its ``w`` in ``want`` for one k of 0..5."""
    return any(all(math.isclose(float(g), round(float(w), k), rel_tol=1e-9) for g, w in zip(got, want))
               for k in range(6))


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
    if all(a == 0 for a in answers):
        return wrong("your fractions are all 0: integer division (//, or int(...) on the times, which are far "
                     "below 1 second) rounds them down. Divide with / and keep the floats.")
    if _rounded(tuple(answers), _cap_vector(reference_serial_cap)):
        return wrong("your fractions are the right ones rounded: return the value unrounded (no round(...)); "
                     "rounding is for printing, and the checker compares to six significant digits.")
    return wrong("work out the time per score of each part, work divided by rate: how many matmul FLOPs and how "
                 "many exponentials one score needs, each at its own rate. Then the cap is the share of the total "
                 "time that goes to the matmuls.")


# ---- exercise: a sliding window in the fused kernel -------------------------------------------------

#: The sliding-window exercise's runs ``(S, D, window, BLOCK_Q, BLOCK_K)``: a window wider than a query
#: block, and one narrower, where a row's first tile can hide all its keys (the kernel's m_ref guard).
#: Every block is at least 16 wide, the smallest ``tl.dot`` a compiled Triton kernel accepts.
WINDOW_RUNS: tuple[tuple[int, int, int, int, int], ...] = ((160, 16, 36, 16, 16), (75, 16, 10, 32, 16))


def reference_visible(rows: Tensor, cols: Tensor, window: int) -> Tensor:
    """Which keys each query of a tile may see under a causal sliding window of ``window`` keys.

    ``rows`` is a column ``[BLOCK_Q, 1]`` of query positions, ``cols`` a row ``[1, BLOCK_K]`` of key
    positions; query ``i`` sees keys ``i - window + 1 .. i``. Only comparisons and ``&``, so the same
    function runs on PyTorch tensors and, through ``triton.jit``, inside a Triton kernel.
    """
    return (cols <= rows) & (rows - cols < window)


def reference_first_key(q_start: int, window: int) -> int:
    """The first key a block of queries starting at ``q_start`` may see (negative means key 0)."""
    return q_start - window + 1


def _clamped(x: int) -> int:
    return max(0, x)


def windowed_tiled_attention(q: Tensor, k: Tensor, v: Tensor, visible: Callable[..., Any],
                             first_key: Callable[[int, int], Any], window: int, block_q: int,
                             block_k: int) -> tuple[Tensor, list[int]]:
    """The sliding-window kernel's loop in PyTorch, for ``[BH, S, D]`` tensors: the same tiles, the same
    skip (each query block starts at the key block holding ``first_key``) and the same mask inside.

    Returns the output and the number of tiles each query block computed.
    """
    BH, S, D = q.shape
    out, tiles = torch.empty_like(q), []
    scale = D ** -0.5
    for q0 in range(0, S, block_q):
        rows = torch.arange(q0, min(q0 + block_q, S))[:, None]  # [r, 1]
        m = torch.full((BH, len(rows), 1), float("-inf"), dtype=q.dtype)
        l = torch.zeros(BH, len(rows), 1, dtype=q.dtype)
        acc = torch.zeros(BH, len(rows), D, dtype=q.dtype)
        k_start = _clamped(int(first_key(q0, window))) // block_k * block_k
        n = 0
        for k0 in range(k_start, min(S, q0 + block_q), block_k):
            cols = torch.arange(k0, min(k0 + block_k, S))[None, :]  # [1, c]
            s = (q[:, q0:q0 + len(rows)] @ k[:, k0:k0 + cols.shape[1]].transpose(-2, -1)) * scale
            s = s.masked_fill(~visible(rows, cols, window), float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            m_ref = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # a tile hiding a whole row
            p = torch.exp(s - m_ref)
            alpha = torch.exp(m - m_ref)
            l = l * alpha + p.sum(-1, keepdim=True)
            acc = acc * alpha + p @ v[:, k0:k0 + cols.shape[1]]
            m, n = m_new, n + 1
        out[:, q0:q0 + len(rows)] = acc / l
        tiles.append(n)
    return out, tiles


_WINDOW_KERNEL: list[Any] = []


def _window_kernel() -> Any:
    """The Triton kernel of the exercise, decorated on first use (TRITON_INTERPRET is read then)."""
    if _WINDOW_KERNEL:
        return _WINDOW_KERNEL[0]
    import triton
    import triton.language as tl

    @triton.jit
    def window_kernel(Q, K, V, Out, KStart, Tiles, S, D, scale, window, VISIBLE: tl.constexpr,
                      BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
        bh = tl.program_id(1).to(tl.int64)
        rows = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)  # [BLOCK_Q] this program's queries
        dk = tl.arange(0, BLOCK_D)
        q = tl.load(Q + bh * S * D + rows[:, None] * D + dk[None, :],
                    mask=(rows[:, None] < S) & (dk[None, :] < D), other=0.0)
        m = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
        k_start = tl.load(KStart + tl.program_id(0))  # the reader's first_key, rounded down to a key block
        k_end = tl.minimum(S, (tl.program_id(0) + 1) * BLOCK_Q)  # causal: no key after the last row
        n = 0
        for k0 in range(k_start, k_end, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            kt = tl.load(K + bh * S * D + cols[None, :] * D + dk[:, None],
                         mask=(cols[None, :] < S) & (dk[:, None] < D), other=0.0)
            s = tl.dot(q, kt, input_precision="ieee") * scale
            seen = (cols[None, :] < S) & VISIBLE(rows[:, None], cols[None, :], window)  # the reader's mask
            s = tl.where(seen, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # guard: a tile that hides a whole row
            p = tl.exp(s - m_ref[:, None])
            alpha = tl.exp(m - m_ref)
            l = l * alpha + tl.sum(p, 1)
            v = tl.load(V + bh * S * D + cols[:, None] * D + dk[None, :],
                        mask=(cols[:, None] < S) & (dk[None, :] < D), other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            m = m_new
            n += 1
        l = tl.where(l == 0.0, 1.0, l)  # the padding rows past S see no key: 0, not 0 / 0
        tl.store(Out + bh * S * D + rows[:, None] * D + dk[None, :], acc / l[:, None],
                 mask=(rows[:, None] < S) & (dk[None, :] < D))
        tl.store(Tiles + tl.program_id(0), n)

    _WINDOW_KERNEL.append(window_kernel)
    return window_kernel


def triton_mode() -> str | None:
    """How the exercise can run its Triton kernel here: ``"cuda"``, ``"interpreter"`` or ``None``."""
    import importlib.util
    import os

    if importlib.util.find_spec("triton") is None:
        return None
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "cuda"
    return "interpreter" if os.environ.get("TRITON_INTERPRET") == "1" else None


_TILE_ABS: list[Any] = []


def _tile_abs() -> Any:
    """``|x|`` of a Triton tile, jitted on first use (TRITON_INTERPRET is read then)."""
    if not _TILE_ABS:
        import triton
        import triton.language as tl

        @triton.jit
        def tile_abs(x):
            return tl.where(x < 0, -x, x)

        _TILE_ABS.append(tile_abs)
    return _TILE_ABS[0]


def _with_triton_language(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with ``tl`` (triton.language) among its globals, which Triton requires of a jitted function;
    a reader's function defined in a notebook that never imports Triton lacks it. Python's ``abs``, which
    the exercise's arithmetic includes and which runs on PyTorch tensors, becomes ``tl.abs``."""
    import types

    import triton.language as tl

    fn = getattr(fn, "__func__", fn)
    if not isinstance(fn, types.FunctionType):
        return fn
    # Python's abs is arithmetic that the exercise allows, but Triton does not know it: a jitted |x| stands in
    names = {"tl": tl, **({"abs": _tile_abs()} if "abs" not in fn.__globals__ else {})}
    new = types.FunctionType(fn.__code__, {**fn.__globals__, **names}, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__, new.__qualname__, new.__module__ = fn.__kwdefaults__, fn.__qualname__, fn.__module__
    return new


def triton_windowed_attention(q: Tensor, k: Tensor, v: Tensor, visible: Callable[..., Any], starts: list[int],
                              window: int, block_q: int, block_k: int) -> tuple[Tensor, list[int]]:
    """Run the exercise's Triton kernel on float32 ``[BH, S, D]`` tensors with ``visible`` compiled by
    ``triton.jit`` and the query blocks' first keys ``starts``; returns the output and the tiles per block."""
    import triton

    BH, S, D = q.shape
    where = "cuda" if triton_mode() == "cuda" else "cpu"
    q, k, v = (t.to(where, torch.float32).contiguous() for t in (q, k, v))
    out = torch.empty_like(q)
    tiles = torch.zeros(len(starts), dtype=torch.int32, device=where)
    kstart = torch.tensor(starts, dtype=torch.int32, device=where)
    _window_kernel()[(len(starts), BH)](q, k, v, out, kstart, tiles, S, D, D ** -0.5, window,
                                        VISIBLE=triton.jit(_with_triton_language(visible)), BLOCK_Q=block_q, BLOCK_K=block_k,
                                        BLOCK_D=max(16, triton.next_power_of_2(D)))
    return out.cpu(), tiles.cpu().tolist()


def _visible_cases() -> list[tuple[Tensor, Tensor, int]]:
    """Tiles ``(rows, cols, window)`` the checker asks ``visible`` about directly: tiles of the second run that
    hold both the future of some query and keys too far behind another, so that every mistake shows."""
    S, _, W, bq, bk = WINDOW_RUNS[1]
    return [(torch.arange(q0, min(q0 + bq, S))[:, None], torch.arange(k0, min(k0 + bk, S))[None, :], W)
            for q0, k0 in ((0, 0), (32, 32), (32, 48))]


def _first_key_cases() -> list[tuple[int, int]]:
    return [(q0, W) for S, _, W, bq, _ in WINDOW_RUNS for q0 in range(0, S, bq)]


_PRECEDENCE = (
    "in Python & binds tighter than the comparisons <= and <, so `cols <= rows & (rows - cols < window)` reads as "
    "`cols <= (rows & (rows - cols < window))`, a bitwise and of the positions. Put each comparison in its own "
    "parentheses before combining them with &."
)

VISIBLE_MISTAKES = (
    Mistake("causal only", lambda r, c, w: c <= r,
            "that is the causal mask alone: the window also hides every key more than window - 1 positions "
            "before the query."),
    Mistake("window only", lambda r, c, w: r - c < w,
            "your tile lets a query see keys after it: the window sits behind the query, so it needs a causal "
            "condition beside it."),
    Mistake("one key too many", lambda r, c, w: (c <= r) & (r - c <= w),
            "each query sees window keys, itself and the window - 1 before it: rows - cols <= window lets it see one "
            "more."),
    Mistake("one key too few", lambda r, c, w: (c <= r) & (r - c < w - 1),
            "each query sees window keys, itself and the window - 1 before it: yours sees one fewer."),
    Mistake("rows and cols swapped", lambda r, c, w: (r <= c) & (c - r < w),
            "rows and cols are swapped: rows holds the query positions (a column), cols the key positions (a row), "
            "and query i sees keys i - window + 1 .. i."),
    Mistake("or for and", lambda r, c, w: (c <= r) | (r - c < w),
            "a key is visible when both conditions hold: combine them with &, not |."),
    Mistake("strictly causal", lambda r, c, w: (c < r) & (r - c < w),
            "a query also sees itself (cols == rows), and your causal part leaves it out."),
    Mistake("& before <=", lambda r, c, w: c <= (r & (r - c < w)),
            _PRECEDENCE),
    Mistake("inverted", lambda r, c, w: (c > r) | (r - c >= w),
            "your tile is the opposite of the mask: True where the query may NOT see the key. The kernel keeps a "
            "score where `visible` is True, tl.where(visible, s, -inf), so return True for the keys a query sees "
            "(the other way round from masked_fill, whose True means hide): not after the query, and fewer than "
            "window positions back."),
    Mistake("symmetric window", lambda r, c, w: (r - c).abs() < w,
            "your window reaches both ways: it lets a query see keys after it, up to window - 1 ahead. The window "
            "sits behind the query only, so combine the look-back limit with the causal part (cols <= rows)."),
)

FIRST_KEY_MISTAKES = (
    Mistake("no skip", lambda q0, w: 0,
            "starting every query block at key 0 gives the right output but computes every tile left of the "
            "diagonal: the point is to skip the key blocks entirely before the window of the block's first row."),
    Mistake("one key early", lambda q0, w: q0 - w,
            "one key too early: the block's first row sees itself and the window - 1 keys before it; count them "
            "again."),
    Mistake("one key late", lambda q0, w: q0 - w + 2,
            "one key too late: the block's first row sees itself and the window - 1 keys before it, so the kernel "
            "would miss the earliest of them; count them again."),
    Mistake("the query itself", lambda q0, w: q0,
            "the block's queries look back: its first row sees itself and the window - 1 keys before it, so the "
            "first key comes before q_start; count them again."),
    Mistake("the window length", lambda q0, w: w,
            "the first key depends on where the block starts: its first row, q_start, sees itself and the "
            "window - 1 keys before it; count them again."),
)


def _first_key_same(a: Any, b: Any) -> bool:
    try:
        return _clamped(int(a)) == _clamped(int(b))
    except Exception:
        return False


#: The two parts of ``visible`` and the slips each part can carry on its own, with what each slip gets
#: wrong (no answer stated): a reader's tile that is one causal slip AND one window slip together is
#: named as two differences, where a single-mistake hint would name one and leave the reader puzzled.
_CAUSAL_SLIPS = (
    (lambda r, c: c < r, "its causal part leaves out the query itself (cols == rows), which a query always sees"),
    (lambda r, c: r <= c, "its causal part faces the wrong way: it keeps the keys after the query, where the "
                          "window sits behind it"),
)
_WINDOW_SLIPS = (
    (lambda r, c, w: r - c <= w, "its window part lets a query see one key more than window (itself and the "
                                 "window - 1 keys before it make window)"),
    (lambda r, c, w: r - c < w - 1, "its window part lets a query see one key fewer than window"),
    (lambda r, c, w: (r - c).abs() < w, "its window part reaches both ways, to keys after the query too"),
)


def _two_slips(got: Tensor, rows: Tensor, cols: Tensor, window: int) -> Feedback | None:
    """The hint for a tile that is one causal slip and one window slip at once (``None`` otherwise)."""
    for causal, why_causal in _CAUSAL_SLIPS:
        for part, why_window in _WINDOW_SLIPS:
            compound = causal(rows, cols) & part(rows, cols, window)
            # both slips must show on this tile: with the other part right, each alone gives another tile
            alone = (causal(rows, cols) & (rows - cols < window), (cols <= rows) & part(rows, cols, window))
            if torch.equal(got, compound) and not any(torch.equal(compound, a) for a in alone):
                return wrong(f"your tile has two differences, not one: {why_causal}; and {why_window}. "
                             "Fix one, run the check again, and the other is named on its own.")
    return None


def _with_first_key(problem: Feedback, first_key: Callable[[int, int], Any]) -> Feedback:
    """``problem`` (a "wrong" verdict on ``visible``), extended when ``first_key`` is wrong as well, so that a
    reader with two slips, one in each function, is told of both instead of one."""
    if problem.status != "wrong":
        return problem
    for q0, window in _first_key_cases():
        other = _first_key_one(first_key, q0, window)
        if other is not None and other.status == "wrong":
            return wrong(f"more than one thing differs. In `visible`: {problem.message} In `first_key` too: "
                         f"{other.message}")
    return problem


def _visible_one(fn: Callable[..., Any], rows: Tensor, cols: Tensor, window: int) -> Feedback | None:
    got, fb = run_reader_code(fn, rows, cols, window)
    if fb is not None and "Boolean value of Tensor" in fb.message:
        return wrong("Python's `and`, `or`, `not`, `if` and a chained comparison such as `a < b <= c` (which "
                     "Python runs as `a < b and b <= c`) each need one True or False, and a tile of comparisons "
                     "holds many: which operator combines two boolean tiles element by element? Put each "
                     "comparison in its own parentheses before combining them.")
    if fb is not None:
        return fb
    expected = reference_visible(rows, cols, window)
    if isinstance(got, tuple):
        return wrong(f"`visible` returned a tuple of {len(got)} items: return one boolean tile, shape "
                     f"{tuple(expected.shape)} (write `return a & b`, not `return a, b`).")
    if not isinstance(got, Tensor):
        return wrong(f"`visible` should return a boolean tensor (comparisons combined with &), got {describe(got)}.")
    if tuple(got.shape) != tuple(expected.shape):
        return wrong(f"`visible` returned shape {tuple(got.shape)} for rows {tuple(rows.shape)} and cols "
                     f"{tuple(cols.shape)}: compare the column `rows` with the row `cols` so that they broadcast to "
                     f"[BLOCK_Q, BLOCK_K] = {list(expected.shape)}.")
    if got.dtype != torch.bool:
        return wrong(f"`visible` returned {got.dtype}: return the comparisons themselves, a torch.bool tile "
                     "(True where the query may see the key), combined with &.")
    if torch.equal(got, expected):
        return None
    return diagnose(got, VISIBLE_MISTAKES, rows, cols, window) or _two_slips(got, rows, cols, window) or wrong(
        f"on the tile of queries {rows[0, 0].item()}..{rows[-1, 0].item()} and keys {cols[0, 0].item()}.."
        f"{cols[0, -1].item()} with window = {window}, your tile differs: query i sees keys i - window + 1 .. i.")


#: What ``visible`` may apply to its tiles: the operators a Triton tile has too (comparisons, arithmetic,
#: ``abs``, ``&``), which reach ``__torch_function__`` as the tensor methods of these names, and reading an
#: attribute such as ``shape``; a function of the torch namespace (torch.where, torch.logical_and) is refused.
_TILE_OPERATORS = frozenset({
    "lt", "le", "gt", "ge", "eq", "ne", "add", "sub", "mul", "neg", "abs", "floor_divide", "remainder",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
    "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "__and__", "__rand__", "__or__", "__ror__",
    "__xor__", "__rxor__", "__invert__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
    "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__neg__", "__pos__", "__abs__", "__bool__", "__get__",
})


class _TorchCall(Exception):
    """Raised when ``visible`` applies a torch function to a tile (see :class:`_TileOnly`)."""


class _TileOnly(Tensor):
    """A tile that allows only :data:`_TILE_OPERATORS`, as a Triton tile does: ``visible`` runs on these in the
    PyTorch loop too, so that a torch function is refused whether or not Triton runs the kernel."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", str(func))
        if name not in _TILE_OPERATORS or getattr(func, "__qualname__", "").startswith("_VariableFunctions"):
            raise _TorchCall(name)
        return super().__torch_function__(func, types, args, kwargs or {})


_TORCH_IN_VISIBLE = (
    "`visible` calls {name} (torch.{name}, or the tensor method .{name}): inside the Triton kernel rows and cols "
    "are Triton tiles, which torch functions cannot take, so the kernel would fail there, whether or not it runs "
    "in Triton here. Write it with comparisons (<, <=), arithmetic (+, -, abs) and & only."
)


def _torch_in_visible(fn: Callable[..., Any]) -> Feedback | None:
    """The hint for a ``visible`` that applies a torch function to its tiles (``None`` when it uses operators only)."""
    rows, cols, window = _visible_cases()[0]
    try:
        fn(rows.as_subclass(_TileOnly), cols.as_subclass(_TileOnly), window)
    except _TorchCall as err:
        return wrong(_TORCH_IN_VISIBLE.format(name=err.args[0]))
    except Exception:  # any other error has been named on plain tensors already
        return None
    return None


def _first_key_one(fn: Callable[..., Any], q0: int, window: int) -> Feedback | None:
    got, fb = run_reader_code(fn, q0, window)
    if fb is not None:
        return fb
    if isinstance(got, tuple):
        return wrong(f"`first_key` returned a tuple of {len(got)} items: return one whole number, a key position.")
    try:
        value = as_index(_first_key_value(got))
    except Exception:
        return wrong(f"`first_key` should return one whole number (an int), a key position, got {describe(got)}.")
    expected = reference_first_key(q0, window)
    if _first_key_same(value, expected) or _first_key_rounded(value, expected):
        return None
    values = _first_key_values(fn)
    for m in FIRST_KEY_MISTAKES:  # a mistake is named only when it explains every block, not this one alone
        if values is not None and all(_first_key_same(x, m.compute(q, w)) for x, (q, w) in zip(values, _first_key_cases())):
            return wrong(m.hint)
    if values is not None and all(x % w == 0 for x, (_, w) in zip(values, _first_key_cases())):
        return wrong(_ROUNDED_TO_WINDOW)
    return wrong(f"for q_start = {q0} and window = {window} your first key is not the first key the block's "
                 "first row sees; that row, q_start, sees itself and the window - 1 keys before it: count them again.")


_ROUNDED_TO_WINDOW = (
    "your first keys are all multiples of window: rounding to the window does not match the kernel's walk, "
    "which goes by key blocks of BLOCK_K keys and rounds down to its own block. Return the first key the "
    "block's first row sees, unrounded: `first_key` need not know any block size."
)


def _first_key_values(fn: Callable[..., Any]) -> list[int] | None:
    """``fn``'s first key on every block of :func:`_first_key_cases` (``None`` if one is not a whole number)."""
    values = []
    for q0, window in _first_key_cases():
        got, fb = run_reader_code(fn, q0, window)
        try:
            values.append(as_index(_first_key_value(got)) if fb is None else None)
        except Exception:
            return None
        if values[-1] is None:
            return None
    return values


#: The smallest key block of :data:`WINDOW_RUNS`: a ``first_key`` rounded down within such a block
#: gives the kernel the same walk, since the kernel rounds down to its key block anyway.
_SMALLEST_BLOCK_K = min(run[4] for run in WINDOW_RUNS)


def _first_key_rounded(value: Any, expected: int) -> bool:
    """Whether ``value`` is ``expected`` rounded down to the start of its key block (clamped at 0); a
    value merely inside that block (one key early, say) is not accepted: it is off by one, and only
    this block size hides it."""
    try:
        got, want = _clamped(int(value)), _clamped(int(expected))
    except Exception:
        return False
    return got == want // _SMALLEST_BLOCK_K * _SMALLEST_BLOCK_K


_ROUNDED_NOTE = (" Your `first_key` rounds the first key down (or clamps it at 0) itself: that gives the same walk, "
                 "since the kernel rounds down to its key block anyway, but `first_key` need not know the block "
                 "size: q_start - window + 1 is enough.")


def _solution_visible(rows: Tensor, cols: Tensor, window: int) -> Tensor:
    return (cols <= rows) & (rows - cols < window)


def _solution_first_key(q_start: int, window: int) -> int:
    return q_start - window + 1


@exercise(solution=(_solution_visible, _solution_first_key), kind="functions",
          tables=(MistakeTable(VISIBLE_MISTAKES, _visible_cases, reference_visible),
                  MistakeTable(FIRST_KEY_MISTAKES, _first_key_cases, reference_first_key, same=_first_key_same)),
          not_generic={"float16": "the answers are a boolean tile and a key position",
                       "a non-contiguous copy": "`visible` may use operators only, as inside a Triton kernel: a copy "
                                                "made with torch.stack is a torch function, refused there"})
def check_sliding_window(visible: Callable[..., Any], first_key: Callable[[int, int], Any]) -> Feedback:
    """Check a sliding window added to a fused kernel: ``visible(rows, cols, window)`` (the mask inside a
    tile) and ``first_key(q_start, window)`` (where a query block's walk starts, so the key blocks before
    the window are skipped).

    Both are checked directly on the tiles and blocks of :data:`WINDOW_RUNS`; then the kernel runs with them
    and must equal SDPA with ``attnlib.causal_mask(S, window=W)``: in Triton (compiled on CUDA, or in
    Triton's interpreter when ``TRITON_INTERPRET=1``), else in :func:`windowed_tiled_attention`, the same
    loop in PyTorch.
    """
    from attnlib import causal_mask
    import torch.nn.functional as F

    problem = _ignores_window(visible, first_key)
    if problem is not None:
        return problem
    for rows, cols, window in _visible_cases():
        problem = _visible_one(visible, rows, cols, window)
        if problem is not None:
            return _with_first_key(problem, first_key)
    problem = _torch_in_visible(visible)
    if problem is not None:
        return problem
    for q0, window in _first_key_cases():
        problem = _first_key_one(first_key, q0, window)
        if problem is not None:
            return problem
    rounded = any(not _first_key_same(as_index(_first_key_value(first_key(q0, window))), reference_first_key(q0, window))
                  for q0, window in _first_key_cases())
    mode = triton_mode()
    lambda_note = ""
    if mode is not None and getattr(visible, "__name__", "") == "<lambda>":
        mode, lambda_note = None, (" Triton cannot compile a lambda: write `visible` with def to run it inside the "
                                   "Triton kernel.")
    computed = causal_tiles = 0
    for run, (S, D, W, bq, bk) in enumerate(WINDOW_RUNS):
        gen = torch.Generator().manual_seed(90 + run)
        q, k, v = (torch.randn(2, S, D, generator=gen) for _ in range(3))  # [BH, S, D]
        starts = [_clamped(as_index(_first_key_value(first_key(q0, W)))) // bk * bk for q0 in range(0, S, bq)]
        if mode is None:
            out, tiles = windowed_tiled_attention(q, k, v, visible, first_key, W, bq, bk)
        else:
            try:
                out, tiles = triton_windowed_attention(q, k, v, visible, starts, W, bq, bk)
            except Exception as err:  # the reader's visible may use what Triton cannot compile
                return wrong(f"Triton could not run your `visible` inside the kernel ({type(err).__name__}: "
                             f"{str(err).splitlines()[0][:160] if str(err) else 'no message'}): write it with "
                             "comparisons (<, <=), arithmetic (+, -, abs) and & only, no torch functions.")
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(S, window=W))
        if not close(out, ref, atol=1e-5, rtol=1e-5):
            return wrong("the kernel's output differs from SDPA with the same sliding-window mask, although "
                         "`visible` and `first_key` gave the right answers on their own: check that both use the "
                         "arguments they are given, not globals of your notebook.")
        computed += sum(tiles)
        causal_tiles += sum(math.ceil(min(S, q0 + bq) / bk) for q0 in range(0, S, bq))
    import importlib.util

    off = ("Triton is not installed here" if importlib.util.find_spec("triton") is None else
           "Triton's interpreter is off here: TRITON_INTERPRET=1 must be set before Triton is first imported")
    where = {"cuda": "compiled by Triton on your GPU", "interpreter": "in Triton's interpreter on your CPU",
             None: "in the same tiled loop written in PyTorch" + ("" if lambda_note else f" ({off})")}[mode]
    return correct(f"the windowed kernel ran {where} and equals SDPA with the same mask. It computed {computed} "
                   f"tiles where a causal kernel computes {causal_tiles}: a window makes the work per query block "
                   "constant, so the cost grows like S, not S^2." + lambda_note + (_ROUNDED_NOTE if rounded else ""))


#: Where the checker probes whether ``visible`` and ``first_key`` use their ``window`` argument: a tile of
#: 1,024 queries and keys (wider than the notebook's global ``W = 256``), a block far from the start, and two
#: windows to compare.
_PROBE_S, _PROBE_Q0, _PROBE_WINDOWS = 1024, 5000, (10, 100)

_IGNORES_WINDOW = (
    "your `{name}` gives the same answer for window = {w1} and window = {w2}, that of a window of {fixed} keys: "
    "it ignores its `window` argument (does it read a global, such as the W = 256 the FlexAttention cell sets?). "
    "Use the `window` it is given: the checker, like the kernel, passes different windows."
)


def _ignores_window(visible: Callable[..., Any], first_key: Callable[[int, int], Any]) -> Feedback | None:
    """The hint for a ``visible`` or ``first_key`` that answers as a sliding window of one fixed size (a global
    ``W``, say) whatever ``window`` it is given; ``None`` otherwise. The causal mask alone, a ``visible`` that
    is True everywhere and a ``first_key`` of 0 or ``q_start`` keep their own hints from the mistake tables."""
    w1, w2 = _PROBE_WINDOWS
    rows, cols = torch.arange(_PROBE_S)[:, None], torch.arange(_PROBE_S)[None, :]
    try:
        a, b = visible(rows, cols, w1), visible(rows, cols, w2)
        if isinstance(a, Tensor) and isinstance(b, Tensor) and a.dtype == b.dtype == torch.bool \
                and a.shape == b.shape == (_PROBE_S, _PROBE_S) and torch.equal(a, b):
            fixed = int(a[-1].sum())  # the keys the last query sees
            if 0 < fixed < _PROBE_S and fixed not in (w1, w2) and torch.equal(a, reference_visible(rows, cols, fixed)):
                return wrong(_IGNORES_WINDOW.format(name="visible", w1=w1, w2=w2, fixed=fixed))
    except Exception:  # crashes and odd answers are named by the checks that follow
        pass
    try:
        x, y = (as_index(_first_key_value(first_key(_PROBE_Q0, w))) for w in (w1, w2))
        fixed = _PROBE_Q0 - x + 1
        if x == y and 1 < fixed <= _PROBE_Q0 and fixed not in (w1, w2):
            return wrong(_IGNORES_WINDOW.format(name="first_key", w1=w1, w2=w2, fixed=fixed))
    except Exception:
        pass
    return None


def _first_key_value(got: Any) -> Any:
    """A one-element integer tensor as an int (other values unchanged, for :func:`as_index` to judge)."""
    if isinstance(got, Tensor) and got.numel() == 1 and not got.is_floating_point() and got.dtype != torch.bool:
        return int(got.item())
    return got


# ---- the causal tile schedule's traffic, by block size ---------------------------------------------

def causal_traffic_lines(S: int = 1024, d: int = 64, blocks: tuple[int, ...] = (64, 128, 256, 512)) -> list[str]:
    """One line per block size: a fused causal kernel's HBM traffic for one head in FlashAttention-2's
    order (:func:`fused_forward_io`), against standard attention's (:func:`standard_attention_io`), and
    the FLOPs of the tiles it computes (masked parts included) per float16 byte moved.

    >>> causal_traffic_lines(blocks=(128,))[2].split()[:3]
    ['128', '36', '0.72']
    """
    standard = standard_attention_io(S, d)
    lines = [f"standard attention (no mask pass): {standard / 1e6:.2f} M numbers per head",
             f"{'block':>5}  {'tiles':>5}  {'fused, M numbers':>16}  {'vs standard':>11}  {'FLOP per byte':>13}"]
    for block in blocks:
        n = math.ceil(S / block)
        sizes = [min(block, S - i * block) for i in range(n)]
        tiles = n * (n + 1) // 2
        flops = sum(4 * sizes[i] * sizes[j] * d for i in range(n) for j in range(i + 1))  # QK^T and PV, computed tiles
        fused = fused_forward_io(S, d, block, causal=True)
        lines.append(f"{block:>5}  {tiles:>5}  {fused / 1e6:>16.2f}  {f'{standard / fused:.1f}x less':>11}  "
                     f"{flops / (2 * fused):>13.0f}")
    return lines


# ---- SDPA's order of priority ----------------------------------------------------------------------

def cudnn_first(capability: tuple[int, int], cudnn_version: int, cuda_version: str | None,
                env: dict[str, str]) -> bool:
    """Whether SDPA (torch 2.10 to 2.13) moves cuDNN to the front of its CUDA priority order.

    The rule of ``check_prefer_cudnn_attention()`` in ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``:
    a GPU of compute capability 9.x or 10.x (with a build for CUDA 12, only 9.0, 10.0 and 10.3), a cuDNN
    loaded at run time newer than 9.15.0 (``torch.backends.cudnn.version() > 91500``), and no
    ``TORCH_CUDNN_SDPA_DEPRIORITIZED=1`` (``TORCH_CUDNN_SDPA_PREFERRED=0`` in the releases that read that name).

    >>> cudnn_first((9, 0), 92000, "13.0", {}), cudnn_first((8, 0), 92000, "13.0", {})
    (True, False)
    >>> cudnn_first((9, 0), 91002, "12.8", {}), cudnn_first((10, 0), 92000, "13.0", {"TORCH_CUDNN_SDPA_DEPRIORITIZED": "1"})
    (False, False)
    """
    if env.get("TORCH_CUDNN_SDPA_DEPRIORITIZED") == "1" or env.get("TORCH_CUDNN_SDPA_PREFERRED") == "0":
        return False
    major, minor = capability
    cuda_major = int(cuda_version.split(".")[0]) if cuda_version else 0
    if cuda_major < 13 and minor not in (0, 3):
        return False
    return cudnn_version > 91500 and major in (9, 10)


def sdpa_priority_line() -> tuple[str, list[str], str | None]:
    """SDPA's order of priority on this machine: a sentence that says which machine and gives the order,
    the order, and the backend :func:`cudnn_first` expects first (``None`` off an NVIDIA GPU, or with a
    torch outside 2.10 to 2.13, whose rule differs).

    On a CUDA GPU the order is read after one CUDA call, since the first call is what may put cuDNN first.
    """
    import os

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    if torch.cuda.is_available():
        x = torch.zeros(1, 1, 8, 64, device="cuda", dtype=torch.float16)  # [B, H, S, D_k]
        F.scaled_dot_product_attention(x, x, x)  # the first CUDA call settles the order
    order = [SDPBackend(i).name for i in torch._C._get_sdp_priority_order()]
    expected = None
    if not torch.cuda.is_available():
        where = "This machine has no CUDA GPU, so SDPA keeps its default order"
    elif torch.version.hip is not None:
        where = f"On this ROCm GPU ({torch.cuda.get_device_name()}), SDPA's order"
    else:
        cap = torch.cuda.get_device_capability()
        cudnn = torch.backends.cudnn.version() or 0
        where = (f"On this GPU ({torch.cuda.get_device_name()}, compute capability {cap[0]}.{cap[1]}, cuDNN {cudnn}, "
                 f"CUDA {torch.version.cuda}), after its first CUDA call, SDPA's order")
        first = cudnn_first(cap, cudnn, torch.version.cuda, dict(os.environ))
        if first:
            where += " (cuDNN moved to the front)"
        version = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
        if (2, 10) <= version <= (2, 13):
            expected = "CUDNN_ATTENTION" if first else "FLASH_ATTENTION"
    return f"{where}: {', '.join(order)}", order, expected


# ---- diagram: FlashAttention-3's ping-pong ----------------------------------------------------------

@diagram
def ping_pong_diagram() -> Diagram:
    """Taking turns against FlashAttention-3's ping-pong, on an H100 at d = 128, where a block's
    exponentials take half as long as its two matmuls (the serial cap's table)."""
    u, x0 = 26, 62  # px per unit of time: the matmuls of one block take 2 units, its exponentials 1
    d = Diagram(
        "ch09_ping_pong", 380, 352, title="Taking turns against ping-pong scheduling",
        alt=("Two timelines for an H100 at d = 128, where a block's exponentials take half as long as its two "
             "matmuls. Above, one warpgroup takes turns: matmuls, then exponentials, then matmuls, so the tensor "
             "cores idle during every exponential and are busy two thirds of the time. Below, FlashAttention-3's "
             "ping-pong: two warpgroups alternate, and while one computes its exponentials on the special-function "
             "units the other runs its matmuls, so the tensor cores are busy all the time."))
    d.text(190, 26, "Who uses the tensor cores when", size=16, weight="bold")
    d.text(190, 46, "H100, d = 128: exponentials take half as long as matmuls", size=12, color=MUTED)

    def block(x: float, y: float, units: int, what: str) -> None:
        colour = "blue" if what == "matmul" else "orange"
        d.rect(x0 + x * u, y, units * u, 26, fill=colour, tint=True, stroke=colour, width=2, rx=2)
        d.text(x0 + (x + units / 2) * u, y + 18, "MM" if what == "matmul" else "exp", size=12)

    d.text(20, 78, "taking turns (one warpgroup)", size=13, anchor="start", color=MUTED)
    for k in range(4):  # matmuls 2 units, then exponentials 1 unit
        block(3 * k, 88, 2, "matmul")
        block(3 * k + 2, 88, 1, "exp")
    d.text(x0 - 8, 106, "WG", size=13, anchor="end")
    d.text(x0 - 8, 142, "TC", size=13, anchor="end")
    for k in range(4):
        d.rect(x0 + 3 * k * u, 126, 2 * u, 24, fill="green", tint=True, stroke="green", width=1.5, rx=2)
    d.text(190, 170, "tensor cores busy 2/3 of the time", size=13, color=MUTED)

    d.text(20, 200, "ping-pong (two warpgroups)", size=13, anchor="start", color=MUTED)
    for k in range(3):  # warpgroup 1 starts at 0, warpgroup 2 at 2: each one's exponentials hide under the other's matmuls
        block(4 * k, 210, 2, "matmul")
        block(4 * k + 2, 210, 1, "exp")
        block(4 * k + 2, 242, 2, "matmul")
        if k < 2:
            block(4 * k + 4, 242, 1, "exp")
    d.text(x0 - 8, 228, "WG 1", size=13, anchor="end")
    d.text(x0 - 8, 260, "WG 2", size=13, anchor="end")
    d.text(x0 - 8, 292, "TC", size=13, anchor="end")
    d.rect(x0, 276, 12 * u, 24, fill="green", tint=True, stroke="green", width=1.5, rx=2)
    d.text(190, 322, "MM: matmuls, on the tensor cores (TC)", size=12, color=MUTED)
    d.text(190, 340, "exp: exponentials, on the special-function units", size=12, color=MUTED)
    return d


# ---- diagram: a sliding-window block mask (section 9.8) ---------------------------------------------

#: The block mask of section 9.8: S queries and keys, a window of FLEX_WINDOW keys, square blocks.
FLEX_S, FLEX_WINDOW, FLEX_BLOCK = 1024, 256, 128


def window_tile_kinds(S: int, window: int, block: int) -> list[list[str]]:
    """Each tile's kind under a causal sliding window (query blocks down, key blocks across): ``"full"``
    (every score kept, no mask inside), ``"partial"`` (computed, masked inside) or ``"skipped"`` (never loaded),
    as FlexAttention's ``create_block_mask`` sorts them.

    >>> window_tile_kinds(4, 2, 2)
    [['partial', 'skipped'], ['partial', 'partial']]
    """
    if S % block:
        raise ValueError(f"S = {S} is not a multiple of block = {block}; expected whole tiles")
    pos = torch.arange(S)
    seen = reference_visible(pos[:, None], pos[None, :], window)  # [S, S] True where the query sees the key
    n = S // block
    tiles = seen.view(n, block, n, block)  # [query block, row, key block, column]
    kept, all_kept = tiles.any(dim=(1, 3)), tiles.all(dim=(1, 3))  # [n, n] each
    return [["full" if all_kept[i, j] else "partial" if kept[i, j] else "skipped" for j in range(n)]
            for i in range(n)]


@diagram
def window_block_mask_diagram() -> Diagram:
    """Which tiles a sliding-window kernel computes in full, computes with a mask inside, or skips."""
    S, W, B = FLEX_S, FLEX_WINDOW, FLEX_BLOCK
    kinds = window_tile_kinds(S, W, B)
    n = len(kinds)
    count = {k: sum(row.count(k) for row in kinds) for k in ("full", "partial", "skipped")}
    style = {"full": ("green", "F"), "partial": ("orange", "M"), "skipped": ("none", "")}
    d = Diagram(
        "ch09_window_block_mask", 380, 516, title="A sliding-window block mask",
        alt=(f"An {n} by {n} grid of tiles for S = {S} with {B}-blocks: query blocks Q1 to Q{n} down, key blocks "
             f"K1 to K{n} across, under a sliding window where each query sees itself and the {W - 1} keys before "
             f"it. In every row the diagonal tile is computed with a mask inside (M, orange), since it holds the "
             f"future of some of its queries. From the second row on, the tile just left of the diagonal is "
             f"computed in full (F, green), and from the third row on the tile left of that is masked inside too, "
             f"since some of its keys have left the window for some of its queries. Every other tile is skipped and "
             f"never loaded: {count['full'] + count['partial']} of the {n * n} tiles are computed, {count['full']} "
             f"in full and {count['partial']} with a mask inside."))
    d.text(190, 26, "A sliding-window block mask", size=16, weight="bold")
    d.text(190, 46, f"S = {S}, window {W} keys, {B}-blocks", size=13, color=MUTED)
    cell, x0, y0 = 32, 84, 96
    d.text(x0 + n * cell / 2, 70, "key blocks", size=13)
    d.grid(x0, y0, [[style[k][0] for k in row] for row in kinds], cell=cell, size=13,
           labels=[[style[k][1] for k in row] for row in kinds],
           row_labels=[f"Q{i + 1}" for i in range(n)], col_labels=[f"K{j + 1}" for j in range(n)])
    d.text(20, y0 + n * cell + 24, "rows: query blocks", size=13, anchor="start", color=MUTED)
    legend = (("full", f"F: computed in full, no mask ({count['full']})"),
              ("partial", f"M: computed, masked inside ({count['partial']})"),
              ("skipped", f"blank: skipped, never loaded ({count['skipped']})"))
    for k, (kind, text) in enumerate(legend):
        y = y0 + n * cell + 44 + 28 * k
        colour = style[kind][0]
        d.rect(20, y, 20, 20, fill=colour, tint=colour != "none", stroke="#1A1A1A", rx=0, width=1)
        d.text(50, y + 15, text, size=13, anchor="start")
    d.text(190, y0 + n * cell + 148, f"{count['full'] + count['partial']} of {n * n} tiles computed", size=14,
           weight="bold")
    return d


# ---- diagram: merging partial results through their logsumexps ----------------------------------

@diagram
def lse_merge_diagram() -> Diagram:
    """Section 9.9's merge: two partial results over disjoint keys, each an output normalised over its own
    keys and the logsumexp of its scores, combined with weights exp(lse_i - lse). The split is that of
    exercise 9.3's first case (:data:`MERGE_CASES`)."""
    S_k, split = MERGE_CASES[0][2], MERGE_CASES[0][3]
    a_keys, b_keys = f"keys 0..{split - 1}", f"keys {split}..{S_k - 1}"
    d = Diagram(
        "ch09_lse_merge", 358, 490, title="Merging two partial results through their logsumexps",
        alt=(f"One query's keys split into two parts, {a_keys} and {b_keys}. Each part gives an output normalised "
             "over its own keys, O_a or O_b, and the logsumexp of its scores, lse_a or lse_b, the log of its share "
             "of the softmax denominator. The merge adds the shares, lse = log(e^lse_a + e^lse_b), computed as "
             "max + log(e^(lse_a \u2212 max) + e^(lse_b \u2212 max)) so that nothing overflows; each part's weight "
             "is its share of the whole, w_a = e^(lse_a \u2212 lse) and w_b = e^(lse_b \u2212 lse), which sum to 1; "
             "and O = w_a O_a + w_b O_b equals attention over all the keys."))
    d.text(179, 28, "Merging two partial results", size=16, weight="bold")
    d.text(179, 50, f"one query, {S_k} keys in two parts", size=14, color=MUTED)
    d.box(10, 66, 164, 74, "part a", sub=a_keys, color="sky")
    d.box(184, 66, 164, 74, "part b", sub=b_keys, color="orange")
    d.text(92, 164, "O_{a}, lse_{a}", size=15)
    d.text(266, 164, "O_{b}, lse_{b}", size=15)
    d.arrow(92, 174, 150, 214)
    d.arrow(266, 174, 208, 214)
    d.rect(10, 218, 338, 204, fill="green", tint=True, stroke="green", width=2)
    rows = ("lse = log(e^{lse_a} + e^{lse_b})",
            "w_{a} = e^{lse_a \u2212 lse}",
            "w_{b} = e^{lse_b \u2212 lse}",
            "w_{a} + w_{b} = 1",
            "O = w_{a} O_{a} + w_{b} O_{b}")
    d.text(22, 242, "merge, per query row:", size=14, anchor="start", color=MUTED)
    for k, row in enumerate(rows):
        d.text(22, 270 + 28 * k, row, size=15, anchor="start")
    d.text(22, 410, "(lse from the max first: no overflow)", size=13, anchor="start", color=MUTED)
    d.text(179, 450, "O and lse equal attention over", size=14)
    d.text(179, 470, f"all {S_k} keys, whatever the split", size=14)
    return d


# ---- diagram: FlashAttention-4's lazy rescaling ------------------------------------------------------

#: The lazy-rescaling diagram: one query row's running maximum after each of its key blocks (made up,
#: growing at every block, as in the "climbing" scores of section 9.7's cell), and the threshold tau, the
#: same as the cell's ``lazy_online_softmax(..., threshold=8.0)``.
LAZY_MAXIMA: tuple[int, ...] = (3, 5, 6, 9, 10, 12, 13, 17, 18, 21)
LAZY_THRESHOLD = 8


def lazy_reference_points(maxima: tuple[int, ...] = LAZY_MAXIMA, threshold: float = LAZY_THRESHOLD) -> list[float]:
    """The reference point ``m`` after each block, moved (as in :func:`lazy_online_softmax`) only when the
    block's maximum exceeds ``m + threshold``.

    >>> lazy_reference_points((3, 5, 12, 13), 8)
    [3, 3, 12, 12]
    """
    refs: list[float] = []
    for x in maxima:
        refs.append(x if not refs or x > refs[-1] + threshold else refs[-1])
    return refs


@diagram
def lazy_rescale_diagram() -> Diagram:
    """FlashAttention-4's lazy rescaling on one query row: the running maximum grows at every block, the
    reference point ``m`` moves (a rescale) only when the maximum passes ``m + tau``."""
    maxima, tau = LAZY_MAXIMA, LAZY_THRESHOLD
    refs = lazy_reference_points(maxima, tau)
    moves = [k for k in range(1, len(maxima)) if refs[k] != refs[k - 1]]
    exact = sum(maxima[k] > maxima[k - 1] for k in range(1, len(maxima)))
    n = len(maxima)
    x0, step, base, unit = 44, 30, 330, 8  # block k at x0 + k * step; score v at base - unit * v

    def X(k: float) -> float:
        return x0 + k * step

    def Y(v: float) -> float:
        return base - unit * v

    grown = ", ".join(f"at block {k + 1} the maximum, {maxima[k]}, passes {refs[k - 1]} + {tau} = "
                      f"{refs[k - 1] + tau}, and m moves up to {refs[k]}" for k in moves)
    d = Diagram(
        "ch09_lazy_rescale", 380, 450, title="Rescale only when the maximum jumps",
        alt=(f"One query row over {n} key blocks, with a threshold tau = {tau}. Blue squares: the running maximum "
             f"of the row's scores after each block, growing at every block from {maxima[0]} to {maxima[-1]}. "
             f"Orange: the reference point m that the sums are kept relative to, with a shaded band from m up to "
             f"m + tau, where every exponential exp(s - m) stays at most exp(tau). m starts at {refs[0]} and stays "
             f"while the maximum stays inside the band; {grown} (each a rescale, a vermillion arrow). The exact "
             f"online softmax rescales {exact} times, at every block where the maximum grows; the lazy one "
             f"{len(moves)} times, with the same output."))
    d.text(190, 26, "Rescale only when the maximum jumps", size=16, weight="bold")
    d.text(190, 46, f"one query row, {n} key blocks, \u03c4 = {tau}", size=13, color=MUTED)
    # the band m .. m + tau, one rectangle per run of blocks with the same m
    starts = [0, *moves, n]
    for a, b in zip(starts, starts[1:]):
        m = refs[a]
        left, width = X(a + 0.5) + 2, (b - a) * step - 4
        d.rect(left, Y(m + tau), width, unit * tau, fill="orange", tint=True, stroke="orange", width=1, rx=0)
        d.line(left, Y(m), left + width, Y(m), color="orange", width=3)
        d.line(left, Y(m + tau), left + width, Y(m + tau), color="orange", width=1.5, dash=True)
    # axes
    d.line(X(0.5), Y(0), X(n + 0.5), Y(0), color=INK, width=1)
    d.line(X(0.5), Y(0), X(0.5), Y(31), color=INK, width=1)
    for v in (0, 10, 20, 30):
        d.text(X(0.5) - 6, Y(v) + 4, str(v), size=12, anchor="end", color=MUTED)
    for k in range(n):
        d.text(X(k + 1), Y(0) + 18, str(k + 1), size=12, color=MUTED)
    d.text(X((n + 1) / 2), Y(0) + 38, "key block", size=13, color=MUTED)
    # the running maximum
    for k in range(n):
        if k:
            d.line(X(k), Y(maxima[k - 1]), X(k + 1), Y(maxima[k]), color="blue", width=1.5)
        d.rect(X(k + 1) - 4, Y(maxima[k]) - 4, 8, 8, fill="blue", stroke="blue", width=1, rx=1)
    for k in moves:
        d.arrow(X(k + 1) - 9, Y(refs[k - 1]) - 2, X(k + 1) - 9, Y(refs[k]) + 6, color="vermillion")
        d.text(X(k + 1) - 14, Y(refs[k - 1] + 2), "rescale", size=12, anchor="end", color="vermillion")
    ly = 392
    d.rect(24, ly - 9, 8, 8, fill="blue", stroke="blue", width=1, rx=1)
    d.text(40, ly, "running maximum of the row's scores", size=12, anchor="start")
    d.line(20, ly + 16, 36, ly + 16, color="orange", width=3)
    d.text(40, ly + 20, "m, kept stale; band up to m + \u03c4", size=12, anchor="start")
    d.text(190, ly + 44, f"exact online softmax: {exact} rescales; lazy: {len(moves)}", size=13, weight="bold")
    return d


# ---- diagram: split-K against split-Q inside one thread block (section 9.3) -------------------------

#: Warps per thread block in section 9.3's comparison of split-K (FlashAttention-1) and split-Q (FlashAttention-2).
SPLIT_WARPS = 4


@diagram
def split_k_split_q_diagram() -> Diagram:
    """How one thread block splits its tile (a query block against a key/value block) between its warps:
    split-K (FlashAttention-1), where the warps own column slices of K and V and must add their partial
    outputs through shared memory, against split-Q (FlashAttention-2), where they own row slices of Q."""
    n = SPLIT_WARPS
    colours = ("sky", "orange", "green", "purple")[:n]
    warps = [f"W{k + 1}" for k in range(n)]
    d = Diagram(
        "ch09_split_k_split_q", 380, 568, title="Split-K against split-Q",
        alt=(f"One thread block's tile, queries (rows) against keys and values (columns), split between its {n} "
             f"warps W1 to W{n} in two ways. Above, split-K (FlashAttention-1): each warp takes its own slice of the "
             "key/value columns against all the query rows and holds a partial output for every row; the warps add "
             "these up through shared memory, waiting for each other. Below, split-Q (FlashAttention-2): each warp "
             "takes its own slice of the query rows against the whole key/value block and writes its own output "
             "rows, with no exchange."))
    d.text(190, 26, f"One tile, {n} warps: two ways to split it", size=16, weight="bold")
    d.text(190, 46, "rows: the block's queries; columns: its keys and values", size=12, color=MUTED)
    x0, w, h = 40, 160, 112

    # split-K: column slices
    d.text(20, 80, "split-K (FlashAttention-1)", size=14, anchor="start", weight="bold")
    y0 = 94
    for k in range(n):
        d.rect(x0 + k * w / n, y0, w / n, h, fill=colours[k], tint=True, stroke=INK, rx=0, width=1)
        d.text(x0 + (k + 0.5) * w / n, y0 + h / 2 + 5, warps[k], size=13)
    for k, line in enumerate(("each warp: its own", "K/V columns, all", "the Q rows: a partial", "output for every row")):
        d.text(214, y0 + 22 + 22 * k, line, size=12, anchor="start")
    d.arrow(x0 + w / 2, y0 + h + 4, x0 + w / 2, y0 + h + 34)
    d.box(20, y0 + h + 38, 340, 54, f"shared memory: add the {n} partials", sub="the warps wait for each other",
          color="vermillion", size=14)

    # split-Q: row slices
    d.text(20, 334, "split-Q (FlashAttention-2)", size=14, anchor="start", weight="bold")
    y1 = 348
    for k in range(n):
        d.rect(x0, y1 + k * h / n, w, h / n, fill=colours[k], tint=True, stroke=INK, rx=0, width=1)
        d.text(x0 + w / 2, y1 + (k + 0.5) * h / n + 5, warps[k], size=13)
    for k, line in enumerate(("each warp: its own", "Q rows, the whole", "K/V block")):
        d.text(214, y1 + 22 + 22 * k, line, size=12, anchor="start")
    d.arrow(x0 + w / 2, y1 + h + 4, x0 + w / 2, y1 + h + 34)
    d.box(20, y1 + h + 38, 340, 54, "each warp writes its own output rows", sub="no exchange, no waiting",
          color="green", size=14)
    return d


# ---- diagram: how SDPA picks a backend (section 9.10) ------------------------------------------------

#: The torch version whose SDPA rules section 9.10 states, and those rules on CUDA: the default order of the
#: backends, what the flash backend needs (compute capabilities, the widest head), and the cuDNN version
#: that must be exceeded for cuDNN to move to the front (:func:`cudnn_first`).
SDPA_TORCH = "2.13"
SDPA_ORDER = ("flash", "memory-efficient", "math", "cuDNN")
FLASH_CAPABILITIES = ((8, 0), (12, 1))
FLASH_MAX_HEAD = 256
CUDNN_FRONT_AFTER = 91500


@diagram
def sdpa_backends_diagram() -> Diagram:
    """How ``F.scaled_dot_product_attention`` picks a backend on CUDA in torch 2.13: the backends in their
    default order of priority, what each refuses or takes, and when cuDNN moves to the front."""
    lo, hi = FLASH_CAPABILITIES
    cc = f"{lo[0]}.{lo[1]}\u2013{hi[0]}.{hi[1]}"
    major, minor = divmod(CUDNN_FRONT_AFTER // 100, 100)
    cudnn = f"{major}.{minor}.{CUDNN_FRONT_AFTER % 100}"
    order = ", ".join(SDPA_ORDER)
    d = Diagram(
        "ch09_sdpa_backends", 380, 610, title=f"How SDPA picks a backend (CUDA, torch {SDPA_TORCH})",
        alt=(f"How SDPA picks a backend on a CUDA GPU in torch {SDPA_TORCH}: it tries them in order, by default "
             f"{order}, and the first that accepts the call runs. Flash refuses a dtype other than float16 and "
             f"bfloat16, an explicit attn_mask, is_causal with S_q \u2260 S_k, head widths that differ or exceed "
             f"{FLASH_MAX_HEAD}, and compute capability outside {cc}. Memory-efficient also takes masks and float32. "
             f"Math materialises the weights. cuDNN moves to the front on compute capability 9.x or 10.x (CUDA 12 "
             f"builds: 9.0, 10.0, 10.3) with a cuDNN newer than {cudnn}, unless TORCH_CUDNN_SDPA_DEPRIORITIZED=1."))
    d.text(190, 26, "How SDPA picks a backend", size=16, weight="bold")
    d.text(190, 46, f"on a CUDA GPU, torch {SDPA_TORCH}", size=13, color=MUTED)
    d.box(20, 60, 340, 40, "F.scaled_dot_product_attention(...)", color="grey", size=14)
    d.text(190, 122, "tries in this order; the first that accepts runs", size=12, color=MUTED)

    def stage(y: float, height: float, head: str, lines: tuple[str, ...], colour: str) -> None:
        d.rect(20, y, 340, height, fill=colour, tint=True, stroke=colour, width=2)
        d.text(32, y + 22, head, size=14, anchor="start", weight="bold")
        for k, line in enumerate(lines):
            d.text(32, y + 42 + 18 * k, line, size=12, anchor="start")

    def refused(y: float) -> None:
        d.arrow(190, y, 190, y + 24)
        d.text(200, y + 17, "if refused", size=12, anchor="start", color=MUTED)

    y = 132
    stage(y, 136, f"1. {SDPA_ORDER[0]} (FlashAttention-2 kernels)",
          ("refuses: a dtype other than float16/bfloat16;", "an explicit attn_mask (only is_causal);",
           "is_causal with S_q \u2260 S_k;", f"head widths that differ or exceed {FLASH_MAX_HEAD};",
           f"compute capability outside {cc}"), "blue")
    refused(y + 136)
    y += 164
    stage(y, 62, f"2. {SDPA_ORDER[1]}", ("also takes masks and float32",), "sky")
    refused(y + 62)
    y += 90
    stage(y, 62, f"3. {SDPA_ORDER[2]}", ("the reference; materialises the weights",), "green")
    refused(y + 62)
    y += 90
    stage(y, 118, f"4. {SDPA_ORDER[3]}, moved to the front when:",
          ("compute capability 9.x or 10.x (CUDA 12", "builds: 9.0, 10.0, 10.3 only), and", f"cuDNN newer than {cudnn}, and",
           "TORCH_CUDNN_SDPA_DEPRIORITIZED is not 1"), "orange")
    return d
