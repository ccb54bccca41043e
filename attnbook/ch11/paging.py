"""Chapter 11.1-11.2: memory policies for a KV cache, copy-on-write, prefix sharing by chained block hashes,
and the slider of a paged pool filling up. The paged cache itself is :mod:`attnlib.paged`."""

from __future__ import annotations

import hashlib
import math
from typing import Any, Sequence

import numpy as np
import torch

from attnlib.paged import BlockPool, PagedKVCache

from ..slider import Frame, Panel
from ._common import is_int, one_of, positive_int

POLICIES = ("max-length", "doubling", "paged")

# ---- memory policies on a simulated mix of requests -----------------------------------------------

def request_mix(n: int = 2000, *, max_len: int = 2048, seed: int = 0) -> list[tuple[int, int]]:
    """``n`` simulated requests ``(prompt_len, output_len)``: log-normal lengths (median prompt 256,
    median output 128, both long-tailed, as chat traffic is), capped so that the total fits ``max_len`` (>= 8)."""
    n, max_len = positive_int("n", n, minimum=0), positive_int("max_len", max_len, minimum=8)
    if not is_int(seed):
        raise ValueError(f"seed must be an int, got {seed!r}")
    rng = np.random.default_rng(seed)
    prompts = np.clip(rng.lognormal(math.log(256), 1.0, n), 4, max_len // 2).astype(int)
    outputs = np.clip(rng.lognormal(math.log(128), 1.0, n), 1, max_len - prompts).astype(int)
    return list(zip(prompts.tolist(), outputs.tolist()))


def reserved_positions(policy: str, length: int, *, max_len: int = 2048, block_size: int = 16) -> int:
    """Positions a cache reserves while holding ``length`` under ``policy``.

    ``"max-length"``: the longest allowed sequence, from the start; ``"doubling"``: the next power of two
    (attnlib's ``KVCache``; 0 while empty); ``"paged"``: whole blocks of ``block_size``. ``length``
    is at most ``max_len``.
    """
    one_of("policy", policy, POLICIES)
    max_len, block_size = positive_int("max_len", max_len), positive_int("block_size", block_size)
    if not 0 <= positive_int("length", length, minimum=0) <= max_len:
        raise ValueError(f"length must be in 0..max_len = {max_len}, got {length!r}")
    if policy == "max-length":
        return max_len
    if policy == "doubling":
        return 0 if length == 0 else 1 << (length - 1).bit_length()
    return -(-length // block_size) * block_size


def memory_waste(mix: Sequence[tuple[int, int]], *, max_len: int = 2048, block_size: int = 16) -> dict[str, float]:
    """The share of reserved cache memory that holds no token, averaged over every decode step of every request.

    At each step a request holds ``prompt + generated`` positions and reserves what its policy gives.
    ``mix`` holds ``(prompt, output)`` pairs, each at least 1, with ``prompt + output <= max_len``.
    """
    max_len, block_size = positive_int("max_len", max_len), positive_int("block_size", block_size)
    for i, pair in enumerate(mix):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(is_int(x) and x >= 1 for x in pair)
                and sum(pair) <= max_len):
            raise ValueError(f"mix[{i}] must be (prompt, output) ints >= 1 with prompt + output <= max_len = {max_len}, got {pair!r}")
    if not mix:
        raise ValueError("mix must hold at least one (prompt, output) pair, got none")
    held = 0
    reserved = {p: 0 for p in POLICIES}
    for prompt, output in mix:
        lengths = np.arange(prompt + 1, prompt + output + 1)  # held after each generated token
        held += int(lengths.sum())
        reserved["max-length"] += max_len * len(lengths)
        reserved["doubling"] += int((2 ** np.ceil(np.log2(lengths))).sum())
        reserved["paged"] += int((np.ceil(lengths / block_size) * block_size).sum())
    return {p: 1 - held / r for p, r in reserved.items()}


def cow_demo(prompt_len: int = 50, samples: int = 4, new_tokens: int = 20, *, block_size: int = 16,
             H_kv: int = 2, D_k: int = 8, seed: int = 0) -> dict[str, Any]:
    """Parallel sampling with copy-on-write: one prompt, ``samples`` continuations.

    Returns the blocks used when the samples share the prompt's blocks and when each has its own
    copy, the copies made, and whether every sample reads exactly what a private cache would hold.
    """
    sizes = dict(prompt_len=prompt_len, samples=samples, new_tokens=new_tokens, block_size=block_size, H_kv=H_kv, D_k=D_k)
    prompt_len, samples, new_tokens, block_size, H_kv, D_k = (positive_int(k, v) for k, v in sizes.items())
    if not is_int(seed):
        raise ValueError(f"seed must be an int, got {seed!r}")
    private = samples * -(-(prompt_len + new_tokens) // block_size)
    gen = torch.Generator().manual_seed(seed)
    pool = BlockPool(private, block_size, H_kv, D_k)  # room for private copies: sharing never runs out
    prompt_k, prompt_v = (torch.randn(H_kv, prompt_len, D_k, generator=gen) for _ in range(2))
    parent = PagedKVCache(pool)
    parent.append(prompt_k, prompt_v)
    children = [parent.fork() for _ in range(samples - 1)]
    seqs = [parent, *children]
    news = [[torch.randn(H_kv, new_tokens, D_k, generator=gen) for _ in range(2)] for _ in seqs]
    for seq, (k, v) in zip(seqs, news):
        for t in range(new_tokens):  # one token per step, as decoding writes them
            seq.append(k[:, t : t + 1], v[:, t : t + 1])
    exact = all(
        torch.equal(seq.gather()[0], torch.cat([prompt_k, k], 1)) and torch.equal(seq.gather()[1], torch.cat([prompt_v, v], 1))
        for seq, (k, v) in zip(seqs, news)
    )
    return {"shared": pool.blocks_in_use, "private": private, "copies": pool.copies, "exact": exact}


# ==== 11.2 prefix sharing ==========================================================================

def block_hashes(tokens: Sequence[int], block_size: int) -> list[str]:
    """One hash per *full* block: of the block's tokens and of the hash before it (so of the whole prefix)."""
    block_size = positive_int("block_size", block_size)
    _token_list(tokens)
    hashes, parent = [], ""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = ",".join(map(str, tokens[start : start + block_size]))
        parent = hashlib.sha256(f"{parent}|{block}".encode()).hexdigest()[:16]
        hashes.append(parent)
    return hashes


class PrefixCache:
    """Full blocks by the hash of their prefix: a new request reuses every leading block already cached.

    Counts blocks by token ids only (the keys and values are those of whatever model fills them).
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = positive_int("block_size", block_size)
        self.blocks: dict[str, int] = {}  # hash -> reference count
        self.computed_tokens = 0  # positions whose keys and values had to be computed (prefill)
        self.requested_tokens = 0

    def admit(self, tokens: Sequence[int]) -> int:
        """Register a request's prompt; returns how many of its leading tokens need no computing.

        A whole prompt found in the cache still computes its last token: that token's query gives the
        first output token's logits. (vLLM's V1 engine leaves the last token out of its search too, but
        reuses whole blocks only, so it recomputes the whole block that holds the last token.)
        """
        hashes = block_hashes(tokens, self.block_size)
        hits = 0
        while hits < len(hashes) and hashes[hits] in self.blocks:  # chained hashes: a hit implies its prefix
            hits += 1
        for h in hashes:
            self.blocks[h] = self.blocks.get(h, 0) + 1
        reused = min(hits * self.block_size, max(len(tokens) - 1, 0))  # the last token is always computed
        self.requested_tokens += len(tokens)
        self.computed_tokens += len(tokens) - reused
        return reused

    def blocks_in_use(self, partial_blocks: int) -> int:
        """Distinct full blocks plus the requests' own partial last blocks."""
        return len(self.blocks) + positive_int("partial_blocks", partial_blocks, minimum=0)


def _token_list(tokens: object) -> None:
    if not isinstance(tokens, (list, tuple, range)) or not all(is_int(t) for t in tokens):
        raise ValueError(f"tokens must be a list of int token ids, got {tokens!r:.80}")


# ==== the slider: a paged cache filling up =========================================================

# (arrival step, prompt, output) of four requests sharing a pool: request 3 arrives after request 0 has
# finished and reuses its freed blocks
_FRAME_REQUESTS = ((0, 37, 12), (0, 21, 34), (0, 9, 18), (14, 15, 20))


def simulate_paging(steps: int, block_size: int, requests: Sequence[tuple[int, int, int]] = _FRAME_REQUESTS,
                    num_blocks: int | None = None) -> tuple[list[list[int]], list[int], list[str]]:
    """Allocate blocks step by step, as a paged server does, and return the state after ``steps`` steps.

    At step ``a`` a request arriving then is prefilled (blocks for its prompt); at every later step each
    running request appends one token, taking a new block from the free list (the lowest-numbered free
    block) only when its last block is full; a request that has produced all its tokens returns its
    blocks to the free list, where later requests pick them up. Blocks never move. Returns
    ``(block tables, lengths, states)``, one entry per request; a finished or not yet arrived request
    has an empty table. Deterministic: the same arguments always give the same state.
    """
    steps, block_size = positive_int("steps", steps, minimum=0), positive_int("block_size", block_size)
    for i, r in enumerate(requests):
        if not (isinstance(r, (tuple, list)) and len(r) == 3 and all(is_int(x) for x in r) and r[0] >= 0 and min(r[1:]) >= 1):
            raise ValueError(f"requests[{i}] must be (arrival step >= 0, prompt >= 1, output >= 1) ints, got {r!r}")
    num_blocks = 160 // block_size if num_blocks is None else positive_int("num_blocks", num_blocks)
    free = list(range(num_blocks))  # kept sorted: the lowest-numbered free block is taken first
    tables: list[list[int]] = [[] for _ in requests]
    lengths = [0] * len(requests)
    states = ["waiting"] * len(requests)

    def grow(r: int, new_length: int) -> None:
        while len(tables[r]) * block_size < new_length:
            if not free:
                raise ValueError(f"pool of {num_blocks} blocks of {block_size} is full at request {r}")
            tables[r].append(free.pop(0))
        lengths[r] = new_length

    for step in range(steps + 1):
        for r, (arrival, prompt, output) in enumerate(requests):
            if states[r] == "running" and step > arrival:
                grow(r, lengths[r] + 1)  # one decoded token
                if lengths[r] == prompt + output:  # done: its blocks go back to the pool
                    free = sorted(free + tables[r])
                    tables[r], states[r] = [], "finished"
            elif states[r] == "waiting" and step == arrival:
                states[r] = "running"
                grow(r, prompt)  # the prefill
    return tables, lengths, states


def paging_frame(step: int, block_size: int = 16) -> Frame:
    """The pool's blocks after ``step`` decode steps of four requests, and what each policy reserves.

    One heatmap row per request over the pool's physical blocks: the share of each of its blocks that
    holds tokens. The allocation is simulated from step 0 (:func:`simulate_paging`), so a frame
    depends only on its arguments.
    """
    step = positive_int("step", step, minimum=0)
    tables, lengths, states = simulate_paging(step, block_size)
    n_blocks = 160 // block_size  # room for the requests at their longest, with any block size down to 4
    pool_owner = np.zeros((len(_FRAME_REQUESTS), n_blocks))
    labels, texts = [], []
    held = in_use = reserved_max = reserved_dbl = 0
    for r, (table, length, state) in enumerate(zip(tables, lengths, states)):
        for j, b in enumerate(table):
            pool_owner[r, b] = min(block_size, length - j * block_size) / block_size
        if state == "running":
            held += length
            in_use += len(table)
            reserved_max += 64
            reserved_dbl += reserved_positions("doubling", length)
            labels.append(f"request {r} ({length} tokens)")
            texts.append(f"request {r}: blocks {', '.join(map(str, table))}")
        else:
            labels.append(f"request {r} ({'finished, blocks freed' if state == 'finished' else 'not arrived'})")
    paged = in_use * block_size
    caption = (f"After {step} decode steps the running requests hold {held} positions in {in_use} blocks of "
               f"{block_size} ({paged} positions reserved, {paged - held} empty; {n_blocks - in_use} blocks free). "
               f"Preallocating the maximum length of 64 would reserve {reserved_max}; doubling buffers would reserve "
               f"{reserved_dbl}. " + "; ".join(texts) + ".")
    panel = Panel(pool_owner, labels, [str(b) for b in range(n_blocks)], vmin=0.0, vmax=1.0, masked=pool_owner == 0,
                  title=f"physical blocks of {block_size} positions: the share of each that holds tokens (hatched: not this request's)")
    return Frame(label=f"blocks of {block_size}, step {step}", panels=[panel], caption=caption)  # both vary in a slider
