#include "kernels/cuda/nn_kernels.h"

#include <cmath>

#include "kernels/nn_math.h"

namespace memwall {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp;  // one warp per row
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kMaxBlocks = 4096;

unsigned Blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}
unsigned RowBlocks(int64_t rows) {
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// nn_math.h's lane order: warp lane j < kRowLanes sums f(j), f(j + 16), ...
// in order (the CPU's lane j), then the lanes combine with widths 8, 4, 2,
// 1 exactly as the CPU's pairwise loop does. Every lane returns the total.
template <typename F>
__device__ float LaneSum(int64_t n, F f) {
  const int lane = threadIdx.x % kWarp;
  float v = 0.0f;
  if (lane < kRowLanes) {
    for (int64_t i = lane; i < n; i += kRowLanes) v += f(i);
  }
  for (int width = kRowLanes / 2; width > 0; width /= 2) {
    v += __shfl_down_sync(kFullMask, v, width);
  }
  return __shfl_sync(kFullMask, v, 0);
}

__device__ float RowMax(const float* x, int64_t n) {
  const int lane = threadIdx.x % kWarp;
  float max = -INFINITY;
  for (int64_t j = lane; j < n; j += kWarp) max = x[j] > max ? x[j] : max;
  for (int width = kWarp / 2; width > 0; width /= 2) {
    const float other = __shfl_down_sync(kFullMask, max, width);
    max = other > max ? other : max;
  }
  return __shfl_sync(kFullMask, max, 0);
}

// Grid-stride over rows, a warp per row. The loop bound is the same for the
// whole warp, so shuffles see every lane.
#define MW_FOR_EACH_ROW(row, rows)                                                        \
  for (int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarp; row < (rows); \
       row += int64_t{gridDim.x} * kRowsPerBlock)

__global__ void GeluForwardKernel(const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    y[i] = GeluElement(x[i]);
  }
}

__global__ void GeluBackwardKernel(const float* x, const float* dy, float* dx, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    dx[i] = GeluGradElement(x[i], dy[i]);
  }
}

__global__ void LayerNormForwardKernel(const float* x, const float* gamma, const float* beta,
                                       int64_t rows, int64_t h, float* y, float* stats) {
  const int lane = threadIdx.x % kWarp;
  MW_FOR_EACH_ROW(r, rows) {
    const float* xr = x + r * h;
    const float mean = LaneSum(h, [xr](int64_t i) { return xr[i]; }) / static_cast<float>(h);
    const float var = LaneSum(h, [xr, mean](int64_t i) {
                        const float c = xr[i] - mean;
                        return c * c;
                      }) /
                      static_cast<float>(h);
    const float rstd = 1.0f / sqrtf(var + kLayerNormEps);
    for (int64_t i = lane; i < h; i += kWarp) {
      y[r * h + i] = (xr[i] - mean) * rstd * gamma[i] + beta[i];
    }
    if (lane == 0) {
      stats[2 * r] = mean;
      stats[2 * r + 1] = rstd;
    }
  }
}

__global__ void LayerNormBackwardDxKernel(const float* dy, const float* x, const float* stats,
                                          const float* gamma, int64_t rows, int64_t h,
                                          float* dx) {
  const int lane = threadIdx.x % kWarp;
  MW_FOR_EACH_ROW(r, rows) {
    const float* xr = x + r * h;
    const float* dyr = dy + r * h;
    const float mean = stats[2 * r], rstd = stats[2 * r + 1];
    const float a = LaneSum(h, [dyr, gamma](int64_t i) { return dyr[i] * gamma[i]; }) /
                    static_cast<float>(h);
    const float b = LaneSum(h, [=](int64_t i) {
                      return LayerNormBTerm(dyr[i], gamma[i], xr[i], mean, rstd);
                    }) /
                    static_cast<float>(h);
    for (int64_t i = lane; i < h; i += kWarp) {
      dx[r * h + i] = LayerNormDx(dyr[i], gamma[i], xr[i], mean, rstd, a, b);
    }
  }
}

// A thread per column adds the rows in order, as the CPU loop does.
__global__ void LayerNormBackwardParamsKernel(const float* dy, const float* x, const float* stats,
                                              int64_t rows, int64_t h, float* dgamma,
                                              float* dbeta) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < h;
       i += int64_t{gridDim.x} * blockDim.x) {
    float g = dgamma[i], b = dbeta[i];
    for (int64_t r = 0; r < rows; ++r) {
      g += dy[r * h + i] * LayerNormXhat(x[r * h + i], stats[2 * r], stats[2 * r + 1]);
      b += dy[r * h + i];
    }
    dgamma[i] = g;
    dbeta[i] = b;
  }
}

__global__ void CausalSoftmaxForwardKernel(float* x, int64_t matrices, int64_t s) {
  const int lane = threadIdx.x % kWarp;
  MW_FOR_EACH_ROW(row, matrices * s) {
    float* xr = x + row * s;
    const int64_t n = row % s + 1;
    const float max = RowMax(xr, n);
    for (int64_t j = lane; j < n; j += kWarp) xr[j] = ExpF(xr[j] - max);
    __syncwarp();
    const float inv = 1.0f / LaneSum(n, [xr](int64_t j) { return xr[j]; });
    for (int64_t j = lane; j < s; j += kWarp) xr[j] = j < n ? xr[j] * inv : 0.0f;
  }
}

__global__ void CausalSoftmaxBackwardKernel(const float* probs, float* d, int64_t matrices,
                                            int64_t s) {
  const int lane = threadIdx.x % kWarp;
  MW_FOR_EACH_ROW(row, matrices * s) {
    const float* pr = probs + row * s;
    float* dr = d + row * s;
    const int64_t n = row % s + 1;
    const float dot = LaneSum(n, [pr, dr](int64_t j) { return dr[j] * pr[j]; });
    for (int64_t j = lane; j < s; j += kWarp) dr[j] = j < n ? pr[j] * (dr[j] - dot) : 0.0f;
  }
}

__global__ void CrossEntropyKernel(const float* logits, const float* targets, int64_t rows,
                                   int64_t vocab, float scale, float* dlogits, float* losses) {
  const int lane = threadIdx.x % kWarp;
  MW_FOR_EACH_ROW(r, rows) {
    const float* lr = logits + r * vocab;
    float* dr = dlogits + r * vocab;
    const int64_t t = static_cast<int64_t>(targets[r]);
    const float max = RowMax(lr, vocab);
    for (int64_t j = lane; j < vocab; j += kWarp) dr[j] = ExpF(lr[j] - max);
    __syncwarp();
    const float sum = LaneSum(vocab, [dr](int64_t j) { return dr[j]; });
    const float inv = scale / sum;
    for (int64_t j = lane; j < vocab; j += kWarp) {
      const float p = dr[j] * inv;
      dr[j] = j == t ? p - scale : p;
    }
    if (lane == 0) losses[r] = (logf(sum) + max) - lr[t];
  }
}

__global__ void BroadcastRowsKernel(const float* b, int64_t rows, int64_t cols, float* y) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = b[i % cols];
  }
}

__global__ void ColumnSumKernel(const float* x, int64_t rows, int64_t cols, float* sum) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cols;
       c += int64_t{gridDim.x} * blockDim.x) {
    if (rows > 0) sum[c] += PairwiseColumnSum(x, rows, cols, c);
  }
}

__global__ void EmbeddingForwardKernel(const float* ids, const float* wte, int64_t begin,
                                       int64_t end, const float* wpe, int64_t rows, int64_t seq,
                                       int64_t h, float* out) {
  const int64_t n = rows * h;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = k / h, i = k % h, id = static_cast<int64_t>(ids[r]);
    if (id >= begin && id < end) out[k] = wte[(id - begin) * h + i] + wpe[(r % seq) * h + i];
  }
}

// A thread per column walks the rows in order: the CPU's order for every
// element of dwte and dwpe, and no atomics (deterministic).
__global__ void EmbeddingBackwardKernel(const float* ids, const float* dout, int64_t rows,
                                        int64_t seq, int64_t h, int64_t begin, int64_t end,
                                        float* dwte, float* dwpe) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < h;
       i += int64_t{gridDim.x} * blockDim.x) {
    for (int64_t r = 0; r < rows; ++r) {
      const float d = dout[r * h + i];
      const int64_t id = static_cast<int64_t>(ids[r]);
      if (id >= begin && id < end) dwte[(id - begin) * h + i] += d;
      if (dwpe != nullptr) dwpe[(r % seq) * h + i] += d;
    }
  }
}

}  // namespace

cudaError_t GeluForward(const float* x, float* y, size_t n, cudaStream_t stream) {
  GeluForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t GeluBackward(const float* x, const float* dy, float* dx, size_t n,
                         cudaStream_t stream) {
  GeluBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, dy, dx, n);
  return cudaGetLastError();
}

cudaError_t LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                             int64_t h, float* y, float* stats, cudaStream_t stream) {
  LayerNormForwardKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(x, gamma, beta, rows, h, y,
                                                                    stats);
  return cudaGetLastError();
}

cudaError_t LayerNormBackward(const float* dy, const float* x, const float* stats,
                              const float* gamma, int64_t rows, int64_t h, float* dx,
                              float* dgamma, float* dbeta, cudaStream_t stream) {
  LayerNormBackwardDxKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(dy, x, stats, gamma, rows,
                                                                       h, dx);
  LayerNormBackwardParamsKernel<<<Blocks(h), kThreads, 0, stream>>>(dy, x, stats, rows, h, dgamma,
                                                                     dbeta);
  return cudaGetLastError();
}

cudaError_t CausalSoftmaxForward(float* x, int64_t matrices, int64_t s, cudaStream_t stream) {
  CausalSoftmaxForwardKernel<<<RowBlocks(matrices * s), kThreads, 0, stream>>>(x, matrices, s);
  return cudaGetLastError();
}

cudaError_t CausalSoftmaxBackward(const float* probs, float* d, int64_t matrices, int64_t s,
                                  cudaStream_t stream) {
  CausalSoftmaxBackwardKernel<<<RowBlocks(matrices * s), kThreads, 0, stream>>>(probs, d,
                                                                               matrices, s);
  return cudaGetLastError();
}

cudaError_t CrossEntropy(const float* logits, const float* targets, int64_t rows, int64_t vocab,
                         float scale, float* dlogits, float* losses, cudaStream_t stream) {
  CrossEntropyKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(logits, targets, rows, vocab,
                                                               scale, dlogits, losses);
  return cudaGetLastError();
}

cudaError_t BroadcastRows(const float* b, int64_t rows, int64_t cols, float* y,
                          cudaStream_t stream) {
  BroadcastRowsKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(b, rows, cols, y);
  return cudaGetLastError();
}

cudaError_t ColumnSum(const float* x, int64_t rows, int64_t cols, float* sum,
                      cudaStream_t stream) {
  ColumnSumKernel<<<Blocks(cols), kThreads, 0, stream>>>(x, rows, cols, sum);
  return cudaGetLastError();
}

cudaError_t EmbeddingForward(const float* ids, const float* wte, int64_t begin, int64_t end,
                             const float* wpe, int64_t rows, int64_t seq, int64_t h, float* out,
                             cudaStream_t stream) {
  EmbeddingForwardKernel<<<Blocks(rows * h), kThreads, 0, stream>>>(ids, wte, begin, end, wpe,
                                                                    rows, seq, h, out);
  return cudaGetLastError();
}

cudaError_t EmbeddingBackward(const float* ids, const float* dout, int64_t rows, int64_t seq,
                              int64_t h, int64_t begin, int64_t end, float* dwte, float* dwpe,
                              cudaStream_t stream) {
  EmbeddingBackwardKernel<<<Blocks(h), kThreads, 0, stream>>>(ids, dout, rows, seq, h, begin,
                                                              end, dwte, dwpe);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace memwall
