// Internal to kernels/: how an op reaches its backend. Included by the op
// files (ops.cc, nn.cc), which build with MEMWALL_HAS_CUDA=1 unless the
// build is --config=nocuda. Not a public header.
#ifndef MEMWALL_KERNELS_DISPATCH_H_
#define MEMWALL_KERNELS_DISPATCH_H_

#include "absl/status/status.h"
#include "runtime/device.h"

#if MEMWALL_HAS_CUDA
#include <cuda_runtime_api.h>

#include "runtime/cuda/cuda_status.h"
#endif

namespace memwall {
namespace kernels {
namespace internal {

#if MEMWALL_HAS_CUDA
inline cudaStream_t CudaStreamOf(Stream& stream) {
  return static_cast<cudaStream_t>(stream.native_handle());
}
// A CUDA launch as a Status naming the kernel.
#define MW_CUDA_CALL(call, name) ::memwall::CudaStatus((call), name)
#else
// For cuda calls when the build has no CUDA (CreateDevice never makes such a
// device then, so this only guards against a foreign Device subclass).
inline absl::Status NoCuda() {
  return absl::UnimplementedError(
      "the cuda backend is not in this build (it was built with --config=nocuda)");
}
#define MW_CUDA_CALL(call, name) ::memwall::kernels::internal::NoCuda()
#endif

// Runs `host` in `stream`'s order on host (it may run later, on the
// stream's thread, so it captures by value), `cuda` (returning a Status) on
// cuda, nothing on meta; counts one launch on every backend.
template <typename Host, typename Cuda>
absl::Status Dispatch(Device& device, Stream& stream, Host host, Cuda cuda) {
  device.CountLaunch();
  switch (device.backend()) {
    case Backend::kHost:
      return stream.RunHost([host] {
        host();
        return absl::OkStatus();
      });
    case Backend::kMeta:
      return absl::OkStatus();
    case Backend::kCuda:
      return cuda();
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace kernels
}  // namespace memwall

#endif  // MEMWALL_KERNELS_DISPATCH_H_
