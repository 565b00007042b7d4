// What `memwall train` and `memwall profile` share: the config they run
// with, and the ranks they run on.
#ifndef MEMWALL_CLI_SESSION_H_
#define MEMWALL_CLI_SESSION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/mpi_communicator.h"

namespace memwall {

// The built-in default config (ZeRO stage 2 with overlap, AdamW); the same
// as configs/gpt-tiny-zero2.json.
extern const char kDefaultTrainConfig[];

// `path`'s config, or the built-in one when `path` is empty.
absl::StatusOr<Config> LoadConfigOrDefault(const std::string& path);

// The MPI world (initialised), and the communicator to train with: the
// world itself, or on meta a simulated world of `simulate_ranks` in which
// this single process is rank 0, or on cuda (after UseDevice) NCCL over the
// world's ranks.
struct Ranks {
  std::unique_ptr<MpiCommunicator> world;
  std::unique_ptr<Communicator> owned;  // the simulated or NCCL communicator
  Communicator* comm = nullptr;
};
absl::StatusOr<Ranks> StartRanks(Backend backend, int simulate_ranks);

// The device this rank trains on: on cuda, GPU rank % (visible GPUs), and
// the ranks then communicate over NCCL; on host and meta, device `rank`.
absl::StatusOr<std::unique_ptr<Device>> UseDevice(Ranks& ranks, Backend backend,
                                                  int64_t capacity_bytes);

}  // namespace memwall

#endif  // MEMWALL_CLI_SESSION_H_
