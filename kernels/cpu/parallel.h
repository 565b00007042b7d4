// CPU kernels on several threads (OpenMP). Element-wise kernels split into
// contiguous chunks, so results are bit-for-bit those of one thread.
#ifndef MEMWALL_KERNELS_CPU_PARALLEL_H_
#define MEMWALL_KERNELS_CPU_PARALLEL_H_

#include <cstddef>

#include "kernels/cpu/cpu_kernels.h"

namespace memwall {
namespace kernels {
namespace cpu {

// Threads the host ops use: MEMWALL_CPU_THREADS if set (>= 1), else 1 (ranks
// are processes that already share the cores). Read once.
int CpuThreads();
// Whether MEMWALL_CPU_THREADS is set (CpuThreads is then its count). Read
// once, with CpuThreads.
bool CpuThreadsFromEnvironment();
// `configured` threads if > 0 (a config's cpu_threads), else CpuThreads().
inline int CpuThreadsOr(int configured) { return configured > 0 ? configured : CpuThreads(); }

// KernelTable::adam over `threads` threads (chunks of whole cache lines).
void ParallelAdam(const KernelTable& kernels, const AdamConstants& constants, float* p,
                  const void* g, DType g_dtype, float* m, float* v, void* p_low, DType low_dtype,
                  size_t n, int threads);

// KernelTable::adam_to over `threads` threads, chunked as ParallelAdam.
void ParallelAdamTo(const KernelTable& kernels, const AdamConstants& constants, const float* p,
                    const void* g, DType g_dtype, const float* m, const float* v, float* p_out,
                    float* m_out, float* v_out, void* p_low, DType low_dtype, size_t n,
                    int threads);

}  // namespace cpu
}  // namespace kernels
}  // namespace memwall

#endif  // MEMWALL_KERNELS_CPU_PARALLEL_H_
