// Lists a GGUF file's header with @huggingface/gguf, as JSON on stdout, so that a C++ test can
// check that a standard GGUF reader sees exactly what fireline wrote (tests/fire/gguf_js_test.cpp).
//   node tests/js/gguf_list.mjs FILE
import { gguf } from "@huggingface/gguf";

const path = process.argv[2];
const parsed = await gguf(path, { allowLocalFile: true });
// BigInts (u64 counts, dims, offsets) become decimal strings; JSON has no 64-bit integers.
const plain = (v) => (typeof v === "bigint" ? v.toString() : Array.isArray(v) ? v.map(plain) : v);
const metadata = {};
for (const [key, value] of Object.entries(parsed.metadata)) metadata[key] = plain(value);
const out = {
  metadata,
  tensors: parsed.tensorInfos.map((t) => ({
    name: t.name,
    n_dims: t.n_dims,
    shape: plain(t.shape),
    dtype: t.dtype,
    offset: plain(t.offset),
  })),
  tensor_data_offset: plain(parsed.tensorDataOffset),
};
process.stdout.write(JSON.stringify(out) + "\n");
