"""The tiny language model of chapter 4: data, shapes, causality, reproducible training."""

from __future__ import annotations

import pytest
import torch

from attnbook import toy_lm


def test_shipped_text_loads_without_its_header() -> None:
    text = toy_lm.load_text()
    assert 3_000 < len(text) < 30_000
    assert not any(line.startswith("#") for line in text.splitlines())
    assert text.startswith("The dog lay on the rug by the door.")
    with pytest.raises(ValueError, match=r"no text named 'missing.txt'.*small_tales.txt"):
        toy_lm.load_text("missing.txt")


def test_vocab_round_trip_and_errors() -> None:
    vocab = toy_lm.CharVocab("banana")
    assert vocab.chars == ["a", "b", "n"] and len(vocab) == 3
    ids = vocab.encode("nab")
    assert ids.tolist() == [2, 0, 1] and ids.dtype == torch.long
    assert vocab.decode(ids) == "nab" and vocab.decode([1, 0]) == "ba"
    with pytest.raises(ValueError, match=r"\['z'\] are not in the vocabulary"):
        vocab.encode("zab")
    with pytest.raises(ValueError, match="non-empty"):
        toy_lm.CharVocab("")


def test_sample_batch_targets_are_inputs_shifted_by_one() -> None:
    data = torch.arange(100)
    x, y = toy_lm.sample_batch(data, 4, 10, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 10)
    assert torch.equal(y, x + 1)
    with pytest.raises(ValueError, match="N >= seq_len \\+ 2"):
        toy_lm.sample_batch(torch.arange(5), 1, 10, torch.Generator())


def test_tiny_lm_shapes_and_causality() -> None:
    torch.manual_seed(0)
    model = toy_lm.TinyLM(11, d_model=16, num_heads=2, max_len=8).eval()
    ids = torch.randint(0, 11, (3, 8))
    logits = model(ids, causal=True)
    assert logits.shape == (3, 8, 11)
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 11  # change the future of position 4
    torch.testing.assert_close(model(changed, causal=True)[:, :5], logits[:, :5])
    assert not torch.allclose(model(changed, causal=False)[:, :5], model(ids, causal=False)[:, :5])
    with pytest.raises(ValueError, match=r"S <= max_len = 8, got shape \(1, 9\)"):
        model(torch.zeros(1, 9, dtype=torch.long), causal=True)
    with pytest.raises(ValueError, match="vocab_size must be a positive int"):
        toy_lm.TinyLM(0)


def test_training_is_reproducible_and_lowers_the_loss() -> None:
    data = toy_lm.CharVocab("abcabcabd" * 20).encode("abcabcabd" * 20)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = toy_lm.TinyLM(4, d_model=16, num_heads=2, max_len=8)
        runs.append(toy_lm.train_next_token(model, data, causal=True, steps=30, batch_size=4, seq_len=8, lr=1e-2))
    assert runs[0] == runs[1]
    assert len(runs[0]) == 30 and runs[0][-1] < runs[0][0]
    assert toy_lm.evaluate_loss(model, data, causal=True, seq_len=8) < runs[0][0]


def test_generate_keeps_the_prompt_and_slides_its_window() -> None:
    torch.manual_seed(0)
    model = toy_lm.TinyLM(5, d_model=8, num_heads=2, max_len=4)
    prompt = torch.tensor([1, 2, 3])
    out = toy_lm.generate(model, prompt, 6, causal=True)
    assert out.shape == (9,) and torch.equal(out[:3], prompt)
    assert int(out.max()) < 5
    with pytest.raises(ValueError, match="prompt must be"):
        toy_lm.generate(model, torch.zeros(2, 2, dtype=torch.long), 1, causal=True)


def test_greedy_generation_is_the_same_with_and_without_the_cache() -> None:
    torch.manual_seed(0)
    text = toy_lm.load_text()
    vocab = toy_lm.CharVocab(text)
    model = toy_lm.TinyLM(len(vocab), d_model=32, num_heads=4, max_len=96)
    toy_lm.train_next_token(model, vocab.encode(text), causal=True, steps=30, seq_len=32)
    prompt = vocab.encode("The cat ")
    cached = model.generate(prompt, 80, use_cache=True)
    uncached = model.generate(prompt, 80, use_cache=False)
    assert torch.equal(cached, uncached) and cached.shape == (88,)
    assert torch.equal(cached[:8], prompt)
    legacy = toy_lm.generate(model, prompt, 80, causal=True)  # chapter 4's call: re-runs the prefix
    assert torch.equal(legacy, cached)
    samples = [model.generate(prompt, 20, greedy=False, temperature=0.8, use_cache=c,
                              generator=torch.Generator().manual_seed(1)) for c in (True, False)]
    assert torch.equal(samples[0], samples[1])
    with pytest.raises(ValueError, match=r"S0 \+ max_new_tokens <= max_len = 96"):
        model.generate(prompt, 89)


@pytest.mark.parametrize("name", sorted(toy_lm.TRAINED))
def test_the_shipped_checkpoints_are_what_their_recipe_trains(name: str) -> None:
    """Retraining on this CPU starts from the same weights and ends at the shipped model's loss.

    Bit-for-bit equality holds only on the CPU that trained the checkpoint (the reason it ships),
    so the end of training is compared by its loss, with a margin far below what a different
    recipe (steps, width, seed, learning rate) moves it.
    """
    shipped, shipped_losses = toy_lm.load_trained(name)
    retrained, losses = toy_lm.train_shipped(name)
    assert len(losses) == len(shipped_losses) == toy_lm.TRAINED[name]["steps"]
    assert losses[0] == pytest.approx(shipped_losses[0], abs=1e-4)  # the same initial weights and first batch
    final, shipped_final = sum(losses[-20:]) / 20, sum(shipped_losses[-20:]) / 20
    assert final == pytest.approx(shipped_final, abs=0.03)
    assert not shipped.training
    data = toy_lm.CharVocab(toy_lm.load_text()).encode(toy_lm.load_text())
    assert toy_lm.evaluate_loss(shipped, data, causal=True) == pytest.approx(
        toy_lm.evaluate_loss(retrained, data, causal=True), abs=0.05)


def test_load_trained_names_what_it_has() -> None:
    with pytest.raises(ValueError, match=r"no trained model named 'large'; available: \['draft', 'target'\]"):
        toy_lm.load_trained("large")
