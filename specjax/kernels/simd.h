// Float vectors for specjax's CPU kernels (cpu_matmul.cc, cpu_attention.cc): 16 lanes where the
// CPU has AVX-512, else 8 (GCC vector extensions; without AVX the compiler splits them). Loads
// and stores are unaligned; every multiply-add is fused where the CPU can, so the kernels'
// results do not depend on which code path (vector body or tail) computed them.
#ifndef SPECJAX_KERNELS_SIMD_H_
#define SPECJAX_KERNELS_SIMD_H_

#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
typedef float Vec __attribute__((vector_size(64), aligned(4)));
typedef int32_t IntVec __attribute__((vector_size(64), aligned(4)));
constexpr int64_t kLanes = 16;
constexpr int64_t kRegisters = 32;  // vector registers
#else
typedef float Vec __attribute__((vector_size(32), aligned(4)));
typedef int32_t IntVec __attribute__((vector_size(32), aligned(4)));
constexpr int64_t kLanes = 8;
constexpr int64_t kRegisters = 16;
#endif

// Unaligned loads and stores as single vector instructions where the CPU has them: as memcpy,
// GCC tuned for some CPUs (-march=znver2) copies through the stack in 16-byte halves, and the
// 32-byte reload of two 16-byte stores cannot be forwarded (measured 10x slower products).
inline Vec Load(const float* p) {
#if defined(__AVX512F__)
  return (Vec)_mm512_loadu_ps(p);
#elif defined(__AVX__)
  return (Vec)_mm256_loadu_ps(p);
#else
  Vec v; std::memcpy(&v, p, sizeof(v)); return v;
#endif
}

inline void Store(float* p, Vec v) {
#if defined(__AVX512F__)
  _mm512_storeu_ps(p, (__m512)v);
#elif defined(__AVX__)
  _mm256_storeu_ps(p, (__m256)v);
#else
  std::memcpy(p, &v, sizeof(v));
#endif
}

// a * b + c, fused (one rounding) wherever the CPU can.
inline Vec MulAdd(Vec a, Vec b, Vec c) {
#if defined(__AVX512F__)
  return (Vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  return (Vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
}
inline float MulAdd(float a, float b, float c) {
#if defined(__FMA__) || defined(__AVX512F__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

typedef float Vec8 __attribute__((vector_size(32), aligned(4)));
typedef float Vec4 __attribute__((vector_size(16), aligned(4)));

// The sum of a vector's lanes, always in the same order: halves added pairwise (4 levels of
// shuffles and adds with 16 lanes; a serial sum extracts every lane and costs several times
// as much, which dominated a dot product of 64 floats).
inline float LaneSum(Vec v) {
#if defined(__AVX512F__)
  const Vec8 eight = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                     __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  const Vec8 eight = v;
#endif
  const Vec4 four = __builtin_shufflevector(eight, eight, 0, 1, 2, 3) +
                    __builtin_shufflevector(eight, eight, 4, 5, 6, 7);
  return (four[0] + four[2]) + (four[1] + four[3]);
}

// LaneSums(v)[j] = LaneSum(v[j]), bit for bit, for kLanes vectors at once: the same pairwise
// tree, with each level's shuffles and adds shared by all of them (a few operations a vector
// instead of a full reduction each).
__attribute__((always_inline)) inline Vec LaneSums(const Vec* v) {
#if defined(__AVX512F__)
  Vec eight[8], four[4], two[2];
  for (int i = 0; i < 8; ++i) {
    eight[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18,
                                       19, 20, 21, 22, 23) +
               __builtin_shufflevector(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24,
                                       25, 26, 27, 28, 29, 30, 31);
  }
  for (int i = 0; i < 4; ++i) {
    four[i] = __builtin_shufflevector(eight[2 * i], eight[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11,
                                      16, 17, 18, 19, 24, 25, 26, 27) +
              __builtin_shufflevector(eight[2 * i], eight[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15,
                                      20, 21, 22, 23, 28, 29, 30, 31);
  }
  for (int i = 0; i < 2; ++i) {
    two[i] = __builtin_shufflevector(four[2 * i], four[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16,
                                     17, 20, 21, 24, 25, 28, 29) +
             __builtin_shufflevector(four[2 * i], four[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18,
                                     19, 22, 23, 26, 27, 30, 31);
  }
  return __builtin_shufflevector(two[0], two[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24,
                                 26, 28, 30) +
         __builtin_shufflevector(two[0], two[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25,
                                 27, 29, 31);
#else
  Vec four[4], two[2];
  for (int i = 0; i < 4; ++i) {
    four[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
              __builtin_shufflevector(v[2 * i], v[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  }
  for (int i = 0; i < 2; ++i) {
    two[i] = __builtin_shufflevector(four[2 * i], four[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
             __builtin_shufflevector(four[2 * i], four[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
  }
  return __builtin_shufflevector(two[0], two[1], 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(two[0], two[1], 1, 3, 5, 7, 9, 11, 13, 15);
#endif
}

#endif  // SPECJAX_KERNELS_SIMD_H_
