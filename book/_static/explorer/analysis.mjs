// The explorer's numbers: the chapter's head scores and the heatmap colours. No DOM here, so
// tests/test_explorer_onnx.py runs this module in Node and compares it with attnlib.
// Weights are nested arrays indexed [layer][head][query][key], as window.attnlibLive.run returns.

/** Mean over queries 1..S-1 of the weight on token i-1, for every head: [L][H] (attnlib's "previous"). */
export function previousTokenScores(att) {
  return att.map((layer) => layer.map((w) => {
    let sum = 0;
    for (let i = 1; i < w.length; i++) sum += w[i][i - 1];
    return sum / (w.length - 1);
  }));
}

/** Mean over all queries of the weight on the key at `position` (0 is [CLS]), for every head: [L][H]. */
export function keyScores(att, position = 0) {
  return att.map((layer) => layer.map((w) => w.reduce((s, row) => s + row[position], 0) / w.length));
}

/** The k largest entries of a [L][H] score as {layer, head, value}, largest first (ties: lower index first). */
export function topHeads(score, k = 3) {
  const all = [];
  score.forEach((row, layer) => row.forEach((value, head) => all.push({ layer, head, value })));
  return all.sort((a, b) => b.value - a.value || a.layer - b.layer || a.head - b.head).slice(0, k);
}

/** Every head whose largest weight from `query` falls on `key` (positions), with that weight. */
export function headsWithTopOn(att, query, key) {
  const found = [];
  att.forEach((layer, l) => layer.forEach((w, h) => {
    const row = w[query];
    let best = 0;
    for (let j = 1; j < row.length; j++) if (row[j] > row[best]) best = j;
    if (best === key) found.push({ layer: l, head: h, value: row[key] });
  }));
  return found;
}

// matplotlib's viridis, 256 colours ("#rrggbb" without the #), from
// matplotlib.colormaps["viridis"](numpy.linspace(0, 1, 256)); tests/test_explorer_onnx.py checks it.
const VIRIDIS_HEX = "44015444025645045745055946075a46085c460a5d460b5e470d60470e6147106347116447136548146748166848176948186a481a6c481b6d481c6e481d6f481f70482071482173482374482475482576482677482878482979472a7a472c7a472d7b472e7c472f7d46307e46327e46337f463480453581453781453882443983443a83443b84433d84433e85423f854240864241864142874144874045884046883f47883f48893e49893e4a893e4c8a3d4d8a3d4e8a3c4f8a3c508b3b518b3b528b3a538b3a548c39558c39568c38588c38598c375a8c375b8d365c8d365d8d355e8d355f8d34608d34618d33628d33638d32648e32658e31668e31678e31688e30698e306a8e2f6b8e2f6c8e2e6d8e2e6e8e2e6f8e2d708e2d718e2c718e2c728e2c738e2b748e2b758e2a768e2a778e2a788e29798e297a8e297b8e287c8e287d8e277e8e277f8e27808e26818e26828e26828e25838e25848e25858e24868e24878e23888e23898e238a8d228b8d228c8d228d8d218e8d218f8d21908d21918c20928c20928c20938c1f948c1f958b1f968b1f978b1f988b1f998a1f9a8a1e9b8a1e9c891e9d891f9e891f9f881fa0881fa1881fa1871fa28720a38620a48621a58521a68522a78522a88423a98324aa8325ab8225ac8226ad8127ad8128ae8029af7f2ab07f2cb17e2db27d2eb37c2fb47c31b57b32b67a34b67935b77937b87838b9773aba763bbb753dbc743fbc7340bd7242be7144bf7046c06f48c16e4ac16d4cc26c4ec36b50c46a52c56954c56856c66758c7655ac8645cc8635ec96260ca6063cb5f65cb5e67cc5c69cd5b6ccd5a6ece5870cf5773d05675d05477d1537ad1517cd2507fd34e81d34d84d44b86d54989d5488bd6468ed64590d74393d74195d84098d83e9bd93c9dd93ba0da39a2da37a5db36a8db34aadc32addc30b0dd2fb2dd2db5de2bb8de29bade28bddf26c0df25c2df23c5e021c8e020cae11fcde11dd0e11cd2e21bd5e21ad8e219dae319dde318dfe318e2e418e5e419e7e419eae51aece51befe51cf1e51df4e61ef6e620f8e621fbe723fde725";
export const VIRIDIS = Array.from({ length: 256 }, (_, i) => "#" + VIRIDIS_HEX.slice(6 * i, 6 * i + 6));

/** WCAG 2.1 relative luminance of "#rrggbb". */
export function luminance(hex) {
  const lin = [1, 3, 5].map((i) => {
    const c = parseInt(hex.slice(i, i + 2), 16) / 255;
    return c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
  });
  return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
}

/** WCAG contrast ratio of two "#rrggbb" colours (1 to 21). */
export function contrast(a, b) {
  const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
}

/** Background and text colour of a cell: black or white text, whichever contrasts more (>= 4.5:1 on viridis). */
export function cellColours(value, vmax) {
  const t = vmax > 0 ? Math.min(Math.max(value / vmax, 0), 1) : 0;
  const bg = VIRIDIS[Math.round(t * 255)];
  return { bg, fg: contrast(bg, "#000000") >= contrast(bg, "#ffffff") ? "#000000" : "#ffffff" };
}
