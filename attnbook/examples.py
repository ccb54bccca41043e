"""The running examples of the book and reproducible toy inputs for them."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["BOOKS_SENTENCE", "THEY_SENTENCE", "toy_hidden_states"]

#: The book's running example, "The books on the shelf are old.", split into S = 8 tokens: the verb
#: "are" agrees with the plural "books", four positions back, not with the nearer "shelf".
BOOKS_SENTENCE: list[str] = ["The", "books", "on", "the", "shelf", "are", "old", "."]
#: The same sentence continued (S = 12): the pronoun "they" stands for "books", and "dusty" is
#: what is said about them, so "they" needs two other tokens at once (chapter 5).
THEY_SENTENCE: list[str] = ["The", "books", "on", "the", "shelf", "are", "old", "and", "they", "look", "dusty", "."]


def toy_hidden_states(tokens: list[str], d_model: int = 16, *, seed: int = 0, device: torch.device | str | None = None) -> Tensor:
    """Reproducible stand-in for embeddings + positions: ``[1, S, d_model]``.

    Each distinct (lower-cased) word gets a random unit-variance vector from a generator seeded
    with ``seed``; a sinusoidal position code (as in the original Transformer) is added, so the
    two "the"s differ only by position.
    """
    if d_model < 2 or d_model % 2:
        raise ValueError(f"d_model must be an even int >= 2, got {d_model}")
    gen = torch.Generator().manual_seed(seed)
    vocab = sorted({t.lower() for t in tokens})
    table = torch.randn(len(vocab), d_model, generator=gen)  # [V, D]
    ids = torch.tensor([vocab.index(t.lower()) for t in tokens])
    words = table[ids]  # [S, D]
    pos = torch.arange(len(tokens), dtype=torch.float32)[:, None]  # [S, 1]
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))  # [D/2]
    pe = torch.zeros(len(tokens), d_model)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)
    return (words + pe)[None].to(device)  # [1, S, D]
