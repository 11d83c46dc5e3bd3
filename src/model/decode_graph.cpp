#include "model/decode_graph.h"

namespace fl {

ReplayedDecode::ReplayedDecode(Backend& backend, Sequence& seq, CheckStep check, Run run)
    : backend_(backend), seq_(seq), check_(std::move(check)), run_(std::move(run)), arena_(backend) {
  inputs_ = backend.allocate(256);
  id_ = make_tensor(inputs_->data(), DType::i32, {1}, backend.device());
  position_ = make_tensor(static_cast<char*>(inputs_->data()) + 128, DType::i32, {1}, backend.device());
  chosen_ = make_tensor(static_cast<char*>(inputs_->data()) + 64, DType::i32, {1}, backend.device());
}

void ReplayedDecode::advance(int32_t token) {
  check_(seq_, std::span<const int32_t>(&token, 1));
  const int32_t position = static_cast<int32_t>(seq_.n_past);
  backend_.copy_to_device(id_, &token);
  backend_.copy_to_device(position_, &position);
  if (graph_) {
    graph_->replay();
  } else if (steps_ == 0) {
    arena_.reset();
    logits_ = run_(arena_, seq_, id_, position_);
  } else {
    arena_.reset();  // outside the capture: it may reallocate once after step 1
    graph_ = backend_.capture([&] { logits_ = run_(arena_, seq_, id_, position_); });
    graph_->replay();
  }
  ++steps_;
  seq_.n_past += 1;
}

std::vector<float> ReplayedDecode::step(int32_t token) {
  advance(token);
  std::vector<float> out(static_cast<size_t>(logits_.numel()));
  backend_.copy_to_host(out.data(), logits_);
  return out;
}

int32_t ReplayedDecode::step_sample(int32_t token, const SampleSpec& spec) {
  advance(token);
  return sample_id(backend_, chosen_, logits_.reshape({logits_.numel()}), spec);
}

}  // namespace fl
