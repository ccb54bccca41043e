"""The KV cache of one attention layer: the keys and values of every position seen so far.

Growth: one buffer per tensor whose capacity doubles when full, so appending ``n`` positions one
at a time copies ``O(n)`` numbers in total (``torch.cat`` on every step: ``O(n^2)``). A sliding
window keeps the last ``window`` positions in a buffer of at least ``2 * window`` once full, moved
to the front when full: at most one copy per appended position, whatever ``window``.

* **Autograd.** Under ``torch.no_grad()``/``torch.inference_mode()`` (decoding), or for tensors
  that need no gradient, the cache writes into its buffers in place. Keys and values that require
  grad are appended with ``torch.cat``, so gradients reach those of earlier calls: training through
  a cache gives the gradients of one pass, at the price of a copy of the cache per call.
* **Modes.** A cache filled under ``inference_mode`` works outside it and the other way round
  (the first call in the new mode copies the cache once).
* **Sharing.** The first layer that stores into a cache owns it; any other layer, even of the same
  shape, is refused: one ``KVCache`` per layer.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from . import _checks

__all__ = ["KVCache"]


class KVCache:
    """Keys and values of one layer, appended to as a sequence is decoded.

    Pass an empty ``KVCache()`` to the layer's ``forward(..., cache=cache)`` once per call; the
    first call (the prompt, *prefill*) fills it, each later call (*decode*) adds its positions.
    See the module docstring for autograd, ``inference_mode`` and sharing.

    Attributes:
        keys, values: ``[B, H_kv, S_cached, D_k]`` (views of the buffers), or ``None`` while empty.
            :class:`attnlib.MultiHeadLatentAttention` stores its latents as ``keys``
            ``[B, 1, S_cached, latent_dim]`` and no ``values``.
        length: positions seen so far (with a window, more than ``S_cached``).
        nbytes: bytes of the cached positions, what :func:`attnlib.kv_cache_bytes` counts.
        reserved_bytes: bytes the cache's buffers reserve: at most twice ``nbytes`` plus the
            positions of the last call (room to grow), after ``truncate`` at most twice ``nbytes``,
            with a window at most ``2 * window`` positions.

    >>> cache = KVCache()
    >>> k = torch.randn(2, 4, 5, 8)  # [B, H_kv, S, D_k]
    >>> keys, values = cache.update(k, k)
    >>> keys.shape, cache.length, cache.nbytes
    (torch.Size([2, 4, 5, 8]), 5, 2560)
    """

    def __init__(self) -> None:
        self._buffers: list[Tensor] = []
        self._start = self._end = 0  # the cached positions are buffer[:, :, start:end]
        self._writable = False  # whether the buffers are this cache's own, to write into in place
        self._window: int | None = None
        self._owner: weakref.ref | None = None  # the layer that stored something first
        self.length = 0

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

    def held_by(self, layer: object) -> tuple[int, int]:
        """``(length, S_cached)`` for ``layer``; ValueError if another layer filled this cache."""
        if self._owner is not None and self._owner() is not layer:
            raise ValueError(f"this KVCache holds the keys and values of another layer, not this {type(layer).__name__}; "
                             "use one KVCache per layer")
        return self.length, self._end - self._start

    def update(self, *new: Tensor, window: int | None = None, owner: object = None) -> tuple[Tensor, ...]:
        """Append new positions and return everything the new queries may attend to.

        Args:
            *new: ``[B, H_kv, S_new, D_k]`` tensors (keys and values), all with the same ``S_new``.
            window: keep only the last ``window`` positions once the new queries have used them.
            owner: the layer calling (a layer passes itself); another layer is refused afterwards.

        Returns:
            One ``[B, H_kv, S_kept + S_new, D_k]`` view per input: the positions kept from
            earlier calls followed by the new ones. Use it before the next ``update``.
        """
        _checks.cache_entries(new, self._buffers)
        window = None if window is None else _checks.positive_int("window", window)
        if owner is not None:
            self.held_by(owner)
            self._owner = self._owner or weakref.ref(owner)
        n, self._window = new[0].shape[-2], window
        kept = [b[:, :, self._start : self._end] for b in self._buffers]  # [B, H_kv, S_kept, D_k]
        if torch.is_grad_enabled() and any(t.requires_grad for t in (*new, *kept)):  # keep the graph for autograd
            views = tuple(torch.cat([c, t], dim=2) for c, t in zip(kept, new)) if kept else new
            self._buffers, self._start, self._end, self._writable = list(views), 0, views[0].shape[-2], False
        else:
            if not self._fits(n):
                self._make_room(new, n)
            for buffer, t in zip(self._buffers, new):
                buffer[:, :, self._end : self._end + n] = t
            self._end += n
            views = tuple(b[:, :, self._start : self._end] for b in self._buffers)  # [B, H_kv, S_kept + S_new, D_k]
        self.length += n
        if window is not None:
            self._start = max(self._start, self._end - window)  # the rolling buffer drops the oldest
            if self._buffers[0].shape[-2] > 2 * window:  # a long prompt grew it: keep only the window
                self._compact()
        return views

    def truncate(self, length: int) -> None:
        """Roll back to the first ``length`` positions: keep positions ``< length``, forget the rest.

        Speculative decoding appends several drafted tokens, then keeps only those the large model
        accepts. ``length`` must be an int in ``0..self.length``. A windowed cache has dropped its
        oldest positions, so it can roll back only while the next query still finds its window.

        >>> cache = KVCache()
        >>> _ = cache.update(torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4))  # 6 positions
        >>> cache.truncate(4)  # two drafted tokens rejected
        >>> cache.length, cache.keys.shape
        (4, torch.Size([1, 2, 4, 4]))
        """
        if not _checks.is_int(length) or not 0 <= length <= self.length:
            raise ValueError(f"truncate length must be an int in 0..{self.length} (the positions seen), got {length!r}")
        first = self.length - (self._end - self._start)  # the oldest position still held
        needed = 0 if self._window is None else max(0, length - self._window + 1)  # what the next query sees
        if first > min(needed, length):
            raise ValueError(f"this cache (window = {self._window}) holds positions {first}..{self.length - 1}; after "
                             f"rolling back to {length} the next query would need position {needed}, already dropped")
        self._end -= self.length - int(length)
        self.length = int(length)
        if self.reserved_bytes > 2 * self.nbytes:  # a long rollback: give the room back
            self._compact()

    def _compact(self) -> None:  # buffers that hold just the kept positions
        self._buffers = [b[:, :, self._start : self._end].clone() for b in self._buffers]
        self._start, self._end = 0, self._end - self._start

    def __getstate__(self) -> dict:
        """Pickle and deep-copy without the owner (a weak reference to a live layer): the copy is claimed afresh."""
        return {**self.__dict__, "_owner": None}

    def _fits(self, n: int) -> bool:
        """Whether ``n`` positions can be written in place: own buffers with room, usable in this mode."""
        b = self._buffers[0] if self._buffers else None
        return (b is not None and self._writable and self._end + n <= b.shape[-2]
                and (torch.is_inference_mode_enabled() or not b.is_inference()))

    def _make_room(self, new: tuple[Tensor, ...], n: int) -> None:
        """Move the kept positions to the front of fresh buffers with room for ``n`` more (doubling)."""
        kept, w = self._end - self._start, self._window or 0  # a full window: >= 2w, one move per w appends
        capacity = max(self._buffers[0].shape[-2] if self._writable else kept, 1, 2 * w if kept + n > w else 1)
        while kept + n > capacity:
            capacity *= 2
        old = self._buffers or [t[:, :, :0] for t in new]
        fresh = [b.new_empty(*b.shape[:2], capacity, b.shape[-1]) for b in old]
        for b, f in zip(old, fresh):
            f[:, :, :kept] = b[:, :, self._start : self._end]  # [B, H_kv, kept, D_k]
        self._buffers, self._start, self._end, self._writable = fresh, 0, kept, True
