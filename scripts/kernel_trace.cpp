// A CUDA injection library for scripts/step-timeline: the driver loads it at cuInit
// (CUDA_INJECTION64_PATH) and calls InitializeInjection, which turns on CUPTI's kernel activity
// records (each kernel's start and end on the GPU, graph nodes included, neighbours free to
// overlap); at exit every record goes to the CSV named by KERNEL_TRACE_OUT as
//   start_ns,end_ns,stream,name
// Built on the GPU machine by step-timeline against its toolkit's CUPTI (not part of the build:
// Debian's CI has no CUPTI, and the engine never links it).
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>

namespace {

FILE* g_out = nullptr;
constexpr size_t kBufferBytes = size_t{16} << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  while (g_out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    const char* name = k->name ? k->name : "?";
    int status = 0;
    char* readable = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::fprintf(g_out, "%llu,%llu,%u,\"%s\"\n", static_cast<unsigned long long>(k->start),
                 static_cast<unsigned long long>(k->end), k->streamId, status == 0 && readable ? readable : name);
    std::free(readable);
  }
  // A step that lost a kernel falls out of step-timeline's count of steps: say so.
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS && dropped > 0)
    std::fprintf(stderr, "kernel_trace: CUPTI dropped %zu kernel records\n", dropped);
  std::free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(1);
  if (g_out) std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection() {
  const char* path = std::getenv("KERNEL_TRACE_OUT");
  g_out = std::fopen(path ? path : "kernel-trace.csv", "w");
  if (!g_out) return 0;
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI refused the kernel activity records\n");
    return 0;
  }
  std::atexit(flush_at_exit);
  return 1;
}
