#pragma once
// The model interface: an architecture turns token ids into logits through Backend ops. One file
// per architecture implements it (gemma4.cpp, qwen35.cpp); the registry picks one from the config.
//
// A Sequence holds the per-sequence state (KV cache rows, recurrent states, position). A forward call appends
// tokens to a sequence: prefill is one call with the whole prompt, decode one call per token,
// and any mix of the two gives the same logits.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/model_source.h"

namespace fl {

struct SequenceOptions {
  int64_t max_seq = 4096;       // positions this sequence may reach
  DType kv_dtype = DType::f32;  // KV cache element type: f32, bf16 or q8_0
  bool sliding_ring = true;     // false: sliding layers keep every position (linear), for testing
};

// What a linear-attention (Gated DeltaNet) layer carries from token to token instead of K/V rows:
// a fixed size whatever the context, zero at the start of a sequence.
struct RecurrentView {
  Tensor conv;   // [kernel - 1, conv channels] f32: the last pre-convolution inputs, oldest first
  Tensor delta;  // [value heads, key head dim, value head dim] f32: the delta-rule state
};

class Sequence {
 public:
  int64_t n_past = 0;   // tokens already in the cache
  int64_t max_seq = 0;
  std::vector<KvView> kv;  // one per layer; KV-shared layers alias their source layer; empty on linear layers
  std::vector<RecurrentView> recurrent;  // one per layer on hybrid models; empty on attention layers
  std::vector<std::unique_ptr<DeviceBuffer>> storage;  // KV rows and recurrent states
  size_t kv_bytes = 0;
  size_t recurrent_bytes = 0;
  // A model split over several devices (model/tensor_parallel.h): each rank's own sequence, whose
  // KV rows hold that rank's heads; this one then only carries the position.
  std::vector<std::unique_ptr<Sequence>> rank_parts;
};

enum class LogitsMode { last, all };

// For model implementations: the rows [first_row, first_row + n_rows) of a stacked forward that
// belong to `seq` (one sequence's prompt chunk, or one decode row of each sequence in a batch).
// Weight ops see every row; attention, KV writes and recurrent states go per sequence.
struct SequenceRows {
  Sequence* seq = nullptr;
  int64_t first_row = 0, n_rows = 0;
};

// Bytes one decode step must move through memory at a given context: every weight read once
// (the experts a token actually uses, one row of embedding tables), plus the KV rows attention
// reads. Over the memory bandwidth this is the roofline `bench` compares against.
struct DecodeTraffic {
  double weight_bytes = 0;
  double kv_bytes = 0;
  double state_bytes = 0;  // recurrent state read and written back (linear-attention layers)
  double total() const { return weight_bytes + kv_bytes + state_bytes; }
};

// One decode token per step, replayed from a captured device graph after the first steps (see
// DESIGN §3): the step's kernels are recorded once and relaunched with one call, reading the
// token id and position from device memory. Results are byte-identical to Model::forward.
class DecodeGraph {
 public:
  virtual ~DecodeGraph() = default;
  // Appends `token` to the sequence; returns the logits [vocab] that follow it.
  virtual std::vector<float> step(int32_t token) = 0;
  // Appends `token` and samples the next token from the logits that follow it, by `spec`
  // (backend/sampling.h; the same token the host Sampler would choose), or -1 when every token
  // is banned. On a GPU the logits stay there and only the id crosses; the default steps and
  // samples on the host.
  virtual int32_t step_sample(int32_t token, const SampleSpec& spec);
  virtual bool captured() const = 0;  // true once steps replay a graph
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual int vocab_size() const = 0;
  virtual std::unique_ptr<Sequence> new_sequence(const SequenceOptions& options) = 0;
  // Appends `ids` to `seq` and returns their logits on the host: [1, vocab] for LogitsMode::last,
  // [ids.size(), vocab] for LogitsMode::all, row-major.
  virtual std::vector<float> forward(Sequence& seq, std::span<const int32_t> ids, LogitsMode mode) = 0;
  // One new token for each of several sequences in one pass (continuous batching): ids[i] is
  // appended to seqs[i]; returns the logits [seqs.size(), vocab]: what forward gives each
  // sequence alone, bit for bit on the CPU. On CUDA equal up to summation order (within the op
  // harness's budget): attention splits the context by how many rows the step has, and 16 or
  // more rows take the tensor-core GEMM and attention. Weight ops see all the rows at once, so
  // each weight is read once per step instead of once per sequence. The default runs the
  // sequences one by one.
  virtual std::vector<float> forward_batch(std::span<Sequence* const> seqs, std::span<const int32_t> ids);
  // forward_batch, then one token per sequence sampled from its logits by specs[i]
  // (backend/sampling.h; the token the host Sampler would choose), or -1 where every token is
  // banned. On a GPU only the ids cross to the host, not [seqs, vocab] logits. The default samples
  // forward_batch's logits on the host.
  virtual std::vector<int32_t> forward_batch_sample(std::span<Sequence* const> seqs, std::span<const int32_t> ids,
                                                    std::span<const SampleSpec> specs);
  // Empties `seq` for a new prompt at position 0, keeping its memory. Attention reads KV rows by
  // position only (every row is written again before it is read), so attention models just reset
  // the position; recurrent states carry over from token to token and are zeroed.
  virtual void reset_sequence(Sequence& seq) { seq.n_past = 0; }
  // dst becomes a copy of src (every KV row, recurrent state and the position), as if it had read
  // the same tokens: several answers to one prompt share one prefill. Both sequences must come
  // from this model's new_sequence with the same options (throws fl::Error otherwise).
  virtual void copy_sequence(const Sequence& src, Sequence& dst) = 0;
  virtual DecodeTraffic decode_traffic(int64_t context, DType kv_dtype) const = 0;
  // A graph-replayed decode loop over `seq` (which must outlive it). Use either this or forward
  // for a sequence at a time, not both interleaved.
  virtual std::unique_ptr<DecodeGraph> make_decode_graph(Sequence& seq) = 0;
  // Makes the calling thread drive the model's device (Backend::bind_to_this_thread): a thread
  // other than the one that loaded the model (the server's inference loop) calls it first, or a
  // model on GPU 1 would launch from GPU 0. A split model's ranks bind their own threads.
  virtual void bind_to_this_thread() {}
};

// What the caller will ask of the model, so that load_model can check up front that weights, KV
// cache and scratch fit in the device's memory.
struct LoadOptions {
  int64_t max_seq = 4096;        // context of one sequence
  DType kv_dtype = DType::f32;   // KV cache element type
  int64_t max_tokens = 512;      // most tokens one forward call will process (prefill chunk)
  LogitsMode logits = LogitsMode::last;
  int sequences = 1;             // sequences alive at once, each with its own KV cache (serve --parallel)
};

// Device bytes a model needs (DESIGN §5: computed before loading, refused with the numbers).
struct MemoryPlan {
  double weights = 0;
  double kv = 0;
  double recurrent = 0;  // recurrent state of linear-attention layers (fixed size per sequence)
  double scratch = 0;
  double total() const { return weights + kv + recurrent + scratch; }
  // What loading allocates on a device: everything on a GPU; on the CPU, whose weights stay in
  // the mapped file (page cache the kernel can drop), the rest.
  double allocated_on(Device device) const { return device == Device::cpu ? total() - weights : total(); }
};

// Backend workspace a concurrent branch's side line (Backend::branch_begin) adds, for a dense
// MLP or shared expert of hidden size H and intermediate size I over T tokens: a GEMM's input
// rows cut into three bf16 pieces (rows rounded up to whole 128-row tiles), and the partial
// outputs of a GEMM split along K (up to 16 splits; only GEMMs of fewer tiles than SMs split,
// which bounds their rows). An estimate for the plan: the workspace grows if an op asks more.
inline double concurrent_branch_workspace(double T, double H, double I) {
  const double K = H > I ? H : I, M = H > 2 * I ? H : 2 * I;
  const double tile_rows = (static_cast<double>(static_cast<int64_t>(T + 127) / 128)) * 128;
  return 3.0 * 2.0 * tile_rows * K + 16.0 * 4.0 * (T < 128.0 ? T : 128.0) * M;
}

// Backend workspace of split attention's partial outputs (per query head and split: D values, the
// max and the sum, f32). Only decode rows split along the context: a prompt step of 16 or more
// tokens of one sequence runs unsplit (the CUDA backend's plan_attention), so at most max(16,
// sequences) query rows of a step split. The plan splits to fill the GPU: a step's split rows
// (rows x heads x splits) stay under 2 per query head plus 64 per SM for up to 16 query heads per
// KV head, counted here for 256 SMs, and 64 splits a row (the backend's workspace grows if an op
// asks more). Counting 64 splits for every row of a step put 63 GB of partials into the 26B-A4B's
// plan for one 30000-token step, which no kernel writes (AttentionPlan.MemoryPlansCoverThePartials).
inline double attention_partials_workspace(double T, double sequences, double n_heads, double head_dim) {
  const double split_rows = T < 16.0 ? T : (sequences > 16.0 ? (sequences < T ? sequences : T) : 16.0);
  return (split_rows * n_heads * 64.0 + 64.0 * 256.0) * (head_dim + 2.0) * 4.0;
}

// Backend workspace of one routed-expert block over T tokens with k experts each (of E, hidden
// H, expert intermediate I): the pairs' intermediates (gate/up [pairs, 2I], activated [pairs, I],
// outputs [pairs, H], f32) and their sort by expert; and the tensor-core GEMM's split inputs of
// the wider product's K (H for gate/up, I for down; padded to 256): three bf16 pieces a value and
// a 4-byte sum per 64 values, counted in the form the Hopper expert kernel gathers (each expert's
// pairs in whole 64-row tiles, rows rounded to 128: at most pairs + 64 E + 128 rows;
// BackendOptions::hopper_expert_gemm), an upper bound for the other form (T or pairs rows).
inline double moe_experts_workspace(double T, double k, double E, double H, double I) {
  const double pairs = T * k, gathered_rows = pairs + 64.0 * E + 128.0;
  const double K = static_cast<double>(static_cast<int64_t>((H > I ? H : I) + 255.0) / 256 * 256);
  return pairs * (3.0 * I + H) * 4.0 + 4.0 * (2.0 * pairs + 4.0 * E + 4.0) +
         gathered_rows * K * (3.0 * 2.0 + 4.0 / 64.0);
}

// Whether one sequence's decode step may write its K/V row while its attention reads the cache
// (a concurrent branch). The attention takes the step's own key and value from the fresh rows,
// never from the cache; the row written, pos % rows, holds key pos - rows (or nothing yet), which
// a window of W keys (self included) has left when rows >= W. Full attention (window 0) keeps
// every key, so its cache never wraps. A ring shorter than its window (allowed where max_seq is)
// never wraps either, but cannot be told from one that does here: it writes in order.
inline bool kv_write_may_overlap_attention(const KvView& cache, int window) {
  return window == 0 || cache.n_rows() >= window;
}

// A layer's attention for a step's rows, each sequence's rows over its own cache at `layer`, and
// the step's keys and values (k, v [T, nKV, D], the fresh rows of `layer`) written into those
// caches unless write_kv is false (a layer that reads another's cache, or whose write waits).
// Batched decode (several sequences of one row each) takes one launch of each; one sequence's
// decode step writes beside the attention, off the step's critical path, where
// kv_write_may_overlap_attention allows; anything else goes sequence by sequence, each writing
// after its attention (a prompt chunk's later keys' rows may still be read).
void attend_and_write_kv(Backend& b, Tensor attn, const Tensor& q, const Tensor& k, const Tensor& v,
                         std::span<const SequenceRows> parts, const Tensor& positions, const AttentionParams& params,
                         int64_t layer, bool write_kv);

// The same for a layer that writes its own keys now, from its projections: norms[0..2] hold q, k
// and v with their head norms (as rms_norm_rope_group takes them; normed in place). One
// sequence's decode step whose write may overlap its attention goes to
// Backend::attention_from_projections (one launch on a GPU); anything else norms, then
// attend_and_write_kv.
void attend_from_projections(Backend& b, Tensor attn, std::span<const HeadNorm> norms, float eps,
                             const Tensor& inv_freq, std::span<const SequenceRows> parts, const Tensor& positions,
                             const AttentionParams& params, int64_t layer);

// The checks every model makes, in one place so that a wrapper (model/tensor_parallel.h) refuses
// exactly what the models it wraps would: sequence options (positive max_seq, a KV type of f32,
// bf16 or q8_0), and a step's ids (at least one, within the context left, inside [0, vocab)).
void check_sequence_options(const SequenceOptions& options);
void check_step_ids(const Sequence& seq, std::span<const int32_t> ids, int vocab);

// Model::copy_sequence for a model whose sequences live on one backend: each storage buffer
// copied on the device, then the position. check_sequence_copy: the refusal it makes first
// (fl::Error unless the two have the same buffers and positions).
void copy_sequence_storage(Backend& backend, const Sequence& src, Sequence& dst);
void check_sequence_copy(const Sequence& src, const Sequence& dst);

// The memory plan of the source's architecture for these options.
MemoryPlan plan_model_memory(const ModelSource& source, const LoadOptions& options);

// Builds the model the source's config names; throws fl::Error for unknown architectures, for
// missing or misshapen tensors (naming the tensor), and, before uploading anything, when the
// memory plan exceeds the backend's free memory (with the numbers and what to reduce).
std::unique_ptr<Model> load_model(const ModelSource& source, Backend& backend, const LoadOptions& options = {});

class Communicator;
// One rank of a model split with --tp (model/tensor_parallel.h) from its rank source
// (model/rank_source.h), by the source's architecture; `comm` adds up the ranks' partial sums.
std::unique_ptr<Model> make_rank_model(std::unique_ptr<ModelSource> rank_source, Backend& backend, Communicator& comm);

}  // namespace fl
