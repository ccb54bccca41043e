"""Train the toy decoders that chapter 11 measures and store them in one checkpoint.

Usage: PYTHONPATH=. python tools/train_tiny_lm.py   (about a minute on one CPU core)

The models and their recipes are :data:`attnbook.toy_lm.TRAINED` (a target of width 64 and a
draft of width 32, 200 AdamW steps each on the book's text, one thread, seeded). The result is
``attnbook/data/tiny_lm.pt``. Why the book ships them instead of training them in the notebook:
see the comment above ``TRAINED`` in ``attnbook/toy_lm.py``. After retraining, re-execute chapter 11
and read its prose against the new numbers.
"""

from __future__ import annotations

import time

import torch

from attnbook import toy_lm

if __name__ == "__main__":
    blob: dict = {"losses": {}}
    for name in toy_lm.TRAINED:
        start = time.time()
        model, losses = toy_lm.train_shipped(name)
        blob[name] = model.state_dict()
        blob["losses"][name] = losses
        print(f"{name}: final training loss {sum(losses[-20:]) / 20:.3f} nats/char in {time.time() - start:.0f} s")
    torch.save(blob, toy_lm.DATA_DIR / toy_lm.TRAINED_CHECKPOINT)
    print("wrote", toy_lm.DATA_DIR / toy_lm.TRAINED_CHECKPOINT)
