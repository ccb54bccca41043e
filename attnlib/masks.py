"""Boolean attention masks, and converters from the conventions other libraries use.

attnlib's masks are ``torch.bool`` with **True = may attend**. Other libraries differ
(checked on torch 2.13.0; ``tests/test_masks_behaviour.py`` pins each row):

| mask                                            | may attend | hidden           | to attnlib               |
| ----------------------------------------------- | ---------- | ---------------- | ------------------------ |
| attnlib, F.scaled_dot_product_attention (bool)  | True       | False            | (as it is)               |
| nn.MultiheadAttention key_padding_mask [B, S]   | False      | True ("ignore")  | from_key_padding_mask(m) |
| nn.MultiheadAttention bool attn_mask [S_q, S_k] | False      | True ("blocked") | ~m                       |
| Hugging Face attention_mask [B, S]              | 1          | 0 (padding)      | padding_mask(m)          |
| additive float mask (HF 4-D, SDPA/nn.MHA float) | 0.0        | -inf or <= -1e4  | from_additive_mask(m)    |

A bool ``[B, S]`` mask in the wrong convention inverts the padding without an error. So
:func:`padding_mask` and :func:`from_key_padding_mask` warn (``UserWarning``) when a whole sequence
is left with no key: inverted, the longest sequence of a padded batch (no padding) hides everything.
The check reads values, so it is skipped under ``torch.compile`` and ``torch.export``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _checks

__all__ = ["causal_mask", "padding_mask", "from_key_padding_mask", "from_additive_mask", "combine_masks"]

HIDE_BELOW = -1e4  # additive values <= this hide a key: exp(-1e4) is exactly 0 even in float64


def causal_mask(
    S: int, *, device: torch.device | str | None = None, S_k: int | None = None, window: int | None = None
) -> Tensor:
    """Mask that lets query ``i`` see keys ``0..i`` and hides the future.

    Args:
        S: number of query positions (0 gives an empty mask).
        device: where to create the mask (default: CPU).
        S_k: number of key positions, default ``S``. With ``S_k > S`` the queries are the last ``S``
            positions (a KV cache), so the last query sees every key. PyTorch's ``is_causal`` aligns
            the diagonal top-left instead: the two agree only when ``S_k == S``.
        window: if set, each query sees only the last ``window`` positions, itself included
            (Mistral's sliding window; the Mistral paper writes the span as ``i - W .. i``).

    Returns:
        bool ``[S, S_k]``, True where ``j <= i + (S_k - S)`` (and ``j > i + (S_k - S) - window``).

    >>> causal_mask(3).int()
    tensor([[1, 0, 0],
            [1, 1, 0],
            [1, 1, 1]], dtype=torch.int32)
    >>> causal_mask(2, S_k=4).shape
    torch.Size([2, 4])
    >>> causal_mask(3, S_k=4, window=2).int()  # bottom-right aligned, two keys per query
    tensor([[1, 1, 0, 0],
            [0, 1, 1, 0],
            [0, 0, 1, 1]], dtype=torch.int32)
    """
    S = _checks.positive_int("S", S, minimum=0)
    S_k = S if S_k is None else _checks.positive_int("S_k", S_k, minimum=S)
    ones = torch.ones(S, S_k, dtype=torch.bool, device=device)
    mask = torch.tril(ones, diagonal=S_k - S)  # [S, S_k]
    if window is not None:
        window = _checks.positive_int("window", window)
        mask = mask & torch.triu(ones, diagonal=S_k - S - window + 1)  # [S, S_k]
    return mask


def padding_mask(attention_mask: Tensor) -> Tensor:
    """Hugging Face-style ``[B, S]`` mask (1 = real token, 0 = padding) to an attnlib key mask.

    Args:
        attention_mask: ``[B, S]`` of 0/1 integers, 0.0/1.0 floats, or bools (True = real token).

    Returns:
        bool ``[B, 1, 1, S]``, True where the key is a real token; the singleton axes broadcast
        over heads and queries. ``ValueError`` for other shapes or values; ``UserWarning`` if a
        sequence has no real token (see above).

    >>> padding_mask(torch.tensor([[1, 1, 0], [1, 1, 1]])).shape
    torch.Size([2, 1, 1, 3])
    """
    return _key_mask(attention_mask, warn=True)


def _key_mask(attention_mask: Tensor, warn: bool) -> Tensor:
    attention_mask = _checks.tensor_with_dims("attention_mask", attention_mask, 2, "[B, S]")
    _checks.only_values("attention_mask", attention_mask, lambda m: (m == 0) | (m == 1), "0 and 1")
    keep = attention_mask != 0  # [B, S]
    if warn:
        _checks.warn_empty_sequences(keep, "padding_mask")
    return keep[:, None, None, :]  # [B, 1, 1, S]


def from_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """``nn.MultiheadAttention``'s ``key_padding_mask`` ``[B, S]`` to an attnlib key mask.

    Args:
        key_padding_mask: ``[B, S]`` bool with **True = ignore this key**, or a float mask that
            ``nn.MultiheadAttention`` adds to the scores (0 = keep, large negative/-inf = ignore).

    Returns:
        bool ``[B, 1, 1, S]``, True where the key may be attended to (``UserWarning`` if a
        sequence has every key ignored).

    >>> from_key_padding_mask(torch.tensor([[False, False, True]])).int()
    tensor([[[[1, 1, 0]]]], dtype=torch.int32)
    """
    m = _checks.tensor_with_dims("key_padding_mask", key_padding_mask, 2, "[B, S]")
    if m.dtype != torch.bool and not m.is_floating_point():
        raise ValueError(f"key_padding_mask must be bool (True = ignore) or an additive float mask, got {m.dtype}")
    keep = from_additive_mask(m) if m.is_floating_point() else ~m  # [B, S]
    _checks.warn_empty_sequences(keep, "from_key_padding_mask")
    return keep[:, None, None, :]  # [B, 1, 1, S]


def from_additive_mask(mask: Tensor) -> Tensor:
    """An additive float mask (added to the scores: 0 = keep, -inf or large negative = hide) to bool.

    Hugging Face's 4-D masks (``torch.finfo(dtype).min`` for hidden keys), the old BERT ``-10000``,
    and float masks for ``F.scaled_dot_product_attention`` have this form. Returns a bool tensor
    of the same shape, True where the value is 0. Values ``<= -1e4`` hide a key; any other
    nonzero value is a bias, not a mask, and raises ``ValueError``.

    >>> from_additive_mask(torch.tensor([[0.0, float("-inf")], [0.0, -1e9]])).int()
    tensor([[1, 0],
            [1, 0]], dtype=torch.int32)
    """
    mask = _checks.float_tensor("additive mask", mask)
    expected = f"0 (keep) and -inf or values <= {HIDE_BELOW:g} (hide)"
    hint = "; a bias is not a mask: add it to the scores"
    _checks.only_values("an additive mask", mask, lambda m: (m == 0) | (m <= HIDE_BELOW), expected, hint)
    return mask == 0


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of boolean masks, broadcast against each other.

    ``None`` entries are skipped: ``combine_masks(None, m)`` is ``m``, ``combine_masks()`` is
    ``None``. ``ValueError`` if a mask is not bool, shapes cannot broadcast, or devices differ.

    >>> combine_masks(causal_mask(3), padding_mask(torch.tensor([[1, 1, 0], [1, 1, 1]]))).shape
    torch.Size([2, 1, 3, 3])
    """
    present = [_checks.bool_mask(m, f"mask {i}") for i, m in enumerate(masks) if m is not None]
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
