// Plan requests and their reports (what `memwall plan` and
// memwall.torch.plan print): one full training step of a model, dry-run on
// the meta backend as rank 0 of N (forward, backward, reductions, optimizer
// step, offload traffic, recomputation), whether it fits a device, host
// memory and an NVMe budget, and with the auto strategy the fastest
// configuration that does; model names, "hf:" and "traced:" resolved here.
#ifndef MEMWALL_PLANNING_PLAN_H_
#define MEMWALL_PLANNING_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/auto_strategy.h"
#include "engine/config.h"
#include "engine/dry_run.h"
#include "engine/model.h"
#include "models/traced.h"
#include "nlohmann/json.hpp"

namespace memwall {

// A plan request (the flags of `memwall plan`).
struct PlanOptions {
  std::string model = "gpt2-1.5b";  // models/spec.h MakeModel's specs
  // Set: the model to plan (e.g. a traced PyTorch model's factory, see
  // models/traced.h), `model` naming it in the report.
  ModelFactory factory;
  // For a traced model: what was traced and the attention kernel assumed,
  // printed under the plan's first line and as "traced" in its JSON.
  std::string traced_class, traced_dtype, traced_attention;
  std::string config_path;          // empty: the built-in training config
  std::string config_text;          // set: the config itself (JSON), not a file
  int64_t gpus = 1;                 // N: the data-parallel world
  // GPUs per node (0: the config's ranks_per_node, else the hardware
  // profile's: 8 for the GPU presets, one node for this-machine) and each
  // GPU's bandwidth across nodes in Gb/s (0: the profile's).
  int64_t gpus_per_node = 0;
  double inter_node_gbit = 0;
  int64_t device_bytes = kPlanDeviceBytes;
  int64_t host_bytes = kPlanHostBytes;  // pinned host memory per GPU
  int64_t nvme_bytes = 0;                   // 0: no NVMe budget (none used)
  int64_t batch = 0;                        // 0: the config's micro-batch
  int64_t seq = 0;                          // transformers: 0 = the model's
  int64_t image = 224;                      // CNNs
  // "hf:PATH" models (a Hugging Face config.json or a directory with one):
  // traced by `python -m memwall.hf` ($MEMWALL_PYTHON, else python3) in
  // the config's dtype, with this attention kernel and LoRA adapters of
  // rank lora_rank (0: full fine-tuning) on the lora_targets projections.
  std::string attention = "auto";
  int64_t lora_rank = 0;
  std::string lora_targets = "q_proj,v_proj";
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
  // Whether the auto strategy may trade micro-batch for accumulation (a
  // caller whose loop sets the micro-batch, memwall.torch, says false).
  bool vary_micro_batch = true;
  std::string out_path;
  // Whether an existing `out_path` is replaced (--force); a checkpoint's
  // file never is (engine/checkpoint.h CheckOutputFile).
  bool overwrite_out = false;
  // Set: progress reports of the planning (memwall plan: on stderr after a
  // second).
  PlanProgress* progress = nullptr;
};

// The engine's dry-run options for these flags, on `hw` (its GPUs per
// node unless the flags or the config say).
DryRunOptions ToDryRunOptions(const PlanOptions& options, const Config& config,
                              const Hardware& hw);

// The step-time model's hardware for these flags: options.hardware's
// profile (empty: the one for the device memory) with the flags' node size
// and bandwidth across nodes. Errors name the flag.
absl::StatusOr<Hardware> PlanHardware(const PlanOptions& options);

// The plan: text ending with "fits: yes" or "fits: no (<what overflows,
// by how much>)", or JSON with `json` ("memwall.plan/1"; with the auto
// strategy "memwall.plan-auto/1": the candidates, the chosen config and its
// plan). Errors only for bad input (naming the flag, model or file) or a
// step that cannot run at all.
absl::StatusOr<std::string> PlanReport(const PlanOptions& options);
// Traces options.model, "hf:PATH", with the Python front end
// ($MEMWALL_PYTHON, else python3; `python -m memwall.hf`) in `config`'s
// precision at its micro-batch, with options' seq, image, attention and
// LoRA settings. Errors name --model and say what the tracer said.
absl::StatusOr<TracedModel> TraceHuggingFace(const PlanOptions& options, const Config& config);
// Sets options' traced_* fields from a traced model's description.
void DescribeTraced(const TracedModel& model, PlanOptions& options);
// One dry run's report as "memwall.plan/1" JSON.
nlohmann::json PlanJson(const PlanOptions& options, const Config& config, const DryRunResult& r);

}  // namespace memwall

#endif  // MEMWALL_PLANNING_PLAN_H_
