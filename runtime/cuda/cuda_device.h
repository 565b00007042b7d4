// The cuda backend (see device.h). Internal: callers use CreateDevice().
#ifndef MEMWALL_RUNTIME_CUDA_CUDA_DEVICE_H_
#define MEMWALL_RUNTIME_CUDA_CUDA_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/device.h"

namespace memwall {

// REQUIRES: options.backend == Backend::kCuda. Selects the GPU
// options.ordinal on the calling thread (cudaSetDevice).
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const DeviceOptions& options);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_CUDA_CUDA_DEVICE_H_
