// BERT uncased WordPiece tokenization, step for step as the Hugging Face tokenizer of
// all-MiniLM-L6-v2 does it (tokenizers' BertNormalizer, BertPreTokenizer, WordPiece and the
// [CLS] ... [SEP] template). tests/test_explorer_onnx.py runs this file in Node and compares
// it token for token with the Python tokenizer on tests/data/tokenizer_cases.txt.
// No DOM here: the same module runs in the browser and in Node.

const MAX_CHARS_PER_WORD = 100; // longer words become [UNK]

// White_Space characters (as Rust's char::is_whitespace), plus the three BERT counts as space.
const WHITESPACE = new Set([0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x20, 0x85, 0xa0, 0x1680,
  0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a,
  0x2028, 0x2029, 0x202f, 0x205f, 0x3000]);
const OTHER = /\p{C}/u; // Cc, Cf, Cs, Co, Cn: dropped (tab, newline and carriage return excepted)
const PUNCTUATION = /\p{P}/u;
const NONSPACING_MARK = /\p{Mn}/u;

const isWhitespace = (cp) => WHITESPACE.has(cp);
const isControl = (cp) => cp !== 0x09 && cp !== 0x0a && cp !== 0x0d && OTHER.test(String.fromCodePoint(cp));

function isPunctuation(cp) {
  // ASCII symbols such as $ + < = > ^ ` | ~ count as punctuation too.
  const ascii = (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126);
  return ascii || PUNCTUATION.test(String.fromCodePoint(cp));
}

function isChinese(cp) { // the CJK Unified Ideographs blocks (not Hangul, Hiragana or Katakana)
  return (cp >= 0x4e00 && cp <= 0x9fff) || (cp >= 0x3400 && cp <= 0x4dbf) || (cp >= 0x20000 && cp <= 0x2a6df)
    || (cp >= 0x2a700 && cp <= 0x2b73f) || (cp >= 0x2b740 && cp <= 0x2b81f) || (cp >= 0x2b920 && cp <= 0x2ceaf)
    || (cp >= 0xf900 && cp <= 0xfaff) || (cp >= 0x2f800 && cp <= 0x2fa1f);
}

/** The normalised text: controls dropped, spaces unified, CJK spaced, accents stripped, lower case. */
export function normalize(text) {
  let out = "";
  for (const ch of text) {
    const cp = ch.codePointAt(0);
    if (cp === 0 || cp === 0xfffd || isControl(cp)) continue;
    if (isWhitespace(cp)) out += " ";
    else if (isChinese(cp)) out += " " + ch + " ";
    else out += ch;
  }
  let stripped = "";
  for (const ch of out.normalize("NFD")) if (!NONSPACING_MARK.test(ch)) stripped += ch;
  let lower = ""; // one character at a time, as tokenizers does (no word-final sigma rule)
  for (const ch of stripped) lower += ch.toLowerCase();
  return lower;
}

/** Words: split on whitespace, and every punctuation character is a word of its own. */
export function preTokenize(text) {
  const words = [];
  let word = "";
  for (const ch of text) {
    const cp = ch.codePointAt(0);
    if (isWhitespace(cp) || isPunctuation(cp)) {
      if (word) words.push(word);
      word = "";
      if (!isWhitespace(cp)) words.push(ch);
    } else {
      word += ch;
    }
  }
  if (word) words.push(word);
  return words;
}

/** Greedy longest-match-first WordPiece of one word; ["[UNK]"] when it cannot be split. */
export function wordPiece(word, vocab) {
  const chars = Array.from(word);
  if (chars.length > MAX_CHARS_PER_WORD) return ["[UNK]"];
  const pieces = [];
  for (let start = 0; start < chars.length;) {
    let end = chars.length;
    let found = null;
    while (start < end) {
      const piece = (start > 0 ? "##" : "") + chars.slice(start, end).join("");
      if (vocab.ids.has(piece)) { found = piece; break; }
      end -= 1;
    }
    if (found === null) return ["[UNK]"];
    pieces.push(found);
    start = end;
  }
  return pieces;
}

/** The vocabulary from the text of vocab.txt (one token a line; the line number is the id). */
export function parseVocab(text) {
  const tokens = text.split("\n");
  if (tokens.length && tokens[tokens.length - 1] === "") tokens.pop();
  const ids = new Map();
  tokens.forEach((t, i) => { if (!ids.has(t)) ids.set(t, i); });
  return { tokens, ids };
}

/**
 * Tokenise one sentence as the model sees it.
 * @returns {{tokens: string[], ids: number[], truncated: boolean, pieces: number}}
 *   `pieces` is the number of word pieces before truncation to `maxTokens` (specials included).
 */
export function tokenize(text, vocab, maxTokens = 128) {
  const pieces = [];
  for (const word of preTokenize(normalize(text))) pieces.push(...wordPiece(word, vocab));
  const kept = pieces.slice(0, maxTokens - 2);
  const tokens = ["[CLS]", ...kept, "[SEP]"];
  return {
    tokens,
    ids: tokens.map((t) => vocab.ids.get(t)),
    truncated: kept.length < pieces.length,
    pieces: pieces.length + 2,
  };
}
