// The meta backend's communicator: one process plays rank `rank` of a world
// of `world_size`; collectives move no bytes but are validated and counted
// exactly as on a real communicator, so a dry run reports the traffic of the
// real schedule. Ranks cannot disagree (there is only one process), so no
// agreement check runs.
#ifndef MEMWALL_RUNTIME_SIMULATED_COMMUNICATOR_H_
#define MEMWALL_RUNTIME_SIMULATED_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/communicator.h"

namespace memwall {

class SimulatedCommunicator final : public Communicator {
 public:
  // Errors: kInvalidArgument unless world_size >= 1 and 0 <= rank < world_size.
  static absl::StatusOr<std::unique_ptr<SimulatedCommunicator>> Create(int rank,
                                                                       int world_size);

  absl::string_view kind() const override { return "simulated"; }

 private:
  SimulatedCommunicator(int rank, int world_size)
      : Communicator(rank, world_size, CommunicatorOptions{/*check_agreement=*/false}) {}

  bool moves_bytes() const override { return false; }
  // Ranks cannot disagree on the split either: this rank's group.
  absl::StatusOr<std::unique_ptr<Communicator>> DoSplit(int, int position, int size) override {
    return std::unique_ptr<Communicator>(new SimulatedCommunicator(position, size));
  }
  absl::Status Agree(const Signature&) override { return absl::OkStatus(); }
  absl::Status DoAllReduce(const void*, void*, size_t, DType, ReduceOp,
                           Stream&) override {
    return absl::OkStatus();
  }
  absl::Status DoReduceScatter(const void*, void*, size_t, DType, ReduceOp,
                               Stream&) override {
    return absl::OkStatus();
  }
  absl::Status DoAllGather(const void*, void*, size_t, DType, Stream&) override {
    return absl::OkStatus();
  }
  absl::Status DoBroadcast(void*, size_t, DType, int, Stream&) override {
    return absl::OkStatus();
  }
  absl::Status DoBarrier() override { return absl::OkStatus(); }
  absl::Status DoAllToAll(const void*, void*, size_t, DType, Stream&) override {
    return absl::OkStatus();
  }
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_SIMULATED_COMMUNICATOR_H_
