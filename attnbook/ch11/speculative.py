"""Chapter 11.5: greedy speculative decoding, verified in one target pass, with cache rollback."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnlib import KVCache

from ._common import _OneThread, instance, positive_int, token_ids

@torch.no_grad()
def speculative_generate(target: Any, draft: Any, prompt: Tensor, max_new_tokens: int, k: int = 4) -> tuple[Tensor, dict[str, int]]:
    """Greedy speculative decoding with two :class:`attnbook.toy_lm.TinyLM` models sharing a vocabulary.

    Each round the draft proposes ``k`` tokens one by one; the target checks all of them in ONE
    cached pass (``k`` new queries, bottom-right causal mask), keeps the longest prefix it agrees
    with plus its own next token, and rolls both caches back with ``KVCache.truncate``. The output is
    exactly the target's greedy output.

    ``prompt [S0]`` holds at least 2 token ids, and ``S0 + max_new_tokens`` fits both models' ``max_len``.
    Returns ``(ids [S0 + max_new_tokens], stats)`` with the target's forward passes, the tokens proposed and
    accepted, and the draft's forward calls (its prefill, one per proposed token, and the catch-up calls
    that feed it the target's corrections). Every forward call counts as one, whatever its number of
    positions: the target's passes are its prefill (all but the last prompt token, which gives no token)
    plus one verification pass per round; plain greedy decoding of ``n`` tokens counts ``n`` passes.
    """
    from ..toy_lm import TinyLM

    instance("target", target, TinyLM, "an attnbook.toy_lm.TinyLM")
    instance("draft", draft, TinyLM, "an attnbook.toy_lm.TinyLM")
    if target.head.out_features != draft.head.out_features:
        raise ValueError(f"target and draft must share a vocabulary, got {target.head.out_features} and {draft.head.out_features} tokens")
    if token_ids("prompt", prompt, 1, "[S0]").numel() < 2:
        raise ValueError(f"prompt must hold at least 2 tokens, got {prompt.numel()}")
    max_new_tokens, k = positive_int("max_new_tokens", max_new_tokens, minimum=0), positive_int("k", k)
    if prompt.numel() + max_new_tokens > min(target.max_len, draft.max_len):
        raise ValueError(f"prompt ({prompt.numel()}) + max_new_tokens ({max_new_tokens}) exceeds the models' "
                         f"max_len = {min(target.max_len, draft.max_len)}")
    with _OneThread():
        return _speculative(target, draft, prompt, max_new_tokens, k)


def _speculative(target: Any, draft: Any, prompt: Tensor, max_new_tokens: int, k: int) -> tuple[Tensor, dict[str, int]]:
    target.eval(), draft.eval()
    t_cache, d_cache = KVCache(), KVCache()
    ids = prompt.clone()
    t_logits = target(ids[None, :-1], causal=True, cache=t_cache)  # prefill all but the last prompt token
    draft(ids[None, :-1], causal=True, cache=d_cache)
    stats = {"target_passes": 1, "accepted": 0, "proposed": 0, "draft_calls": 1}
    while ids.numel() - prompt.numel() < max_new_tokens:
        n = min(k, max_new_tokens - (ids.numel() - prompt.numel()))
        proposal, feed = [], ids[-1:]
        for _ in range(n):  # the draft's greedy guesses
            nxt = draft(feed[None], causal=True, cache=d_cache)[0, -1].argmax()[None]  # [1]
            stats["draft_calls"] += 1
            proposal.append(nxt)
            feed = nxt
        proposal = torch.cat(proposal)  # [n]
        # verify: the last accepted token and the n proposals, one pass, n + 1 new queries
        t_logits = target(torch.cat([ids[-1:], proposal])[None], causal=True, cache=t_cache)[0]  # [n + 1, V]
        stats["target_passes"] += 1
        choice = t_logits.argmax(-1)  # [n + 1]: the target's own next token after each prefix
        agree = int((choice[:n] == proposal).long().cumprod(0).sum())
        stats["accepted"] += agree
        stats["proposed"] += n
        new = torch.cat([proposal[:agree], choice[agree : agree + 1]])[: max_new_tokens - (ids.numel() - prompt.numel())]
        ids = torch.cat([ids, new])
        # roll back: both caches keep every position before the newest token, which the next round feeds
        t_cache.truncate(ids.numel() - 1)
        d_cache.truncate(min(d_cache.length, ids.numel() - 1))
        if d_cache.length < ids.numel() - 1:  # the draft has not seen the target's correction yet
            draft(ids[None, d_cache.length : -1], causal=True, cache=d_cache)
            stats["draft_calls"] += 1
    return ids, stats
