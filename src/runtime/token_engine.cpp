#include "runtime/token_engine.h"

#include <algorithm>

#include "core/error.h"

namespace fl {

TokenEngine::TokenEngine(Model& model, EngineOptions options) : model_(model), options_(options) {
  if (options_.context <= 0) fail("the context must hold at least one token, not {}", options_.context);
  if (options_.prefill_chunk <= 0) fail("the prefill chunk must be at least one token, not {}", options_.prefill_chunk);
  // The KV cache is allocated once, here (it is part of loading, not of a request's latency).
  seq_ = model_.new_sequence({options_.context, options_.kv_dtype, /*sliding_ring=*/true});
}

TokenEngine::~TokenEngine() = default;

void TokenEngine::reset() {
  graph_.reset();  // it captured the sequence's old state
  model_.reset_sequence(*seq_);  // position 0, recurrent states zeroed
  tokens_.clear();
  logits_.clear();
}

bool TokenEngine::prefill(std::span<const int32_t> prompt, const std::atomic<bool>* cancel) {
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n == 0) fail("the prompt has no tokens");
  if (n > options_.context)
    fail("the prompt is {} tokens but the context holds {}; shorten the prompt or use a larger context", n,
         options_.context);

  // Reuse the cached tokens when the prompt extends them (at least one new token is needed for
  // fresh logits); otherwise start over. The old sequence is freed before a new one is allocated.
  graph_.reset();
  const bool extends = n > n_past() && std::equal(tokens_.begin(), tokens_.end(), prompt.begin());
  if (!extends) reset();
  reused_ = n_past();

  try {
    for (int64_t start = n_past(); start < n; start += options_.prefill_chunk) {
      if (cancel && cancel->load(std::memory_order_relaxed)) {
        reset();
        return false;
      }
      const int64_t len = std::min(options_.prefill_chunk, n - start);
      std::span<const int32_t> chunk = prompt.subspan(static_cast<size_t>(start), static_cast<size_t>(len));
      logits_ = model_.forward(*seq_, chunk, LogitsMode::last);
      tokens_.insert(tokens_.end(), chunk.begin(), chunk.end());
    }
  } catch (...) {
    reset();  // the sequence may hold part of a chunk: never reuse it
    throw;
  }
  return true;
}

void TokenEngine::append(int32_t token) { step(token, nullptr); }

int32_t TokenEngine::append_and_sample(int32_t token, const SampleSpec& spec) { return step(token, &spec); }

int32_t TokenEngine::step(int32_t token, const SampleSpec* spec) {
  if (tokens_.empty()) fail("append: no prompt has been run");
  if (full()) fail("append: the context of {} tokens is full", options_.context);
  int32_t next = -1;
  bool sampled = false;
  try {
    logits_.clear();
    if (options_.decode_graph) {
      if (!graph_) graph_ = model_.make_decode_graph(*seq_);
      if (spec) {
        next = graph_->step_sample(token, *spec);
        sampled = true;
      } else {
        logits_ = graph_->step(token);
      }
    } else {
      logits_ = model_.forward(*seq_, std::span<const int32_t>(&token, 1), LogitsMode::last);
    }
  } catch (...) {  // a failed step leaves the sequence unknown: start over next time
    reset();
    throw;
  }
  tokens_.push_back(token);
  // A sampling error (every token banned) leaves the sequence as it is, on either path.
  if (spec && !sampled) {  // the eager path: sample the host logits (the same chain)
    std::vector<float> logits = logits_;
    next = sample_logits_reference(logits, *spec);
  }
  if (spec && next < 0) fail("sampler: every token is banned");
  return next;
}

}  // namespace fl
