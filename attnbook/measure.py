"""Measuring what attention costs on this machine: wall time, peak memory, saved tensors, ATen ops.

Unlike :mod:`attnlib.cost`, which counts, these functions *measure*: timings and peak memory
depend on the machine and its load (the book prints them with a leading ``~``). The saved-tensor
bytes and the op trace are exact for a given PyTorch build, but depend on which kernels run.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

__all__ = [
    "saved_tensor_bytes", "peak_memory_bytes", "peak_tensor_bytes", "median_seconds", "interleaved_median_ms", "aten_ops_called",
    "matmul_gflops",
]


def saved_tensor_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, int]:
    """What autograd keeps from ``fn(*args, **kwargs)`` for the backward pass, in bytes.

    Every tensor saved for backward is recorded (with ``torch.autograd.graph.saved_tensors_hooks``);
    tensors that share storage (views of the same memory) are counted once. A saved tensor is an
    **activation** when its memory was allocated by an operation that ran during the call (recorded
    with a ``TorchDispatchMode``); everything else existed before the call and exists anyway: the
    inputs, every parameter and buffer (of a module passed as ``fn``, of one captured by a lambda,
    or a view such as ``weight.t()`` that a linear layer saves), and any other tensor the caller
    made earlier. This is exact, not a timing-style measurement: it is the activation memory one
    training step holds between forward and backward, for the kernels that ran.

    Returns:
        ``{"activations": bytes, "params_and_inputs": bytes of the saved tensors that existed
        before the call, "largest": bytes of the largest activation, "count": number of distinct
        activation storages}``.

    >>> lin = torch.nn.Linear(256, 256)
    >>> x = torch.randn(4, 256, requires_grad=True)
    >>> r = saved_tensor_bytes(lambda t: torch.relu(lin(t)), x)  # a lambda: lin.weight is still not an activation
    >>> r["activations"] == 4 * 256 * 4, r["params_and_inputs"] == (256 * 256 + 4 * 256) * 4
    (True, True)
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    created: set[int] = set()  # storages that an operation of this call allocated

    def ptrs(tree: Any) -> set[int]:
        return {t.untyped_storage().data_ptr() for t in tree_leaves(tree) if isinstance(t, Tensor)}

    class _RecordAllocations(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            created.update(ptrs(out) - ptrs((args, kwargs)))  # a view or in-place result is not new memory
            return out

    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.enable_grad(), _RecordAllocations():
        fn(*args, **kwargs)
    acts = {ptr: n for ptr, n in seen.items() if ptr in created}
    return {
        "activations": sum(acts.values()),
        "params_and_inputs": sum(n for ptr, n in seen.items() if ptr not in created),
        "largest": max(acts.values(), default=0),
        "count": len(acts),
    }


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


def peak_tensor_bytes(fn: Callable[[], Any]) -> int:
    """Most bytes of tensors that ``fn()`` allocates and holds at once, on any device.

    Every operation of the call is recorded (with a ``TorchDispatchMode``); a tensor whose memory
    an operation allocated counts from that operation until the last tensor using the memory is
    gone (views share it and count once). Memory that existed before the call (inputs, parameters)
    does not count; the result of ``fn()`` does. This is exact and the same on every machine: it
    counts the tensors PyTorch hands out, not what an allocator or the operating system keeps
    around them, nor scratch space a kernel uses internally.

    >>> peak_tensor_bytes(lambda: torch.ones(256) * 2)  # two 1 KiB tensors exist at once
    2048
    """
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    live: dict[int, tuple[int, list[weakref.ref[Tensor]]]] = {}  # data_ptr -> (bytes, tensors using it)
    peak = 0

    def held() -> int:
        for ptr in [p for p, (_, refs) in live.items() if all(r() is None for r in refs)]:
            del live[ptr]  # every tensor on this memory is gone: it was freed
        return sum(n for n, _ in live.values())

    class _Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            nonlocal peak
            out = func(*args, **(kwargs or {}))
            before = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
            held()
            for t in tree_leaves(out):
                if not isinstance(t, Tensor):
                    continue
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr in live:
                    live[ptr][1].append(weakref.ref(t))  # a view of memory this call allocated
                elif ptr not in before:  # new memory (a view or in-place result of an input is not)
                    live[ptr] = (storage.nbytes(), [weakref.ref(t)])
            peak = max(peak, held())
            return out

    with _Track():
        result = fn()
    del result
    return peak


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

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
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


def matmul_gflops(n: int = 2048, device: torch.device | str = "cpu") -> float:
    """The device's speed on one large float32 matrix product ``[n, n] @ [n, n]``, in GFLOP/s (a measurement).

    The yardstick the book sets attention timings against: what this machine does at its best.
    """
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    return 2 * n**3 / median_seconds(lambda: a @ b, repeats=5, device=device) / 1e9

