// CUDA twins of the CPU neural-network kernels (NnKernelTable in
// kernels/cpu/cpu_kernels.h): same arguments, same math (kernels/nn_math.h),
// same reduction order, so they return the CPU's bits (the cross-entropy
// loss excepted: its log is the platform's). Plain functions returning
// cudaError_t so this header builds under nvcc without Abseil. Pointers are
// device memory; work is enqueued on `stream`.
#ifndef MEMWALL_KERNELS_CUDA_NN_KERNELS_H_
#define MEMWALL_KERNELS_CUDA_NN_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace memwall {
namespace kernels {
namespace cuda {

cudaError_t GeluForward(const float* x, float* y, size_t n, cudaStream_t stream);
cudaError_t GeluBackward(const float* x, const float* dy, float* dx, size_t n,
                         cudaStream_t stream);
cudaError_t LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                             int64_t h, float* y, float* stats, cudaStream_t stream);
cudaError_t LayerNormBackward(const float* dy, const float* x, const float* stats,
                              const float* gamma, int64_t rows, int64_t h, float* dx,
                              float* dgamma, float* dbeta, cudaStream_t stream);
cudaError_t CausalSoftmaxForward(float* x, int64_t matrices, int64_t s, cudaStream_t stream);
cudaError_t CausalSoftmaxBackward(const float* probs, float* d, int64_t matrices, int64_t s,
                                  cudaStream_t stream);
cudaError_t CrossEntropy(const float* logits, const float* targets, int64_t rows, int64_t vocab,
                         float scale, float* dlogits, float* losses, cudaStream_t stream);
cudaError_t BroadcastRows(const float* b, int64_t rows, int64_t cols, float* y,
                          cudaStream_t stream);
cudaError_t ColumnSum(const float* x, int64_t rows, int64_t cols, float* sum,
                      cudaStream_t stream);
cudaError_t EmbeddingForward(const float* ids, const float* wte, int64_t begin, int64_t end,
                             const float* wpe, int64_t rows, int64_t seq, int64_t h, float* out,
                             cudaStream_t stream);
cudaError_t EmbeddingBackward(const float* ids, const float* dout, int64_t rows, int64_t seq,
                              int64_t h, int64_t begin, int64_t end, float* dwte, float* dwpe,
                              cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace memwall

#endif  // MEMWALL_KERNELS_CUDA_NN_KERNELS_H_
