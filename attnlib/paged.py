"""A paged KV cache (vLLM's PagedAttention): one layer's keys and values in fixed-size blocks of a pool.

A sequence's *block table* lists the blocks holding its positions: position ``i`` is in block
``table[i // b]``, slot ``i % b``, so a sequence reserves at most ``b - 1`` positions it does not hold.
Blocks are shared by reference count (parallel samples, a common prefix) and copied on write.

One :class:`PagedKVCache` is one sequence (no batch axis): keys and values ``[H_kv, S, D_k]``,
queries ``[H, S_new, D_k]`` with ``H % H_kv == 0`` (grouped-query attention). A call that raises has
changed nothing (no partial append, no reference count below zero, no block handed out twice): bad
input is a ``ValueError``, a full pool a ``RuntimeError``.

>>> pool = BlockPool(num_blocks=4, block_size=16, num_kv_heads=2, head_dim=8)
>>> seq = PagedKVCache(pool)
>>> seq.append(torch.randn(2, 20, 8), torch.randn(2, 20, 8))  # [H_kv, S_new, D_k]
>>> seq.block_table, seq.length, pool.blocks_in_use
([0, 1], 20, 2)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _checks
from .masks import causal_mask

__all__ = ["BlockPool", "PagedKVCache", "contiguous_attention", "paged_attention", "paged_attention_in_place"]


class BlockPool:
    """The physical memory of one layer: ``num_blocks`` blocks of ``block_size`` positions.

    ``keys``, ``values``: ``[H_kv, N, b, D_k]``; block ``n`` is ``keys[:, n]`` (heads first: a sequence's
    blocks in table order form ``[H_kv, S, D_k]`` with one gather). A block is free until
    :meth:`allocate` hands it out, and free again when every holder has released it.

    >>> pool = BlockPool(2, block_size=4, num_kv_heads=1, head_dim=8)
    >>> a = pool.share(pool.allocate()); pool.release(a); pool.release(a); pool.free_blocks
    2
    >>> pool.release(a)
    Traceback (most recent call last):
    ...
    ValueError: cannot release block 0: it is free (never allocated, or released by every holder)
    """

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        sizes = dict(num_blocks=num_blocks, block_size=block_size, num_kv_heads=num_kv_heads, head_dim=head_dim)
        N, b, H_kv, D_k = (_checks.positive_int(name, value) for name, value in sizes.items())
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.block_size = b
        self.keys = torch.zeros(H_kv, N, b, D_k, dtype=dtype, device=device)  # [H_kv, N, b, D_k]
        self.values = torch.zeros_like(self.keys)  # [H_kv, N, b, D_k]
        self.ref_count = [0] * N
        self._free = list(range(N - 1, -1, -1))  # a stack: block 0 is handed out first
        self.copies = 0  # blocks copied on write

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def blocks_in_use(self) -> int:
        return len(self.ref_count) - len(self._free)

    @property
    def block_bytes(self) -> int:  # one block's keys and values
        return 2 * self.keys[:, 0].nbytes

    def allocate(self) -> int:
        """A free block, now held once; ``RuntimeError`` when every block is in use."""
        if not self._free:
            raise RuntimeError(f"out of KV blocks: all {len(self.ref_count)} are in use")
        block = self._free.pop()
        self.ref_count[block] = 1
        return block

    def share(self, block: int) -> int:
        """One more holder of a block in use (a forked sequence, a cached prefix)."""
        block = _checks.block_in_use(block, self.ref_count, "share")
        self.ref_count[block] += 1
        return block

    def release(self, block: int) -> None:
        """One holder fewer; the last one frees the block."""
        block = _checks.block_in_use(block, self.ref_count, "release")
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self._free.append(block)


class PagedKVCache:
    """One sequence's keys and values in one layer: a block table into a shared :class:`BlockPool`.

    Has the :class:`attnlib.KVCache` calls a decoder uses (``update``, ``length``, ``truncate``) for a
    batch of one sequence, so the same decoding loop runs on either.

    >>> pool = BlockPool(8, block_size=4, num_kv_heads=2, head_dim=8)
    >>> parent = PagedKVCache(pool)
    >>> parent.append(torch.randn(2, 6, 8), torch.randn(2, 6, 8))  # [H_kv, S_new, D_k]: blocks 0, 1
    >>> child = parent.fork()  # shares both blocks
    >>> child.append(torch.randn(2, 1, 8), torch.randn(2, 1, 8))  # copies block 1 before writing
    >>> parent.block_table, child.block_table, pool.copies
    ([0, 1], [0, 2], 1)
    """

    def __init__(self, pool: BlockPool) -> None:
        _checks.instance("pool", pool, BlockPool, "a BlockPool")
        self.pool = pool
        self.block_table: list[int] = []
        self.length = 0

    def fork(self) -> PagedKVCache:
        """A second sequence sharing every block (parallel sampling): no copy until one of them writes."""
        child = PagedKVCache(self.pool)
        child.block_table = [self.pool.share(b) for b in self.block_table]
        child.length = self.length
        return child

    def append(self, k: Tensor, v: Tensor) -> None:
        """Write ``k``, ``v`` ``[H_kv, S_new, D_k]`` after the cached positions (all or nothing)."""
        _checks.paged_entries(k, v, self.pool.keys)
        n, b, pool = k.shape[1], self.pool.block_size, self.pool
        fresh = -(-(self.length + n) // b) - len(self.block_table)  # new blocks
        copy = n > 0 and self.length % b > 0 and pool.ref_count[self.block_table[-1]] > 1  # shared last block
        if fresh + copy > pool.free_blocks:
            raise RuntimeError(f"out of KV blocks: appending {n} positions needs {fresh + copy} free blocks, "
                               f"the pool has {pool.free_blocks} of {len(pool.ref_count)}; nothing was written")
        if copy:  # copy on write
            last, own = self.block_table[-1], pool.allocate()
            pool.keys[:, own], pool.values[:, own] = pool.keys[:, last], pool.values[:, last]
            pool.release(last)
            pool.copies += 1
            self.block_table[-1] = own
        self.block_table += [pool.allocate() for _ in range(fresh)]
        i = 0
        while i < n:  # block by block: position length + i goes to slot (length + i) % b
            block, slot = self.block_table[(self.length + i) // b], (self.length + i) % b
            m = min(b - slot, n - i)
            pool.keys[:, block, slot : slot + m] = k[:, i : i + m]  # [H_kv, m, D_k]
            pool.values[:, block, slot : slot + m] = v[:, i : i + m]
            i += m
        self.length += n

    def gather(self) -> tuple[Tensor, Tensor]:
        """The cached keys and values in order, ``[H_kv, S, D_k]`` each (one copy through the block table)."""
        table = torch.tensor(self.block_table, dtype=torch.long, device=self.pool.keys.device)  # [n]
        keys, values = (s.index_select(1, table).flatten(1, 2) for s in (self.pool.keys, self.pool.values))  # [H_kv, n b, D_k]
        return keys[:, : self.length], values[:, : self.length]  # [H_kv, S, D_k] each, views

    def update(self, k: Tensor, v: Tensor, window: int | None = None) -> tuple[Tensor, Tensor]:
        """KVCache-style: append ``[1, H_kv, S_new, D_k]``, return all keys and values ``[1, H_kv, S, D_k]``."""
        if window is not None:
            raise ValueError(f"window = {window!r}: this paged cache keeps every position; evict blocks with truncate")
        _checks.single_sequence(k, v)
        self.append(k[0], v[0])
        keys, values = self.gather()  # [H_kv, S, D_k] each
        return keys[None], values[None]  # [1, H_kv, S, D_k]

    def truncate(self, length: int) -> None:
        """Forget positions ``>= length`` and release the blocks no longer needed."""
        if not _checks.is_int(length) or not 0 <= length <= self.length:
            raise ValueError(f"truncate length must be an int in 0..{self.length} (the positions held), got {length!r}")
        keep = -(-int(length) // self.pool.block_size)
        for block in self.block_table[keep:]:
            self.pool.release(block)
        self.block_table, self.length = self.block_table[:keep], int(length)

    def free(self) -> None:
        """Release every block."""
        self.truncate(0)


def contiguous_attention(q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """``q [H, S_new, D_k]``, the last ``S_new`` positions, over ``keys``, ``values`` ``[H_kv, S, D_k]``
    -> ``[H, S_new, D_k]``, bottom-right causal; each key/value head serves ``H // H_kv`` query heads.

    >>> contiguous_attention(torch.randn(4, 2, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)).shape
    torch.Size([4, 2, 8])
    """
    _checks.kv_pair(keys, values)
    _checks.gqa_query(q, keys, keys.shape[1])
    S_new, S = q.shape[1], keys.shape[1]
    mask = causal_mask(S_new, S_k=S, device=q.device) if S_new > 1 else None  # [S_new, S]; one query sees all
    out = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, enable_gqa=True)  # [1, H, S_new, D_k]
    return out[0]


def paged_attention(q: Tensor, cache: PagedKVCache) -> Tensor:
    """Attention of ``q [H, S_new, D_k]`` (the last ``S_new`` positions) over a paged cache -> ``[H, S_new, D_k]``.

    Gathers the cache through the block table, then runs :func:`contiguous_attention`: equal to a
    contiguous cache bit for bit.

    >>> seq = PagedKVCache(BlockPool(4, 16, num_kv_heads=2, head_dim=8))
    >>> seq.append(torch.randn(2, 20, 8), torch.randn(2, 20, 8))
    >>> paged_attention(torch.randn(8, 3, 8), seq).shape  # [H, S_new, D_k]
    torch.Size([8, 3, 8])
    """
    _checks.instance("cache", cache, PagedKVCache, "a PagedKVCache")
    _checks.gqa_query(q, cache.pool.keys, cache.length)
    keys, values = cache.gather()  # [H_kv, S, D_k] each
    return contiguous_attention(q, keys, values)


def paged_attention_in_place(q: Tensor, cache: PagedKVCache) -> Tensor:
    """:func:`paged_attention` for one query per head, ``q [H, 1, D_k]``, reading the blocks in place.

    Runs of consecutive blocks are views of the pool (no gather), merged one run at a time with an
    online softmax (a running maximum ``m``, denominator ``l`` and output; in float32 for a 16-bit
    pool). Equal to :func:`paged_attention` up to float rounding.

    >>> seq = PagedKVCache(BlockPool(4, 16, num_kv_heads=2, head_dim=8, dtype=torch.float64))
    >>> seq.append(torch.randn(2, 20, 8, dtype=torch.float64), torch.randn(2, 20, 8, dtype=torch.float64))
    >>> q = torch.randn(8, 1, 8, dtype=torch.float64)  # [H, 1, D_k]
    >>> torch.allclose(paged_attention_in_place(q, seq), paged_attention(q, seq))
    True
    """
    _checks.instance("cache", cache, PagedKVCache, "a PagedKVCache")
    _checks.gqa_query(q, cache.pool.keys, cache.length, one_query=True)
    H, _, D_k = q.shape
    H_kv, b, table = cache.pool.keys.shape[0], cache.pool.block_size, cache.block_table
    acc = torch.promote_types(q.dtype, torch.float32)  # 16-bit caches: scores and softmax in float32, as SDPA does
    qg = q.view(H_kv, H // H_kv, D_k).to(acc) / math.sqrt(D_k)  # [H_kv, G, D_k]: each key/value head's queries
    m, l, out, start = qg.new_full((*qg.shape[:2], 1), -math.inf), qg.new_zeros(*qg.shape[:2], 1), torch.zeros_like(qg), 0
    while start < len(table):  # a run of consecutive blocks: table[start:end], holding n positions
        end = start + 1
        while end < len(table) and table[end] == table[end - 1] + 1:
            end += 1
        n, (first, last) = min(cache.length - start * b, (end - start) * b), (table[start], table[end - 1] + 1)
        k, v = (t[:, first:last].flatten(1, 2)[:, :n].to(acc) for t in (cache.pool.keys, cache.pool.values))  # [H_kv, n, D_k]
        s = qg @ k.transpose(1, 2)  # [H_kv, G, n]: this run's scores
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))  # [H_kv, G, 1]: the running maximum
        p, rescale = torch.exp(s - m_new), torch.exp(m - m_new)  # this run's weights; the earlier runs' rescaling
        m, l, out, start = m_new, l * rescale + p.sum(-1, keepdim=True), out * rescale + p @ v, end
    return (out / l).reshape(H, 1, D_k).to(q.dtype)  # [H, 1, D_k]
