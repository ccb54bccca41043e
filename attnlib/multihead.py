"""Multi-head self-attention as one readable ``nn.Module``.

Shapes (batch first): ``B`` batch, ``S`` positions, ``D = d_model``, ``H`` query heads,
``H_kv`` key/value heads (``H_kv = H`` is classic multi-head attention, ``1 < H_kv < H`` is
grouped-query attention, ``H_kv = 1`` is multi-query attention), ``D_k = D // H``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .core import scaled_dot_product_attention
from .heads import merge_heads, repeat_kv, split_heads
from .masks import causal_mask, combine_masks, padding_mask

__all__ = ["AttentionOutput", "MultiHeadSelfAttention"]


class AttentionOutput(NamedTuple):
    """What :class:`MultiHeadSelfAttention` returns.

    Attributes:
        hidden_states: ``[B, S, D]``, the updated token vectors (goes on to residual + LayerNorm).
        attention_weights: ``[B, H, S, S]`` for analysis and plots, or ``None`` when the module
            was called with ``need_weights=False``. Nothing downstream uses them.
    """

    hidden_states: Tensor
    attention_weights: Tensor | None


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class MultiHeadSelfAttention(nn.Module):
    """Multi-head self-attention: project, split into heads, attend, merge, project.

    Args:
        d_model: ``D``, the width of every token vector.
        num_heads: ``H``, the number of query heads; ``D`` must be divisible by ``H``.
        bias: whether the four projections have a bias term.
        num_kv_heads: ``H_kv``, the number of key/value heads (default ``H``). ``H`` must be a
            multiple of it. Fewer key/value heads shrink ``w_k``/``w_v`` and the KV cache.

    Layers:
        ``w_q``: ``nn.Linear(D, D)``; ``w_k``, ``w_v``: ``nn.Linear(D, H_kv * D_k)``;
        ``w_o``: ``nn.Linear(D, D)``. No dropout.
    """

    def __init__(self, d_model: int, num_heads: int, *, bias: bool = True, num_kv_heads: int | None = None) -> None:
        super().__init__()
        _check_positive_int("d_model", d_model)
        _check_positive_int("num_heads", num_heads)
        if d_model % num_heads != 0:
            raise ValueError(f"d_model = {d_model} is not divisible by num_heads = {num_heads}")
        num_kv_heads = num_heads if num_kv_heads is None else _check_positive_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads = {num_heads} is not a multiple of num_kv_heads = {num_kv_heads}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.d_k = d_model // num_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)  # [D] -> [H * D_k]
        self.w_k = nn.Linear(d_model, num_kv_heads * self.d_k, bias=bias)  # [D] -> [H_kv * D_k]
        self.w_v = nn.Linear(d_model, num_kv_heads * self.d_k, bias=bias)  # [D] -> [H_kv * D_k]
        self.w_o = nn.Linear(d_model, d_model, bias=bias)  # [H * D_k] -> [D]

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, d_k={self.d_k}"

    def _mask(self, hidden_states: Tensor, attention_mask: Tensor | None, causal: bool) -> Tensor | None:
        B, S, _ = hidden_states.shape
        pad = None
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (B, S):
                raise ValueError(
                    f"attention_mask shape {tuple(attention_mask.shape)} does not match hidden_states [B, S] = {(B, S)}"
                )
            if attention_mask.device != hidden_states.device:
                raise ValueError(
                    f"attention_mask is on {attention_mask.device} but hidden_states is on {hidden_states.device}"
                )
            pad = padding_mask(attention_mask)  # [B, 1, 1, S]
        future = causal_mask(S, device=hidden_states.device) if causal else None  # [S, S]
        return combine_masks(pad, future)  # [B, 1, S, S], [B, 1, 1, S], [S, S] or None

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None = None,
        *,
        causal: bool = False,
        need_weights: bool = True,
    ) -> AttentionOutput:
        """Let every position gather information from the positions it may see.

        Args:
            hidden_states: ``[B, S, D]`` token vectors; queries, keys and values all come from it.
            attention_mask: optional ``[B, S]``, 1 for a real token and 0 for padding.
            causal: if True, position ``i`` sees only positions ``0..i`` (decoder style).
            need_weights: if False, run PyTorch's fused ``scaled_dot_product_attention`` (faster,
                less memory) and return ``attention_weights=None``.

        Returns:
            :class:`AttentionOutput` with ``hidden_states [B, S, D]`` and
            ``attention_weights [B, H, S, S]`` (or ``None``).
        """
        if not isinstance(hidden_states, Tensor) or hidden_states.dim() != 3:
            got = tuple(hidden_states.shape) if isinstance(hidden_states, Tensor) else type(hidden_states).__name__
            raise ValueError(f"hidden_states must be [B, S, D] with D = {self.d_model}, got {got}")
        if hidden_states.shape[-1] != self.d_model:
            raise ValueError(
                f"hidden_states last dim is {hidden_states.shape[-1]} but d_model = {self.d_model} "
                f"(got shape {tuple(hidden_states.shape)}, expected [B, S, {self.d_model}])"
            )
        if hidden_states.dtype != self.w_q.weight.dtype or hidden_states.device != self.w_q.weight.device:
            raise ValueError(
                f"hidden_states is {hidden_states.dtype} on {hidden_states.device} but the module's weights are "
                f"{self.w_q.weight.dtype} on {self.w_q.weight.device}; use module.to(...) or hidden_states.to(...)"
            )
        mask = self._mask(hidden_states, attention_mask, causal)

        q = split_heads(self.w_q(hidden_states), self.num_heads)  # [B, H, S, D_k]
        k = split_heads(self.w_k(hidden_states), self.num_kv_heads)  # [B, H_kv, S, D_k]
        v = split_heads(self.w_v(hidden_states), self.num_kv_heads)  # [B, H_kv, S, D_k]
        k = repeat_kv(k, self.num_heads)  # [B, H, S, D_k]
        v = repeat_kv(v, self.num_heads)  # [B, H, S, D_k]

        if need_weights:
            context, weights = scaled_dot_product_attention(q, k, v, mask)  # [B, H, S, D_k], [B, H, S, S]
        else:
            is_causal = causal and attention_mask is None  # an explicit mask rules out the flash backend on CUDA
            mask = None if is_causal else mask
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)  # [B, H, S, D_k]
            weights = None

        merged = merge_heads(context)  # [B, S, D]
        return AttentionOutput(hidden_states=self.w_o(merged), attention_weights=weights)

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> "MultiHeadSelfAttention":
        """Copy the weights of a ``torch.nn.MultiheadAttention`` into a new module.

        The copy computes the same function (use it batch first, ``[B, S, D]``; a PyTorch module
        built with ``batch_first=False`` expects ``[S, B, D]`` instead). Dropout is not copied:
        compare the two in ``eval()`` mode or with ``dropout=0``.

        Raises:
            ValueError: for configurations this module does not have (separate key/value widths,
                ``add_bias_kv`` or ``add_zero_attn``).
        """
        if not isinstance(m, nn.MultiheadAttention):
            raise ValueError(f"from_torch expects torch.nn.MultiheadAttention, got {type(m).__name__}")
        if not m._qkv_same_embed_dim:
            raise ValueError(f"kdim/vdim ({m.kdim}, {m.vdim}) differ from embed_dim {m.embed_dim}; not supported")
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn are not supported")
        bias = m.in_proj_bias is not None
        out = cls(m.embed_dim, m.num_heads, bias=bias)
        out = out.to(device=m.in_proj_weight.device, dtype=m.in_proj_weight.dtype)
        D = m.embed_dim
        with torch.no_grad():
            for i, layer in enumerate((out.w_q, out.w_k, out.w_v)):
                layer.weight.copy_(m.in_proj_weight[i * D : (i + 1) * D])  # rows of the packed [3D, D]
                if bias:
                    layer.bias.copy_(m.in_proj_bias[i * D : (i + 1) * D])
            out.w_o.weight.copy_(m.out_proj.weight)
            if bias:
                out.w_o.bias.copy_(m.out_proj.bias)
        return out
