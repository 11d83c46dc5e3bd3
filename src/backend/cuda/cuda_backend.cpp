// The CUDA backend: Backend ops on device memory. This file is the one dispatch point from the
// typed op entries to the kernel launchers (one .cuh per op family: matmul, norm, attention, moe,
// elementwise, linear_attention); it checks shapes on the host, passes raw pointers and element
// strides, and turns every CUDA error into an fl::Error naming the op.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/delta_net_step.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/experts_scratch.h"
#include "backend/cuda/gpu_runtime.h"
#include "backend/cuda/linear_attention.cuh"
#include "backend/cuda/sampling.cuh"
#include "backend/cuda/tensor_checks.h"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_mma.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/norm_pieces.h"
#include "core/error.h"
#include "core/log.h"
#if !defined(FIRELINE_GPU_HIP)
#include <cuda_profiler_api.h>
#endif

namespace fl {
namespace {

using cuda::check;
using cuda::CudaBuffer;
using cuda::CudaGraph;
// A prefetch hint's span (AttentionParams / ResidualUpdate::next_weights): the first `mb` MB of
// the weights, where they are contiguous device memory; 0 bytes (no prefetch) otherwise.
int64_t l2_prefetch_bytes(const Tensor* next, int mb, const uint8_t** data) {
  if (mb <= 0 || !next || !next->data || next->device != Device::cuda || !next->is_contiguous()) return 0;
  *data = static_cast<const uint8_t*>(next->data);
  return std::min<int64_t>(next->nbytes(), int64_t{mb} << 20);
}

using cuda::check_gain;
using cuda::check_rope;
using cuda::f32_heads;
using cuda::f32_rows;
using cuda::F32Heads;
using cuda::F32Rows;
using cuda::gain_data;
using cuda::gain_dtype;
using cuda::require_device;
using cuda::same_shape;

class CudaBackend;

// Brackets one op with a pair of events when profiling is on (and the stream is not capturing).
class OpTimer {
 public:
  OpTimer(CudaBackend& backend, const char* op, double bytes, int kernels = 1);
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  CudaBackend* backend_ = nullptr;
  const char* op_;
  double bytes_;
  int kernels_;
  cudaEvent_t start_ = nullptr;
};

class CudaBackend final : public Backend {
  friend class OpTimer;

 public:
  CudaBackend(int device_index, const BackendOptions& options)
      : device_(device_index),
        act_pieces_(options.tensor_core_precision == TensorCorePrecision::bf16 ? 1 : cuda::kMmaExactParts),
        options_(options) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      fail("no {} device found (use --backend cpu)", gpu::kRuntimeName);
    }
    if (device_index < 0 || device_index >= count)
      fail("{} device {} does not exist ({} found)", gpu::kRuntimeName, device_index, count);
    check(cudaSetDevice(device_index), "set device");
    check(cudaStreamCreateWithFlags(&main_stream_, cudaStreamNonBlocking), "stream create");
    stream_ = main_stream_;
    if (options.concurrent_branches) {
      // Made here, not at the first branch: a decode graph's capture may hold the first one.
      check(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking), "stream create");
      check(cudaEventCreateWithFlags(&fork_event_, cudaEventDisableTiming), "event create");
      check(cudaEventCreateWithFlags(&join_event_, cudaEventDisableTiming), "event create");
    }
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device_index), "device properties");
    name_ = prop.name;
    sm_count_ = prop.multiProcessorCount;
    int memory_khz = 0, bus_bits = 0;  // (cudaDeviceProp's memoryClockRate is gone in CUDA 13)
    if (cudaDeviceGetAttribute(&memory_khz, cudaDevAttrMemoryClockRate, device_index) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device_index) == cudaSuccess &&
        memory_khz > 0 && bus_bits > 0)
      memory_peak_ = MemoryPeak{name_, 2.0 * memory_khz * 1e3 * (bus_bits / 8.0) / 1e9};
    cudaGetLastError();  // a device that reports neither leaves no error behind
    // (ready pieces only for the integer matvec, where it runs)
    options_.imma_ready_pieces = options_.imma_matvec && options_.imma_ready_pieces && cuda::imma_matvec_available();
    options_.imma_experts = options_.imma_matvec && options_.imma_experts && cuda::imma_matvec_available();
    check(cudaMalloc(&device_words_, kDeviceWords * sizeof(int32_t)), "malloc");
    check(cudaMemsetAsync(device_words_, 0, kDeviceWords * sizeof(int32_t), stream_), "memset");
    check(cudaStreamSynchronize(stream_), "memset");
    log_debug("{} device {}: {} ({} SMs, sm_{}{})", gpu::kRuntimeName, device_index, name_, sm_count_, prop.major, prop.minor);
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(main_stream_);
    if (side_stream_) {
      cudaStreamSynchronize(side_stream_);
      cudaEventDestroy(fork_event_);
      cudaEventDestroy(join_event_);
      cudaStreamDestroy(side_stream_);
    }
    cudaFree(device_words_);
    cudaStreamDestroy(main_stream_);
  }

  std::string_view name() const override { return gpu::kBackendName; }
  Device device() const override { return Device::cuda; }
  std::optional<MemoryPeak> memory_peak() const override { return memory_peak_; }
  cudaStream_t stream() const { return main_stream_; }
  int device_index() const { return device_; }
  void bind_to_this_thread() override { check(cudaSetDevice(device_), "set device"); }

  std::unique_ptr<DeviceBuffer> allocate(size_t bytes) override {
    require_no_branch("allocate");
    return std::make_unique<CudaBuffer>(bytes, stream_);
  }
  // This backend's GPU, whichever device is current on the calling thread (a split model asks
  // every rank's from one thread); the thread's current device is left as it was.
  std::optional<size_t> free_memory() const override {
    int current = 0;
    check(cudaGetDevice(&current), "current device");
    if (current != device_) check(cudaSetDevice(device_), "set device");
    size_t free_bytes = 0, total = 0;
    const cudaError_t err = cudaMemGetInfo(&free_bytes, &total);
    if (current != device_) cudaSetDevice(current);
    check(err, "memory info");
    return free_bytes;
  }

  Tensor upload_weight(const Tensor& host) override {
    if (host.device != Device::cpu || !host.is_contiguous()) fail("upload_weight: {} is not a contiguous host tensor", host.describe());
    const size_t bytes = static_cast<size_t>(host.nbytes());
    std::lock_guard lock(weights_mutex_);
    // Weights go into large chunks (one arena per model) rather than one cudaMalloc each.
    constexpr size_t kChunk = size_t{256} << 20, kAlign = 256;
    if (weight_chunks_.empty() || weight_used_ + bytes > weight_chunks_.back()->size()) {
      weight_chunks_.push_back(std::make_unique<CudaBuffer>(std::max(kChunk, bytes), stream_));
      weight_used_ = 0;
    }
    char* dst = static_cast<char*>(weight_chunks_.back()->data()) + weight_used_;
    weight_used_ += (bytes + kAlign - 1) / kAlign * kAlign;
    weight_bytes_ += bytes;
    check(cudaMemcpyAsync(dst, host.data, bytes, cudaMemcpyHostToDevice, stream_), "weight upload");
    check(cudaStreamSynchronize(stream_), "weight upload");
    Tensor out = host;
    out.data = dst;
    out.device = Device::cuda;
    return out;
  }

  void copy_to_device(Tensor dst, const void* src) override {
    require_no_branch("copy_to_device");
    require_device(dst, "copy_to_device");
    ++*ops_;
    check(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream_), "copy to device");
    check(cudaStreamSynchronize(stream_), "copy to device");
  }
  void copy_to_host(void* dst, const Tensor& src) override {
    require_no_branch("copy_to_host");
    require_device(src, "copy_to_host");
    check(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_), "copy to host");
    synchronize();
  }
  void copy_on_device(Tensor dst, const Tensor& src) override {
    require_no_branch("copy_on_device");
    require_device(dst, "copy_on_device");
    require_device(src, "copy_on_device");
    check_copy_on_device(dst, src);
    ++*ops_;
    check(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(src.nbytes()), cudaMemcpyDeviceToDevice, stream_),
          "copy on device");
  }
  void synchronize() override {
    require_no_branch("synchronize");  // (so the side stream's work is joined into the main one)
    check(cudaStreamSynchronize(stream_), "synchronize");
    delta_step_op_ = 0;  // (nothing in flight: the next fused step overlaps no kernel)
    int32_t flag = 0;
    check(cudaMemcpyAsync(&flag, error_flag(), sizeof flag, cudaMemcpyDeviceToHost, stream_), "error flag");
    check(cudaStreamSynchronize(stream_), "error flag");
    if (flag) {
      check(cudaMemsetAsync(error_flag(), 0, sizeof flag, stream_), "error flag");
      fail("embed: a token id was outside the vocabulary");
    }
  }

  std::unique_ptr<CapturedSteps> capture(const std::function<void()>& body) override {
    require_no_branch("graph capture");
    ++*ops_;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "graph capture");
    cudaGraph_t graph = nullptr;
    capturing_ = true;
    try {
      body();
      capturing_ = false;
      ++*ops_;  // (the captured ops' pieces serve no op after the capture: their kernels have not run)
    } catch (...) {
      capturing_ = false;
      branch_abandon();                       // (run_side_by_side did already; a body without it may not have)
      cudaStreamEndCapture(stream_, &graph);  // leave the stream usable, then report
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    check(cudaStreamEndCapture(stream_, &graph), "graph capture");
    cudaGraphExec_t exec = nullptr;
    cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check(err, "graph instantiate");
    return std::make_unique<CudaGraph>(
        exec, stream_, std::vector<std::shared_ptr<CudaBuffer>>{workspaces_[0], workspaces_[1], norm_pieces_buffer_},
        ops_);
  }

  // The side line goes to a second stream forked off the main one by an event and joined by
  // another; its ops take the second workspace (the lines' scratch must not overlap). While
  // profiling (events bracket each op on one stream) or with concurrent_branches off, both lines
  // run in order on the main stream.
  void branch_begin() override {
    if (branch_ != BranchState::none) fail("branch_begin: a concurrent branch is already open");
    ++*ops_;  // (pieces serve the next op of their own line only)
    norm_pieces_.branch_forked(*ops_);
    if (!side_stream_ || profiling_) {
      branch_ = BranchState::in_order_side;
      return;
    }
    // One event pair serves every branch: a stream's wait takes the event's record current at the
    // call (CUDA and HIP alike), and a captured graph keeps the dependency, not the event.
    ++branch_forks_;
    check(cudaEventRecord(fork_event_, main_stream_), "branch begin");
    check(cudaStreamWaitEvent(side_stream_, fork_event_, 0), "branch begin");
    stream_ = side_stream_;
    branch_ = BranchState::side;
  }
  // A write to device memory on this backend's stream that is not one of its ops (NCCL's
  // in-place all-reduce): counted as an op, so no product takes pieces cut before it.
  void note_foreign_write() { ++*ops_; }
  // Side streams forked so far (tests: whether branches really ran side by side).
  int64_t branch_forks() const { return branch_forks_; }
  int64_t workspace_growths() const { return workspace_growths_; }

  // Memory operations, synchronisation and captures are refused while a branch is open: a
  // branch's lines issue ops only (Backend::branch_begin).
  void require_no_branch(const char* op) const {
    if (branch_ != BranchState::none) fail("{}: not allowed inside a concurrent branch", op);
  }
  void branch_end() override {
    ++*ops_;
    norm_pieces_.side_ended(*ops_);
    if (branch_ == BranchState::in_order_side) {
      branch_ = BranchState::in_order_main;
      return;
    }
    if (branch_ != BranchState::side) fail("branch_end: no side line is open");
    check(cudaEventRecord(join_event_, side_stream_), "branch end");
    stream_ = main_stream_;
    branch_ = BranchState::main;
  }
  void branch_join() override {
    // (no op count: the main line's last op still serves the next; a side line's pieces are on
    // the other stream and workspace)
    if (branch_ == BranchState::in_order_main) {
      branch_ = BranchState::none;
      return;
    }
    if (branch_ != BranchState::main) fail("branch_join: no branch_end before it");
    check(cudaStreamWaitEvent(main_stream_, join_event_, 0), "branch join");
    branch_ = BranchState::none;
  }
  void branch_abandon() noexcept override {
    ++*ops_;
    if (branch_ == BranchState::side) cudaEventRecord(join_event_, side_stream_);
    if (branch_ == BranchState::side || branch_ == BranchState::main) cudaStreamWaitEvent(main_stream_, join_event_, 0);
    cudaGetLastError();  // (an invalidated capture refuses both; the error being reported is the first)
    stream_ = main_stream_;
    branch_ = BranchState::none;
  }

  void embed(Tensor out, const Tensor& table, const Tensor& ids, float scale) override {
    OpTimer timer(*this, "embed", static_cast<double>(ids.numel()) * (table.row_bytes() + table.cols() * 4.0));
    F32Rows o = f32_rows(out, "embed");
    require_device(table, "embed");
    require_device(ids, "embed");
    if (ids.dtype != DType::i32 || ids.numel() != o.rows) fail("embed: ids must be i32[{}]", o.rows);
    if (table.cols() != o.cols) fail("embed: table width {} != output width {}", table.cols(), o.cols);
    check(cuda::launch_embed(o.data, o.stride, table.data, table.dtype, table.row_bytes(), table.rows(),
                             ids.ptr<int32_t>(), o.rows, o.cols, scale, error_flag(), stream_),
          "embed");
  }

  void rms_norm(Tensor out, const Tensor& x, const Tensor* weight, NormGain gain, float eps) override {
    OpTimer timer(*this, "rms_norm", 2.0 * x.numel() * 4);
    F32Rows o = f32_rows(out, "rms_norm"), in = f32_rows(x, "rms_norm");
    same_shape(o, in, "rms_norm");
    check_gain(weight, gain, in.cols, "rms_norm");
    check(cuda::launch_rms_norm(o.data, o.stride, in.data, in.stride, in.rows, in.cols, gain_data(weight),
                                gain_dtype(weight), static_cast<cuda::Gain>(gain), eps, stream_),
          "rms_norm");
  }

  void matmul(Tensor out, const Tensor& x, const Tensor& weight) override {
    OpTimer timer(*this, "matmul", static_cast<double>(weight.nbytes()) + 4.0 * (x.numel() + out.numel()));
    F32Rows o = f32_rows(out, "matmul"), in = f32_rows(x, "matmul");
    require_device(weight, "matmul");
    if (weight.ndim != 2 || in.cols != weight.dim(1) || o.cols != weight.dim(0) || o.rows != in.rows)
      fail("matmul: cannot multiply x {} by weight {} into {}", x.describe(), weight.describe(), out.describe());
    cuda::MatvecArgs a = matvec_args();
    a.out = o.data;
    a.out_stride = o.stride;
    a.x = in.data;
    a.x_stride = in.stride;
    a.weight = static_cast<const uint8_t*>(weight.data);
    a.weight_type = weight.dtype;
    a.M = weight.dim(0);
    a.K = weight.dim(1);
    a.row_bytes = weight.stride[0];
    a.n_inputs = in.rows;
    a.scratch_bytes = cuda::matvec_scratch_bytes(a);
    if (a.scratch_bytes > 0) take_scratch_or_ready_pieces(a);
    check(cuda::launch_matvec(a, stream_), "matmul");
  }

  void add_rms_norm(Tensor h, Tensor x, const Tensor* weight, NormGain gain, float eps) override {
    OpTimer timer(*this, "add_rms_norm", 4.0 * x.numel() * 4);
    F32Rows res = f32_rows(h, "add_rms_norm"), in = f32_rows(x, "add_rms_norm");
    same_shape(res, in, "add_rms_norm");
    check_gain(weight, gain, in.cols, "add_rms_norm");
    check(cuda::launch_rms_norm(in.data, in.stride, in.data, in.stride, in.rows, in.cols, gain_data(weight),
                                gain_dtype(weight), static_cast<cuda::Gain>(gain), eps, stream_, res.data, res.stride),
          "add_rms_norm");
  }

  void rms_norm_rope(Tensor x, const Tensor* weight, NormGain gain, float eps, const Tensor& positions,
                     const Tensor& inv_freq) override {
    OpTimer timer(*this, "rms_norm_rope", 2.0 * x.numel() * 4);
    check_rope(x, positions, inv_freq, "rms_norm_rope");
    check_gain(weight, gain, x.dim(2), "rms_norm_rope");
    check(cuda::launch_rms_norm_rope(x.ptr<float>(), x.dim(0), x.dim(1), x.dim(2), gain_data(weight),
                                     gain_dtype(weight), static_cast<cuda::Gain>(gain), eps, positions.ptr<int32_t>(),
                                     inv_freq.ptr<float>(), inv_freq.numel(), stream_),
          "rms_norm_rope");
  }

  void rms_norm_rope_group(std::span<const HeadNorm> parts, float eps, const Tensor& positions,
                           const Tensor& inv_freq) override {
    double bytes = 0;
    for (const HeadNorm& p : parts) bytes += 2.0 * p.x.numel() * 4;
    OpTimer timer(*this, "rms_norm_rope", bytes);
    cuda::HeadNormPart args[cuda::kMaxHeadNormParts];
    const int64_t T = cuda::head_norm_parts(parts, positions, inv_freq, args, "rms_norm_rope_group");
    check(cuda::launch_rms_norm_rope_group(args, static_cast<int>(parts.size()), T, eps, positions.ptr<int32_t>(),
                                           inv_freq.ptr<float>(), inv_freq.numel(), stream_),
          "rms_norm_rope_group");
  }

  void residual_update(Tensor h, const ResidualUpdate& u) override {
    check_residual_update(h, u);  // counts within cuda::kMaxResidualTerms / kMaxStreamNorms, aliases
    static_assert(cuda::kMaxResidualTerms == 2 && cuda::kMaxStreamNorms == 4,
                  "Backend::check_residual_update's limits");
    cuda::ResidualUpdateArgs a = cuda::residual_update_args(h, u);
    OpTimer timer(*this, "residual_update", 4.0 * a.rows * a.cols * (2 + 2 * u.terms.size() + u.norms.size()));
    a.cluster = options_.cluster_residual_update;
    // The next product's first bytes into L2 during a one-row update (a hint; the register and
    // cluster kernels take it, the general kernel ignores it; prefill's and batched rows' updates
    // run beside no idle DRAM).
    if (a.rows == 1)
      a.l2_prefetch_bytes = l2_prefetch_bytes(u.next_weights, options_.update_prefetch_mb, &a.l2_prefetch);
    // One row: each norm's output is a product's input (Gemma 4's MoE layers: the dense MLP's, the
    // router's, the experts'); cut them here, outside branches (norm_pieces.h).
    a.pieces_group = pieces_group_for(a.cols);
    static_assert(cuda::NormPiecesBook::kMaxEntries == cuda::kMaxStreamNorms, "a cut per norm");
    cuda::NormPiecesBook::Entry cuts[cuda::kMaxStreamNorms];
    int n_cuts = 0;
    if (options_.imma_ready_pieces && imma_products_seen_ && branch_ == BranchState::none &&
        cuda::residual_update_cuts_pieces(a)) {
      const size_t each = (cuda::hfq4_imma_scratch_bytes(a.cols, a.pieces_group) + 255) / 256 * 256;
      auto* buffer = static_cast<uint8_t*>(norm_pieces_buffer(each * a.n_norms));
      for (int i = 0; i < a.n_norms && buffer; ++i) {
        bool apart = true;  // (a row another norm also writes: its last bytes may not be this norm's)
        for (int j = 0; j < a.n_norms; ++j)
          apart = apart &&
                  (j == i || a.norms[j].out + a.cols <= a.norms[i].out || a.norms[i].out + a.cols <= a.norms[j].out);
        if (!apart) continue;
        a.pieces[i] = buffer + i * each;
        cuts[n_cuts++] = {a.norms[i].out, a.cols, a.pieces_group, a.pieces[i]};
      }
    }
    check(cuda::launch_residual_update(a, stream_), "residual_update");
    if (branch_ == BranchState::none) norm_pieces_.cut({cuts, static_cast<size_t>(n_cuts)}, *ops_);
  }

  void matmul_group(std::span<const Tensor> outs, const Tensor& x, std::span<const Tensor* const> weights) override {
    // One launch for a decode step's projections of one input (the matvec kernels); with
    // BackendOptions::group_gemm, one split of the inputs and one GEMM launch for many inputs where
    // the GEMM takes segments (Hopper); anything else, one matmul each.
    bool grouped = outs.size() == weights.size() && !outs.empty() && outs.size() <= cuda::kMaxMatvecSegments &&
                   x.ndim == 2 && x.dim(0) >= 1 && (x.dim(0) == 1 || options_.group_gemm);
    for (size_t i = 0; grouped && i < weights.size(); ++i)
      grouped = weights[i]->ndim == 2 && weights[i]->dtype == weights[0]->dtype && weights[i]->dim(1) == x.dim(1) &&
                outs[i].ndim == 2 && outs[i].dim(0) == x.dim(0) && outs[i].dim(1) == weights[i]->dim(0) &&
                outs[i].dtype == DType::f32 && outs[i].is_contiguous();
    if (!grouped) return Backend::matmul_group(outs, x, weights);
    const int64_t T = x.dim(0);
    F32Rows in = f32_rows(x, "matmul_group");
    cuda::MatvecArgs a = matvec_args();
    a.x = in.data;
    a.x_stride = in.stride;
    a.weight_type = weights[0]->dtype;
    a.K = x.dim(1);
    a.n_inputs = T;
    a.n_segments = static_cast<int>(weights.size());
    for (size_t i = 0; i < weights.size(); ++i) {
      require_device(*weights[i], "matmul_group");
      require_device(outs[i], "matmul_group");
      a.segments[i].out = outs[i].ptr<float>();
      a.segments[i].weight = static_cast<const uint8_t*>(weights[i]->data);
      a.segments[i].M = weights[i]->dim(0);
      a.segments[i].row_bytes = weights[i]->stride[0];
    }
    if (T > 1 && !cuda::matmul_mma_takes_segments(a, act_pieces_)) return Backend::matmul_group(outs, x, weights);
    double bytes = 4.0 * x.numel();
    for (size_t i = 0; i < weights.size(); ++i)
      bytes += static_cast<double>(weights[i]->nbytes()) + 4.0 * outs[i].numel();
    OpTimer timer(*this, "matmul", bytes);
    if (T == 1) {
      a.scratch_bytes = cuda::matvec_scratch_bytes(a);  // (the integer matvec's input pieces)
      if (a.scratch_bytes > 0) take_scratch_or_ready_pieces(a);
      return check(cuda::launch_matvec_group(a, stream_), "matmul_group");
    }
    a.scratch_bytes = cuda::matmul_mma_scratch_bytes(a, act_pieces_);
    a.scratch = workspace_floats((a.scratch_bytes + 3) / 4);
    check(cuda::launch_matmul_mma(a, act_pieces_, stream_), "matmul_group");
  }

  void matmul_gated(Tensor out, Tensor up, const Tensor& x, const Tensor& gate_w, const Tensor& up_w,
                    Activation act) override {
    // One input row on HFQ4 weights (a decode step): both products and the activation in one
    // launch; anything else, the default (two products, then the activation).
    cuda::MatvecArgs a = matvec_args();
    a.weight_type = gate_w.dtype;
    a.n_inputs = x.ndim == 2 ? x.dim(0) : 0;
    a.gated = true;
    const bool fused = options_.gated_matvec && a.n_inputs == 1 && cuda::matvec_gated_supported(a) &&
                       up_w.dtype == gate_w.dtype && gate_w.ndim == 2 && up_w.ndim == 2 &&
                       gate_w.dim(0) == up_w.dim(0) && gate_w.dim(1) == up_w.dim(1) &&
                       gate_w.stride[0] == up_w.stride[0] && x.dim(1) == gate_w.dim(1) && out.ndim == 2 &&
                       out.dim(0) == 1 && out.dim(1) == gate_w.dim(0);
    if (!fused) return Backend::matmul_gated(out, up, x, gate_w, up_w, act);
    OpTimer timer(*this, "matmul",
                  static_cast<double>(gate_w.nbytes() + up_w.nbytes()) + 4.0 * (x.numel() + out.numel()));
    F32Rows o = f32_rows(out, "matmul_gated"), in = f32_rows(x, "matmul_gated");
    require_device(gate_w, "matmul_gated");
    require_device(up_w, "matmul_gated");
    a.out = o.data;
    a.out_stride = o.stride;
    a.x = in.data;
    a.x_stride = in.stride;
    a.weight = static_cast<const uint8_t*>(gate_w.data);
    a.up_weight = static_cast<const uint8_t*>(up_w.data);
    a.M = gate_w.dim(0);
    a.K = gate_w.dim(1);
    a.row_bytes = gate_w.stride[0];
    a.act = static_cast<cuda::Act>(act);
    check(cuda::launch_matvec(a, stream_), "matmul_gated");
  }

  void rope(Tensor x, const Tensor& positions, const Tensor& inv_freq) override {
    OpTimer timer(*this, "rope", 2.0 * x.numel() * 4);
    check_rope(x, positions, inv_freq, "rope");
    check(cuda::launch_rope(x.ptr<float>(), x.dim(0), x.dim(1), x.dim(2), positions.ptr<int32_t>(),
                            inv_freq.ptr<float>(), inv_freq.numel(), stream_),
          "rope");
  }

  void gated_activation(Tensor out, const Tensor& gate, const Tensor& up, Activation act) override {
    OpTimer timer(*this, "gated_activation", 3.0 * out.numel() * 4);
    F32Rows o = f32_rows(out, "gated_activation"), g = f32_rows(gate, "gated_activation"), u = f32_rows(up, "gated_activation");
    same_shape(o, g, "gated_activation");
    same_shape(o, u, "gated_activation");
    // a down projection's input: cut it here too
    if (options_.imma_ready_pieces && imma_products_seen_ && o.rows == 1) {
      const int group = pieces_group_for(o.cols);
      void* pieces = workspace_floats((cuda::hfq4_imma_scratch_bytes(o.cols, group) + 3) / 4);
      check(cuda::launch_gated_activation_imma_pieces(o.data, g.data, u.data, o.cols, static_cast<cuda::Act>(act),
                                                      group, pieces, stream_),
            "gated_activation");
      ready_pieces_ = {o.data, o.cols, group, pieces, stream_, *ops_};
      return;
    }
    check(cuda::launch_gated_activation(o.data, o.stride, g.data, g.stride, u.data, u.stride, o.rows, o.cols,
                                        static_cast<cuda::Act>(act), stream_),
          "gated_activation");
  }

  void add(Tensor out, const Tensor& a, const Tensor& b) override {
    OpTimer timer(*this, "add/scale/softcap", 3.0 * out.numel() * 4);
    F32Rows o = f32_rows(out, "add"), x = f32_rows(a, "add"), y = f32_rows(b, "add");
    same_shape(o, x, "add");
    same_shape(o, y, "add");
    check(cuda::launch_add(o.data, o.stride, x.data, x.stride, y.data, y.stride, o.rows, o.cols, stream_), "add");
  }

  void scale(Tensor x, float s) override {
    OpTimer timer(*this, "add/scale/softcap", 2.0 * x.numel() * 4);
    F32Rows r = f32_rows(x, "scale");
    check(cuda::launch_scale(r.data, r.stride, r.rows, r.cols, s, nullptr, DType::f32, stream_), "scale");
  }

  void scale_by(Tensor x, const Tensor& scalar) override {
    OpTimer timer(*this, "add/scale/softcap", 2.0 * x.numel() * 4);
    F32Rows r = f32_rows(x, "scale_by");
    require_device(scalar, "scale_by");
    if (scalar.numel() != 1) fail("scale_by: expected a 1-element scalar, got {}", scalar.describe());
    check(cuda::launch_scale(r.data, r.stride, r.rows, r.cols, 1.0f, scalar.data, scalar.dtype, stream_), "scale_by");
  }

  void softcap(Tensor x, float cap) override {
    OpTimer timer(*this, "add/scale/softcap", 2.0 * x.numel() * 4);
    F32Rows r = f32_rows(x, "softcap");
    check(cuda::launch_softcap(r.data, r.stride, r.rows, r.cols, cap, stream_), "softcap");
  }

  void attention(Tensor out, const Tensor& q, const Tensor& k_new, const Tensor& v_new, const KvView& cache,
                 const Tensor& positions, const AttentionParams& p) override {
    run_attention(out, q, k_new, v_new, cache, positions, p, nullptr);
  }

  // The head norms, RoPE and KV write inside the decode kernel by KV head where it takes the step
  // (run_attention says), else the default's three ops.
  void attention_from_projections(Tensor out, std::span<const HeadNorm> norms, float eps, const Tensor& positions,
                                  const Tensor& inv_freq, const KvView& cache, const AttentionParams& p) override {
    if (options_.fused_decode_attention && norms.size() == 3) {
      cuda::AttentionArgs fused;
      cuda::head_norm_parts(norms, positions, inv_freq, fused.fresh_norms, "attention_from_projections");
      fused.from_projections = true;
      fused.norm_eps = eps;
      fused.inv_freq = inv_freq.ptr<float>();
      fused.rope_half = static_cast<int>(inv_freq.numel());
      fused.k_cache_write = static_cast<uint8_t*>(cache.k.data);
      fused.v_cache_write = static_cast<uint8_t*>(cache.v.data);
      if (run_attention(out, norms[0].x, norms[1].x, norms[2].x, cache, positions, p, nullptr, &fused)) return;
    }
    Backend::attention_from_projections(out, norms, eps, positions, inv_freq, cache, p);
  }

  // Batched decode: one launch for all rows, each reading its own cache through a device table of
  // cache addresses (uploaded per call: a few hundred bytes).
  void attention_rows(Tensor out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                      std::span<const KvView> caches, const Tensor& positions, const AttentionParams& p) override {
    if (caches.empty() || q.ndim != 3 || q.dim(0) != static_cast<int64_t>(caches.size()))
      fail("attention_rows: {} caches for q {}", caches.size(), q.describe());
    const void* const* tables = upload_cache_table(caches, "attention_rows");
    run_attention(out, q, k_new, v_new, caches[0], positions, p, tables);
  }

  void kv_write_rows(std::span<const KvView> caches, const Tensor& k, const Tensor& v, const Tensor& positions) override {
    OpTimer timer(*this, "kv_write", 4.0 * (k.numel() + v.numel()));
    const int64_t B = static_cast<int64_t>(caches.size());
    for (const Tensor* t : std::initializer_list<const Tensor*>{&k, &v, &positions}) require_device(*t, "kv_write_rows");
    if (B == 0 || k.ndim != 3 || k.dim(0) != B || v.ndim != 3 || v.dim(0) != B || !k.is_contiguous() ||
        !v.is_contiguous() || positions.dtype != DType::i32 || positions.numel() != B)
      fail("kv_write_rows: {} caches for k {}, v {}, positions {}", B, k.describe(), v.describe(), positions.describe());
    const KvView& first = caches[0];
    if (first.k.ndim != 3 || first.k.dim(1) != k.dim(1) || first.k.dim(2) != k.dim(2) || v.dim(1) != k.dim(1) ||
        v.dim(2) != k.dim(2))
      fail("kv_write_rows: k {} and v {} do not fit cache {}", k.describe(), v.describe(), first.k.describe());
    void* const* tables = const_cast<void* const*>(upload_cache_table(caches, "kv_write_rows"));
    check(cuda::launch_kv_write(nullptr, nullptr, first.k.dtype, first.n_rows(), first.k.stride[1], k.ptr<float>(),
                                v.ptr<float>(), positions.ptr<int32_t>(), B, k.dim(1), k.dim(2), stream_,
                                reinterpret_cast<uint8_t* const*>(tables), reinterpret_cast<uint8_t* const*>(tables) + B),
          "kv_write_rows");
  }

  // [K cache of each row..., V cache of each row...] in device memory, for one batched launch.
  // Every cache must match the first (rows, layout, type): the kernels size the grid and read
  // rows from one description.
  const void* const* upload_cache_table(std::span<const KvView> caches, const char* op) {
    if (capturing_) fail("{}: not inside a captured graph (the cache table is uploaded per call)", op);
    cuda::check_row_caches(caches, op);
    std::vector<const void*> table(2 * caches.size());
    for (size_t i = 0; i < caches.size(); ++i) {
      table[i] = caches[i].k.data;
      table[caches.size() + i] = caches[i].v.data;
    }
    return upload_pointer_table(table, op);
  }

  // Rows of one batched launch write their own state: two rows on one state would race on the
  // GPU where the CPU's row-by-row default runs them one after the other.
  static void require_distinct(std::vector<const void*> addresses, const char* op) {
    std::sort(addresses.begin(), addresses.end());
    if (std::adjacent_find(addresses.begin(), addresses.end()) != addresses.end())
      fail("{}: two rows share one state (each row must continue its own sequence)", op);
  }

  // A table of device addresses in device memory for one batched launch (per-row caches or
  // states). One buffer serves every such op: the copy is stream-ordered after the launches that
  // read the previous table. Not inside a captured graph (the table is uploaded per call).
  const void* const* upload_pointer_table(const std::vector<const void*>& table, const char* op) {
    if (capturing_) fail("{}: not inside a captured graph (the row table is uploaded per call)", op);
    require_no_branch(op);  // (one row table serves every launch, in stream order)
    const size_t bytes = table.size() * sizeof(void*);
    if (!cache_table_ || cache_table_->size() < bytes) {
      check(cudaStreamSynchronize(stream_), op);  // the old table may still be read
      cache_table_ = std::make_unique<CudaBuffer>(std::max<size_t>(bytes, 4096), stream_);
    }
    // From pageable memory: staged before the call returns, so `table` may go out of scope.
    check(cudaMemcpyAsync(cache_table_->data(), table.data(), bytes, cudaMemcpyHostToDevice, stream_), op);
    return static_cast<const void* const*>(cache_table_->data());
  }

  // One sequence (row_tables null): T queries at consecutive positions over `cache`; or one query
  // per row, each over its own cache (row_tables: K caches then V caches, `cache` describing all).
  // from_projections: its fields of that name (AttentionArgs) for a step from raw projections;
  // false (nothing launched) where the planned kernel does not take them.
  bool run_attention(Tensor out, const Tensor& q, const Tensor& k_new, const Tensor& v_new, const KvView& cache,
                     const Tensor& positions, const AttentionParams& p, const void* const* row_tables,
                     const cuda::AttentionArgs* from_projections = nullptr) {
    const int64_t T = q.dim(0), D = p.head_dim;
    if (q.ndim != 3 || q.dim(1) != p.n_heads || q.dim(2) != D || !q.is_contiguous())
      fail("attention: q {} does not match the params", q.describe());
    if (k_new.ndim != 3 || k_new.dim(0) != T || k_new.dim(1) != p.n_kv_heads || k_new.dim(2) != D ||
        !k_new.is_contiguous() || !v_new.is_contiguous() || !out.is_contiguous())
      fail("attention: k {} does not match the params", k_new.describe());
    if (v_new.ndim != 3 || v_new.dim(0) != T || v_new.dim(1) != p.n_kv_heads || v_new.dim(2) != D)
      fail("attention: v {} does not match k {}", v_new.describe(), k_new.describe());
    if (out.ndim != 3 || out.dim(0) != T || out.dim(1) != p.n_heads || out.dim(2) != D || out.dtype != DType::f32)
      fail("attention: out {} does not match q {}", out.describe(), q.describe());
    if (p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads) fail("attention: {} heads over {} KV heads", p.n_heads, p.n_kv_heads);
    if (D > 512) fail("attention: head_dim {} is larger than the 512 this kernel supports", D);
    for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &q, &k_new, &v_new, &cache.k, &cache.v, &positions}) require_device(*t, "attention");
    if (positions.dtype != DType::i32 || positions.numel() != T) fail("attention: positions must be i32[{}]", T);
    if (cache.k.ndim != 3 || cache.k.dim(1) != p.n_kv_heads || cache.k.dim(2) != D)
      fail("attention: cache {} does not match the params", cache.k.describe());

    cuda::AttentionArgs a;
    a.out = out.ptr<float>();
    a.q = q.ptr<float>();
    a.k_new = k_new.ptr<float>();
    a.v_new = v_new.ptr<float>();
    a.k_cache = static_cast<const uint8_t*>(cache.k.data);
    a.v_cache = static_cast<const uint8_t*>(cache.v.data);
    if (row_tables) {
      a.k_row_caches = reinterpret_cast<const uint8_t* const*>(row_tables);
      a.v_row_caches = reinterpret_cast<const uint8_t* const*>(row_tables) + T;
    }
    a.cache_type = cache.k.dtype;
    a.cache_rows = cache.n_rows();
    a.cache_row_bytes = cache.k.stride[1];
    a.positions = positions.ptr<int32_t>();
    a.n_tokens = static_cast<int>(T);
    a.n_heads = p.n_heads;
    a.n_kv_heads = p.n_kv_heads;
    a.head_dim = static_cast<int>(D);
    a.scale = p.scale;
    a.window = p.window;
    // The kernel and the splits along the context (cuda::plan_attention); the grid is fixed by
    // the cache size, not the current position, so a captured decode step stays valid. Keys one
    // query can see: the cache (or window) plus the step's fresh rows before it.
    const int64_t fresh = row_tables ? 1 : T;
    const int64_t max_keys = (p.window > 0 ? std::min<int64_t>(p.window, cache.n_rows() + fresh) : cache.n_rows()) + fresh;
    const cuda::AttentionPlan plan = cuda::plan_attention(T, p.n_heads, p.n_kv_heads, static_cast<int>(D), max_keys,
                                                          row_tables != nullptr, sm_count_, cache.k.dtype);
    a.group_queries = plan.group_queries;
    a.by_kv_head = plan.by_kv_head;
    a.tensor_cores = plan.by_kv_head && options_.decode_attention_mma;
    a.n_splits = plan.n_splits;
    if (from_projections) {
      const cuda::AttentionArgs& f = *from_projections;
      a.from_projections = true;
      std::copy(std::begin(f.fresh_norms), std::end(f.fresh_norms), std::begin(a.fresh_norms));
      a.norm_eps = f.norm_eps, a.inv_freq = f.inv_freq, a.rope_half = f.rope_half;
      a.k_cache_write = f.k_cache_write, a.v_cache_write = f.v_cache_write;
      if (!a.by_kv_head || !cuda::decode_from_projections_applies(a)) return false;
    }
    // The prompt's tensor-core attention takes the backend's precision; a lone decode row (the
    // group kernel) stays f32, as decode does everywhere.
    a.pieces = plan.group_queries ? cuda::kMmaExactParts : act_pieces_;
    if (cuda::flash_bf16_applies(a)) {  // the keys it sees, gathered as bf16
      a.scratch_bytes = cuda::flash_bf16_scratch_bytes(a);
      a.scratch = workspace_floats((a.scratch_bytes + 3) / 4);
    }
    if (a.n_splits > 1) a.partial = workspace_floats(static_cast<size_t>(T * p.n_heads) * a.n_splits * (D + 2));
    // The next product's first bytes into L2 during the attention (only the kernel by KV head
    // takes them; a hint: a weight on the host or of another layout is simply not prefetched).
    if (a.by_kv_head)
      a.l2_prefetch_bytes = l2_prefetch_bytes(p.next_weights, options_.attention_prefetch_mb, &a.l2_prefetch);
    // Bytes: the KV rows a step can read (the whole ring, or the whole linear cache: an upper
    // bound when the sequence is shorter than the cache), plus q and out; per sequence.
    const double kv_rows = static_cast<double>(std::min<int64_t>(max_keys, cache.n_rows())) * (row_tables ? T : 1);
    OpTimer timer(*this, "attention", 2.0 * kv_rows * p.n_kv_heads * a.cache_row_bytes + 8.0 * q.numel(),
                  a.n_splits > 1 || a.scratch ? 2 : 1);  // + the merge, or the bf16 kernel's gather
    check(cuda::launch_attention(a, stream_), "attention");
    return true;
  }

  void kv_write(const KvView& cache, const Tensor& k, const Tensor& v, const Tensor& positions) override {
    OpTimer timer(*this, "kv_write", 4.0 * (k.numel() + v.numel()));
    for (const Tensor* t : std::initializer_list<const Tensor*>{&cache.k, &cache.v, &k, &v, &positions}) require_device(*t, "kv_write");
    const int64_t T = k.dim(0), n_kv = k.dim(1), D = k.dim(2);
    if (cache.k.dim(1) != n_kv || cache.k.dim(2) != D) fail("kv_write: k {} does not fit cache {}", k.describe(), cache.k.describe());
    if (!k.is_contiguous() || !v.is_contiguous()) fail("kv_write: k and v must be contiguous");
    if (positions.numel() != T) fail("kv_write: positions must be i32[{}]", T);
    check(cuda::launch_kv_write(static_cast<uint8_t*>(cache.k.data), static_cast<uint8_t*>(cache.v.data), cache.k.dtype,
                                cache.n_rows(), cache.k.stride[1], k.ptr<float>(), v.ptr<float>(),
                                positions.ptr<int32_t>(), T, n_kv, D, stream_),
          "kv_write");
  }

  void moe_keep_experts(Tensor ids, Tensor weights, int64_t first, int64_t count) override {
    check_moe_keep_experts(ids, weights, first, count);
    require_device(ids, "moe_keep_experts");
    require_device(weights, "moe_keep_experts");
    OpTimer timer(*this, "moe_keep_experts", 16.0 * ids.numel());
    check(cuda::launch_moe_keep_experts(ids.ptr<int32_t>(), weights.ptr<float>(), ids.numel(),
                                        static_cast<int32_t>(first), static_cast<int32_t>(count), stream_),
          "moe_keep_experts");
  }

  void moe_route(Tensor weights, Tensor ids, const Tensor& logits, const Tensor* per_expert_scale) override {
    OpTimer timer(*this, "moe_route", 4.0 * logits.numel());
    F32Rows l = f32_rows(logits, "moe_route"), w = f32_rows(weights, "moe_route");
    require_device(ids, "moe_route");
    if (ids.dtype != DType::i32 || ids.rows() != l.rows || ids.cols() != w.cols || w.rows != l.rows || w.cols > l.cols)
      fail("moe_route: bad shapes");
    if (l.stride != l.cols || w.stride != w.cols || !ids.is_contiguous()) fail("moe_route: tensors must be contiguous");
    if (per_expert_scale) {
      require_device(*per_expert_scale, "moe_route");
      if (per_expert_scale->numel() != l.cols) fail("moe_route: per_expert_scale must have {} elements", l.cols);
    }
    check(cuda::launch_moe_route(w.data, ids.ptr<int32_t>(), l.data, l.rows, l.cols, w.cols,
                                 per_expert_scale ? per_expert_scale->data : nullptr,
                                 per_expert_scale ? per_expert_scale->dtype : DType::f32, stream_),
          "moe_route");
  }

  size_t moe_experts_workspace_bytes(int64_t T, int64_t K, int64_t E, int64_t H, int64_t I, DType type) {
    bind_to_this_thread();  // the Hopper kernel's part depends on the current device
    const cuda::ExpertsScratch s = cuda::plan_experts_scratch(T, K, E, H, I, type, type, options_, act_pieces_);
    return s.floats() * sizeof(float);
  }

  // Whether moe_experts runs as the fused launch: 1-4 tokens, HFQ4 stacks, no grouped GEMM (plan).
  bool takes_fused_experts(const cuda::ExpertsScratch& plan, DType gate_up, DType down, int64_t T, int64_t K,
                           int64_t I) const {
    return options_.fused_experts && !plan.mma && cuda::moe_experts_decode_supports(gate_up, down, T, K, I);
  }
  // fused_experts: the router's product (f32 matvec bits) and routing join the experts' launch; else 3 ops.
  void moe_route_experts(Tensor out, const Tensor& x, const Tensor& x_router, const Tensor& router,
                         const Tensor* per_expert_scale, Tensor logits, Tensor weights, Tensor ids,
                         const Tensor& gate_up, const Tensor& down, Activation act) override {
    const bool stacks = gate_up.ndim == 3 && down.ndim == 3;
    const int64_t T = x.rows(), K = ids.cols(), E = router.ndim == 2 ? router.dim(0) : 0, I = stacks ? down.dim(2) : 0;
    const bool fused = stacks && cuda::moe_experts_decode_routes(router.dtype, gate_up.dtype, E, K) &&
                       takes_fused_experts(cuda::plan_experts_scratch(T, K, E, x.cols(), I, gate_up.dtype, down.dtype,
                                                                      options_, act_pieces_),
                                           gate_up.dtype, down.dtype, T, K, I);
    if (!fused)
      return Backend::moe_route_experts(out, x, x_router, router, per_expert_scale, logits, weights, ids, gate_up, down,
                                        act);
    F32Rows xr = f32_rows(x_router, "moe_route_experts"), l = f32_rows(logits, "moe_route_experts");
    require_device(router, "moe_route_experts");
    if (router.dim(1) != xr.cols || xr.cols != x.cols() || xr.rows != T || l.rows != T || l.cols != E ||
        l.stride != E || E != gate_up.dim(0) || ids.dtype != DType::i32 || ids.rows() != T)
      fail("moe_route_experts: router {}, x_router {}, logits {} and ids {} do not fit x {} and experts {}",
           router.describe(), x_router.describe(), logits.describe(), ids.describe(), x.describe(), gate_up.describe());
    if (per_expert_scale) require_device(*per_expert_scale, "moe_route_experts");
    if (per_expert_scale && per_expert_scale->numel() != E)
      fail("moe_route_experts: per_expert_scale must have {} elements", E);
    cuda::MoeDecodeArgs::Route r;
    r.router = static_cast<const uint8_t*>(router.data), r.type = router.dtype, r.row_bytes = router.stride[0], r.E = E;
    r.x = xr.data, r.x_stride = xr.stride, r.logits = l.data;
    r.ids = ids.ptr<int32_t>(), r.weights = weights.ptr<float>();
    r.per_expert_scale = per_expert_scale ? static_cast<const uint8_t*>(per_expert_scale->data) : nullptr;
    r.scale_type = per_expert_scale ? per_expert_scale->dtype : DType::f32;
    run_moe_experts(out, x, gate_up, down, ids, weights, act, &r);  // (the fused launch: the checks above chose it)
  }
  void moe_experts(Tensor out, const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& ids,
                   const Tensor& weights, Activation act) override {
    run_moe_experts(out, x, gate_up, down, ids, weights, act, nullptr);
  }
  // moe_experts; with a route, moe_route_experts' routing joins the fused launch (which must take it).
  void run_moe_experts(Tensor out, const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& ids,
                       const Tensor& weights, Activation act, const cuda::MoeDecodeArgs::Route* route) {
    F32Rows o = f32_rows(out, "moe_experts"), in = f32_rows(x, "moe_experts"), w = f32_rows(weights, "moe_experts");
    same_shape(o, in, "moe_experts");
    for (const Tensor* t : std::initializer_list<const Tensor*>{&gate_up, &down, &ids}) require_device(*t, "moe_experts");
    if (gate_up.ndim != 3 || down.ndim != 3) fail("moe_experts: expert tensors must be 3-D");
    const int64_t E = gate_up.dim(0), I2 = gate_up.dim(1), H = in.cols, I = I2 / 2, K = ids.cols(), T = in.rows;
    if (gate_up.dim(2) != H || down.dim(0) != E || down.dim(1) != H || down.dim(2) != I || I2 != 2 * I)
      fail("moe_experts: gate_up {} and down {} do not fit hidden size {}", gate_up.describe(), down.describe(), H);
    if (w.rows != T || w.cols != K || w.stride != K || !ids.is_contiguous()) fail("moe_experts: bad routing shapes");
    const int64_t pairs = T * K;
    const cuda::ExpertsScratch sizes =
        cuda::plan_experts_scratch(T, K, E, H, I, gate_up.dtype, down.dtype, options_, act_pieces_);
    const bool mma = sizes.mma;
    // Bytes: each pair's expert matrices (the matvec path), or each expert's once per work item
    // (the GEMM, counted as if every expert got pairs: an upper bound).
    // With BackendOptions::gated_matvec the matvec path's gate_up product stores the activated
    // rows itself where it can (HFQ4).
    cuda::MatvecArgs gated_probe;
    gated_probe.weight_type = gate_up.dtype, gated_probe.expert_ids = ids.ptr<int32_t>(), gated_probe.gated = true;
    const bool fused = takes_fused_experts(sizes, gate_up.dtype, down.dtype, T, K, I);
    if (route && !fused) fail("moe_route_experts: the fused launch does not take these experts");
    const bool imma = sizes.imma && !fused;
    const bool gated = options_.gated_matvec && !mma && !imma && cuda::matvec_gated_supported(gated_probe);
    const double expert_bytes = static_cast<double>(gate_up.stride[0] + down.stride[0]);
    cuda::MatvecArgs down_probe = gated_probe;  // (down's products and the combine in one launch)
    down_probe.weight_type = down.dtype, down_probe.gated = false, down_probe.n_inputs = pairs;
    const bool summed =
        !mma && !imma && !fused && options_.experts_down_sum && cuda::hfq4_pairs_sum_takes(down_probe, K);
    const int kernels = fused ? 1 : mma || imma ? 5 : (gated ? 3 : 4) - (summed ? 1 : 0);
    const double bytes = expert_bytes * (mma ? static_cast<double>(std::min(pairs, E)) : pairs) +
                         (route ? static_cast<double>(route->row_bytes * route->E) : 0.0);  // (and the router's)
    OpTimer timer(*this, route ? "moe_route_experts" : "moe_experts", bytes, kernels);
    const int64_t max_items = sizes.max_items;
    const size_t split_bytes = sizes.split_bytes, head_floats = sizes.head_floats;
    float* scratch = workspace_floats(sizes.floats());
    float* hidden = scratch;
    float* activated = hidden + pairs * I2;
    float* y = activated + pairs * I;
    cuda::MmaGroupedRows grouped;
    if (mma) {
      static_assert(sizeof(cuda::MmaWorkItem) == 4 * sizeof(float));
      auto* items = reinterpret_cast<cuda::MmaWorkItem*>(y + pairs * H);
      auto* n_items = reinterpret_cast<int32_t*>(items + max_items);
      check(cuda::launch_moe_sort_pairs(grouped, items, n_items, n_items + 1, ids.ptr<int32_t>(), pairs, E, stream_),
            "moe_experts sort");
      grouped.hopper = options_.hopper_expert_gemm;
    }
    if (fused) {  // BackendOptions::fused_experts: the four kernels below in one launch
      auto stack = [](const Tensor& t) {
        return cuda::MoeDecodeArgs::Stack{static_cast<const uint8_t*>(t.data), t.dtype, t.stride[1], t.stride[0]};
      };
      cuda::MoeDecodeArgs f{o.data, o.stride, in.data, in.stride, stack(gate_up), stack(down)};
      f.ids = ids.ptr<int32_t>(), f.weights = w.data, f.activated = activated;
      f.counters = moe_decode_counters();
      f.T = T, f.K = K, f.H = H, f.I = I, f.act = static_cast<cuda::Act>(act);
      f.blocks_per_sm = options_.fused_experts_blocks;
      if (route) f.route = *route;
      check(cuda::launch_moe_experts_decode(f, stream_), "moe_experts fused");
      return;
    }
    auto expert_product = [&](const cuda::MatvecArgs& args, const char* what) {
      check(mma ? cuda::launch_matmul_mma(args, args.act_pieces, stream_, &grouped) : cuda::launch_matvec(args, stream_),
            what);
    };

    cuda::MatvecArgs a = matvec_args();
    a.scratch = mma ? static_cast<void*>(scratch + head_floats) : nullptr;
    a.scratch_bytes = split_bytes;
    a.out = hidden;
    a.out_stride = I2;
    a.x = in.data;
    a.x_stride = in.stride;
    a.weight = static_cast<const uint8_t*>(gate_up.data);
    a.weight_type = gate_up.dtype;
    a.M = I2;
    a.K = H;
    a.row_bytes = gate_up.stride[1];
    a.n_inputs = pairs;
    a.expert_ids = ids.ptr<int32_t>();
    a.expert_bytes = gate_up.stride[0];
    a.x_row_div = K;
    // With the integer kernel: x's pieces (cut by the gate_up launch), gate_up per pair into
    // hidden [pairs, 2I], the activation into `activated` [pairs, I] cutting each pair's row into
    // the down products' pieces, down per pair from those.
    auto* x_pieces = reinterpret_cast<uint8_t*>(scratch + head_floats);
    uint8_t* act_pieces = x_pieces + sizes.imma_x_bytes;
    const int down_group = hfq4_group_size(down.dtype);
    if (imma) {
      a.scratch = x_pieces;
      a.scratch_bytes = sizes.imma_x_bytes;
      a.imma_pieces_ready = false;
      check(cuda::launch_hfq4_imma_experts(a, hfq4_group_size(gate_up.dtype), stream_), "moe_experts gate_up");
      check(
          cuda::launch_gated_activation_imma_pieces_rows(activated, I, hidden, hidden + I, I2, pairs, I,
                                                         static_cast<cuda::Act>(act), down_group, act_pieces, stream_),
          "moe_experts activation");
    } else if (gated) {  // act(gate) * up straight into `activated` [pairs, I]
      a.out = activated;
      a.out_stride = I;
      a.M = I;
      a.gated = true;
      a.act = static_cast<cuda::Act>(act);
      expert_product(a, "moe_experts gate_up");
      a.gated = false;
    } else {
      expert_product(a, "moe_experts gate_up");
      check(cuda::launch_gated_activation(activated, I, hidden, I2, hidden + I, I2, pairs, I,
                                          static_cast<cuda::Act>(act), stream_),
            "moe_experts activation");
    }
    a.out = y;
    a.out_stride = H;
    a.x = activated;
    a.x_stride = I;
    a.weight = static_cast<const uint8_t*>(down.data);
    a.weight_type = down.dtype;
    a.M = H;
    a.K = I;
    a.row_bytes = down.stride[1];
    a.expert_bytes = down.stride[0];
    a.x_row_div = 1;
    if (imma) {
      a.scratch = act_pieces;
      a.scratch_bytes = cuda::hfq4_imma_rows_scratch_bytes(pairs, I, down_group);
      a.imma_pieces_ready = true;
      check(cuda::launch_hfq4_imma_experts(a, down_group, stream_), "moe_experts down");
    } else if (summed) {
      a.out = o.data, a.out_stride = o.stride;  // out [T, H] straight from the pairs
      check(cuda::launch_hfq4_pairs_sum(a, w.data, static_cast<int>(K), stream_), "moe_experts down");
      return;
    } else {
      expert_product(a, "moe_experts down");
    }
    check(cuda::launch_moe_combine(o.data, o.stride, y, w.data, ids.ptr<int32_t>(), T, K, H, stream_), "moe_experts combine");
  }

  // ---- Gated DeltaNet (Qwen3.5); shapes checked as the CPU oracle checks them ----
  void causal_conv1d(Tensor out, const Tensor& x, const Tensor& weight, Tensor state, Activation act) override {
    const char* op = "causal_conv1d";
    OpTimer timer(*this, op, 8.0 * x.numel() + 8.0 * state.numel() + static_cast<double>(weight.nbytes()), 2);
    F32Rows o = f32_rows(out, op), in = f32_rows(x, op), st = f32_rows(state, op);
    require_device(weight, op);
    const int64_t T = in.rows, C = in.cols, K = weight.cols();
    if (o.rows != T || o.cols != C) fail("{}: out {} does not match x {}", op, out.describe(), x.describe());
    if (!weight.is_contiguous() || weight.rows() != C || K < 1)
      fail("{}: weight {} must be contiguous [{}, kernel]", op, weight.describe(), C);
    if (st.rows != K - 1 || (K > 1 && st.cols != C))
      fail("{}: state {} must be [{}, {}]", op, state.describe(), K - 1, C);
    if (out.data == x.data) fail("{}: out must not alias x", op);
    if (act != Activation::silu) fail("{}: only silu follows the convolution", op);
    check(cuda::launch_causal_conv1d(o.data, o.stride, in.data, in.stride, st.data, st.stride, weight.data,
                                     weight.dtype, weight.row_bytes(), T, C, K, stream_),
          op);
  }

  void causal_conv1d_rows(Tensor out, const Tensor& x, const Tensor& weight, std::span<const Tensor> states,
                          Activation act) override {
    const char* op = "causal_conv1d";
    F32Rows o = f32_rows(out, op), in = f32_rows(x, op);
    require_device(weight, op);
    const int64_t B = in.rows, C = in.cols, K = weight.cols();
    if (static_cast<int64_t>(states.size()) != B || o.rows != B || o.cols != C)
      fail("{}: {} states for x {} and out {}", op, states.size(), x.describe(), out.describe());
    if (!weight.is_contiguous() || weight.rows() != C || K < 2 || K > cuda::kConvRowsMaxKernel)
      fail("{}: weight {} must be contiguous [{}, 2..{}] for the batched form", op, weight.describe(), C,
           cuda::kConvRowsMaxKernel);
    if (out.data == x.data) fail("{}: out must not alias x", op);
    if (act != Activation::silu) fail("{}: only silu follows the convolution", op);
    OpTimer timer(*this, op, 8.0 * x.numel() + 8.0 * B * (K - 1) * C + static_cast<double>(weight.nbytes()));
    std::vector<const void*> table(states.size());
    int64_t state_stride = 0;
    for (size_t i = 0; i < states.size(); ++i) {
      F32Rows st = f32_rows(states[i], op);
      if (st.rows != K - 1 || st.cols != C) fail("{}: state {} must be [{}, {}]", op, states[i].describe(), K - 1, C);
      if (i == 0) state_stride = st.stride;
      if (st.stride != state_stride) fail("{}: state {} has another row stride than the first", op, i);
      table[i] = st.data;
    }
    require_distinct(table, op);
    const void* const* states_on_device = upload_pointer_table(table, op);
    check(cuda::launch_causal_conv1d_rows(
              o.data, o.stride, in.data, in.stride,
              const_cast<float* const*>(reinterpret_cast<const float* const*>(states_on_device)), state_stride,
              weight.data, weight.dtype, weight.row_bytes(), B, C, K, stream_),
          op);
  }

  void gated_delta_rule_rows(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                             const Tensor& beta, std::span<const Tensor> states,
                             const DeltaRuleParams& params) override {
    const char* op = "gated_delta_rule";
    if (states.empty() || q.ndim != 3 || q.dim(0) != static_cast<int64_t>(states.size()))
      fail("{}: {} states for q {}", op, states.size(), q.describe());
    // run_delta_rule checks the first state; the others must match it.
    std::vector<const void*> table(states.size());
    for (size_t i = 0; i < states.size(); ++i) {
      const Tensor& st = states[i];
      if (st.dtype != states[0].dtype || st.ndim != states[0].ndim || st.shape != states[0].shape ||
          st.device != Device::cuda || !st.is_contiguous())
        fail("{}: state {} {} must be contiguous in GPU memory, shaped as the first {}", op, i, st.describe(),
             states[0].describe());
      table[i] = st.data;
    }
    require_distinct(table, op);
    const void* const* states_on_device = upload_pointer_table(table, op);
    run_delta_rule(op, out, q, k, v, g, beta, states[0], params,
                   const_cast<float* const*>(reinterpret_cast<const float* const*>(states_on_device)));
  }

  void delta_rule_gates(Tensor g, Tensor beta, const Tensor& a, const Tensor& b, const Tensor& a_log,
                        const Tensor& dt_bias) override {
    const char* op = "delta_rule_gates";
    OpTimer timer(*this, op, 16.0 * a.numel());
    F32Rows go = f32_rows(g, op), bo = f32_rows(beta, op), ai = f32_rows(a, op), bi = f32_rows(b, op);
    const int64_t T = ai.rows, nV = ai.cols;
    for (const F32Rows* m : {&go, &bo, &bi})
      if (m->rows != T || m->cols != nV) fail("{}: g, beta, a and b must all be [{}, {}]", op, T, nV);
    if (a_log.numel() != nV || dt_bias.numel() != nV)
      fail("{}: A_log {} and dt_bias {} must have {} elements", op, a_log.describe(), dt_bias.describe(), nV);
    auto vector_of = [&](const Tensor& w) {
      require_device(w, op);
      if (!w.is_contiguous()) fail("{}: weight {} must be contiguous", op, w.describe());
      return cuda::WeightVector{w.data, w.dtype, w.cols(), w.row_bytes()};
    };
    check(cuda::launch_delta_rule_gates(go.data, go.stride, bo.data, bo.stride, ai.data, ai.stride, bi.data, bi.stride,
                                        vector_of(a_log), vector_of(dt_bias), T, nV, stream_),
          op);
  }

  // One launch (cuda::launch_delta_net_step) where the device, the build and the shapes allow; a
  // cluster the GPU cannot place is refused at launch, and then the default's kernels run.
  void gated_delta_net_rows(Tensor out, Tensor conv, const Tensor& qkv, const Tensor& z, Tensor a, Tensor b,
                            std::span<const Tensor> conv_states, std::span<const Tensor> delta_states,
                            const DeltaNetStep& step) override {
    // (the fused kernel reads the states before the programmatic-launch wait: the launch right
    // before it must not be a step, which may have written them)
    const bool follows_step = delta_step_op_ != 0 && delta_step_op_ == *ops_;
    if (options_.fused_delta_net && !follows_step && cuda::delta_net_step_available()) {
      cuda::DeltaNetStepLaunch launch = cuda::delta_net_step_launch(out, qkv, z, a, b, conv_states, delta_states, step);
      cuda::DeltaNetStepArgs& args = launch.args;
      if (cuda::delta_net_step_fits(args)) {
        const auto first_delta = launch.states.begin() + args.n_rows;
        require_distinct({launch.states.begin(), first_delta}, "gated_delta_net");
        require_distinct({first_delta, launch.states.end()}, "gated_delta_net");
        OpTimer timer(*this, "gated_delta_net", launch.bytes);
        delta_step_op_ = *ops_;
        if (args.n_rows > 1) {  // several rows: their states' addresses, conv then delta
          auto table = const_cast<float* const*>(
              reinterpret_cast<const float* const*>(upload_pointer_table(launch.states, "gated_delta_net")));
          args.conv_table = table;
          args.delta_table = table + args.n_rows;
        }
        const int64_t width = int64_t{args.n_v_heads} * args.dv;  // out_proj's input: its pieces cut here too
        args.pieces_group = pieces_group_for(width);
        const bool cut = options_.imma_ready_pieces && imma_products_seen_ && cuda::delta_net_step_cuts_pieces(args);
        if (cut) args.pieces = workspace_floats((cuda::hfq4_imma_scratch_bytes(width, args.pieces_group) + 3) / 4);
        if (cuda::launch_delta_net_step(args, stream_) == cudaSuccess) {
          if (cut) ready_pieces_ = {args.out, width, args.pieces_group, args.pieces, stream_, *ops_};
          return;
        }
        cudaGetLastError();  // (the refused launch's error, not left for the next check)
      }
    }
    Backend::gated_delta_net_rows(out, conv, qkv, z, a, b, conv_states, delta_states, step);
  }

  void gated_delta_rule(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, Tensor state, const DeltaRuleParams& params) override {
    run_delta_rule("gated_delta_rule", out, q, k, v, g, beta, state, params);
  }

  // The chunked (WY/UT) form, as the CPU computes it, where a chunk's tiles fit shared memory
  // (cuda::delta_rule_chunked_applies: chunks of up to 64 tokens, head sizes up to 128, CUDA);
  // elsewhere the recurrence, which agrees with the chunked form within what the two forms differ
  // by on the CPU (tests/unit/linear_attention_test.cpp).
  void gated_delta_rule_chunked(Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                const Tensor& beta, Tensor state, const DeltaRuleParams& params) override {
    if (params.chunk < 1) fail("gated_delta_rule_chunked: chunk must be positive (got {})", params.chunk);
    run_delta_rule("gated_delta_rule_chunked", out, q, k, v, g, beta, state, params, nullptr, /*chunked=*/true);
  }

  void sigmoid_gate(Tensor x, const Tensor& gate) override {
    const char* op = "sigmoid_gate";
    OpTimer timer(*this, op, 8.0 * x.numel() + 4.0 * gate.numel());
    F32Rows xs = f32_rows(x, op), gs = f32_rows(gate, op);
    if (gs.rows != xs.rows || (gs.cols != xs.cols && gs.cols != 1))
      fail("{}: gate {} must be [{}, {}] or [{}, 1]", op, gate.describe(), xs.rows, xs.cols, xs.rows);
    const bool per_row = gs.cols == 1 && xs.cols != 1;
    check(cuda::launch_sigmoid_gate(xs.data, xs.stride, gs.data, gs.stride, per_row, xs.rows, xs.cols, stream_), op);
  }

  void argmax(Tensor out_ids, const Tensor& logits) override {
    OpTimer timer(*this, "argmax", 4.0 * logits.numel());
    F32Rows l = f32_rows(logits, "argmax");
    require_device(out_ids, "argmax");
    check(cuda::launch_argmax(out_ids.ptr<int32_t>(), l.data, l.stride, l.rows, l.cols, stream_), "argmax");
  }

  void sample(Tensor out_id, Tensor logits, const SampleSpec& spec) override {
    check_sample_args(out_id, logits);
    require_device(logits, "sample");
    require_device(out_id, "sample");
    if (capturing_) fail("sample: not inside a captured graph (its inputs are copied in per call)");
    // The adjustments travel with the launch: a pageable-memory copy is staged before it returns.
    // The launch's scratch (greedy's per-block results) follows them in the same buffer.
    const size_t adjust_bytes = spec.adjust.size() * sizeof(SampleAdjust);
    const size_t scratch_at = (adjust_bytes + 15) / 16 * 16;
    cuda::SampleArgs a;
    a.logits = logits.ptr<float>();
    a.vocab = logits.numel();
    a.out = out_id.ptr<int32_t>();
    a.n_adjust = static_cast<int>(spec.adjust.size());
    a.p = spec;
    const int64_t scratch_bytes = cuda::sample_scratch_bytes(a);
    OpTimer timer(*this, "sample", 4.0 * logits.numel(), scratch_bytes > 0 ? 2 : 1);  // greedy: blocks, then the pick
    auto* device = static_cast<uint8_t*>(
        sample_upload_buffer(scratch_at + static_cast<size_t>(scratch_bytes), "sample"));
    if (adjust_bytes)
      check(cudaMemcpyAsync(device, spec.adjust.data(), adjust_bytes, cudaMemcpyHostToDevice, stream_), "sample");
    a.adjust = reinterpret_cast<const SampleAdjust*>(device);
    check(cuda::launch_sample(a, device + scratch_at, stream_), "sample");
  }

  void sample_rows(Tensor out_ids, Tensor logits, std::span<const SampleSpec> specs) override {
    OpTimer timer(*this, "sample", 4.0 * logits.numel());
    const auto B = static_cast<int64_t>(specs.size());
    if (logits.ndim != 2 || logits.dim(0) != B || !logits.is_contiguous() || logits.dtype != DType::f32 ||
        logits.dim(1) <= 0 || logits.dim(1) > 0x7fffffff || out_ids.dtype != DType::i32 || out_ids.numel() != B ||
        !out_ids.is_contiguous())
      fail("sample_rows: expected logits f32 [{}, V] and contiguous out_ids i32 [{}], got {} and {}", B, B,
           logits.describe(), out_ids.describe());
    require_device(logits, "sample_rows");
    require_device(out_ids, "sample_rows");
    if (capturing_) fail("sample_rows: not inside a captured graph (its inputs are copied in per call)");
    if (B == 0) return;
    // One upload: the rows' arguments [B], then every row's adjustments, back to back.
    size_t n_adjust = 0;
    for (const SampleSpec& s : specs) n_adjust += s.adjust.size();
    const size_t args_bytes = static_cast<size_t>(B) * sizeof(cuda::SampleArgs);
    const size_t bytes = args_bytes + n_adjust * sizeof(SampleAdjust);
    auto* device = static_cast<uint8_t*>(sample_upload_buffer(bytes, "sample_rows"));
    std::vector<uint8_t> host(bytes);
    auto* args = reinterpret_cast<cuda::SampleArgs*>(host.data());
    size_t adjust_at = args_bytes;
    for (int64_t i = 0; i < B; ++i) {
      const SampleSpec& s = specs[i];
      cuda::SampleArgs a;
      a.logits = logits.ptr<float>() + i * logits.dim(1);
      a.vocab = logits.dim(1);
      a.out = out_ids.ptr<int32_t>() + i;
      a.adjust = reinterpret_cast<const SampleAdjust*>(device + adjust_at);
      a.n_adjust = static_cast<int>(s.adjust.size());
      a.p = s;
      std::memcpy(args + i, &a, sizeof(a));
      if (!s.adjust.empty()) std::memcpy(host.data() + adjust_at, s.adjust.data(), s.adjust.size() * sizeof(SampleAdjust));
      adjust_at += s.adjust.size() * sizeof(SampleAdjust);
    }
    // Pageable memory: the copy is staged before cudaMemcpyAsync returns, so `host` may go.
    check(cudaMemcpyAsync(device, host.data(), bytes, cudaMemcpyHostToDevice, stream_), "sample_rows");
    check(cuda::launch_sample_rows(reinterpret_cast<const cuda::SampleArgs*>(device), B, stream_), "sample_rows");
  }

  size_t weight_bytes() const { return weight_bytes_; }

  void set_profiling(bool on) override { profiling_ = on; }
  void profiler_region(bool on) override {
#if !defined(FIRELINE_GPU_HIP)
    check(cudaStreamSynchronize(stream_), "profiler region");  // the region holds exactly the work between
    check(on ? cudaProfilerStart() : cudaProfilerStop(), "profiler region");
#else
    (void)on;
#endif
  }

  std::vector<OpProfile> take_profile() override {
    check(cudaStreamSynchronize(stream_), "profile");
    std::vector<OpProfile> out;
    for (const TimedOp& t : timed_) {
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, t.start, t.end), "profile");
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.end);
      auto it = std::find_if(out.begin(), out.end(), [&](const OpProfile& p) { return p.op == t.op; });
      if (it == out.end()) it = out.insert(out.end(), OpProfile{t.op});
      it->calls += 1;
      it->kernels += t.kernels;
      it->ms += ms;
      it->bytes += t.bytes;
    }
    timed_.clear();
    return out;
  }

 private:
  struct TimedOp {
    const char* op;
    cudaEvent_t start, end;
    double bytes;
    int kernels;
  };

  // One sequence's T tokens continuing `state`; or (state_table) T sequences of one token each,
  // `state` describing every row's state.
  void run_delta_rule(const char* op, Tensor out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                      const Tensor& beta, Tensor state, const DeltaRuleParams& p, float* const* state_table = nullptr,
                      bool chunked = false) {
    F32Heads qh = f32_heads(q, op, "q"), kh = f32_heads(k, op, "k"), vh = f32_heads(v, op, "v"),
             oh = f32_heads(out, op, "out");
    F32Rows gr = f32_rows(g, op), br = f32_rows(beta, op);
    const int64_t T = qh.tokens, nK = qh.heads, dk = qh.dim, nV = vh.heads, dv = vh.dim;
    if (kh.tokens != T || kh.heads != nK || kh.dim != dk)
      fail("{}: k {} does not match q {}", op, k.describe(), q.describe());
    if (vh.tokens != T || oh.tokens != T || oh.heads != nV || oh.dim != dv)
      fail("{}: v {} and out {} must both be [{}, nV, dv]", op, v.describe(), out.describe(), T);
    if (nK <= 0 || nV % nK) fail("{}: {} value heads cannot share {} key heads", op, nV, nK);
    if (gr.rows != T || gr.cols != nV || br.rows != T || br.cols != nV)
      fail("{}: g {} and beta {} must be [{}, {}]", op, g.describe(), beta.describe(), T, nV);
    if (state.device != Device::cuda || state.dtype != DType::f32 || !state.is_contiguous() || state.ndim != 3 ||
        state.shape[0] != nV || state.shape[1] != dk || state.shape[2] != dv)
      fail("{}: state {} must be contiguous f32 [{}, {}, {}] in GPU memory", op, state.describe(), nV, dk, dv);
    if (dk > cuda::kDeltaRuleMaxDk || nV > 65535)
      fail("{}: key head size {} (at most {}) or {} value heads (at most 65535) is too large for this kernel", op, dk,
           cuda::kDeltaRuleMaxDk, nV);
    chunked = chunked && !state_table && T > 1 && cuda::delta_rule_chunked_applies(dk, dv, p.chunk);
    cuda::DeltaRuleArgs a;
    a.out = {oh.data, oh.token_stride, oh.head_stride};
    a.q = {qh.data, qh.token_stride, qh.head_stride};
    a.k = {kh.data, kh.token_stride, kh.head_stride};
    a.v = {vh.data, vh.token_stride, vh.head_stride};
    a.g = gr.data;
    a.g_stride = gr.stride;
    a.beta = br.data;
    a.beta_stride = br.stride;
    a.state = state.ptr<float>();
    a.state_table = state_table;
    a.n_tokens = T;
    a.n_k_heads = static_cast<int>(nK);
    a.n_v_heads = static_cast<int>(nV);
    a.dk = static_cast<int>(dk);
    a.dv = static_cast<int>(dv);
    a.q_scale = p.q_scale;
    a.l2_eps = p.l2_eps;
    const double bytes =
        8.0 * state.numel() * (state_table ? T : 1) + 4.0 * (q.numel() + k.numel() + v.numel() + out.numel());
    if (!chunked) {
      OpTimer timer(*this, op, bytes);
      check(cuda::launch_gated_delta_rule(a, stream_), op);
      return;
    }
    // Scratch for a slab of chunks' factors (~64 MB at most); two kernels per slab.
    const cuda::DeltaChunkPlan plan = cuda::plan_delta_rule_chunked(a, p.chunk);
    float* scratch = workspace_floats((plan.scratch_bytes + 3) / 4);
    OpTimer timer(*this, op, bytes + 2.0 * static_cast<double>(plan.chunk_bytes) * static_cast<double>(plan.chunks),
                  static_cast<int>(2 * plan.slabs));
    check(cuda::launch_gated_delta_rule_chunked(a, p.chunk, plan, scratch, stream_), op);
  }

  // The sampling ops' per-call upload (adjustments, row arguments): at least `bytes`, grown after
  // a stream sync, since a previous launch may still read the old buffer.
  void* sample_upload_buffer(size_t bytes, const char* op) {
    if (!sample_adjust_ || sample_adjust_->size() < bytes) {
      check(cudaStreamSynchronize(stream_), op);
      sample_adjust_ = std::make_unique<CudaBuffer>(std::max<size_t>(bytes, 4096), stream_);
    }
    return sample_adjust_->data();
  }

  // Device scratch shared by ops within one call (attention partials, expert intermediates), one
  // per stream: a concurrent branch's side line has its own. It only grows; ops on one stream run
  // in order, so reuse across ops is safe. It cannot grow inside a graph capture (no
  // synchronisation there): the uncaptured first step of a decode graph sizes it. A grown
  // workspace replaces the old one, which lives on while a graph captured with it does (CudaGraph).
  float* workspace_floats(size_t n) {
    const size_t bytes = n * sizeof(float);
    std::shared_ptr<CudaBuffer>& workspace = workspaces_[branch_ == BranchState::side ? 1 : 0];
    if (!workspace || workspace->size() < bytes) {
      if (capturing_) fail("the {} workspace must grow to {} bytes inside a graph capture", gpu::kRuntimeName, bytes);
      const size_t grown = std::max(bytes, workspace ? workspace->size() * 2 : size_t{1} << 20);
      check(cudaStreamSynchronize(stream_), "workspace resize");
      workspace.reset();
      workspace = std::make_shared<CudaBuffer>(grown, stream_);
      ++workspace_growths_;
    }
    return static_cast<float*>(workspace->data());
  }

  // The weight-group size a kernel cuts its one-row output [K] for: the hf4 preset's choice for
  // rows of K weights (quant_policy.cpp), which the next product's weights most likely have (the
  // product checks, and cuts its own pieces otherwise).
  static int pieces_group_for(int64_t K) { return K % 256 == 0 ? 256 : 128; }
  // A one-input product's scratch (a.scratch_bytes > 0, after its OpTimer): the pieces of its
  // input where the op right before it on this stream cut them (a.imma_pieces_ready; they lie in
  // this stream's workspace, which nothing has touched since), else the workspace's start.
  void take_scratch_or_ready_pieces(cuda::MatvecArgs& a) {
    const ReadyPieces& r = ready_pieces_;
    const int group = hfq4_group_size(a.weight_type);
    const bool next_op = r.x && a.n_inputs == 1 && r.op + 1 == *ops_ && r.stream == stream_ && r.x == a.x &&
                         r.K == a.K && r.group == group;
    const cuda::NormPiecesBook::Entry* normed =
        a.n_inputs == 1 ? norm_pieces_.find(a.x, a.K, group, op_line(), *ops_) : nullptr;
    void* pieces = next_op ? r.scratch : normed ? normed->pieces : nullptr;
    const bool ready = pieces && cuda::hfq4_imma_scratch_bytes(a.K, group) >= a.scratch_bytes;
    // (one input: the scratch is the integer matvec's; many inputs' is the GEMM's, which a model
    // with q8 or bf16 products also runs)
    if (a.n_inputs == 1) imma_products_seen_ = true;
    if (!ready && a.n_inputs == 1 && cuda::matvec_weight_bytes(a) < options_.imma_min_bytes) {
      a.scratch = nullptr;  // (no scratch: the f32 rows kernels, and no pieces launch before them)
      a.scratch_bytes = 0;
      return;
    }
    a.scratch = ready ? pieces : workspace_floats((a.scratch_bytes + 3) / 4);
    a.imma_pieces_ready = ready;
  }

  // MatvecArgs with this backend's switches (tensor-core pieces, prefetch, bulk copies, split
  // steps, integer tensor cores).
  cuda::MatvecArgs matvec_args() const {
    cuda::MatvecArgs a;
    a.act_pieces = act_pieces_;
    a.weight_prefetch = options_.weight_prefetch;
    a.async_rows = options_.async_matvec ? -1 : 0;
    a.split_rows = options_.split_matvec ? 1 : 0;
    a.imma_rows = options_.imma_matvec ? -1 : 0;
    a.imma_l2_ahead = options_.imma_l2_ahead;
    a.imma_lean = options_.imma_lean, a.imma_warps_per_sm = options_.imma_warps_per_sm;
    a.expert_rows = options_.expert_matvec.rows, a.expert_steps = options_.expert_matvec.steps;
    a.expert_ring = options_.expert_matvec_ring;
    return a;
  }

  int device_;
  // bf16 pieces per activation in the tensor-core products of many tokens (BackendOptions).
  int act_pieces_;
  BackendOptions options_;        // the switches, as this backend reads them (the constructor)
  uint64_t delta_step_op_ = 0;    // the op count (ops_) of the last fused DeltaNet step
  // Ops issued so far (OpTimer, and the memory, capture, replay and branch calls and NCCL's
  // in-place all-reduce between them): a producer's pieces serve only the op right after it.
  // Shared with the captured graphs, whose replays count too.
  std::shared_ptr<uint64_t> ops_ = std::make_shared<uint64_t>(0);
  bool imma_products_seen_ = false;  // (producers cut pieces once an integer product has run)
  // The integer matvec's pieces of the one-row output x [K] that the op numbered `op` cut beside
  // it (imma_pieces.cuh), at `scratch` (the workspace of `stream`), for `group`-weight groups.
  struct ReadyPieces {
    const float* x = nullptr;
    int64_t K = 0;
    int group = 0;
    void* scratch = nullptr;
    cudaStream_t stream = nullptr;
    uint64_t op = 0;
  };
  ReadyPieces ready_pieces_;
  cuda::NormPiecesBook norm_pieces_;                // the residual updates' pieces (norm_pieces.h)
  std::shared_ptr<CudaBuffer> norm_pieces_buffer_;  // (held by the graphs captured with it)
  cuda::OpLine op_line() const {
    if (branch_ == BranchState::none) return cuda::OpLine::unbranched;
    return branch_ == BranchState::side || branch_ == BranchState::in_order_side ? cuda::OpLine::side
                                                                                 : cuda::OpLine::main;
  }
  // At least `bytes` of it; nullptr inside a capture where it would have to grow (no cut then).
  void* norm_pieces_buffer(size_t bytes) {
    if (!norm_pieces_buffer_ || norm_pieces_buffer_->size() < bytes) {
      if (capturing_) return nullptr;
      check(cudaStreamSynchronize(stream_), "norm pieces resize");
      norm_pieces_buffer_.reset();
      norm_pieces_buffer_ = std::make_shared<CudaBuffer>(bytes, stream_);
    }
    return norm_pieces_buffer_->data();
  }
  // Ops go to stream_: the main stream, or the side stream inside a branch's side line.
  cudaStream_t stream_ = nullptr;
  cudaStream_t main_stream_ = nullptr;
  cudaStream_t side_stream_ = nullptr;  // null: concurrent branches off
  enum class BranchState { none, side, main, in_order_side, in_order_main };
  BranchState branch_ = BranchState::none;
  cudaEvent_t fork_event_ = nullptr, join_event_ = nullptr;
  int64_t branch_forks_ = 0;
  std::string name_;
  std::optional<MemoryPeak> memory_peak_;
  int sm_count_ = 0;
  // The embed's error flag, then each stream's fused-experts counters (zero between launches).
  static constexpr int kDeviceWords = cuda::kMoeDecodeCounterStride + 2 * cuda::kMoeDecodeCounters;
  int32_t* device_words_ = nullptr;
  int32_t* error_flag() const { return device_words_; }
  int32_t* moe_decode_counters() const {
    return device_words_ + cuda::kMoeDecodeCounterStride + (stream_ == main_stream_ ? 0 : cuda::kMoeDecodeCounters);
  }
  std::mutex weights_mutex_;
  std::vector<std::unique_ptr<CudaBuffer>> weight_chunks_;
  size_t weight_used_ = 0;
  size_t weight_bytes_ = 0;
  std::shared_ptr<CudaBuffer> workspaces_[2];  // the main stream's, the side stream's (graphs share them)
  int64_t workspace_growths_ = 0;
  std::unique_ptr<CudaBuffer> sample_adjust_;
  // upload_pointer_table: per-row cache or state addresses of the rows ops (attention_rows,
  // kv_write_rows, causal_conv1d_rows, gated_delta_rule_rows)
  std::unique_ptr<CudaBuffer> cache_table_;
  bool profiling_ = false;
  bool capturing_ = false;
  std::vector<TimedOp> timed_;
};

OpTimer::OpTimer(CudaBackend& backend, const char* op, double bytes, int kernels)
    : op_(op), bytes_(bytes), kernels_(kernels) {
  ++*backend.ops_;
  if (!backend.profiling_ || backend.capturing_) return;
  backend_ = &backend;
  check(cudaEventCreate(&start_), "profile");
  check(cudaEventRecord(start_, backend.stream_), "profile");
}

OpTimer::~OpTimer() {
  if (!backend_) return;
  cudaEvent_t end = nullptr;
  if (cudaEventCreate(&end) != cudaSuccess || cudaEventRecord(end, backend_->stream_) != cudaSuccess) {
    cudaGetLastError();
    cudaEventDestroy(start_);
    return;
  }
  backend_->timed_.push_back({op_, start_, end, bytes_, kernels_});
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device_index, const BackendOptions& options) {
  return std::make_unique<CudaBackend>(device_index, options);
}

namespace {
CudaBackend& cuda_backend_of(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda) fail("expected a {} backend, got {}", gpu::kBackendName, backend.name());
  return *cuda;
}
}  // namespace

int cuda_device_index(Backend& backend) { return cuda_backend_of(backend).device_index(); }
int64_t cuda_branch_forks(Backend& backend) { return cuda_backend_of(backend).branch_forks(); }
int64_t cuda_workspace_growths(Backend& backend) { return cuda_backend_of(backend).workspace_growths(); }
void cuda_note_foreign_write(Backend& backend) { cuda_backend_of(backend).note_foreign_write(); }
size_t cuda_moe_experts_workspace_bytes(Backend& backend, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I,
                                        DType type) {
  return cuda_backend_of(backend).moe_experts_workspace_bytes(T, k, E, H, I, type);
}
void* cuda_stream_of(Backend& backend) { return cuda_backend_of(backend).stream(); }

int cuda_sm_count(Backend& backend) {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cuda_device_index(backend)), "device attribute");
  return sms;
}

int cuda_max_block_shared_memory(Backend& backend) {
  int bytes = 0;
  check(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, cuda_device_index(backend)),
        "device attribute");
  return bytes;
}

}  // namespace fl
