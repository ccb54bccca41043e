"""A tiny next-token language model, small enough to train on a CPU in seconds.

Chapter 4 uses it for two experiments about the causal mask (chapter 10 generates text with it,
with and without a KV cache):

* **cheating**: train it once without and once with the causal mask and compare what it learns;
* **speed**: time one parallel masked pass over ``S`` tokens against ``S`` passes over the
  prefixes ``x[:1], x[:2], ..., x[:S]`` (what training without a mask but without cheating
  would have to do).

Shapes: ``B`` batch, ``S`` positions, ``D = d_model``, ``V`` vocabulary size.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlib.kv_cache import KVCache
from attnlib.multihead import MultiHeadSelfAttention

__all__ = [
    "DATA_DIR", "CharVocab", "TinyLM", "load_text", "sample_batch", "train_next_token",
    "evaluate_loss", "generate", "TRAINED", "TRAINED_CHECKPOINT", "train_shipped", "load_trained",
]

#: Where the texts that ship with the book live.
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

    def forward(self, ids: Tensor, *, causal: bool, cache: KVCache | None = None) -> Tensor:
        """Next-token logits for every position.

        Args:
            ids: ``[B, S]`` token ids with ``S <= max_len`` (with a cache: the new tokens only).
            causal: whether position ``i`` may only look at positions ``0..i``.
            cache: the attention layer's :class:`attnlib.KVCache`; the new tokens get the
                positions after the ``cache.length`` tokens it has seen.

        Returns:
            ``[B, S, V]`` logits; position ``i`` predicts token ``i + 1``.
        """
        start = 0 if cache is None else cache.length
        if ids.dim() != 2 or start + ids.shape[1] > self.max_len:
            raise ValueError(
                f"ids must be [B, S] with {start} cached + S <= max_len = {self.max_len}, got shape {tuple(ids.shape)}"
            )
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)  # [S]
        x = self.embed(ids) + self.pos(positions)  # [B, S, D]
        x = x + self.attention(x, causal=causal, need_weights=False, cache=cache).hidden_states  # [B, S, D]
        return self.head(x)  # [B, S, V]

    @torch.no_grad()
    def generate(
        self,
        prompt: Tensor,
        max_new_tokens: int,
        *,
        use_cache: bool = True,
        temperature: float = 1.0,
        greedy: bool = True,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Autoregressive generation: append one predicted token ``max_new_tokens`` times.

        With ``use_cache`` the prompt runs once (prefill) and every later step feeds only the
        newest token against the cached keys and values (decode); without it every step re-runs
        the whole sequence so far. Both compute the same logits for the last position.

        Args:
            prompt: ``[S0]`` token ids; ``S0 + max_new_tokens <= max_len``.
            temperature: divides the logits before sampling (ignored when ``greedy``).
            greedy: take the most likely token instead of sampling one.
            generator: a seeded ``torch.Generator`` for sampling.

        Returns:
            ``[S0 + max_new_tokens]`` token ids.
        """
        if prompt.dim() != 1 or prompt.numel() < 1 or prompt.numel() + max_new_tokens > self.max_len:
            raise ValueError(
                f"prompt must be [S0] with 1 <= S0 and S0 + max_new_tokens <= max_len = {self.max_len}, "
                f"got shape {tuple(prompt.shape)} and max_new_tokens = {max_new_tokens}"
            )
        if not greedy and not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        self.eval()
        ids, cache = prompt.clone(), (KVCache() if use_cache else None)
        feed = ids  # the tokens the next forward pass has not seen
        for _ in range(max_new_tokens):
            logits = self(feed[None], causal=True, cache=cache)[0, -1]  # [V], the last position's prediction
            if greedy:
                token = logits.argmax()[None]  # [1]
            else:
                token = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator)  # [1]
            ids = torch.cat([ids, token])  # [S + 1]
            feed = token if use_cache else ids
        return ids


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


# ==== trained models that ship with the book =======================================================
#
# A training run is reproducible on one machine, not across machines: PyTorch's CPU kernels and MKL
# choose their code by instruction set (AVX-512, AVX2, Arm), so the last bits of a gradient differ
# from one CPU to another and 200 optimiser steps grow them into visibly different weights. Where a
# chapter quotes numbers measured *on* a trained model (chapter 11's quantised caches and
# speculative decoding), it loads the model trained once and shipped here, so that every reader's
# page shows the numbers its prose describes. ``tools/train_tiny_lm.py`` retrains them with
# :func:`train_shipped`; ``tests/test_toy_lm.py`` checks that the recipe still reproduces them.

#: The shipped :class:`TinyLM` models and their recipes (the text is :func:`load_text`'s).
TRAINED: dict[str, dict[str, int]] = {
    "target": dict(d_model=64, num_heads=4, max_len=64, init_seed=0, steps=200, seq_len=64),
    "draft": dict(d_model=32, num_heads=2, max_len=64, init_seed=1, steps=200, seq_len=64),
}

#: The file in :data:`DATA_DIR` that holds them (float32 state dicts and training losses).
TRAINED_CHECKPOINT = "tiny_lm.pt"


def _untrained(name: str, vocab_size: int) -> TinyLM:
    if name not in TRAINED:
        raise ValueError(f"no trained model named {name!r}; available: {sorted(TRAINED)}")
    spec = TRAINED[name]
    torch.manual_seed(spec["init_seed"])
    return TinyLM(vocab_size, d_model=spec["d_model"], num_heads=spec["num_heads"], max_len=spec["max_len"])


def train_shipped(name: str) -> tuple[TinyLM, list[float]]:
    """Train the model :data:`TRAINED` names from scratch, as it was trained for the checkpoint.

    Returns:
        The model (in eval mode) and its training losses, one per step.
    """
    text = load_text()
    vocab = CharVocab(text)
    model = _untrained(name, len(vocab))
    spec = TRAINED[name]
    losses = train_next_token(model, vocab.encode(text), causal=True, steps=spec["steps"], seq_len=spec["seq_len"])
    return model.eval(), losses


def load_trained(name: str) -> tuple[TinyLM, list[float]]:
    """The shipped model :data:`TRAINED` names (in eval mode) and the losses of the run that made it."""
    model = _untrained(name, len(CharVocab(load_text())))
    blob = torch.load(DATA_DIR / TRAINED_CHECKPOINT, weights_only=True)
    model.load_state_dict(blob[name])
    return model.eval(), blob["losses"][name]
