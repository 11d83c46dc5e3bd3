// The CUDA backend's host-side checks of an op's tensors (tensor_checks.h).
#include "backend/cuda/tensor_checks.h"

#include "core/error.h"

namespace fl::cuda {

F32Rows f32_rows(const Tensor& t, const char* op) {
  if (t.device != Device::cuda) fail("{}: tensor {} is not in GPU memory", op, t.describe());
  if (t.dtype != DType::f32) fail("{}: expected an f32 activation, got {}", op, t.describe());
  F32Rows r{static_cast<float*>(t.data), t.rows(), t.cols(), t.cols()};
  if (t.ndim >= 2) {
    if (t.stride[t.ndim - 1] != 4) fail("{}: innermost dimension of {} is not contiguous", op, t.describe());
    r.stride = t.stride[t.ndim - 2] / 4;
    for (int i = t.ndim - 3; i >= 0; --i)
      if (t.shape[i] > 1 && t.stride[i] != t.stride[i + 1] * t.shape[i + 1])
        fail("{}: the leading dimensions of {} cannot be folded into rows", op, t.describe());
  }
  return r;
}

void require_device(const Tensor& t, const char* op) {
  if (t.device != Device::cuda) fail("{}: tensor {} is not in GPU memory", op, t.describe());
}

F32Heads f32_heads(const Tensor& t, const char* op, const char* what) {
  require_device(t, op);
  if (t.dtype != DType::f32 || t.ndim != 3)
    fail("{}: {} must be f32 [tokens, heads, dim], got {}", op, what, t.describe());
  if (t.stride[2] != 4) fail("{}: innermost dimension of {} {} is not contiguous", op, what, t.describe());
  if (t.stride[0] % 4 || t.stride[1] % 4)
    fail("{}: {} {} has strides that are not whole floats", op, what, t.describe());
  return {static_cast<float*>(t.data), t.shape[0], t.shape[1], t.shape[2], t.stride[0] / 4, t.stride[1] / 4};
}

void same_shape(const F32Rows& a, const F32Rows& b, const char* op) {
  if (a.rows != b.rows || a.cols != b.cols)
    fail("{}: shape mismatch ({} x {} vs {} x {})", op, a.rows, a.cols, b.rows, b.cols);
}

void check_gain(const Tensor* weight, NormGain gain, int64_t cols, const char* op) {
  if (gain == NormGain::none) return;
  if (!weight || weight->numel() != cols) fail("{}: gain weight must have {} elements", op, cols);
  require_device(*weight, op);
}

void check_rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, const char* op) {
  if (x.ndim != 3 || !x.is_contiguous()) fail("{}: expected a contiguous x [T, heads, D], got {}", op, x.describe());
  f32_rows(x, op);
  require_device(positions, op);
  require_device(inv_freq, op);
  if (positions.dtype != DType::i32 || positions.numel() != x.dim(0))
    fail("{}: positions must be i32[{}]", op, x.dim(0));
  if (inv_freq.numel() * 2 > x.dim(2)) fail("{}: inv_freq must be f32[<= {}]", op, x.dim(2) / 2);
}

int64_t head_norm_parts(std::span<const HeadNorm> parts, const Tensor& positions, const Tensor& inv_freq,
                        HeadNormPart* out, const char* op) {
  if (parts.empty() || parts.size() > kMaxHeadNormParts)
    fail("{}: {} parts (1 to {})", op, parts.size(), kMaxHeadNormParts);
  const int64_t T = parts[0].x.ndim == 3 ? parts[0].x.dim(0) : -1;
  for (size_t i = 0; i < parts.size(); ++i) {
    const HeadNorm& p = parts[i];
    if (p.rope) {
      check_rope(p.x, positions, inv_freq, op);
    } else if (p.x.ndim != 3 || !p.x.is_contiguous()) {
      fail("{}: expected a contiguous x [T, heads, D], got {}", op, p.x.describe());
    } else {
      f32_rows(p.x, op);
    }
    if (p.x.dim(0) != T) fail("{}: part {} has {} tokens, part 0 has {}", op, i, p.x.dim(0), T);
    check_gain(p.weight, p.gain, p.x.dim(2), op);
    HeadNormPart& o = out[i];
    o.x = p.x.ptr<float>(), o.heads = p.x.dim(1), o.head_dim = p.x.dim(2);
    o.weight = gain_data(p.weight), o.weight_type = gain_dtype(p.weight), o.gain = static_cast<Gain>(p.gain);
    o.rope = p.rope;
    if (p.source) {
      const F32Heads s = f32_heads(*p.source, op, "a norm's source");
      if (s.tokens != p.x.dim(0) || s.heads != p.x.dim(1) || s.dim != p.x.dim(2))
        fail("{}: part {}'s source {} does not match {}", op, i, p.source->describe(), p.x.describe());
      o.src = s.data, o.src_token_stride = s.token_stride, o.src_head_stride = s.head_stride;
    }
  }
  return T;
}

void check_row_caches(std::span<const KvView> caches, const char* op) {
  const KvView& first = caches[0];
  for (size_t i = 0; i < caches.size(); ++i) {
    const KvView& c = caches[i];
    require_device(c.k, op);
    require_device(c.v, op);
    if (c.k.ndim != 3 || c.v.ndim != 3 || c.k.dtype != first.k.dtype || c.v.dtype != first.k.dtype ||
        c.v.dim(0) != first.k.dim(0) || c.v.dim(1) != first.k.dim(1) || c.v.dim(2) != first.k.dim(2) ||
        c.k.dim(0) != first.k.dim(0) || c.k.dim(1) != first.k.dim(1) || c.k.dim(2) != first.k.dim(2) ||
        c.k.stride[1] != first.k.stride[1] || c.v.stride[1] != first.k.stride[1] ||
        c.k.stride[0] != first.k.stride[0] || c.v.stride[0] != first.k.stride[0])
      fail("{}: cache {} of {} differs from the first ({} vs {})", op, i, caches.size(), c.k.describe(),
           first.k.describe());
  }
}

ResidualUpdateArgs residual_update_args(const Tensor& h, const ResidualUpdate& u) {
  F32Rows hr = f32_rows(h, "residual_update");
  ResidualUpdateArgs a;
  a.h = hr.data;
  a.h_stride = hr.stride;
  a.rows = hr.rows;
  a.cols = hr.cols;
  a.eps = u.eps;
  a.n_terms = static_cast<int>(u.terms.size());
  for (size_t i = 0; i < u.terms.size(); ++i) {
    const ResidualTerm& t = u.terms[i];
    F32Rows r = f32_rows(t.x, "residual_update");
    same_shape(hr, r, "residual_update");
    if (t.normed) check_gain(t.weight, t.gain, hr.cols, "residual_update");
    a.terms[i] = {r.data,
                  r.stride,
                  gain_data(t.weight),
                  gain_dtype(t.weight),
                  static_cast<Gain>(t.normed ? t.gain : NormGain::none),
                  t.normed};
  }
  if (u.merge_weight) {
    check_gain(u.merge_weight, u.merge_gain, hr.cols, "residual_update");
    a.merge = true;
    a.merge_weight = u.merge_weight->data;
    a.merge_type = u.merge_weight->dtype;
    a.merge_gain = static_cast<Gain>(u.merge_gain);
  }
  if (u.layer_scalar) {
    require_device(*u.layer_scalar, "residual_update");
    if (u.layer_scalar->numel() != 1)
      fail("residual_update: expected a 1-element layer scalar, got {}", u.layer_scalar->describe());
    a.scalar = u.layer_scalar->data;
    a.scalar_type = u.layer_scalar->dtype;
  }
  a.n_norms = static_cast<int>(u.norms.size());
  for (size_t i = 0; i < u.norms.size(); ++i) {
    const StreamNorm& n = u.norms[i];
    F32Rows r = f32_rows(n.out, "residual_update");
    same_shape(hr, r, "residual_update");
    check_gain(n.weight, n.gain, hr.cols, "residual_update");
    a.norms[i] = {r.data, r.stride, gain_data(n.weight), gain_dtype(n.weight), static_cast<Gain>(n.gain), n.scale};
  }
  return a;
}

}  // namespace fl::cuda
