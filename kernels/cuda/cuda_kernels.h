// CUDA twins of the CPU kernels (kernels/cpu/cpu_kernels.h): same element
// math, same rounding. Plain functions returning cudaError_t so this header
// builds under nvcc without Abseil; kernels/ops.h turns errors into Status.
// All pointers are device memory (or managed/pinned memory the device can
// reach); work is enqueued on `stream` and completes asynchronously.
#ifndef MEMWALL_KERNELS_CUDA_CUDA_KERNELS_H_
#define MEMWALL_KERNELS_CUDA_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/elementwise.h"
#include "runtime/dtype.h"

namespace memwall {
namespace kernels {
namespace cuda {

// Blocks of the first reduction pass; SumOfSquares needs this many doubles
// of device workspace.
constexpr int kReductionBlocks = 256;

cudaError_t Fill(void* dst, DType dtype, size_t n, float value, cudaStream_t stream);
cudaError_t Cast(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                 size_t n, cudaStream_t stream);
cudaError_t Scale(void* x, DType dtype, size_t n, float alpha, cudaStream_t stream);
cudaError_t Accumulate(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
                       cudaStream_t stream);
cudaError_t Axpy(float alpha, const float* x, float* y, size_t n, cudaStream_t stream);
// Writes the sum of squares (in double, fixed reduction order for a given
// n) to *result; `partials` is kReductionBlocks doubles of workspace.
cudaError_t SumOfSquares(const void* x, DType dtype, size_t n, double* partials,
                         double* result, cudaStream_t stream);
// Sets *flag (device int) to 1 if any element is inf or nan, else 0.
cudaError_t HasInfOrNan(const void* x, DType dtype, size_t n, int* flag,
                        cudaStream_t stream);
// As KernelTable::adam.
cudaError_t Adam(const AdamConstants& constants, float* p, const void* g, DType g_dtype, float* m,
                 float* v, void* p_low, DType low_dtype, size_t n, cudaStream_t stream);

// As KernelTable::sgd.
cudaError_t Sgd(const SgdParams& params, float* p, const void* g, DType g_dtype,
                float* momentum_buffer, void* p_low, DType low_dtype, size_t n,
                cudaStream_t stream);

// As KernelTable::quantize_int8 and dequantize_int8 (block >= 1).
cudaError_t QuantizeInt8(const void* x, DType dtype, size_t n, size_t block, int8_t* q,
                         float* absmax, cudaStream_t stream);
cudaError_t DequantizeInt8(const int8_t* q, const float* absmax, size_t n, size_t block,
                           void* out, DType dtype, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace memwall

#endif  // MEMWALL_KERNELS_CUDA_CUDA_KERNELS_H_
