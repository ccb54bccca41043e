"""Chapter 11.6: attention sinks: a learned sink logit, a small RoPE decoder, streaming with a bounded cache."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlib import _checks, causal_mask

from ._common import _OneThread, float_tensor, instance, is_int, positive_int, tensor_with_dims, token_ids
from .model import rope

def sink_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, sink_logit: Tensor | None = None) -> Tensor:
    """Attention ``[B, H, S_q, D_k]`` whose softmax denominator has one more term per head, ``exp(sink_logit[h])``.

    The sink is a key every query sees with value zero: the weights over the real keys then sum to
    less than one, so a head can attend to "nothing". Without ``sink_logit``, ordinary attention.
    ``mask``: bool, True = may attend, broadcasting to ``[B, H, S_q, S_k]``; ``sink_logit``: ``[H]``.
    """
    tensor_with_dims("q", q, 4, "[B, H, S_q, D_k]")
    _checks.qkv(q, k, v, mask)
    if sink_logit is not None and float_tensor("sink_logit", sink_logit).shape != q.shape[1:2]:
        raise ValueError(f"sink_logit must be [H] = [{q.shape[1]}], one per head, got shape {tuple(sink_logit.shape)}")
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, H, S_q, S_k]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sink_logit is None:
        return torch.softmax(scores, -1) @ v
    sink = sink_logit.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)  # [B, H, S_q, 1]
    weights = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]  # drop the sink's column
    return weights @ v  # [B, H, S_q, D_k]


def sink_logsumexp(scores: Tensor, sink_logit: Tensor) -> Tensor:
    """``log(exp(sink) + sum_j exp(s_j))`` per row, stably: the denominator with the sink term.

    ``scores [..., S_k]``; ``sink_logit`` broadcasts to ``scores.shape[:-1]`` (e.g. ``[1, H, 1]`` for ``[B, H, S_q, S_k]``).
    """
    float_tensor("scores", scores, min_dim=1), float_tensor("sink_logit", sink_logit)
    try:
        torch.broadcast_to(sink_logit, scores.shape[:-1])
    except RuntimeError:
        raise ValueError(f"sink_logit shape {tuple(sink_logit.shape)} cannot broadcast to the rows "
                         f"{tuple(scores.shape[:-1])} of scores {tuple(scores.shape)}") from None
    return torch.logaddexp(torch.logsumexp(scores, -1), sink_logit.expand(scores.shape[:-1]))


class SinkLM(torch.nn.Module):
    """A small character-level decoder with RoPE, for the attention-sink experiments.

    ``layers`` pre-norm blocks (RMSNorm, attention with rotary positions, a GELU MLP of width 4D).
    With ``sink=True`` each head has a learned sink logit, one extra term in its softmax denominator
    (as in gpt-oss). Rotary positions make the attention depend only on distances, so the model can
    run over streams longer than it was trained on, with any cache policy (:func:`stream_loss`).
    """

    def __init__(self, vocab_size: int, d_model: int = 64, num_heads: int = 4, layers: int = 2, sink: bool = False) -> None:
        super().__init__()
        vocab_size, layers = positive_int("vocab_size", vocab_size), positive_int("layers", layers)
        d_model, num_heads, _ = _checks.head_counts(d_model, num_heads)
        if (d_model // num_heads) % 2:
            raise ValueError(f"d_model // num_heads = {d_model // num_heads} must be even for rotary positions")
        sink = _checks.flag("sink", sink)
        self.H, self.D_k = num_heads, d_model // num_heads
        self.embed = torch.nn.Embedding(vocab_size, d_model)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            block = torch.nn.Module()
            block.norm1, block.norm2 = torch.nn.RMSNorm(d_model), torch.nn.RMSNorm(d_model)
            block.qkv = torch.nn.Linear(d_model, 3 * d_model, bias=False)
            block.out = torch.nn.Linear(d_model, d_model, bias=False)
            block.mlp = torch.nn.Sequential(torch.nn.Linear(d_model, 4 * d_model), torch.nn.GELU(), torch.nn.Linear(4 * d_model, d_model))
            block.sink = torch.nn.Parameter(torch.zeros(num_heads)) if sink else None
            self.blocks.append(block)
        self.norm = torch.nn.RMSNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab_size, bias=False)

    def _qkv(self, block: Any, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, S, _ = x.shape
        q, k, v = block.qkv(block.norm1(x)).view(B, S, 3, self.H, self.D_k).permute(2, 0, 3, 1, 4)  # 3 x [B, H, S, D_k]
        return q, k, v

    @torch.no_grad()
    def attention_weights(self, ids: Tensor) -> list[Tensor]:
        """Every layer's attention weights in one causal pass over ``ids [B, S]``.

        One ``[B, H, S, S]`` tensor per layer, with one more column (the learned sink's share) when the
        model has sink logits. The residual stream is computed as in :meth:`forward`.
        """
        x = self.embed(token_ids("ids", ids, 2, "[B, S]"))  # [B, S, D]
        B, S = ids.shape
        pos = torch.arange(S)
        weights = []
        for block in self.blocks:
            q, k, v = self._qkv(block, x)
            q, k = rope(q, pos, 10000.0), rope(k, pos, 10000.0)
            scores = (q @ k.transpose(-2, -1) / math.sqrt(self.D_k)).masked_fill(~causal_mask(S), float("-inf"))  # [B, H, S, S]
            if block.sink is not None:  # the sink's column: one extra term per head
                scores = torch.cat([scores, block.sink.view(1, -1, 1, 1).expand(B, self.H, S, 1)], -1)  # [B, H, S, S + 1]
            weights.append(torch.softmax(scores, -1))
            att = sink_attention(q, k, v, causal_mask(S), block.sink)  # [B, H, S, D_k]
            x = x + block.out(att.transpose(1, 2).flatten(2))
            x = x + block.mlp(block.norm2(x))
        return weights

    def forward(self, ids: Tensor) -> Tensor:
        """Logits ``[B, S, V]`` of one causal pass over ``ids [B, S]`` (training and full-attention evaluation)."""
        x = self.embed(token_ids("ids", ids, 2, "[B, S]"))  # [B, S, D]
        S = ids.shape[1]
        pos = torch.arange(S)
        for block in self.blocks:
            q, k, v = self._qkv(block, x)
            q, k = rope(q, pos, 10000.0), rope(k, pos, 10000.0)
            att = sink_attention(q, k, v, causal_mask(S), block.sink)  # [B, H, S, D_k]
            x = x + block.out(att.transpose(1, 2).flatten(2))
            x = x + block.mlp(block.norm2(x))
        return self.head(self.norm(x))


@torch.no_grad()
def stream_loss(model: SinkLM, ids: Tensor, *, window: int | None, sinks: int = 0) -> Tensor:
    """Per-token loss ``[S - 1]`` of decoding the stream ``ids [S]`` one token at a time with a bounded cache.

    The cache keeps the first ``sinks`` positions and the last ``window - sinks`` (``window=None``:
    every position). Positions are those of the cache's slots, as in StreamingLLM: the query sits in
    the last slot, the recent keys just before it, the sinks in the first slots, so no distance the
    model sees exceeds the cache's length. (Rotary scores depend only on distances, so the recent
    keys keep the rotation of their original positions; only the sinks are rotated again each step.)
    ``ids`` holds at least 2 tokens; ``sinks`` needs a ``window`` larger than it.
    """
    instance("model", model, SinkLM, "a SinkLM")
    if token_ids("ids", ids, 1, "[S]").numel() < 2:
        raise ValueError(f"ids must hold at least 2 tokens (one to predict), got {ids.numel()}")
    sinks = positive_int("sinks", sinks, minimum=0)
    if window is None and sinks:
        raise ValueError(f"sinks = {sinks} needs a window (window=None keeps every position)")
    if window is not None and positive_int("window", window) <= sinks:
        raise ValueError(f"window = {window} must be larger than sinks = {sinks}: the window holds the sinks and the recent keys")
    model.eval()
    with _OneThread():  # tiny operations: one thread avoids waiting for the others
        return _stream_loss(model, ids, window, sinks)


@torch.no_grad()
def _stream_loss(model: SinkLM, ids: Tensor, window: int | None, sinks: int) -> Tensor:
    S, H, D_k = ids.numel(), model.H, model.D_k
    bufs = [{name: torch.zeros(1, H, S, D_k) for name in ("rotated", "raw", "values")} for _ in model.blocks]
    losses = []
    for t in range(S - 1):
        x = model.embed(ids[t : t + 1])[None]  # [1, 1, D]
        here = torch.tensor([t])
        for block, buf in zip(model.blocks, bufs):
            q, k, v = model._qkv(block, x)  # [1, H, 1, D_k] each
            buf["raw"][:, :, t : t + 1], buf["values"][:, :, t : t + 1] = k, v
            buf["rotated"][:, :, t : t + 1] = rope(k, here, 10000.0)
            if window is None or t < window:  # everything so far fits
                keys, values = buf["rotated"][:, :, : t + 1], buf["values"][:, :, : t + 1]  # [1, H, t + 1, D_k]
            else:
                start = t - (window - sinks) + 1  # the oldest recent position kept
                sink_pos = torch.arange(start - sinks, start)  # the sinks' slots, just before the recent keys
                keys = torch.cat([rope(buf["raw"][:, :, :sinks], sink_pos, 10000.0), buf["rotated"][:, :, start : t + 1]], 2)
                values = torch.cat([buf["values"][:, :, :sinks], buf["values"][:, :, start : t + 1]], 2)  # [1, H, window, D_k]
            att = sink_attention(rope(q, here, 10000.0), keys, values, None, block.sink)  # [1, H, 1, D_k]
            x = x + block.out(att.transpose(1, 2).flatten(2))
            x = x + block.mlp(block.norm2(x))
        logits = model.head(model.norm(x))[0, 0]  # [V]
        losses.append(F.cross_entropy(logits[None], ids[t + 1 : t + 2]))
    return torch.stack(losses)


def train_sink_lm(sink: bool, *, steps: int = 600, seq_len: int = 128, batch_size: int = 16, seed: int = 0) -> tuple[SinkLM, list[float]]:
    """Train a :class:`SinkLM` on the book's text (all but its last 1,000 characters), one thread, seeded."""
    sizes = dict(steps=steps, seq_len=seq_len, batch_size=batch_size)
    steps, seq_len, batch_size = (positive_int(name, value) for name, value in sizes.items())
    if not is_int(seed):
        raise ValueError(f"seed must be an int, got {seed!r}")
    from ..toy_lm import CharVocab, load_text, sample_batch

    text = load_text()
    vocab = CharVocab(text)
    data = vocab.encode(text[:-1000])
    torch.manual_seed(seed)
    model = SinkLM(len(vocab), sink=sink)  # checks sink
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    losses = []
    try:
        model.train()
        for _ in range(steps):
            x, y = sample_batch(data, batch_size, seq_len, gen)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return model.eval(), losses


SINK_CHECKPOINT = "sink_lm.pt"


def load_sink_models() -> dict[str, Any]:
    """The two shipped :class:`SinkLM` checkpoints (``tools/train_sink_lm.py`` reproduces them)."""
    from ..toy_lm import DATA_DIR, CharVocab, load_text

    blob = torch.load(DATA_DIR / SINK_CHECKPOINT, weights_only=True)
    vocab = CharVocab(load_text())
    models = {}
    for name in ("plain", "sink"):
        m = SinkLM(len(vocab), sink=name == "sink")
        m.load_state_dict(blob[name])
        models[name] = m.eval()
    return {"models": models, "vocab": vocab, "losses": blob["losses"]}


# ---- a head that must sometimes attend to nothing --------------------------------------------------

def nothing_to_attend(*, trials: int = 200, context: int = 32, d_k: int = 16, beta: float = 12.0, margin: float = 4.0,
                      seed: int = 0) -> dict[str, dict[str, float]]:
    """A constructed head that copies a marker's value when the marker is in context and should output 0 otherwise.

    Every query is ``beta * u``; the marker's key is ``u`` (a unit vector) and its value ``v*``; the other
    ``context`` keys and values are random and nearly orthogonal to ``u``. Scores use no 1/sqrt(d_k) here
    (``scale = 1``), so the marker scores ``beta`` and the others about 0. Three ways to attend:

    * ``"softmax"``: plain attention, the weights sum to 1 over the keys in context;
    * ``"sink token"``: a token kept at position 0 with key ``(beta - margin) / beta * u``, so it scores
      ``beta - margin``, and value 0 (what StreamingLLM keeps);
    * ``"sink logit"``: no token, one more denominator term ``exp(beta - margin)`` (gpt-oss's learned sink).

    Returns, per way, the output's error ``|out - target| / |v*|`` averaged over ``trials`` draws, with the
    marker present (target ``v*``) and absent (target 0). A window that evicts the sink token turns that
    row back into the plain softmax.
    """
    trials, context, d_k = positive_int("trials", trials), positive_int("context", context), positive_int("d_k", d_k, minimum=2)
    gen = torch.Generator().manual_seed(seed)
    ways = ("softmax", "sink token", "sink logit")
    errors: dict[str, dict[str, list[float]]] = {w: {"present": [], "absent": []} for w in ways}
    for _ in range(trials):
        u = F.normalize(torch.randn(d_k, generator=gen, dtype=torch.float64), dim=0)
        keys = torch.randn(context, d_k, generator=gen, dtype=torch.float64) / math.sqrt(d_k)
        keys -= (keys @ u)[:, None] * u  # the other keys score exactly 0 against the query
        values = torch.randn(context, d_k, generator=gen, dtype=torch.float64)
        target_v = torch.randn(d_k, generator=gen, dtype=torch.float64)
        q = beta * u
        for case in ("present", "absent"):
            k, v = keys.clone(), values.clone()
            if case == "present":
                k[-1], v[-1] = u, target_v  # the marker, the newest position
            target = target_v if case == "present" else torch.zeros(d_k, dtype=torch.float64)
            for way in ways:
                kk, vv, extra = k, v, None
                if way == "sink token":
                    kk = torch.cat([((beta - margin) / beta * u)[None], k])
                    vv = torch.cat([torch.zeros(1, d_k, dtype=torch.float64), v])
                if way == "sink logit":
                    extra = torch.tensor(beta - margin, dtype=torch.float64)
                scores = kk @ q  # [S]
                if extra is not None:
                    scores = torch.cat([scores, extra[None]])
                    vv = torch.cat([vv, torch.zeros(1, d_k, dtype=torch.float64)])
                out = torch.softmax(scores, 0) @ vv
                errors[way][case].append(float((out - target).norm() / target_v.norm()))
    return {w: {c: float(np.mean(e)) for c, e in by.items()} for w, by in errors.items()}
