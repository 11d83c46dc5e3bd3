// Quality gates per weight and KV format (issue 4 item 7, DESIGN §7 "Quantized quality"): each
// committed golden fixture is quantized with every preset through the io API, run on the CPU
// oracle over its prompt, and compared with the same checkpoint at f32:
//   KL(P_f32 || P_format) of the next-token distribution at every position (mean and max),
//   top-1 agreement (argmax equal), and the worst |logit difference|.
// Every gate below is a constant with its reason; a deliberately broken codec (a mutation of the
// stored bytes, see Mutations) must exceed its format's gate, which shows the gate can fail.
//
// The tests print the measured values as the tables in docs/formats.md "Quality gates":
//   build/tests/quant/quant_tests --gtest_filter='QualityGates.*'
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "core/half.h"
#include "io/fire_file.h"
#include "io/quantize_model.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "quant/layouts.h"
#include "quant/quant.h"
#include "quant/quant_policy.h"
#include "util/test_util.h"

namespace fl {
namespace {

const char* const kFixtures[] = {"gemma4-moe", "gemma4-dense", "gemma4-e2b"};

// ---- metrics ----

struct Quality {
  double kl_mean = 0;    // nats, averaged over positions
  double kl_max = 0;     // nats, worst position
  double top1 = 0;       // fraction of positions whose argmax agrees
  double max_abs = 0;    // worst |logit difference| over all positions and ids
  int64_t positions = 0;
};

// Log-softmax of one row in double (logits are f32; double keeps KL of ~1e-9 meaningful).
std::vector<double> log_softmax(const float* logits, int64_t V) {
  double m = -INFINITY;
  for (int64_t i = 0; i < V; ++i) m = std::max(m, static_cast<double>(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(logits[i]) - m);
  const double lse = m + std::log(sum);
  std::vector<double> out(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) out[i] = static_cast<double>(logits[i]) - lse;
  return out;
}

int64_t argmax(const float* x, int64_t V) { return std::max_element(x, x + V) - x; }

// `ref` and `got`: [T, V] logits of the f32 model and of the model under test.
Quality compare_logits(const std::vector<float>& ref, const std::vector<float>& got, int64_t V) {
  EXPECT_EQ(ref.size(), got.size());
  Quality q;
  q.positions = static_cast<int64_t>(ref.size()) / V;
  int64_t agree = 0;
  for (int64_t t = 0; t < q.positions; ++t) {
    const float* r = ref.data() + t * V;
    const float* g = got.data() + t * V;
    const std::vector<double> lp = log_softmax(r, V), lq = log_softmax(g, V);
    double kl = 0;
    for (int64_t i = 0; i < V; ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
    kl = std::max(kl, 0.0);  // rounding can leave -1e-17 for identical rows
    q.kl_mean += kl;
    q.kl_max = std::max(q.kl_max, kl);
    agree += argmax(r, V) == argmax(g, V);
    for (int64_t i = 0; i < V; ++i) q.max_abs = std::max(q.max_abs, std::fabs(static_cast<double>(r[i]) - g[i]));
  }
  q.kl_mean /= static_cast<double>(q.positions);
  q.top1 = static_cast<double>(agree) / static_cast<double>(q.positions);
  return q;
}

// ---- gates ----
//
// How each gate is set. KL between two nearby distributions is second order in the logit
// perturbation δ (KL ≈ ½ Var_P(δ)), and δ is linear in the weight error, so KL grows with the
// square of a codec's error. Each KL gate is 2x the value measured for that format on that fixture,
// rounded up to one significant digit (docs/formats.md has the measurements): a codec whose
// error is more than ~1.4x its format's (√2) fails. Values that are 0 (bf16 of a checkpoint that
// is already bf16) or rounding noise get a floor of 1e-9 nats, far below any lossy format here.
// The formats' error bounds (docs/formats.md) order them: a step of range/15 (HFQ4), range/63
// (HFQ6), amax/127 over 32 values (Q8_0), 2^-8 (BF16) and 2^-11 (F16) relative, and
// FormatsKeepTheOrderOfTheirErrorBounds checks that the measurements keep that order.
//
// Top-1: every variant agrees at all 48 positions of every fixture. The gates allow one position
// (two for 4-bit formats) to flip at a near tie, which is not by itself a codec error; the
// broken codecs below lose up to 8 positions.
//
// These fixtures are tiny random-weight models (every weight random, norms included, width 64):
// harsher than real checkpoints, whose dot products average quantization noise over thousands of
// inputs and whose weights have smoother groups. Their KL is not a prediction for a real model.
struct Gate {
  double kl_mean;  // nats
  double kl_max;   // nats
  double top1;     // minimum agreement
};

constexpr double kOneFlip = 47.0 / 48.0, kTwoFlips = 46.0 / 48.0;

// Weight variants (see Variant) -> fixture -> gate.
const std::map<std::string, std::map<std::string, Gate>> kWeightGates = {
    // The reference itself: the same bytes through the same code give the same logits.
    {"f32", {{"gemma4-moe", {0, 0, 1.0}}, {"gemma4-dense", {0, 0, 1.0}}, {"gemma4-e2b", {0, 0, 1.0}}}},
    // moe and e2b are bf16 checkpoints: converting them to bf16 loses nothing.
    {"bf16", {{"gemma4-moe", {1e-9, 1e-9, kOneFlip}}, {"gemma4-dense", {8e-7, 5e-6, kOneFlip}},
              {"gemma4-e2b", {1e-9, 1e-9, kOneFlip}}}},
    // bf16 values fit f16 except for tiny magnitudes (f16 subnormals): ~1e-14 on moe/e2b.
    {"f16", {{"gemma4-moe", {1e-9, 1e-9, kOneFlip}}, {"gemma4-dense", {3e-8, 4e-7, kOneFlip}},
             {"gemma4-e2b", {1e-9, 1e-9, kOneFlip}}}},
    {"q8", {{"gemma4-moe", {7e-5, 3e-3, kOneFlip}}, {"gemma4-dense", {6e-6, 3e-5, kOneFlip}},
            {"gemma4-e2b", {3e-6, 3e-5, kOneFlip}}}},
    // On these fixtures hf6 stores the same bytes as hf4 (no K is a multiple of 256): same gates.
    {"hf6", {{"gemma4-moe", {2e-3, 2e-2, kTwoFlips}}, {"gemma4-dense", {3e-3, 5e-2, kTwoFlips}},
             {"gemma4-e2b", {3e-4, 2e-3, kTwoFlips}}}},
    {"hf4", {{"gemma4-moe", {2e-3, 2e-2, kTwoFlips}}, {"gemma4-dense", {3e-3, 5e-2, kTwoFlips}},
             {"gemma4-e2b", {3e-4, 2e-3, kTwoFlips}}}},
    {"Q8_0", {{"gemma4-moe", {7e-5, 3e-3, kOneFlip}}, {"gemma4-dense", {6e-6, 3e-5, kOneFlip}},
              {"gemma4-e2b", {3e-6, 3e-5, kOneFlip}}}},
    {"HFQ6-G256", {{"gemma4-moe", {3e-4, 7e-3, kOneFlip}}, {"gemma4-dense", {2e-4, 9e-4, kOneFlip}},
                   {"gemma4-e2b", {4e-5, 3e-4, kOneFlip}}}},
    {"HFQ4-G256", {{"gemma4-moe", {3e-3, 3e-2, kTwoFlips}}, {"gemma4-dense", {5e-3, 6e-2, kTwoFlips}},
                   {"gemma4-e2b", {8e-4, 6e-3, kTwoFlips}}}},
    {"HFQ4-G128", {{"gemma4-moe", {3e-3, 4e-2, kTwoFlips}}, {"gemma4-dense", {5e-3, 6e-2, kTwoFlips}},
                   {"gemma4-e2b", {8e-4, 6e-3, kTwoFlips}}}},
};

// KV element formats with f32 weights, decoding token by token -> fixture -> gate.
const std::map<DType, std::map<std::string, Gate>> kKvGates = {
    {DType::bf16, {{"gemma4-moe", {3e-7, 8e-6, kOneFlip}}, {"gemma4-dense", {2e-7, 2e-6, kOneFlip}},
                   {"gemma4-e2b", {4e-8, 5e-7, kOneFlip}}}},
    {DType::q8_0, {{"gemma4-moe", {2e-6, 2e-5, kOneFlip}}, {"gemma4-dense", {1e-6, 9e-6, kOneFlip}},
                   {"gemma4-e2b", {3e-7, 2e-6, kOneFlip}}}},
};
// ---- running the fixtures ----

std::vector<int32_t> golden_input_ids(const std::string& fixture) {
  SafetensorsFile f(test::fixtures_dir() + "/" + fixture + "/golden.safetensors");
  const SafetensorsEntry* e = f.find("input_ids");
  if (!e) fail("{}: golden.safetensors has no input_ids", fixture);
  Tensor t = f.tensor(*e);
  return std::vector<int32_t>(t.ptr<int32_t>(), t.ptr<int32_t>() + t.numel());
}

// Logits [T, V] of `source` at every position of `ids`: one prefill call, or (decode = true) one
// token per call, so that attention reads every earlier position back from the KV cache (in a
// prefill the keys of the call itself come straight from the projection, bypassing the cache).
std::vector<float> run_logits(const ModelSource& source, const std::vector<int32_t>& ids, DType kv = DType::f32,
                              bool decode = false) {
  auto backend = make_cpu_backend();
  auto model = load_model(source, *backend);
  SequenceOptions options;
  options.max_seq = static_cast<int64_t>(ids.size()) + 1;
  options.kv_dtype = kv;
  auto seq = model->new_sequence(options);
  if (!decode) return model->forward(*seq, ids, LogitsMode::all);
  std::vector<float> all;
  for (int32_t id : ids) {
    std::vector<float> row = model->forward(*seq, std::span<const int32_t>(&id, 1), LogitsMode::last);
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

// What is measured: a quantizer preset as the policy applies it, or one format for every weight
// matrix (rank >= 2, embeddings included; 1-D tensors stay f32).
//
// The presets alone do not show every format on these fixtures: their matrices have K = 64..176,
// never a multiple of 256, so hf4 and hf6 both choose HFQ4-G128 (HFQ6 needs K % 256 == 0) and the
// hf6 preset measures the same bytes as hf4. The per-format rows force HFQ6-G256 and HFQ4-G256
// (row-safe packing pads the one short block per row).
struct Variant {
  std::string name;      // table row and gate key
  std::string preset;    // a quantizer preset, or
  std::string format;    // a weight format for every matrix
};

const Variant kVariants[] = {
    {"f32", "f32", ""},           {"bf16", "bf16", ""},         {"f16", "f16", ""},
    {"q8", "q8", ""},             {"hf6", "hf6", ""},           {"hf4", "hf4", ""},
    {"Q8_0", "", "q8_0"},         {"HFQ6-G256", "", "hfq6_g256"}, {"HFQ4-G256", "", "hfq4_g256"},
    {"HFQ4-G128", "", "hfq4_g128"},
};

// The format a Variant stores its matrices in (what the mutations target).
DType variant_matrix_dtype(const Variant& v) {
  if (!v.format.empty()) return *dtype_from_name(v.format);
  static const std::map<std::string, DType> kPresetMatrix = {
      {"bf16", DType::bf16}, {"f16", DType::f16}, {"q8", DType::q8_0}, {"hf6", DType::hfq4_g128}, {"hf4", DType::hfq4_g128}};
  return kPresetMatrix.at(v.preset);
}

QuantPolicy variant_policy(const Variant& v, const ModelSource& fixture) {
  QuantPolicy policy;
  if (!v.preset.empty()) {
    policy.preset = *parse_quant_preset(v.preset);
    return policy;
  }
  policy.preset = QuantPreset::f32;
  for (const std::string& name : fixture.tensor_names())
    if (fixture.find(name)->ndim >= 2) policy.overrides.push_back({name, v.format});
  return policy;
}

// Every fixture quantized with every variant, kept for the whole suite.
struct FixtureRun {
  std::vector<int32_t> ids;
  int64_t vocab = 0;
  std::map<std::string, std::string> fire_paths;  // variant -> .fire
  std::vector<float> reference;                   // f32 weights, one prefill
  std::vector<float> reference_decode;            // f32 weights and KV, token by token
};

class QualityGates : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    runs_ = new std::map<std::string, FixtureRun>();
    for (const char* fixture : kFixtures) {
      FixtureRun run;
      run.ids = golden_input_ids(fixture);
      const std::string src = test::fixtures_dir() + "/" + fixture;
      auto original = open_model_source(src);
      for (const Variant& v : kVariants) {
        const std::string path = dir_->file(std::string(fixture) + "-" + v.name + ".fire");
        QuantizeOptions q;
        q.policy = variant_policy(v, *original);
        quantize_model(src, path, q);
        run.fire_paths[v.name] = path;
      }
      auto reference = open_model_source(run.fire_paths.at("f32"));
      run.reference = run_logits(*reference, run.ids);
      run.reference_decode = run_logits(*reference, run.ids, DType::f32, /*decode=*/true);
      run.vocab = static_cast<int64_t>(run.reference.size() / run.ids.size());
      runs_->emplace(fixture, std::move(run));
    }
  }
  static void TearDownTestSuite() {
    delete runs_;
    delete dir_;
    runs_ = nullptr;
    dir_ = nullptr;
  }

  static const FixtureRun& run(const std::string& fixture) { return runs_->at(fixture); }

  static Quality measure_weights(const std::string& fixture, const std::string& variant) {
    const FixtureRun& r = run(fixture);
    auto source = open_model_source(r.fire_paths.at(variant));
    return compare_logits(r.reference, run_logits(*source, r.ids), r.vocab);
  }
  static Quality measure_kv(const std::string& fixture, DType kv) {
    const FixtureRun& r = run(fixture);
    auto source = open_model_source(r.fire_paths.at("f32"));
    return compare_logits(r.reference_decode, run_logits(*source, r.ids, kv, /*decode=*/true), r.vocab);
  }

  static test::TempDir* dir_;
  static std::map<std::string, FixtureRun>* runs_;
};

test::TempDir* QualityGates::dir_ = nullptr;
std::map<std::string, FixtureRun>* QualityGates::runs_ = nullptr;

// ---- mutations: deliberately broken codecs ----
//
// A model source that serves some tensors with altered bytes (a copy; the .fire stays intact), as
// a decoder with a bug would see them.
using Mutation = std::function<void(const Tensor& t, std::vector<uint8_t>& bytes)>;

class MutatedSource final : public ModelSource {
 public:
  // Applies `mutate` to every tensor stored as `dtype`.
  MutatedSource(std::unique_ptr<ModelSource> base, DType dtype, const Mutation& mutate) : base_(std::move(base)) {
    for (const std::string& name : base_->tensor_names()) {
      const Tensor t = *base_->find(name);
      if (t.dtype != dtype) continue;
      const auto* p = static_cast<const uint8_t*>(t.data);
      std::vector<uint8_t> bytes(p, p + t.nbytes());
      mutate(t, bytes);
      mutated_.emplace(name, std::make_pair(t, std::move(bytes)));
    }
    if (mutated_.empty()) fail("no tensor stored as {} to mutate", dtype_name(dtype));
  }
  const std::string& path() const override { return base_->path(); }
  const ModelConfig& config() const override { return base_->config(); }
  const std::string& hf_config_json() const override { return base_->hf_config_json(); }
  std::optional<Tensor> find(std::string_view name) const override {
    auto it = mutated_.find(std::string(name));
    if (it == mutated_.end()) return base_->find(name);
    const Tensor& t = it->second.first;
    return make_tensor(const_cast<uint8_t*>(it->second.second.data()), t.dtype, t.shape.data(), t.ndim);
  }
  std::vector<std::string> tensor_names() const override { return base_->tensor_names(); }
  std::string tokenizer_json() const override { return {}; }
  std::string generation_config_json() const override { return {}; }
  std::string chat_template() const override { return {}; }

 private:
  std::unique_ptr<ModelSource> base_;
  std::map<std::string, std::pair<Tensor, std::vector<uint8_t>>> mutated_;
};

// Bytes of each block's header (the scale, and the min of the affine formats).
int block_header_bytes(DType d) { return d == DType::q8_0 ? 2 : 8; }
int block_levels(DType d) {
  switch (d) {
    case DType::q8_0: return layout::Q8_0::qmax;
    case DType::hfq6_g256: return layout::Hfq6G256::levels;
    default: return layout::Hfq4G256::levels;
  }
}

float read_scale(DType d, const uint8_t* block) {
  if (d == DType::q8_0) {
    uint16_t h;
    std::memcpy(&h, block, 2);
    return f16_to_f32(h);
  }
  float s;
  std::memcpy(&s, block, 4);
  return s;
}
void write_scale(DType d, uint8_t* block, float s) {
  if (d == DType::q8_0) {
    const uint16_t h = f32_to_f16(s);
    std::memcpy(block, &h, 2);
  } else {
    std::memcpy(block, &s, 4);
  }
}

// Calls f(block pointer) for every block of a quantized tensor, row by row.
template <typename F>
void for_each_block(const Tensor& t, std::vector<uint8_t>& bytes, F f) {
  const DTypeTraits& traits = dtype_traits(t.dtype);
  const int64_t per_row = (t.cols() + traits.block_elems - 1) / traits.block_elems;
  for (int64_t r = 0; r < t.rows(); ++r)
    for (int64_t b = 0; b < per_row; ++b) f(bytes.data() + r * t.row_bytes() + b * traits.block_bytes);
}

// The scale one level short: the decoder divides the range by 2^bits instead of 2^bits - 1
// (Q8_0: amax / 128 instead of / 127). Every block's top code lands one step low.
void scale_one_level_short(const Tensor& t, std::vector<uint8_t>& bytes) {
  const float factor = static_cast<float>(block_levels(t.dtype)) / static_cast<float>(block_levels(t.dtype) + 1);
  for_each_block(t, bytes, [&](uint8_t* block) { write_scale(t.dtype, block, read_scale(t.dtype, block) * factor); });
}

// Off by one group: every block is decoded with the next block's scale (and min), as a decoder
// that indexes headers one group ahead, or runs across a row boundary, would.
void off_by_one_group(const Tensor& t, std::vector<uint8_t>& bytes) {
  std::vector<uint8_t*> blocks;
  for_each_block(t, bytes, [&](uint8_t* block) { blocks.push_back(block); });
  const int h = block_header_bytes(t.dtype);
  std::vector<uint8_t> first(blocks[0], blocks[0] + h);
  for (size_t i = 0; i + 1 < blocks.size(); ++i) std::memcpy(blocks[i], blocks[i + 1], h);
  std::memcpy(blocks.back(), first.data(), h);
}

// Plain types: two mantissa bits fewer (truncated), an encoder with 4x the format's rounding error.
void two_mantissa_bits_short(const Tensor& t, std::vector<uint8_t>& bytes) {
  for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
    uint16_t v;
    std::memcpy(&v, bytes.data() + i, 2);
    v &= static_cast<uint16_t>(~3u);
    std::memcpy(bytes.data() + i, &v, 2);
  }
  (void)t;
}

void expect_within(const Quality& q, const Gate& gate, const std::string& what) {
  EXPECT_LE(q.kl_mean, gate.kl_mean) << what << ": mean KL";
  EXPECT_LE(q.kl_max, gate.kl_max) << what << ": max KL";
  EXPECT_GE(q.top1, gate.top1) << what << ": top-1 agreement";
}

std::string row(const std::string& what, const std::string& fixture, const Quality& q) {
  return fmt::format("| {} | {} | {:.3g} | {:.3g} | {:.1f} | {:.3g} |", what, fixture, q.kl_mean, q.kl_max,
                     100.0 * q.top1, q.max_abs);
}

bool exceeds(const Quality& q, const Gate& gate) {
  return q.kl_mean > gate.kl_mean || q.kl_max > gate.kl_max || q.top1 < gate.top1;
}

// A backend that stores KV rows through a broken codec: after the CPU backend writes a row, the
// row's bytes go through `mutate` (as a kv_write kernel with a bug would leave them).
class KvMutatingBackend final : public Backend {
 public:
  explicit KvMutatingBackend(Mutation mutate) : base_(make_cpu_backend()), mutate_(std::move(mutate)) {}

  void kv_write(const KvView& cache, const Tensor& k, const Tensor& v, const Tensor& positions) override {
    base_->kv_write(cache, k, v, positions);
    for (int64_t t = 0; t < positions.numel(); ++t) {
      const int64_t row = positions.ptr<int32_t>()[t] % cache.n_rows();
      for (const Tensor* c : {&cache.k, &cache.v}) {
        const Tensor r = c->select(row);  // [n_kv_heads, head_dim]
        auto* p = static_cast<uint8_t*>(r.data);
        std::vector<uint8_t> bytes(p, p + r.nbytes());
        mutate_(r, bytes);
        std::memcpy(p, bytes.data(), bytes.size());
      }
    }
  }

  std::string_view name() const override { return "kv-mutating cpu"; }
  Device device() const override { return base_->device(); }
  std::unique_ptr<DeviceBuffer> allocate(size_t n) override { return base_->allocate(n); }
  std::optional<size_t> free_memory() const override { return base_->free_memory(); }
  Tensor upload_weight(const Tensor& h) override { return base_->upload_weight(h); }
  void copy_to_device(Tensor d, const void* s) override { base_->copy_to_device(d, s); }
  void copy_to_host(void* d, const Tensor& s) override { base_->copy_to_host(d, s); }
  void synchronize() override { base_->synchronize(); }
  std::unique_ptr<CapturedSteps> capture(const std::function<void()>& body) override { return base_->capture(body); }
  void embed(Tensor o, const Tensor& t, const Tensor& ids, float s) override { base_->embed(o, t, ids, s); }
  void rms_norm(Tensor o, const Tensor& x, const Tensor* w, NormGain g, float eps) override { base_->rms_norm(o, x, w, g, eps); }
  void matmul(Tensor o, const Tensor& x, const Tensor& w) override { base_->matmul(o, x, w); }
  void rope(Tensor x, const Tensor& p, const Tensor& f) override { base_->rope(x, p, f); }
  void gated_activation(Tensor o, const Tensor& g, const Tensor& u, Activation a) override { base_->gated_activation(o, g, u, a); }
  void add(Tensor o, const Tensor& a, const Tensor& b) override { base_->add(o, a, b); }
  void scale(Tensor x, float s) override { base_->scale(x, s); }
  void scale_by(Tensor x, const Tensor& s) override { base_->scale_by(x, s); }
  void softcap(Tensor x, float cap) override { base_->softcap(x, cap); }
  void attention(Tensor o, const Tensor& q, const Tensor& k, const Tensor& v, const KvView& c, const Tensor& p,
                 const AttentionParams& a) override {
    base_->attention(o, q, k, v, c, p, a);
  }
  void moe_route(Tensor w, Tensor ids, const Tensor& l, const Tensor* s) override { base_->moe_route(w, ids, l, s); }
  void moe_experts(Tensor o, const Tensor& x, const Tensor& gu, const Tensor& d, const Tensor& ids, const Tensor& w,
                   Activation a) override {
    base_->moe_experts(o, x, gu, d, ids, w, a);
  }
  void causal_conv1d(Tensor o, const Tensor& x, const Tensor& w, Tensor st, Activation a) override {
    base_->causal_conv1d(o, x, w, st, a);
  }
  void delta_rule_gates(Tensor g, Tensor beta, const Tensor& a, const Tensor& b, const Tensor& a_log,
                        const Tensor& dt_bias) override {
    base_->delta_rule_gates(g, beta, a, b, a_log, dt_bias);
  }
  void gated_delta_rule(Tensor o, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, Tensor st, const DeltaRuleParams& p) override {
    base_->gated_delta_rule(o, q, k, v, g, beta, st, p);
  }
  void gated_delta_rule_chunked(Tensor o, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                const Tensor& beta, Tensor st, const DeltaRuleParams& p) override {
    base_->gated_delta_rule_chunked(o, q, k, v, g, beta, st, p);
  }
  void sigmoid_gate(Tensor x, const Tensor& g) override { base_->sigmoid_gate(x, g); }
  void argmax(Tensor o, const Tensor& l) override { base_->argmax(o, l); }

 private:
  std::unique_ptr<Backend> base_;
  Mutation mutate_;
};

// The broken codecs a format's gate must catch.
std::vector<std::pair<std::string, Mutation>> mutations_for(DType d) {
  if (!dtype_traits(d).quantized) return {{"two mantissa bits short", two_mantissa_bits_short}};
  return {{"scale one level short", scale_one_level_short}, {"off by one group", off_by_one_group}};
}

TEST_F(QualityGates, WeightFormatsStayWithinTheirGates) {
  std::string table = "| format | fixture | KL mean (nats) | KL max (nats) | top-1 % | max abs logit diff |\n"
                      "|---|---|---:|---:|---:|---:|\n";
  for (const Variant& v : kVariants)
    for (const char* fixture : kFixtures) {
      const Quality q = measure_weights(fixture, v.name);
      expect_within(q, kWeightGates.at(v.name).at(fixture), v.name + " on " + fixture);
      table += row(v.name, fixture, q) + "\n";
    }
  std::printf("%s", table.c_str());  // the table in docs/formats.md
}

TEST_F(QualityGates, KvFormatsStayWithinTheirGates) {
  std::string table = "| KV format | fixture | KL mean (nats) | KL max (nats) | top-1 % | max abs logit diff |\n"
                      "|---|---|---:|---:|---:|---:|\n";
  for (const auto& [kv, gates] : kKvGates)
    for (const char* fixture : kFixtures) {
      const Quality q = measure_kv(fixture, kv);
      expect_within(q, gates.at(fixture), fmt::format("KV {} on {}", dtype_name(kv), fixture));
      table += row(std::string(dtype_name(kv)), fixture, q) + "\n";
    }
  std::printf("%s", table.c_str());
}

// The gates can fail: every format's codec, deliberately broken, exceeds its gate on the dense
// fixture (f32 weights, so every format is lossy there).
TEST_F(QualityGates, BrokenWeightCodecsExceedTheGates) {
  const FixtureRun& r = run("gemma4-dense");
  std::string table = "| format | broken codec | KL mean (nats) | KL max (nats) | top-1 % |\n|---|---|---:|---:|---:|\n";
  for (const Variant& v : kVariants) {
    if (v.name == "f32") continue;
    const DType d = variant_matrix_dtype(v);
    for (const auto& [what, mutate] : mutations_for(d)) {
      MutatedSource broken(open_model_source(r.fire_paths.at(v.name)), d, mutate);
      const Quality q = compare_logits(r.reference, run_logits(broken, r.ids), r.vocab);
      EXPECT_TRUE(exceeds(q, kWeightGates.at(v.name).at("gemma4-dense")))
          << v.name << " with " << what << " passes its gate: KL mean " << q.kl_mean << ", max " << q.kl_max;
      table += fmt::format("| {} | {} | {:.3g} | {:.3g} | {:.1f} |\n", v.name, what, q.kl_mean, q.kl_max, 100.0 * q.top1);
    }
  }
  std::printf("%s", table.c_str());
}

TEST_F(QualityGates, BrokenKvCodecsExceedTheGates) {
  const FixtureRun& r = run("gemma4-dense");
  auto source = open_model_source(r.fire_paths.at("f32"));
  std::string table = "| KV format | broken codec | KL mean (nats) | KL max (nats) | top-1 % |\n|---|---|---:|---:|---:|\n";
  for (const auto& [kv, gates] : kKvGates)
    for (const auto& [what, mutate] : mutations_for(kv)) {
      KvMutatingBackend backend(mutate);
      auto model = load_model(*source, backend);
      auto seq = model->new_sequence({static_cast<int64_t>(r.ids.size()) + 1, kv, true});
      std::vector<float> logits;
      for (int32_t id : r.ids) {
        std::vector<float> step = model->forward(*seq, std::span<const int32_t>(&id, 1), LogitsMode::last);
        logits.insert(logits.end(), step.begin(), step.end());
      }
      const Quality q = compare_logits(r.reference_decode, logits, r.vocab);
      EXPECT_TRUE(exceeds(q, gates.at("gemma4-dense")))
          << "KV " << dtype_name(kv) << " with " << what << " passes its gate: KL mean " << q.kl_mean;
      table += fmt::format("| {} | {} | {:.3g} | {:.3g} | {:.1f} |\n", dtype_name(kv), what, q.kl_mean, q.kl_max,
                           100.0 * q.top1);
    }
  std::printf("%s", table.c_str());
}

// The measurements keep the order of the formats' error bounds, on every fixture where the format
// loses anything: F16 < BF16, Q8_0 < HFQ6-G256 < HFQ4-G256. HFQ6's step is 4.2x finer than HFQ4's,
// so its KL should be ~17x smaller (error squared); it must be at least 4x smaller.
TEST_F(QualityGates, FormatsKeepTheOrderOfTheirErrorBounds) {
  for (const char* fixture : kFixtures) {
    SCOPED_TRACE(fixture);
    const double f16 = measure_weights(fixture, "f16").kl_mean, bf16 = measure_weights(fixture, "bf16").kl_mean;
    const double q8 = measure_weights(fixture, "Q8_0").kl_mean, hfq6 = measure_weights(fixture, "HFQ6-G256").kl_mean,
                 hfq4 = measure_weights(fixture, "HFQ4-G256").kl_mean;
    if (bf16 > 0) {
      EXPECT_LT(f16, bf16);
    }
    EXPECT_LT(q8, hfq6);
    EXPECT_LT(4 * hfq6, hfq4);
    EXPECT_GT(hfq4, 0.0);
  }
  // And the reference matches transformers (the golden test's bound), so "vs f32" means "vs HF".
  for (const char* fixture : kFixtures) {
    SafetensorsFile f(test::fixtures_dir() + "/" + fixture + "/golden.safetensors");
    const Tensor golden = f.tensor(*f.find("logits_prefill"));
    const std::vector<float>& ref = run(fixture).reference;
    ASSERT_EQ(static_cast<size_t>(golden.numel()), ref.size());
    float worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(ref[i] - golden.ptr<float>()[i]));
    EXPECT_LE(worst, 1e-4f) << fixture;
  }
}

}  // namespace
}  // namespace fl
