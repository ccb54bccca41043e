"""Train the two small decoders of chapter 11's attention-sink section and store them in one checkpoint.

Usage: PYTHONPATH=. python tools/train_sink_lm.py   (a few minutes on one CPU core)

Both models (:class:`attnbook.ch11.SinkLM`: 2 layers, D = 64, 4 heads, RoPE) are trained on the
book's text without its last 1,000 characters, one seeded run each on one thread: one with
ordinary softmax attention, one with a learned sink logit per head. The result is
``attnbook/data/sink_lm.pt`` (float32 state dicts plus the training losses).
"""

from __future__ import annotations

import time

import torch

from attnbook import ch11
from attnbook.toy_lm import DATA_DIR

if __name__ == "__main__":
    blob = {"losses": {}}
    for name in ("plain", "sink"):
        start = time.time()
        model, losses = ch11.train_sink_lm(sink=name == "sink")
        blob[name] = model.state_dict()
        blob["losses"][name] = losses
        print(f"{name}: final training loss {sum(losses[-50:]) / 50:.3f} nats/char in {time.time() - start:.0f} s")
    torch.save(blob, DATA_DIR / ch11.SINK_CHECKPOINT)
    print("wrote", DATA_DIR / ch11.SINK_CHECKPOINT)
