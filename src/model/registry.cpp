// The architecture registry: the one place that maps a config's architecture to its model code.
#include <functional>
#include <map>

#include "core/error.h"
#include "model/gemma4.h"
#include "model/model.h"
#include "model/qwen35.h"

namespace fl {

namespace {

struct Architecture {
  std::function<std::unique_ptr<Model>(const ModelSource&, Backend&)> make;
  std::function<MemoryPlan(const ModelSource&, const LoadOptions&)> plan_memory;
  std::function<std::unique_ptr<Model>(std::unique_ptr<ModelSource>, Backend&, Communicator&)> make_rank;
};

const Architecture& architecture_of(const ModelSource& source) {
  static const std::map<std::string, Architecture> kArchitectures = {
      {"gemma4", {make_gemma4_model, gemma4_memory_plan, make_gemma4_rank_model}},
      {"qwen35", {make_qwen35_model, qwen35_memory_plan, make_qwen35_rank_model}},
  };
  const std::string& arch = source.config().architecture;
  auto it = kArchitectures.find(arch);
  if (it == kArchitectures.end()) fail("{}: no model code for architecture '{}'", source.path(), arch);
  return it->second;
}

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

}  // namespace

int32_t DecodeGraph::step_sample(int32_t token, const SampleSpec& spec) {
  std::vector<float> logits = step(token);
  try {
    return sample_logits_reference(logits, spec);
  } catch (const Error&) {  // every token banned
    return -1;
  }
}

std::vector<float> Model::forward_batch(std::span<Sequence* const> seqs, std::span<const int32_t> ids) {
  if (seqs.size() != ids.size()) fail("forward_batch: {} sequences but {} token ids", seqs.size(), ids.size());
  std::vector<float> out;
  out.reserve(seqs.size() * static_cast<size_t>(vocab_size()));
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::vector<float> row = forward(*seqs[i], ids.subspan(i, 1), LogitsMode::last);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

std::vector<int32_t> Model::forward_batch_sample(std::span<Sequence* const> seqs, std::span<const int32_t> ids,
                                                 std::span<const SampleSpec> specs) {
  if (specs.size() != seqs.size()) fail("forward_batch_sample: {} sequences but {} sampling specs", seqs.size(), specs.size());
  std::vector<float> logits = forward_batch(seqs, ids);
  const auto V = static_cast<size_t>(vocab_size());
  std::vector<int32_t> tokens(seqs.size(), -1);
  for (size_t i = 0; i < seqs.size(); ++i) {
    try {
      tokens[i] = sample_logits_reference(std::span<float>(logits.data() + i * V, V), specs[i]);
    } catch (const Error&) {  // every token banned
    }
  }
  return tokens;
}

namespace {

// The architecture plans one sequence; every sequence has its own KV cache and recurrent state.
MemoryPlan plan_for(const Architecture& arch, const ModelSource& source, const LoadOptions& options) {
  if (options.sequences < 1) fail("a model needs at least one sequence, not {}", options.sequences);
  MemoryPlan plan = arch.plan_memory(source, options);
  plan.kv *= options.sequences;
  plan.recurrent *= options.sequences;
  return plan;
}

}  // namespace

void check_sequence_copy(const Sequence& src, const Sequence& dst) {
  if (src.storage.size() != dst.storage.size() || src.max_seq != dst.max_seq)
    fail("copy_sequence: the sequences were made with different options ({} and {} buffers, {} and {} positions)",
         src.storage.size(), dst.storage.size(), src.max_seq, dst.max_seq);
  for (size_t i = 0; i < src.storage.size(); ++i)
    if (dst.storage[i]->size() != src.storage[i]->size())
      fail("copy_sequence: the sequences were made with different options (buffer {} holds {} bytes and {})", i,
           src.storage[i]->size(), dst.storage[i]->size());
}

void copy_sequence_storage(Backend& backend, const Sequence& src, Sequence& dst) {
  if (&src == &dst) return;
  check_sequence_copy(src, dst);
  for (size_t i = 0; i < src.storage.size(); ++i) {
    const int64_t bytes = static_cast<int64_t>(src.storage[i]->size());
    backend.copy_on_device(make_tensor(dst.storage[i]->data(), DType::u8, {bytes}, backend.device()),
                           make_tensor(src.storage[i]->data(), DType::u8, {bytes}, backend.device()));
  }
  dst.n_past = src.n_past;
}

namespace {
// One sequence's decode row (T == 1) whose KV write may run beside its attention: its cache.
const KvView* cache_written_beside_attention(std::span<const SequenceRows> parts, int64_t T, int64_t layer,
                                             int window) {
  if (parts.size() != 1 || T != 1) return nullptr;
  const KvView& cache = parts[0].seq->kv[layer];
  return kv_write_may_overlap_attention(cache, window) ? &cache : nullptr;
}
}  // namespace

void attend_and_write_kv(Backend& b, Tensor attn, const Tensor& q, const Tensor& k, const Tensor& v,
                         std::span<const SequenceRows> parts, const Tensor& positions, const AttentionParams& params,
                         int64_t layer, bool write_kv) {
  const int64_t T = q.dim(0);
  bool one_row_parts = parts.size() > 1;
  for (const SequenceRows& part : parts) one_row_parts = one_row_parts && part.n_rows == 1;
  if (one_row_parts) {
    std::vector<KvView> caches;  // row i: sequence i's cache
    caches.reserve(parts.size());
    for (const SequenceRows& part : parts) caches.push_back(part.seq->kv[layer]);
    b.attention_rows(attn, q, k, v, caches, positions, params);
    if (write_kv) b.kv_write_rows(caches, k, v, positions);
  } else if (const KvView* cache =
                 write_kv ? cache_written_beside_attention(parts, T, layer, params.window) : nullptr) {
    run_side_by_side(
        b, [&] { b.kv_write(*cache, k, v, positions); },
        [&] { b.attention(attn, q, k, v, *cache, positions, params); });
  } else {
    for (const SequenceRows& part : parts) {
      const int64_t r0 = part.first_row, r1 = part.first_row + part.n_rows;
      const Tensor k_rows = k.slice(r0, r1), v_rows = v.slice(r0, r1), pos_rows = positions.slice(r0, r1);
      b.attention(attn.slice(r0, r1), q.slice(r0, r1), k_rows, v_rows, part.seq->kv[layer], pos_rows, params);
      if (write_kv) b.kv_write(part.seq->kv[layer], k_rows, v_rows, pos_rows);
    }
  }
}

void attend_from_projections(Backend& b, Tensor attn, std::span<const HeadNorm> norms, float eps,
                             const Tensor& inv_freq, std::span<const SequenceRows> parts, const Tensor& positions,
                             const AttentionParams& params, int64_t layer) {
  if (norms.size() != 3) fail("attend_from_projections: {} head norms (q, k and v: 3)", norms.size());
  const Tensor &q = norms[0].x, &k = norms[1].x, &v = norms[2].x;
  if (const KvView* cache = cache_written_beside_attention(parts, q.dim(0), layer, params.window)) {
    b.attention_from_projections(attn, norms, eps, positions, inv_freq, *cache, params);
    return;
  }
  b.rms_norm_rope_group(norms, eps, positions, inv_freq);
  attend_and_write_kv(b, attn, q, k, v, parts, positions, params, layer, true);
}

void check_sequence_options(const SequenceOptions& options) {
  if (options.max_seq <= 0) fail("max_seq must be positive (got {})", options.max_seq);
  if (options.kv_dtype != DType::f32 && options.kv_dtype != DType::bf16 && options.kv_dtype != DType::q8_0)
    fail("KV cache type {} is not supported (f32, bf16, q8_0)", dtype_name(options.kv_dtype));
}

void check_step_ids(const Sequence& seq, std::span<const int32_t> ids, int vocab) {
  const int64_t T = static_cast<int64_t>(ids.size());
  if (T == 0) fail("forward: no tokens");
  if (seq.n_past + T > seq.max_seq)
    fail("the sequence would reach {} tokens but its context holds {}", seq.n_past + T, seq.max_seq);
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) fail("token id {} is outside the vocabulary [0, {})", id, vocab);
}

MemoryPlan plan_model_memory(const ModelSource& source, const LoadOptions& options) {
  return plan_for(architecture_of(source), source, options);
}

std::unique_ptr<Model> load_model(const ModelSource& source, Backend& backend, const LoadOptions& options) {
  const Architecture& arch = architecture_of(source);
  if (auto free_bytes = backend.free_memory()) {
    const MemoryPlan plan = plan_for(arch, source, options);
    const bool on_cpu = backend.device() == Device::cpu;
    const double need = plan.allocated_on(backend.device());
    if (need > static_cast<double>(*free_bytes)) {
      const std::string recurrent =
          plan.recurrent > 0 ? fmt::format(" + recurrent state {:.2f}", gib(plan.recurrent)) : "";
      const std::string sequences =
          options.sequences > 1 ? fmt::format(" x {} sequences", options.sequences) : std::string();
      const std::string weights = on_cpu ? std::string() : fmt::format("weights {:.2f} + ", gib(plan.weights));
      fail("{} does not fit: it needs {:.2f} GiB ({}KV cache {:.2f} at {} tokens in {}{}{} + scratch {:.2f} for "
           "{}-token steps{}) but the {} device has {:.2f} GiB {}; reduce the context, {}use --kv q8{}",
           source.path(), gib(need), weights, gib(plan.kv), options.max_seq, dtype_name(options.kv_dtype), sequences,
           recurrent, gib(plan.scratch), options.max_tokens, on_cpu ? "; the weights stay in the mapped file" : "",
           backend.name(), gib(*free_bytes), on_cpu ? "available" : "free",
           options.sequences > 1 ? "run fewer sequences in parallel, " : "",
           on_cpu ? "" : ", or a smaller weight format");
    }
  }
  return arch.make(source, backend);
}

std::unique_ptr<Model> make_rank_model(std::unique_ptr<ModelSource> rank_source, Backend& backend, Communicator& comm) {
  if (!rank_source) fail("make_rank_model: no rank source");
  const Architecture& arch = architecture_of(*rank_source);
  return arch.make_rank(std::move(rank_source), backend, comm);
}

}  // namespace fl
