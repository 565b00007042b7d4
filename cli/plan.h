// `memwall plan`: one full training step of a model, dry-run on the meta
// backend as rank 0 of N (forward, backward, reductions, optimizer step,
// offload traffic, recomputation), and whether it fits a device, host
// memory and an NVMe budget.
#ifndef MEMWALL_CLI_PLAN_H_
#define MEMWALL_CLI_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/dry_run.h"

namespace memwall {

// The flags of `memwall plan`.
struct PlanOptions {
  std::string model = "gpt2-1.5b";  // models/spec.h MakeModel's specs
  std::string config_path;          // empty: the built-in training config
  int64_t gpus = 1;                 // N: the data-parallel world
  int64_t device_bytes = int64_t{32} << 30;
  int64_t host_bytes = int64_t{512} << 30;  // pinned host memory per GPU
  int64_t nvme_bytes = 0;                   // 0: no NVMe budget (none used)
  int64_t batch = 0;                        // 0: the config's micro-batch
  int64_t seq = 0;                          // transformers: 0 = the model's
  int64_t image = 224;                      // CNNs
  bool json = false;
  // Device memory outside memwall's allocator: kDeviceRuntimeAllowance for
  // a GPU, 0 to plan a host-backend run.
  int64_t runtime_allowance = kDeviceRuntimeAllowance;
  // The auto strategy (also when the config's stage is "auto"): the
  // candidates, the chosen configuration printed as JSON (and written to
  // `out_path` if set). `hardware`: a preset of engine/auto_strategy.h, or
  // empty to pick by device memory.
  bool auto_strategy = false;
  std::string hardware;
  std::string out_path;
};

// The engine's dry-run options for these flags.
DryRunOptions ToDryRunOptions(const PlanOptions& options);

// Prints the plan (text, or JSON with --json) ending with "fits: yes" or
// "fits: no (<what overflows, by how much>)". Errors only for bad input
// (naming the flag, model or file) or a step that cannot run at all.
absl::Status RunPlan(const PlanOptions& options);

}  // namespace memwall

#endif  // MEMWALL_CLI_PLAN_H_
