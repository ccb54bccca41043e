"""attnlib.paged against plain attention in float64 and attnlib.KVCache as oracles, and its misuse.

Every refused call must leave the pool and the cache exactly as they were (atomic operations).
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from attnlib import KVCache, causal_mask
from attnlib.paged import BlockPool, PagedKVCache, contiguous_attention, paged_attention, paged_attention_in_place

F64 = torch.float64


def plain_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``q [H, S_new, D_k]`` over ``[H_kv, S, D_k]``, bottom-right causal, written out in float64."""
    H, S_new, D_k = q.shape
    G = H // keys.shape[0]
    k, v = keys.repeat_interleave(G, 0), values.repeat_interleave(G, 0)  # [H, S, D_k]
    scores = q @ k.transpose(1, 2) / math.sqrt(D_k)  # [H, S_new, S]
    scores = scores.masked_fill(~causal_mask(S_new, S_k=keys.shape[1]), float("-inf"))
    return torch.softmax(scores, -1) @ v


def state(pool: BlockPool, *seqs: PagedKVCache) -> tuple:
    return (list(pool.ref_count), list(pool._free), pool.copies, pool.keys.clone(), pool.values.clone(),
            [(list(s.block_table), s.length) for s in seqs])


def same_state(a: tuple, b: tuple) -> bool:
    return a[:3] == b[:3] and torch.equal(a[3], b[3]) and torch.equal(a[4], b[4]) and a[5] == b[5]


@pytest.mark.parametrize("H, H_kv, block_size, chunks", [
    (4, 4, 4, (5, 1, 1, 7)), (8, 2, 3, (1,) * 10), (6, 1, 16, (40, 1)), (2, 2, 1, (3, 2)),
])
def test_paged_attention_equals_plain_attention_and_the_kv_cache(H: int, H_kv: int, block_size: int, chunks: tuple) -> None:
    gen = torch.Generator().manual_seed(H * 100 + block_size)
    S, D_k = sum(chunks), 8
    k, v = (torch.randn(H_kv, S, D_k, generator=gen, dtype=F64) for _ in range(2))
    pool = BlockPool(2 * -(-S // block_size), block_size, H_kv, D_k, dtype=F64)
    other = PagedKVCache(pool)
    seq, cache, done = PagedKVCache(pool), KVCache(), 0
    for n in chunks:  # interleave with another sequence so the block table is not contiguous
        seq.append(k[:, done : done + n], v[:, done : done + n])
        other.append(k[:, :1], v[:, :1])
        with torch.no_grad():
            cache.update(k[None, :, done : done + n], v[None, :, done : done + n])
        done += n
        keys, values = seq.gather()
        assert torch.equal(keys, k[:, :done]) and torch.equal(values, v[:, :done])
        assert torch.equal(keys, cache.keys[0]) and torch.equal(values, cache.values[0])
        for S_new in {1, min(n, done)}:
            q = torch.randn(H, S_new, D_k, generator=gen, dtype=F64)
            expected = plain_attention(q, k[:, :done], v[:, :done])
            assert torch.allclose(paged_attention(q, seq), expected, atol=1e-12)
            assert torch.equal(paged_attention(q, seq), contiguous_attention(q, cache.keys[0], cache.values[0]))
            if S_new == 1:
                assert torch.allclose(paged_attention_in_place(q, seq), expected, atol=1e-12)
    assert len(seq.block_table) == -(-S // block_size)  # whole blocks, no more


def test_update_returns_the_kv_cache_view_and_truncate_rolls_back() -> None:
    gen = torch.Generator().manual_seed(0)
    k, v = (torch.randn(1, 2, 11, 4, generator=gen) for _ in range(2))
    seq, cache = PagedKVCache(BlockPool(6, 2, 2, 4)), KVCache()
    with torch.no_grad():
        for a, b in ((0, 5), (5, 6), (6, 11)):
            got, want = seq.update(k[:, :, a:b], v[:, :, a:b]), cache.update(k[:, :, a:b], v[:, :, a:b])
            assert all(torch.equal(x, y) for x, y in zip(got, want))
    seq.truncate(3)
    assert seq.length == 3 and seq.block_table == [0, 1] and seq.pool.blocks_in_use == 2
    assert torch.equal(seq.gather()[0], k[0, :, :3])


def test_random_workload_keeps_every_sequence_exact_and_every_count_consistent() -> None:
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    pool = BlockPool(24, 3, 1, 2, dtype=F64)
    seqs: list[tuple[PagedKVCache, torch.Tensor]] = []
    for _ in range(500):
        op = rng.choice(["new", "append", "fork", "truncate", "free"] if seqs else ["new"])
        if op == "new":
            seqs.append((PagedKVCache(pool), torch.zeros(1, 0, 2, dtype=F64)))
        else:
            i = rng.randrange(len(seqs))
            seq, held = seqs[i]
            if op == "append":
                new = torch.randn(1, rng.randint(0, 5), 2, generator=gen, dtype=F64)
                try:
                    seq.append(new, new)
                    held = torch.cat([held, new], 1)
                except RuntimeError:  # the pool is full: nothing was written
                    pass
            elif op == "fork":
                seqs.append((seq.fork(), held))
            elif op == "truncate":
                held = held[:, : rng.randint(0, held.shape[1])]
                seq.truncate(held.shape[1])
            else:
                seq.free()
                held = held[:, :0]
            seqs[i] = (seq, held)
        for seq, held in seqs:
            assert torch.equal(seq.gather()[0], held)
        holders = [0] * 24
        for seq, _ in seqs:
            for b in seq.block_table:
                holders[b] += 1
        assert holders == pool.ref_count and pool.free_blocks == holders.count(0)
        assert sorted(pool._free) == [b for b in range(24) if holders[b] == 0]


# ---------------------------------------------------------------- misuse: refused, and nothing changed


def _filled() -> tuple[BlockPool, PagedKVCache]:
    pool = BlockPool(4, 4, 2, 3)
    seq = PagedKVCache(pool)
    seq.append(torch.ones(2, 5, 3), torch.ones(2, 5, 3))
    return pool, seq


@pytest.mark.parametrize("k, v, match", [
    (torch.ones(1, 2, 3), torch.ones(1, 2, 3), r"k and v have shape \(1, 2, 3\) but the pool holds \[H_kv, S_new, D_k\] = \[2, S_new, 3\]"),
    (torch.ones(2, 2, 1), torch.ones(2, 2, 1), r"shape \(2, 2, 1\) but the pool holds"),
    (torch.ones(2, 3, 3), torch.ones(2, 5, 3), r"k and v must share shape"),
    (torch.ones(2, 2, 3, dtype=F64), torch.ones(2, 2, 3, dtype=F64), r"float64 on cpu but the pool holds torch.float32"),
    (torch.ones(2, 2, 3, device="meta"), torch.ones(2, 2, 3, device="meta"), r"on meta but the pool holds torch.float32 on cpu"),
    (torch.ones(1, 2, 2, 3), torch.ones(1, 2, 2, 3), r"k must be \[H_kv, S, D_k\] \(3 dims\)"),
    (torch.ones(2, 2, 3, dtype=torch.long), torch.ones(2, 2, 3, dtype=torch.long), "floating-point"),
    ([[1.0]], [[1.0]], "must be a torch.Tensor"),
])
def test_append_refuses_wrong_heads_widths_lengths_dtype_device_without_broadcasting(k, v, match: str) -> None:
    pool, seq = _filled()
    before = state(pool, seq)
    with pytest.raises(ValueError, match=match):
        seq.append(k, v)
    assert same_state(before, state(pool, seq))


def test_update_refuses_a_batch_of_two_instead_of_storing_sequence_0() -> None:
    pool, seq = _filled()
    before = state(pool, seq)
    with pytest.raises(ValueError, match=r"k has batch B = 2 .* one PagedKVCache per sequence"):
        seq.update(torch.ones(2, 2, 1, 3), torch.ones(2, 2, 1, 3))
    with pytest.raises(ValueError, match="window = 4"):
        seq.update(torch.ones(1, 2, 1, 3), torch.ones(1, 2, 1, 3), window=4)
    assert same_state(before, state(pool, seq))


def test_an_append_that_runs_out_of_blocks_writes_nothing() -> None:
    pool, seq = _filled()  # 5 positions in 2 of 4 blocks
    before = state(pool, seq)
    with pytest.raises(RuntimeError, match="out of KV blocks: appending 12 positions needs 3 free blocks, the pool has 2 of 4"):
        seq.append(torch.full((2, 12, 3), 7.0), torch.full((2, 12, 3), 7.0))
    assert same_state(before, state(pool, seq))
    c1, c2 = seq.fork(), seq.fork()  # block 1 is shared three times
    PagedKVCache(pool).append(torch.ones(2, 8, 3), torch.ones(2, 8, 3))  # the last two blocks: the pool is full
    before = state(pool, seq, c1, c2)
    with pytest.raises(RuntimeError, match="appending 1 positions needs 1 free blocks, the pool has 0"):
        c1.append(torch.ones(2, 1, 3), torch.ones(2, 1, 3))  # fits in its last block, but that block must be copied
    assert same_state(before, state(pool, seq, c1, c2))


def test_release_and_share_refuse_free_blocks_so_no_block_is_handed_out_twice() -> None:
    pool = BlockPool(3, 2, 1, 1)
    for call, match in ((pool.release, "cannot release block 1: it is free"), (pool.share, "cannot share block 1: it is free")):
        with pytest.raises(ValueError, match=match):
            call(1)  # never allocated
        assert pool.ref_count == [0, 0, 0] and pool.free_blocks == 3
    a = pool.allocate()
    pool.release(a)
    with pytest.raises(ValueError, match="cannot release block 0"):  # double release
        pool.release(a)
    with pytest.raises(ValueError, match="cannot share block 0"):  # share of a freed block
        pool.share(a)
    assert pool.ref_count == [0, 0, 0]
    assert len({pool.allocate() for _ in range(3)}) == 3  # three different blocks
    for bad in (3, -1, 1.0, True, "0"):
        with pytest.raises(ValueError, match=r"block must be an int in 0..2"):
            pool.release(bad)


@pytest.mark.parametrize("args, match", [
    ((0, 4, 1, 1), "num_blocks must be a positive int, got 0"),
    ((4, 0, 1, 1), "block_size must be a positive int, got 0"),
    ((4, -16, 1, 1), "block_size must be a positive int, got -16"),
    ((4, 4, 0, 1), "num_kv_heads must be a positive int, got 0"),
    ((4, 4, 1, 2.0), "head_dim must be a positive int, got 2.0"),
])
def test_pool_refuses_sizes_that_cannot_be_right(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BlockPool(*args)
    with pytest.raises(ValueError, match="dtype must be a floating-point torch.dtype, got torch.int8"):
        BlockPool(1, 1, 1, 1, dtype=torch.int8)
    with pytest.raises(ValueError, match="pool must be a BlockPool"):
        PagedKVCache("pool")  # type: ignore[arg-type]


def test_truncate_refuses_lengths_outside_what_is_held() -> None:
    pool, seq = _filled()
    before = state(pool, seq)
    for bad in (-1, 6, 2.0, None):
        with pytest.raises(ValueError, match=r"truncate length must be an int in 0..5"):
            seq.truncate(bad)
    assert same_state(before, state(pool, seq))


@pytest.mark.parametrize("q, match", [
    (torch.ones(3, 1, 3), r"q shape \(3, 1, 3\) does not fit: expected \[H, S_new, D_k\] with H a multiple of H_kv = 2"),
    (torch.ones(4, 1, 2), r"does not fit: .* D_k = 3"),
    (torch.ones(4, 6, 3), r"q has S_new = 6 queries for the last of the 5 cached positions; expected 1..5"),
    (torch.ones(4, 1, 3, dtype=F64), r"q is torch.float64 on cpu but the keys are torch.float32"),
    (torch.ones(1, 4, 1, 3), r"q must be \[H, S_new, D_k\]"),
])
def test_paged_attention_refuses_queries_that_do_not_fit(q: torch.Tensor, match: str) -> None:
    _, seq = _filled()
    with pytest.raises(ValueError, match=match):
        paged_attention(q, seq)
    with pytest.raises(ValueError, match="q "):
        paged_attention_in_place(q, seq)
    with pytest.raises(ValueError, match=r"expected \[H, 1, D_k\]"):  # in place: one query per head
        paged_attention_in_place(torch.ones(4, 2, 3), seq)
    with pytest.raises(ValueError, match="cache must be a PagedKVCache"):
        paged_attention(torch.ones(4, 1, 3), KVCache())  # type: ignore[arg-type]
    empty = PagedKVCache(BlockPool(1, 1, 2, 3))
    with pytest.raises(ValueError, match="for the last of the 0 cached positions"):
        paged_attention(torch.ones(4, 1, 3), empty)


def test_contiguous_attention_refuses_mismatched_keys_and_values() -> None:
    with pytest.raises(ValueError, match="k and v must share shape"):
        contiguous_attention(torch.ones(2, 1, 4), torch.ones(1, 5, 4), torch.ones(1, 4, 4))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_in_place_attention_is_as_precise_as_the_gathered_one_in_16_bit(dtype: torch.dtype) -> None:
    """A 16-bit pool: the in-place kernel computes its scores and softmax in float32, as SDPA does."""
    torch.manual_seed(0)
    pool = BlockPool(60, 2, num_kv_heads=2, head_dim=64, dtype=dtype)
    seq, other = PagedKVCache(pool), PagedKVCache(pool)
    k, v = torch.randn(2, 2, 50, 64).unbind(0)                     # [H_kv, S, D_k] each
    for i in range(0, 50, 2):                                      # interleaved: a fragmented block table
        seq.append(k[:, i : i + 2].to(dtype), v[:, i : i + 2].to(dtype))
        other.append(k[:, i : i + 2].to(dtype), v[:, i : i + 2].to(dtype))
    q = torch.randn(8, 1, 64)                                      # [H, 1, D_k]
    keys, values = seq.gather()
    oracle = contiguous_attention(q.double(), keys.double(), values.double())
    err = {name: (fn(q.to(dtype), seq).double() - oracle).abs().max().item()
           for name, fn in (("in place", paged_attention_in_place), ("gathered", paged_attention))}
    assert err["in place"] <= 1.5 * err["gathered"] + 1e-4, err


def test_in_place_attention_merges_run_by_run_with_an_online_softmax(monkeypatch: pytest.MonkeyPatch) -> None:
    """No softmax over the joined scores: each run of blocks rescales the running (m, l, output), so a
    later run whose scores are 500 higher than the first's still gives the reference, in float32."""
    gen = torch.Generator().manual_seed(3)
    pool = BlockPool(12, 4, num_kv_heads=1, head_dim=8)
    seq, other = PagedKVCache(pool), PagedKVCache(pool)
    k, v = torch.randn(1, 20, 8, generator=gen), torch.randn(1, 20, 8, generator=gen)
    q = torch.randn(2, 1, 8, generator=gen)                        # [H, 1, D_k], two query heads share the key head
    k[:, 12:] += 60 * q[0, 0] / q[0, 0].norm()                     # the last runs' scores are far above the first's
    for i in range(0, 20, 4):                                      # interleaved: five runs of one block each
        seq.append(k[:, i : i + 4], v[:, i : i + 4])
        other.append(k[:, :1], v[:, :1])
    expected = plain_attention(q.double(), k.double(), v.double()).float()
    monkeypatch.setattr(torch, "softmax", lambda *a, **kw: pytest.fail("one softmax over all the scores"))
    assert torch.allclose(paged_attention_in_place(q, seq), expected, atol=1e-5)
