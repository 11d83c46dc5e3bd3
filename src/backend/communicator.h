#pragma once
// Collective communication between the ranks of one model split over several devices (issue 10:
// --tp / --ep, model/parallel_plan.h): one Communicator per rank, each next to that rank's
// Backend. The model's per-rank forward adds up the partial sums of o_proj, down_proj and the
// expert block with all_reduce_sum.
//
// Every rank must make the same sequence of calls with the same shapes; a rank that never calls
// leaves the others waiting (as with any collective library). Argument mistakes are checked
// inside the collective, after every rank has arrived, so that every rank throws the same
// fl::Error instead of some ranks throwing and the rest waiting forever.
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace fl {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // t (f32, contiguous, on this rank's device) becomes the sum of every rank's t, in place, and
  // every rank gets the same bits.
  virtual void all_reduce_sum(Tensor& t) = 0;
  // For a rank that failed outside a collective (so the others would wait for it forever): every
  // rank's current and later collectives throw fl::Error with `why`. The group stays broken.
  virtual void abort(const std::string& why) = 0;
};

// `ranks` ranks as threads of this process on the CPU backend (tests, and the CPU reference of a
// split forward): communicator r belongs to the thread that runs rank r. The sum is taken in rank
// order, ((x0 + x1) + x2) + ..., so it equals a sequential sum of the ranks' parts bit for bit.
std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int ranks);

}  // namespace fl
