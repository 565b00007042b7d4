// What the jobs (train, profile) share: their MPI world, device capacity
// and engine options.
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

// A job's MPI world (MPI initialised; collectives wait at most
// `collective_timeout` for the other ranks) and the engine options its
// options set alike: the backend, the device capacity per rank (`capacity`,
// or with cuda and 0 given the free memory of the rank's GPU, rank modulo
// the GPUs as the engine picks it, less the CUDA runtime's allowance, since
// cuBLAS's and NCCL's memory lies outside memwall's allocator), the pinned
// pool and the simulated world. `engine.world` points into `world`, which
// must outlive the engine.
struct JobSession {
  std::unique_ptr<MpiCommunicator> world;
  EngineOptions engine;
};
absl::StatusOr<JobSession> StartJob(Backend backend, int64_t capacity, int64_t pinned_bytes,
                                    int simulate_ranks, absl::Duration collective_timeout);

}  // namespace memwall

#endif  // MEMWALL_JOBS_SESSION_H_
