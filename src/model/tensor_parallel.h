#pragma once
// A model split over N devices with --tp (issue 10), one thread per rank in this process: rank r
// runs its part of the model (make_rank_model on its shards, model/rank_source.h: Gemma 4 or
// Qwen3.5) on its own backend and thread, and the ranks add up their partial sums through their
// communicators.
// The result is an ordinary Model: every call runs on all ranks at once and answers with rank 0's
// result, which every rank shares bit for bit. Input the ranks would refuse is refused before
// they start. With --ep, a rank runs only its own experts' pairs (moe_keep_experts marks the
// others -1, which moe_experts skips). A rank that fails aborts the
// communicators, so the others stop waiting and the call throws the first rank's error; the model
// is unusable after that (as a device error leaves a single-device model).
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/communicator.h"
#include "model/model.h"
#include "model/parallel_plan.h"

namespace fl {

// backends[r] and comms[r] belong to rank r (backends.size() == comms.size() == ranks); `whole`
// must outlive the model. Each rank's memory plan for `load` is checked against its device.
// Throws when the model cannot be split that way (plan_gemma4_parallel's reasons) or a rank's
// part does not fit. With options.expert_parallel the experts are dealt out too (a third
// all-reduce per layer, after the expert block).
std::unique_ptr<Model> make_tensor_parallel_model(const ModelSource& whole, const ParallelOptions& options,
                                                  const LoadOptions& load,
                                                  std::vector<std::unique_ptr<Backend>> backends,
                                                  std::vector<std::unique_ptr<Communicator>> comms);

// The split the command line asks for (--tp N, --ep), after check_tensor_parallel_flags gave
// `ranks_backend`: N CPU backends with thread communicators ("cpu"), or GPUs 0 .. N-1 with NCCL
// ("cuda"), each made with `backend_options`. The one place that picks the ranks' backends and
// transport.
std::unique_ptr<Model> make_command_line_split_model(const ModelSource& whole, const ParallelOptions& options,
                                                     const LoadOptions& load, std::string_view ranks_backend,
                                                     const BackendOptions& backend_options = {});
// Rank r's make_backend name: "cpu", or GPU r ("cuda:r").
std::string rank_backend_name(std::string_view ranks_backend, int rank);
// Its backends, for messages: "cpu x 2 (--tp 2 --ep)", "cuda x 4 (--tp 4, NCCL)".
std::string command_line_split_name(const ParallelOptions& options, std::string_view ranks_backend);

// The command-line check of --tp N / --ep on `backend` (a make_backend name, empty for the
// default), returning where the ranks run: "cpu", or "cuda" (one GPU per rank, GPUs 0 .. N-1).
// No backend named: GPUs when the machine has N of them, else the CPU; GPUs named: the machine
// must have N. --ep needs N >= 2; a GPU index ("cuda:1") is refused (the ranks take GPUs 0 ..
// N-1).
std::string check_tensor_parallel_flags(int ranks, bool expert_parallel, std::string_view backend);

}  // namespace fl
