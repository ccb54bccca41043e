"""Chapter 11's explanatory diagrams, drawn from the chapter's own code and constants.

The block tables and the copy-on-write fork come from :class:`attnlib.paged.BlockPool` runs, the
batching timelines from :func:`batching_timeline`, so a picture cannot drift from the code it shows.
"""

from __future__ import annotations

import torch

from attnlib.paged import BlockPool, PagedKVCache

from ..diagrams import INK, MUTED, Diagram, diagram

#: the block-table picture: blocks of 4 positions; A writes 6, B 5, then A grows to 10
TABLE_BLOCK, TABLE_POOL = 4, 8
#: the copy-on-write picture: section 11.1's prompt of 50 tokens in blocks of 16, forked once
COW_PROMPT, COW_BLOCK = 50, 16
#: the batching timeline: (name, arrival step, decode steps) for three slots
TIMELINE_SLOTS = 3
TIMELINE_REQUESTS = (("A", 0, 3), ("B", 0, 6), ("C", 0, 2), ("D", 1, 4), ("E", 2, 3))
#: the speculative round: the running example, a prompt, four drafted words, the target's own choices
SPEC_PROMPT = "The books on"
SPEC_DRAFT = ("the", "shelf", "is", "new")
SPEC_TARGET = ("the", "shelf", "are", "old", ".")


def _listed(xs: list[int]) -> str:
    return ", ".join(map(str, xs[:-1])) + f" and {xs[-1]}" if len(xs) > 1 else str(xs[0])


def _write(cache: PagedKVCache, n: int) -> None:
    cache.append(torch.zeros(1, n, 1), torch.zeros(1, n, 1))


def block_table_example() -> dict[str, list[int]]:
    """Two sequences in one pool, allocated as a server does it (A 6 positions, B 5, then A up to 10)."""
    pool = BlockPool(TABLE_POOL, TABLE_BLOCK, 1, 1)
    a, b = PagedKVCache(pool), PagedKVCache(pool)
    _write(a, 6), _write(b, 5), _write(a, 4)
    return {"A": list(a.block_table), "B": list(b.block_table), "lengths": [a.length, b.length]}


def cow_example() -> dict[str, object]:
    """A prompt forked into two samples that then write one token each: tables, reference counts, copies."""
    pool = BlockPool(8, COW_BLOCK, 1, 1)
    first = PagedKVCache(pool)
    _write(first, COW_PROMPT)
    second = first.fork()
    before = list(pool.ref_count)
    _write(first, 1), _write(second, 1)
    return {"before": before, "after": list(pool.ref_count), "first": list(first.block_table),
            "second": list(second.block_table), "copies": pool.copies}


def batching_timeline(policy: str) -> list[list[str]]:
    """Which request each slot decodes at every step: ``[slot][step]``, ``""`` for an idle slot.

    ``"static"`` admits a new batch only when every request of the last one has finished;
    ``"continuous"`` gives a finished request's slot to the next waiting one at the next step.
    """
    if policy not in ("static", "continuous"):
        raise ValueError(f"policy must be 'static' or 'continuous', got {policy!r}")
    waiting = list(TIMELINE_REQUESTS)
    slots: list[list | None] = [None] * TIMELINE_SLOTS
    rows: list[list[str]] = [[] for _ in range(TIMELINE_SLOTS)]
    step = 0
    while waiting or any(slots):
        if policy == "continuous" or not any(slots):
            for i in range(TIMELINE_SLOTS):
                if slots[i] is None and waiting and waiting[0][1] <= step:
                    name, _, n = waiting.pop(0)
                    slots[i] = [name, n]
        for i, s in enumerate(slots):
            rows[i].append(s[0] if s else "")
            if s:
                s[1] -= 1
                if s[1] == 0:
                    slots[i] = None
        step += 1
    return rows


@diagram
def block_table_diagram() -> Diagram:
    ex = block_table_example()
    b = TABLE_BLOCK
    A, B = (_listed(ex[n]) for n in ("A", "B"))
    alt = (f"Two sequences share one pool of {TABLE_POOL} blocks of {b} positions. Sequence A holds {ex['lengths'][0]} "
           f"positions; its block table lists blocks {A}. Sequence B holds {ex['lengths'][1]}; its table lists blocks {B}. "
           "Arrows go from each table entry to its block, whose filled slots are shaded; the other blocks are free. "
           f"Position p lives in entry p // {b} of its block table, at slot p % {b}.")
    d = Diagram("ch11_block_table", 440, 330, title="A block table maps a sequence's positions to blocks in a pool", alt=alt)
    colour = {"A": "blue", "B": "orange"}
    d.text(20, 30, "block tables", size=15, weight="bold", anchor="start")
    px, py, row = 290, 44, 32
    d.text(px + 2 * 24, 30, "pool", size=15, weight="bold")
    owner = {blk: n for n in ("A", "B") for blk in ex[n]}
    fill = {}
    for n, length in zip(("A", "B"), ex["lengths"]):
        for i, blk in enumerate(ex[n]):
            fill[blk] = min(b, length - i * b)
    for blk in range(TABLE_POOL):
        y = py + blk * row
        d.text(px - 8, y + 19, str(blk), size=14, anchor="end", color=MUTED)
        for s in range(b):
            used = blk in owner and s < fill[blk]
            d.rect(px + s * 24, y, 24, 26, fill=colour[owner[blk]] if used else "none", tint=used, stroke=INK,
                   rx=0, width=1)
        if blk not in owner:
            d.text(px + b * 24 + 8, y + 19, "free", size=14, anchor="start", color=MUTED)
    y = 50
    for n in ("A", "B"):
        d.text(30, y + 20, n, size=15, weight="bold", anchor="start")
        for i, blk in enumerate(ex[n]):
            d.box(60, y, 40, 28, str(blk), color=colour[n], size=15)
            d.arrow(100, y + 14, px - 26, py + blk * row + 13, color=colour[n])
            y += 34
        y += 26
    d.text(20, 290, f"position p: block table[p // {b}],", size=14, anchor="start")
    d.text(20, 310, f"slot p % {b}", size=14, anchor="start")
    return d


@diagram
def copy_on_write_diagram() -> Diagram:
    ex = cow_example()
    b, full = COW_BLOCK, COW_PROMPT // COW_BLOCK
    last = ex["first"][-1]
    alt = (f"A prompt of {COW_PROMPT} tokens fills {full} blocks of {b} and {COW_PROMPT % b} positions of a fourth. "
           "Forking it into two samples copied the block table, not the blocks: right after the fork all four blocks "
           "had a reference count of 2. The picture shows the tables after the first writes: the first sample to "
           f"write into the shared, partly filled last block got its own copy (block {last}); the other, now its "
           f"only owner, writes in place. The {full} full prompt blocks stay shared (reference count 2), so the two "
           f"samples hold {full + 2} blocks instead of the {2 * (full + 1)} of two private caches.")
    d = Diagram("ch11_copy_on_write", 440, 300, title="Copy-on-write: a fork shares blocks until a write", alt=alt)
    d.text(20, 30, f"a {COW_PROMPT}-token prompt in blocks of {b}, forked in two", size=14, anchor="start")
    for r, name in enumerate(("first", "second")):
        y = 60 + r * 100
        d.text(20, y + 20, f"sample {r + 1}", size=15, anchor="start")
        for i, blk in enumerate(ex[name]):
            x = 120 + i * 60
            own = i >= full
            d.box(x, y, 50, 30, str(blk), color="orange" if own else "blue", size=15)
    d.arrow(120 + 3 * 60 + 25, 160, 120 + 3 * 60 + 25, 92, color="vermillion")
    d.text(120 + 3 * 60 + 33, 131, "copy", size=14, color="vermillion", anchor="start")  # beside the arrow
    for i in range(full):
        d.text(120 + i * 60 + 25, 130, f"x{ex['after'][ex['first'][i]]}", size=14, color=MUTED)
    d.rect(20, 210, 14, 14, fill="blue", tint=True, stroke="blue", width=2)
    d.text(40, 222, "shared (reference count 2)", size=14, anchor="start")
    d.rect(20, 236, 14, 14, fill="orange", tint=True, stroke="orange", width=2)
    d.text(40, 248, "the sample's own block", size=14, anchor="start")
    used = len(set(ex["first"]) | set(ex["second"]))
    d.text(20, 272, f"{used} blocks with copy-on-write ({full} shared, {used - full} private),", size=14, anchor="start")
    d.text(20, 292, f"against {len(ex['first']) + len(ex['second'])} for two private caches", size=14, anchor="start")
    return d


@diagram
def batching_timeline_diagram() -> Diagram:
    rows = {p: batching_timeline(p) for p in ("static", "continuous")}
    steps = max(len(r) for rs in rows.values() for r in rs)
    names = [r[0] for r in TIMELINE_REQUESTS]
    colour = dict(zip(names, ("blue", "orange", "green", "purple", "sky")))
    arrivals = ", ".join(f"{n} arrives at step {a}" for n, a, _ in TIMELINE_REQUESTS if a)
    cell = 26
    alt = (f"Two timelines of {TIMELINE_SLOTS} batch slots (rows) over decode steps (columns). Requests A, B and C start "
           f"at step 0; {arrivals}. With static batching the slots of A and C idle until B, the longest, finishes, and D "
           f"and E wait for the next batch: the work ends after {len(rows['static'][0])} steps. With continuous batching a "
           f"finished request's slot goes to the next waiting one at once: it ends after {len(rows['continuous'][0])} steps.")
    d = Diagram("ch11_batching_timeline", 440, 334, title="Static and continuous batching over time", alt=alt)
    x0 = 120
    for k, (policy, rs) in enumerate(rows.items()):
        y = 44 + k * 140
        d.text(20, y - 10, policy, size=15, weight="bold", anchor="start")
        fills = [[colour[c] if c else "none" for c in r] + ["none"] * (steps - len(r)) for r in rs]
        labels = [[c for c in r] + [""] * (steps - len(r)) for r in rs]
        d.grid(x0, y, fills, cell=cell, labels=labels, size=14, row_labels=[f"slot {i}" for i in range(len(rs))])
    d.text(20, 296, f"{arrivals}; empty cell: idle slot", size=14, anchor="start")
    d.text(20, 318, f"columns: decode steps 0 .. {steps - 1}", size=14, anchor="start")
    return d


@diagram
def speculative_diagram() -> Diagram:
    k = len(SPEC_DRAFT)
    agree = 0
    while agree < k and SPEC_DRAFT[agree] == SPEC_TARGET[agree]:
        agree += 1
    kept = list(SPEC_DRAFT[:agree]) + [SPEC_TARGET[agree]]
    d = Diagram("ch11_speculative", 440, 300, title="Speculative decoding: one target pass checks k drafted tokens",
                alt=f"After the prompt '{SPEC_PROMPT}', a draft model proposes {k} words: "
                    f"{', '.join(SPEC_DRAFT)}. The target model runs once over all of them and gives its own next "
                    f"word after every prefix: {', '.join(SPEC_TARGET)}. The first {agree} drafted words agree and "
                    f"are kept; at the first disagreement the target's word '{SPEC_TARGET[agree]}' is kept instead, "
                    f"so the round yields {len(kept)} words from one target pass, and the cache is rolled back over "
                    f"the rejected drafted positions. The drafted words after the first disagreement are not "
                    f"compared: they followed a word that was rejected.")
    x0, w = 124, 60
    d.text(20, 30, f"prompt: \"{SPEC_PROMPT}\"", size=15, anchor="start")
    rows = (("draft", SPEC_DRAFT), ("target", SPEC_TARGET))
    for r, (label, words) in enumerate(rows):
        y = 56 + r * 70
        d.text(20, y + 20, label, size=15, anchor="start", weight="bold")
        for i, wd in enumerate(words):
            rejected = label == "draft" and i >= agree
            d.box(x0 + i * w, y, w - 6, 30, wd, color="grey" if rejected else ("sky" if label == "draft" else "blue"),
                  size=14, dash=rejected)
    for i in range(k):  # compared up to the first disagreement; the later positions no longer count
        mark, colour = ("=", "green") if i < agree else ("x", "vermillion") if i == agree else ("-", MUTED)
        d.text(x0 + i * w + (w - 6) / 2, 112, mark, size=16, color=colour, weight="bold")
    y = 210
    d.text(20, y + 20, "kept", size=15, anchor="start", weight="bold")
    for i, wd in enumerate(kept):
        d.box(x0 + i * w, y, w - 6, 30, wd, color="green", size=14)
    d.text(20, 180, "target: one pass over all drafted positions", size=14, anchor="start", color=MUTED)
    d.text(20, 276, f"{len(kept)} tokens for one target pass; roll the cache back", size=14, anchor="start")
    d.text(20, 294, f"over the {k - agree} rejected positions", size=14, anchor="start")
    return d


#: the prefix-sharing picture: three requests in blocks of 3 words, the running example first
PREFIX_BLOCK = 3
PREFIX_REQUESTS = (
    "The books on the shelf are old . Dust",
    "The books on the shelf are old . Nobody",
    "The books on the desk are new . We",
)


def prefix_example() -> list[list[tuple[str, str]]]:
    """Each request's full blocks as (words, short chained hash), from :func:`ch11.block_hashes`."""
    from .paging import block_hashes

    vocab: dict[str, int] = {}
    out = []
    for text in PREFIX_REQUESTS:
        words = text.split()
        ids = [vocab.setdefault(w, len(vocab)) for w in words]
        hashes = block_hashes(ids, PREFIX_BLOCK)
        out.append([(" ".join(words[i * PREFIX_BLOCK:(i + 1) * PREFIX_BLOCK]), h[:4]) for i, h in enumerate(hashes)])
    return out


@diagram
def prefix_sharing_diagram() -> Diagram:
    rows = prefix_example()
    alt = (f"Three requests cut into blocks of {PREFIX_BLOCK} words; each block is named by a hash of its words and of "
           "the previous block's hash. Requests A and B begin 'The books on the shelf are old .', so their first two "
           "blocks have the same names and are stored once; their third blocks differ. Request C shares only its "
           "first block: its second holds other words, so its name, and every later one, differs.")
    d = Diagram("ch11_prefix_sharing", 440, 320, title="Prefix sharing: blocks named by chained hashes", alt=alt)
    colours = ("blue", "orange", "green", "purple", "sky", "yellow", "vermillion")
    seen: dict[str, int] = {}
    w, h, x0 = 120, 52, 40
    for r, blocks in enumerate(rows):
        y = 30 + r * 76
        d.text(14, y + 32, "ABC"[r], size=16, weight="bold", anchor="start")
        for i, (words, hsh) in enumerate(blocks):
            first = hsh not in seen
            colour = colours[seen.setdefault(hsh, len(seen)) % len(colours)]
            x = x0 + i * (w + 8)
            d.rect(x, y, w, h, fill=colour, tint=True, stroke=colour, width=2, dash=not first)
            d.text(x + w / 2, y + 22, words, size=14)
            d.text(x + w / 2, y + 42, f"#{hsh}" + ("" if first else " shared"), size=14, color=MUTED)
    d.text(20, 268, "same name = same words up to the block's end:", size=14, anchor="start")
    d.text(20, 290, "the block is stored and computed once (dashed:", size=14, anchor="start")
    d.text(20, 310, "a later request's table points at it)", size=14, anchor="start")
    return d


#: the quantisation picture: a key matrix of QUANT_POSITIONS x QUANT_CHANNELS with one outlier channel
QUANT_POSITIONS, QUANT_CHANNELS, QUANT_OUTLIER, QUANT_GROUP = 6, 4, 2, 4


@diagram
def quantisation_groups_diagram() -> Diagram:
    """Which numbers of a cached key matrix share one scale: per token, per channel, and KIVI's keys."""
    S, C, o, G = QUANT_POSITIONS, QUANT_CHANNELS, QUANT_OUTLIER, QUANT_GROUP
    alt = (f"Three copies of a cached key matrix of {S} positions (rows) by {C} channels (columns); channel {o} "
           f"holds large outliers (marked !). Per token: one scale covers a row, so the outlier sets the scale "
           f"of every row. Per channel: one scale covers a column, so the outlier sets only its own column's "
           f"scale. KIVI's keys: one scale per channel over a group of {G} positions, and the newest "
           f"{S - G} positions kept in 16 bits.")
    d = Diagram("ch11_quantisation_groups", 440, 300, title="What one quantisation scale covers", alt=alt)
    cell, tops = 24, 64
    panels = (("per token", [["orange" if r == 1 else "none" for _ in range(C)] for r in range(S)]),
              ("per channel", [["orange" if c == 1 else "none" for c in range(C)] for _ in range(S)]),
              ("KIVI keys", [["grey" if r >= G else ("orange" if c == 1 else "none") for c in range(C)]
                             for r in range(S)]))
    labels = [["!" if c == o else "" for c in range(C)] for _ in range(S)]
    for k, (name, fills) in enumerate(panels):
        x = 34 + k * 140
        d.text(x + C * cell / 2, 30, name, size=15, weight="bold")
        d.grid(x, tops, fills, cell=cell, labels=labels, size=14,
               row_labels=[str(r) for r in range(S)] if k == 0 else None)
    d.text(34 + C * cell / 2, 52, "channels", size=14, color=MUTED)
    d.rect(20, 226, 14, 14, fill="orange", tint=True, stroke="orange", width=2)
    d.text(40, 238, "numbers sharing one scale", size=14, anchor="start")
    d.rect(250, 226, 14, 14, fill="grey", tint=True, stroke="grey", width=2)
    d.text(270, 238, "kept in 16 bits", size=14, anchor="start")
    d.text(20, 266, "! an outlier channel: it sets the scale of every", size=14, anchor="start")
    d.text(20, 286, "group it falls in (a whole row, per token)", size=14, anchor="start")
    return d


#: the chunked-prefill picture: three running requests decode while D's prompt is prefilled, whole or in chunks
CHUNK_RUNNING, CHUNK_NEW, CHUNK_PROMPT, CHUNK_SIZE = ("A", "B", "C"), "D", 1024, 256


def chunked_prefill_steps(chunk: int | None) -> list[tuple[int, int]]:
    """The steps from D's arrival to the first step in which it decodes, as ``(decodes, prompt tokens)``.

    Every step decodes one token of each running request; ``chunk`` caps the prompt tokens a step takes
    (``None``: the whole prompt in one step). The step that ends the prefill gives D's first token.
    """
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be a positive number of tokens or None, got {chunk!r}")
    steps, left = [], CHUNK_PROMPT
    while left:
        n = left if chunk is None else min(chunk, left)
        steps.append((len(CHUNK_RUNNING), n))
        left -= n
    return steps + [(len(CHUNK_RUNNING) + 1, 0)]


@diagram
def chunked_prefill_diagram() -> Diagram:
    from .simulation import StepCost

    cost = StepCost()  # section 11.3's cost model: 20 ms per step plus 0.05 ms per token
    plans = {"whole prompt": chunked_prefill_steps(None), f"chunks of {CHUNK_SIZE}": chunked_prefill_steps(CHUNK_SIZE)}
    ms = {name: [cost(d + p) for d, p in steps] for name, steps in plans.items()}
    (whole, chunked) = plans
    stall, stall_c = max(ms[whole]), max(ms[chunked])
    first, first_c = sum(ms[whole][:-1]), sum(ms[chunked][:-1])
    runners = ", ".join(CHUNK_RUNNING[:-1]) + f" and {CHUNK_RUNNING[-1]}"
    alt = (f"Three running requests, {runners}, decode one token per step when request {CHUNK_NEW} arrives with a "
           f"prompt of {CHUNK_PROMPT:,d} tokens. Each column is one step, a stack of the work it does: a cell per "
           f"decoded token, a cell per {CHUNK_SIZE} prompt tokens. Without chunking one step carries the whole prompt "
           f"with the three decodes and takes {stall:.0f} ms ({cost.fixed_ms:g} ms plus {cost.per_token_ms:g} ms per "
           f"token), so {runners} wait {stall:.0f} ms for their next token. With chunks of {CHUNK_SIZE} the prompt is "
           f"spread over {len(plans[chunked]) - 1} steps of {stall_c:.0f} ms: the running requests never wait more "
           f"than {stall_c:.0f} ms, but {CHUNK_NEW}'s first token comes after {first_c:.0f} ms instead of {first:.0f}.")
    d = Diagram("ch11_chunked_prefill", 440, 350, title="Chunked prefill: a long prompt spread over several steps",
                alt=alt)
    cell, gap, base = 24, 10, 236
    for k, (name, steps) in enumerate(plans.items()):
        x0 = 60 if k == 0 else 200
        width = len(steps) * (cell + gap) - gap
        d.text(x0 + width / 2, 34, name, size=15, weight="bold")
        for i, (dec, prompt) in enumerate(steps):
            x = x0 + i * (cell + gap)
            labels = [*CHUNK_RUNNING, CHUNK_NEW][:dec] + ["P"] * (prompt // CHUNK_SIZE)
            for r, lab in enumerate(labels):
                y = base - (r + 1) * cell
                d.rect(x, y, cell, cell, fill="orange" if lab == "P" else "blue", tint=True, stroke=INK, rx=0, width=1)
                d.text(x + cell / 2, y + cell / 2 + 5, lab, size=14)
            d.text(x + cell / 2, base + 20, f"{ms[name][i]:.0f}", size=14, color=MUTED)
    d.text(20, base + 20, "ms", size=14, color=MUTED, anchor="start")
    d.rect(20, base + 36, 14, 14, fill="blue", tint=True, stroke="blue", width=2)
    d.text(40, base + 48, "one decoded token", size=14, anchor="start")
    d.rect(200, base + 36, 14, 14, fill="orange", tint=True, stroke="orange", width=2)
    d.text(220, base + 48, f"P: {CHUNK_SIZE} prompt tokens of {CHUNK_NEW}", size=14, anchor="start")
    d.text(20, base + 76, f"longest wait for a running request: {stall:.0f} ms, or {stall_c:.0f}", size=14, anchor="start")
    d.text(20, base + 96, f"{CHUNK_NEW}'s first token: after {first:.0f} ms, or {first_c:.0f} with chunks", size=14,
           anchor="start")
    return d


#: the sink picture: the StreamingLLM cache of section 11.6 (4 sinks + 28 recent, a window of 32) at query
#: token 100, and exercise 11.4's worked example (scores 2 and 0, a sink logit of 1)
SINK_TOKENS, SINK_WINDOW, SINK_QUERY = 4, 32, 100
SINK_SCORES, SINK_LOGIT = (2.0, 0.0), 1.0


def sink_cache_example() -> dict[str, object]:
    """Which tokens a StreamingLLM cache keeps at query ``SINK_QUERY``, and the weights of the softmax example.

    The recent tokens are the last ``SINK_WINDOW - SINK_TOKENS``, the query's own included, as in
    :func:`stream_loss`; the weights are ``softmax([scores, sink])``: the keys' and the sink's.
    """
    start = SINK_QUERY - (SINK_WINDOW - SINK_TOKENS) + 1  # the oldest recent token kept
    w = torch.softmax(torch.tensor([*SINK_SCORES, SINK_LOGIT], dtype=torch.float64), 0).tolist()
    return {"sinks": (0, SINK_TOKENS - 1), "evicted": (SINK_TOKENS, start - 1), "recent": (start, SINK_QUERY),
            "weights": w[:-1], "sink_weight": w[-1]}


@diagram
def sink_cache_diagram() -> Diagram:
    ex = sink_cache_example()
    (s0, s1), (e0, e1), (r0, r1) = ex["sinks"], ex["evicted"], ex["recent"]
    n_recent = r1 - r0 + 1
    w, ws = ex["weights"], ex["sink_weight"]
    alt = (f"A StreamingLLM cache at query token {SINK_QUERY} with a window of {SINK_WINDOW}: tokens {s0} to {s1} are "
           f"kept as sinks, tokens {e0} to {e1} are evicted, and tokens {r0} to {r1} are kept as the {n_recent} recent "
           f"ones. Positions are given by cache slot: the sinks take slots 0 to {SINK_TOKENS - 1} and the recent tokens "
           f"slots {SINK_TOKENS} to {SINK_WINDOW - 1}, so no distance exceeds {SINK_WINDOW - 1}. Below, a softmax with "
           f"a learned sink logit: two keys with scores {SINK_SCORES[0]:g} and {SINK_SCORES[1]:g} and a sink logit of "
           f"{SINK_LOGIT:g}; the keys get {w[0]:.3f} and {w[1]:.3f} of the weight, and the sink's extra term in the "
           f"denominator takes the remaining {ws:.3f}, attached to a value of zero.")
    d = Diagram("ch11_sink_cache", 440, 362, title="Attention sinks: a StreamingLLM cache and a sink logit", alt=alt)
    d.text(20, 26, f"window {SINK_WINDOW} at token {SINK_QUERY}: {SINK_TOKENS} sinks + {n_recent} recent",
           size=14, anchor="start", weight="bold")
    y = 56
    d.text(20, y - 8, "tokens", size=14, anchor="start", color=MUTED)
    d.box(20, y, 90, 40, f"{s0}-{s1}", sub="sinks", color="orange", size=16)
    d.box(120, y, 130, 40, f"{e0}-{e1}", sub="evicted", color="grey", size=16, dash=True)
    d.box(260, y, 160, 40, f"{r0}-{r1}", sub="recent", color="blue", size=16)
    y2 = 150
    d.text(20, y2 - 8, "cache slots (the positions the model sees)", size=14, anchor="start", color=MUTED)
    d.box(20, y2, 90, 32, f"0-{SINK_TOKENS - 1}", color="orange", size=15)
    d.box(120, y2, 300, 32, f"{SINK_TOKENS}-{SINK_WINDOW - 1}", color="blue", size=15)
    d.arrow(65, y + 42, 65, y2 - 22, color="orange")
    d.arrow(340, y + 42, 270, y2 - 22, color="blue")
    y3 = 228
    d.text(20, y3 - 10, f"a sink logit: scores {SINK_SCORES[0]:g}, {SINK_SCORES[1]:g}; sink {SINK_LOGIT:g}",
           size=14, anchor="start", weight="bold")
    x, width = 20, 400
    for i, (share, colour) in enumerate(((w[0], "blue"), (w[1], "sky"), (ws, "grey"))):
        seg = width * share
        d.rect(x, y3, seg, 30, fill=colour, tint=True, stroke=colour, rx=0, width=2, dash=i == 2)
        d.text(x + seg / 2, y3 + 20, f"{share:.2f}", size=14)
        x += seg
    d.text(20, y3 + 52, "key 1, key 2, and the sink's term (value 0):", size=14, anchor="start")
    d.text(20, y3 + 74, "weight of key j = exp(s_j) /", size=14, anchor="start")
    d.text(60, y3 + 96, "(exp(sink) + sum over k of exp(s_k))", size=14, anchor="start")
    d.text(20, y3 + 120, "the keys' weights sum to less than 1", size=14, anchor="start", color=MUTED)
    return d
