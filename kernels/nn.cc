#include "kernels/nn.h"

#include <cblas.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
#include "runtime/status.h"

#if MEMWALL_HAS_CUDA
#include <cublas_v2.h>

#include "kernels/cuda/nn_kernels.h"
#endif

namespace memwall {
namespace kernels {
namespace {

using internal::Dispatch;
#if MEMWALL_HAS_CUDA
using internal::CudaStreamOf;

// One cuBLAS handle per thread (cuBLAS handles are not for concurrent use),
// created on first use. Deliberately never destroyed: a thread_local
// destructor would run cublasDestroy after the CUDA runtime has shut down
// at process exit, which is undefined; the process's exit frees it.
absl::StatusOr<cublasHandle_t> ThreadCublas() {
  thread_local cublasHandle_t handle = nullptr;
  if (handle == nullptr) {
    MW_RETURN_IF_ERROR(CublasStatus(cublasCreate(&handle), "cublasCreate"));
  }
  return handle;
}
#else
using internal::NoCuda;
#endif

absl::Status CheckDims(absl::string_view op, std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat(op, ": a dimension is ", d, " (< 0)"));
  }
  return absl::OkStatus();
}

const cpu::NnKernelTable& Nn() { return cpu::NnKernels(); }

}  // namespace

absl::Status Gemm(Device& device, Stream& stream, bool trans_a, bool trans_b, int64_t m,
                  int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  MW_RETURN_IF_ERROR(CheckDims("Gemm", {m, n, k, lda, ldb, ldc}));
  if (ldc < n || lda < (trans_a ? m : k) || ldb < (trans_b ? k : n)) {
    return absl::InvalidArgumentError(absl::StrCat("Gemm: leading dimensions (", lda, ", ", ldb,
                                                   ", ", ldc, ") shorter than the rows"));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  return Dispatch(
      device, stream,
      [=] {
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                    ldc);
      },
      [&]() -> absl::Status {
#if MEMWALL_HAS_CUDA
        // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
        MW_ASSIGN_OR_RETURN(cublasHandle_t handle, ThreadCublas());
        MW_RETURN_IF_ERROR(
            CublasStatus(cublasSetStream(handle, CudaStreamOf(stream)), "cublasSetStream"));
        return CublasStatus(
            cublasSgemm(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                        trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                        static_cast<int>(m), static_cast<int>(k), &alpha, b, static_cast<int>(ldb),
                        a, static_cast<int>(lda), &beta, c, static_cast<int>(ldc)),
            "cublasSgemm");
#else
        return NoCuda();
#endif
      });
}

absl::Status GeluForward(Device& device, Stream& stream, const float* x, float* y, int64_t n) {
  MW_RETURN_IF_ERROR(CheckDims("GeluForward", {n}));
  return Dispatch(
      device, stream, [=] { Nn().gelu_forward(x, y, n); },
      [&] { return MW_CUDA_CALL(cuda::GeluForward(x, y, n, CudaStreamOf(stream)), "GeluForward"); });
}

absl::Status GeluBackward(Device& device, Stream& stream, const float* x, const float* dy,
                          float* dx, int64_t n) {
  MW_RETURN_IF_ERROR(CheckDims("GeluBackward", {n}));
  return Dispatch(
      device, stream, [=] { Nn().gelu_backward(x, dy, dx, n); },
      [&] {
        return MW_CUDA_CALL(cuda::GeluBackward(x, dy, dx, n, CudaStreamOf(stream)),
                            "GeluBackward");
      });
}

absl::Status LayerNormForward(Device& device, Stream& stream, const float* x, const float* gamma,
                              const float* beta, int64_t rows, int64_t h, float* y,
                              float* stats) {
  MW_RETURN_IF_ERROR(CheckDims("LayerNormForward", {rows, h}));
  return Dispatch(
      device, stream, [=] { Nn().layer_norm_forward(x, gamma, beta, rows, h, y, stats); },
      [&] {
        return MW_CUDA_CALL(
            cuda::LayerNormForward(x, gamma, beta, rows, h, y, stats, CudaStreamOf(stream)),
            "LayerNormForward");
      });
}

absl::Status LayerNormBackward(Device& device, Stream& stream, const float* dy, const float* x,
                               const float* stats, const float* gamma, int64_t rows, int64_t h,
                               float* dx, float* dgamma, float* dbeta) {
  MW_RETURN_IF_ERROR(CheckDims("LayerNormBackward", {rows, h}));
  return Dispatch(
      device, stream,
      [=] { Nn().layer_norm_backward(dy, x, stats, gamma, rows, h, dx, dgamma, dbeta); },
      [&] {
        return MW_CUDA_CALL(cuda::LayerNormBackward(dy, x, stats, gamma, rows, h, dx, dgamma,
                                                    dbeta, CudaStreamOf(stream)),
                            "LayerNormBackward");
      });
}

absl::Status CausalSoftmaxForward(Device& device, Stream& stream, float* x, int64_t matrices,
                                  int64_t s) {
  MW_RETURN_IF_ERROR(CheckDims("CausalSoftmaxForward", {matrices, s}));
  return Dispatch(
      device, stream, [=] { Nn().causal_softmax_forward(x, matrices, s); },
      [&] {
        return MW_CUDA_CALL(cuda::CausalSoftmaxForward(x, matrices, s, CudaStreamOf(stream)),
                            "CausalSoftmaxForward");
      });
}

absl::Status CausalSoftmaxBackward(Device& device, Stream& stream, const float* probs, float* d,
                                   int64_t matrices, int64_t s) {
  MW_RETURN_IF_ERROR(CheckDims("CausalSoftmaxBackward", {matrices, s}));
  return Dispatch(
      device, stream, [=] { Nn().causal_softmax_backward(probs, d, matrices, s); },
      [&] {
        return MW_CUDA_CALL(
            cuda::CausalSoftmaxBackward(probs, d, matrices, s, CudaStreamOf(stream)),
            "CausalSoftmaxBackward");
      });
}

absl::Status BroadcastRows(Device& device, Stream& stream, const float* b, int64_t rows,
                           int64_t cols, float* y) {
  MW_RETURN_IF_ERROR(CheckDims("BroadcastRows", {rows, cols}));
  return Dispatch(
      device, stream, [=] { Nn().broadcast_rows(b, rows, cols, y); },
      [&] {
        return MW_CUDA_CALL(cuda::BroadcastRows(b, rows, cols, y, CudaStreamOf(stream)),
                            "BroadcastRows");
      });
}

absl::Status ColumnSum(Device& device, Stream& stream, const float* x, int64_t rows,
                       int64_t cols, float* sum) {
  MW_RETURN_IF_ERROR(CheckDims("ColumnSum", {rows, cols}));
  return Dispatch(
      device, stream, [=] { Nn().column_sum(x, rows, cols, sum); },
      [&] {
        return MW_CUDA_CALL(cuda::ColumnSum(x, rows, cols, sum, CudaStreamOf(stream)),
                            "ColumnSum");
      });
}

namespace {

// The checks both embedding kernels share; `what` names the kernel.
absl::Status CheckEmbedding(absl::string_view what, int64_t rows, int64_t seq, int64_t h,
                            int64_t begin, int64_t end) {
  MW_RETURN_IF_ERROR(CheckDims(what, {rows, h}));
  if (seq < 1) return absl::InvalidArgumentError(absl::StrCat(what, ": seq must be >= 1"));
  if (begin < 0 || end <= begin) {
    return absl::InvalidArgumentError(absl::StrCat(what,
                                                   ": expected a vocabulary tile [begin, end) "
                                                   "with 0 <= begin < end, got [",
                                                   begin, ", ", end, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingForward(Device& device, Stream& stream, const float* ids, const float* wte,
                              int64_t begin, int64_t end, const float* wpe, int64_t rows,
                              int64_t seq, int64_t h, float* out) {
  MW_RETURN_IF_ERROR(CheckEmbedding("EmbeddingForward", rows, seq, h, begin, end));
  return Dispatch(
      device, stream, [=] { Nn().embedding_forward(ids, wte, begin, end, wpe, rows, seq, h, out); },
      [&] {
        return MW_CUDA_CALL(cuda::EmbeddingForward(ids, wte, begin, end, wpe, rows, seq, h, out,
                                                   CudaStreamOf(stream)),
                            "EmbeddingForward");
      });
}

absl::Status EmbeddingBackward(Device& device, Stream& stream, const float* ids, const float* dout,
                               int64_t rows, int64_t seq, int64_t h, int64_t begin, int64_t end,
                               float* dwte, float* dwpe) {
  MW_RETURN_IF_ERROR(CheckEmbedding("EmbeddingBackward", rows, seq, h, begin, end));
  return Dispatch(
      device, stream,
      [=] { Nn().embedding_backward(ids, dout, rows, seq, h, begin, end, dwte, dwpe); },
      [&] {
        return MW_CUDA_CALL(cuda::EmbeddingBackward(ids, dout, rows, seq, h, begin, end, dwte, dwpe,
                                                    CudaStreamOf(stream)),
                            "EmbeddingBackward");
      });
}

absl::StatusOr<double> CrossEntropy(Device& device, Stream& stream, const float* logits,
                                    const float* targets, int64_t rows, int64_t vocab,
                                    float scale, float* dlogits) {
  MW_RETURN_IF_ERROR(CheckDims("CrossEntropy", {rows}));
  if (vocab < 1) return absl::InvalidArgumentError("CrossEntropy: vocab must be >= 1");
  if (rows == 0) return 0.0;
  if (device.backend() == Backend::kMeta) {  // no value, but the wait a real run makes
    MW_RETURN_IF_ERROR(stream.Synchronize());
    return 0.0;
  }
  std::vector<float> losses(rows);
  if (device.backend() == Backend::kHost) {
    float* out = losses.data();
    MW_RETURN_IF_ERROR(stream.RunHost([=] {
      Nn().cross_entropy(logits, targets, rows, vocab, scale, dlogits, out);
      return absl::OkStatus();
    }));
    MW_RETURN_IF_ERROR(stream.Synchronize());  // `losses` is read below
  } else {
#if MEMWALL_HAS_CUDA
    MW_ASSIGN_OR_RETURN(DeviceBuffer workspace,
                        device.Allocate(rows * sizeof(float), MemoryCategory::kWorkspace,
                                        "kernels.cross_entropy"));
    auto* device_losses = static_cast<float*>(workspace.data());
    MW_RETURN_IF_ERROR(MW_CUDA_CALL(cuda::CrossEntropy(logits, targets, rows, vocab, scale, dlogits,
                                                       device_losses, CudaStreamOf(stream)),
                                    "CrossEntropy"));
    MW_RETURN_IF_ERROR(
        device.CopyAsync(losses.data(), device_losses, rows * sizeof(float), stream));
    MW_RETURN_IF_ERROR(stream.Synchronize());  // before `workspace` goes
#else
    return NoCuda();
#endif
  }
  double sum = 0;
  for (float l : losses) sum += l;
  return sum;
}

absl::Status CheckIds(Device& device, Stream& stream, const float* ids, int64_t n, int64_t limit,
                      absl::string_view what) {
  if (n == 0) return absl::OkStatus();
  // Meta reads no ids but waits where a host run does (cuda waits once more
  // for the copy below).
  MW_RETURN_IF_ERROR(stream.Synchronize());
  if (device.backend() == Backend::kMeta) return absl::OkStatus();
  std::vector<float> copy;
  const float* host = ids;
  if (device.backend() == Backend::kCuda) {
    copy.resize(n);
    MW_RETURN_IF_ERROR(device.CopyAsync(copy.data(), ids, n * sizeof(float), stream));
    MW_RETURN_IF_ERROR(stream.Synchronize());
    host = copy.data();
  }
  for (int64_t i = 0; i < n; ++i) {
    const float v = host[i];
    if (!(v >= 0 && v < static_cast<float>(limit)) || v != std::floor(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", i, " is ", v, "; expected an id in 0..", limit - 1));
    }
  }
  return absl::OkStatus();
}

}  // namespace kernels
}  // namespace memwall
