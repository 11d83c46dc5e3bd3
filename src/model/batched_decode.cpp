#include "model/batched_decode.h"

#include "core/error.h"

namespace fl {

BatchedDecode::Step BatchedDecode::run(std::span<Sequence* const> seqs, std::span<const int32_t> ids) {
  const auto B = static_cast<int64_t>(seqs.size());
  if (B == 0 || static_cast<int64_t>(ids.size()) != B)
    fail("forward_batch: {} sequences but {} token ids", seqs.size(), ids.size());
  std::vector<SequenceRows> parts(static_cast<size_t>(B));
  std::vector<int32_t> pos_host(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) {
    for (int64_t j = 0; j < i; ++j)
      if (seqs[j] == seqs[i]) fail("forward_batch: a sequence appears twice in one batch");
    check_(*seqs[i], ids.subspan(i, 1));
    parts[i] = {seqs[i], i, 1};
    pos_host[i] = static_cast<int32_t>(seqs[i]->n_past);
  }
  arena_.reset();
  Tensor ids_t = arena_.alloc(DType::i32, {B});
  backend_.copy_to_device(ids_t, ids.data());
  Tensor positions = arena_.alloc(DType::i32, {B});
  backend_.copy_to_device(positions, pos_host.data());
  Tensor sampled = arena_.alloc(DType::i32, {B});
  return {run_(arena_, parts, ids_t, positions), sampled};
}

std::vector<float> BatchedDecode::logits(std::span<Sequence* const> seqs, std::span<const int32_t> ids) {
  const Step step = run(seqs, ids);
  std::vector<float> out(static_cast<size_t>(step.logits.numel()));
  backend_.copy_to_host(out.data(), step.logits);
  for (Sequence* seq : seqs) seq->n_past += 1;
  return out;
}

std::vector<int32_t> BatchedDecode::sampled(std::span<Sequence* const> seqs, std::span<const int32_t> ids,
                                            std::span<const SampleSpec> specs) {
  if (specs.size() != seqs.size())
    fail("forward_batch_sample: {} sequences but {} sampling specs", seqs.size(), specs.size());
  const Step step = run(seqs, ids);
  backend_.sample_rows(step.sampled, step.logits, specs);
  std::vector<int32_t> tokens(seqs.size());
  backend_.copy_to_host(tokens.data(), step.sampled);
  for (Sequence* seq : seqs) seq->n_past += 1;
  return tokens;
}

}  // namespace fl
