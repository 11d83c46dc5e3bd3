#include "model/tensor_parallel.h"

#include <fmt/format.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

#include "core/error.h"
#include "core/log.h"
#include "model/parallel_plan.h"
#include "model/rank_source.h"
#include "model/weight_loader.h"

namespace fl {
namespace {

// One thread per rank: run(body) runs body(r) on every rank's thread at once and returns when
// all have (one call at a time, as with any Model). Each rank's backend is thus only ever used
// from its own thread, whichever thread calls the model. The first rank to fail aborts its
// communicator (freeing ranks that wait for it in a collective), run then throws that rank's
// error, and every later run is refused.
class RankThreads {
 public:
  RankThreads(std::vector<Communicator*> comms, std::vector<Backend*> backends)
      : comms_(std::move(comms)), backends_(std::move(backends)) {
    for (int r = 0; r < static_cast<int>(comms_.size()); ++r) workers_.emplace_back([this, r] { work(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    start_.notify_all();
    for (auto& t : workers_) t.join();
  }
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  // body(r) on every rank, returning rank 0's result (the ranks compute the same logits and tokens).
  template <typename Body>
  auto run_for_rank0(Body body) {
    decltype(body(0)) first{};
    run([&](int r) {
      auto mine = body(r);
      if (r == 0) first = std::move(mine);
    });
    return first;
  }

  // `release`: the model's teardown, which runs on each rank's thread even after a failure.
  void run(const std::function<void(int rank)>& body, bool release = false) {
    std::unique_lock lock(mutex_);
    // After a rank failed the group is aborted for good, and a captured decode graph would replay
    // the GPU ranks' collectives on aborted communicators (a replay calls no Communicator): every
    // later call is refused here, before any rank runs.
    if (!stopped_.empty() && !release) fail("the split model stopped after a failure ({}); load it again", stopped_);
    body_ = &body;
    pending_ = static_cast<int>(workers_.size());
    failure_.clear();
    ++job_;
    start_.notify_all();
    done_.wait(lock, [&] { return pending_ == 0; });
    body_ = nullptr;
    if (!failure_.empty()) fail("{}", failure_);
  }

 private:
  void execute(int rank) {
    std::string error;
    try {
      backends_[static_cast<size_t>(rank)]->bind_to_this_thread();  // a GPU rank's device, on this thread
      (*body_)(rank);
      return;
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "an unknown exception";
    }
    const std::string why = fmt::format("rank {} failed: {}", rank, error);
    {
      std::lock_guard lock(mutex_);
      if (failure_.empty()) failure_ = comms_.size() > 1 ? fmt::format("rank {}: {}", rank, error) : error;
      if (stopped_.empty()) stopped_ = why;
    }
    comms_[static_cast<size_t>(rank)]->abort(why);
  }

  void work(int rank) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        start_.wait(lock, [&] { return stop_ || job_ != seen; });
        if (stop_) return;
        seen = job_;
      }
      execute(rank);
      std::lock_guard lock(mutex_);
      if (--pending_ == 0) done_.notify_all();
    }
  }

  std::vector<Communicator*> comms_;
  std::vector<Backend*> backends_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(int)>* body_ = nullptr;
  uint64_t job_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::string failure_;
  std::string stopped_;  // the first rank failure: every later run() is refused
};

struct Rank {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Model> model;
};

// The steps of every rank's graph, run together; the sequence's position follows rank 0's.
class TensorParallelDecode final : public DecodeGraph {
 public:
  TensorParallelDecode(RankThreads& threads, std::vector<std::unique_ptr<DecodeGraph>> graphs, Sequence& seq, int vocab)
      : threads_(threads), graphs_(std::move(graphs)), seq_(seq), vocab_(vocab) {}

  std::vector<float> step(int32_t token) override {
    return step_ranks(token, [&](DecodeGraph& g) { return g.step(token); });
  }
  int32_t step_sample(int32_t token, const SampleSpec& spec) override {
    return step_ranks(token, [&](DecodeGraph& g) { return g.step_sample(token, spec); });
  }
  bool captured() const override { return graphs_[0]->captured(); }

 private:
  // What the ranks would refuse, refused before they start (a refusal inside a rank aborts the
  // communicators, which is for faults, not for bad input).
  void check(int32_t token) const { check_step_ids(seq_, std::span<const int32_t>(&token, 1), vocab_); }

  // One step of every rank's graph from the caller's position (the caller may have moved it);
  // rank 0's result and position.
  template <typename Step>
  auto step_ranks(int32_t token, Step step) -> std::invoke_result_t<Step, DecodeGraph&> {
    check(token);
    auto result = threads_.run_for_rank0([&](int r) {
      seq_.rank_parts[static_cast<size_t>(r)]->n_past = seq_.n_past;
      return step(*graphs_[static_cast<size_t>(r)]);
    });
    seq_.n_past = seq_.rank_parts[0]->n_past;
    return result;
  }

  RankThreads& threads_;
  std::vector<std::unique_ptr<DecodeGraph>> graphs_;
  Sequence& seq_;
  int vocab_;
};

class TensorParallelModel final : public Model {
 public:
  TensorParallelModel(const ModelSource& whole, const ParallelOptions& options, const LoadOptions& load,
                      std::vector<std::unique_ptr<Backend>> backends, std::vector<std::unique_ptr<Communicator>> comms)
      : config_(whole.config()) {
    const int N = options.tensor_parallel;
    if (static_cast<int>(backends.size()) != N || static_cast<int>(comms.size()) != N)
      fail("--tp {}: {} backends and {} communicators", N, backends.size(), comms.size());
    if (options.expert_parallel && !has_routed_experts(whole.config()))
      fail("--ep: {} has no mixture-of-experts block to deal out", whole.path());
    if (!find_weight_prefix(whole, "embed_tokens.weight"))
      fail("{}: no embed_tokens.weight under any known prefix", whole.path());
    const ParallelPlan plan = plan_model_parallel(whole.config(), options, source_weight_formats(whole));
    std::vector<std::unique_ptr<ModelSource>> sources;
    std::vector<Communicator*> comm_of;
    std::vector<Backend*> backend_of;
    for (int r = 0; r < N; ++r) {
      sources.push_back(make_rank_source(whole, plan, r));  // cut here: `whole` is read on this thread only
      if (auto free_bytes = backends[r]->free_memory()) {
        const MemoryPlan need = plan_model_memory(*sources.back(), load);
        const double allocated = need.allocated_on(backends[r]->device());
        if (allocated > static_cast<double>(*free_bytes))
          fail(
              "{}: rank {} needs {:.2f} GiB (weights {:.2f}{}, KV {:.2f}, scratch {:.2f}) but its {} device has {:.2f} "
              "GiB free",
              whole.path(), r, allocated / 1073741824.0, need.weights / 1073741824.0,
              backends[r]->device() == Device::cpu ? " in the mapped file, not counted" : "", need.kv / 1073741824.0,
              need.scratch / 1073741824.0, backends[r]->name(), static_cast<double>(*free_bytes) / 1073741824.0);
      }
      comm_of.push_back(comms[r].get());
      backend_of.push_back(backends[r].get());
      ranks_.push_back({std::move(backends[r]), std::move(comms[r]), nullptr});
    }
    threads_ = std::make_unique<RankThreads>(comm_of, backend_of);
    // Each rank's model is built on its own thread, as every later call to its backend is made.
    threads_->run([&](int r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.model = make_rank_model(std::move(sources[static_cast<size_t>(r)]), *rank.backend, *rank.comm);
    });
    vocab_ = ranks_[0].model->vocab_size();
  }

  ~TensorParallelModel() override {
    // Each rank's model and backend go on the thread that made and used them (a GPU backend's
    // calls belong to its own thread), then the threads.
    try {
      threads_->run(
          [&](int r) {
            ranks_[static_cast<size_t>(r)].model.reset();
            ranks_[static_cast<size_t>(r)].backend.reset();
          },
          /*release=*/true);
    } catch (const std::exception& e) {
      log_warn("tensor parallel: releasing a rank failed: {}", e.what());
    }
    threads_.reset();
  }

  const ModelConfig& config() const override { return config_; }
  int vocab_size() const override { return vocab_; }

  std::unique_ptr<Sequence> new_sequence(const SequenceOptions& options) override {
    check_sequence_options(options);  // what the ranks would refuse, refused here first
    auto seq = std::make_unique<Sequence>();
    seq->max_seq = options.max_seq;
    seq->rank_parts.resize(ranks_.size());
    threads_->run([&](int r) {
      seq->rank_parts[static_cast<size_t>(r)] = ranks_[static_cast<size_t>(r)].model->new_sequence(options);
    });
    for (const auto& part : seq->rank_parts) seq->kv_bytes += part->kv_bytes;
    return seq;
  }

  std::vector<float> forward(Sequence& seq, std::span<const int32_t> ids, LogitsMode mode) override {
    check_step(seq, ids);
    std::vector<float> logits = threads_->run_for_rank0([&](int r) {
      Sequence& part = *seq.rank_parts[static_cast<size_t>(r)];
      part.n_past = seq.n_past;
      return ranks_[static_cast<size_t>(r)].model->forward(part, ids, mode);
    });
    seq.n_past += static_cast<int64_t>(ids.size());
    return logits;
  }

  std::vector<float> forward_batch(std::span<Sequence* const> seqs, std::span<const int32_t> ids) override {
    return run_batch(seqs, ids,
                     [&](Model& m, std::span<Sequence* const> parts) { return m.forward_batch(parts, ids); });
  }

  std::vector<int32_t> forward_batch_sample(std::span<Sequence* const> seqs, std::span<const int32_t> ids,
                                            std::span<const SampleSpec> specs) override {
    if (specs.size() != seqs.size())
      fail("forward_batch_sample: {} sequences but {} sampling specs", seqs.size(), specs.size());
    return run_batch(seqs, ids, [&](Model& m, std::span<Sequence* const> parts) {
      return m.forward_batch_sample(parts, ids, specs);
    });
  }

  void copy_sequence(const Sequence& src, Sequence& dst) override {
    check_ours(src);
    check_ours(dst);
    if (&src == &dst) return;
    check_sequence_copy(src, dst);  // refused here, not inside a rank (which would stop the model)
    for (size_t i = 0; i < ranks_.size(); ++i) check_sequence_copy(*src.rank_parts[i], *dst.rank_parts[i]);
    threads_->run([&](int r) {
      const auto i = static_cast<size_t>(r);
      ranks_[i].model->copy_sequence(*src.rank_parts[i], *dst.rank_parts[i]);
    });
    dst.n_past = src.n_past;
  }

  void reset_sequence(Sequence& seq) override {
    check_ours(seq);
    threads_->run(
        [&](int r) { ranks_[static_cast<size_t>(r)].model->reset_sequence(*seq.rank_parts[static_cast<size_t>(r)]); });
    seq.n_past = 0;
  }

  // Per device: every rank moves about this much (its heads, its MLP slice, the replicated rest).
  DecodeTraffic decode_traffic(int64_t context, DType kv_dtype) const override {
    return ranks_[0].model->decode_traffic(context, kv_dtype);
  }

  std::unique_ptr<DecodeGraph> make_decode_graph(Sequence& seq) override {
    check_ours(seq);
    std::vector<std::unique_ptr<DecodeGraph>> graphs(ranks_.size());
    threads_->run([&](int r) {
      Sequence& part = *seq.rank_parts[static_cast<size_t>(r)];
      part.n_past = seq.n_past;
      graphs[static_cast<size_t>(r)] = ranks_[static_cast<size_t>(r)].model->make_decode_graph(part);
    });
    return std::make_unique<TensorParallelDecode>(*threads_, std::move(graphs), seq, vocab_);
  }

 private:
  void check_ours(const Sequence& seq) const {
    if (seq.rank_parts.size() != ranks_.size()) fail("this sequence was not made by this {}-rank model", ranks_.size());
  }

  // What the ranks would refuse, refused before they start (a refusal inside a rank aborts the
  // communicators, which is for faults, not for bad input).
  void check_step(const Sequence& seq, std::span<const int32_t> ids) const {
    check_ours(seq);
    check_step_ids(seq, ids, vocab_);
  }

  // call(rank's model, rank's parts of seqs) on every rank; rank 0's result.
  template <typename Call>
  auto run_batch(std::span<Sequence* const> seqs, std::span<const int32_t> ids, Call call)
      -> std::invoke_result_t<Call, Model&, std::span<Sequence* const>> {
    if (seqs.empty() || seqs.size() != ids.size())
      fail("forward_batch: {} sequences but {} token ids", seqs.size(), ids.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      check_step(*seqs[i], ids.subspan(i, 1));
      for (size_t j = 0; j < i; ++j)
        if (seqs[j] == seqs[i]) fail("forward_batch: a sequence appears twice in one batch");
    }
    auto result = threads_->run_for_rank0([&](int r) {
      std::vector<Sequence*> parts;
      for (Sequence* s : seqs) {
        Sequence& part = *s->rank_parts[static_cast<size_t>(r)];
        part.n_past = s->n_past;
        parts.push_back(&part);
      }
      return call(*ranks_[static_cast<size_t>(r)].model, parts);
    });
    for (Sequence* s : seqs) s->n_past += 1;
    return result;
  }

  ModelConfig config_;
  std::vector<Rank> ranks_;
  std::unique_ptr<RankThreads> threads_;
  int vocab_ = 0;
};

}  // namespace

std::unique_ptr<Model> make_command_line_split_model(const ModelSource& whole, const ParallelOptions& options,
                                                     const LoadOptions& load, std::string_view ranks_backend,
                                                     const BackendOptions& backend_options) {
  const int N = options.tensor_parallel;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<Backend*> ranks;
  for (int r = 0; r < N; ++r) {
    backends.push_back(make_backend(rank_backend_name(ranks_backend, r), backend_options));
    ranks.push_back(backends.back().get());
  }
  auto comms = make_rank_communicators(ranks);
  return make_tensor_parallel_model(whole, options, load, std::move(backends), std::move(comms));
}

std::string rank_backend_name(std::string_view ranks_backend, int rank) {
  return ranks_backend == "cpu" ? std::string("cpu") : fmt::format("{}:{}", ranks_backend, rank);
}

std::string command_line_split_name(const ParallelOptions& options, std::string_view ranks_backend) {
  return fmt::format("{} x {} (--tp {}{}{})", ranks_backend, options.tensor_parallel, options.tensor_parallel,
                     options.expert_parallel ? " --ep" : "", ranks_backend == "cpu" ? "" : ", NCCL");
}

std::string check_tensor_parallel_flags(int ranks, bool expert_parallel, std::string_view backend) {
  if (expert_parallel && ranks < 2) fail("--ep deals the experts out over the ranks of --tp N (N >= 2)");
  if (ranks <= 1) return std::string(backend);
  std::string where(backend);
  if (where.empty()) {
    where = gpu_device_count() >= ranks ? "cuda" : "cpu";
    log_debug("--tp {}: the ranks run on {}", ranks,
              where == "cpu" ? fmt::format("the CPU ({} GPUs here)", gpu_device_count())
                             : "GPUs 0.." + std::to_string(ranks - 1));
  }
  if (where.find(':') != std::string::npos)
    fail("--tp {} --backend {}: the ranks take GPUs 0 .. {}; name the backend without an index", ranks, where,
         ranks - 1);
  if (where != "cpu" && gpu_device_count() < ranks)
    fail("--tp {} on GPUs needs {} of them (one rank each); this machine has {}", ranks, ranks, gpu_device_count());
  return where;
}

std::unique_ptr<Model> make_tensor_parallel_model(const ModelSource& whole, const ParallelOptions& options,
                                                  const LoadOptions& load,
                                                  std::vector<std::unique_ptr<Backend>> backends,
                                                  std::vector<std::unique_ptr<Communicator>> comms) {
  return std::make_unique<TensorParallelModel>(whole, options, load, std::move(backends), std::move(comms));
}

}  // namespace fl
