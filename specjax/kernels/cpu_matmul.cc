// Small-M float32 matmul for XLA:CPU: y[M,N] = x[M,K] @ W, with W stored [K,N] or, transposed,
// [N,K]. XLA:CPU runs a one-row product on one thread; decoding is a chain of them, so it reads
// the weights at one core's bandwidth. This kernel splits each product into chunks that a
// persistent thread pool and the calling thread claim as they become free. Built and loaded by
// cpu_matmul.py; see there for when it is used.
//
// Determinism: every output element is summed in an order fixed by (K, N) alone (the chunking
// depends on the shape, not on the threads), each multiply-add is fused explicitly in every
// code path, and the build passes -ffp-contract=off so that the compiler fuses nothing else: a
// row's result does not depend on M (how many rows are multiplied together), on the code path
// M selects, on the thread count or on timing. The lossless decoding loop relies on that:
// verifying K+1 drafted tokens at once gives each token the same logits as decoding it alone.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>
#include <unistd.h>

#include "simd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Several rows of x multiply a few-row product in as many operations as one row: with 512-bit
// vectors and 8 rows of W per pass, 3 to 8 rows took 1.4-1.7x less time than with 256-bit vectors
// and 4 rows of W (AMD Zen 5, one thread, the default model's products from L3; one row: the
// same).
#if defined(__AVX512F__)
constexpr int64_t kRowsPerPass = 8;  // rows of W [K,N] multiply-added per pass over the outputs
#else
constexpr int64_t kRowsPerPass = 4;  // (with 256-bit vectors 8 measured the same)
#endif
constexpr int64_t kBlock = 1024;     // output columns per cache-resident accumulator block
constexpr int64_t kPad = 16;         // accumulator rows 4 KiB + 64 B apart: no L1 set aliasing
constexpr int64_t kAhead = 8;        // software prefetch distance, in rows of W
constexpr int kBandVecs = 8;         // register-held sums per band of W, for one row of x
constexpr int kMaxChunks = 2;        // a product is split into at most this many chunks (each
                                     // more is one more partial sum: measured, ar decoding 8%
                                     // slower with 8 chunks, 2% with 4)
constexpr int64_t kChunkMin = 32;    // and each chunk spans at least this many rows of K (or N)
constexpr int64_t kSpinNanos = 50000;  // a worker polls this long for the next product
constexpr int kWindow = 64;            // pooled products judged together
constexpr int64_t kLateMicros = 20;    // a wait this much past the caller's own share is late
constexpr int kLateInWindow = 4;       // late waits that fail a window (one is a hiccup)
constexpr int64_t kMinSolo = 1024, kMaxSolo = 16384;  // products the caller then does alone

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

struct Problem {
  const float* x;  // [m, k]
  const float* w;  // [k, n], or [n, k] when transposed
  int64_t m, k, n;
  bool transposed;
};

// out[r, c..c + Vecs * kLanes) = sum over k in [k0, k1) of x[r, k] * W[k, c..]: a band of W read top
// to bottom once, the sums kept in registers.
template <int Rows, int Vecs>
inline void Band(const Problem& p, int64_t k0, int64_t k1, int64_t c, float* out) {
  Vec acc[Rows][Vecs] = {};
  const float* w = p.w + k0 * p.n + c;
  for (int64_t k = k0; k < k1; ++k, w += p.n) {
    for (int64_t line = 0; line < Vecs * kLanes; line += 16) {
      __builtin_prefetch(w + kAhead * p.n + line);
    }
    for (int r = 0; r < Rows; ++r) {
      const Vec x = Vec{} + p.x[r * p.k + k];
      for (int v = 0; v < Vecs; ++v) acc[r][v] = MulAdd(x, Load(w + v * kLanes), acc[r][v]);
    }
  }
  for (int r = 0; r < Rows; ++r) {
    for (int v = 0; v < Vecs; ++v) Store(out + r * p.n + c + v * kLanes, acc[r][v]);
  }
}

// out[r, :] = sum over k in [k0, k1) of x[r, k] * W[k, :] for Rows rows, band by band.
template <int Rows, int Vecs>
void RegisterNN(const Problem& p, int64_t k0, int64_t k1, float* out) {
  int64_t c = 0;
  for (; c + Vecs * kLanes <= p.n; c += Vecs * kLanes) Band<Rows, Vecs>(p, k0, k1, c, out);
  for (; c + kLanes <= p.n; c += kLanes) Band<Rows, 1>(p, k0, k1, c, out);
  for (; c < p.n; ++c) {
    for (int r = 0; r < Rows; ++r) {
      float sum = 0.f;
      for (int64_t k = k0; k < k1; ++k) sum = MulAdd(p.x[r * p.k + k], p.w[k * p.n + c], sum);
      out[r * p.n + c] = sum;
    }
  }
}

// acc[r, j..j+kLanes) += sum over i < Rows of x[r, k+i] * W[k+i, c+j..]: each slice of W is
// loaded once and used for every row r.
template <int Rows>
inline void AddRows(const Problem& p, int64_t k, const float* w, float* acc, int64_t stride) {
  Vec wv[Rows];
  for (int i = 0; i < Rows; ++i) {
    wv[i] = Load(w + i * p.n);
    __builtin_prefetch(w + (i + kAhead) * p.n);
  }
  for (int64_t r = 0; r < p.m; ++r, acc += stride) {
    const float* x = p.x + r * p.k + k;
    Vec a = Load(acc);
    for (int i = 0; i < Rows; ++i) a = MulAdd(Vec{} + x[i], wv[i], a);
    Store(acc, a);
  }
}

template <size_t... Rows>
constexpr auto AddRowsTable(std::index_sequence<Rows...>) {
  return std::array{&AddRows<Rows + 1>...};
}
constexpr auto kAddRows = AddRowsTable(std::make_index_sequence<kRowsPerPass>());  // by rows

// out[r, :] = sum over k in [k0, k1) of x[r, k] * W[k, :], W [K,N] streamed row by row.
void StreamNN(const Problem& p, int64_t k0, int64_t k1, float* out) {
  thread_local std::vector<float> acc;
  const int64_t stride = std::min(kBlock, p.n) + kPad;
  acc.resize(p.m * stride);
  for (int64_t c = 0; c < p.n; c += kBlock) {
    const int64_t width = std::min(kBlock, p.n - c);
    const int64_t vec_width = width / kLanes * kLanes;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t k = k0; k < k1; k += kRowsPerPass) {
      const int64_t rows = std::min(kRowsPerPass, k1 - k);
      const float* w = p.w + k * p.n + c;
      for (int64_t j = 0; j < vec_width; j += kLanes) {
        kAddRows[rows - 1](p, k, w + j, acc.data() + j, stride);
      }
      for (int64_t j = vec_width; j < width; ++j) {
        for (int64_t r = 0; r < p.m; ++r) {
          for (int64_t i = 0; i < rows; ++i) {
            float& a = acc[r * stride + j];
            a = MulAdd(p.x[r * p.k + k + i], w[i * p.n + j], a);
          }
        }
      }
    }
    for (int64_t r = 0; r < p.m; ++r) {
      std::memcpy(out + r * p.n + c, acc.data() + r * stride, width * sizeof(float));
    }
  }
}

// out[r, :] = sum over k in [k0, k1) of x[r, k] * W[k, :]. Every output element is summed over
// k in order by either path, so a row's bits do not depend on the row count: for one or two
// rows the sums fit in registers; for more, W is streamed once through L1-resident sums.
void PartialNN(const Problem& p, int64_t k0, int64_t k1, float* out) {
  switch (p.m) {
    case 1: RegisterNN<1, kBandVecs>(p, k0, k1, out); break;
    case 2: RegisterNN<2, kBandVecs / 2>(p, k0, k1, out); break;
    default: StreamNN(p, k0, k1, out); break;
  }
}

// out[r, n] = dot(x[r, :], W[n, :]) for n in [n0, n1), W [N,K]: kLanes lanes, then a
// fixed-order reduction; each row of W is loaded once for all rows of x.
template <int Rows>
inline void DotRows(const Problem& p, int64_t r0, int64_t n, float* out) {
  Vec acc[Rows] = {};
  const float* w = p.w + n * p.k;
  int64_t k = 0;
  for (; k + kLanes <= p.k; k += kLanes) {
    const Vec wv = Load(w + k);
    for (int r = 0; r < Rows; ++r) acc[r] = MulAdd(Load(p.x + (r0 + r) * p.k + k), wv, acc[r]);
  }
  for (int r = 0; r < Rows; ++r) {
    float sum = LaneSum(acc[r]);
    for (int64_t kk = k; kk < p.k; ++kk) sum = MulAdd(p.x[(r0 + r) * p.k + kk], w[kk], sum);
    out[(r0 + r) * p.n + n] = sum;
  }
}

void ColumnsNT(const Problem& p, int64_t n0, int64_t n1, float* out) {
  for (int64_t n = n0; n < n1; ++n) {
    int64_t r = 0;
    for (; r + 4 <= p.m; r += 4) DotRows<4>(p, r, n, out);
    switch (p.m - r) {
      case 3: DotRows<3>(p, r, n, out); break;
      case 2: DotRows<2>(p, r, n, out); break;
      case 1: DotRows<1>(p, r, n, out); break;
      default: break;
    }
  }
}

// How many chunks a product is split into: a function of its shape alone, so the order in which
// partial sums are added, and so every bit of the result, is the same whatever the thread count.
int Chunks(const Problem& p) {
  return static_cast<int>(std::clamp<int64_t>((p.transposed ? p.n : p.k) / kChunkMin, 1,
                                              kMaxChunks));
}

// Chunk `chunk` of `chunks`. Transposed: a contiguous range of output columns, written to
// outputs[0] (the result). Otherwise a contiguous range of W's rows, summed into
// outputs[chunk]; the caller adds outputs[1..] into outputs[0] in order.
void RunChunk(const Problem& p, int chunk, int chunks, float* const* outputs) {
  if (p.transposed) {
    ColumnsNT(p, p.n * chunk / chunks, p.n * (chunk + 1) / chunks, outputs[0]);
  } else {
    PartialNN(p, p.k * chunk / chunks, p.k * (chunk + 1) / chunks, outputs[chunk]);
  }
}

// Chunks are claimed one at a time by whichever thread is free: the calling thread claims too,
// so it never waits for a worker that has not started (a worker descheduled by other load, or
// asleep), only for chunks a worker is already computing. Workers poll for the next product
// for kSpinNanos (a decode step issues its products microseconds apart), then sleep: they
// leave the cores to XLA's own threads and to other processes between bursts of products.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 1; i < threads; ++i) std::thread([this] { Work(); }).detach();
  }
  std::mutex& mutex() { return mutex_; }

  void Run(const Problem& p, int chunks, float* const* outputs) {  // the caller holds mutex()
    problem_ = p;
    outputs_ = outputs;
    done_.store(0, std::memory_order_relaxed);
    const uint32_t generation = generation_.load(std::memory_order_relaxed) + 1;
    state_.store(Pack(generation, chunks, 0), std::memory_order_release);
    generation_.store(generation, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
    const auto start = std::chrono::steady_clock::now();
    const bool helped = Drain() < chunks;
    const auto drained = std::chrono::steady_clock::now();
    while (done_.load(std::memory_order_acquire) < chunks) CpuRelax();
    const auto own = drained - start, waited = std::chrono::steady_clock::now() - drained;
    Assess(helped, waited > own + own / 2 + std::chrono::microseconds(kLateMicros));
  }

  // Whether the caller computes this product alone: the same chunks in turn, so the same bits.
  bool Solo() {  // the caller holds mutex()
    if (solo_left_ == 0) return false;
    --solo_left_;
    return true;
  }

 private:
  // state_ packs (generation, chunk count, next chunk) so that a claim and the job it belongs
  // to are read in one atomic step: a claim of a finished job can never succeed.
  static uint64_t Pack(uint32_t generation, int chunks, int next) {
    return (uint64_t{generation} << 32) | (uint64_t(chunks) << 16) | uint64_t(next);
  }

  // Computes chunks until none is left; returns how many it computed.
  int Drain() {
    int claimed = 0;
    uint64_t state = state_.load(std::memory_order_acquire);
    for (;;) {
      const int chunks = static_cast<int>((state >> 16) & 0xffff);
      const int next = static_cast<int>(state & 0xffff);
      if (next >= chunks) return claimed;
      if (state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        RunChunk(problem_, next, chunks, outputs_);
        done_.fetch_add(1, std::memory_order_release);
        ++claimed;
        state = state_.load(std::memory_order_acquire);
      }
    }
  }

  void Work() {
    uint32_t seen = generation_.load(std::memory_order_acquire);
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      for (int polls = 0; generation_.load(std::memory_order_acquire) == seen; ++polls) {
        if (polls % 8 != 7 || std::chrono::steady_clock::now() - start <
                                   std::chrono::nanoseconds(kSpinNanos)) {
          sched_yield();  // not a pause: a busy machine gets the core back at once
          continue;
        }
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        generation_.wait(seen, std::memory_order_seq_cst);
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
      }
      seen = generation_.load(std::memory_order_acquire);
      Drain();
    }
  }

  // Workers that rarely get to a product before the caller has claimed all of it, or that
  // keep the caller waiting again and again, are not getting a core (other processes hold
  // them): posting products to them only makes them poll, taking time from the caller. The
  // caller then works alone for a while (the workers go to sleep), longer each time a trial
  // window fails again. On an idle machine workers take part in nearly every product and this
  // never triggers.
  void Assess(bool helped, bool late) {
    helped_ += helped;
    late_ += late;
    if (++window_ < kWindow) return;
    if (late_ >= kLateInWindow || 4 * helped_ < kWindow) {
      solo_left_ = backoff_;
      backoff_ = std::min(2 * backoff_, kMaxSolo);
    } else {
      backoff_ = kMinSolo;
    }
    window_ = helped_ = late_ = 0;
  }

  std::mutex mutex_;
  int64_t solo_left_ = 0, backoff_ = kMinSolo;  // these four: the caller's, under mutex_
  int window_ = 0, helped_ = 0, late_ = 0;
  Problem problem_{};
  float* const* outputs_ = nullptr;
  std::atomic<uint64_t> state_{0};
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> done_{0};
  std::atomic<int> sleepers_{0};
};

int PoolSize() {
  if (const char* env = std::getenv("SPECJAX_CPU_THREADS")) return std::max(1, std::atoi(env));
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::clamp(CPU_COUNT(&set), 1, 8);
#endif
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
}

std::atomic<Pool*> global_pool{nullptr};
std::mutex global_pool_mutex;

// Built on first use and never destroyed (workers outlive exit handlers); after the first call a
// product pays one atomic load here. A forked child inherits no threads, so a fork handler drops
// the parent's pool and the child builds its own.
Pool& GlobalPool() {
  if (Pool* pool = global_pool.load(std::memory_order_acquire)) return *pool;
  std::lock_guard<std::mutex> lock(global_pool_mutex);
  Pool* pool = global_pool.load(std::memory_order_relaxed);
  if (pool == nullptr) {
    static const bool fork_handler = pthread_atfork(
        nullptr, nullptr, [] { global_pool.store(nullptr, std::memory_order_relaxed); }) == 0;
    (void)fork_handler;
    pool = new Pool(PoolSize());
    global_pool.store(pool, std::memory_order_release);
  }
  return *pool;
}

using Matrix = ffi::Buffer<ffi::F32, 2>;

// How a product's chunks are computed: kAdaptive (decoding) shares them with the pool unless
// the pool is resting; the others are for measuring the two ends of that (specjax's
// kernels/decision.py): kAlone, the calling thread computes them all (a busy machine), and
// kShared, always offered to the pool (an idle machine, however the pool judged itself).
enum Schedule : int32_t { kAdaptive = 0, kAlone = 1, kShared = 2 };

ffi::Error SmallMatmul(Matrix x, Matrix w, ffi::Result<Matrix> y, bool transposed,
                       int32_t schedule) {
  const auto x_dims = x.dimensions(), w_dims = w.dimensions();
  const Problem p{x.typed_data(), w.typed_data(), x_dims[0], x_dims[1],
                  transposed ? w_dims[0] : w_dims[1], transposed};
  if ((transposed ? w_dims[1] : w_dims[0]) != p.k) {
    return ffi::Error::InvalidArgument("specjax small matmul: contraction sizes differ");
  }
  Pool& pool = GlobalPool();
  const int chunks = Chunks(p);
  const int64_t size = p.m * p.n;
  thread_local std::vector<float> partials;
  thread_local std::vector<float*> outputs;
  partials.resize(transposed ? 0 : (chunks - 1) * size);
  outputs.assign(chunks, y->typed_data());
  for (int chunk = 1; chunk < chunks && !transposed; ++chunk) {
    outputs[chunk] = partials.data() + (chunk - 1) * size;
  }
  std::unique_lock<std::mutex> lock(pool.mutex(), std::try_to_lock);
  if (lock.owns_lock() && chunks > 1 && schedule != kAlone &&
      (schedule == kShared || !pool.Solo())) {
    pool.Run(p, chunks, outputs.data());
  } else {  // the pool is taken or resting, or kAlone: the same chunks in turn, so the same bits
    for (int chunk = 0; chunk < chunks; ++chunk) RunChunk(p, chunk, chunks, outputs.data());
  }
  if (!transposed) {
    float* out = outputs[0];
    for (int chunk = 1; chunk < chunks; ++chunk) {
      for (int64_t e = 0; e < size; ++e) out[e] += outputs[chunk][e];
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxSmallMatmulF32, SmallMatmul,
                              ffi::Ffi::Bind()
                                  .Arg<Matrix>()
                                  .Arg<Matrix>()
                                  .Ret<Matrix>()
                                  .Attr<bool>("transposed")
                                  .Attr<int32_t>("schedule"));
