"""Checkers for chapter 5, *Multi-head attention*.

* :func:`check_param_count`: the reader's number for the parameters of one attention block.
* :func:`check_per_head_loop`: the reader writes multi-head attention as a loop over heads.
* :func:`check_weights_bytes`: the reader computes the bytes of the ``[B, H, S, S]`` weights.

Each checker compares a wrong answer with the usual mistakes (forgetting biases or ``W_O``,
scaling by ``sqrt(D)``, softmax over the wrong axis, forgetting ``H`` or a factor ``S``, ...)
to say which one it looks like.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from attnlib.cost import attention_weights_bytes, mha_param_count
from attnlib.heads import merge_heads, split_heads
from attnlib.multihead import MultiHeadSelfAttention

from .feedback import Feedback, correct, run_reader_code, wrong

__all__ = ["check_param_count", "check_per_head_loop", "check_weights_bytes"]


def check_param_count(answer: object, *, d_model: int = 1024, num_heads: int = 16, bias: bool = True) -> Feedback:
    """Check a number for the parameters of ``MultiHeadSelfAttention(d_model, num_heads, bias=bias)``.

    The right answer is ``4 D^2 + 4 D`` with biases (``4 D^2`` without), whatever ``H`` is.
    """
    if answer is None:
        return Feedback("todo", "replace `None` with your number (an int), then run the cell again.")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return wrong(f"the answer should be a number (an int), got {type(answer).__name__}.")
    D, H = d_model, num_heads
    d_k = D // H
    right = mha_param_count(D, H, bias=bias)
    if answer == right:
        extra = " Note that H never entered the formula." if bias else ""
        return correct(f"{right:,} = 4·D² + 4·D: four D×D weight matrices and four bias vectors of D.{extra}" if bias
                       else f"{right:,} = 4·D²: four D×D weight matrices, no biases.")
    if answer != int(answer):
        return wrong("a parameter count is a whole number.")
    a = int(answer)
    guesses = {
        4 * D * D: "that is the four weight matrices only: each of the four projections also has a bias vector of D numbers.",
        3 * D * D + 3 * D: "that covers W_Q, W_K and W_V: the output projection W_O (D×D plus its bias) belongs to the block too.",
        3 * D * D: "that is W_Q, W_K and W_V without biases: add the output projection W_O and the four bias vectors.",
        4 * D * d_k + 4 * d_k: "that is the block for one head's width D_k: the projections map D to H·D_k = D, so each is D×D.",
        4 * D * d_k: "that is one head's share (D×D_k per projection): the projections map D to H·D_k = D, so each is D×D (plus biases).",
        H * (4 * D * D + 4 * D): "you multiplied by H: the heads share the D×D projections (each head owns D_k of their output columns), so H does not multiply the count.",
        4 * D * D + D: "you have one bias vector: each of the four projections has its own bias of D numbers.",
        4 * (D * D + 1): "each bias is a vector of D numbers, not one number.",
    }
    if a in guesses:
        return wrong(guesses[a])
    return wrong(f"{a:,} is not it. Count the weight matrices (how many, what shape?) and the bias vectors; D = {D}, H = {H}.")


def _reference_module() -> tuple[MultiHeadSelfAttention, Tensor]:
    torch.manual_seed(5)
    module = MultiHeadSelfAttention(12, 3, bias=True)  # D = 12, H = 3, D_k = 4
    with torch.no_grad():
        for p in module.parameters():  # larger weights make every mistake visible
            p.mul_(3.0)
    x = torch.randn(2, 5, 12)  # [B, S, D]
    return module, x


def _variant(module: MultiHeadSelfAttention, x: Tensor, *, scale: float | None = None, dim: int = -1,
             use_wo: bool = True, reverse: bool = False) -> Tensor:
    """The reference with one thing changed (a typical mistake)."""
    H = module.num_heads
    q = split_heads(module.w_q(x), H)  # [B, H, S, D_k]
    k = split_heads(module.w_k(x), H)  # [B, H, S, D_k]
    v = split_heads(module.w_v(x), H)  # [B, H, S, D_k]
    s = 1.0 / math.sqrt(module.d_k) if scale is None else scale
    weights = torch.softmax(q @ k.transpose(-2, -1) * s, dim=dim)  # [B, H, S, S]
    context = weights @ v  # [B, H, S, D_k]
    if reverse:
        context = context.flip(1)  # heads concatenated in reverse order
    merged = merge_heads(context)  # [B, S, D]
    return module.w_o(merged) if use_wo else merged


def _columns_variant(module: MultiHeadSelfAttention, x: Tensor) -> Tensor:
    """Per-head loop that slices weight *columns* (``W[:, sl]``) as if nn.Linear stored ``[in, out]``."""
    d_k = module.d_k
    heads = []
    for h in range(module.num_heads):
        sl = slice(h * d_k, (h + 1) * d_k)
        q = x @ module.w_q.weight[:, sl] + module.w_q.bias[sl]  # [B, S, D_k]
        k = x @ module.w_k.weight[:, sl] + module.w_k.bias[sl]  # [B, S, D_k]
        v = x @ module.w_v.weight[:, sl] + module.w_v.bias[sl]  # [B, S, D_k]
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1)  # [B, S, S]
        heads.append(w @ v)  # [B, S, D_k]
    return module.w_o(torch.cat(heads, dim=-1))  # [B, S, D]


class _NoForward(MultiHeadSelfAttention):
    def forward(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        raise RuntimeError("the exercise asks for the per-head loop: do not call the module itself")


def check_per_head_loop(fn: Callable[[Tensor, MultiHeadSelfAttention], Tensor]) -> Feedback:
    """Check ``fn(x, module) -> [B, S, D]``, multi-head attention written as a loop over heads.

    ``x: [B, S, D]``; ``module`` is a :class:`MultiHeadSelfAttention` (no mask). The checker uses
    ``D = 12``, ``H = 3`` (``D_k = 4``), biases on, and compares with ``module(x).hidden_states``.
    The module passed in cannot be called directly (that would skip the exercise).
    """
    with torch.random.fork_rng(devices=[]):  # leave the reader's random state alone
        ref, x = _reference_module()
        module = _NoForward(12, 3, bias=True)
        module.load_state_dict(ref.state_dict())
    with torch.no_grad():
        expected = ref(x).hidden_states  # [B, S, D]
    got, fb = run_reader_code(fn, x.clone(), module)
    if fb is not None:
        return fb
    if not isinstance(got, Tensor):
        return wrong(f"return a torch.Tensor of shape [B, S, D] = {tuple(expected.shape)}, got {type(got).__name__}.")
    if tuple(got.shape) != tuple(expected.shape):
        if got.dim() == 4:
            return wrong(f"your result has shape {tuple(got.shape)}: concatenate the heads' outputs along the "
                         "last axis (torch.cat(heads, dim=-1)) and apply w_o.")
        return wrong(f"your result has shape {tuple(got.shape)}, expected [B, S, D] = {tuple(expected.shape)}.")
    got64 = got.detach().to(torch.float64)

    def same(t: Tensor) -> bool:
        return bool(torch.allclose(got64, t.detach().to(torch.float64), atol=1e-5, rtol=1e-4))

    with torch.no_grad():
        if same(expected):
            return correct("your loop matches the batched module: the heads are independent until W_O mixes them.")
        D, H = module.d_model, module.num_heads
        mistakes = [
            (dict(use_wo=False), "this is the concatenation of the heads without the output projection: finish with module.w_o(...)."),
            (dict(scale=1.0 / math.sqrt(D)), f"you scaled by 1/sqrt(D) = 1/sqrt({D}); each head scales by 1/sqrt(D_k) = 1/sqrt({D // H})."),
            (dict(scale=1.0), "the scores are not scaled: divide q_h k_h^T by sqrt(D_k)."),
            (dict(scale=1.0 / module.d_k), "you divided by D_k; divide by its square root."),
            (dict(dim=-2), "your softmax normalises over the queries (dim=-2): each query's weights over the keys must sum to 1, so use dim=-1."),
            (dict(reverse=True), "the heads are concatenated in reverse order: head h's output goes to features h·D_k .. (h+1)·D_k - 1."),
        ]
        for kwargs, message in mistakes:
            if same(_variant(ref, x, **kwargs)):  # type: ignore[arg-type]
                return wrong(message)
        if same(_columns_variant(ref, x)):
            return wrong(
                "you sliced the columns of the weight matrices: nn.Linear stores weight as [out, in], so head h "
                "uses rows h·D_k .. (h+1)·D_k - 1 (module.w_q.weight[sl]) and computes x @ W[sl].T + b[sl]."
            )
    if not torch.isfinite(got64).all():
        return wrong("your result contains NaN or inf.")
    worst = float((got64 - expected.to(torch.float64)).abs().max())
    return wrong(
        "the shape is right but the numbers differ (largest difference "
        f"{worst:.3g}). Head h uses rows h·D_k .. (h+1)·D_k - 1 of each weight matrix (nn.Linear stores "
        "[out, in]) and the same slice of each bias; check the slicing first."
    )


def check_weights_bytes(fn: Callable[[int, int, int, torch.dtype], int]) -> Feedback:
    """Check ``fn(batch, num_heads, seq_len, dtype) -> int``, the bytes of ``[B, H, S, S]`` weights.

    Tried on several configurations (float32, float16, bfloat16) and compared with
    ``torch.empty(B, H, S, S, dtype=dtype).nbytes`` (on the meta device, so nothing is allocated).
    """
    configs = [(1, 12, 128, torch.float32), (3, 32, 4096, torch.float16), (3, 8, 100, torch.bfloat16), (4, 1, 7, torch.float32)]
    for B, H, S, dtype in configs:
        got, fb = run_reader_code(fn, B, H, S, dtype)
        if fb is not None:
            return fb
        expected = torch.empty(B, H, S, S, dtype=dtype, device="meta").nbytes
        assert expected == attention_weights_bytes(B, H, S, dtype)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return wrong(f"return a number of bytes (an int), got {type(got).__name__}.")
        if got == expected:
            continue
        size = torch.empty((), dtype=dtype).element_size()
        where = f"for B={B}, H={H}, S={S}, {dtype}: you returned {got:,}, expected {expected:,}."
        if got == B * H * S * S:
            return wrong(f"{where} That is the number of elements: multiply by the bytes per element ({size} for {dtype}).")
        if got == B * H * S * S * 4 and size != 4:
            return wrong(f"{where} {dtype} takes {size} bytes per element, not 4: use torch.empty((), dtype=dtype).element_size().")
        if got == B * S * S * size:
            return wrong(f"{where} Each of the H heads has its own S×S weights: multiply by H.")
        if got == B * H * S * size:
            return wrong(f"{where} Each head stores one weight per (query, key) pair: S·S, not S.")
        if got == H * S * S * size:
            return wrong(f"{where} Every sequence in the batch has its own weights: multiply by B.")
        if got == B * H * S * S * size * 8 or got == B * H * S * S * size / 8:
            return wrong(f"{where} A factor 8 off: bytes, not bits.")
        return wrong(where)
    return correct("B·H·S²·(bytes per element): linear in H, quadratic in S. At S = 4096 and H = 32 in float16 that is already 1 GiB per sequence and layer.")
