#pragma once
// The CPU backend's attention: Backend::attention's contract (backend.h) over a KV cache of any
// element type (f32, bf16, Q8_0; linear or a sliding ring), in two implementations:
// - reference: the oracle. One query head at a time: every key and value row it reads is
//   decoded with the registry's dequantize_row, scores are sequential f32 dots, softmax in f32,
//   values summed in key order. Slow and obvious; the other path is tested against it.
// - grouped: what the backend runs. The query heads that share a KV head are taken together:
//   their scores are one matmul (cpu_matmul.h) of the heads' q rows against the packed key rows,
//   read block by block by its fastest path, and each value row is decoded once for all of them
//   (4-8 heads in Gemma 4 and Qwen3.5), not once per head. The q.k dots sum in another order and
//   the value sums fuse their multiply-adds where the CPU has FMA: tests hold the result within
//   1e-5 of the reference's scale.
// Both split independent (token, head) work over the pool and compute each output the same way
// whatever the thread count and whatever other tokens or heads share the call, so a sequence's
// rows are bit for bit alike alone and in a batch.
#include "backend/backend.h"

namespace fl {

class ThreadPool;

namespace cpu {

enum class AttentionPath { reference, grouped };

void attention(Tensor out, const Tensor& q, const Tensor& k_new, const Tensor& v_new, const KvView& cache,
               const Tensor& positions, const AttentionParams& p, AttentionPath path, ThreadPool& pool);

}  // namespace cpu
}  // namespace fl
