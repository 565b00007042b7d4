// What `memwall train` and `memwall profile` share: the config they run
// with, and the ranks they run on.
#ifndef MEMWALL_CLI_SESSION_H_
#define MEMWALL_CLI_SESSION_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "checkpointing/plan.h"
#include "engine/config.h"
#include "engine/layer.h"
#include "engine/trainer.h"
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
// world's ranks. The world's collectives wait at most `timeout` for the
// other ranks (CommunicatorOptions::timeout).
struct Ranks {
  std::unique_ptr<MpiCommunicator> world;
  std::unique_ptr<Communicator> owned;  // the simulated or NCCL communicator
  Communicator* comm = nullptr;
};
absl::StatusOr<Ranks> StartRanks(Backend backend, int simulate_ranks,
                                 absl::Duration timeout = absl::Minutes(10));

// The device this rank trains on: on cuda, GPU rank % (visible GPUs), and
// the ranks then communicate over NCCL; on host and meta, device `rank`.
// `pinned_bytes` sizes its pinned host pool (0: none).
absl::StatusOr<std::unique_ptr<Device>> UseDevice(Ranks& ranks, Backend backend,
                                                  int64_t capacity_bytes, int64_t pinned_bytes);

// A model to run: its layers, loss, and one micro-batch's input and target
// shapes.
struct Model {
  std::vector<std::unique_ptr<Layer>> layers;
  std::unique_ptr<LossFunction> loss;
  std::vector<int64_t> input, target;
};
// `spec` is a zoo name (resnet50, resnest269, llama-7b, llama2-70b) or a
// GPT spec (models/gpt.h: presets, overrides, gpt:params=N). `seq` > 0
// overrides a transformer's sequence length; CNNs take square `image`s.
// Errors name the flag or the model.
absl::StatusOr<Model> MakeModel(const std::string& spec, int64_t batch, int64_t seq,
                                int64_t image);

// The pinned pool for --pinned_memory `flag`: the flag when given (> 0);
// else, when `config` offloads optimizer states, 64 GiB (a limit: the pool
// takes host memory as it is used); else as much as the device when
// activation offload is allowed; else none.
int64_t PinnedBytes(int64_t flag, int64_t capacity, const Config& config);

// A step's micro-batches for a dry run: `count` of them, inputs and
// targets of the given shapes, allocated on `device` (no values on meta).
absl::StatusOr<std::vector<Batch>> EmptyBatches(Device& device, int count,
                                                const std::vector<int64_t>& input,
                                                const std::vector<int64_t>& target);

// One training step of `layers` on a meta device of `capacity` bytes
// (and an unbounded pinned pool) playing rank `rank` of `world_size`, with
// micro-batches of shapes `input` and `target`, following `plan` (null:
// every layer recomputed, the least activation memory a fixed plan gives):
// the allocator's books afterwards, or the step's error (kResourceExhausted
// when it does not fit).
absl::StatusOr<AllocatorStats> DryRunStep(std::vector<std::unique_ptr<Layer>> layers,
                                          std::unique_ptr<LossFunction> loss, const Config& config,
                                          int rank, int world_size,
                                          const std::vector<int64_t>& input,
                                          const std::vector<int64_t>& target,
                                          int64_t capacity = int64_t{1} << 60,
                                          const Plan* plan = nullptr);

// Sets `trainer`'s recomputation plan from config.activation_checkpointing
// for micro-batches whose first input has shape `input`, and returns it.
// For `optimal` without budget_bytes the budget is the device's `capacity`
// less what the rest of a step holds (each category but activations at its
// own peak in `dry_run`'s books, so never less than at any one moment),
// less 5% for the caching allocator's rounding and fragmentation. With
// `offload`, segment inputs may wait in the device's pinned pool.
absl::StatusOr<Plan> ApplyRecomputation(
    Trainer& trainer, const RecomputeConfig& config, const std::vector<int64_t>& input,
    int64_t capacity, const std::function<absl::StatusOr<AllocatorStats>()>& dry_run);

}  // namespace memwall

#endif  // MEMWALL_CLI_SESSION_H_
