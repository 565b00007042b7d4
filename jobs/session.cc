#include "jobs/session.h"

#include "absl/strings/str_cat.h"
#include "engine/dry_run.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {

absl::StatusOr<std::unique_ptr<MpiCommunicator>> StartWorld(absl::Duration timeout) {
  CommunicatorOptions options;
  options.timeout = timeout;
  return MpiCommunicator::Create(options);
}

absl::StatusOr<int64_t> DeviceBytesFor(Backend backend, int64_t given, int rank) {
  if (backend != Backend::kCuda || given > 0) return given;
  MW_ASSIGN_OR_RETURN(const int ordinal, CudaOrdinalForRank(rank));
  MW_ASSIGN_OR_RETURN(const int64_t free_bytes, CudaFreeBytes(ordinal));
  if (free_bytes <= kDeviceRuntimeAllowance) {
    return absl::ResourceExhaustedError(
        absl::StrCat("--device_memory: cuda:", ordinal, " has ", FormatBytes(free_bytes),
                     " free, no more than the CUDA runtime's allowance of ",
                     FormatBytes(kDeviceRuntimeAllowance), "; free the GPU or name a size"));
  }
  return free_bytes - kDeviceRuntimeAllowance;
}

EngineOptions CommandEngineOptions(Backend backend, int64_t device_bytes, int64_t pinned_bytes,
                                   int simulate_ranks, MpiCommunicator& world) {
  EngineOptions options;
  options.backend = backend;
  options.device_bytes = device_bytes;
  options.pinned_bytes = pinned_bytes;
  options.simulate_ranks = simulate_ranks;
  options.world = &world;
  return options;
}

}  // namespace memwall
