#include "runtime/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace memwall {

absl::Status CudaStatus(cudaError_t code, absl::string_view call) {
  if (code == cudaSuccess) return absl::OkStatus();
  // Clear the sticky "last error" so a later check does not see this one.
  (void)cudaGetLastError();
  const std::string message = absl::StrCat(call, ": ", cudaGetErrorName(code),
                                           " (", cudaGetErrorString(code), ")");
  switch (code) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::UnavailableError(message);
    case cudaErrorInvalidValue:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CublasStatus(cublasStatus_t code, absl::string_view call) {
  if (code == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(call, ": ", cublasGetStatusName(code),
                                           " (", cublasGetStatusString(code), ")");
  switch (code) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace memwall
