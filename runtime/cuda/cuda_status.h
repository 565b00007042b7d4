// CUDA runtime and cuBLAS error codes as absl::Status values naming the call.
// Out-of-memory codes map to kResourceExhausted (the allocator and the pager
// branch on it); a missing GPU or driver maps to kUnavailable; everything
// else to kInternal.
#ifndef MEMWALL_RUNTIME_CUDA_CUDA_STATUS_H_
#define MEMWALL_RUNTIME_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace memwall {

// OK for cudaSuccess; otherwise "<call>: <cudaErrorName> (<description>)".
absl::Status CudaStatus(cudaError_t code, absl::string_view call);
// OK for CUBLAS_STATUS_SUCCESS; otherwise "<call>: <CUBLAS_STATUS_...>".
absl::Status CublasStatus(cublasStatus_t code, absl::string_view call);

}  // namespace memwall

// Returns a Status naming the call when the CUDA runtime call fails.
#define MW_CUDA_RETURN_IF_ERROR(call) \
  MW_RETURN_IF_ERROR(::memwall::CudaStatus((call), #call))

#endif  // MEMWALL_RUNTIME_CUDA_CUDA_STATUS_H_
