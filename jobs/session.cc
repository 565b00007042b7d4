#include "jobs/session.h"

#include "absl/strings/str_cat.h"
#include "engine/dry_run.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {

namespace {

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

}  // namespace

absl::StatusOr<JobSession> StartJob(Backend backend, int64_t capacity, int64_t pinned_bytes,
                                    int simulate_ranks, absl::Duration collective_timeout) {
  CommunicatorOptions world_options;
  world_options.timeout = collective_timeout;
  JobSession session;
  MW_ASSIGN_OR_RETURN(session.world, MpiCommunicator::Create(world_options));
  EngineOptions& engine = session.engine;
  engine.backend = backend;
  MW_ASSIGN_OR_RETURN(engine.device_bytes,
                      DeviceBytesFor(backend, capacity, session.world->rank()));
  engine.pinned_bytes = pinned_bytes;
  engine.simulate_ranks = simulate_ranks;
  engine.world = session.world.get();
  return session;
}

}  // namespace memwall
