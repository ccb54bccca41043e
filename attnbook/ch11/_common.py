"""What several of chapter 11's modules share: one-thread timing and argument checks that name the argument.

The checks are attnlib's (:mod:`attnlib._checks`): each raises ``ValueError`` naming the argument,
what it got and what it expected.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np
import torch

from attnlib._checks import constant_scalar, float_tensor, instance, is_int, positive_int, tensor_with_dims




class _OneThread:
    """Run tiny operations on one thread: with many threads each of them waits for the slowest."""

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc: Any) -> None:
        torch.set_num_threads(self.threads)


def one_of(name: str, value: object, options: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")
    return value


def token_ids(name: str, ids: object, dims: int, layout: str) -> torch.Tensor:
    """An integer tensor of token ids with ``dims`` dims and at least one position."""
    ids = tensor_with_dims(name, ids, dims, layout)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool or ids.shape[-1] == 0:
        raise ValueError(f"{name} must be integer token ids {layout} with at least one position, "
                         f"got dtype {ids.dtype} and shape {tuple(ids.shape)}")
    return ids


def finite_at_least(name: str, value: object, minimum: float = 0.0) -> float:
    """A finite real number ``>= minimum`` (Python, NumPy or 0-d tensor) as a float."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.dtype.is_complex and value.dtype != torch.bool:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be a finite number >= {minimum:g}, got {value!r}")
    return float(value)
