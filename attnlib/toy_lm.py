"""A tiny next-token language model, small enough to train on a CPU in seconds.

Chapter 4 uses it for two experiments about the causal mask:

* **cheating**: train it once without and once with the causal mask and compare what it learns;
* **speed**: time one parallel masked pass over ``S`` tokens against ``S`` passes over the
  prefixes ``x[:1], x[:2], ..., x[:S]`` (what training without a mask but without cheating
  would have to do).

Shapes: ``B`` batch, ``S`` positions, ``D = d_model``, ``V`` vocabulary size.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cost import interleaved_median_ms
from .multihead import MultiHeadSelfAttention

__all__ = [
    "DATA_DIR", "CharVocab", "TinyLM", "load_text", "sample_batch", "train_next_token",
    "evaluate_loss", "generate", "time_parallel_and_prefixes",
]

#: Where the texts that ship with attnlib live.
DATA_DIR = Path(__file__).resolve().parent / "data"


def load_text(name: str = "small_tales.txt") -> str:
    """Read a text from :data:`DATA_DIR`, without its header lines (those starting with ``#``)."""
    path = DATA_DIR / name
    if not path.is_file():
        available = sorted(p.name for p in DATA_DIR.glob("*.txt"))
        raise ValueError(f"no text named {name!r} in {DATA_DIR}; available: {available}")
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if not line.startswith("#")).strip() + "\n"


class CharVocab:
    """Character-level vocabulary: every distinct character of a text is one token.

    Args:
        text: the text whose characters make up the vocabulary (sorted, so it is reproducible).
    """

    def __init__(self, text: str) -> None:
        if not text:
            raise ValueError("CharVocab needs a non-empty text")
        self.chars: list[str] = sorted(set(text))
        self.index: dict[str, int] = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> Tensor:
        """``str`` of length ``N`` -> ``[N]`` int64 token ids."""
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            raise ValueError(f"characters {unknown} are not in the vocabulary of {len(self)} characters")
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)  # [N]

    def decode(self, ids: Tensor | list[int]) -> str:
        """``[N]`` token ids -> ``str``."""
        values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return "".join(self.chars[i] for i in values)


class TinyLM(nn.Module):
    """Token embedding + learned positional embedding + one multi-head self-attention + output head.

    ``logits = head(x + attention(x))`` with ``x = embed(ids) + pos(0..S-1)``: a single
    attention layer with a residual connection, no MLP, no LayerNorm. That is enough to show
    what a model learns with and without the causal mask.

    Args:
        vocab_size: ``V``.
        d_model: ``D``.
        num_heads: ``H`` (``D`` must be divisible by it).
        max_len: the longest sequence the positional embedding covers.
    """

    def __init__(self, vocab_size: int, d_model: int = 64, num_heads: int = 4, max_len: int = 64) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.max_len = max_len
        self.embed = nn.Embedding(vocab_size, d_model)  # [V, D]
        self.pos = nn.Embedding(max_len, d_model)  # [max_len, D]
        self.attention = MultiHeadSelfAttention(d_model, num_heads)
        self.head = nn.Linear(d_model, vocab_size)  # [D] -> [V]

    def forward(self, ids: Tensor, *, causal: bool) -> Tensor:
        """Next-token logits for every position.

        Args:
            ids: ``[B, S]`` token ids with ``S <= max_len``.
            causal: whether position ``i`` may only look at positions ``0..i``.

        Returns:
            ``[B, S, V]`` logits; position ``i`` predicts token ``i + 1``.
        """
        if ids.dim() != 2 or ids.shape[1] > self.max_len:
            raise ValueError(f"ids must be [B, S] with S <= max_len = {self.max_len}, got shape {tuple(ids.shape)}")
        S = ids.shape[1]
        x = self.embed(ids) + self.pos(torch.arange(S, device=ids.device))  # [B, S, D]
        x = x + self.attention(x, causal=causal, need_weights=False).hidden_states  # [B, S, D]
        return self.head(x)  # [B, S, V]


def sample_batch(data: Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random windows of a token stream: inputs and the same windows shifted by one.

    Args:
        data: ``[N]`` token ids.
        generator: a seeded ``torch.Generator`` (CPU) so the batches are reproducible.

    Returns:
        ``x [B, S]`` and ``y [B, S]`` with ``y[:, i] = x[:, i + 1]`` for ``i < S - 1``.
    """
    if data.dim() != 1 or data.numel() < seq_len + 2:
        raise ValueError(f"data must be [N] with N >= seq_len + 2 = {seq_len + 2}, got shape {tuple(data.shape)}")
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch_size,), generator=generator)  # [B]
    offsets = torch.arange(seq_len)  # [S]
    x = data[starts[:, None] + offsets]  # [B, S]
    y = data[starts[:, None] + offsets + 1]  # [B, S]
    return x, y


def _loss(model: TinyLM, x: Tensor, y: Tensor, causal: bool) -> Tensor:
    logits = model(x, causal=causal)  # [B, S, V]
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())  # mean over B * S predictions


def train_next_token(
    model: TinyLM,
    data: Tensor,
    *,
    causal: bool,
    steps: int = 300,
    batch_size: int = 32,
    seq_len: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` to predict the next token with AdamW, on the CPU, in one thread.

    One thread makes the run bit-for-bit reproducible on a given machine (floating-point
    sums do not depend on how the work is split); the thread count is restored afterwards.

    Args:
        data: ``[N]`` token ids of the training text.
        causal: train with (True) or without (False) the causal mask.

    Returns:
        The training loss (nats per token) after each of the ``steps`` steps.
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    losses: list[float] = []
    try:
        model.train()
        for _ in range(steps):
            x, y = sample_batch(data, batch_size, seq_len, generator)  # [B, S], [B, S]
            loss = _loss(model, x, y, causal)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return losses


@torch.no_grad()
def evaluate_loss(model: TinyLM, data: Tensor, *, causal: bool, seq_len: int = 64, batch_size: int = 64, seed: int = 1) -> float:
    """Mean next-token loss (nats per token) on one fixed, seeded batch of windows of ``data [N]``."""
    generator = torch.Generator().manual_seed(seed)
    x, y = sample_batch(data, batch_size, seq_len, generator)  # [B, S], [B, S]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.eval()
        return float(_loss(model, x, y, causal))
    finally:
        torch.set_num_threads(threads)


@torch.no_grad()
def generate(model: TinyLM, prompt: Tensor, new_tokens: int, *, causal: bool) -> Tensor:
    """Greedy autoregressive generation: append the most likely next token, ``new_tokens`` times.

    The future does not exist yet, so each step can only feed what has been generated so far
    (the last ``max_len`` tokens) and read the prediction at the last position.

    Args:
        prompt: ``[S0]`` token ids.

    Returns:
        ``[S0 + new_tokens]`` token ids.
    """
    if prompt.dim() != 1 or prompt.numel() < 1:
        raise ValueError(f"prompt must be [S0] with S0 >= 1, got shape {tuple(prompt.shape)}")
    model.eval()
    ids = prompt.clone()
    for _ in range(new_tokens):
        window = ids[-model.max_len:][None]  # [1, S]
        logits = model(window, causal=causal)[0, -1]  # [V], the prediction at the last position
        ids = torch.cat([ids, logits.argmax()[None]])  # [S + 1]
    return ids


@torch.no_grad()
def time_parallel_and_prefixes(
    attention: MultiHeadSelfAttention,
    x: Tensor,
    *,
    repeats: int = 5,
    parallel_repeats: int | None = None,
    cpu_threads: int | None = None,
) -> tuple[float, float]:
    """Median wall time of the two ways to get a causal output for every position of ``x``.

    * parallel: one call ``attention(x, causal=True)`` over all ``S`` positions;
    * prefixes: ``S`` calls ``attention(x[:, :i])`` for ``i = 1..S``, keeping the last position
      of each (no mask needed: a prefix has no future). This is the same result, computed the
      way a model without a causal mask would have to compute it to avoid cheating.

    Both use PyTorch's fused attention (``need_weights=False``). One warm-up run of each comes
    first.

    Args:
        attention: the module to time (its device is where the timing runs).
        x: ``[B, S, D]`` input on the module's device.
        repeats: how many timed runs of the prefixes; the median is returned.
        parallel_repeats: how many timed runs of the parallel pass (default ``4 * repeats``). It
            is cheap, so more runs buy a steadier median at little cost.
        cpu_threads: on a CPU, run with this many threads (restored afterwards); ``None`` keeps
            PyTorch's setting. With ``cpu_threads=1`` the clock is the CPU time of the calling
            thread (``time.thread_time``), which other programs sharing the machine cannot inflate;
            otherwise it is wall time (``time.perf_counter``, after synchronising a GPU).

    Returns:
        ``(parallel_seconds, prefixes_seconds)``.
    """
    if repeats < 1 or (parallel_repeats is not None and parallel_repeats < 1):
        raise ValueError(f"repeats must be >= 1, got repeats={repeats}, parallel_repeats={parallel_repeats}")
    if x.dim() != 3:
        raise ValueError(f"x must be [B, S, D], got shape {tuple(x.shape)}")
    S = x.shape[1]

    def parallel() -> Tensor:
        return attention(x, causal=True, need_weights=False).hidden_states  # [B, S, D]

    def prefixes() -> Tensor:
        outs = [attention(x[:, :i], need_weights=False).hidden_states[:, -1] for i in range(1, S + 1)]  # S x [B, D]
        return torch.stack(outs, dim=1)  # [B, S, D]

    device = x.device
    threads = torch.get_num_threads()
    if cpu_threads is not None and device.type == "cpu":
        torch.set_num_threads(cpu_threads)
    try:
        n_parallel = 4 * repeats if parallel_repeats is None else parallel_repeats
        clock = time.thread_time if (cpu_threads == 1 and device.type == "cpu") else time.perf_counter
        ms = [
            interleaved_median_ms({"run": fn}, repeats=n, warmup=1, device=device, clock=clock)["run"]
            for fn, n in ((parallel, n_parallel), (prefixes, repeats))
        ]
        return ms[0] / 1000.0, ms[1] / 1000.0
    finally:
        torch.set_num_threads(threads)
