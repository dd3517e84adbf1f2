// Attention of a few new tokens over a KV cache, for XLA:CPU decoding. XLA computes a masked
// softmax over every slot of the cache in several fused loops, each dispatched on its own (tens
// of microseconds a layer for a decode step, however little of the cache is filled); this
// kernel visits only the blocks of slots that some new token sees, on the calling thread, and
// reads each key and value there once for all the call's queries of a kv head. Built and loaded
// by cpu_attention.py; see there for when it is used.
//
//   out[n, r] = sum_s softmax_s(scale * q[n, r] . k[n, s]) v[n, s]   over slots s with
//   mask[b, t, s], for n = b * kv_heads + h and query row r = g * T + t (g of the group).
//
// Determinism: a query row's result depends only on its own query and on the keys and values
// of the slots it sees, never on how many tokens or rows are computed together (T, the group,
// the batch) or on what hidden slots hold (as long as they are finite): slot s always sits in
// lane s % kLanes of the vectors that sum the softmax, a hidden slot adds an exact zero there
// and to the weighted values (summed slot by slot in order), and a score's sum over head_dim
// is the slot's own. Verifying K+1 drafted tokens at once gives each token the bits of decoding
// it alone, as the lossless decoding loop needs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "simd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// exp(x) for x <= 0 (scores minus their maximum), one vector at a time: Cody-Waite reduction
// x = n ln2 + r, |r| <= ln2 / 2, a degree-7 polynomial for exp(r) (Cephes' expf coefficients,
// about 1 ulp), then 2^n built in the exponent bits. Below -87.3 (2^n subnormal) it is 0.
inline Vec ExpNonPositive(Vec x) {
  const Vec zero = Vec{} + 0.f;
  const Vec round = x * 1.44269504088896341f + 12582912.f;  // 1.5 * 2^23: rounds to an integer
  const Vec n = round - 12582912.f;
  Vec r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  Vec p = zero + 1.9875691500e-4f;
  p = MulAdd(p, r, zero + 1.3981999507e-3f);
  p = MulAdd(p, r, zero + 8.3334519073e-3f);
  p = MulAdd(p, r, zero + 4.1665795894e-2f);
  p = MulAdd(p, r, zero + 1.6666665459e-1f);
  p = MulAdd(p, r, zero + 5.0000001201e-1f);
  const Vec y = MulAdd(p, r * r, r) + 1.f;
  const IntVec bits = (__builtin_convertvector(n, IntVec) + 127) << 23;
  return x < -87.3365447f ? zero : y * (Vec)bits;
}

using Tensor = ffi::Buffer<ffi::F32, 3>;
using Mask = ffi::Buffer<ffi::PRED, 3>;
typedef uint8_t Bytes __attribute__((vector_size(kLanes)));

struct Problem {
  const float *q, *k, *v;  // [N, Q, D], [N, S, D], [N, S, D]
  const bool* mask;        // [B, T, S]
  float* out;              // [N, Q, D]
  int64_t kv_heads, group, steps, slots, dim;
  float scale;
};

// Mask bytes [s0, s0 + kLanes) of one row as a vector, false past the last slot.
inline Bytes MaskBlock(const bool* row, int64_t s0, int64_t slots) {
  Bytes bytes{};
  if (s0 + kLanes <= slots) {
    std::memcpy(&bytes, row + s0, kLanes);  // one vector load
  } else {
    std::memcpy(&bytes, row + s0, slots - s0);
  }
  return bytes;
}

// The blocks of kLanes slots (block i: slots [i * kLanes, (i + 1) * kLanes)) that some token of
// batch row b sees.
void ActiveBlocks(const Problem& p, int64_t b, std::vector<int32_t>& blocks) {
  blocks.clear();
  for (int64_t s0 = 0; s0 < p.slots; s0 += kLanes) {
    for (int64_t t = 0; t < p.steps; ++t) {
      const Bytes bytes = MaskBlock(p.mask + (b * p.steps + t) * p.slots, s0, p.slots);
      uint64_t words[kLanes / 8];
      std::memcpy(words, &bytes, sizeof(bytes));
      uint64_t any = 0;
      for (uint64_t word : words) any |= word;
      if (any) {
        blocks.push_back(static_cast<int32_t>(s0 / kLanes));
        break;
      }
    }
  }
}

// One query's masked, scaled scores for slots [s0, s0 + kLanes), slot s0 + i in lane i: -inf
// where the query's mask row hides it (or past the last slot).
template <int Vecs>
Vec BlockScores(const Problem& p, const float* q, const float* k, const bool* mask, int64_t s0) {
  const int64_t vecs = Vecs ? Vecs : p.dim / kLanes, count = std::min(kLanes, p.slots - s0);
  Vec acc[kLanes];  // slot i's products, summed lane by lane over head_dim's vectors
  if (Vecs && count == kLanes) {  // a whole block: fixed offsets, the sums in registers
    constexpr int64_t dim = Vecs * kLanes;
    const float* keys = k + s0 * dim;
    for (int64_t i = 0; i < kLanes; ++i) acc[i] = Vec{};
    for (int64_t j = 0; j < Vecs; ++j) {
      const Vec query = Load(q + j * kLanes);
      for (int64_t i = 0; i < kLanes; ++i) {
        acc[i] = MulAdd(query, Load(keys + i * dim + j * kLanes), acc[i]);
      }
    }
  } else {
    for (int64_t i = 0; i < kLanes; ++i) {
      Vec sum{};
      for (int64_t j = 0; j < vecs && i < count; ++j) {
        sum = MulAdd(Load(q + j * kLanes), Load(k + (s0 + i) * p.dim + j * kLanes), sum);
      }
      acc[i] = sum;
    }
  }
  Vec score = LaneSums(acc);
  for (int64_t i = 0; i < count && vecs * kLanes < p.dim; ++i) {  // head_dim's tail
    float sum = score[i];
    for (int64_t d = vecs * kLanes; d < p.dim; ++d) {
      sum = MulAdd(q[d], k[(s0 + i) * p.dim + d], sum);
    }
    score[i] = sum;
  }
  const IntVec seen = __builtin_convertvector(MaskBlock(mask, s0, p.slots), IntVec);
  return seen != 0 ? score * p.scale : Vec{} - INFINITY;
}

// Softmax weights, in place, of one row's `count` masked scores (a multiple of kLanes; hidden:
// -inf, whose exp is 0): returns 1 / their sum, or 0 for a row that sees nothing (its weights
// are then zeros).
float Softmax(float* weights, int64_t count) {
  Vec top = Vec{} - INFINITY;
  for (int64_t i = 0; i < count; i += kLanes) {
    const Vec w = Load(weights + i);
    top = w > top ? w : top;
  }
  float max = top[0];
  for (int64_t i = 1; i < kLanes; ++i) max = std::max(max, top[i]);
  if (max == -INFINITY) {
    std::fill_n(weights, count, 0.f);
    return 0.f;
  }
  Vec total{};
  for (int64_t i = 0; i < count; i += kLanes) {
    const Vec e = ExpNonPositive(Load(weights + i) - max);
    Store(weights + i, e);
    total += e;
  }
  return 1.f / LaneSum(total);
}

// out[r] = inverse[r] * sum over the active slots of weights[r][slot] * v[slot] for Tile rows
// at once: each value row is read once for the tile, and each (row, vector of head_dim) sums
// its slots in order, so a row's result does not depend on the tile. With head_dim a whole
// number of vectors (Vecs > 0) all Tile * Vecs sums stay in registers; otherwise one vector
// of head_dim at a time, then its tail one float at a time.
template <int Vecs, int Tile>
void WeightedValues(const Problem& p, const float* v, const std::vector<int32_t>& blocks,
                    const float* weights, int64_t stride, const float* inverse,
                    float* const* out) {
  auto each_slot = [&](auto visit) {
    for (size_t a = 0; a < blocks.size(); ++a) {
      const int64_t s0 = blocks[a] * kLanes, count = std::min(kLanes, p.slots - s0);
      for (int64_t i = 0; i < count; ++i) visit(a * kLanes + i, v + (s0 + i) * p.dim);
    }
  };
  if constexpr (Vecs > 0) {
    Vec acc[Tile][Vecs] = {};
    each_slot([&](int64_t w, const float* value) {
      for (int64_t j = 0; j < Vecs; ++j) {
        const Vec vj = Load(value + j * kLanes);
        for (int64_t r = 0; r < Tile; ++r) {
          acc[r][j] = MulAdd(Vec{} + weights[r * stride + w], vj, acc[r][j]);
        }
      }
    });
    for (int64_t r = 0; r < Tile; ++r) {
      for (int64_t j = 0; j < Vecs; ++j) Store(out[r] + j * kLanes, acc[r][j] * inverse[r]);
    }
  } else {
    const int64_t vecs = p.dim / kLanes;
    for (int64_t j = 0; j < vecs; ++j) {
      Vec acc[Tile] = {};
      each_slot([&](int64_t w, const float* value) {
        const Vec vj = Load(value + j * kLanes);
        for (int64_t r = 0; r < Tile; ++r) {
          acc[r] = MulAdd(Vec{} + weights[r * stride + w], vj, acc[r]);
        }
      });
      for (int64_t r = 0; r < Tile; ++r) Store(out[r] + j * kLanes, acc[r] * inverse[r]);
    }
    for (int64_t d = vecs * kLanes; d < p.dim; ++d) {
      float acc[Tile] = {};
      each_slot([&](int64_t w, const float* value) {
        for (int64_t r = 0; r < Tile; ++r) acc[r] = MulAdd(weights[r * stride + w], value[d], acc[r]);
      });
      for (int64_t r = 0; r < Tile; ++r) out[r][d] = acc[r] * inverse[r];
    }
  }
}

// Rows [first, rows) of WeightedValues, in tiles of Tile rows, then of halves of it.
template <int Vecs, int Tile>
void AllWeightedValues(const Problem& p, const float* v, const std::vector<int32_t>& blocks,
                       const float* weights, int64_t stride, const float* inverse, float* out,
                       int64_t first, int64_t rows) {
  for (; first + Tile <= rows; first += Tile) {
    float* tile_out[Tile];
    for (int64_t r = 0; r < Tile; ++r) tile_out[r] = out + (first + r) * p.dim;
    WeightedValues<Vecs, Tile>(p, v, blocks, weights + first * stride, stride, inverse + first,
                               tile_out);
  }
  if constexpr (Tile > 1) {
    AllWeightedValues<Vecs, Tile / 2>(p, v, blocks, weights, stride, inverse, out, first, rows);
  }
}

template <int Vecs>
void Attend(const Problem& p, int64_t rows) {
  // rows per tile of weighted values: 16 vectors of sums (of 32 registers with AVX-512)
  constexpr int kTile = Vecs == 0 ? 8 : Vecs >= 16 ? 1 : 16 / Vecs;
  thread_local std::vector<int32_t> blocks;
  thread_local std::vector<float> weights, inverse;
  const int64_t queries = p.group * p.steps;
  for (int64_t n = 0; n < rows; ++n) {
    const int64_t b = n / p.kv_heads;
    const float* k = p.k + n * p.slots * p.dim;
    const float* v = p.v + n * p.slots * p.dim;
    ActiveBlocks(p, b, blocks);
    const int64_t stride = static_cast<int64_t>(blocks.size()) * kLanes;
    weights.resize(queries * stride);
    inverse.resize(queries);
    for (size_t a = 0; a < blocks.size(); ++a) {  // a block's keys stay in L1 for every query
      for (int64_t r = 0; r < queries; ++r) {
        const bool* mask = p.mask + (b * p.steps + r % p.steps) * p.slots;
        Store(weights.data() + r * stride + a * kLanes,
              BlockScores<Vecs>(p, p.q + (n * queries + r) * p.dim, k, mask, blocks[a] * kLanes));
      }
    }
    for (int64_t r = 0; r < queries; ++r) inverse[r] = Softmax(weights.data() + r * stride, stride);
    AllWeightedValues<Vecs, kTile>(p, v, blocks, weights.data(), stride, inverse.data(),
                                   p.out + n * queries * p.dim, 0, queries);
  }
}

}  // namespace

ffi::Error CachedAttention(Tensor q, Tensor k, Tensor v, Mask mask, ffi::Result<Tensor> out,
                           float scale) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(),
             md = mask.dimensions();
  const int64_t rows = qd[0], batch = md[0], steps = md[1], slots = md[2], dim = qd[2];
  if (kd[0] != rows || vd[0] != rows || kd[1] != slots || vd[1] != slots || kd[2] != dim ||
      vd[2] != dim || batch == 0 || rows % batch != 0 || steps == 0 || qd[1] % steps != 0) {
    return ffi::Error::InvalidArgument("specjax cached attention: inconsistent shapes");
  }
  const Problem p{q.typed_data(), k.typed_data(), v.typed_data(), mask.typed_data(),
                  out->typed_data(), rows / batch, qd[1] / steps, steps, slots, dim, scale};
  switch (dim % kLanes ? 0 : dim / kLanes) {  // head_dim in vectors, fixed at compile time
    case 2: Attend<2>(p, rows); break;
    case 4: Attend<4>(p, rows); break;
    case 8: Attend<8>(p, rows); break;
    default: Attend<0>(p, rows); break;
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxCachedAttentionF32, CachedAttention,
                              ffi::Ffi::Bind()
                                  .Arg<Tensor>()
                                  .Arg<Tensor>()
                                  .Arg<Tensor>()
                                  .Arg<Mask>()
                                  .Ret<Tensor>()
                                  .Attr<float>("scale"));
