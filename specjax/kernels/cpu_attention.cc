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
#include <type_traits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "simd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// exp(x) for x <= 0 (scores minus their maximum; -inf for hidden slots), one vector at a time:
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, a degree-7 polynomial for exp(r) (Cephes'
// expf coefficients, about 1 ulp), then 2^n built in the exponent bits. Below -87.3 (2^n
// subnormal) it is 0; the reduction runs on x clamped there, so n always converts exactly.
inline Vec ExpNonPositive(Vec x) {
  constexpr float kSmallest = -87.3365447f;  // ln of the smallest normal float
  const Vec zero = Vec{} + 0.f;
  const Vec clamped = x < kSmallest ? zero + kSmallest : x;
  const Vec round = clamped * 1.44269504088896341f + 12582912.f;  // 1.5 * 2^23: to an integer
  const Vec n = round - 12582912.f;
  Vec r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  Vec p = zero + 1.9875691500e-4f;
  p = MulAdd(p, r, zero + 1.3981999507e-3f);
  p = MulAdd(p, r, zero + 8.3334519073e-3f);
  p = MulAdd(p, r, zero + 4.1665795894e-2f);
  p = MulAdd(p, r, zero + 1.6666665459e-1f);
  p = MulAdd(p, r, zero + 5.0000001201e-1f);
  const Vec y = MulAdd(p, r * r, r) + 1.f;
  const IntVec bits = (__builtin_convertvector(n, IntVec) + 127) << 23;
  return x < kSmallest ? zero : y * (Vec)bits;
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

// Mask bytes as 0/1 lanes of int32, in one instruction where the CPU has it (the compiler
// otherwise moves them one byte at a time).
inline IntVec Widen(Bytes bytes) {
#if defined(__AVX512F__)
  return (IntVec)_mm512_cvtepu8_epi32((__m128i)bytes);
#elif defined(__AVX2__)
  uint64_t word;
  std::memcpy(&word, &bytes, sizeof(word));
  return (IntVec)_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(word)));
#else
  return __builtin_convertvector(bytes, IntVec);
#endif
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

// q . k of one query for slots [s0, s0 + kLanes), slot s0 + i in lane i (0 past the last
// slot), any head_dim: slot i's products summed lane by lane over head_dim's vectors in order,
// those lanes by LaneSums, then head_dim's tail in order.
template <int Vecs>
Vec QueryScores(const Problem& p, const float* q, const float* k, int64_t s0) {
  const int64_t vecs = Vecs ? Vecs : p.dim / kLanes, count = std::min(kLanes, p.slots - s0);
  Vec acc[kLanes];
  for (int64_t i = 0; i < kLanes; ++i) {
    Vec sum{};
    for (int64_t j = 0; j < vecs && i < count; ++j) {
      sum = MulAdd(Load(q + j * kLanes), Load(k + (s0 + i) * p.dim + j * kLanes), sum);
    }
    acc[i] = sum;
  }
  Vec score = LaneSums(acc);
  for (int64_t i = 0; i < count && vecs * kLanes < p.dim; ++i) {  // head_dim's tail
    float sum = score[i];
    for (int64_t d = vecs * kLanes; d < p.dim; ++d) {
      sum = MulAdd(q[d], k[(s0 + i) * p.dim + d], sum);
    }
    score[i] = sum;
  }
  return score;
}

// QueryScores of Rows consecutive queries q[r * dim] over a whole block (head_dim = Vecs
// vectors), bit for bit: each key vector is loaded once for all of them, and Rows x Slots
// sums (8) are independent chains of multiply-adds in registers, so their latency overlaps.
template <int Vecs, int Rows>
void TileScores(const float* q, const float* keys, Vec* scores) {
  constexpr int64_t dim = Vecs * kLanes, kSlots = std::max(1, 8 / Rows);
  Vec acc[Rows][kLanes];
  for (int64_t i0 = 0; i0 < kLanes; i0 += kSlots) {
    Vec sum[Rows][kSlots];
    for (int r = 0; r < Rows; ++r) {
      for (int64_t i = 0; i < kSlots; ++i) sum[r][i] = Vec{};
    }
    for (int64_t j = 0; j < Vecs; ++j) {
      Vec key[kSlots];
      for (int64_t i = 0; i < kSlots; ++i) key[i] = Load(keys + (i0 + i) * dim + j * kLanes);
      for (int r = 0; r < Rows; ++r) {
        const Vec query = Load(q + r * dim + j * kLanes);
        for (int64_t i = 0; i < kSlots; ++i) sum[r][i] = MulAdd(query, key[i], sum[r][i]);
      }
    }
    for (int r = 0; r < Rows; ++r) {
      for (int64_t i = 0; i < kSlots; ++i) acc[r][i0 + i] = sum[r][i];
    }
  }
  for (int r = 0; r < Rows; ++r) scores[r] = LaneSums(acc[r]);
}

// Every query's masked, scaled scores for active block a (slots [s0, s0 + kLanes)) of kv head
// n: weights[r * stride + a * kLanes + i], -inf where query r's token does not see the slot.
template <int Vecs>
void BlockScores(const Problem& p, int64_t n, const float* k, int64_t s0, float* weights,
                 int64_t stride, int64_t a) {
  const int64_t queries = p.group * p.steps, b = n / p.kv_heads;
  const float* q = p.q + n * queries * p.dim;
  auto store = [&](int64_t r, Vec score) {
    const bool* mask = p.mask + (b * p.steps + r % p.steps) * p.slots;
    const IntVec seen = Widen(MaskBlock(mask, s0, p.slots));
    Store(weights + r * stride + a * kLanes, seen != 0 ? score * p.scale : Vec{} - INFINITY);
  };
  int64_t r = 0;
  if constexpr (Vecs > 0) {
    if (s0 + kLanes <= p.slots) {  // a whole block: tiles of 8, 4, 2, 1 queries
      const float* keys = k + s0 * p.dim;
      Vec scores[8];
      auto tiles = [&](auto rows) {
        for (; r + rows() <= queries; r += rows()) {
          TileScores<Vecs, rows()>(q + r * p.dim, keys, scores);
          for (int64_t u = 0; u < rows(); ++u) store(r + u, scores[u]);
        }
      };
      tiles(std::integral_constant<int, 8>{});
      tiles(std::integral_constant<int, 4>{});
      tiles(std::integral_constant<int, 2>{});
      tiles(std::integral_constant<int, 1>{});
    }
  }
  for (; r < queries; ++r) store(r, QueryScores<Vecs>(p, q + r * p.dim, k, s0));
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
  // rows per tile of weighted values: their sums fill half the vector registers
  constexpr int kTile = Vecs == 0 ? 8 : std::max(1, static_cast<int>(kRegisters / 2 / Vecs));
  thread_local std::vector<int32_t> blocks;
  thread_local std::vector<float> weights, inverse;
  const int64_t queries = p.group * p.steps;
  for (int64_t n = 0; n < rows; ++n) {
    const int64_t b = n / p.kv_heads;
    const float* k = p.k + n * p.slots * p.dim;
    const float* v = p.v + n * p.slots * p.dim;
    if (n % p.kv_heads == 0) ActiveBlocks(p, b, blocks);  // a sequence's kv heads share them
    const int64_t stride = static_cast<int64_t>(blocks.size()) * kLanes;
    weights.resize(queries * stride);
    inverse.resize(queries);
    for (size_t a = 0; a < blocks.size(); ++a) {  // a block's keys stay in L1 for every query
      BlockScores<Vecs>(p, n, k, blocks[a] * kLanes, weights.data(), stride, a);
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
    case 1: Attend<1>(p, rows); break;
    case 2: Attend<2>(p, rows); break;
    case 4: Attend<4>(p, rows); break;
    case 6: Attend<6>(p, rows); break;
    case 8: Attend<8>(p, rows); break;
    case 16: Attend<16>(p, rows); break;
    default: Attend<0>(p, rows); break;  // any other head_dim: loops of run-time length
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
