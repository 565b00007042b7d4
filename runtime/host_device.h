// The host and meta backends (see device.h). Internal: callers use
// CreateDevice().
#ifndef MEMWALL_RUNTIME_HOST_DEVICE_H_
#define MEMWALL_RUNTIME_HOST_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/device.h"

namespace memwall {

// REQUIRES: options.backend is kHost or kMeta.
absl::StatusOr<std::unique_ptr<Device>> CreateHostOrMetaDevice(
    const DeviceOptions& options);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_HOST_DEVICE_H_
