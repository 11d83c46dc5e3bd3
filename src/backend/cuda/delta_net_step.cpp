// The fused Gated DeltaNet decode step's arguments (delta_net_step.h).
#include "backend/cuda/delta_net_step.h"

#include "core/error.h"

namespace fl::cuda {
namespace {

constexpr const char* kOp = "gated_delta_net_rows";

// f32 rows [rows, cols] in GPU memory with a contiguous last dimension: the element stride
// between rows.
int64_t f32_row_stride(const Tensor& t, int64_t rows, int64_t cols, const char* what) {
  if (t.device != Device::cuda || t.dtype != DType::f32 || t.ndim != 2 || t.dim(0) != rows || t.dim(1) != cols ||
      t.stride[1] != 4)
    fail("{}: {} {} must be f32 [{}, {}] rows in GPU memory", kOp, what, t.describe(), rows, cols);
  return t.stride[0] / 4;
}

WeightVector weight_vector(const Tensor* w, int64_t elements, const char* what) {
  if (!w || w->device != Device::cuda || !w->is_contiguous() || w->numel() != elements)
    fail("{}: {} {} must be {} contiguous elements in GPU memory", kOp, what, w ? w->describe() : "(none)", elements);
  return WeightVector{w->data, w->dtype, w->cols(), w->row_bytes()};
}

}  // namespace

DeltaNetStepLaunch delta_net_step_launch(const Tensor& out, const Tensor& qkv, const Tensor& z, const Tensor& a,
                                         const Tensor& b, std::span<const Tensor> conv_states,
                                         std::span<const Tensor> delta_states, const DeltaNetStep& step) {
  const int64_t R = static_cast<int64_t>(conv_states.size());
  if (R == 0 || static_cast<int64_t>(delta_states.size()) != R)
    fail("{}: {} conv states and {} delta states (one of each per row)", kOp, R, delta_states.size());
  const Tensor& first = delta_states[0];
  if (first.ndim != 3) fail("{}: delta state {} is not [nV, dk, dv]", kOp, first.describe());
  const int64_t nV = first.dim(0), dk = first.dim(1), dv = first.dim(2);
  const int64_t C = qkv.ndim == 2 ? qkv.dim(1) : 0, qk_cols = C - nV * dv;
  if (dk <= 0 || qk_cols <= 0 || qk_cols % (2 * dk) != 0)
    fail("{}: qkv {} is not [{}, 2 nK x {} + {} x {}]", kOp, qkv.describe(), R, dk, nV, dv);
  const int64_t nK = qk_cols / (2 * dk);
  if (!step.conv_taps) fail("{}: no conv taps", kOp);
  const Tensor& taps = *step.conv_taps;
  if (taps.device != Device::cuda || !taps.is_contiguous() || taps.ndim != 2 || taps.rows() != C)
    fail("{}: conv taps {} must be [{}, K] and contiguous in GPU memory", kOp, taps.describe(), C);
  if (out.device != Device::cuda || out.dtype != DType::f32 || !out.is_contiguous() || out.ndim != 3 ||
      out.dim(0) != R || out.dim(1) != nV || out.dim(2) != dv)
    fail("{}: out {} must be contiguous f32 [{}, {}, {}] in GPU memory", kOp, out.describe(), R, nV, dv);

  DeltaNetStepLaunch launch;
  DeltaNetStepArgs& s = launch.args;
  s.out = static_cast<float*>(out.data);
  s.out_stride = nV * dv;
  s.qkv = static_cast<const float*>(qkv.data);
  s.qkv_stride = f32_row_stride(qkv, R, C, "qkv");
  s.z = static_cast<const float*>(z.data);
  s.z_stride = f32_row_stride(z, R, nV * dv, "z");
  s.a = static_cast<const float*>(a.data);
  s.a_stride = f32_row_stride(a, R, nV, "a");
  s.b = static_cast<const float*>(b.data);
  s.b_stride = f32_row_stride(b, R, nV, "b");
  s.conv_weight = taps.data;
  s.conv_type = taps.dtype;
  s.conv_row_bytes = taps.row_bytes();
  s.conv_kernel = static_cast<int>(taps.cols());
  s.a_log = weight_vector(step.a_log, nV, "A_log");
  s.dt_bias = weight_vector(step.dt_bias, nV, "dt_bias");
  s.norm = weight_vector(step.norm, dv, "the output norm's gain");
  for (int64_t i = 0; i < R; ++i) {
    const Tensor& conv = conv_states[static_cast<size_t>(i)];
    const int64_t stride = f32_row_stride(conv, taps.cols() - 1, C, "conv state");
    if (i > 0 && stride != s.conv_state_stride) fail("{}: conv state {} has another row stride than the first", kOp, i);
    s.conv_state_stride = stride;
    const Tensor& delta = delta_states[static_cast<size_t>(i)];
    if (delta.device != Device::cuda || delta.dtype != DType::f32 || !delta.is_contiguous() || delta.ndim != 3 ||
        delta.shape != first.shape)
      fail("{}: delta state {} {} must be contiguous f32 in GPU memory, shaped as the first {}", kOp, i,
           delta.describe(), first.describe());
    launch.states.push_back(conv.data);
  }
  for (const Tensor& delta : delta_states) launch.states.push_back(delta.data);
  if (R == 1) {
    s.conv_state = static_cast<float*>(conv_states[0].data);
    s.delta_state = static_cast<float*>(delta_states[0].data);
  }
  s.n_rows = R;
  s.n_k_heads = static_cast<int>(nK);
  s.n_v_heads = static_cast<int>(nV);
  s.dk = static_cast<int>(dk);
  s.dv = static_cast<int>(dv);
  s.q_scale = step.rule.q_scale;
  s.l2_eps = step.rule.l2_eps;
  s.norm_eps = step.norm_eps;
  // the states read and written, the rows read (qkv, z, a, b) and written
  launch.bytes = 8.0 * R * (static_cast<double>(first.numel()) + static_cast<double>(conv_states[0].numel())) +
                 4.0 * R * (C + 2.0 * nV * dv + 2.0 * nV) + static_cast<double>(taps.nbytes());
  return launch;
}

}  // namespace fl::cuda
