#include "runtime/simulated_communicator.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace memwall {

absl::StatusOr<std::unique_ptr<SimulatedCommunicator>> SimulatedCommunicator::Create(
    int rank, int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size: expected >= 1, got ", world_size));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank: expected 0..", world_size - 1, " for a world of ", world_size,
        ", got ", rank));
  }
  return std::unique_ptr<SimulatedCommunicator>(
      new SimulatedCommunicator(rank, world_size));
}

}  // namespace memwall
