// `memwall plan`: one full training step of a model, dry-run on the meta
// backend as rank 0 of N (forward, backward, reductions, optimizer step,
// offload traffic, recomputation), and whether it fits a device, host
// memory and an NVMe budget.
#ifndef MEMWALL_CLI_PLAN_H_
#define MEMWALL_CLI_PLAN_H_

#include <cstdint>
#include <string>

#include <array>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpointing/plan.h"
#include "engine/config.h"
#include "profiler/memory_profiler.h"
#include "runtime/communicator.h"

namespace memwall {

// Room the CUDA context, cuBLAS and NCCL keep on a GPU outside memwall's
// allocator; `plan` takes it off the device memory before comparing.
constexpr int64_t kDeviceRuntimeAllowance = int64_t{1} << 30;

struct PlanOptions {
  std::string model = "gpt2-1.5b";  // cli/session.h MakeModel's specs
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
  // `out_path` if set). `hardware`: a preset of cli/auto_strategy.h, or
  // empty to pick by device memory.
  bool auto_strategy = false;
  std::string hardware;
  std::string out_path;
};

// What one dry-run step of a model under a config measured.
struct PlanResult {
  int64_t parameters = 0;
  int64_t batch = 0;
  Plan recompute;              // the recomputation plan followed
  std::string recompute_note;  // why it is the least-peak plan, if so
  int64_t device_requested_peak = 0;
  int64_t device_reserved_peak = 0;
  int64_t device_needed = 0;  // reserved peak + kDeviceRuntimeAllowance
  PeakSnapshot peak;          // the device's peak moment
  int64_t host_peak = 0;      // pinned pool, reserved
  int64_t nvme_used = 0;
  std::array<CollectiveStats, kNumCollectives> collectives{};
  int64_t comm_bytes = 0;
  double forward_flops = 0;  // one step's forwards (all micro-batches)
  double extra_flops = 0;    // recomputation's, likewise
  int64_t kernel_launches = 0;  // kernels one step launches on the device
  // Bytes of the activations and workspaces one step allocates (each is
  // written once and read at least once: the element-wise traffic).
  int64_t transient_bytes = 0;
  int64_t offloaded_elements = 0;  // updated on the CPU per step
  int64_t pcie_bytes = 0;          // host link traffic per step (derived)
  int64_t nvme_bytes_per_step = 0;
  bool fits = false;
  std::string fits_text;  // "yes" or "no (...)"
};

// Runs the step of `options.model` under `config` on meta and measures it.
absl::StatusOr<PlanResult> DryRunPlan(const PlanOptions& options, const Config& config);

// For an out-of-memory error of a run of `options.model` under `config`:
// what the auto strategy would run instead, or that nothing fits, and the
// command for the full plan. Empty if the search itself fails.
std::string OutOfMemoryFix(const PlanOptions& options, const Config& config);

// Prints the plan (text, or JSON with --json) ending with "fits: yes" or
// "fits: no (<what overflows, by how much>)". Errors only for bad input
// (naming the flag, model or file) or a step that cannot run at all.
absl::Status RunPlan(const PlanOptions& options);

}  // namespace memwall

#endif  // MEMWALL_CLI_PLAN_H_
