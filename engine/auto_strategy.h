// The auto strategy: among ZeRO stages, optimizer offload (and its ratio),
// parameter paging, the NVMe tier and recomputation, the configuration whose
// dry-run step (engine/dry_run.h) fits the device, host and NVMe budgets
// with the lowest predicted step time on a hardware profile.
#ifndef MEMWALL_ENGINE_AUTO_STRATEGY_H_
#define MEMWALL_ENGINE_AUTO_STRATEGY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/dry_run.h"

namespace memwall {

// What the step-time model needs of a machine. Rates are what a training
// step sustains, not datasheet peaks: dense bf16 FLOP/s at 40% of peak
// (a typical large-model MFU), and the measured-or-typical bandwidths.
struct Hardware {
  std::string name;
  int64_t device_bytes = 0;
  double flops = 0;               // per GPU
  double memory_bps = 0;          // device memory (HBM) bytes per second, sustained
  double launch_seconds = 0;      // per kernel launch, the floor of a small op
  // Link bytes (runtime/communicator.h) per second per GPU, one direction:
  // inside a node (NVLink) and across nodes (the GPU's share of the
  // node's network: its rail).
  double interconnect_bps = 0;
  double inter_node_bps = 0;
  int64_t gpus_per_node = 0;      // a node's GPUs; 0: every GPU on one
  double pcie_bps = 0;            // host link, each direction
  double cpu_adam_bps = 0;        // CPU Adam, bytes per second (28 per parameter)
  double nvme_bps = 0;            // per GPU
  double collective_latency = 0;  // seconds per collective call
  // Whether the device's compute runs on the CPU cores that also run the
  // offloaded update (the host backend: "this-machine"), so that an
  // overlapped update cannot hide under backward.
  bool device_is_cpu = false;
};

// "v100-32gb", "a100-40gb", "a100-80gb", "h100-80gb", "h200" (nodes of 8
// GPUs, each with a rail of the node's network: DGX-1's 4 x 100 Gb/s
// InfiniBand shared by 8, DGX A100's 200 Gb/s per GPU, DGX H100's 400), or
// "this-machine": measured now, in about a second, on this machine's CPU
// (the host backend's "device"): an OpenBLAS SGEMM's FLOP/s, memcpy
// bandwidth for device memory, the host link and the interconnect (ranks
// share memory), the cost of one host-backend kernel on a tiny tensor, the
// CPU Adam kernel, and the NVMe tier's update pattern on 64 MiB in $TMPDIR
// (chunks read, then written back, as a step streams them).
// kNotFound lists them.
absl::StatusOr<Hardware> HardwarePreset(const std::string& name);
std::vector<std::string> HardwarePresets();
// The preset whose device memory `device_bytes` matches: up to 32 GiB a
// V100, 40 an A100-40GB, 80 an H100, above an H200.
std::string PresetForMemory(int64_t device_bytes);

// One configuration tried, with its dry run and predicted step time.
struct Candidate {
  std::string name;  // "stage 3 + optimizer offload + optimal recomputation"
  Config config;
  // The model's block operators in this many tiles
  // (DryRunOptions::tiled_model): a model property, not the config's.
  int64_t tiles = 1;
  DryRunResult plan;
  double step_seconds = 0;  // meaningful when plan.fits
  // Its communication is quantized (ZeRO++): the results differ from an
  // exact run's, so it is chosen only when the base config enables that
  // quantization (zero_quantized_weights, zero_quantized_gradients).
  bool changes_results = false;
};

struct AutoResult {
  std::vector<Candidate> candidates;  // in the order tried
  int best = -1;                      // index of the chosen one; -1: none fits
};

// Predicted seconds per step of `plan` under `config` on `hw`: compute
// (three forwards per micro-batch plus recomputation, at the profile's
// FLOP/s; the step's activations and workspaces written and read once at
// its memory bandwidth; and a launch cost per kernel the dry run counted)
// and communication (each GPU's share of the link bytes inside and across
// nodes over those links' bandwidths, one after the other as a
// hierarchical collective moves them, plus a latency per collective call;
// none on one GPU; overlapped when overlap_comm is on), plus
// host-link copies, the
// CPU update of offloaded elements and NVMe traffic, which the model adds.
struct StepTime {
  double flops = 0, memory = 0, launches = 0;  // compute's three terms
  double communication = 0;  // collectives, bandwidth and latency
  double across_nodes = 0;   // of communication, the link bytes across nodes
  double host_link = 0, cpu_update = 0, nvme = 0;
  // Of cpu_update, the part under backward (offload_overlap_step: every
  // group's update but the last-reduced one's, up to backward's two thirds
  // of the compute time); the rest adds to the step.
  double cpu_update_hidden = 0;
  double total = 0;  // compute and communication overlapped or added, plus the rest
  // "0.0070 s (FLOPs 0.0021 s, memory ..., ...)"
  std::string ToString() const;
};
StepTime PredictStep(const DryRunResult& plan, const Config& config, const Hardware& hw);
double PredictStepSeconds(const DryRunResult& plan, const Config& config, const Hardware& hw);

// Tries every candidate built from `base` (its optimizer and precision
// kept): stages, optimizer offload (at stages 2-3 also with the update
// overlapped with backward), paging, recomputation, on several GPUs
// stage 3 with quantized weight gathers (ZeRO++ qwZ: listed, and chosen
// only when `base` sets zero_quantized_weights), on several nodes stage 3
// with a secondary partition in each node (hpZ, exact; also with qwZ),
// with quantized gradients (qgZ: chosen only when `base` sets
// zero_quantized_gradients) and with all three, on several nodes stages
// 2 and 3 sharded inside each node and replicated across nodes (hybrid
// sharding, mics_shard_size; exact), and flat-group
// (bucket and prefetch) sizes of 5e6 and 5e7 elements; offload to NVMe
// only when options.nvme_bytes > 0 (at stage 3 also with the parameters
// and gradients there, the block weights gathered on use, and, when that
// does not fit and options.tiled_model is set, the model in 2, 4, 8 or 16
// tiles: the fewest that fit); and, with `vary_micro_batch` and a
// global batch per GPU (options.batch, else the config's micro-batch, times
// its gradient_accumulation_steps) above 1, each of its divisors as the
// micro-batch with the accumulation that keeps it (", micro-batch M x K"
// in the candidate's name). A planner varies it; an engine resolving
// "stage": "auto" does not (its caller's micro-batches are given).
absl::StatusOr<AutoResult> AutoStrategy(const DryRunOptions& options, const Config& base,
                                        const Hardware& hw, bool vary_micro_batch = false);

// For an out-of-memory error of a run under `config`: " The auto strategy
// fits it with <candidate> (<need> of <device>)"; when nothing fits its
// micro-batch, the largest smaller one that divides the step's samples
// (micro-batch x accumulation) and fits, with the accumulation that keeps
// them (" ... fits it at micro-batch M x K accumulation steps ..."); else
// " No configuration memwall can run fits <device> per device, at any
// micro-batch ...". Searched on the preset that matches
// options.device_bytes. Empty if the search itself fails.
std::string OutOfMemoryAdvice(const DryRunOptions& options, const Config& config);

}  // namespace memwall

#endif  // MEMWALL_ENGINE_AUTO_STRATEGY_H_
