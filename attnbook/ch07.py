"""Chapter 7, *Real attention in a pretrained model*: recording runs, head summaries, checkers.

* :func:`run_model`, :func:`check_layer`: record every layer of all-MiniLM-L6-v2 and compare attnlib's copy.
* :func:`head_pattern_scores`, :func:`top_heads`, :func:`weighted_value_norms`: what the heads do.

* :func:`check_strongest_link`: find the (layer, head) where one token attends most to another.
* :func:`check_previous_token_score`: the per-head "previous token" score ``[L, H]``.
* :func:`check_copy_layer`: copy a layer of all-MiniLM-L6-v2 into ``attnlib.MultiHeadSelfAttention``.

The right answers are computed from the model itself (:mod:`attnlib.pretrained`), never typed in.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import torch
from torch import Tensor, nn

from attnlib import pretrained as P
from attnlib.multihead import MultiHeadSelfAttention

from .feedback import (
    Feedback,
    as_cpu_float64,
    compare_tensors,
    correct,
    run_reader_code,
    wrong,
)

__all__ = [
    "ModelRun",
    "LayerCheck",
    "run_model",
    "check_layer",
    "head_pattern_scores",
    "top_heads",
    "weighted_value_norms",
    "LINK_CASES",
    "link_case",
    "reference_strongest_link",
    "reference_previous_token_score",
    "check_strongest_link",
    "check_previous_token_score",
    "check_copy_layer",
]

# --- recording a run of the model and summarising its heads --------------------------------


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
    layers = P.encoder_layers(model)
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
    mine = P.layer_to_attnlib(model, layer_index)
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
    mine = P.layer_to_attnlib(model, layer_index)
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < mine.num_heads:
        raise ValueError(f"head must be an int in 0..{mine.num_heads - 1}, got {head!r}")
    x = run.layer_inputs[layer_index][batch_index]  # [S, D]
    d_k = mine.d_k
    cols = slice(head * d_k, (head + 1) * d_k)
    v = mine.w_v(x)[:, cols]  # [S, D_k], head h's values
    f = v @ mine.w_o.weight[:, cols].T  # [S, D_k] @ [D_k, D] -> [S, D]
    w = run.attentions[layer_index, batch_index, head]  # [S, S]
    return w * f.norm(dim=-1)[None, :]  # [S, S]


# --- checkers -------------------------------------------------------------------------------


#: (sentence, query token, key token): verbs and their subjects, the first one the book's example.
LINK_CASES: tuple[tuple[str, str, str], ...] = (
    ("The keys on the table are lost.", "are", "keys"),
    ("The students in the library were quiet.", "were", "students"),
)


def link_case(i: int = 0) -> tuple[Tensor, list[str], str, str]:
    """Case ``i`` of :data:`LINK_CASES` as ``(weights [L, H, S, S], tokens, query, key)``."""
    sentence, query, key = LINK_CASES[i]
    model, tokenizer = P.load_minilm()
    run = run_model(model, P.encode(tokenizer, sentence))
    return run.attentions[:, 0].clone(), P.tokens(tokenizer, sentence), query, key


def reference_strongest_link(weights: Tensor, toks: Sequence[str], query: str, key: str) -> tuple[int, int]:
    """The ``(layer, head)`` whose weight from ``query`` to ``key`` (first occurrences) is largest."""
    i, j = list(toks).index(query), list(toks).index(key)
    H = weights.shape[1]
    flat = int(weights[:, :, i, j].flatten().argmax())  # over L * H heads
    return flat // H, flat % H


def _as_pair(result: Any) -> tuple[int, int] | None:
    if isinstance(result, Tensor) and result.numel() == 2:
        result = result.flatten().tolist()
    if isinstance(result, (tuple, list)) and len(result) == 2:
        try:
            return int(result[0]), int(result[1])
        except (TypeError, ValueError):
            return None
    return None


def check_strongest_link(fn: Callable[[Tensor, list[str], str, str], Any]) -> Feedback:
    """Check ``fn(weights [L, H, S, S], tokens, query, key) -> (layer, head)`` on both :data:`LINK_CASES`."""
    for case in range(len(LINK_CASES)):
        weights, toks, query, key = link_case(case)
        L, H = weights.shape[:2]
        result, fb = run_reader_code(fn, weights.clone(), list(toks), query, key)
        if fb is not None:
            return fb
        got = _as_pair(result)
        if got is None:
            if isinstance(result, (int, Tensor)) and not isinstance(result, bool):
                return wrong(f"return a pair (layer, head), got {result!r}: a flat index i over L*H heads is "
                             f"(i // {H}, i % {H}).")
            return wrong(f"return a pair of ints (layer, head), got {type(result).__name__} {result!r}.")
        expected = reference_strongest_link(weights, toks, query, key)
        if got == expected:
            continue
        sentence = LINK_CASES[case][0]
        if got == (expected[0] + 1, expected[1] + 1):
            return wrong("layers and heads are counted from 0 in PyTorch (and in this book); you counted from 1.")
        if got == reference_strongest_link(weights.transpose(-1, -2), toks, query, key):
            return wrong(f"you found where {key!r} attends to {query!r}. weights[l, h, i, j] is how much query i "
                         f"takes from key j: read the row of {query!r} and its column {key!r}.")
        if got == (expected[1], expected[0]):
            return wrong("layer and head are swapped: weights is [L, H, S, S], so return (layer, head).")
        if not (0 <= got[0] < L and 0 <= got[1] < H):
            return wrong(f"({got[0]}, {got[1]}) is not a head of this model: layers are 0..{L - 1}, heads 0..{H - 1}.")
        return wrong(f"for {sentence!r} (query {query!r}, key {key!r}) you returned {got}; the weight there is "
                     f"{float(weights[got[0], got[1], toks.index(query), toks.index(key)]):.2f}, but another head "
                     f"puts more on {key!r}. Did you find the tokens' positions with tokens.index(...), counting [CLS]?")
    return correct("you found the head from the data, for the book's sentence and for a second one.")


def reference_previous_token_score(weights: Tensor) -> Tensor:
    """``[L, H]``: mean over query positions ``i = 1 .. S-1`` of ``weights[..., i, i-1]``."""
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)  # [L, H, S-1] -> [L, H]


def check_previous_token_score(fn: Callable[[Tensor], Any]) -> Feedback:
    """Check ``fn(weights [L, H, S, S]) -> [L, H]`` on the book's sentence."""
    weights, _, _, _ = link_case(0)
    result, fb = run_reader_code(fn, weights.clone())
    if fb is not None:
        return fb
    expected = reference_previous_token_score(weights)
    if isinstance(result, Tensor) and tuple(result.shape) == tuple(expected.shape):
        r = as_cpu_float64(result)

        def same(t: Tensor) -> bool:
            return torch.allclose(r, as_cpu_float64(t), atol=1e-5)

        if same(expected):
            return correct("that is the previous-token score of all 72 heads.")
        if same(weights.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1)):
            return wrong("that is the weight on the next token (i+1). Entry [i, i-1] lies just below the "
                         "diagonal: diagonal(offset=-1).")
        if same(weights.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) / weights.shape[-1]):
            return wrong(f"you divided by S = {weights.shape[-1]}; only S - 1 queries have a previous token.")
        if same(weights.diagonal(dim1=-2, dim2=-1).mean(-1)):
            return wrong("that is the weight on the token itself (the diagonal); the previous token is offset -1.")
    mismatch = compare_tensors(result, expected, name="your score")
    return mismatch if mismatch is not None else correct("that is the previous-token score of all 72 heads.")


def _same(a: Tensor, b: Tensor) -> bool:
    return tuple(a.shape) == tuple(b.shape) and torch.equal(a.detach().cpu(), b.detach().cpu())


def _diagnose_copy(mine: MultiHeadSelfAttention, model: nn.Module, layer_index: int) -> Feedback | None:
    """A specific hint when the copied parameters reveal a typical mistake, else None."""
    layers = model.encoder.layer
    attn = layers[layer_index].attention
    theirs = {"w_q": attn.self.query, "w_k": attn.self.key, "w_v": attn.self.value, "w_o": attn.output.dense}
    sources = {"query": attn.self.query, "key": attn.self.key, "value": attn.self.value, "dense": attn.output.dense}
    for name, target in theirs.items():
        got: nn.Linear = getattr(mine, name)
        if _same(got.weight, target.weight):
            if got.bias is None:
                return wrong(f"{name} has no bias; BERT's projections have one: build the module with bias=True "
                             "and copy .bias as well.")
            if not _same(got.bias, target.bias):
                return wrong(f"{name}.weight is right but {name}.bias is not: copy the bias too.")
            continue
        if _same(got.weight.T, target.weight):
            return wrong(f"{name}.weight is transposed. nn.Linear stores weight as [out, in] in both libraries, "
                         "so copy it as it is (no .T); with D x D weights the shapes cannot warn you.")
        for other_name, other in sources.items():
            if other is not target and _same(got.weight, other.weight):
                return wrong(f"{name} holds the weights of attention.{'self' if other_name != 'dense' else 'output'}"
                             f".{other_name}; match w_q/w_k/w_v/w_o to query/key/value/output.dense.")
        for j, layer in enumerate(layers):
            if j != layer_index:
                other_target = {"w_q": layer.attention.self.query, "w_k": layer.attention.self.key,
                                "w_v": layer.attention.self.value, "w_o": layer.attention.output.dense}[name]
                if _same(got.weight, other_target.weight):
                    return wrong(f"{name} comes from layer {j}, but you were asked for layer {layer_index}.")
        label = {"w_q": "attention.self.query", "w_k": "attention.self.key", "w_v": "attention.self.value",
                 "w_o": "attention.output.dense"}[name]
        return wrong(f"{name}.weight does not match layer {layer_index}'s {label}.weight.")
    return None


def check_copy_layer(fn: Callable[[nn.Module, int], Any], layers: Sequence[int] = (2, 5)) -> Feedback:
    """Check ``fn(model, layer_index) -> MultiHeadSelfAttention`` on the given layers.

    The reader's copy must reproduce the model's attention weights and ``attention.output.dense``
    output to within 1e-5 on a padded batch of two sentences (real tokens compared).
    """
    model, tokenizer = P.load_minilm()
    run = run_model(model, P.encode(tokenizer, [LINK_CASES[0][0], "Where are they?"]))
    real = run.attention_mask.bool()  # [B, S]
    for layer_index in layers:
        result, fb = run_reader_code(fn, model, layer_index)
        if fb is not None:
            return fb
        if not isinstance(result, MultiHeadSelfAttention):
            return wrong(f"return an attnlib.MultiHeadSelfAttention, got {type(result).__name__}.")
        if (result.d_model, result.num_heads) != (384, 12):
            return wrong(f"the model has D = 384 and H = 12 heads; your module has d_model = {result.d_model}, "
                         f"num_heads = {result.num_heads}.")
        hint = _diagnose_copy(result, model, layer_index)
        if hint is not None:
            return hint
        with torch.no_grad():
            got = result.eval()(run.layer_inputs[layer_index], run.attention_mask)
        w = (got.attention_weights - run.attentions[layer_index]).abs().permute(0, 2, 1, 3)[real]  # [N, H, S]
        o = (got.hidden_states - run.dense_outputs[layer_index]).abs()[real]  # [N, D]
        if float(w.max()) >= 1e-5 or float(o.max()) >= 1e-5:
            return wrong(f"layer {layer_index}: the parameters look right but the outputs differ "
                         f"(weights by {float(w.max()):.1e}, output by {float(o.max()):.1e}).")
    return correct(f"your copies of layers {', '.join(map(str, layers))} reproduce the model's attention "
                   "weights and dense outputs to within 1e-5 on a padded batch.")
