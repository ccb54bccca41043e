"""Boolean attention masks. Convention everywhere in attnlib: ``True`` means "may attend".

* :func:`causal_mask` hides the future: ``[S, S]``, lower triangle (diagonal included) True.
* :func:`padding_mask` hides padding keys: ``[B, S]`` 1/0 -> ``[B, 1, 1, S]``, which broadcasts
  over heads ``H`` and query positions ``S_q``.
* :func:`combine_masks` lets a key through only where every mask lets it through (logical AND).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["causal_mask", "padding_mask", "combine_masks"]


def causal_mask(S: int, device: torch.device | str | None = None, *, S_k: int | None = None) -> Tensor:
    """Mask that lets query ``i`` see keys ``0..i`` and hides the future.

    Args:
        S: number of query positions.
        device: where to create the mask (default: CPU).
        S_k: number of key positions, default ``S``. When ``S_k > S`` (queries are the last ``S``
            positions of a longer sequence, as with a KV cache) the diagonal is shifted so that the
            last query sees every key, matching ``torch.nn.functional.scaled_dot_product_attention``'s
            ``is_causal`` only when ``S_k == S``.

    Returns:
        bool ``[S, S_k]``; entry ``[i, j]`` is True when ``j <= i + (S_k - S)``.

    Example:
        >>> causal_mask(3).int()
        tensor([[1, 0, 0],
                [1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
    """
    if isinstance(S, bool) or not isinstance(S, int) or S < 1:
        raise ValueError(f"S must be a positive int, got {S!r}")
    S_k = S if S_k is None else S_k
    if isinstance(S_k, bool) or not isinstance(S_k, int) or S_k < S:
        raise ValueError(f"S_k must be an int >= S = {S}, got {S_k!r}")
    ones = torch.ones(S, S_k, dtype=torch.bool, device=device)
    return torch.tril(ones, diagonal=S_k - S)  # [S, S_k]


def padding_mask(attention_mask: Tensor) -> Tensor:
    """Turn a tokenizer-style ``[B, S]`` mask (1 = real token, 0 = padding) into a key mask.

    Args:
        attention_mask: ``[B, S]`` of 0/1 integers, bools, or 0.0/1.0 floats.

    Returns:
        bool ``[B, 1, 1, S]``: True where the key is a real token. The two singleton axes
        broadcast over heads ``H`` and query positions ``S_q`` of scores ``[B, H, S_q, S]``.

    Raises:
        ValueError: if the input is not 2-D or holds values other than 0 and 1.
    """
    if not isinstance(attention_mask, Tensor):
        raise ValueError(f"attention_mask must be a torch.Tensor [B, S], got {type(attention_mask).__name__}")
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [B, S] (2 dims), got shape {tuple(attention_mask.shape)}")
    if attention_mask.dtype != torch.bool:
        bad = (attention_mask != 0) & (attention_mask != 1)
        if bool(bad.any()):
            values = sorted({float(x) for x in attention_mask[bad].flatten()[:5].tolist()})
            raise ValueError(f"attention_mask must hold only 0 and 1, found {values}")
    return attention_mask.bool()[:, None, None, :]  # [B, S] -> [B, 1, 1, S]


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of boolean masks, broadcast against each other.

    ``None`` entries are skipped, so ``combine_masks(None, m)`` is ``m`` and
    ``combine_masks()`` is ``None`` (no masking).

    Example: ``combine_masks(causal_mask(S), padding_mask(am))`` has shape ``[B, 1, S, S]``.

    Raises:
        ValueError: if a mask is not bool or the shapes cannot broadcast together.
    """
    present = [m for m in masks if m is not None]
    for i, m in enumerate(present):
        if not isinstance(m, Tensor) or m.dtype != torch.bool:
            got = m.dtype if isinstance(m, Tensor) else type(m).__name__
            raise ValueError(f"mask {i} must be a torch.bool tensor, got {got}")
    if not present:
        return None
    try:
        torch.broadcast_shapes(*(m.shape for m in present))
    except RuntimeError as err:
        shapes = ", ".join(str(tuple(m.shape)) for m in present)
        raise ValueError(f"mask shapes {shapes} cannot broadcast together") from err
    devices = {m.device for m in present}
    if len(devices) > 1:
        raise ValueError(f"masks are on different devices: {sorted(str(d) for d in devices)}")
    combined = present[0]
    for m in present[1:]:
        combined = combined & m
    return combined
