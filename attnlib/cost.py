"""Counting what attention costs: parameters, FLOPs and the bytes of the attention weights.

Everything here is exact and machine independent (a count, not a measurement), except
:func:`saved_tensor_bytes`, which reports what autograd actually keeps for one forward pass
(also exact for a given PyTorch build, but it depends on which kernels run).

Shapes: ``B`` batch, ``S`` positions, ``D = d_model``, ``H`` query heads, ``H_kv`` key/value heads.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

__all__ = [
    "mha_param_count",
    "mha_matmul_flops",
    "count_flops",
    "flops_by_op",
    "attention_weights_bytes",
    "saved_tensor_bytes",
    "kv_cache_bytes",
    "peak_memory_bytes",
    "median_seconds",
    "aten_ops_called",
]


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def mha_param_count(d_model: int, num_heads: int, bias: bool = True, num_kv_heads: int | None = None) -> int:
    """Parameters of one multi-head attention block (``w_q``, ``w_k``, ``w_v``, ``w_o``).

    With ``H_kv = H`` (classic multi-head attention) this is ``4 D^2 + 4 D`` with biases and
    ``4 D^2`` without: it does not depend on ``H``. With fewer key/value heads
    (``D_k = D / H``) the key and value projections shrink to ``D x H_kv D_k`` each.

    Args:
        d_model: ``D``.
        num_heads: ``H``; must divide ``D``.
        bias: whether the four projections have biases.
        num_kv_heads: ``H_kv`` (default ``H``); must divide ``H``.

    Returns:
        The number of scalars, as ``sum(p.numel() for p in MultiHeadSelfAttention(...).parameters())``.
    """
    D = _positive_int("d_model", d_model)
    H = _positive_int("num_heads", num_heads)
    H_kv = H if num_kv_heads is None else _positive_int("num_kv_heads", num_kv_heads)
    if D % H:
        raise ValueError(f"d_model = {D} is not divisible by num_heads = {H}")
    if H % H_kv:
        raise ValueError(f"num_heads = {H} is not a multiple of num_kv_heads = {H_kv}")
    kv_width = H_kv * (D // H)
    weights = D * D + 2 * D * kv_width + D * D  # w_q, w_k + w_v, w_o
    biases = (D + 2 * kv_width + D) if bias else 0
    return weights + biases


def mha_matmul_flops(batch: int, seq_len: int, d_model: int) -> int:
    """FLOPs of the matrix multiplications of one self-attention forward pass (``H_kv = H``).

    Counts a multiply-add as 2 FLOPs, as ``torch.utils.flop_counter.FlopCounterMode`` does:
    four projections ``4 * 2 B S D^2`` plus ``Q K^T`` and ``weights @ V``, ``2 * 2 B S^2 D``.
    ``H`` does not appear. Biases, scaling, masking and softmax (elementwise work that grows as
    ``B H S^2``) are not included.
    """
    B = _positive_int("batch", batch)
    S = _positive_int("seq_len", seq_len)
    D = _positive_int("d_model", d_model)
    return 8 * B * S * D * D + 4 * B * S * S * D


def flops_by_op(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, int]:
    """Run ``fn(*args, **kwargs)`` under ``FlopCounterMode`` and return FLOPs per ATen op.

    Only ops with a registered FLOP formula (matmuls, convolutions, some attention kernels) are
    counted; elementwise ops (softmax, division, masking) count as 0. Runs under ``no_grad``.

    Returns:
        e.g. ``{"aten.addmm": 536870912, "aten.bmm": 134217728}``.
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        fn(*args, **kwargs)
    return {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}


def count_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Total FLOPs that ``FlopCounterMode`` sees for ``fn(*args, **kwargs)`` (see :func:`flops_by_op`)."""
    return sum(flops_by_op(fn, *args, **kwargs).values())


_DTYPE_BYTES = {torch.float64: 8, torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}


def attention_weights_bytes(
    batch: int, num_heads: int, seq_len: int, dtype: torch.dtype = torch.float32, *, seq_len_k: int | None = None
) -> int:
    """Bytes of a materialised ``[B, H, S_q, S_k]`` attention-weights tensor (``S_k = S_q`` by default)."""
    B = _positive_int("batch", batch)
    H = _positive_int("num_heads", num_heads)
    S_q = _positive_int("seq_len", seq_len)
    S_k = S_q if seq_len_k is None else _positive_int("seq_len_k", seq_len_k)
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(map(str, _DTYPE_BYTES))}, got {dtype!r}")
    return B * H * S_q * S_k * _DTYPE_BYTES[dtype]


def saved_tensor_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, int]:
    """What autograd keeps from ``fn(*args, **kwargs)`` for the backward pass, in bytes.

    Every tensor saved for backward is recorded (with ``torch.autograd.graph.saved_tensors_hooks``);
    tensors that share storage (views of the same memory, the parameters) are counted once.
    Parameters and the inputs ``args`` themselves are reported separately, since they exist
    anyway. This is exact, not a timing-style measurement: it is the activation memory one
    training step holds between forward and backward for this module, for the kernels that ran.

    Returns:
        ``{"activations": bytes, "params_and_inputs": bytes, "largest": bytes of the largest
        activation, "count": number of distinct activation storages}``.
    """
    existing: set[int] = set()
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, Tensor):
            existing.add(a.untyped_storage().data_ptr())
    owner = getattr(fn, "parameters", None)
    if callable(owner):
        existing.update(p.untyped_storage().data_ptr() for p in owner())
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.enable_grad():
        fn(*args, **kwargs)
    acts = {ptr: n for ptr, n in seen.items() if ptr not in existing}
    return {
        "activations": sum(acts.values()),
        "params_and_inputs": sum(n for ptr, n in seen.items() if ptr in existing),
        "largest": max(acts.values(), default=0),
        "count": len(acts),
    }


# --- KV cache and measurement helpers (chapter 8) ---------------------------------------------


def kv_cache_bytes(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    seq_len: int = 1,
    batch: int = 1,
    dtype_bytes: int = 2,
) -> int:
    """Bytes a decoder's KV cache holds: keys **and** values of every layer, KV head and position.

    ``2 (K and V) * layers * H_kv * D_k * S * B * bytes per number``. Only the key/value heads
    count: with grouped-query attention several query heads read the same cached head, so
    ``H_kv`` (not the number of query heads ``H``) sets the size. ``seq_len=1, batch=1`` gives
    the bytes per token.

    Args:
        num_layers: attention layers, each with its own cache.
        num_kv_heads: ``H_kv`` (``= H`` for multi-head, ``1`` for multi-query attention).
        head_dim: ``D_k``, the width of one key (and one value) vector.
        seq_len: cached positions ``S``.
        batch: sequences ``B`` decoded together.
        dtype_bytes: bytes per number (2 for float16/bfloat16, 4 for float32, 1 for 8-bit).

    Returns:
        The size in bytes (an exact count).

    Example:
        Llama 2 7B (32 layers, 32 heads of width 128, float16): ``kv_cache_bytes(32, 32, 128)``
        is 524288 bytes = 0.5 MiB per token.
    """
    args = dict(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, seq_len=seq_len,
                batch=batch, dtype_bytes=dtype_bytes)
    for name, value in args.items():
        _positive_int(name, value)
    return 2 * num_layers * num_kv_heads * head_dim * seq_len * batch * dtype_bytes


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # the file reports kB
    raise RuntimeError(f"{field} not found in /proc/self/status")


def peak_memory_bytes(fn: Callable[[], Any], device: torch.device | str = "cpu") -> int | None:
    """Extra memory ``fn()`` needs at its peak, above what was in use just before the call.

    * CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak, minus the bytes
      allocated before: exactly the tensors PyTorch's allocator handed out.
    * CPU (Linux): the process's peak resident memory (``VmHWM`` in ``/proc/self/status``, reset
      by writing 5 to ``/proc/self/clear_refs``) minus the resident memory before the call. This is
      physical memory actually touched; memory that the allocator reuses from pages that were
      already resident does not show up, so small buffers can read as 0 (a lower bound).

    The result of ``fn()`` is dropped before returning, but it counts at the peak.

    Returns:
        Bytes, or ``None`` where the platform offers no such measurement (CPU off Linux, MPS).
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        del result
        return peak - before
    if device.type != "cpu":
        return None
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # resets VmHWM (peak RSS) to the current RSS
        before = _rss_bytes("VmRSS")
    except OSError:
        return None
    result = fn()
    peak = _rss_bytes("VmHWM")
    del result
    return max(peak - before, 0)


def median_seconds(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1,
                   device: torch.device | str = "cpu") -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs.

    The median resists the odd slow run on a shared machine. On CUDA the device is synchronised
    around each run so the time covers the kernels, not just their launch. (One callable of
    :func:`interleaved_median_ms`, in seconds.)
    """
    return interleaved_median_ms({"fn": fn}, repeats=repeats, warmup=warmup, device=device)["fn"] / 1000.0


def interleaved_median_ms(
    fns: dict[str, Callable[[], Any]],
    *,
    repeats: int = 15,
    warmup: int = 2,
    device: torch.device | str | None = None,
    clock: Callable[[], float] | None = None,
) -> dict[str, float]:
    """Median wall time, in milliseconds, of each zero-argument callable in ``fns``.

    The callables take turns (round robin), so a burst of load from other processes on a
    shared machine hits all of them alike instead of spoiling one. On CUDA the device is
    synchronised around each call. This is a measurement: print it with the book's ``~``.

    Args:
        fns: name -> callable to time.
        repeats: timed calls per callable (the median is taken).
        warmup: untimed calls per callable first.
        device: the device the work runs on (synchronised when it is CUDA or MPS).
        clock: seconds counter, default ``time.perf_counter`` (wall time). ``time.thread_time``
            (CPU time of this thread) resists load from other programs when torch runs one thread.

    Returns:
        name -> median milliseconds.
    """
    import statistics
    import time

    _positive_int("repeats", repeats)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    kind = torch.device(device).type if device is not None else "cpu"
    clock = time.perf_counter if clock is None else clock

    def sync() -> None:
        if kind == "cuda":
            torch.cuda.synchronize()
        elif kind == "mps":
            torch.mps.synchronize()

    for _ in range(warmup):
        for fn in fns.values():
            fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            start = clock()
            fn()
            sync()
            times[name].append((clock() - start) * 1000.0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def aten_ops_called(fn: Callable[[], Any]) -> list[str]:
    """The ATen operators that ``fn()`` dispatches to, in call order (e.g. ``"aten.bmm.default"``).

    Shows which kernel a composite function such as ``F.scaled_dot_product_attention`` really
    ran (``aten._scaled_dot_product_flash_attention_for_cpu`` or the ``bmm``/``_safe_softmax``
    steps of the math backend). Uses a ``TorchDispatchMode``, so it prints nothing and needs no
    profiler.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[str] = []

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            calls.append(str(func))
            return func(*args, **(kwargs or {}))

    with _Record():
        fn()
    return calls
