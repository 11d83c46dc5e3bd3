#pragma once
// A DecodeGraph for any model whose forward can run as device ops only (no host copies or
// synchronisation inside): step 1 runs eagerly (sizing the scratch arena and the backend's
// workspace), step 2 captures the forward and replays it, later steps only write the token id
// and position into device memory and replay. Results are byte-identical to eager decode.
#include <functional>
#include <memory>
#include <span>

#include "model/model.h"
#include "model/scratch_arena.h"

namespace fl {

class ReplayedDecode final : public DecodeGraph {
 public:
  // Throws when `ids` may not be appended to the sequence (context full, id out of range).
  using CheckStep = std::function<void(const Sequence&, std::span<const int32_t> ids)>;
  // The forward over device tensors ids [1] and positions [1], scratch from `arena` (not reset
  // by it); returns the logits [1, vocab] in the arena.
  using Run = std::function<Tensor(ScratchArena& arena, Sequence& seq, const Tensor& ids, const Tensor& positions)>;

  ReplayedDecode(Backend& backend, Sequence& seq, CheckStep check, Run run);

  std::vector<float> step(int32_t token) override;
  int32_t step_sample(int32_t token, const SampleSpec& spec) override;  // samples with backend.sample
  bool captured() const override { return graph_ != nullptr; }

 private:
  void advance(int32_t token);  // runs (or replays) the step; the logits stay in logits_

  Backend& backend_;
  Sequence& seq_;
  CheckStep check_;
  Run run_;
  ScratchArena arena_;
  std::unique_ptr<DeviceBuffer> inputs_;
  Tensor id_, position_, chosen_, logits_;
  std::unique_ptr<CapturedSteps> graph_;
  int64_t steps_ = 0;
};

}  // namespace fl
