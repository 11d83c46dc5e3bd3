// ScratchArena: per-layer temporaries reuse their bytes after a rewind, also while the arena
// spills past its main buffer (the first long prompt), and a reset folds the spills into one
// buffer of the high-water size.
#include "model/scratch_arena.h"

#include <gtest/gtest.h>

#include <set>

#include "backend/backend.h"

namespace fl {
namespace {

constexpr int64_t kFloats = 1 << 16;  // 256 KB per temporary
constexpr int kLayers = 12;

// A forward's pattern: one tensor kept across layers, then per layer three temporaries released
// by a rewind to the layer's mark. Returns every temporary's address.
std::set<void*> run_forward(ScratchArena& arena) {
  arena.reset();
  Tensor kept = arena.alloc(DType::f32, {kFloats});
  std::set<void*> addresses{kept.data};
  const size_t layer_mark = arena.mark();
  for (int l = 0; l < kLayers; ++l) {
    arena.rewind(layer_mark);
    for (int64_t size : {kFloats, 2 * kFloats, kFloats / 2}) addresses.insert(arena.alloc(DType::f32, {size}).data);
  }
  return addresses;
}

TEST(ScratchArena, SpillsAreReusedAfterARewindAndFoldedAtTheNextReset) {
  auto cpu = make_cpu_backend();
  ScratchArena arena(*cpu);
  const size_t one_layer = (kFloats + 2 * kFloats + kFloats / 2) * sizeof(float);
  const size_t kept = kFloats * sizeof(float);

  // The first forward has no main buffer: everything spills. Each layer's temporaries land on
  // the blocks the first layer allocated, so the arena holds one layer, not twelve.
  const std::set<void*> first = run_forward(arena);
  EXPECT_EQ(first.size(), 4u) << "layers 2..12 must reuse layer 1's spilled blocks";
  EXPECT_EQ(arena.held_bytes(), kept + one_layer);

  // The reset replaces the spills with one buffer of the high-water size, and every later forward
  // gets the same addresses from it (what a replayed graph needs).
  const std::set<void*> second = run_forward(arena);
  EXPECT_EQ(arena.capacity(), kept + one_layer);
  EXPECT_EQ(arena.held_bytes(), arena.capacity());
  EXPECT_EQ(second.size(), 4u);
  EXPECT_EQ(run_forward(arena), second);
}

TEST(ScratchArena, LiveTensorsNeverShareABlock) {
  auto cpu = make_cpu_backend();
  ScratchArena arena(*cpu);
  arena.reset();
  // Without a rewind nothing is released: each allocation must get its own bytes, even where a
  // rewound allocation at another offset left a block behind.
  const size_t mark = arena.mark();
  Tensor big = arena.alloc(DType::f32, {4 * kFloats});
  arena.rewind(mark);
  Tensor a = arena.alloc(DType::f32, {kFloats});  // reuses big's block (same offset, fits)
  Tensor b = arena.alloc(DType::f32, {kFloats});  // a new offset: a new block
  EXPECT_EQ(a.data, big.data);
  EXPECT_NE(b.data, a.data);
  const char* a_begin = static_cast<const char*>(a.data);
  const char* b_begin = static_cast<const char*>(b.data);
  EXPECT_TRUE(b_begin >= a_begin + a.nbytes() || b_begin + b.nbytes() <= a_begin) << "live tensors overlap";
  // A larger allocation at a reused offset does not fit the old block: it gets a new one.
  arena.rewind(mark);
  Tensor larger = arena.alloc(DType::f32, {8 * kFloats});
  EXPECT_NE(larger.data, big.data);
}

}  // namespace
}  // namespace fl
