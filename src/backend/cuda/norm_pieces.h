#pragma once
// Which products may take the integer matvec's pieces that a one-row residual update cut beside
// its norms' outputs (BackendOptions::imma_ready_pieces). Gemma 4's MoE layers norm the updated
// row three times (the dense MLP's input, the router's, the experts'), and the dense MLP and the
// router then run side by side (Backend::branch_begin): each line's first product reads one of
// those rows. Pieces in a workspace serve only the op right after their producer (the next op
// takes the workspace's start as scratch); these lie in a buffer of their own, which only
// residual updates outside a branch write, so they can serve the first product of each line.
//
// The rule, by op numbers (CudaBackend's ops_: every op, branch fork and end, copy, capture and
// replay counts one): an entry cut by op c serves a product issued as op `now`
// - outside a branch: now == c + 1 (the op right after the update);
// - on a branch's side line: the fork was op c + 1 and now == c + 2 (the line's first op);
// - on its main line: the fork was op c + 1 and now == the side line's end + 1 (likewise).
// Anything else between (a copy, a replay, another op of the same line, which may have written
// the row) leaves the product to cut its own pieces. The two lines of a branch never write what
// the other reads (Backend::branch_begin), so neither line's ops can change the other's row.
// Host code without GPU headers (the op harness includes it in every build).
#include <cstdint>
#include <span>

namespace fl::cuda {

// Where an op is issued: outside any branch, on a branch's side line, or on its main line (after
// the side line's end).
enum class OpLine { unbranched, side, main };

class NormPiecesBook {
 public:
  static constexpr int kMaxEntries = 4;  // an update's norms (kMaxStreamNorms, norm.cuh)
  struct Entry {
    const float* x = nullptr;  // the norm's output row [K]
    int64_t K = 0;
    int group = 0;           // the weight-group size the pieces are cut for
    void* pieces = nullptr;  // hfq4_imma_scratch_bytes(K, group) bytes
  };
  // A residual update outside any branch, op number `op`, cut these rows (the buffer rewritten:
  // whatever an earlier update cut is gone).
  void cut(std::span<const Entry> entries, uint64_t op) {
    n_ = 0;
    for (const Entry& e : entries)
      if (n_ < kMaxEntries) entries_[n_++] = e;
    cut_op_ = op;
  }
  // The op numbers of a branch's fork and of its side line's end.
  void branch_forked(uint64_t op) { fork_op_ = op; }
  void side_ended(uint64_t op) { side_end_op_ = op; }
  // The entry for a one-input product on x [K] in `group`-weight groups, issued as op `now` on
  // `line`; nullptr where it must cut its own.
  const Entry* find(const float* x, int64_t K, int group, OpLine line, uint64_t now) const {
    if (n_ == 0) return nullptr;
    const bool first_on_line = line == OpLine::unbranched ? now == cut_op_ + 1
                               : line == OpLine::side     ? fork_op_ == cut_op_ + 1 && now == cut_op_ + 2
                                                          : fork_op_ == cut_op_ + 1 && now == side_end_op_ + 1;
    if (!first_on_line) return nullptr;
    for (int i = 0; i < n_; ++i)
      if (entries_[i].x == x && entries_[i].K == K && entries_[i].group == group) return &entries_[i];
    return nullptr;
  }

 private:
  Entry entries_[kMaxEntries];
  int n_ = 0;
  uint64_t cut_op_ = 0, fork_op_ = 0, side_end_op_ = 0;
};

}  // namespace fl::cuda
