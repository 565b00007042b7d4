#include "kernels/cpu/parallel.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace memwall {
namespace kernels {
namespace cpu {
namespace {

// Chunks are multiples of 64 elements (256 bytes of f32, 128 of bf16): whole
// cache lines for every array, so threads never share a line.
constexpr size_t kChunkQuantum = 64;

// MEMWALL_CPU_THREADS, read once: 0 when unset or empty; 1 (with a
// warning) when it is not a count >= 1.
int EnvironmentThreads() {
  static const int threads = [] {
    const char* text = std::getenv("MEMWALL_CPU_THREADS");
    if (text == nullptr || *text == '\0') return 0;
    const int count = std::atoi(text);
    if (count < 1) {
      std::fprintf(stderr, "memwall: MEMWALL_CPU_THREADS=%s is not a count >= 1; using 1\n", text);
      return 1;
    }
    return count;
  }();
  return threads;
}

}  // namespace

int CpuThreads() { return std::max(EnvironmentThreads(), 1); }

bool CpuThreadsFromEnvironment() { return EnvironmentThreads() > 0; }

namespace {

// Runs fn(begin, end) over [0, n) split into `threads` contiguous ranges of
// whole chunks (the ceiling of n / threads, rounded up: the last thread may
// get less, never leave elements behind); on the caller's thread alone for
// one thread or a short n.
template <typename Fn>
void ForEachRange(size_t n, int threads, const Fn& fn) {
  threads = std::max(1, threads);
  if (threads == 1 || n < 2 * kChunkQuantum) {
    fn(size_t{0}, n);
    return;
  }
  const size_t share = (n + threads - 1) / threads;
  const size_t per = (share + kChunkQuantum - 1) / kChunkQuantum * kChunkQuantum;
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int t = 0; t < threads; ++t) {
    const size_t begin = std::min(n, per * t);
    const size_t end = std::min(n, begin + per);
    if (begin < end) fn(begin, end);
  }
}

}  // namespace

void ParallelAdam(const KernelTable& k, const AdamConstants& c, float* p, const void* g,
                  DType g_dtype, float* m, float* v, void* p_low, DType low_dtype, size_t n,
                  int threads) {
  const size_t low_size = DTypeSize(low_dtype), g_size = DTypeSize(g_dtype);
  ForEachRange(n, threads, [&](size_t begin, size_t end) {
    void* low = p_low == nullptr ? nullptr : static_cast<char*>(p_low) + begin * low_size;
    k.adam(c, p + begin, static_cast<const char*>(g) + begin * g_size, g_dtype, m + begin,
           v + begin, low, low_dtype, end - begin);
  });
}

void ParallelAdamTo(const KernelTable& k, const AdamConstants& c, const float* p, const void* g,
                    DType g_dtype, const float* m, const float* v, float* p_out, float* m_out,
                    float* v_out, void* p_low, DType low_dtype, size_t n, int threads) {
  const size_t low_size = DTypeSize(low_dtype), g_size = DTypeSize(g_dtype);
  ForEachRange(n, threads, [&](size_t begin, size_t end) {
    void* low = p_low == nullptr ? nullptr : static_cast<char*>(p_low) + begin * low_size;
    k.adam_to(c, p + begin, static_cast<const char*>(g) + begin * g_size, g_dtype, m + begin,
              v + begin, p_out + begin, m_out + begin, v_out + begin, low, low_dtype, end - begin);
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace memwall
