"""The KV cache of one attention layer: the keys and values of every position seen so far.

Growth policy: one preallocated buffer per tensor whose capacity doubles when it is full, so
appending ``n`` positions one at a time copies ``O(n)`` numbers in total; ``torch.cat`` on every
step would copy the whole cache each time, ``O(n^2)``. With a sliding window the cache keeps only
the last ``window`` positions (a rolling buffer); when the buffer is full they are moved to its
front, which again costs ``O(1)`` copies per position on average. Positions stay in order.

Caches are for inference: they store detached tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _checks

__all__ = ["KVCache"]


class KVCache:
    """Keys and values of one layer, appended to as a sequence is decoded.

    Pass an empty ``KVCache()`` to the layer's ``forward(..., cache=cache)`` once per call; the
    first call (the prompt, *prefill*) fills it, each later call (*decode*) adds its positions.

    Attributes:
        keys, values: ``[B, H_kv, S_cached, D_k]`` (views of the buffers), or ``None`` while empty.
            :class:`attnlib.MultiHeadLatentAttention` stores its latents as ``keys``
            ``[B, 1, S_cached, latent_dim]`` and no ``values``.
        length: positions seen so far (with a window, more than ``S_cached``).
        nbytes: bytes of the cached positions, what :func:`attnlib.kv_cache_bytes` counts.
        reserved_bytes: bytes the cache's buffers reserve (room to grow: up to twice ``nbytes``).

    >>> cache = KVCache()
    >>> k = torch.randn(2, 4, 5, 8)  # [B, H_kv, S, D_k]
    >>> keys, values = cache.update(k, k)
    >>> keys.shape, cache.length, cache.nbytes
    (torch.Size([2, 4, 5, 8]), 5, 2560)
    """

    def __init__(self) -> None:
        self._buffers: list[Tensor] = []
        self._start = self._end = 0  # the cached positions are buffer[:, :, start:end]
        self.length = 0
        self.owner: tuple | None = None  # set by the layer that uses the cache first

    def _view(self, i: int) -> Tensor | None:
        return self._buffers[i][:, :, self._start : self._end] if i < len(self._buffers) else None

    @property
    def keys(self) -> Tensor | None:
        return self._view(0)

    @property
    def values(self) -> Tensor | None:
        return self._view(1)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in map(self._view, range(len(self._buffers))) if t is not None)

    @property
    def reserved_bytes(self) -> int:
        return sum(b.untyped_storage().nbytes() for b in self._buffers)

    def truncate(self, length: int) -> None:
        """Roll back to the first ``length`` positions: keep positions ``< length``, forget the rest.

        Speculative decoding appends several drafted tokens, then keeps only those the large model
        accepts. ``length`` must be an int in ``0..self.length``; a windowed cache can roll back only
        as far as the positions it still holds allow.

        >>> cache = KVCache()
        >>> _ = cache.update(torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4))  # 6 positions
        >>> cache.truncate(4)  # two drafted tokens rejected
        >>> cache.length, cache.keys.shape
        (4, torch.Size([1, 2, 4, 4]))
        """
        if not _checks.is_int(length) or not 0 <= length <= self.length:
            raise ValueError(f"truncate length must be an int in 0..{self.length} (the positions seen), got {length!r}")
        first = self.length - (self._end - self._start)  # the oldest position still held
        if length < first:
            raise ValueError(f"this windowed cache holds positions {first}..{self.length - 1}; cannot roll back to {length}")
        self._end -= self.length - int(length)
        self.length = int(length)

    def update(self, *new: Tensor, window: int | None = None) -> tuple[Tensor, ...]:
        """Append new positions and return everything the new queries may attend to.

        Args:
            *new: ``[B, H_kv, S_new, D_k]`` tensors (keys and values), all with the same ``S_new``.
            window: keep only the last ``window`` positions once the new queries have used them.

        Returns:
            One ``[B, H_kv, S_kept + S_new, D_k]`` view per input: the positions kept from
            earlier calls followed by the new ones. Use it before the next ``update``.
        """
        _checks.cache_update(self._buffers, new)
        n = new[0].shape[-2]
        if self._end + n > (self._buffers[0].shape[-2] if self._buffers else 0):
            self._make_room(new, n)
        for buffer, t in zip(self._buffers, new):
            buffer[:, :, self._end : self._end + n] = t.detach()
        self._end += n
        self.length += n
        views = tuple(b[:, :, self._start : self._end] for b in self._buffers)  # [B, H_kv, S_kept + S_new, D_k]
        if window is not None:
            self._start = max(self._start, self._end - window)  # the rolling buffer drops the oldest
        return views

    def _make_room(self, new: tuple[Tensor, ...], n: int) -> None:
        """Move the kept positions to the front of a buffer with room for ``n`` more (doubling)."""
        kept = self._end - self._start
        old = self._buffers or [t.new_empty(*t.shape[:2], 0, t.shape[-1]) for t in new]
        capacity = max(old[0].shape[-2], 1)
        while kept + n > capacity:
            capacity *= 2
        fresh = [b if b.shape[-2] == capacity else b.new_empty(*b.shape[:2], capacity, b.shape[-1]) for b in old]
        for b, f in zip(old, fresh):
            f[:, :, :kept] = b[:, :, self._start : self._end].clone()  # [B, H_kv, kept, D_k]
        self._buffers, self._start, self._end = fresh, 0, kept
