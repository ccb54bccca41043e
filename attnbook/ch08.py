"""Checkers, counts and figures for chapter 8, *What attention costs, and attention without the [S, S] matrix*.

* :func:`standard_attention_io`, :func:`fused_forward_io`: exact HBM traffic of a GPU kernel (chapter 9's
  traffic table and roofline; defined here, next to the tile schedule they count).
* :func:`causal_tile_counts`: the tiles and scores a causal tiled pass computes and masks.
* :func:`tile_frame`, :func:`tile_grid_html`: the frame of the tile-schedule slider, and its live redraw.
* :func:`steady_median_ms`: timings that load from other programs does not inflate (one thread, CPU time).
* :func:`time_projections_and_cores`: the chapter's timing of the projections against three
  attention cores over the sequence length (and the readable core's peak memory), printed.
* :func:`check_online_softmax_update`: one step of the online softmax (fold a tile of scores
  into the running max ``m``, running sum ``l`` and running output ``acc``).
* :func:`check_tile_weights`: recover one tile's weights from the scores and the logsumexp.

The checkers diagnose the usual mistakes: a running sum or output not rescaled by
``exp(m_old - m_new)``, the new tile exponentiated against the old maximum, NaN on the first tile
(``m = -inf``); a tile softmaxed on its own or divided by ``lse`` instead of ``exp(lse)``; and a right
answer returned in float16 or bfloat16 (:func:`attnbook.feedback.low_precision`) or cast down to
a narrower dtype than the inputs' (:func:`narrowed_dtype`, also used by chapter 9's merge checker).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from .feedback import (
    ATOL,
    HALF_TOL,
    Feedback,
    Mistake,
    MistakeTable,
    as_cpu_float64,
    low_precision,
    close,
    correct,
    describe,
    diagnose,
    exercise,
    call_reader,
    run_reader_code,
    wrong,
)
from .diagrams import INK, MUTED, Diagram, diagram
from .slider import Frame, Panel

__all__ = [
    "standard_attention_io",
    "fused_forward_io",
    "causal_tile_counts",
    "tile_frame",
    "TILE_FMT",
    "TILE_LEGEND",
    "steady_median_ms",
    "time_projections_and_cores",
    "time_exp_fresh_and_reused",
    "tile_grid_html",
    "reference_tile_weights",
    "check_tile_weights",
    "reference_online_update",
    "check_online_softmax_update",
    "narrowed_dtype",
]



def standard_attention_io(N: int, d: int) -> int:
    """Numbers read from and written to HBM by standard attention, per (batch, head).

    Algorithm 0 of Dao et al. (2022): read Q, K, write S (``2Nd + N^2``); read S, write P
    (``2N^2``); read P, V, write O (``N^2 + 2Nd``). Total ``4Nd + 4N^2``: Theta(Nd + N^2).
    A separate mask or scale pass adds ``2N^2`` each.
    """
    return 4 * N * d + 4 * N * N


def fused_forward_io(N: int, d: int, block_q: int, causal: bool = False) -> int:
    """HBM numbers of attnlib's Triton kernel (FlashAttention-2's loop order), per (batch, head).

    Each query block is read once, its output and logsumexp written once (``2Nd + N``); the keys
    and values it sees are read once per query block (``2d`` numbers per key row; with ``causal``
    only the rows up to the block's last query). Caches may serve some of those re-reads.
    """
    key_rows = sum(min(N, q0 + block_q) if causal else N for q0 in range(0, N, block_q))
    return 2 * N * d + N + 2 * d * key_rows


def steady_median_ms(fns: dict[str, Callable[[], Any]], *, repeats: int, warmup: int = 1,
                     device: torch.device | str = "cpu") -> dict[str, float]:
    """Median milliseconds of each callable, measured so that other programs on a CPU do not inflate them.

    On a CPU, torch runs on one thread for the measurement (the setting is restored afterwards) and
    each call is timed by that thread's CPU time (``time.thread_time``), which waiting for the cores
    does not add to; the callables take turns as in :func:`attnbook.measure.interleaved_median_ms`.
    On CUDA it is that function's wall time, synchronised. Print the results with the book's ``~``.
    """
    import time

    from .measure import interleaved_median_ms

    if torch.device(device).type != "cpu":
        return interleaved_median_ms(fns, repeats=repeats, warmup=warmup, device=device)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return interleaved_median_ms(fns, repeats=repeats, warmup=warmup, device=device, clock=time.thread_time)
    finally:
        torch.set_num_threads(threads)


def tensor_peaks_one_thread(fns: dict[str, Callable[[], Any]]) -> dict[str, int]:
    """:func:`attnbook.measure.peak_tensor_bytes` of each callable, counted with PyTorch on one thread.

    The count records the operations of the thread that calls it. On a CPU with several threads,
    ``attnlib.flash_attention`` without gradients hands each thread a share of the heads, and the
    tiles those threads make would not be counted; on one thread every tensor is, and the count is
    the same on every machine. The thread setting is restored afterwards.

    >>> tensor_peaks_one_thread({"double": lambda: torch.ones(256) * 2})  # two 1 KiB tensors
    {'double': 2048}
    """
    from .measure import peak_tensor_bytes

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: peak_tensor_bytes(fn) for name, fn in fns.items()}
    finally:
        torch.set_num_threads(threads)


def time_projections_and_cores(sizes: list[int], D: int, H: int, device: torch.device | str = "cpu"
                               ) -> tuple[float, dict[str, list[float]], list[int]]:
    """Time the four projections of a ``MultiHeadSelfAttention(D, H)`` and three attention cores at
    each sequence length of ``sizes`` (batch 1), and print the times.

    Returns ``(peak_gflops, times, core_mem)``: the speed of one ``[1024, 1024] @ [1024, 1024]``
    float32 matmul (GFLOP/s); for ``"projections"``, ``"attnlib core"``, ``"torch.softmax core"``
    and ``"SDPA core"`` the median seconds at each size; and the most bytes of tensors the readable
    core holds at once at each size (:func:`attnbook.measure.peak_tensor_bytes`, exact on every device). The callables of one size
    take turns (:func:`steady_median_ms`: medians of interleaved repeats, 7 up to S = 512 and 3
    above). The second-last line compares the growth from the fourth size to the last (S = 512 to
    2048 in the chapter); the last divides each time at the largest size by its FLOP line, the FLOPs
    divided by the matmul speed.
    """
    import torch.nn.functional as F

    import attnlib
    from attnlib import MultiHeadSelfAttention, split_heads

    from .measure import peak_tensor_bytes

    a_big = torch.randn(1024, 1024, device=device)
    peak_gflops = 2 * 1024**3 / steady_median_ms({"matmul": lambda: a_big @ a_big}, repeats=5, device=device)["matmul"] / 1e6
    print(f"one [1024, 1024] @ [1024, 1024] matmul, float32: ~{peak_gflops:.0f} GFLOP/s")
    mha = MultiHeadSelfAttention(D, H).to(device)
    # three implementations of softmax(q k^T / sqrt(D_k)) v, all materialising [1, H, S, S] or fused
    cores = {
        "attnlib core": lambda q, k, v: attnlib.scaled_dot_product_attention(q, k, v).output,
        "torch.softmax core": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D // H), dim=-1) @ v,
        "SDPA core": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    }
    times: dict[str, list[float]] = {name: [] for name in ("projections", *cores)}  # seconds, one entry per S
    core_mem: list[int] = []
    with torch.inference_mode():
        for S in sizes:
            x = torch.randn(1, S, D, device=device)
            q, k, v = (split_heads(layer(x), H) for layer in (mha.w_q, mha.w_k, mha.w_v))  # [1, H, S, D_k]
            fns = {
                "projections": lambda: [layer(x) for layer in (mha.w_q, mha.w_k, mha.w_v, mha.w_o)],
                **{name: (lambda f=f: f(q, k, v)) for name, f in cores.items()},
            }
            ms = steady_median_ms(fns, repeats=7 if S <= 512 else 3, warmup=1, device=device)
            for name in times:
                times[name].append(ms[name] / 1e3)
            core_mem.append(peak_tensor_bytes(fns["attnlib core"]))
    for i, S in enumerate(sizes):  # the memory counts are the chapter's section 8.2's to print
        print(f"S = {S:>4} ({S / D:.2f} D): "
              + ", ".join(f"{name} ~{t[i] * 1e3:.2f} ms" for name, t in times.items()))
    if len(sizes) > 3:
        print(f"growth from S = {sizes[3]} to {sizes[-1]}: projections "
              f"~{times['projections'][-1] / times['projections'][3]:.1f}x (FLOPs {sizes[-1] // sizes[3]}x), attnlib "
              f"core ~{times['attnlib core'][-1] / times['attnlib core'][3]:.1f}x (FLOPs {(sizes[-1] // sizes[3]) ** 2}x)")
    S = sizes[-1]
    # each FLOP line in seconds: the FLOPs at S divided by the matmul speed (the chart's dashed lines)
    line = {name: (8 * S * D**2 if name == "projections" else 4 * S**2 * D) / (peak_gflops * 1e9) for name in times}
    print(f"at S = {S}, measured time / FLOP line: "
          + ", ".join(f"{name} ~{t[-1] / line[name]:.1f}x" for name, t in times.items()))
    return peak_gflops, times, core_mem


def time_exp_fresh_and_reused(H: int, sizes: Sequence[int]) -> dict[int, dict[str, float]]:
    """Time one elementwise pass over ``[H, S, S]`` float32 scores, three ways, on one CPU thread.

    ``"copy"`` copies the scores into a tensor made once before the timing; ``"exp, reused"`` writes
    their exponentials into that tensor (``torch.exp(x, out=y)``); ``"exp, fresh"`` is
    ``torch.exp(x)``, which allocates its result at every call, as each step of the readable core
    does. Prints one line per size and returns the medians in milliseconds per size and name.
    """
    out: dict[int, dict[str, float]] = {}
    for S in sizes:
        x = torch.randn(H, S, S)
        y = torch.empty_like(x).fill_(0.0)  # every page of y touched once, before the timing
        out[S] = steady_median_ms({
            "copy": lambda: y.copy_(x),
            "exp, reused": lambda: torch.exp(x, out=y),
            "exp, fresh": lambda: torch.exp(x),
        }, repeats=5)
        print(f"[{H}, {S}, {S}] float32 ({x.numel() * 4 / 2**20:.0f} MiB): "
              + ", ".join(f"{name} ~{ms:.1f} ms" for name, ms in out[S].items()))
    return out


def causal_tile_counts(S: int, block_q: int, block_k: int) -> dict[str, int]:
    """What a causal tiled pass over ``S`` queries and ``S`` keys computes, per (batch, head).

    Query block ``rows`` computes key block ``cols`` when some query of it sees a key of it
    (``cols.start <= rows.stop - 1``); such a tile is masked inside when it also holds a key in
    some query's future (``cols.stop - 1 > rows.start``), as in :func:`attnlib.flash_attention`.

    Returns:
        ``tiles`` (all of them), ``computed``, ``masked_tiles`` (computed and masked inside),
        ``scores`` (scores computed, masked ones included) and ``masked_scores`` (computed, then
        hidden by the mask).

    >>> c = causal_tile_counts(2048, 256, 256)
    >>> c["computed"], c["tiles"], c["scores"], c["masked_tiles"], c["masked_scores"]
    (36, 64, 2359296, 8, 261120)
    """
    rows_of = [(r, min(r + block_q, S)) for r in range(0, S, block_q)]
    cols_of = [(c, min(c + block_k, S)) for c in range(0, S, block_k)]
    out = dict(tiles=len(rows_of) * len(cols_of), computed=0, masked_tiles=0, scores=0, masked_scores=0)
    for r0, r1 in rows_of:
        for c0, c1 in cols_of:
            if c0 > r1 - 1:  # every key of the tile is in every query's future: skipped
                continue
            out["computed"] += 1
            out["scores"] += (r1 - r0) * (c1 - c0)
            if c1 - 1 > r0:  # some query of the tile has a future key in it
                out["masked_tiles"] += 1
                out["masked_scores"] += sum(max(0, c1 - max(c0, i + 1)) for i in range(r0, r1))  # keys j > i
    return out


#: How the tile grid prints its cells (kinds 0, 1, 2), live and static alike.
TILE_FMT = "{:.0f}"


def tile_grid_html(block: int) -> Any:
    """The tile grid of :func:`tile_frame` as HTML, formatted as the static slider formats it (live redraws)."""
    from .slider import frame_html

    return frame_html(tile_frame(block), fmt=TILE_FMT)


#: The tile grid's legend. The slider announces hidden (hatched) cells as "masked" to screen readers,
#: so the legend names them that way too, and the diagonal tiles are described without the word.
TILE_LEGEND = ("2 = on the diagonal (computed, the future hidden inside the tile), 1 = computed in full, "
               "hatched (masked) = skipped, never computed")


def tile_frame(block: int, S: int = 1024) -> Frame:
    """The causal tile schedule for ``S`` positions and square ``block`` tiles: the tiles computed,
    and how many of the scores they compute are masked away (the future inside the diagonal tiles)."""
    n = math.ceil(S / block)
    kind = torch.zeros(n, n)  # 1 = a full tile, 2 = on the diagonal (masked inside)
    for i in range(n):
        kind[i, : i + 1] = 1
        kind[i, i] = 2
    sizes = [min(block, S - i * block) for i in range(n)]  # rows (or keys) of each block
    computed = sum(sizes[i] * sizes[j] for i in range(n) for j in range(i + 1))  # scores of the computed tiles
    needed = S * (S + 1) // 2  # the causal pairs
    labels = [str(i * block) for i in range(n)]
    caption = (f"{int((kind > 0).sum())} of {n * n} tiles computed ({int((kind == 2).sum())} on the diagonal): "
               f"{computed:,} scores, of which {computed - needed:,} ({(computed - needed) / computed:.0%}) are "
               "masked away inside the diagonal tiles.")
    panel = Panel(kind.numpy(), labels, labels, f"query block (rows) x key block (columns), block = {block}: {TILE_LEGEND}",
                  vmin=0, vmax=2, masked=(kind == 0).numpy())
    return Frame(label=f"block {block}", panels=[panel], caption=caption)


def narrowed_dtype(name: str, got: Any, expected: Tensor) -> Feedback | None:
    """The hint for a right answer returned in a narrower float dtype than ``expected`` (the inputs'
    dtype): float16 or bfloat16 through :func:`attnbook.feedback.low_precision`, and a cast such as
    float64 inputs returned as float32, which the float64 comparison of :func:`close` would accept.
    ``None`` when ``got`` is as wide as the inputs (a wider result is fine) or its values differ.

    >>> ref = torch.tensor([0.25, 1.5], dtype=torch.float64)
    >>> narrowed_dtype("out", ref.float(), ref).message[:44]
    'out is torch.float32, but the inputs are tor'
    >>> narrowed_dtype("out", ref, ref.float()) is None
    True
    """
    if not (isinstance(got, Tensor) and got.is_floating_point() and expected.is_floating_point()):
        return None
    if torch.finfo(got.dtype).bits >= torch.finfo(expected.dtype).bits:
        return None
    half = low_precision(got, expected, name=name)
    if half is not None:
        return half
    if not close(got, expected):
        return None
    return wrong(f"{name} is {got.dtype}, but the inputs are {expected.dtype}: the values are right, but a cast "
                 f"(.float(), .to(...)) throws away digits the inputs carry. Compute in the inputs' dtype and "
                 f"return the result without casting it ({expected.dtype}).")


def reference_online_update(m: Tensor, l: Tensor, acc: Tensor, s: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Fold one tile into the running statistics of the online softmax.

    Args:
        m: ``[S_q, 1]`` running maximum of the scores seen so far (``-inf`` before the first tile).
        l: ``[S_q, 1]`` running sum of ``exp(score - m)``.
        acc: ``[S_q, D_v]`` running sum of ``exp(score - m) * v``.
        s: ``[S_q, S_blk]`` this tile's scores.
        v: ``[S_blk, D_v]`` this tile's values.

    Returns:
        ``(m_new, l_new, acc_new)`` with the same shapes as ``(m, l, acc)``.
    """
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # [S_q, 1]
    p = torch.exp(s - m_new)  # [S_q, S_blk]
    alpha = torch.exp(m - m_new)  # [S_q, 1], 0 on the first tile (m = -inf)
    l_new = l * alpha + p.sum(dim=-1, keepdim=True)  # [S_q, 1]
    acc_new = acc * alpha + p @ v  # [S_q, D_v]
    return m_new, l_new, acc_new


#: The online-softmax checker's cases ``(S_q, S_k, first tile's keys, D_v, dtype)``: the second
#: differs in every size (and its tiles are uneven) and in the dtype; the third has scores near
#: :data:`LARGE_SCORE`, where ``exp(score)`` overflows even float64 unless the maximum is subtracted.
ONLINE_CASES: tuple[tuple[int, int, int, int, torch.dtype], ...] = (
    (3, 8, 4, 2, torch.float64), (5, 9, 6, 3, torch.float32), (4, 10, 5, 2, torch.float64))

#: The score added in the online checker's last case: ``exp(800)`` is inf in float64 (above about 709).
LARGE_SCORE = 800.0

_NO_MAX_SUBTRACTED = (
    "with scores near 800 your {name} contains inf or NaN: the tile is exponentiated without subtracting the "
    "maximum first (exp(s), then a rescale by exp(-m_new)). exp(800) overflows even float64 (above about 709; "
    "float32 above about 88), and no later factor brings inf back. Subtract before exponentiating: "
    "p = exp(s - m_new), alpha = exp(m_old - m_new); every exponent is then at most 0."
)


def _case(seed: int, case: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    S_q, S_k, split, D_v, dtype = ONLINE_CASES[case]
    gen = torch.Generator().manual_seed(seed + case)
    s = torch.randn(S_q, S_k, generator=gen, dtype=torch.float64) * 3  # [S_q, S_k] scores, two tiles
    s[0, split:] += 6  # query 0's maximum is in the second tile: the rescaling matters
    if case == 2:
        s += LARGE_SCORE  # exp(s) = inf: only an update that subtracts the maximum survives
    v = torch.randn(S_k, D_v, generator=gen, dtype=torch.float64)  # [S_k, D_v]
    s, v = s.to(dtype), v.to(dtype)
    return s, v, torch.softmax(s, dim=-1) @ v  # [S_q, D_v] the answer after both tiles


def _solution_online(m: Tensor, l: Tensor, acc: Tensor, s: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # [S_q, 1]
    p = torch.exp(s - m_new)  # [S_q, S_blk]
    alpha = torch.exp(m - m_new)  # [S_q, 1]
    return m_new, l * alpha + p.sum(dim=-1, keepdim=True), acc * alpha + p @ v


def _triple(result: Any) -> Feedback | None:
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        return wrong(f"return three tensors (m_new, l_new, acc_new), got {describe(result)}.")
    for name, got in zip(("m_new", "l_new", "acc_new"), result):
        if not isinstance(got, Tensor) or got.is_complex():
            return wrong(f"{name} should be a real torch.Tensor, got {describe(got)}.")
    return None


@exercise(solution=_solution_online,
          not_generic={"no table": "each step of the update is checked in turn, each with its own hint",
                       "transposed": "m and l are columns [S_q, 1]; a transposed acc is a shape error the checker names"})
def check_online_softmax_update(fn: Callable[..., Any]) -> Feedback:
    """Check ``fn(m, l, acc, s, v) -> (m_new, l_new, acc_new)``, one online-softmax step.

    For each case of :data:`ONLINE_CASES` the checker starts from ``m = -inf, l = 0, acc = 0``,
    folds two tiles with the reader's function, and compares with :func:`reference_online_update`
    and with ``softmax(s) @ v``. Query 0's largest score sits in the second tile, so a missing
    rescale shows.
    """
    for case in range(len(ONLINE_CASES)):
        problem = _online_one(fn, case)
        if problem is not None:
            return problem
    return correct("two tiles folded online give exactly softmax(s) @ v: this is the heart of FlashAttention.")


def _online_shape(name: str, got: Tensor, exp: Tensor, s_blk: int) -> Feedback:
    """The hint for ``got`` (one of m_new, l_new, acc_new) whose shape is not ``exp``'s."""
    shape, want = tuple(got.shape), tuple(exp.shape)
    if len(want) == 2 and shape == want[::-1]:
        return wrong(f"{name} is transposed: shape {shape}, expected {want} (one row per query): acc * rescale + p @ v "
                     "with p [S_q, S_blk] and v [S_blk, D_v].")
    if name != "acc_new" and shape == (want[0], s_blk):
        return wrong(f"{name} has one column per key of the tile, shape {shape}, expected {want}: reduce over the "
                     "tile's keys, the last axis, keeping it: s.amax(dim=-1, keepdim=True), p.sum(dim=-1, keepdim=True).")
    if name != "acc_new" and len(want) == 2 and want[1] == 1 and shape == (want[0], want[0]):
        return wrong(f"{name} has shape {shape}, a square, expected {want}: a row total taken without keepdim=True is "
                     "a flat [S_q] vector, and added to the [S_q, 1] column it broadcasts into [S_q, S_q]. Keep the "
                     "reduced axis (keepdim=True) so every row total stays a column.")
    if got.dim() < exp.dim() and got.numel() == exp.numel():
        return wrong(f"{name} has shape {shape}, expected {want}: keep the reduced axis with keepdim=True.")
    return wrong(f"{name} has shape {shape}, expected {want}.")


_NORMALISED_ACC = (
    "l_new is right, but acc_new is divided by l_new, as FlashAttention-1 did at every step. Here acc stays "
    "unnormalised, the running sum of exp(score - m) * v: acc_new = acc * exp(m_old - m_new) + exp(s - m_new) @ v, "
    "and the division by l happens once, after the last tile (out = acc / l)."
)

_ONLINE_BROADCAST = (
    " The shapes did not line up. m and l are columns [S_q, 1] and s is [S_q, S_blk]: reduce a tile over its "
    "keys, the last axis, and keep that axis so the result stays a column: s.amax(dim=-1, keepdim=True) and "
    "p.sum(dim=-1, keepdim=True) (amax over dim 0, or without keepdim, gives a shape that cannot broadcast)."
)


_RESCALED_AFTER_ADDING = (
    "l_new is 0 after the first tile: you multiplied by exp(m_old - m_new), which is 0 there (m_old = -inf), after "
    "adding the tile's terms. Rescale what was summed before, then add the new tile: "
    "l * exp(m_old - m_new) + sum(exp(s - m_new)), and the same for acc."
)

_NEW_TILE_RESCALED = (
    "l_new is right, but you multiplied the new tile's exp(s - m_new) @ v by the rescale factor exp(m_old - m_new) "
    "too (on the first tile that factor is 0, since m_old = -inf, so acc_new came out 0). Only the old acc, summed "
    "against m_old, is rescaled; the new tile is already against m_new: "
    "acc_new = acc * exp(m_old - m_new) + exp(s - m_new) @ v."
)

_RESCALE_WITHOUT_EXP = (
    "your rescale factor has no exponential: m_old - m_new is a difference of exponents, not a factor. On the first "
    "tile it is -inf, and l * (-inf) = 0 * (-inf) is NaN. What was summed against m_old is converted to m_new by "
    "multiplying it by exp(m_old - m_new), which is 0 on the first tile and at most 1 after it."
)

_INVERTED_RESCALE = (
    "your rescale factor is upside down: exp(m_new - m_old) grows (and is inf on the first tile, where m_old = -inf). "
    "What was summed against m_old shrinks when the maximum rises: multiply it by exp(m_old - m_new), at most 1."
)


_ACC_NOT_MATMUL = (
    " m_new and l_new are right, so the shapes go wrong in acc_new: the new tile adds the matrix product "
    "p @ v, [S_q, S_blk] @ [S_blk, D_v] -> [S_q, D_v], a sum over the tile's keys. A product in the other "
    "order (v.T @ p.T is [D_v, S_q]) or an elementwise product summed over another axis gives a different shape."
)


_NO_EXP = (
    "l_new is the sum of the tile's scores themselves (or of s - m_new): the exponential is missing. Softmax "
    "weights grow like e^score, not like the score, so what l and acc add up is p = exp(s - m_new): "
    "l gets p.sum(dim=-1, keepdim=True) and acc gets p @ v. Subtracting m_new only keeps every exponent at most 0."
)

_MAX_AS_SUM = (
    "l_new equals m_new, the running maximum: you returned (or added) the maximum where the running sum goes. "
    "l is the running sum of exp(s - m_new), the softmax denominator; the maximum only keeps those exponents "
    "at most 0. l_new = l * exp(m_old - m_new) + p.sum(dim=-1, keepdim=True)."
)

_MAX_OF_TILE_AS_SUM = (
    "l_new is 1 for every row while acc_new is right: where the running sum goes, you took the largest of the "
    "tile's exp(s - m_new) (amax or max), which is always exp(0) = 1, at the row's top score. l adds up every "
    "exponential of the row, the softmax denominator: p.sum(dim=-1, keepdim=True)."
)


_OLD_MAX_RETURNED = (
    "l_new and acc_new are right, but the m you returned is still -inf after the first tile: you returned the old "
    "running maximum, the m your function received. Return the new one, the maximum you exponentiated against, so "
    "that the next tile's l and acc are rescaled from it."
)


def _square_first_tile(fn: Callable[..., Any], S_q: int = 3, n: int = 2
                       ) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor], tuple[Any, ...]] | None:
    """``fn`` on a first tile whose key count equals D_v (both ``n``), where some wrong shapes still broadcast
    (with ``S_q = n`` too, an elementwise ``p * v.T`` does): ``(s, (m0, l0, acc0), result)``, or ``None`` when
    it raises or does not return three tensors."""
    gen = torch.Generator().manual_seed(5)
    s = torch.randn(S_q, n, generator=gen, dtype=torch.float64)  # [S_q, S_blk]
    v = torch.randn(n, n, generator=gen, dtype=torch.float64)  # [S_blk, D_v], S_blk = D_v
    m0, l0 = torch.full((S_q, 1), float("-inf"), dtype=s.dtype), torch.zeros(S_q, 1, dtype=s.dtype)
    acc0 = torch.zeros(S_q, n, dtype=s.dtype)
    result, fb = run_reader_code(fn, m0, l0, acc0, s.clone(), v.clone())
    if fb is not None or _triple(result) is not None:
        return None
    return s, (m0, l0, acc0), (*result, v)


def _acc_not_matmul(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` gets m_new and l_new right on a first tile whose key count equals D_v (where a
    wrong acc_new product still broadcasts), so that its shape error lies in acc_new."""
    for S_q, n in ((3, 2), (3, 3)):  # the second also lets p * v.T broadcast: [S_q, S_blk] * [D_v, S_blk]
        run = _square_first_tile(fn, S_q, n)
        if run is None:
            continue
        s, state, (*result, v) = run
        ref = reference_online_update(*state, s, v)
        if all(tuple(g.shape) == tuple(e.shape) and close(g, e) for g, e in zip(result[:2], ref[:2])) \
                and not close(result[2], ref[2]):
            return True
    return False


def _first_tile_hint(result: tuple[Tensor, Tensor, Tensor], ref: tuple[Tensor, Tensor, Tensor], s: Tensor,
                     D_v: int) -> Feedback | None:
    """Hints for the first tile that name the step at fault, before the step-by-step checks below."""
    names = ("m_new", "l_new", "acc_new")
    for order in ((1, 0, 2), (0, 2, 1), (2, 1, 0), (1, 2, 0), (2, 0, 1)):
        if all(tuple(result[i].shape) == tuple(ref[j].shape) and close(result[i], ref[j]) for i, j in enumerate(order)):
            got = ", ".join(names[j] for j in order)
            return wrong(f"your values are right but in the order ({got}): return (m_new, l_new, acc_new), in that order.")
    m1, l1 = result[0], result[1]
    if tuple(m1.shape) != tuple(ref[0].shape):
        return None
    if torch.isneginf(m1).all() and all(tuple(result[i].shape) == tuple(ref[i].shape) and close(result[i], ref[i])
                                        for i in (1, 2)):
        return wrong(_OLD_MAX_RETURNED)
    if torch.isneginf(m1).all():
        return wrong("m_new is still -inf after the first tile: the running maximum is the larger of the old one and "
                     "the tile's, torch.maximum(m, s.amax(dim=-1, keepdim=True)); torch.minimum (or amin) keeps -inf.")
    if close(m1, s.amin(dim=-1, keepdim=True)):
        return wrong("m_new is each row's smallest score: use the largest, torch.maximum(m, s.amax(dim=-1, keepdim=True)) "
                     "(amax, not amin), so that every exponent exp(s - m_new) is at most 0.")
    for scale in (math.sqrt(D_v), math.sqrt(s.shape[-1])):
        if scale != 1 and close(m1, ref[0] / scale):
            return wrong("you divided the scores by sqrt(d) again: the tile s holds scaled scores already "
                         "(q . k / sqrt(d_k)), so use it as it is.")
    if not close(m1, ref[0]) or tuple(l1.shape) != tuple(ref[1].shape):
        return None
    acc_right = tuple(result[2].shape) == tuple(ref[2].shape) and close(result[2], ref[2])
    if close(l1, ref[0]) and not close(ref[1], ref[0]):
        return wrong(_MAX_AS_SUM)
    if close(l1, torch.ones_like(l1)) and not close(ref[1], torch.ones_like(ref[1])) and acc_right:
        return wrong(_MAX_OF_TILE_AS_SUM)
    if close(l1, s.sum(dim=-1, keepdim=True)) or close(l1, (s - ref[0]).sum(dim=-1, keepdim=True)):
        return wrong(_NO_EXP)
    if close(l1, torch.ones_like(l1)) and not close(ref[1], torch.ones_like(ref[1])):
        return wrong("l_new is 1 for every row: you normalised the tile (softmax, or p / p.sum()). p is the "
                     "unnormalised exp(s - m_new); the running sum l collects the denominators, and the division "
                     "happens once, at the end (out = acc / l).")
    if close(l1, torch.exp2(s - ref[0]).sum(dim=-1, keepdim=True)):
        return wrong("you used base 2 (torch.exp2 or 2 ** x): softmax is in base e, so use torch.exp. (GPU kernels "
                     "do use exp2, but on scores multiplied by log2(e) first, which gives the same weights up to rounding.)")
    if close(l1, torch.exp(s - ref[0]).sum().expand_as(l1)):
        return wrong("l_new is the same number on every row, the sum over the whole tile: sum each row over its "
                     "keys only, p.sum(dim=-1, keepdim=True).")
    return None


def _rescales_by(fn: Callable[..., Any], state: tuple[Tensor, Tensor, Tensor], s2: Tensor, v2: Tensor,
                 factor: Callable[[Tensor, Tensor], Tensor]) -> bool:
    """Whether ``fn``, started from the right state after the first tile, rescales ``l`` by
    ``factor(m_old, m_new)`` (a wrong factor: the first tile alone gave NaN, so the second one shows which)."""
    result, fb = run_reader_code(fn, *(t.clone() for t in state), s2.clone(), v2.clone())
    if fb is not None or _triple(result) is not None:
        return False
    m_old, l_old, _ = state
    m_new = torch.maximum(m_old, s2.amax(-1, keepdim=True))
    return close(result[1], l_old * factor(m_old, m_new) + torch.exp(s2 - m_new).sum(-1, keepdim=True))


_SCALAR_IDIOMS = (
    "Boolean value of Tensor with more than one value is ambiguous",  # max(m, column)
    "only one element tensors can be converted to Python scalars",  # math.exp(column)
    "return_types.max",  # torch.maximum(m, torch.max(s, -1, keepdim=True)), a (values, indices) pair
)

_SCALAR_TO_TENSOR = (
    " Section 8.3's worked example runs on single numbers, with Python's max and math.exp; here m, l and each "
    "tile are columns of numbers, one per query. Use the tensor versions: torch.maximum(m, s.amax(dim=-1, "
    "keepdim=True)) for the running maximum (torch.max(s, dim) returns a (values, indices) pair; amax returns "
    "the values) and torch.exp for the exponentials."
)


_ELEMENTWISE_MAX = (
    " m_new came out one value per score, [S_q, S_blk], not one per row: torch.max(m, s) (like torch.maximum) "
    "with the whole tile compares elementwise, each score with m. Reduce the tile to its row maxima first, over "
    "the keys with keepdim=True, and take the larger of those and m."
)

_HALF_INSIDE = (
    "your values are right to only about {digits} significant digits (off by up to {worst:.2g}), as if computed "
    "in {narrow} and cast back: those keep too few digits for a running sum. Compute in the inputs' "
    "dtype ({dtype}), without casting down."
)

_P_AGAINST_TILE_MAX = (
    "l_new is off after the second tile: you exponentiated the new tile against its own maximum, "
    "exp(s - tile max), but l and acc are sums against the running maximum m_new. Where the old maximum is the "
    "larger one the two differ, and the tile's terms need the extra factor exp(tile max - m_new): exponentiate "
    "against m_new."
)

_RESCALE_BY_TILE_MAX = (
    "l_new is off after the second tile: your rescale factor is exp(m_old - tile max), against the tile's own "
    "maximum. Where the old maximum is the larger one that factor exceeds 1 and the old sums grow. The old sums "
    "move from m_old to the running maximum m_new, the larger of the two."
)


_TILE_ON_ITS_OWN = (
    "after the second tile you added the new tile, exponentiated against its own maximum, to l and acc as they "
    "were: the old sums are against m_old and the tile's terms against the tile's maximum, and terms against "
    "different maxima cannot be added. Bring both to the running maximum m_new: rescale the old sums by "
    "exp(m_old - m_new) and exponentiate the tile against m_new."
)

_SUMS_AGAINST_TILE_MAX = (
    "after the second tile your l and acc are sums against the tile's own maximum (the old sums rescaled by "
    "exp(m_old - tile max), the tile exponentiated against its max), but the m_new you return is the running "
    "maximum, and the next tile will rescale from it. Where the old maximum is the larger one the two differ: "
    "take both the rescale and the exponentials against m_new."
)


def _elementwise_max(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``, on a first tile whose key count equals D_v (where a [S_q, S_blk] m_new still broadcasts
    through acc), returns m_new = torch.maximum(m, s) elementwise, one value per score."""
    run = _square_first_tile(fn)
    if run is None:
        return False
    s, _, (m_new, *_) = run
    return tuple(m_new.shape) == tuple(s.shape) and close(m_new, s)  # max(-inf, s) = s


def _rounded_inside(result: Sequence[Tensor], ref: Sequence[Tensor]) -> Feedback | None:
    """The hint for a step computed in float16 or bfloat16 and cast back: every value equals the reference
    to half precision (:data:`HALF_TOL`) but not to the checker's tolerance."""
    if all(close(g, e) for g, e in zip(result, ref)):
        return None
    if not all(tuple(g.shape) == tuple(e.shape) and close(g, e, atol=HALF_TOL, rtol=HALF_TOL) for g, e in zip(result, ref)):
        return None
    worst = max(float((as_cpu_float64(g) - as_cpu_float64(e)).abs().max()) for g, e in zip(result, ref))
    scale = max(1.0, *(float(as_cpu_float64(e).abs().max()) for e in ref))
    if ref[0].dtype == torch.float64 and worst <= 1e-5 * scale:  # float32 keeps about 7 digits, float16 about 3
        narrow, digits = "float32 (a .float() or .to(torch.float32) inside)", "6 or 7"
    else:
        narrow, digits = "float16 or bfloat16", "2 or 3"
    return wrong(_HALF_INSIDE.format(worst=worst, dtype=ref[0].dtype, narrow=narrow, digits=digits))


_MATMUL_ORDER = (
    " The tile's product did not line up: p = exp(s - m_new) is [S_q, S_blk] (one row per query, one column per "
    "key of the tile) and v is [S_blk, D_v] (one row per key). A matrix product sums over the axis the two share, "
    "the tile's keys: the last axis of its left operand must be the first of its right one, so check the order "
    "of the two operands and leave both untransposed."
)


def _online_call(fn: Callable[..., Any], *args: Tensor) -> tuple[Any, Feedback | None]:
    result, fb = call_reader(fn, args, idioms=False)
    if fb is not None and any(idiom in fb.message for idiom in _SCALAR_IDIOMS):
        return None, wrong(fb.message.rstrip(".") + "." + _SCALAR_TO_TENSOR)
    if fb is not None and "shapes cannot be multiplied" in fb.message:
        return None, wrong(fb.message.rstrip(".") + "." + _MATMUL_ORDER)
    if fb is not None and "max() received an invalid combination" in fb.message:
        return None, wrong("your code called torch.max with two tensors and a dim, which PyTorch refuses (TypeError): "
                           "torch.max(a, b) of two tensors compares them elementwise and takes no dim. Reduce the "
                           "tile to its row maxima first, s.amax(-1, keepdim=True), then take "
                           "torch.maximum(m, those).")
    if fb is not None and "must match the size" in fb.message and _elementwise_max(fn):
        return None, wrong(fb.message.rstrip(".") + "." + _ELEMENTWISE_MAX)
    if fb is not None and "must match the size" in fb.message and _acc_not_matmul(fn):
        return None, wrong(fb.message.rstrip(".") + "." + _ACC_NOT_MATMUL)
    if fb is not None and "must match the size" in fb.message:
        return None, wrong(fb.message.rstrip(".") + "." + _ONLINE_BROADCAST)
    if fb is not None and "same dtype" in fb.message:
        dtypes = sorted({str(a.dtype) for a in args})
        return None, wrong(fb.message.rstrip(".") + f". Here the inputs are {', '.join(dtypes)}: a cast inside "
                           "your function (.double(), .float()) meets an uncast tensor in a product. Compute in "
                           "the inputs' dtype, without casting, and return m_new, l_new, acc_new in that dtype.")
    return result, fb


def _online_one(fn: Callable[..., Any], case: int) -> Feedback | None:
    s, v, expected = _case(8, case)
    split = ONLINE_CASES[case][2]
    S_q, D_v = s.shape[0], v.shape[1]
    m0 = torch.full((S_q, 1), float("-inf"), dtype=s.dtype)
    l0 = torch.zeros(S_q, 1, dtype=s.dtype)
    acc0 = torch.zeros(S_q, D_v, dtype=s.dtype)

    result, fb = _online_call(fn, m0.clone(), l0.clone(), acc0.clone(), s[:, :split].clone(), v[:split].clone())
    if fb is not None:
        return fb
    problem = _triple(result)
    if problem is not None:
        return problem
    ref1 = reference_online_update(m0, l0, acc0, s[:, :split], v[:split])
    hint = _first_tile_hint(result, ref1, s[:, :split], D_v)
    if hint is not None:
        return hint
    for name, got, exp in zip(("m_new", "l_new", "acc_new"), result, ref1):
        if tuple(got.shape) != tuple(exp.shape):
            return _online_shape(name, got, exp, split)
        half = narrowed_dtype(name, got, exp)
        if half is not None:
            return half
        if case == 2 and not torch.isfinite(got).all():
            return wrong(_NO_MAX_SUBTRACTED.format(name=name))
        if torch.isinf(got).any() and name != "m_new":
            return wrong(
                f"{name} contains inf on the first tile: exp(s - m_old) with m_old = -inf is exp(+inf). Compute the "
                "new maximum first and exponentiate against it: exp(s - m_new), and rescale by exp(m_old - m_new)."
            )
        if torch.isnan(got).any():
            if _rescales_by(fn, ref1, s[:, split:], v[split:], lambda old, new: torch.exp(new - old)):
                return wrong(_INVERTED_RESCALE)
            if _rescales_by(fn, ref1, s[:, split:], v[split:], lambda old, new: old - new):
                return wrong(_RESCALE_WITHOUT_EXP)
            return wrong(
                f"{name} contains NaN on the first tile, where m = -inf: compute the new maximum first and "
                "exponentiate against m_new (exp(m - m_new) = exp(-inf) = 0 is fine; -inf - (-inf) and 0 * (-inf) are not)."
            )
    m1, l1, acc1 = result
    rounded = _rounded_inside(result, ref1)
    if rounded is not None:
        return rounded
    if not close(m1, ref1[0]):
        return wrong("m_new should be the larger of the old running max and this tile's row max: torch.maximum(m, s.amax(-1, keepdim=True)).")
    if close(l1, ref1[1]) and not close(acc1, ref1[2]) and close(acc1, ref1[2] / ref1[1]):
        return wrong(_NORMALISED_ACC)
    if not close(l1, ref1[1]):
        if not l1.abs().any():
            return wrong(_RESCALED_AFTER_ADDING)
        return wrong("after the first tile, l_new should be sum(exp(s - m_new)) per row.")
    if not close(acc1, ref1[2]) and not acc1.abs().any():
        return wrong(_NEW_TILE_RESCALED)
    if not close(acc1, ref1[2]):
        return wrong("l_new is right, but acc_new is not: after the first tile acc_new should be exp(s - m_new) @ v.")

    result2, fb = _online_call(fn, m1.detach().clone(), l1.detach().clone(), acc1.detach().clone(), s[:, split:].clone(), v[split:].clone())
    if fb is not None:
        return fb
    problem = _triple(result2)
    if problem is not None:
        return problem
    m2, l2, acc2 = result2
    ref2 = reference_online_update(*ref1, s[:, split:], v[split:])
    for name, got, exp in zip(("m_new", "l_new", "acc_new"), result2, ref2):
        half = narrowed_dtype(name, got, exp)
        if half is not None:
            return half
        if case == 2 and not torch.isfinite(got).all():
            return wrong(_NO_MAX_SUBTRACTED.format(name=name))
    if not close(m2, ref2[0]):
        if close(m2, ref1[0]):
            return wrong("on the second tile m_new is still the old maximum: m_new must be the running maximum, "
                         "max(m_old, tile max): torch.maximum(m, s.amax(-1, keepdim=True)).")
        if close(m2, s[:, split:].amax(-1, keepdim=True)):
            return wrong("on the second tile m_new is the tile max alone: m_new must be the running maximum, "
                         "max(m_old, tile max): torch.maximum(m, s.amax(-1, keepdim=True)).")
        return wrong("on the second tile m_new is wrong: m_new must be the running maximum, max(m_old, tile max).")
    m_ref = ref2[0]
    p_old = torch.exp(s[:, split:] - ref1[0])  # the new tile exponentiated against the OLD maximum
    if close(l2, ref1[1] + torch.exp(s[:, split:] - m_ref).sum(-1, keepdim=True)):
        if close(acc2, ref1[2] + torch.exp(s[:, split:] - m_ref) @ v[split:]):
            return wrong("you forgot to rescale the running sums l and acc by exp(m_old - m_new) before adding the new tile.")
        return wrong("you forgot to rescale the running sum l by exp(m_old - m_new) before adding the new tile.")
    if close(l2, ref1[1] * torch.exp(ref1[0] - m_ref) + p_old.sum(-1, keepdim=True)) or close(l2, ref1[1] + p_old.sum(-1, keepdim=True)):
        return wrong("exponentiate the new tile against the new maximum: exp(s - m_new), not exp(s - m_old).")
    tile_max = s[:, split:].amax(-1, keepdim=True)
    if close(l2, ref1[1] * torch.exp(ref1[0] - m_ref) + torch.exp(s[:, split:] - tile_max).sum(-1, keepdim=True)):
        return wrong(_P_AGAINST_TILE_MAX)
    if close(l2, ref1[1] * torch.exp(ref1[0] - tile_max) + torch.exp(s[:, split:] - m_ref).sum(-1, keepdim=True)):
        return wrong(_RESCALE_BY_TILE_MAX)
    p_tile = torch.exp(s[:, split:] - tile_max).sum(-1, keepdim=True)  # the new tile against its own maximum
    if close(l2, ref1[1] + p_tile):
        return wrong(_TILE_ON_ITS_OWN)
    if close(l2, ref1[1] * torch.exp(ref1[0] - tile_max) + p_tile):
        return wrong(_SUMS_AGAINST_TILE_MAX)
    if close(l2, torch.exp(s[:, split:] - m_ref).sum(-1, keepdim=True)):
        return wrong("after the second tile your l_new (and acc_new) hold this tile alone: the running sums of the "
                     "earlier tiles were dropped. l and acc carry every tile seen so far; the new tile adds to them, "
                     "once they are rescaled to the new maximum." if close(acc2, torch.exp(s[:, split:] - m_ref) @ v[split:])
                     else "after the second tile your l_new holds this tile alone: the running sum l of the earlier "
                     "tiles was dropped. l carries every tile seen so far; the new tile adds to it, once it is "
                     "rescaled to the new maximum.")
    rounded = _rounded_inside(result2, ref2)
    if rounded is not None:
        return rounded
    if not close(l2, ref2[1]):
        return wrong("l_new is off after the second tile: l_new = l * exp(m_old - m_new) + sum(exp(s - m_new)).")
    if close(acc2, ref1[2] + torch.exp(s[:, split:] - m_ref) @ v[split:]):
        return wrong("you rescaled l but not acc: acc also needs the factor exp(m_old - m_new) before adding exp(s - m_new) @ v.")
    alpha2 = torch.exp(ref1[0] - m_ref)
    if close(acc2, (ref1[2] + torch.exp(s[:, split:] - m_ref) @ v[split:]) * alpha2):
        return wrong(_NEW_TILE_RESCALED)
    if not close(acc2, ref2[2]):
        return wrong("acc_new is off after the second tile: acc_new = acc * exp(m_old - m_new) + exp(s - m_new) @ v.")
    if not close(acc2 / l2, expected):
        return wrong("the running values are consistent with the reference but acc / l is not softmax(s) @ v.")  # pragma: no cover
    return None


def reference_tile_weights(s_tile: Tensor, lse: Tensor) -> Tensor:
    """The softmax weights of one tile: ``exp(s_tile - lse[:, None])`` (``[bq, bk]``, ``lse`` ``[bq]``)."""
    return torch.exp(s_tile - lse[:, None])


def _tile_case(case: int = 0) -> tuple[Tensor, Tensor, Tensor, slice, slice]:
    """Case 0: a ``[6, 10]`` float32 score matrix, tile rows 2:5 and keys 4:8. Case 1: ``[7, 13]`` in
    float64 with scores near 800, where ``exp(score)`` overflows even float64, tile rows 1:6 and
    keys 3:10. Case 2: ``[5, 12]`` in float16, tile rows 1:4 and keys 5:11; its weights are the
    softmax of the float16 scores computed in float64 (compared with :data:`HALF_TOL`)."""
    if case == 0:
        gen = torch.Generator().manual_seed(81)
        s = torch.randn(6, 10, generator=gen, dtype=torch.float64).to(torch.float32) * 2  # [S_q, S_k] scores of one head
        rows, cols = slice(2, 5), slice(4, 8)
    elif case == 1:
        gen = torch.Generator().manual_seed(82)
        s = torch.randn(7, 13, generator=gen, dtype=torch.float64) * 2 + 800.0  # [S_q, S_k]: exp(s) = inf
        rows, cols = slice(1, 6), slice(3, 10)
    else:  # float16 scores, as a fused kernel holds them: the weights are compared to float16's precision
        gen = torch.Generator().manual_seed(83)
        s = (torch.randn(5, 12, generator=gen, dtype=torch.float64) * 2).to(torch.float16)  # [S_q, S_k]
        rows, cols = slice(1, 4), slice(5, 11)
        full = s.double()
        return s, torch.logsumexp(full, dim=-1).to(s.dtype), torch.softmax(full, dim=-1), rows, cols
    return s, torch.logsumexp(s, dim=-1), torch.softmax(s, dim=-1), rows, cols


_TILE_MISTAKES = (
    Mistake("softmax inside the tile", lambda s, lse: torch.softmax(s, dim=-1),
            "each row of your tile sums to 1, but the tile holds only some of the row's keys: divide by the "
            "whole row's denominator exp(lse), not by the tile's own sum."),
    Mistake("sign", lambda s, lse: torch.exp(lse[:, None] - s),
            "the sign is flipped: the weight is exp(score - lse), not exp(lse - score)."),
    Mistake("divide by lse", lambda s, lse: torch.exp(s) / lse[:, None],
            "lse is the *log* of the denominator: divide by exp(lse), i.e. compute exp(s - lse)."),
    Mistake("no exp", lambda s, lse: s - lse[:, None],
            "that is the log of the weights; take exp of it."),
    Mistake("softmax over the queries", lambda s, lse: torch.softmax(s, dim=0),
            "your columns sum to 1: softmax over dim=0 normalises each key over the tile's queries. Attention "
            "normalises each query's row over the keys, and here over the whole row, not just the tile: "
            "exp(s - lse[:, None])."),
    Mistake("base 2", lambda s, lse: torch.exp2(s - lse[:, None]),
            "you used base 2 (torch.exp2 or 2 ** x): lse is a natural logarithm, so use torch.exp. (GPU kernels "
            "use exp2, but on scores and lse both multiplied by log2(e) first.)"),
    Mistake("scores divided by lse", lambda s, lse: s / lse[:, None],
            "you divided the scores by lse: lse is a logarithm, the log of the row's whole softmax denominator, "
            "and a weight is an exponential. Dividing by the denominator is subtracting its logarithm inside "
            "the exponent."),
    Mistake("the tile's own max", lambda s, lse: torch.exp(s - s.amax(dim=-1, keepdim=True)),
            "you subtracted the tile's own row maximum (each row of your tile has a 1 where its largest score "
            "is): that keeps exp from overflowing but does not normalise. Subtract the whole row's logsumexp "
            "instead, exp(s - lse[:, None]), which both keeps every weight at most 1 and divides by the "
            "row's full softmax denominator."),
    Mistake("mean of lse", lambda s, lse: torch.exp(s - lse.mean()),
            "you subtracted lse.mean(), one number for the whole tile: each query row has its own logsumexp, the "
            "log of its own row's softmax denominator, and averaging them gives no row's. (Log-sum-exps do not "
            "combine by averaging; merging two partial ones takes torch.logaddexp.) Subtract each row's own: "
            "lse[:, None] lines lse up with the rows."),
    Mistake("scale applied again", lambda s, lse: torch.exp(s / 8 - lse[:, None]),
            "you divided the scores by 8, the 1/sqrt(D_k) scale of the chapter's heads, again: s_tile already "
            "holds the scaled scores, the same ones whose logsumexp lse is, so use them as they are."),
)

_OVERFLOW = (
    "your weights contain inf or NaN when the scores are large (here about 800): exp(score) overflows (float32 "
    "above about 88, float64 above about 709), and inf / inf is NaN. That is what the logsumexp avoids: compute "
    "exp(s - lse) in one step, which never exceeds 1."
)


def _tile_one(fn: Callable[..., Any], case: int) -> Feedback | None:
    s, lse, weights, rows, cols = _tile_case(case)
    s_tile, lse_rows = s[rows, cols].clone(), lse[rows].clone()
    bq, bk = s_tile.shape
    got, fb = run_reader_code(fn, s_tile.clone(), lse_rows.clone())
    if fb is not None and "must match the size" in fb.message:
        return wrong(f"lse has one number per query row, shape [{bq}], and the tile is [{bq}, {bk}]: "
                     "write lse[:, None] so it lines up with the rows, not the columns.")
    if fb is not None and re.search(r"size mismatch|shapes cannot be multiplied", fb.message):
        return wrong(f"{fb.message.rstrip('.')}. That is a matrix product (@, torch.matmul or mv) of the tile with lse: "
                     f"lse holds one number per query row, shape [{bq}], that enters every weight of its row on its "
                     "own, elementwise, not summed against the row's scores as a product does.")
    if fb is not None and "is invalid for input of size" in fb.message:
        return wrong(f"{fb.message.rstrip('.')}. The checker also passes a [5, 7] tile whose lse is [5]: write the shapes "
                     "without fixed sizes, e.g. lse[:, None] or lse.unsqueeze(-1).")
    if fb is not None:
        return fb
    if not isinstance(got, Tensor):
        return wrong(f"return the tile's weights as one torch.Tensor [{bq}, {bk}], got {describe(got)}.")
    half = narrowed_dtype("your weights tensor", got, weights[rows, cols].to(s.dtype))
    if half is not None:
        return half
    tol = HALF_TOL if s.dtype in (torch.float16, torch.bfloat16) else ATOL
    if close(got, weights[rows, cols], atol=tol, rtol=tol):
        return None
    if tuple(got.shape) == (bk, bq):
        what = ("your weights are transposed: the values are right, but the shape is" if close(got.mT, weights[rows, cols])
                else "your weights are the transpose of the tile's shape:")
        return wrong(f"{what} {tuple(got.shape)}, keys down and query rows across. The tile is [{bq}, {bk}], "
                     "one row per query like s_tile: do not transpose s_tile or the result.")
    if tuple(got.shape) != (bq, bk):
        return wrong(f"the tile's weights are [{bq}, {bk}] ({bq} query rows, {bk} keys), got shape {tuple(got.shape)}; "
                     f"lse is [{bq}]: broadcast it over the keys with lse[:, None].")
    if not got.is_complex() and not torch.isfinite(got.detach()).all():
        return wrong(_OVERFLOW)
    hint = diagnose(got, _TILE_MISTAKES, s_tile, lse_rows) or _tile_log_hint(got, s_tile, lse_rows)
    return hint or wrong("the weights differ from softmax(s) in this block; the weight of key j for query i is exp(s_ij - lse_i).")


def _tile_log_hint(got: Tensor, s_tile: Tensor, lse: Tensor) -> Feedback | None:
    """Hints for weights that are exp of the right exponent scaled, shifted, computed in float32, or taken against
    one number for the whole tile (lse.sum(), lse.max())."""
    x = (s_tile - lse[:, None]).double()  # the right log-weights, at most 0
    if s_tile.dtype == torch.float64 and close(got, torch.exp(s_tile.float() - lse.float()[:, None])):
        return wrong("you computed in float32 (.float()): here the scores are float64 near 800, where float32 keeps "
                     "only about 7 significant digits (its spacing at 800 is 6e-5), so the weights lose digits, and "
                     "casting back does not restore them. Compute in the input's dtype or wider; upcast only float16 "
                     "or bfloat16.")
    if close(got, torch.exp(s_tile + lse[:, None])):  # not in the table: on the large scores it overflows, as
        # "divide by lse" does, and both would be inf there
        return wrong("you added lse: the weight divides exp(score) by the row's denominator exp(lse), and dividing "
                     "by an exponential is subtracting its exponent.")
    for low in (torch.float16, torch.bfloat16):
        if s_tile.dtype != low and close(got, torch.exp(s_tile.to(low) - lse.to(low)[:, None]).to(s_tile.dtype)):
            return wrong(f"you computed in {str(low)[6:]} and cast back: its 8 or 11 significant bits round the scores "
                         "and lse before the subtraction, so the weights lose digits that casting back does not "
                         "restore. Compute in the input's dtype.")
    if got.is_complex() or not (got.detach() > 0).all():
        return None
    logs = torch.log(got.detach().double())
    one_number = s_tile.double() - logs  # what was subtracted from each score
    if float(one_number.std(unbiased=False)) < 1e-5 and float(lse.double().std(unbiased=False)) > 1e-3:
        c = one_number.mean()
        named = (("lse.sum()", lse.sum()), ("lse.max()", lse.max()), ("lse.min()", lse.min()))
        what = next((f" (it equals {name})" for name, x in named
                     if abs(float(c) - float(x)) < 1e-4 * max(1.0, abs(float(x)))), "")
        return wrong(f"you subtracted one number from every score of the tile{what}, where each query row has its "
                     "own logsumexp, the log of its own row's softmax denominator: with one number for all "
                     "rows, at most one row is divided by its own denominator. Subtract each row's own: lse[:, None] "
                     "lines lse up with the rows.")
    ratio = logs / x.where(x.abs() > 1e-3, torch.ones_like(x))
    mask = x.abs() > 1e-3
    if mask.any() and float(ratio[mask].std(unbiased=False)) < 1e-5 and abs(float(ratio[mask].mean()) - 1) > 1e-3:
        return wrong(f"your log-weights are {float(ratio[mask].mean()):.4g} times s - lse: the exponent is scaled. The "
                     "scores in s_tile are already divided by sqrt(d), and lse belongs to those scores: the weight "
                     "is exp(s - lse[:, None]), with no further factor.")
    shift = logs - x
    if float(shift.std(unbiased=False)) < 1e-5:
        return wrong(f"your weights are the right ones times e^{float(shift.mean()):.3g}: the exponent is off by a "
                     "constant. Subtract exactly lse, the logarithm of the row's softmax denominator: exp(s - lse[:, None]).")
    return None


def _tile_table_cases() -> list[tuple[Tensor, Tensor]]:
    out = []
    for c in range(2):
        s, lse, _, rows, cols = _tile_case(c)
        out.append((s[rows, cols], lse[rows]))
    return out


@exercise(solution=lambda s_tile, lse: torch.exp(s_tile - lse[:, None]),
          tables=(MistakeTable(_TILE_MISTAKES, _tile_table_cases, reference_tile_weights),))
def check_tile_weights(fn: Callable[..., Any]) -> Feedback:
    """Check ``fn(s_tile, lse) -> weights`` for a block of a score matrix; ``lse`` holds the logsumexp
    of each *whole* row, and the answer must equal the same block of ``softmax(s)``.

    Case 0 is rows 2:5, keys 4:8 of a ``[6, 10]`` float32 matrix; case 1 a block of a float64
    matrix with scores near 800, where ``exp(s) / exp(lse)`` overflows; case 2 a float16 block, where
    a right answer in float16 (or wider) passes to float16's precision.
    """
    for case in range(3):
        problem = _tile_one(fn, case)
        if problem is not None:
            return problem
    return correct("exp(s - lse) gives the tile's weights exactly (in float16 too, to its precision), with no "
                   "other tile in sight: "
                   "this is how the backward pass recomputes P one tile at a time.")



# ---- diagram: the tile loop --------------------------------------------------------------------

#: The diagram's sizes: the tile slider's sequence length and attnlib's default block size.
DIAGRAM_S, DIAGRAM_BLOCK = 1024, 256


def _formula_lines(d: Diagram, y: float, lines: tuple[str, ...]) -> None:
    """The formula lines inside a diagram's box, 24 px apart from ``y`` down."""
    for k, line in enumerate(lines):
        d.text(34, y + 24 * k, line, size=15, anchor="start")


#: The memory-levels diagram's example: section 8.2's sequence length, in float32.
LEVELS_S, LEVELS_BYTES = 4096, 4


def _mib_or_kib(n_bytes: int) -> str:
    """``64 MiB`` or ``256 KiB``: a whole number of the largest binary unit that divides it."""
    return f"{n_bytes // 2**20} MiB" if n_bytes % 2**20 == 0 else f"{n_bytes // 2**10} KiB"


@diagram
def memory_levels_diagram() -> Diagram:
    """Why tiling pays: materialised attention sends every ``[S, S]`` tensor through main memory, the tiled
    loop keeps one small tile in the fast level and sends only Q, K, V, the output and lse through. (The alt text
    writes S \u00d7 S: square brackets would end the markdown image's alt text.)"""
    from attnlib.flash import BLOCK_K, BLOCK_Q

    assert BLOCK_Q == BLOCK_K == DIAGRAM_BLOCK, "draw the diagram with attnlib's default blocks"
    full = _mib_or_kib(LEVELS_S * LEVELS_S * LEVELS_BYTES)
    tile = _mib_or_kib(DIAGRAM_BLOCK * DIAGRAM_BLOCK * LEVELS_BYTES)
    fast = "fast, small: caches (CPU), on-chip (GPU)"
    d = Diagram(
        "ch08_memory_levels", 358, 486, title="Where the scores live: materialised and tiled attention",
        alt=(f"Two panels, each with a fast, small level of memory (a CPU's caches, a GPU's on-chip memory) above "
             f"a large, slower main memory, for S = {LEVELS_S} in float32. Materialised attention: each step "
             f"writes its S \u00d7 S result to main memory, {full} per head, and the next step reads it back. Tiled "
             f"attention: one {DIAGRAM_BLOCK} \u00d7 {DIAGRAM_BLOCK} tile of scores per head, {tile}, stays in the "
             "fast level with the running m, \u2113 and acc; only blocks of Q, K and V go up, and only the "
             "output and lse come back, so main memory holds no S \u00d7 S tensor."))
    d.text(179, 28, "Where the scores live", size=16, weight="bold")
    d.text(179, 50, f"S = {LEVELS_S}, float32, {DIAGRAM_BLOCK}-row blocks", size=14, color=MUTED)
    panels = (("materialised attention", "the arithmetic, one step at a time",
               ("each step writes its [S, S] result,", "the next step reads it back"),
               f"Q, K, V, out, and [S, S] per head: {full}", "vermillion"),
              ("tiled attention", f"a [{DIAGRAM_BLOCK}, {DIAGRAM_BLOCK}] tile per head ({tile}); m, \u2113, acc",
               ("only blocks of Q, K, V go up,", "only out and lse come back"),
               "Q, K, V, out, lse: no [S, S] tensor", "blue"))
    for k, (title, fast_sub, arrow_lines, slow_sub, colour) in enumerate(panels):
        y0 = 66 + 212 * k
        d.text(14, y0 + 16, title, size=15, anchor="start", weight="bold")
        d.box(14, y0 + 26, 330, 56, fast, sub=fast_sub, color="green", size=14)
        d.arrow(44, y0 + 86, 44, y0 + 124, color=colour)
        d.arrow(66, y0 + 124, 66, y0 + 86, color=colour)
        for j, line in enumerate(arrow_lines):
            d.text(82, y0 + 102 + 17 * j, line, size=13, anchor="start")
        d.box(14, y0 + 128, 330, 56, "large, slower: main memory", sub=slow_sub, color="orange", size=14)
    return d


@diagram
def tile_loop_diagram() -> Diagram:
    """One query block's walk over the causal tile grid, and the three running statistics it updates."""
    from attnlib.flash import BLOCK_K, BLOCK_Q

    assert BLOCK_Q == BLOCK_K == DIAGRAM_BLOCK, "draw the diagram with attnlib's default blocks"
    n = DIAGRAM_S // DIAGRAM_BLOCK
    walker = n - 2  # the query block whose walk is numbered
    d = Diagram(
        "ch08_tile_loop", 380, 486, title="The tile loop of tiled attention",
        alt=(f"A {n} by {n} grid of score tiles for S = {DIAGRAM_S} with {DIAGRAM_BLOCK}-row blocks, causal: tiles below "
             f"the diagonal are computed in full, tiles on the diagonal are computed and then masked inside, tiles above it are skipped. "
             f"Query block {walker} walks key blocks 0 to {walker} in order (steps 1 to {walker + 1}); after each "
             f"tile it updates its running max m, running sum \u2113 and accumulator acc, rescaling the last two by "
             f"\u03b1 = exp(old m \u2212 new m), and after the last tile it writes out = acc / \u2113 and lse = m + log \u2113."))
    d.text(190, 28, "One query block walks its key blocks", size=16, weight="bold")
    d.text(190, 50, f"S = {DIAGRAM_S}, {DIAGRAM_BLOCK}-row blocks, causal", size=14, color=MUTED)
    cell, x0, y0 = 40, 44, 100
    fills = [["green" if j < i else "orange" if j == i else "grey" for j in range(n)] for i in range(n)]
    labels = [[str(j + 1) if i == walker and j <= i else "" for j in range(n)] for i in range(n)]
    d.text(x0 + n * cell / 2, 88, "key blocks \u2192", size=14, color=MUTED)
    d.grid(x0, y0, fills, cell=cell, labels=labels, row_labels=[f"q{i}" for i in range(n)], size=15)
    d.rect(x0 - 3, y0 + walker * cell - 3, (walker + 1) * cell + 6, cell + 6, stroke="blue", width=3, rx=2)
    for k, (colour, what) in enumerate((("green", "computed in full"), ("orange", "computed, masked"), ("grey", "skipped"))):
        y = y0 + 14 + k * 34
        d.rect(x0 + n * cell + 16, y, 20, 20, fill=colour, tint=True, stroke=INK, rx=0, width=1)
        d.text(x0 + n * cell + 44, y + 15, what, size=13, anchor="start")
    top = y0 + n * cell
    d.arrow(x0 + (walker + 1) * cell / 2, top + 4, x0 + (walker + 1) * cell / 2, top + 36, color="blue")
    d.rect(20, top + 40, 340, 152, fill="sky", tint=True, stroke="blue", width=2)
    d.text(34, top + 64, "after each tile, per query row:", size=14, anchor="start", color=MUTED)
    _formula_lines(d, top + 90, ("m \u2190 max(m, row max of the tile)", "\u03b1 = e^{old m \u2212 new m}",
                                 "\u2113 \u2190 \u2113 \u00b7 \u03b1 + \u03a3 e^{s \u2212 m}",
                                 "acc \u2190 acc \u00b7 \u03b1 + e^{s \u2212 m} V"))
    d.text(34, top + 184, "then out = acc / \u2113, lse = m + log \u2113", size=14, anchor="start", color=MUTED)
    return d


@diagram
def backward_loop_diagram() -> Diagram:
    """The recomputing backward pass of :func:`attnlib.flash_attention`: key blocks outside, each walking the
    query blocks that see it; what the forward pass saved, and what each tile recomputes and adds."""
    n = DIAGRAM_S // DIAGRAM_BLOCK
    key = 1  # the key block whose walk is numbered
    d = Diagram(
        "ch08_backward_loop", 380, 560, title="The tile loop of the recomputing backward pass",
        alt=(f"The same {n} by {n} grid of causal score tiles, now walked column by column: key block {key} "
             f"visits query blocks {key} to {n - 1} in order (steps 1 to {n - key}). The forward pass saved only the "
             "output O and one logsumexp per query row. Each tile recomputes its scores Z and weights "
             "P = exp(Z \u2212 lse), adds P\u1d40dO into dV of the key block, forms dZ = P \u2218 (dP \u2212 \u0394), "
             "\u2218 being the elementwise product, "
             "adds dZ\u1d40Q into dK of the key block, complete after the walk, and adds dZ K into dQ of the "
             "query block, which sums over all key blocks."))
    d.text(190, 28, "One key block walks its query blocks", size=16, weight="bold")
    d.text(190, 50, f"S = {DIAGRAM_S}, {DIAGRAM_BLOCK}-row blocks, causal", size=14, color=MUTED)
    cell, x0, y0 = 40, 44, 100
    fills = [["green" if j < i else "orange" if j == i else "grey" for j in range(n)] for i in range(n)]
    labels = [[str(i - key + 1) if j == key and i >= key else "" for j in range(n)] for i in range(n)]
    d.text(x0 + n * cell / 2, 88, "key blocks \u2192", size=14, color=MUTED)
    d.grid(x0, y0, fills, cell=cell, labels=labels, row_labels=[f"q{i}" for i in range(n)], size=15)
    d.rect(x0 + key * cell - 3, y0 + key * cell - 3, cell + 6, (n - key) * cell + 6, stroke="blue", width=3, rx=2)
    d.text(x0 + n * cell + 16, y0 + 20, "saved by the", size=13, anchor="start", color=MUTED)
    d.text(x0 + n * cell + 16, y0 + 38, "forward pass:", size=13, anchor="start", color=MUTED)
    d.text(x0 + n * cell + 16, y0 + 60, "O, and one lse", size=13, anchor="start")
    d.text(x0 + n * cell + 16, y0 + 78, "per query row", size=13, anchor="start")
    top = y0 + n * cell
    d.arrow(x0 + (key + 0.5) * cell, top + 4, x0 + (key + 0.5) * cell, top + 36, color="blue")
    d.rect(14, top + 40, 352, 228, fill="sky", tint=True, stroke="blue", width=2)
    d.text(34, top + 64, "each tile (query block i, key block j):", size=14, anchor="start", color=MUTED)
    _formula_lines(d, top + 90, ("Z = Q\u1d62 K\u2c7c\u1d40 \u00b7 scale   (recomputed)", "P = e^{Z \u2212 lse}   (recomputed)",
                                 "dV\u2c7c += P\u1d40 dO\u1d62,   dP = dO\u1d62 V\u2c7c\u1d40", "dZ = P \u2218 (dP \u2212 \u0394)   (\u2218: elementwise)",
                                 "dK\u2c7c += dZ\u1d40 Q\u1d62 \u00b7 scale", "dQ\u1d62 += dZ K\u2c7c \u00b7 scale"))
    d.text(34, top + 236, "dK\u2c7c, dV\u2c7c are complete after the walk;", size=13, anchor="start", color=MUTED)
    d.text(34, top + 256, "dQ\u1d62 sums over all key blocks j", size=13, anchor="start", color=MUTED)
    return d


# ---- diagram: the online softmax's worked example ----------------------------------------------

#: Section 8.3's worked example: one query's six scores and their values (two features each), in two
#: blocks of three keys. The notebook's cell and :func:`online_softmax_diagram` both use these.
ONLINE_SCORES: tuple[float, ...] = (1.0, 3.0, 0.5, 4.0, 2.0, -1.0)
ONLINE_VALUES: tuple[tuple[float, float], ...] = ((1.0, 0.0), (0.0, 1.0), (1.0, 1.0), (2.0, 0.0), (0.0, 2.0),
                                                  (1.0, -1.0))
ONLINE_BLOCK = 3


def _online_steps() -> list[dict[str, Any]]:
    """The running statistics after each block of the worked example, in float64 as in the notebook."""
    s = torch.tensor(ONLINE_SCORES, dtype=torch.float64)
    v = torch.tensor(ONLINE_VALUES, dtype=torch.float64)
    m, l, a, steps = float("-inf"), 0.0, torch.zeros(v.shape[1], dtype=torch.float64), []
    for start in range(0, len(ONLINE_SCORES), ONLINE_BLOCK):
        blk = slice(start, start + ONLINE_BLOCK)
        m_new = max(m, s[blk].max().item())
        rescale = math.exp(m - m_new)
        p = torch.exp(s[blk] - m_new)
        l_old, a_old = l, a
        l, a = l * rescale + p.sum().item(), a * rescale + p @ v[blk]
        steps.append(dict(m_old=m, m_new=m_new, rescale=rescale, p=p.tolist(), l_old=l_old,
                          a_old=a_old.tolist(), l=l, a=a.tolist()))
        m = m_new
    return steps


def _num(x: float) -> str:
    """A number as the notebook prints it (``round(x, 4)``), minus written as a minus sign."""
    r = round(x, 4)
    return (str(int(r)) if r == int(r) else str(r)).replace("-", "\u2212")


def _vec(xs: Sequence[float]) -> str:
    return "[" + ", ".join(_num(x) for x in xs) + "]"


@diagram
def online_softmax_diagram() -> Diagram:
    """Section 8.3's worked example: the two blocks, the maximum going from 3 to 4, the rescale factor
    applied to what was summed, and the new block's terms taken against the new maximum."""
    first, second = _online_steps()
    s = ONLINE_SCORES
    out = [x / second["l"] for x in second["a"]]
    m1, m2, r = _num(first["m_new"]), _num(second["m_new"]), _num(second["rescale"])
    def pair(xs: Sequence[float]) -> str:  # a vector in the alt text, which cannot hold square brackets
        return "(" + ", ".join(_num(x) for x in xs) + ")"

    d = Diagram(
        "ch08_online_softmax", 358, 560, title="The online softmax on two blocks of keys",
        alt=(f"One query's six scores, {', '.join(_num(x) for x in s)}, in two blocks of {ONLINE_BLOCK}. "
             f"Block 1: the maximum goes from minus infinity to {m1}; the exponentials e^(s \u2212 {m1}) are "
             f"{', '.join(_num(x) for x in first['p'])}, so \u2113 = {_num(first['l'])} and a = {pair(first['a'])}. "
             f"Block 2 holds a {m2}: the maximum goes from {m1} to {m2}, so the old \u2113 and a are multiplied by "
             f"e^({m1} \u2212 {m2}) = {r}, and the new exponentials e^(s \u2212 {m2}) = "
             f"{', '.join(_num(x) for x in second['p'])} are added: \u2113 = {_num(second['l'])}, "
             f"a = {pair(second['a'])}. The output a / \u2113 = {pair(out)} equals softmax(s) @ v."))
    d.text(179, 28, "The online softmax, block by block", size=16, weight="bold")
    d.text(179, 50, f"one query, {len(s)} scores s, blocks of {ONLINE_BLOCK} keys", size=14, color=MUTED)
    cell, gap, y0 = 44, 14, 76
    x0 = (358 - 6 * cell - gap) / 2
    for k, x in enumerate(s):
        colour = "sky" if k < ONLINE_BLOCK else "orange"
        cx = x0 + k * cell + (gap if k >= ONLINE_BLOCK else 0)
        d.rect(cx, y0, cell, cell, fill=colour, tint=True, stroke=INK, rx=0, width=1)
        d.text(cx + cell / 2, y0 + cell / 2 + 5, _num(x), size=15)
    d.text(x0 + 1.5 * cell, y0 + cell + 20, "block 1", size=14, color=MUTED)
    d.text(x0 + 4.5 * cell + gap, y0 + cell + 20, "block 2", size=14, color=MUTED)

    def lines(y: float, rows: tuple[str, ...]) -> None:
        for k, line in enumerate(rows):
            d.text(22, y + 23 * k, line, size=14, anchor="start")

    top = y0 + cell + 34
    d.rect(10, top, 338, 104, fill="sky", tint=True, stroke="blue", width=2)
    d.text(22, top + 22, f"block 1: m = \u2212\u221e \u2192 {m1}", size=14, anchor="start", weight="bold")
    lines(top + 46, (f"e^{{s \u2212 {m1}}} = {', '.join(_num(x) for x in first['p'])}",
                     f"\u2113 = {_num(first['l'])}",
                     f"a = \u03a3 e^{{s \u2212 {m1}}} v = {_vec(first['a'])}"))
    mid = top + 104
    d.arrow(50, mid + 4, 50, mid + 34, color="vermillion")
    d.text(64, mid + 24, f"max grows: \u00d7 e^{{{m1} \u2212 {m2}}} = {r}", size=14, anchor="start",
           color="vermillion")
    top2 = mid + 40
    d.rect(10, top2, 338, 196, fill="orange", tint=True, stroke="orange", width=2)
    d.text(22, top2 + 22, f"block 2: m = {m1} \u2192 {m2}", size=14, anchor="start", weight="bold")
    lines(top2 + 46, (f"e^{{s \u2212 {m2}}} = {', '.join(_num(x) for x in second['p'])}",
                      f"\u2113 = {_num(second['l_old'])} \u00b7 {r} + \u03a3 e^{{s \u2212 {m2}}}",
                      f"   = {_num(second['l'])}",
                      f"a = {_vec(second['a_old'])} \u00b7 {r}",
                      f"      + \u03a3 e^{{s \u2212 {m2}}} v",
                      f"   = {_vec(second['a'])}",
                      ))
    d.text(179, top2 + 226, f"o = a / \u2113 = {_vec(out)}", size=15, weight="bold")
    d.text(179, top2 + 248, "= softmax(s) @ v, exactly", size=14, color=MUTED)
    return d
