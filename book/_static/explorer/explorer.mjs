// Live attention of all-MiniLM-L6-v2 in the reader's browser: ONNX Runtime on WebAssembly, no
// kernel, no network beyond this site. Include it in a page with
//     <div id="attnlib-explorer"></div>
//     <script type="module" src="../_static/explorer/explorer.mjs"></script>
// (the div takes data-heading-level="3" when it sits inside a section with an h2 heading).
// Nothing heavy loads with the page: the runtime (about 14 MB) and the model (about 91 MB) are
// fetched only when the reader presses "Load model" or a script calls window.attnlibLive.run.
//
// API: window.attnlibLive.run(sentence) -> Promise<{tokens, attentions, truncated, pieces, ms}>,
// attentions indexed [layer][head][query][key]; the model loads on first use.

import { tokenize, parseVocab } from "./tokenizer.mjs";
import { previousTokenScores, keyScores, topHeads, headsWithTopOn, cellColours } from "./analysis.mjs";

const BASE = new URL("./", import.meta.url);
const DEFAULT_SENTENCE = "The books on the shelf are old.";
// The head the explorer opens on: chapter 7's "are" -> "books" head (attnbook.ch07.ARE_BOOKS_HEAD).
const DEFAULT_LAYER = 3, DEFAULT_HEAD = 1;
const MB = (bytes) => (bytes / 1e6).toFixed(1);

const state = { manifest: null, vocab: null, session: null, loading: null, status: "idle", ui: null };
const timings = { download_ms: null, session_ms: null, runs: [] };

function hasWebAssembly() {
  return typeof WebAssembly === "object" && typeof WebAssembly.instantiate === "function";
}

async function fetchJson(name) {
  const r = await fetch(new URL(name, BASE));
  if (!r.ok) throw new Error(`HTTP ${r.status} for ${name}`);
  return r.json();
}

function manifest() {
  if (!state.manifestPromise) {
    state.manifestPromise = fetchJson("manifest.json").then((m) => (state.manifest = m)).catch((e) => {
      state.manifestPromise = null;
      throw new Error(`the model files are not part of this build of the site (${e.message}); ` +
        "`make book` exports them");
    });
  }
  return state.manifestPromise;
}

async function vocab() {
  if (!state.vocab) {
    const m = await manifest();
    const r = await fetch(new URL(m.vocab.file, BASE));
    if (!r.ok) throw new Error(`HTTP ${r.status} for ${m.vocab.file}`);
    state.vocab = parseVocab(await r.text());
  }
  return state.vocab;
}

/** Fetch several files as bytes, reporting progress over all of them together. */
async function download(files, onProgress) {
  const total = files.reduce((s, f) => s + f.bytes, 0);
  let done = 0;
  const out = [];
  for (const f of files) {
    const r = await fetch(new URL(f.path, BASE));
    if (!r.ok) throw new Error(`HTTP ${r.status} for ${f.path}`);
    const reader = r.body.getReader();
    const bytes = new Uint8Array(f.bytes); // the size the manifest gives: one buffer, no copies
    let at = 0;
    for (;;) {
      const { done: end, value } = await reader.read();
      if (end) break;
      if (at + value.length > f.bytes) throw new Error(`${f.path} is larger than the ${f.bytes} bytes the manifest gives`);
      bytes.set(value, at);
      at += value.length;
      done += value.length;
      onProgress(done, total);
    }
    if (at !== f.bytes) throw new Error(`${f.path} has ${at} bytes, the manifest gives ${f.bytes}`);
    out.push(bytes);
  }
  return out;
}

/** Download the runtime and the model, then create the ONNX Runtime session (once). */
function load() {
  if (state.session) return Promise.resolve(state.session);
  if (state.loading) return state.loading;
  state.loading = (async () => {
    if (!hasWebAssembly()) throw new Error("this browser has no WebAssembly, which the model needs to run");
    const m = await manifest();
    await vocab();
    setStatus("loading");
    const runtime = m.runtime.folder;
    const wasmName = Object.keys(m.runtime.files).find((f) => f.endsWith(".wasm"));
    const t0 = performance.now();
    const [wasm, model] = await download([
      { path: runtime + wasmName, bytes: m.runtime.files[wasmName] },
      { path: m.model.file, bytes: m.model.bytes },
    ], (done, total) => state.ui && state.ui.progress(done, total));
    const t1 = performance.now();
    const ort = await import(new URL(runtime + "ort.wasm.min.mjs", BASE).href);
    ort.env.wasm.wasmPaths = new URL(runtime, BASE).href; // the glue script, served with the site
    ort.env.wasm.wasmBinary = wasm; // already downloaded (with progress)
    ort.env.wasm.numThreads = 1; // threads need cross-origin isolation, which a static site lacks
    ort.env.wasm.proxy = false;
    state.ort = ort;
    state.session = await ort.InferenceSession.create(model, { executionProviders: ["wasm"] });
    timings.download_ms = t1 - t0;
    timings.session_ms = performance.now() - t1;
    setStatus("ready");
    return state.session;
  })().catch((e) => {
    state.loading = null;
    setStatus("failed", e);
    throw e;
  });
  return state.loading;
}

/** Tokenise and run one sentence; attentions are [layer][head][query][key]. */
async function run(sentence) {
  if (typeof sentence !== "string") throw new TypeError(`sentence must be a string, got ${typeof sentence}`);
  const session = await load();
  const t0 = performance.now();
  const m = state.manifest;
  const enc = tokenize(sentence, state.vocab, m.max_tokens);
  const S = enc.ids.length;
  const ids = new state.ort.Tensor("int64", BigInt64Array.from(enc.ids, BigInt), [1, S]);
  const mask = new state.ort.Tensor("int64", new BigInt64Array(S).fill(1n), [1, S]);
  const out = await session.run({ input_ids: ids, attention_mask: mask });
  const attentions = [];
  for (let l = 0; l < m.layers; l++) {
    const data = out[`attention_${l}`].data; // Float32Array [1, H, S, S]
    const layer = [];
    for (let h = 0; h < m.heads; h++) {
      const rows = [];
      for (let i = 0; i < S; i++) rows.push(Array.from(data.subarray((h * S + i) * S, (h * S + i + 1) * S)));
      layer.push(rows);
    }
    attentions.push(layer);
  }
  for (const t of Object.values(out)) if (t.dispose) t.dispose();
  const ms = performance.now() - t0;
  timings.runs.push({ tokens: S, ms });
  return { tokens: enc.tokens, attentions, truncated: enc.truncated, pieces: enc.pieces, ms };
}

function setStatus(status, error) {
  state.status = status;
  state.error = error ? String(error.message || error) : null;
  if (state.ui) state.ui.status(status, state.error);
}

window.attnlibLive = {
  run, load, timings,
  get status() { return state.status; },
  get error() { return state.error; },
  tokenize: async (sentence) => tokenize(sentence, await vocab(), (await manifest()).max_tokens),
  analysis: { previousTokenScores, keyScores, topHeads, headsWithTopOn, cellColours },
};

// ---------------------------------------------------------------------------------------------
// The page: input, load button, progress, selectors, heatmap, line view, analyses.

const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const headName = (l, h) => `L${l}H${h}`;
const fmt = (x) => x.toFixed(2);

/** An accessible heatmap table: text colour follows the cell's luminance, every header has text. */
export function heatmapTable({ matrix, rowLabels, colLabels, caption, corner, vmax }) {
  const top = vmax ?? Math.max(...matrix.map((r) => Math.max(...r)));
  const head = colLabels.map((c) => `<th scope="col"><span>${esc(c)}</span></th>`).join("");
  const body = matrix.map((row, i) => {
    const cells = row.map((v) => {
      const { bg, fg } = cellColours(v, top);
      return `<td style="background:${bg};color:${fg}">${fmt(v)}</td>`;
    }).join("");
    return `<tr><th scope="row">${esc(rowLabels[i])}</th>${cells}</tr>`;
  }).join("");
  return `<table class="attnlib-heatmap ax-heatmap"><caption>${esc(caption)}</caption>` +
    `<thead><tr><th scope="col" class="ax-corner">${esc(corner)}</th>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

/** BertViz-style line view: queries on the left, keys on the right, line opacity = weight. */
function lineView(weights, tokens, query) {
  const rowH = 18, width = 440, xl = 150, xr = 290, S = tokens.length, h = S * rowH + 8;
  const y = (i) => 4 + rowH * i + rowH / 2;
  const lines = [];
  for (let i = 0; i < S; i++) {
    if (query >= 0 && i !== query) continue;
    for (let j = 0; j < S; j++) {
      const w = weights[i][j];
      if (query < 0 && w < 0.01) continue; // invisible anyway; keeps 128 x 128 views light
      lines.push(`<line x1="${xl + 6}" y1="${y(i)}" x2="${xr - 6}" y2="${y(j)}" stroke-opacity="${w.toFixed(4)}" data-q="${i}" data-k="${j}"/>`);
    }
  }
  const label = (t, i, x, anchor) => `<text x="${x}" y="${y(i) + 4}" text-anchor="${anchor}"` +
    `${i === query ? ' class="ax-selected"' : ""}>${esc(t)}</text>`;
  return `<svg class="ax-lines" viewBox="0 0 ${width} ${h}" width="${width}" height="${h}" role="img" aria-labelledby="ax-lines-caption">` +
    `<g class="ax-line-group">${lines.join("")}</g>` +
    tokens.map((t, i) => label(t, i, xl, "end")).join("") + tokens.map((t, i) => label(t, i, xr, "start")).join("") + "</svg>";
}

function headList(items, extra) {
  return items.map((x) => `<button type="button" class="ax-head" data-layer="${x.layer}" data-head="${x.head}">` +
    `${headName(x.layer, x.head)} ${fmt(x.value)}</button>`).join(" ") + (extra || "");
}

function buildUi(root) {
  root.classList.add("ax-root");
  // Headings inside the explorer: h2 by default; data-heading-level="3" where it sits under an h2.
  const hn = `h${Math.min(Math.max(Number(root.dataset.headingLevel) || 2, 2), 6)}`;
  root.innerHTML = `
  <form class="ax-form" novalidate>
    <label for="ax-sentence">Your sentence</label>
    <input id="ax-sentence" type="text" value="${esc(DEFAULT_SENTENCE)}" autocomplete="off" spellcheck="false"
      aria-describedby="ax-limit">
    <p id="ax-limit" class="ax-small">Up to 128 tokens, [CLS] and [SEP] included; a longer sentence is cut, and the page says so.</p>
    <button type="button" class="ax-load" disabled>Load model</button>
    <button type="submit" class="ax-run" disabled>Show attention</button>
    <p class="ax-small ax-what"></p>
    <div class="ax-progress" hidden>
      <progress max="1" value="0" aria-label="Download progress"></progress> <span class="ax-progress-text"></span>
    </div>
  </form>
  <p class="ax-message" role="status" aria-live="polite"></p>
  <div class="ax-results" hidden>
    <p class="ax-note" hidden></p>
    <p class="ax-tokens"></p>
    <div class="ax-pick">
      <label>Layer <select class="ax-layer"></select></label>
      <label>Head <select class="ax-headsel"></select></label>
    </div>
    <div class="ax-scroll" tabindex="0" role="region" aria-label="Attention weights of the chosen head"></div>
    <figure class="ax-figure">
      <div class="ax-scroll ax-svg" tabindex="0" role="region" aria-label="Line view of the chosen head"></div>
      <figcaption id="ax-lines-caption"></figcaption>
      <label>Lines from <select class="ax-from"></select></label>
    </figure>
    <${hn} class="ax-h">Which heads link two tokens?</${hn}>
    <div class="ax-pick">
      <label>Query token <select class="ax-query"></select></label>
      <label>Key token <select class="ax-key"></select></label>
    </div>
    <p class="ax-link"></p>
    <${hn} class="ax-h">Previous-token heads</${hn}>
    <p class="ax-prev"></p>
    <div class="ax-scroll" tabindex="0" role="region" aria-label="Previous-token score of every head"></div>
    <${hn} class="ax-h">[CLS] heads</${hn}>
    <p class="ax-cls"></p>
    <div class="ax-scroll" tabindex="0" role="region" aria-label="[CLS] score of every head"></div>
  </div>`;
  const $ = (sel) => root.querySelector(sel);
  const el = {
    form: $(".ax-form"), input: $("#ax-sentence"), loadBtn: $(".ax-load"), runBtn: $(".ax-run"), what: $(".ax-what"),
    progressBox: $(".ax-progress"), progress: $("progress"), progressText: $(".ax-progress-text"),
    message: $(".ax-message"), results: $(".ax-results"), note: $(".ax-note"), tokens: $(".ax-tokens"),
    layer: $(".ax-layer"), head: $(".ax-headsel"), from: $(".ax-from"), query: $(".ax-query"), key: $(".ax-key"),
    link: $(".ax-link"), prev: $(".ax-prev"), cls: $(".ax-cls"),
  };
  const [mapBox, svgBox, prevBox, clsBox] = root.querySelectorAll(".ax-scroll");
  let current = null; // the last result shown
  const say = (text) => { el.message.textContent = text; };

  const ui = {
    progress(done, total) {
      el.progressBox.hidden = false;
      el.progress.value = done / total;
      el.progressText.textContent = `${MB(done)} of ${MB(total)} MB`;
    },
    status(status, error) {
      if (status === "loading") {
        el.loadBtn.disabled = true;
        say("Downloading the model and the runtime...");
      } else if (status === "ready") {
        el.loadBtn.hidden = true;
        el.progressBox.hidden = true;
        el.runBtn.disabled = false;
      } else if (status === "failed") {
        el.loadBtn.disabled = !hasWebAssembly();
        el.progressBox.hidden = true;
        say(`The live model could not be loaded: ${error}. The rest of this page works without it.`);
        root.classList.add("ax-failed");
      }
    },
  };
  state.ui = ui;

  function fillSelect(select, options, value) {
    select.innerHTML = options.map(([v, text]) => `<option value="${v}">${esc(text)}</option>`).join("");
    select.value = String(value);
  }

  function showHead() {
    const l = Number(el.layer.value), h = Number(el.head.value), from = Number(el.from.value);
    const { tokens, attentions } = current;
    const w = attentions[l][h];
    const labels = tokens.map((t, i) => `${t} ${i}`);
    mapBox.innerHTML = heatmapTable({ matrix: w, rowLabels: labels, colLabels: labels, vmax: 1,
      caption: `Layer ${l}, head ${h}: weight of each query (row) on each key (column); each row sums to 1.`,
      corner: "query \\ key" });
    svgBox.innerHTML = lineView(w, tokens, from);
    $("#ax-lines-caption").textContent = `Line view of layer ${l}, head ${h}: a line from a query (left) to a key (right), ` +
      `as opaque as the weight` + (from < 0 ? " (weights below 0.01 not drawn)." : `, for the query ${tokens[from]} (${from}).`);
  }

  function showLink() {
    const q = Number(el.query.value), k = Number(el.key.value);
    const { tokens, attentions } = current;
    const heads = headsWithTopOn(attentions, q, k);
    const byWeight = topHeads(attentions.map((layer) => layer.map((w) => w[q][k])), 3);
    const what = `${tokens[q]} (${q}) to ${tokens[k]} (${k})`;
    el.link.innerHTML = (heads.length
      ? `${heads.length} of 72 heads put${heads.length === 1 ? "s" : ""} the largest weight of ${esc(tokens[q])} on ${esc(tokens[k])}: ${headList(heads)}.`
      : `No head puts the largest weight of ${esc(tokens[q])} on ${esc(tokens[k])}.`) +
      ` Largest weights from ${esc(what)}: ${headList(byWeight)}.`;
    return heads.length ? `${heads.length} head${heads.length === 1 ? " puts" : "s put"} the top weight of ${tokens[q]} on ${tokens[k]}, ` +
      `first ${headName(heads[0].layer, heads[0].head)}.` : `No head puts the top weight of ${tokens[q]} on ${tokens[k]}.`;
  }

  function scoreTable(box, score, name) {
    box.innerHTML = heatmapTable({ matrix: score, rowLabels: score.map((_, l) => `layer ${l}`),
      colLabels: score[0].map((_, h) => `head ${h}`), corner: "layer \\ head", vmax: 1,
      caption: `${name} score of every head (0 to 1).` });
  }

  function showAnalyses() {
    const { tokens, attentions } = current;
    const prev = previousTokenScores(attentions), cls = keyScores(attentions, 0);
    const mean = (s) => s.flat().reduce((a, b) => a + b, 0) / s.flat().length;
    el.prev.innerHTML = `Mean weight of query i on token i-1 (queries 1 to ${tokens.length - 1}). Top heads: ` +
      headList(topHeads(prev, 3)) + ` (mean over all heads ${fmt(mean(prev))}).`;
    el.cls.innerHTML = `Mean weight of every query on [CLS]. Top heads: ` + headList(topHeads(cls, 3)) +
      ` (mean over all heads ${fmt(mean(cls))}).`;
    scoreTable(prevBox, prev, "Previous-token");
    scoreTable(clsBox, cls, "[CLS]");
    const [p] = topHeads(prev, 1), [c] = topHeads(cls, 1);
    return `Previous-token head ${headName(p.layer, p.head)} (${fmt(p.value)}); [CLS] head ${headName(c.layer, c.head)} (${fmt(c.value)}).`;
  }

  async function runSentence() {
    const sentence = el.input.value;
    el.runBtn.disabled = true;
    try {
      const result = await run(sentence);
      const t0 = performance.now();
      current = result;
      const { tokens } = result;
      const opts = tokens.map((t, i) => [i, `${i}: ${t}`]);
      const q = Math.max(tokens.indexOf("are"), 1), k = tokens.indexOf("books") > 0 ? tokens.indexOf("books") : Math.min(2, tokens.length - 1);
      fillSelect(el.query, opts, q);
      fillSelect(el.key, opts, k);
      fillSelect(el.from, [[-1, "every token"], ...opts], -1);
      if (!el.layer.options.length) {
        fillSelect(el.layer, [...Array(state.manifest.layers).keys()].map((l) => [l, String(l)]), DEFAULT_LAYER);
        fillSelect(el.head, [...Array(state.manifest.heads).keys()].map((h) => [h, String(h)]), DEFAULT_HEAD);
      }
      el.tokens.innerHTML = `${tokens.length} tokens: ` + tokens.map((t, i) => `<span class="ax-tok">${esc(t)}<sub>${i}</sub></span>`).join(" ");
      el.note.hidden = !result.truncated;
      el.note.textContent = result.truncated ? `Your sentence has ${result.pieces} tokens; the model reads only the first 128 ` +
        `(126 word pieces between [CLS] and [SEP]), so the rest is cut.` : "";
      el.results.hidden = false;
      showHead();
      const link = showLink();
      const patterns = showAnalyses();
      timings.render_ms = performance.now() - t0;
      say(`${tokens.length} tokens${result.truncated ? " (cut to 128)" : ""}, computed in ${Math.round(result.ms)} ms. ` +
        `Showing layer ${el.layer.value}, head ${el.head.value}. ${link} ${patterns}`);
    } catch (e) {
      if (state.status !== "failed") say(`Could not run the model: ${e.message || e}`);
    } finally {
      el.runBtn.disabled = state.status !== "ready";
    }
  }

  el.form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (state.status === "ready") runSentence();
    else if (!el.loadBtn.disabled) el.loadBtn.click();
  });
  el.loadBtn.addEventListener("click", () => { load().then(runSentence, () => {}); });
  for (const s of [el.layer, el.head, el.from]) {
    s.addEventListener("change", () => {
      showHead();
      if (s !== el.from) say(`Showing layer ${el.layer.value}, head ${el.head.value}.`);
    });
  }
  for (const s of [el.query, el.key]) s.addEventListener("change", () => say(showLink()));
  root.addEventListener("click", (ev) => {
    const b = ev.target.closest("button.ax-head");
    if (!b) return;
    el.layer.value = b.dataset.layer;
    el.head.value = b.dataset.head;
    showHead();
    say(`Showing layer ${b.dataset.layer}, head ${b.dataset.head}.`);
    el.layer.focus();
  });

  if (!hasWebAssembly()) {
    setStatus("failed", new Error("this browser has no WebAssembly, which the model needs to run"));
    return;
  }
  manifest().then((m) => {
    const runtime = Object.values(m.runtime.files).reduce((a, b) => a + b, 0);
    el.loadBtn.textContent = `Load model (${MB(m.model.bytes + runtime)} MB)`;
    el.what.textContent = `Downloads all-MiniLM-L6-v2 in float32 (${MB(m.model.bytes)} MB) and the ` +
      `${m.runtime.package} WebAssembly runtime (${MB(runtime)} MB), both served with this site; nothing ` +
      "leaves your browser.";
    el.loadBtn.disabled = false;
  }, (e) => setStatus("failed", e));
}

function start() {
  const link = document.createElement("link");
  link.rel = "stylesheet";
  link.href = new URL("explorer.css", BASE).href;
  document.head.appendChild(link);
  const root = document.getElementById("attnlib-explorer");
  if (root) buildUi(root);
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
