// make_backend: the one place that knows which backends this build has.
#include <charconv>

#include <fmt/format.h>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "core/error.h"
#ifdef FIRELINE_HAVE_GPU
#include "backend/cuda/cuda_backend.h"
#endif

namespace fl {

namespace {

// "cuda" / "cuda:N" name the GPU backend in every GPU build; a HIP build also answers to "hip".
#ifdef FIRELINE_GPU_HIP
constexpr std::string_view kGpuNames[] = {"cuda", "hip"};
constexpr const char* kGpuList = ", hip, hip:N (also cuda, cuda:N)";
#else
constexpr std::string_view kGpuNames[] = {"cuda"};
constexpr const char* kGpuList = ", cuda, cuda:N";
#endif

}  // namespace

std::string_view tensor_core_precision_name(TensorCorePrecision precision) {
  return precision == TensorCorePrecision::bf16 ? "bf16" : "f32";
}

TensorCorePrecision parse_tensor_core_precision(std::string_view name) {
  if (name == "f32") return TensorCorePrecision::f32;
  if (name == "bf16") return TensorCorePrecision::bf16;
  fail("precision '{}' is not one of f32, bf16", name);
}

namespace {
constexpr std::string_view kExpertMatvecShapes[] = {"4x2", "2x4", "4x3", "4x4", "8x2", "8x3"};
}  // namespace

BackendOptions::ExpertMatvecShape parse_expert_matvec_shape(std::string_view name) {
  if (name == "plain") return {0, 0};
  if (name == "auto") return {-1, 0};
  for (std::string_view shape : kExpertMatvecShapes)
    if (name == shape) return {shape[0] - '0', shape[2] - '0'};
  fail("expert matvec shape '{}' is not one of plain, auto, 4x2, 2x4, 4x3, 4x4, 8x2, 8x3", name);
}

std::string expert_matvec_shape_name(BackendOptions::ExpertMatvecShape shape) {
  if (shape.rows == 0) return "plain";
  if (shape.rows < 0) return "auto";
  return fmt::format("{}x{}", shape.rows, shape.steps);
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options) {
  if (name == "cpu") return make_cpu_backend();
  for (std::string_view gpu : kGpuNames) {
    if (name != gpu && !(name.starts_with(gpu) && name.size() > gpu.size() && name[gpu.size()] == ':')) continue;
#ifdef FIRELINE_HAVE_GPU
    int index = 0;
    if (name.size() > gpu.size()) {
      auto [ptr, ec] = std::from_chars(name.data() + gpu.size() + 1, name.data() + name.size(), index);
      if (ec != std::errc() || ptr != name.data() + name.size()) fail("backend '{}': expected {}:N", name, gpu);
    }
    return make_cuda_backend(index, options);
#else
    (void)options;
    fail("this fireline was built without a GPU backend (no nvcc at build time); use --backend cpu");
#endif
  }
  fail("unknown backend '{}' (available: cpu{})", name,
#ifdef FIRELINE_HAVE_GPU
       kGpuList
#else
       ""
#endif
  );
}

int gpu_device_count() {
#ifdef FIRELINE_HAVE_GPU
  return cuda_device_count();
#else
  return 0;
#endif
}

std::vector<std::unique_ptr<Communicator>> make_rank_communicators(std::span<Backend* const> backends) {
  if (backends.empty()) fail("a split model needs at least one rank");
  const Device device = backends[0]->device();
  for (Backend* b : backends)
    if (b->device() != device) fail("the ranks of a split model must all run on the CPU or all on GPUs");
  if (device == Device::cpu) return make_thread_communicators(static_cast<int>(backends.size()));
#ifdef FIRELINE_HAVE_GPU
  return make_nccl_communicators(backends);
#else
  fail("this fireline was built without a GPU backend");
#endif
}

}  // namespace fl
