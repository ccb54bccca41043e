"""Input validation for attnlib, out of the reading path. Each check raises ``ValueError`` naming
what it got and what it expected. Checks of tensor *values* are skipped while ``torch.compile`` or
``torch.export`` traces, so no traced path branches on data."""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Callable

import numpy as np
import torch
from torch import Tensor

MASK_HINT = (
    "convert a Hugging Face 1/0 mask with attnlib.padding_mask(m), nn.MultiheadAttention's "
    "key_padding_mask (True = ignore) with attnlib.from_key_padding_mask(m), an additive float mask "
    "(0 = keep, -inf = hide) with attnlib.from_additive_mask(m)"
)


def tracing() -> bool:
    """True while torch.compile or torch.export traces: value-dependent checks must stay out."""
    return torch.compiler.is_compiling()


def shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def is_int(value: object) -> bool:
    """An ``int``, NumPy integer or symbolic size (under torch.export), but not a bool."""
    return isinstance(value, (numbers.Integral, torch.SymInt)) and not isinstance(value, (bool, np.bool_))


def positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    if not is_int(value) or value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value if isinstance(value, torch.SymInt) else int(value)


def head_counts(d_model: object, num_heads: object, num_kv_heads: object = None) -> tuple[int, int, int]:
    """``(D, H, H_kv)`` of a multi-head block: ``H`` divides ``D``, ``H_kv`` (default ``H``) divides ``H``."""
    D, H = positive_int("d_model", d_model), positive_int("num_heads", num_heads)
    H_kv = H if num_kv_heads is None else positive_int("num_kv_heads", num_kv_heads)
    if D % H != 0:
        raise ValueError(f"d_model = {D} is not divisible by num_heads = {H}")
    if H % H_kv != 0:
        raise ValueError(f"num_heads = {H} is not a multiple of num_kv_heads = {H_kv}")
    return D, H, H_kv


def positive_scalar(name: str, value: object) -> float | Tensor:
    """A finite real number > 0; a 0-d tensor comes back as it is, so gradients can flow into it."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, Tensor):
        if value.dim() != 0 or value.dtype == torch.bool or value.is_complex():
            raise ValueError(f"{name} must be a real 0-d tensor, got shape {shape(value)} and dtype {value.dtype}")
        if tracing() or value.device.type == "meta":
            return value
        number = float(value.detach())
    elif isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(
            f"{name} must be a real number (int, float, NumPy scalar or 0-d tensor), got {type(value).__name__} {value!r}"
        )
    else:
        number = value = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {number!r}")
    return value


def constant_scalar(name: str, value: object) -> float:
    """A real number > 0 as a float; a 0-d tensor that requires grad is refused (no gradient would reach it)."""
    value = positive_scalar(name, value)
    if isinstance(value, Tensor) and value.requires_grad:
        raise ValueError(f"{name} is a tensor that requires grad, but no gradient flows to it here; pass {name}.detach() or a float")
    return float(value)


def flag(name: str, value: object, hint: str = "") -> bool:
    """``True`` or ``False`` (a Python or NumPy bool); anything else is refused."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {type(value).__name__}{hint}")
    return bool(value)


def float_tensor(name: str, t: object, *, min_dim: int = 0) -> Tensor:
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dims, got shape {shape(t)}")
    return t


def tensor_with_dims(name: str, t: object, dims: int, layout: str) -> Tensor:
    """A tensor with exactly ``dims`` dims; ``layout`` names them, e.g. ``"[B, S, D]"``."""
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor {layout}, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {layout} ({dims} dims), got shape {shape(t)}")
    return t


def dim_index(t: Tensor, dim: object) -> int:
    """A valid axis of ``t`` (negative counts from the end)."""
    n = max(t.dim(), 1)
    if not is_int(dim) or not -n <= dim < n:
        raise ValueError(f"dim {dim!r} is out of range for a tensor of shape {shape(t)}")
    return int(dim)


def qkv(q: Tensor, k: Tensor, v: Tensor, mask: object = None) -> None:
    """Queries ``[..., S_q, D_k]``, keys ``[..., S_k, D_k]``, values ``[..., S_k, D_v]``, optional mask."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        float_tensor(name, t, min_dim=2)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got q {q.device}, k {k.device}, v {v.device}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dim D_k: got q {shape(q)} [..., S_q, D_k] and k {shape(k)} [..., S_k, D_k]"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of positions S_k: got k {shape(k)} [..., S_k, D_k] and v {shape(v)} [..., S_k, D_v]"
        )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(f"q, k, v must share their leading (batch, head) dims: got q {shape(q)}, k {shape(k)}, v {shape(v)}")
    if mask is not None:
        mask_for(mask, (*shape(q)[:-1], k.shape[-2]), q.device)


def bool_mask(mask: object, name: str = "mask") -> Tensor:
    """A ``torch.bool`` tensor; anything else is refused with the converter to use."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"{name} must be a torch.bool tensor (True = may attend), got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise ValueError(f"{name} must have dtype torch.bool (True = may attend), got {mask.dtype}; {MASK_HINT}")
    return mask


def mask_for(mask: object, scores_shape: tuple[int, ...], device: torch.device) -> Tensor:
    """A bool mask that broadcasts to the scores ``[..., S_q, S_k]`` without growing them."""
    mask = bool_mask(mask)
    if mask.device != device:
        raise ValueError(f"mask is on {mask.device} but the scores are on {device}")
    try:
        broadcast = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != torch.Size(scores_shape):
        raise ValueError(f"mask shape {shape(mask)} cannot broadcast to scores {tuple(scores_shape)}")
    return mask


def only_values(name: str, t: Tensor, allowed: Callable[[Tensor], Tensor], expected: str, hint: str = "") -> None:
    """Every entry of ``t`` passes ``allowed`` (a value check: skipped while tracing)."""
    if tracing():
        return
    bad = ~allowed(t)
    if bool(bad.any()):
        values = sorted({float(x) for x in t[bad].flatten()[:5].tolist()})
        raise ValueError(f"{name} must hold only {expected}, found {values}{hint}")


def warn_empty_sequences(keep: Tensor, source: str) -> None:
    """Warn when a sequence of a ``[B, S]`` key mask lets nothing through: an inverted mask does that."""
    if tracing() or keep.numel() == 0:
        return
    empty = (~keep.any(dim=-1)).nonzero().flatten().tolist()
    if empty:
        warnings.warn(
            f"{source}: sequence(s) {empty[:10]} have no key left to attend to, so their outputs are all zero. "
            "If this mask came from nn.MultiheadAttention's key_padding_mask (True = ignore), convert it with "
            "attnlib.from_key_padding_mask(m); attnlib's padding_mask expects 1 = real token, 0 = padding.",
            UserWarning,
            stacklevel=3,
        )


def module_inputs(x: object, attention_mask: object, d_model: int, weight: Tensor, past: int = 0) -> Tensor:
    """Token vectors ``[B, S, D]`` matching a module's weights, and an optional ``[B, past + S]`` mask
    (``past``: the positions a KV cache has already seen)."""
    x = tensor_with_dims("hidden_states", x, 3, f"[B, S, D] with D = {d_model}")
    if x.shape[-1] != d_model:
        raise ValueError(f"hidden_states last dim is {x.shape[-1]} but d_model = {d_model} (got shape {shape(x)})")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise ValueError(
            f"hidden_states is {x.dtype} on {x.device} but the module's weights are "
            f"{weight.dtype} on {weight.device}; use module.to(...) or hidden_states.to(...)"
        )
    if attention_mask is not None:
        B, S = shape(x)[:2]
        expected, what = (B, past + S), "hidden_states [B, S]" if not past else f"[B, cache.length + S] = [{B}, {past} + {S}]"
        m = tensor_with_dims("attention_mask", attention_mask, 2, f"[B, S] = {expected}")
        if shape(m) != expected:
            raise ValueError(f"attention_mask shape {shape(m)} does not match {what} = {expected}")
        if m.device != x.device:
            raise ValueError(f"attention_mask is on {m.device} but hidden_states is on {x.device}")
    return x


def cache_entries(new: tuple[Tensor, ...], cached: list[Tensor]) -> None:
    """New cache entries ``[B, H_kv, S_new, D_k]`` that match each other and what is cached."""
    if not new:
        raise ValueError("cache.update needs at least one tensor [B, H_kv, S_new, D_k], got none")
    for t in new:
        tensor_with_dims("cache entry", t, 4, "[B, H_kv, S_new, D_k]")
    if len({(shape(t)[:3], t.dtype, t.device) for t in new}) != 1:
        got = [f"{shape(t)} {t.dtype} {t.device}" for t in new]
        raise ValueError(f"keys and values must share B, H_kv, S_new, dtype and device, got {got}")
    if cached and cached[0].shape[0] != new[0].shape[0]:
        raise ValueError(f"batch size changed mid-sequence: the cache holds B = {cached[0].shape[0]}, the new positions have B = {new[0].shape[0]}")
    if cached and [(t.shape[:2], t.shape[3:], t.dtype, t.device) for t in new] != [(b.shape[:2], b.shape[3:], b.dtype, b.device) for b in cached]:
        got, held = ([f"{shape(t)[:2] + shape(t)[3:]} {t.dtype} {t.device}" for t in ts] for ts in (new, cached))
        raise ValueError(
            f"new entries ([B, H_kv, D_k] dtype device) {got} do not match the cached {held}; "
            "a KVCache holds one layer's sequences of one batch: start a new KVCache()"
        )


def instance(name: str, value: object, cls: type, what: str) -> None:
    if not isinstance(value, cls):
        raise ValueError(f"{name} must be {what}, got {type(value).__name__}")


def block_in_use(block: object, ref_count: list[int], action: str) -> int:
    """A block index of a pool that some sequence holds (a free block cannot be shared or released)."""
    if not is_int(block) or not 0 <= block < len(ref_count):
        raise ValueError(f"block must be an int in 0..{len(ref_count) - 1} (the pool's blocks), got {block!r}")
    if ref_count[block] <= 0:
        raise ValueError(f"cannot {action} block {block}: it is free (never allocated, or released by every holder)")
    return int(block)


def kv_pair(k: object, v: object) -> None:
    """One sequence's keys and values ``[H_kv, S, D_k]``: same shape, dtype and device."""
    for name, t in (("k", k), ("v", v)):
        float_tensor(name, tensor_with_dims(name, t, 3, "[H_kv, S, D_k]"))
    if (shape(k), k.dtype, k.device) != (shape(v), v.dtype, v.device):
        raise ValueError(f"k and v must share shape [H_kv, S, D_k], dtype and device, got k {shape(k)} {k.dtype} "
                         f"{k.device} and v {shape(v)} {v.dtype} {v.device}")


def paged_entries(k: object, v: object, store: Tensor) -> None:
    """New keys and values ``[H_kv, S_new, D_k]`` for a block pool ``store [H_kv, N, b, D_k]``: no broadcasting."""
    kv_pair(k, v)
    expected = f"[H_kv, S_new, D_k] = [{store.shape[0]}, S_new, {store.shape[-1]}]"
    if (k.shape[0], k.shape[2]) != (store.shape[0], store.shape[-1]):
        raise ValueError(f"k and v have shape {shape(k)} but the pool holds {expected}")
    if (k.dtype, k.device) != (store.dtype, store.device):
        raise ValueError(f"k and v are {k.dtype} on {k.device} but the pool holds {store.dtype} on {store.device}")


def single_sequence(k: object, v: object) -> None:
    """``[1, H_kv, S_new, D_k]``: a paged cache holds one sequence."""
    for name, t in (("k", k), ("v", v)):
        if tensor_with_dims(name, t, 4, "[1, H_kv, S_new, D_k]").shape[0] != 1:
            raise ValueError(f"{name} has batch B = {t.shape[0]} (shape {shape(t)}) but a paged cache holds one sequence: "
                             "use one PagedKVCache per sequence")


def gqa_query(q: object, keys: Tensor, S: int, *, one_query: bool = False) -> None:
    """Queries ``[H, S_new, D_k]``, the last ``S_new`` of ``S`` positions, over keys ``[H_kv, ..., D_k]``."""
    H_kv, D_k = keys.shape[0], keys.shape[-1]
    layout = f"[H, {'1' if one_query else 'S_new'}, D_k] with H a multiple of H_kv = {H_kv} and D_k = {D_k}"
    tensor_with_dims("q", q, 3, layout)
    if q.shape[0] % H_kv or q.shape[2] != D_k or (one_query and q.shape[1] != 1):
        raise ValueError(f"q shape {shape(q)} does not fit: expected {layout}")
    if (q.dtype, q.device) != (keys.dtype, keys.device):
        raise ValueError(f"q is {q.dtype} on {q.device} but the keys are {keys.dtype} on {keys.device}")
    if not 1 <= q.shape[1] <= S:
        raise ValueError(f"q has S_new = {q.shape[1]} queries for the last of the {S} cached positions; expected 1..{S}")
