// The factored kernel of the CPU matmul's SIMD paths (HFQ4, HFQ6, Q8_0, and the unquantized f32,
// f16 and bf16 rows as blocks of scale 1; see cpu_matmul.h): a block's dot product as
// scale * sum(q x) + min * sum(x), the codes converted straight into FMA chains
// against x prepared once per call (padded to whole blocks, block sums taken, HFQ4's steps
// de-interleaved into even then odd values, the order in which one code load yields them).
//
// Written once over an instruction set and included by each SIMD translation unit
// (cpu_matmul_avx2.cpp, cpu_matmul_avx512.cpp) inside its own anonymous namespace, after it
// defines `Isa`:
//   using V (the float vector); static constexpr int lanes;
//   V zero(); V set1(float); V loadu(const float*); V fmadd(V a, V b, V c) (a b + c); V add(V, V);
//   V mul(V, V);
//   float hsum(V);
//   nibble_pairs(const uint8_t* p, V& even, V& odd): lanes bytes at p, low nibbles (even
//     weights) and high nibbles (odd weights) as floats;
//   signed_bytes(const uint8_t* p, V& first, V& second): 2 x lanes int8 at p as floats;
//   f16_values / bf16_values(const uint8_t* p, V& first, V& second): 2 x lanes halves at p;
//   six_bit_codes(const uint8_t* p, V& first, V& second): 2 x lanes 6-bit codes packed from p
//     (3 bytes per 4 codes, code j at bits 6j of the little-endian stream) as floats, reading
//     only the bytes [p - 4, p + 3 x lanes / 2).
// Everything here then has internal linkage in that unit, compiled for its target flags: no
// template or inline function is shared between units built for different instruction sets
// (the linker could keep one unit's copy for the other's callers).
#ifndef FIRELINE_MATMUL_FACTORED_ISA
#error "include cpu_matmul_factored.h only from a SIMD unit that defines Isa (see above)"
#endif

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// A little-endian f32 or f16 (as f32) at any address.
inline float load_f32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
inline float load_f16(const uint8_t* p) { return _cvtsh_ss(static_cast<uint16_t>(p[0] | p[1] << 8)); }

using V = typename Isa::V;
constexpr int kLanes = Isa::lanes;
constexpr int kFactoredStep = 2 * kLanes;  // values per Codes::step: two vectors

// Codes of one block, one step (2 x kLanes values) at a time, as two float vectors in
// prepared-x order.
template <typename L>
struct Hfq4Codes {
  static constexpr int group = L::group;
  static constexpr int block_bytes = L::block_bytes;
  static constexpr bool interleaved = true;  // x de-interleaved per step: even values, then odd
  static constexpr bool has_min = true;
  static constexpr bool scale_in_codes = false;  // scale (and min) applied once per block
  static constexpr bool whole_blocks = true;     // a row's last block has all its bytes
  static float scale(const uint8_t* block) { return load_f32(block + L::scale_offset); }
  static float min(const uint8_t* block) { return load_f32(block + L::min_offset); }
  static void step(const uint8_t* block, int i, V& even, V& odd) {
    Isa::nibble_pairs(block + L::codes_offset + kLanes * i, even, odd);
  }
};

// HFQ6: 6-bit codes, four to every three bytes (layouts.h), in natural order. A step is 3 x kLanes / 2
// bytes of codes; Isa::six_bit_codes widens each group of four codes' three bytes into four lanes
// and shifts each code down. Its loads start 4 bytes before the step (into the block's 8-byte
// header at the first step), so the last step of a block reads no byte past its codes.
struct Hfq6Codes {
  using L = layout::Hfq6G256;
  static constexpr int group = L::group;
  static constexpr int block_bytes = L::block_bytes;
  static constexpr bool interleaved = false;
  static constexpr bool has_min = true;
  static constexpr bool scale_in_codes = false;
  static constexpr bool whole_blocks = true;
  static float scale(const uint8_t* block) { return load_f32(block + L::scale_offset); }
  static float min(const uint8_t* block) { return load_f32(block + L::min_offset); }
  static void step(const uint8_t* block, int i, V& first, V& second) {
    static_assert(L::codes_offset >= 4, "the loads start 4 bytes before a step");
    Isa::six_bit_codes(block + L::codes_offset + 3 * kFactoredStep / 4 * i, first, second);
  }
};

// At 16 lanes Q8_0's 32-value block is a single step: too short to pay for a sum of the chains
// and a dependent FMA on the running total per block (21 GMAC/s at one input row against AVX2's
// 27). There its codes are multiplied by the block's scale as they are converted (q * d, the
// reference's decoded weight, rounded alike) and the chains run on across blocks
// (scale_in_codes): 42 GMAC/s, ~90 % of the 2-core build machine's read bandwidth. At 8 lanes
// (two steps a block) the per-block scale stays: prescaling there lost a third at 8 input rows.
struct Q8_0Codes {
  using L = layout::Q8_0;
  static constexpr int group = L::group;
  static constexpr int block_bytes = L::block_bytes;
  static constexpr bool interleaved = false;
  static constexpr bool has_min = false;
  static constexpr bool scale_in_codes = L::group == kFactoredStep;
  static constexpr bool whole_blocks = true;
  static float scale(const uint8_t* block) { return load_f16(block + L::scale_offset); }
  static float min(const uint8_t*) { return 0.0f; }
  static void step(const uint8_t* block, int i, V& first, V& second) {
    Isa::signed_bytes(block + L::codes_offset + kFactoredStep * i, first, second);
    if constexpr (scale_in_codes) {
      const V d = Isa::set1(scale(block));
      first = Isa::mul(first, d);
      second = Isa::mul(second, d);
    }
  }
};
// Unquantized rows (f32, f16, bf16: an unconverted checkpoint's weights): no blocks and no scale.
// One step is a "block" of the kernel, its values are the weights (scale_in_codes), and the
// chains run across steps. A row holds exactly K values, so a partial last step is copied into
// a zero-padded buffer rather than read past the row (whole_blocks = false).
template <DType T>
struct PlainCodes {
  static constexpr int group = kFactoredStep;
  static constexpr int block_bytes = kFactoredStep * (T == DType::f32 ? 4 : 2);
  static constexpr bool interleaved = false;
  static constexpr bool has_min = false;
  static constexpr bool scale_in_codes = true;
  static constexpr bool whole_blocks = false;
  static float scale(const uint8_t*) { return 1.0f; }
  static float min(const uint8_t*) { return 0.0f; }
  static void step(const uint8_t* block, int, V& first, V& second) {
    if constexpr (T == DType::f32) {
      first = Isa::loadu(reinterpret_cast<const float*>(block));
      second = Isa::loadu(reinterpret_cast<const float*>(block) + kLanes);
    } else if constexpr (T == DType::f16) {
      Isa::f16_values(block, first, second);
    } else {
      Isa::bf16_values(block, first, second);
    }
  }
};

static_assert(layout::Q8_0::group % kFactoredStep == 0 && layout::Hfq4G128::group % kFactoredStep == 0,
              "a step never crosses a block");
// Four FMA chains per token hide the FMA's latency (~4 cycles, two pipes) when one token is
// multiplied; the same four for any number of tokens, so that a token's sum is computed the same
// way whatever else is in the call (batched rows equal lone ones bit for bit on the CPU).
constexpr int kFactoredChains = 4;
// Tokens per pass over a row: 2 x 4 accumulators + 2 totals + the codes and x fit AVX2's 16
// vector registers; a third token's chains would spill.
constexpr int kFactoredTile = 2;

// The prepared x of `Codes`'s format: per token, `padded` floats (K rounded up to whole blocks,
// zeros past K, HFQ4 de-interleaved) then `blocks` block sums of the real values.
struct PreparedLayout {
  int64_t blocks, padded, floats_per_token;
};

template <typename C>
PreparedLayout prepared_layout(int64_t K) {
  const int64_t blocks = (K + C::group - 1) / C::group;
  // Whole 8-float lines per token keep every token's values 32-byte aligned.
  const int64_t per_token = (blocks * C::group + blocks + 7) / 8 * 8;
  return {blocks, blocks * C::group, per_token};
}

template <typename C>
void prepare_tokens(const simd::MatmulArgs& a, float* prepared) {
  const PreparedLayout l = prepared_layout<C>(a.K);
  for (int64_t t = 0; t < a.T; ++t) {
    const float* x = reinterpret_cast<const float*>(reinterpret_cast<const char*>(a.x) + t * a.x_stride);
    float* xp = prepared + t * l.floats_per_token;
    float* sums = xp + l.padded;
    for (int64_t k = 0; k < l.padded; k += kFactoredStep) {
      for (int i = 0; i < kFactoredStep; ++i) {
        // value k + i of the step sits at position i (natural order) or, de-interleaved, even
        // values first: position i / 2 for even i, kLanes + i / 2 for odd i.
        const int slot = C::interleaved ? (i % 2) * kLanes + i / 2 : i;
        xp[k + slot] = k + i < a.K ? x[k + i] : 0.0f;
      }
    }
    for (int64_t b = 0; b < l.blocks; ++b) {
      float s = 0.0f;
      for (int64_t k = b * C::group; k < min64((b + 1) * C::group, a.K); ++k) s += x[k];
      sums[b] = s;
    }
  }
}

// acc[j][c] += codes * x_j over step i of a block, into chains c and c + 1.
template <int NT, int A, typename C>
inline void factored_step(const uint8_t* block, int i, const float* const* xb, int c, V (*acc)[A]) {
  V first, second;
  C::step(block, i, first, second);
  for (int j = 0; j < NT; ++j) {
    const float* x = xb[j] + kFactoredStep * i;
    acc[j][c % A] = Isa::fmadd(first, Isa::loadu(x), acc[j][c % A]);
    acc[j][(c + 1) % A] = Isa::fmadd(second, Isa::loadu(x + kLanes), acc[j][(c + 1) % A]);
  }
}

// Rows are taken in blocks of kRowBlock and tokens in tiles of NT. With more than one tile, K is
// cut in chunks of kChunkValues: a chunk of x for the tile (8 KB) and of the row block's weights
// (~9 KB of HFQ4) stay in L1 while every row of the block passes over them; unchunked, two
// tokens' whole x (22 KB at K = 2816) and 16 rows (24 KB) overflowed L1 and both streamed from L2
// once per row (AVX2, 2-core build machine, 8 tokens: 28 GMAC/s; chunked, 41). One tile (decode)
// reads each row whole, in order: the weights are then one sequential stream from memory, which
// the chunks' 16 interleaved streams slowed 2.3x.
constexpr int64_t kRowBlock = 16;
constexpr int64_t kChunkValues = 1024;

// Blocks [b0, b1) of rows [m0, m1) against the NT prepared tokens xt, continuing each (row,
// token)'s running sums in total / min_total (indexed by m - m0): calls over consecutive block
// ranges perform exactly the operations of one call over all blocks, in the same order.
template <int NT, typename C>
void factored_blocks(const PreparedLayout& l, const simd::MatmulArgs& a, const float* const* xt, int64_t m0, int64_t m1,
                     int64_t b0, int64_t b1, V (*total)[NT], float (*min_total)[NT]) {
  constexpr int A = kFactoredChains;
  for (int64_t m = m0; m < m1; ++m) {
    const uint8_t* row = a.w + m * a.w_stride;
    V row_total[NT];
    for (int j = 0; j < NT; ++j) row_total[j] = total[m - m0][j];
    if constexpr (C::scale_in_codes) {
      // The chains run across blocks and fold into the total every kChunkValues values: at the
      // same blocks whether or not the call is cut into chunks (which are kChunkValues long and
      // start at such a fold), so a token's sums are the same in any call. Steps alternate
      // between chain pairs (0, 1) and (2, 3): by step within a block of two or more steps, by
      // block when a block is one step; constant indices keep the chains in registers.
      constexpr int steps_per_block = C::group / kFactoredStep;
      const int64_t fold_blocks = kChunkValues / C::group;
      V acc[NT][A];
      for (int j = 0; j < NT; ++j)
        for (int c = 0; c < A; ++c) acc[j][c] = Isa::zero();
      for (int64_t b = b0; b < b1; ++b) {
        const uint8_t* block = row + b * C::block_bytes;
        const int64_t n = min64(C::group, a.K - b * C::group);  // real values in the block
        const int steps = static_cast<int>((n + kFactoredStep - 1) / kFactoredStep);
        alignas(64) uint8_t tail[C::block_bytes];
        if (!C::whole_blocks && n < C::group) {  // a plain row's last, partial step
          std::memset(tail, 0, sizeof tail);
          std::memcpy(tail, block, static_cast<size_t>(n * C::block_bytes / C::group));
          block = tail;
        }
        const float* xb[NT];
        for (int j = 0; j < NT; ++j) xb[j] = xt[j] + b * C::group;
        if constexpr (steps_per_block == 1) {
          if (b % 2 == 0)
            factored_step<NT, A, C>(block, 0, xb, 0, acc);
          else
            factored_step<NT, A, C>(block, 0, xb, 2, acc);
        } else {
          int i = 0;
          for (; i + 1 < steps; i += 2) {
            factored_step<NT, A, C>(block, i, xb, 0, acc);
            factored_step<NT, A, C>(block, i + 1, xb, 2, acc);
          }
          if (i < steps) factored_step<NT, A, C>(block, i, xb, 0, acc);
        }
        if ((b + 1) % fold_blocks == 0 || b + 1 == l.blocks) {
          for (int j = 0; j < NT; ++j) {
            V sum = acc[j][0];
            for (int k = 1; k < A; ++k) sum = Isa::add(sum, acc[j][k]);
            row_total[j] = Isa::add(row_total[j], sum);
            for (int k = 0; k < A; ++k) acc[j][k] = Isa::zero();
          }
        }
      }
      for (int j = 0; j < NT; ++j) total[m - m0][j] = row_total[j];
      continue;
    }
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* block = row + b * C::block_bytes;
      // Steps holding real values; the rest of a tail block meets zeros in x and is skipped.
      const int steps = static_cast<int>((min64(C::group, a.K - b * C::group) + kFactoredStep - 1) / kFactoredStep);
      const float* xb[NT];
      for (int j = 0; j < NT; ++j) xb[j] = xt[j] + b * C::group;
      V acc[NT][A];
      for (int j = 0; j < NT; ++j)
        for (int c = 0; c < A; ++c) acc[j][c] = Isa::zero();
      int i = 0;
      for (; i + 1 < steps; i += 2) {
        factored_step<NT, A, C>(block, i, xb, 0, acc);
        factored_step<NT, A, C>(block, i + 1, xb, 2, acc);
      }
      if (i < steps) factored_step<NT, A, C>(block, i, xb, 0, acc);
      const V scale = Isa::set1(C::scale(block));
      for (int j = 0; j < NT; ++j) {
        V sum = acc[j][0];
        for (int c = 1; c < A; ++c) sum = Isa::add(sum, acc[j][c]);
        row_total[j] = Isa::fmadd(scale, sum, row_total[j]);
        if (C::has_min) min_total[m - m0][j] += C::min(block) * xt[j][l.padded + b];
      }
    }
    for (int j = 0; j < NT; ++j) total[m - m0][j] = row_total[j];
  }
}

template <int NT, typename C>
void factored_tile(const simd::MatmulArgs& a, const float* prepared, int64_t m0, int64_t m1, int64_t t0) {
  const PreparedLayout l = prepared_layout<C>(a.K);
  const int64_t chunk_blocks = a.T <= kFactoredTile ? l.blocks : kChunkValues / C::group;
  const float* xt[NT];
  for (int j = 0; j < NT; ++j) xt[j] = prepared + (t0 + j) * l.floats_per_token;
  V total[kRowBlock][NT];
  float min_total[kRowBlock][NT];
  for (int64_t r = 0; r < m1 - m0; ++r)
    for (int j = 0; j < NT; ++j) total[r][j] = Isa::zero(), min_total[r][j] = 0.0f;
  for (int64_t b0 = 0; b0 < l.blocks; b0 += chunk_blocks)
    factored_blocks<NT, C>(l, a, xt, m0, m1, b0, min64(l.blocks, b0 + chunk_blocks), total, min_total);
  for (int j = 0; j < NT; ++j) {
    float* out = reinterpret_cast<float*>(reinterpret_cast<char*>(a.out) + (t0 + j) * a.out_stride);
    for (int64_t m = m0; m < m1; ++m) out[m] = Isa::hsum(total[m - m0][j]) + min_total[m - m0][j];
  }
}

template <typename C>
void factored_rows(const simd::MatmulArgs& a, const float* prepared, int64_t m0, int64_t m1) {
  static_assert(kChunkValues % C::group == 0, "a chunk holds whole blocks");
  for (int64_t r0 = m0; r0 < m1; r0 += kRowBlock) {
    const int64_t r1 = min64(m1, r0 + kRowBlock);
    for (int64_t t0 = 0; t0 < a.T; t0 += kFactoredTile) {
      if (a.T - t0 >= 2)
        factored_tile<2, C>(a, prepared, r0, r1, t0);
      else
        factored_tile<1, C>(a, prepared, r0, r1, t0);
    }
  }
}

// The entry points' switch over the factored formats: fn.template operator()<Codes>(), or false
// for a format without a factored kernel.
template <typename Fn>
bool with_factored_codes(int w_type, Fn&& fn) {
  switch (static_cast<DType>(w_type)) {
    case DType::q8_0: fn.template operator()<Q8_0Codes>(); return true;
    case DType::hfq4_g256: fn.template operator()<Hfq4Codes<layout::Hfq4G256>>(); return true;
    case DType::hfq4_g128: fn.template operator()<Hfq4Codes<layout::Hfq4G128>>(); return true;
    case DType::hfq6_g256: fn.template operator()<Hfq6Codes>(); return true;
    case DType::f32: fn.template operator()<PlainCodes<DType::f32>>(); return true;
    case DType::f16: fn.template operator()<PlainCodes<DType::f16>>(); return true;
    case DType::bf16: fn.template operator()<PlainCodes<DType::bf16>>(); return true;
    default: return false;
  }
}

int64_t factored_prepared_floats(const simd::MatmulArgs& a) {
  int64_t floats = 0;
  with_factored_codes(a.w_type, [&]<typename C>() { floats = a.T * prepared_layout<C>(a.K).floats_per_token; });
  return floats;
}

void factored_prepare_x(const simd::MatmulArgs& a, float* prepared) {
  with_factored_codes(a.w_type, [&]<typename C>() { prepare_tokens<C>(a, prepared); });
}

void factored_matmul_rows(const simd::MatmulArgs& a, const float* prepared, int64_t m_begin, int64_t m_end) {
  with_factored_codes(a.w_type, [&]<typename C>() { factored_rows<C>(a, prepared, m_begin, m_end); });
}

bool factored_supports(int w_type) {
  return with_factored_codes(w_type, []<typename C>() {});
}
