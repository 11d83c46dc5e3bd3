// Communicator over NCCL (RCCL in HIP builds) for the ranks of a split model that run as threads
// of this process, one GPU each: the ranks' communicators come from one ncclCommInitAll, and
// rank r's all-reduce is enqueued on rank r's backend stream from rank r's thread.
//
// The library is loaded with dlopen when a split model is built, so that fireline builds and runs
// without it (CI has no NCCL, and nothing else needs it). Only the handful of entry points used
// here are declared, with the C types of nccl.h's stable ABI (enums are int-sized).
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_runtime.h"
#include "core/error.h"
#include "core/log.h"

namespace fl {
namespace {

struct NcclCommHandle;
using NcclComm = NcclCommHandle*;  // ncclComm_t
using NcclResult = int;            // ncclResult_t: 0 is ncclSuccess
constexpr int kNcclFloat32 = 7;    // ncclDataType_t ncclFloat32
constexpr int kNcclSum = 0;        // ncclRedOp_t ncclSum

struct NcclApi {
  NcclResult (*get_version)(int*) = nullptr;
  NcclResult (*comm_init_all)(NcclComm*, int, const int*) = nullptr;
  NcclResult (*all_reduce)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t) = nullptr;
  NcclResult (*comm_destroy)(NcclComm) = nullptr;
  NcclResult (*comm_abort)(NcclComm) = nullptr;
  const char* (*error_string)(NcclResult) = nullptr;

  std::string describe(NcclResult r) const { return error_string ? error_string(r) : fmt::format("error {}", r); }
};

// Loads `library` (the dynamic loader's search: LD_LIBRARY_PATH, then the system's paths). The
// handle is never closed: NCCL keeps threads of its own.
NcclApi load_nccl(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    fail("--tp on GPUs needs {} (NCCL, e.g. from the libnccl2 package or a PyTorch install) where the dynamic "
         "loader finds it (LD_LIBRARY_PATH): {}",
         library, dlerror());
  NcclApi api;
  auto bind = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, symbol));
    if (!fn) {
      dlclose(handle);
      fail("{} has no {}: not an NCCL library?", library, symbol);
    }
  };
  bind(api.get_version, "ncclGetVersion");
  bind(api.comm_init_all, "ncclCommInitAll");
  bind(api.all_reduce, "ncclAllReduce");
  bind(api.comm_destroy, "ncclCommDestroy");
  bind(api.comm_abort, "ncclCommAbort");
  bind(api.error_string, "ncclGetErrorString");
  return api;
}

// The ranks' communicators, shared by their NcclCommunicator objects. abort() aborts all of them
// (a rank stuck in a collective waits on its peers' kernels, which only their abort ends).
//
// NCCL takes no two calls on one communicator at once, so rank r's enqueue and an abort of comm r
// (from a failing rank's thread) hold rank r's lock. That is safe because an enqueue never waits
// for the other ranks on the host: the connections are made when the group is set up
// (NCCL_RUNTIME_CONNECT=0), not lazily by the first collective, so a rank's first call cannot
// block inside the lock until a peer's arrives.
struct NcclGroup {
  NcclApi api;
  std::vector<NcclComm> comms;
  std::vector<std::unique_ptr<std::mutex>> rank_mutex;  // comms[r] against abort()
  std::mutex broken_mutex;
  std::string broken;  // non-empty once aborted: why

  ~NcclGroup() {
    for (NcclComm c : comms)
      if (c) api.comm_destroy(c);
  }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclGroup> group, int rank, Backend& backend)
      : group_(std::move(group)),
        rank_(rank),
        backend_(&backend),
        stream_(static_cast<cudaStream_t>(cuda_stream_of(backend))) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_->comms.size()); }

  // Enqueued on this rank's stream, in place; NCCL's ring and tree both hand every rank the same
  // bits of each reduced chunk. Only this rank's tensor can be checked here (NCCL compares
  // nothing): a rank that throws aborts the group through the split model.
  void all_reduce_sum(Tensor& t) override {
    if (t.dtype != DType::f32 || t.device != Device::cuda || !t.is_contiguous())
      fail("all_reduce_sum on rank {}: {} must be contiguous f32 in GPU memory", rank_, t.describe());
    std::lock_guard lock(*group_->rank_mutex[static_cast<size_t>(rank_)]);
    NcclComm comm = group_->comms[static_cast<size_t>(rank_)];
    if (!comm) {  // aborted
      std::lock_guard broken_lock(group_->broken_mutex);
      fail("{}", group_->broken);
    }
    cuda_note_foreign_write(*backend_);  // (t changes under any pieces cut from it)
    const NcclResult r =
        group_->api.all_reduce(t.data, t.data, static_cast<size_t>(t.numel()), kNcclFloat32, kNcclSum, comm, stream_);
    if (r != 0) fail("NCCL all-reduce on rank {}: {}", rank_, group_->api.describe(r));
  }

  void abort(const std::string& why) override {
    {
      std::lock_guard lock(group_->broken_mutex);
      if (!group_->broken.empty()) return;
      group_->broken = why.empty() ? "the rank group was aborted" : why;
    }
    for (size_t r = 0; r < group_->comms.size(); ++r) {
      std::lock_guard lock(*group_->rank_mutex[r]);
      if (group_->comms[r]) group_->api.comm_abort(group_->comms[r]);
      group_->comms[r] = nullptr;
    }
  }

 private:
  std::shared_ptr<NcclGroup> group_;
  int rank_;
  Backend* backend_;
  cudaStream_t stream_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<Backend* const> backends,
                                                                   const NcclOptions& options) {
  if (backends.empty()) fail("make_nccl_communicators: no ranks");
#ifdef FIRELINE_GPU_HIP
  const std::string library = options.library.empty() ? "librccl.so.1" : options.library;
#else
  const std::string library = options.library.empty() ? "libnccl.so.2" : options.library;
#endif
  auto group = std::make_shared<NcclGroup>();
  group->api = load_nccl(library);
  std::vector<int> devices;
  for (Backend* b : backends) {
    const int device = cuda_device_index(*b);
    for (int d : devices)
      if (d == device) fail("--tp: two ranks on GPU {} (NCCL takes one rank per GPU)", device);
    devices.push_back(device);
  }
  int version = 0;
  group->api.get_version(&version);
  // NVLink SHARP multicast (NVLS) stays off: it reserves memory per communicator and the machines
  // this runs on lend it unreliably; rings and trees over NVLink are what fireline measures.
  // NCCL reads its settings from the environment only.
  if (options.disable_nvls) setenv("NCCL_NVLS_ENABLE", "0", 1);
  // Every connection made at setup, none by a first collective (see NcclGroup).
  setenv("NCCL_RUNTIME_CONNECT", "0", 1);
  group->comms.assign(devices.size(), nullptr);
  for (size_t i = 0; i < devices.size(); ++i) group->rank_mutex.push_back(std::make_unique<std::mutex>());
  const NcclResult r = group->api.comm_init_all(group->comms.data(), static_cast<int>(devices.size()), devices.data());
  if (r != 0) {
    std::fill(group->comms.begin(), group->comms.end(), nullptr);  // nothing to destroy after a failed init
    fail("NCCL {} could not set up {} ranks: {}", version, devices.size(), group->api.describe(r));
  }
  log_debug("NCCL {} ({}): {} ranks", version, library, devices.size());
  std::vector<std::unique_ptr<Communicator>> comms;
  for (size_t i = 0; i < devices.size(); ++i)
    comms.push_back(std::make_unique<NcclCommunicator>(group, static_cast<int>(i), *backends[i]));
  return comms;
}

}  // namespace fl
