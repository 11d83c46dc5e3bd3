// make_backend: the one place that knows which backends this build has.
#include <charconv>

#include "backend/backend.h"
#include "core/error.h"
#ifdef FIRELINE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace fl {

std::unique_ptr<Backend> make_backend(std::string_view name) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cuda" || name.starts_with("cuda:")) {
#ifdef FIRELINE_HAVE_CUDA
    int index = 0;
    if (name.size() > 5) {
      auto [ptr, ec] = std::from_chars(name.data() + 5, name.data() + name.size(), index);
      if (ec != std::errc() || ptr != name.data() + name.size()) fail("backend '{}': expected cuda:N", name);
    }
    return make_cuda_backend(index);
#else
    fail("this fireline was built without CUDA (no nvcc at build time); use --backend cpu");
#endif
  }
  fail("unknown backend '{}' (available: cpu{})", name,
#ifdef FIRELINE_HAVE_CUDA
       ", cuda, cuda:N"
#else
       ""
#endif
  );
}

}  // namespace fl
