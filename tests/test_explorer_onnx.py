"""The website's attention explorer, checked without a browser (part of ``make test``).

* The ONNX export of all-MiniLM-L6-v2 (``attnbook/explorer.py``; cached under
  ``_build/explorer-cache/``), run by onnxruntime, gives the attention weights of the Hugging Face
  model and of attnlib within 1e-4 on five sentences (one cut to 128 tokens) and a padded batch.
* Its weights are the package's float32 weights, and its sequence axis is dynamic.
* The JavaScript tokenizer (``book/_static/explorer/tokenizer.mjs``), run in Node, gives exactly the
  Python tokenizer's tokens and ids on every sentence of ``tests/data/tokenizer_cases.txt``.
* The JavaScript head scores (``analysis.mjs``) equal ``attnbook.ch07.head_pattern_scores``,
  and its colour table is matplotlib's viridis, with text contrast of at least 4.5:1 on every colour.

Node.js is required (``.ci/run`` installs it when it is missing).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

from attnbook import ch07
from attnbook import explorer as ex
from attnlib import pretrained

JS = ROOT / "book" / "_static" / "explorer"
CASES = ROOT / "tests" / "data" / "tokenizer_cases.txt"
ATOL = 1e-4  # float32; the measured differences are about 1e-6


@pytest.fixture(scope="module")
def session() -> Any:
    return ort.InferenceSession(str(ex.cached_export()), providers=["CPUExecutionProvider"])


def onnx_attentions(session: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> np.ndarray:
    """``[L, B, H, S, S]`` from the ONNX model."""
    outs = session.run(None, {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()})
    return np.stack(outs[:-1])


def test_graph_inputs_outputs_and_float32_weights(session: Any) -> None:
    import onnx

    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    names = [o.name for o in session.get_outputs()]
    assert names == [f"attention_{i}" for i in range(6)] + ["last_hidden_state"]
    for o in session.get_outputs()[:-1]:
        batch, heads, s_q, s_k = o.shape
        assert heads == 12 and isinstance(s_q, str) and s_q == s_k, o.shape  # [B, H, S, S], S dynamic
    model = onnx.load(str(ex.cached_export()))
    sizes = {onnx.TensorProto.DataType.Name(t.data_type) for t in model.graph.initializer if np.prod(t.dims) > 1000}
    assert sizes == {"FLOAT"}, f"large initializers must all be float32 (no int8/float16), got {sizes}"
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)
    used = sum(p.numel() for n, p in pretrained.load_minilm()[0].named_parameters() if not n.startswith("pooler."))
    assert params >= used, (params, used)  # every weight but the unused pooler's is in the file


@pytest.mark.parametrize("sentence", ex.EXACT_SENTENCES, ids=lambda s: f"{len(s)}chars")
def test_onnx_equals_model_and_attnlib(session: Any, sentence: str) -> None:
    toks, model_w, attnlib_w = ex.reference(sentence)
    _, tokenizer = pretrained.load_minilm()
    enc = tokenizer([sentence], return_tensors="pt", truncation=True, max_length=ex.MAX_TOKENS)
    got = onnx_attentions(session, enc["input_ids"], enc["attention_mask"])[:, 0]  # [L, H, S, S]
    assert got.shape == tuple(model_w.shape) == (6, 12, len(toks), len(toks))
    d_model = float(np.abs(got - model_w.numpy()).max())
    d_attnlib = float(np.abs(got - attnlib_w.numpy()).max())
    print(f"S={len(toks)}: max |onnx - model| = {d_model:.2e}, max |onnx - attnlib| = {d_attnlib:.2e}")
    assert d_model < ATOL and d_attnlib < ATOL, (d_model, d_attnlib)


def test_the_long_sentence_fills_128_tokens() -> None:
    _, tokenizer = pretrained.load_minilm()
    assert len(tokenizer(ex.EXACT_SENTENCES[-1])["input_ids"]) > ex.MAX_TOKENS
    assert len(ex.reference(ex.EXACT_SENTENCES[-1])[0]) == ex.MAX_TOKENS


def test_padded_batch_matches_the_model(session: Any) -> None:
    model, tokenizer = pretrained.load_minilm()
    enc = pretrained.encode(tokenizer, ["The books on the shelf are old.", "Where are they?"])
    got = onnx_attentions(session, enc["input_ids"], enc["attention_mask"])  # [L, B, H, S, S]
    with torch.no_grad():
        want = torch.stack(model(**enc, output_attentions=True).attentions).numpy()
    real = enc["attention_mask"].bool().numpy()  # [B, S]
    diff = np.abs(got - want).transpose(1, 3, 0, 2, 4)[real]  # real query rows: [N_real, L, H, S]
    assert float(diff.max()) < ATOL
    assert np.all(got[:, 1][..., ~real[1]] == 0.0), "padded keys must get weight exactly 0"


# --- the JavaScript side, run in Node --------------------------------------------------------

_ESCAPE = re.compile(r"\\(t|n|r|\\|u\{([0-9A-Fa-f]+)\})")


def tokenizer_cases() -> list[str]:
    """The sentences of tokenizer_cases.txt, escapes decoded (see the file's header)."""
    plain = {"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}
    lines = CASES.read_text(encoding="utf-8").splitlines()
    return [_ESCAPE.sub(lambda m: chr(int(m.group(2), 16)) if m.group(2) else plain[m.group(1)], line)
            for line in lines if line and not line.startswith("#")]


def node_exe() -> str:
    exe = shutil.which("node")
    assert exe, "Node.js is needed for the explorer's JavaScript tests (apt-get install nodejs)"
    return exe


def node(script: str, data: Any) -> Any:
    """Run an ES module ``script`` in Node with ``data`` as JSON on stdin; return its JSON stdout."""
    done = subprocess.run([node_exe(), "--input-type=module", "-e", script, JS.as_uri() + "/"],
                          input=json.dumps(data), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


TOKENIZE_JS = """
import { readFileSync } from "node:fs";
const base = process.argv[1];
const { tokenize, parseVocab } = await import(base + "tokenizer.mjs");
const { vocab, cases } = JSON.parse(readFileSync(0, "utf8"));
const v = parseVocab(readFileSync(vocab, "utf8"));
process.stdout.write(JSON.stringify(cases.map((c) => tokenize(c, v, 128))));
"""


def test_cases_cover_what_the_issue_lists() -> None:
    cases = tokenizer_cases()
    assert len(cases) >= 30
    kinds = {
        "punctuation": r"[!?;:,.\"()\[\]{}]", "numbers": r"\d", "accents": r"[éèàçñüöÅ]", "emoji": r"[\U0001F300-\U0001FAFF]",
        "CJK": r"[\u4e00-\u9fff]", "repeated spaces": r" {3,}", "tab or newline": r"[\t\n]",
        "a word over 100 characters": r"\w{101,}",
    }
    for kind, pattern in kinds.items():
        assert any(re.search(pattern, c) for c in cases), f"no case with {kind}"
    _, tokenizer = pretrained.load_minilm()
    assert any(len(tokenizer(c)["input_ids"]) > 128 for c in cases), "no case longer than 128 tokens"
    assert any("[UNK]" in pretrained.tokens(tokenizer, c) for c in cases), "no case with an unknown word"


def test_vocab_file_is_the_tokenizer_vocabulary() -> None:
    _, tokenizer = pretrained.load_minilm()
    lines = (pretrained.model_path() / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert lines[-1] == ""
    assert {t: i for i, t in enumerate(lines[:-1])} == tokenizer.get_vocab()


def test_js_tokenizer_equals_python_tokenizer() -> None:
    cases = tokenizer_cases()
    got = node(TOKENIZE_JS, {"vocab": str(pretrained.model_path() / "vocab.txt"), "cases": cases})
    _, tokenizer = pretrained.load_minilm()
    wrong = []
    for text, js in zip(cases, got, strict=True):
        ids = tokenizer(text, truncation=True, max_length=128)["input_ids"]
        want = {"tokens": tokenizer.convert_ids_to_tokens(ids), "ids": ids,
                "truncated": len(tokenizer(text)["input_ids"]) > 128}
        if {k: js[k] for k in want} != want:
            wrong.append(f"{text[:60]!r}:\n  python {want['tokens'][:30]}\n  js     {js['tokens'][:30]}")
    assert not wrong, f"{len(wrong)} of {len(cases)} sentences tokenised differently:\n" + "\n".join(wrong)


ANALYSIS_JS = """
import { readFileSync } from "node:fs";
const base = process.argv[1];
const a = await import(base + "analysis.mjs");
const { att, query, key } = JSON.parse(readFileSync(0, "utf8"));
const prev = a.previousTokenScores(att), cls = a.keyScores(att, 0);
process.stdout.write(JSON.stringify({
  prev, cls, topPrev: a.topHeads(prev, 3), link: a.headsWithTopOn(att, query, key),
  viridis: a.VIRIDIS, worst: Math.min(...a.VIRIDIS.map((c) => Math.max(a.contrast(c, "#000000"), a.contrast(c, "#ffffff")))),
  cells: [0, 0.25, 0.5, 0.75, 1].map((v) => a.cellColours(v, 1)),
}));
"""


def test_js_head_scores_equal_attnlib() -> None:
    toks, weights, _ = ex.reference("The books on the shelf are old.")
    are, keys = toks.index("are"), toks.index("books")
    got = node(ANALYSIS_JS, {"att": weights.tolist(), "query": are, "key": keys})
    scores = ch07.head_pattern_scores(weights, toks)
    assert np.abs(np.array(got["prev"]) - scores["previous"].numpy()).max() < 1e-6
    assert np.abs(np.array(got["cls"]) - scores["[CLS]"].numpy()).max() < 1e-6
    assert [(t["layer"], t["head"]) for t in got["topPrev"]] == [(l, h) for l, h, _ in ch07.top_heads(scores["previous"], 3)]
    winners = [(l, h) for l in range(6) for h in range(12) if int(weights[l, h, are].argmax()) == keys]
    assert winners and [(t["layer"], t["head"]) for t in got["link"]] == winners


def test_js_colours_are_viridis_with_readable_text() -> None:
    import matplotlib

    got = node(ANALYSIS_JS, {"att": [[[[1.0, 0.0], [0.5, 0.5]]]], "query": 0, "key": 0})
    rgb = matplotlib.colormaps["viridis"](np.linspace(0, 1, 256))[:, :3]
    want = ["#" + "".join(f"{round(c * 255):02x}" for c in row) for row in rgb]
    assert got["viridis"] == want
    assert got["worst"] >= 4.5, f"some viridis colour has text contrast {got['worst']:.2f} < 4.5"
    for v, cell in zip([0, 0.25, 0.5, 0.75, 1], got["cells"]):
        assert cell["bg"] == want[round(v * 255)]
        on_black, on_white = _contrast(cell["bg"], "#000000"), _contrast(cell["bg"], "#ffffff")
        assert cell["fg"] == ("#000000" if on_black >= on_white else "#ffffff") and max(on_black, on_white) >= 4.5


def _contrast(a: str, b: str) -> float:
    """WCAG 2.1 contrast ratio, computed here independently of the JavaScript."""
    def lum(h: str) -> float:
        c = [int(h[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        c = [x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4 for x in c]
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("script", sorted(p.name for p in JS.glob("*.mjs")))
def test_every_explorer_script_parses(script: str) -> None:
    """explorer.mjs needs a page to run (site_tests run it); here Node checks that each file parses."""
    done = subprocess.run([node_exe(), "--check", str(JS / script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
