#pragma once
// Batched decode (continuous batching) for any model whose forward stacks the rows of several
// sequences (SequenceRows): one new token for each sequence, all rows through every weight op at
// once. Model::forward_batch and forward_batch_sample of such a model are these two calls.
#include <functional>
#include <span>
#include <vector>

#include "model/model.h"
#include "model/scratch_arena.h"

namespace fl {

class BatchedDecode {
 public:
  // Throws when `ids` may not be appended to the sequence (context full, id out of range).
  using CheckStep = std::function<void(const Sequence&, std::span<const int32_t> ids)>;
  // The forward over device tensors ids [B] and positions [B], one row per part, scratch from
  // `arena` (not reset by it); returns the logits [B, vocab] in the arena.
  using RunRows = std::function<Tensor(ScratchArena& arena, std::span<const SequenceRows> parts, const Tensor& ids,
                                       const Tensor& positions)>;

  BatchedDecode(Backend& backend, ScratchArena& arena, CheckStep check, RunRows run)
      : backend_(backend), arena_(arena), check_(std::move(check)), run_(std::move(run)) {}

  // ids[i] appended to seqs[i]; the logits [seqs, vocab] on the host.
  std::vector<float> logits(std::span<Sequence* const> seqs, std::span<const int32_t> ids);
  // The same step, then each row sampled by specs[i] with backend.sample_rows: only the ids
  // ([seqs], -1 where every token is banned) cross to the host.
  std::vector<int32_t> sampled(std::span<Sequence* const> seqs, std::span<const int32_t> ids,
                               std::span<const SampleSpec> specs);

 private:
  struct Step {
    Tensor logits, sampled;
  };
  Step run(std::span<Sequence* const> seqs, std::span<const int32_t> ids);

  Backend& backend_;
  ScratchArena& arena_;
  CheckStep check_;
  RunRows run_;
};

}  // namespace fl
