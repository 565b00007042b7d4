#include "runtime/device.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/host_device.h"
#include "runtime/units.h"

#if MEMWALL_HAS_CUDA
#include "runtime/cuda/cuda_device.h"
#endif

namespace memwall {

absl::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kHost: return "host";
    case Backend::kMeta: return "meta";
    case Backend::kCuda: return "cuda";
  }
  return "unknown";
}

absl::StatusOr<Backend> ParseBackend(absl::string_view name) {
  if (name == "host") return Backend::kHost;
  if (name == "meta") return Backend::kMeta;
  if (name == "cuda") return Backend::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("backend: expected one of host, meta, cuda; got '", name, "'"));
}

absl::StatusOr<DeviceBuffer> Device::AllocatePinned(size_t bytes, MemoryCategory category,
                                                     absl::string_view owner) {
  if (pinned_allocator_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        name(), " has no pinned host pool (create it with DeviceOptions.pinned_capacity_bytes > 0)"));
  }
  return pinned_allocator_->Allocate(bytes, category, owner);
}

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options) {
  if (options.ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ordinal: expected >= 0, got ", options.ordinal));
  }
  if (options.pinned_capacity_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pinned capacity: expected >= 0 bytes, got ", options.pinned_capacity_bytes));
  }
  if (options.capacity_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device capacity: expected >= 0 bytes, got ", options.capacity_bytes));
  }
  switch (options.backend) {
    case Backend::kHost:
    case Backend::kMeta:
      if (options.capacity_bytes == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "device capacity: the ", BackendName(options.backend),
            " backend needs a capacity in bytes (e.g. ", 256 * kMiB,
            " for 256 MiB)"));
      }
      return CreateHostOrMetaDevice(options);
    case Backend::kCuda:
#if MEMWALL_HAS_CUDA
      return CreateCudaDevice(options);
#else
      return absl::UnimplementedError(
          "the cuda backend is not in this build (it was built with "
          "--config=nocuda)");
#endif
  }
  return absl::InvalidArgumentError("unknown backend");
}

#if !MEMWALL_HAS_CUDA
int CudaDeviceCount() { return 0; }
#endif

bool CudaDeviceAvailable() { return CudaDeviceCount() > 0; }

}  // namespace memwall
