// The dry run: one whole training step of a model on the meta backend as
// rank 0 of N (forward, backward, reductions, optimizer step, offload
// traffic, recomputation), every allocation made and accounted as a real
// run makes it and no byte touched, so its peaks are the real run's
// (benchmarks/plan_validation checks them against host runs). What
// `memwall plan` prints, what the auto strategy (engine/auto_strategy.h)
// compares, and what sizes the optimal recomputation budget.
#ifndef MEMWALL_ENGINE_DRY_RUN_H_
#define MEMWALL_ENGINE_DRY_RUN_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpointing/plan.h"
#include "engine/config.h"
#include "engine/model.h"
#include "engine/progress.h"
#include "engine/trainer.h"
#include "profiler/memory_profiler.h"
#include "runtime/allocator.h"
#include "runtime/communicator.h"

namespace memwall {

// Room the CUDA context, cuBLAS and NCCL keep on a GPU outside memwall's
// allocator; a dry run takes it off the device memory before comparing.
constexpr int64_t kDeviceRuntimeAllowance = int64_t{1} << 30;

// What a plan assumes a GPU has unless told: 32 GiB of device memory and
// 512 GiB of pinned host memory (a node's share for offloading).
constexpr int64_t kPlanDeviceBytes = int64_t{32} << 30;
constexpr int64_t kPlanHostBytes = int64_t{512} << 30;
// The pinned pool a running engine makes for offloaded optimizer states
// when none is given.
constexpr int64_t kOffloadPinnedBytes = int64_t{64} << 30;

struct DryRunOptions {
  ModelFactory model;      // required
  std::string model_name;  // for messages and reports
  // Set for a model whose block operators can be tiled (a GPT spec): the
  // same model in `tiles` tiles, or an error for a count it cannot take.
  // The auto strategy tiles candidates with parameters on NVMe that do not
  // fit untiled.
  std::function<absl::StatusOr<ModelFactory>(int64_t tiles)> tiled_model;
  int64_t gpus = 1;        // N: the data-parallel world
  // GPUs per node (the link bytes' topology, runtime/communicator.h); 0:
  // the config's ranks_per_node, else every GPU on one node.
  int64_t ranks_per_node = 0;
  int64_t device_bytes = kPlanDeviceBytes;
  int64_t host_bytes = kPlanHostBytes;  // pinned host memory per GPU
  int64_t nvme_bytes = 0;                   // 0: no NVMe budget (none used)
  int64_t batch = 0;                        // micro-batch; 0: the config's
  // Device memory outside memwall's allocator: kDeviceRuntimeAllowance for
  // a GPU, 0 to plan a host-backend run.
  int64_t runtime_allowance = kDeviceRuntimeAllowance;
  // Set: told each stage of the dry run (and, during its step, given the
  // step's profiler), for progress reports; must outlive the dry run.
  PlanProgress* progress = nullptr;
};

// What one dry-run step of a model under a config measured.
struct DryRunResult {
  int64_t parameters = 0;
  int64_t batch = 0;
  RecomputationPlan recompute;  // the recomputation plan followed
  std::string recompute_note;  // why it is the least-peak plan, if so
  int64_t device_requested_peak = 0;
  int64_t device_reserved_peak = 0;
  int64_t device_needed = 0;  // reserved peak + runtime allowance
  PeakSnapshot peak;          // the device's peak moment
  // Each category's own peak on the device (at different moments).
  std::array<int64_t, kNumMemoryCategories> category_peaks{};
  int64_t host_peak = 0;      // pinned pool, reserved
  int64_t nvme_used = 0;
  std::array<CollectiveStats, kNumCollectives> collectives{};
  int64_t comm_bytes = 0;
  // The step's link bytes inside and across nodes, whole job (the sums of
  // collectives' intra_node_bytes and inter_node_bytes).
  LinkBytes link_bytes;
  int64_t world = 1;         // the data-parallel ranks planned (DryRunOptions::gpus)
  int64_t nodes = 1;         // the nodes they run on
  double forward_flops = 0;  // one step's forwards (all micro-batches)
  double extra_flops = 0;    // recomputation's, likewise
  int64_t kernel_launches = 0;  // kernels one step launches on the device
  // Bytes of the activations and workspaces one step allocates (each is
  // written once and read at least once: the element-wise traffic).
  int64_t transient_bytes = 0;
  int64_t offloaded_elements = 0;  // updated on the CPU per step
  // Of those, the group's reduced last in backward (the first trainable
  // one): an overlapped update cannot start it before backward ends.
  int64_t tail_offloaded_elements = 0;
  int64_t pcie_bytes = 0;          // host link traffic per step (derived)
  int64_t nvme_bytes_per_step = 0;
  bool fits = false;
  std::string fits_text;  // "yes" or "no (...)"
};

// The GPUs of a node the dry run places (the link bytes' topology):
// options.ranks_per_node, else the config's ranks_per_node, else every GPU
// on one node.
int64_t NodeSize(const DryRunOptions& options, const Config& config);

// Runs the step of options.model under `config` on meta and measures it.
// With the optimal planner and no budget, the budget is derived from the
// device memory and tightened (up to four more dry runs) while the measured
// step still overflows the device. Errors name the option or the model.
absl::StatusOr<DryRunResult> DryRun(const DryRunOptions& options, const Config& config);

// A step's micro-batches of the given shapes on `device`: `count` of them,
// f32 inputs and targets, allocated (no values written).
absl::StatusOr<std::vector<Batch>> EmptyBatches(Device& device, int count,
                                                const std::vector<int64_t>& input,
                                                const std::vector<int64_t>& target);

// One training step of `model` on a meta device of `capacity` bytes (and
// an unbounded pinned pool) playing rank `rank` of `world_size`, following
// `plan` (null: every layer recomputed, the least activation memory a
// fixed plan gives): the allocator's books afterwards, or the step's error
// (kResourceExhausted when it does not fit).
absl::StatusOr<AllocatorStats> DryRunStep(Model model, const Config& config, int rank,
                                          int world_size, int64_t capacity = int64_t{1} << 60,
                                          const RecomputationPlan* plan = nullptr);

// Sets `trainer`'s recomputation plan from config.activation_checkpointing
// for micro-batches whose first input has shape `input`, and returns it.
// For `optimal` without budget_bytes the budget is the device's `capacity`
// less what the rest of a step holds (each category but activations at its
// own peak in `dry_run`'s books, so never less than at any one moment),
// less 5% for the caching allocator's rounding and fragmentation. With
// `offload`, segment inputs may wait in the device's pinned pool.
absl::StatusOr<RecomputationPlan> ApplyRecomputation(
    Trainer& trainer, const RecomputeConfig& config, const std::vector<int64_t>& input,
    int64_t capacity, const std::function<absl::StatusOr<AllocatorStats>()>& dry_run);

}  // namespace memwall

#endif  // MEMWALL_ENGINE_DRY_RUN_H_
