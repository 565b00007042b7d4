#include "kernels/cuda/cuda_kernels.h"

#include <cstdint>
#include <cstring>

namespace memwall {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops cap the grid: enough blocks to fill any current GPU.
constexpr size_t kMaxBlocks = 4096;

unsigned Blocks(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

template <DType D>
using T = typename Storage<D>::Type;

template <DType D>
__global__ void FillKernel(T<D>* out, size_t n, T<D> value) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = value;
  }
}

template <DType S, DType D>
__global__ void CastKernel(const T<S>* in, T<D>* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = Storage<D>::Store(Storage<S>::Load(in[i]));
  }
}

template <DType S, DType D>
__global__ void AccumulateKernel(const T<S>* in, T<D>* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = Storage<D>::Store(Storage<D>::Load(out[i]) + Storage<S>::Load(in[i]));
  }
}

template <DType S>
void LaunchAccumulateFrom(const void* src, void* dst, DType dst_dtype, size_t n,
                          cudaStream_t stream) {
  const auto* in = static_cast<const T<S>*>(src);
  switch (dst_dtype) {
    case DType::kF32:
      AccumulateKernel<S, DType::kF32><<<Blocks(n), kThreads, 0, stream>>>(
          in, static_cast<float*>(dst), n);
      break;
    case DType::kBF16:
      AccumulateKernel<S, DType::kBF16><<<Blocks(n), kThreads, 0, stream>>>(
          in, static_cast<uint16_t*>(dst), n);
      break;
    case DType::kF16:
      AccumulateKernel<S, DType::kF16><<<Blocks(n), kThreads, 0, stream>>>(
          in, static_cast<uint16_t*>(dst), n);
      break;
  }
}

template <DType D>
__global__ void ScaleKernel(T<D>* x, size_t n, float alpha) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    x[i] = Storage<D>::Store(Storage<D>::Load(x[i]) * alpha);
  }
}

__global__ void AxpyKernel(float alpha, const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    y[i] = y[i] + alpha * x[i];
  }
}

__device__ double BlockSum(double value) {
  __shared__ double shared[kThreads];
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
  return shared[0];
}

template <DType D>
__global__ void SumOfSquaresKernel(const T<D>* x, size_t n, double* partials) {
  double sum = 0.0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const double value = Storage<D>::Load(x[i]);
    sum += value * value;
  }
  const double block = BlockSum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = block;
}

__global__ void FinishSumKernel(const double* partials, double* result) {
  const double total = BlockSum(threadIdx.x < kReductionBlocks ? partials[threadIdx.x] : 0.0);
  if (threadIdx.x == 0) *result = total;
}

template <DType D>
__global__ void HasInfOrNanKernel(const T<D>* x, size_t n, int* flag) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    if (Storage<D>::NonFinite(x[i])) *flag = 1;  // benign race: all write 1
  }
}

template <DType G, DType Low, bool kCopy>
__global__ void AdamKernel(AdamConstants c, float* p, const T<G>* g, float* m,
                           float* v, T<Low>* low, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    float pi = p[i], mi = m[i], vi = v[i];
    AdamElement(c, pi, Storage<G>::Load(g[i]), mi, vi);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (kCopy) low[i] = Storage<Low>::Store(pi);
  }
}

template <DType G, DType Low, bool kCopy>
__global__ void SgdKernel(SgdParams c, float* p, const T<G>* g, float* buf, T<Low>* low,
                          size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    float pi = p[i];
    SgdElement(c, pi, Storage<G>::Load(g[i]), buf != nullptr ? &buf[i] : nullptr);
    p[i] = pi;
    if (kCopy) low[i] = Storage<Low>::Store(pi);
  }
}

template <DType S>
void LaunchCastFrom(const void* src, void* dst, DType dst_dtype, size_t n,
                    cudaStream_t stream) {
  const auto* in = static_cast<const T<S>*>(src);
  switch (dst_dtype) {
    case DType::kF32:
      CastKernel<S, DType::kF32><<<Blocks(n), kThreads, 0, stream>>>(
          in, static_cast<float*>(dst), n);
      break;
    case DType::kBF16:
      CastKernel<S, DType::kBF16><<<Blocks(n), kThreads, 0, stream>>>(
          in, static_cast<uint16_t*>(dst), n);
      break;
    case DType::kF16:
      CastKernel<S, DType::kF16><<<Blocks(n), kThreads, 0, stream>>>(
          in, static_cast<uint16_t*>(dst), n);
      break;
  }
}

// One CUDA block per quantization block (grid-stride over blocks): the
// threads' largest AbsBits reduced in shared memory (a max of integers:
// the order does not change the result), then each thread quantizes its
// elements.
template <DType D>
__global__ void QuantizeInt8Kernel(const T<D>* x, size_t n, size_t block, int8_t* q,
                                   float* absmax) {
  __shared__ uint32_t shared[kThreads];
  const size_t blocks = (n + block - 1) / block;
  for (size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const size_t begin = b * block;
    const size_t end = n - begin < block ? n : begin + block;
    uint32_t bits = 0;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      bits = max(bits, AbsBits(Storage<D>::Load(x[i])));
    }
    shared[threadIdx.x] = bits;
    __syncthreads();
    for (int width = kThreads / 2; width > 0; width /= 2) {
      if (threadIdx.x < width) {
        shared[threadIdx.x] = max(shared[threadIdx.x], shared[threadIdx.x + width]);
      }
      __syncthreads();
    }
    const float a = BitsFloat(shared[0]);
    if (threadIdx.x == 0) absmax[b] = a;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      q[i] = kernels::QuantizeInt8(Storage<D>::Load(x[i]), a);
    }
    __syncthreads();  // shared[0] read by all before the next block's reduction
  }
}

template <DType D>
__global__ void DequantizeInt8Kernel(const int8_t* q, const float* absmax, size_t n,
                                     size_t block, T<D>* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = Storage<D>::Store(kernels::DequantizeInt8(q[i], absmax[i / block]));
  }
}

unsigned QuantBlocks(size_t n, size_t block) {
  const size_t blocks = (n + block - 1) / block;
  return static_cast<unsigned>(blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

}  // namespace

cudaError_t Fill(void* dst, DType dtype, size_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kF32:
      FillKernel<DType::kF32><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<float*>(dst), n, value);
      break;
    case DType::kBF16:
      FillKernel<DType::kBF16><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<uint16_t*>(dst), n, F32ToBf16(value));
      break;
    case DType::kF16:
      FillKernel<DType::kF16><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<uint16_t*>(dst), n, F32ToF16(value));
      break;
  }
  return cudaGetLastError();
}

cudaError_t Cast(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                 size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (src_dtype == dst_dtype) {
    return cudaMemcpyAsync(dst, src, n * DTypeSize(src_dtype), cudaMemcpyDefault, stream);
  }
  switch (src_dtype) {
    case DType::kF32: LaunchCastFrom<DType::kF32>(src, dst, dst_dtype, n, stream); break;
    case DType::kBF16: LaunchCastFrom<DType::kBF16>(src, dst, dst_dtype, n, stream); break;
    case DType::kF16: LaunchCastFrom<DType::kF16>(src, dst, dst_dtype, n, stream); break;
  }
  return cudaGetLastError();
}

cudaError_t Scale(void* x, DType dtype, size_t n, float alpha, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kF32:
      ScaleKernel<DType::kF32><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<float*>(x), n, alpha);
      break;
    case DType::kBF16:
      ScaleKernel<DType::kBF16><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<uint16_t*>(x), n, alpha);
      break;
    case DType::kF16:
      ScaleKernel<DType::kF16><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<uint16_t*>(x), n, alpha);
      break;
  }
  return cudaGetLastError();
}

cudaError_t Accumulate(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (src_dtype) {
    case DType::kF32: LaunchAccumulateFrom<DType::kF32>(src, dst, dst_dtype, n, stream); break;
    case DType::kBF16: LaunchAccumulateFrom<DType::kBF16>(src, dst, dst_dtype, n, stream); break;
    case DType::kF16: LaunchAccumulateFrom<DType::kF16>(src, dst, dst_dtype, n, stream); break;
  }
  return cudaGetLastError();
}

cudaError_t Axpy(float alpha, const float* x, float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AxpyKernel<<<Blocks(n), kThreads, 0, stream>>>(alpha, x, y, n);
  return cudaGetLastError();
}

cudaError_t SumOfSquares(const void* x, DType dtype, size_t n, double* partials,
                         double* result, cudaStream_t stream) {
  switch (dtype) {
    case DType::kF32:
      SumOfSquaresKernel<DType::kF32><<<kReductionBlocks, kThreads, 0, stream>>>(
          static_cast<const float*>(x), n, partials);
      break;
    case DType::kBF16:
      SumOfSquaresKernel<DType::kBF16><<<kReductionBlocks, kThreads, 0, stream>>>(
          static_cast<const uint16_t*>(x), n, partials);
      break;
    case DType::kF16:
      SumOfSquaresKernel<DType::kF16><<<kReductionBlocks, kThreads, 0, stream>>>(
          static_cast<const uint16_t*>(x), n, partials);
      break;
  }
  static_assert(kReductionBlocks <= kThreads, "one block finishes the sum");
  FinishSumKernel<<<1, kThreads, 0, stream>>>(partials, result);
  return cudaGetLastError();
}

cudaError_t HasInfOrNan(const void* x, DType dtype, size_t n, int* flag,
                        cudaStream_t stream) {
  cudaError_t status = cudaMemsetAsync(flag, 0, sizeof(int), stream);
  if (status != cudaSuccess || n == 0) return status;
  switch (dtype) {
    case DType::kF32:
      HasInfOrNanKernel<DType::kF32><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<const float*>(x), n, flag);
      break;
    case DType::kBF16:
      HasInfOrNanKernel<DType::kBF16><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<const uint16_t*>(x), n, flag);
      break;
    case DType::kF16:
      HasInfOrNanKernel<DType::kF16><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<const uint16_t*>(x), n, flag);
      break;
  }
  return cudaGetLastError();
}

template <DType G>
void LaunchAdam(const AdamConstants& c, float* p, const void* g_in, float* m, float* v,
                void* p_low, DType low_dtype, size_t n, cudaStream_t stream) {
  const auto* g = static_cast<const T<G>*>(g_in);
  if (p_low == nullptr) {
    AdamKernel<G, DType::kF32, false><<<Blocks(n), kThreads, 0, stream>>>(
        c, p, g, m, v, nullptr, n);
    return;
  }
  switch (low_dtype) {
    case DType::kF32:
      AdamKernel<G, DType::kF32, true><<<Blocks(n), kThreads, 0, stream>>>(
          c, p, g, m, v, static_cast<float*>(p_low), n);
      break;
    case DType::kBF16:
      AdamKernel<G, DType::kBF16, true><<<Blocks(n), kThreads, 0, stream>>>(
          c, p, g, m, v, static_cast<uint16_t*>(p_low), n);
      break;
    case DType::kF16:
      AdamKernel<G, DType::kF16, true><<<Blocks(n), kThreads, 0, stream>>>(
          c, p, g, m, v, static_cast<uint16_t*>(p_low), n);
      break;
  }
}

cudaError_t Adam(const AdamConstants& c, float* p, const void* g, DType g_dtype, float* m,
                 float* v, void* p_low, DType low_dtype, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (g_dtype) {
    case DType::kF32: LaunchAdam<DType::kF32>(c, p, g, m, v, p_low, low_dtype, n, stream); break;
    case DType::kBF16: LaunchAdam<DType::kBF16>(c, p, g, m, v, p_low, low_dtype, n, stream); break;
    case DType::kF16: LaunchAdam<DType::kF16>(c, p, g, m, v, p_low, low_dtype, n, stream); break;
  }
  return cudaGetLastError();
}

template <DType G>
void LaunchSgd(const SgdParams& c, float* p, const void* g_in, float* buf, void* p_low,
               DType low_dtype, size_t n, cudaStream_t stream) {
  const auto* g = static_cast<const T<G>*>(g_in);
  if (p_low == nullptr) {
    SgdKernel<G, DType::kF32, false><<<Blocks(n), kThreads, 0, stream>>>(c, p, g, buf, nullptr,
                                                                         n);
    return;
  }
  switch (low_dtype) {
    case DType::kF32:
      SgdKernel<G, DType::kF32, true><<<Blocks(n), kThreads, 0, stream>>>(
          c, p, g, buf, static_cast<float*>(p_low), n);
      break;
    case DType::kBF16:
      SgdKernel<G, DType::kBF16, true><<<Blocks(n), kThreads, 0, stream>>>(
          c, p, g, buf, static_cast<uint16_t*>(p_low), n);
      break;
    case DType::kF16:
      SgdKernel<G, DType::kF16, true><<<Blocks(n), kThreads, 0, stream>>>(
          c, p, g, buf, static_cast<uint16_t*>(p_low), n);
      break;
  }
}

cudaError_t Sgd(const SgdParams& c, float* p, const void* g, DType g_dtype, float* buf,
                void* p_low, DType low_dtype, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (g_dtype) {
    case DType::kF32: LaunchSgd<DType::kF32>(c, p, g, buf, p_low, low_dtype, n, stream); break;
    case DType::kBF16: LaunchSgd<DType::kBF16>(c, p, g, buf, p_low, low_dtype, n, stream); break;
    case DType::kF16: LaunchSgd<DType::kF16>(c, p, g, buf, p_low, low_dtype, n, stream); break;
  }
  return cudaGetLastError();
}

cudaError_t QuantizeInt8(const void* x, DType dtype, size_t n, size_t block, int8_t* q,
                         float* absmax, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned grid = QuantBlocks(n, block);
  switch (dtype) {
    case DType::kF32:
      QuantizeInt8Kernel<DType::kF32><<<grid, kThreads, 0, stream>>>(
          static_cast<const float*>(x), n, block, q, absmax);
      break;
    case DType::kBF16:
      QuantizeInt8Kernel<DType::kBF16><<<grid, kThreads, 0, stream>>>(
          static_cast<const uint16_t*>(x), n, block, q, absmax);
      break;
    case DType::kF16:
      QuantizeInt8Kernel<DType::kF16><<<grid, kThreads, 0, stream>>>(
          static_cast<const uint16_t*>(x), n, block, q, absmax);
      break;
  }
  return cudaGetLastError();
}

cudaError_t DequantizeInt8(const int8_t* q, const float* absmax, size_t n, size_t block,
                           void* out, DType dtype, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kF32:
      DequantizeInt8Kernel<DType::kF32><<<Blocks(n), kThreads, 0, stream>>>(
          q, absmax, n, block, static_cast<float*>(out));
      break;
    case DType::kBF16:
      DequantizeInt8Kernel<DType::kBF16><<<Blocks(n), kThreads, 0, stream>>>(
          q, absmax, n, block, static_cast<uint16_t*>(out));
      break;
    case DType::kF16:
      DequantizeInt8Kernel<DType::kF16><<<Blocks(n), kThreads, 0, stream>>>(
          q, absmax, n, block, static_cast<uint16_t*>(out));
      break;
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace memwall
