// What the jobs (train, profile) share: their MPI
// world, device capacity and engine options.
#ifndef MEMWALL_JOBS_SESSION_H_
#define MEMWALL_JOBS_SESSION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "runtime/device.h"
#include "runtime/mpi_communicator.h"

namespace memwall {

// The MPI world a job's ranks run in (initialising MPI), whose
// collectives wait at most `timeout` for the other ranks.
absl::StatusOr<std::unique_ptr<MpiCommunicator>> StartWorld(absl::Duration timeout);

// The device capacity of a job's rank: `given`, or with
// --backend cuda and none given (0) the free memory of the rank's GPU
// (rank modulo the GPUs, as the engine picks it) less the CUDA runtime's
// allowance (cuBLAS's and NCCL's memory lies outside memwall's allocator).
absl::StatusOr<int64_t> DeviceBytesFor(Backend backend, int64_t given, int rank);

// The engine options the jobs (train, profile) set from their options
// alike; `world` must outlive the engine.
EngineOptions CommandEngineOptions(Backend backend, int64_t device_bytes, int64_t pinned_bytes,
                                   int simulate_ranks, MpiCommunicator& world);

}  // namespace memwall

#endif  // MEMWALL_JOBS_SESSION_H_
