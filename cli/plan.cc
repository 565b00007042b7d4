#include "cli/plan.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpointing/planner.h"
#include "cli/auto_strategy.h"
#include "cli/session.h"
#include "engine/chain.h"
#include "engine/trainer.h"
#include "nlohmann/json.hpp"
#include "profiler/memory_profiler.h"
#include "runtime/simulated_communicator.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {

namespace {

absl::StatusOr<PlanResult> DryRunOnce(const PlanOptions& options, const Config& config) {
  if (options.gpus < 1 || options.gpus > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpus: expected 1..1048576, got ", options.gpus));
  }
  if (options.batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--batch: expected >= 0, got ", options.batch));
  }
  const int64_t batch = options.batch > 0 ? options.batch : config.train_micro_batch_size_per_gpu;
  MW_ASSIGN_OR_RETURN(Model model, MakeModel(options.model, batch, options.seq, options.image));
  // Meta devices with room for anything: the plan measures, then compares.
  const int64_t unbounded = int64_t{1} << 60;
  DeviceOptions device_options{Backend::kMeta, 0, unbounded};
  device_options.pinned_capacity_bytes = unbounded;
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateDevice(device_options));
  const int world = static_cast<int>(options.gpus);
  MW_ASSIGN_OR_RETURN(std::unique_ptr<SimulatedCommunicator> comm,
                      SimulatedCommunicator::Create(0, world));
  MemoryProfiler profiler(device->allocator());
  int64_t parameters = 0;
  for (const auto& layer : model.layers) {
    for (const ParameterDecl& d : layer->Parameters()) {
      int64_t n = 1;
      for (int64_t x : d.shape) n *= x;
      parameters += n;
    }
  }
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                      Trainer::Create(std::move(model.layers), std::move(model.loss), config,
                                      *device, *comm, /*seed=*/1));
  trainer->set_profiler(&profiler);
  // The recomputation plan of the config, with optimal's budget derived
  // from the device memory the plan is for.
  const int64_t usable = options.device_bytes - options.runtime_allowance;
  absl::StatusOr<Plan> applied =
      ApplyRecomputation(*trainer, config.activation_checkpointing, model.input, usable,
                         [&]() -> absl::StatusOr<AllocatorStats> {
                           MW_ASSIGN_OR_RETURN(Model copy, MakeModel(options.model, batch,
                                                                     options.seq, options.image));
                           return DryRunStep(std::move(copy.layers), std::move(copy.loss), config,
                                             0, world, copy.input, copy.target);
                         });
  std::string note;
  if (!applied.ok() && applied.status().code() == absl::StatusCode::kResourceExhausted) {
    // No plan fits the budget: plan the least activation memory instead and
    // let the answer say by how much it does not fit.
    note = std::string(applied.status().message());
    MW_ASSIGN_OR_RETURN(const Chain chain, trainer->ChainFor(model.input));
    PlannerOptions least;
    least.allow_selective = config.activation_checkpointing.selective;
    applied = MinimumPeakPlan(chain, least);
    applied->planner = "least-peak";
    MW_RETURN_IF_ERROR(trainer->SetRecomputationPlan(*applied, chain));
  }
  MW_RETURN_IF_ERROR(applied.status());
  const Plan recompute = *applied;
  MW_ASSIGN_OR_RETURN(
      std::vector<Batch> batches,
      EmptyBatches(*device, config.gradient_accumulation_steps, model.input, model.target));
  // What the step itself launches and writes, for the step-time model:
  // kernels, and the bytes of every activation and workspace it allocates.
  auto transient = [](const AllocatorStats& s) {
    int64_t bytes = 0;
    for (MemoryCategory c : {MemoryCategory::kActivation, MemoryCategory::kCheckpointedActivation,
                             MemoryCategory::kWorkspace}) {
      bytes += s.by_category[static_cast<int>(c)].allocated;
    }
    return bytes;
  };
  const int64_t launches_before = device->launches();
  const int64_t transient_before = transient(device->allocator().stats());
  MW_RETURN_IF_ERROR(trainer->TrainStep(batches).status());

  const AllocatorStats dev = device->allocator().stats();
  const int64_t launches = device->launches() - launches_before;
  const int64_t transient_bytes = transient(dev) - transient_before;
  const AllocatorStats host = device->pinned_allocator()->stats();
  const PeakSnapshot peak = profiler.peak();
  const NvmeStore* nvme = trainer->optimizer().nvme_store();
  const int64_t nvme_used = nvme != nullptr ? nvme->size() : 0;
  // The device must hold its reserved segments (requests rounded into the
  // caching allocator's blocks and segments) plus the runtime allowance.
  int64_t device_need = dev.reserved.peak + options.runtime_allowance;
  int64_t reserved_peak = dev.reserved.peak;
  if (device_need > options.device_bytes && usable > 0) {
    // Unbounded, the allocator keeps freed segments cached; on a full device
    // it releases them and retries. Run the step again at the real capacity:
    // if it completes, the plan fits with what it reserved there.
    MW_ASSIGN_OR_RETURN(Model copy, MakeModel(options.model, batch, options.seq, options.image));
    const absl::StatusOr<AllocatorStats> capped =
        DryRunStep(std::move(copy.layers), std::move(copy.loss), config, 0, world, copy.input,
                   copy.target, usable, &recompute);
    const absl::Status stepped = capped.status();
    if (stepped.ok()) {
      reserved_peak = capped->reserved.peak;
      device_need = reserved_peak + options.runtime_allowance;
    } else if (stepped.code() != absl::StatusCode::kResourceExhausted) {
      return stepped;
    }
  }
  std::vector<std::string> overflow;
  if (device_need > options.device_bytes) {
    overflow.push_back(absl::StrCat("device memory by ", FormatBytes(device_need - options.device_bytes)));
  }
  if (host.reserved.peak > options.host_bytes) {
    overflow.push_back(absl::StrCat("host memory by ", FormatBytes(host.reserved.peak - options.host_bytes)));
  }
  if (nvme_used > options.nvme_bytes) {
    overflow.push_back(absl::StrCat("NVMe by ", FormatBytes(nvme_used - options.nvme_bytes)));
  }
  const std::string fits =
      overflow.empty() ? "yes" : absl::StrCat("no (", absl::StrJoin(overflow, ", "), ")");
  PlanResult r;
  r.parameters = parameters;
  r.batch = batch;
  r.recompute = recompute;
  r.recompute_note = note;
  r.kernel_launches = launches;
  r.transient_bytes = transient_bytes;
  r.device_requested_peak = dev.requested.peak;
  r.device_reserved_peak = reserved_peak;
  r.device_needed = device_need;
  r.peak = peak;
  r.host_peak = host.reserved.peak;
  r.nvme_used = nvme_used;
  r.fits = overflow.empty();
  r.fits_text = fits;
  for (int c = 0; c < kNumCollectives; ++c) {
    r.collectives[c] = comm->stats(static_cast<Collective>(c));
    r.comm_bytes += r.collectives[c].bytes;
  }
  MW_ASSIGN_OR_RETURN(const Chain chain, trainer->ChainFor(model.input));
  for (const ChainLayer& l : chain.layers) r.forward_flops += l.forward_flops;
  r.forward_flops *= config.gradient_accumulation_steps;
  r.extra_flops = recompute.extra_flops * config.gradient_accumulation_steps;
  // Host traffic per step, from the layout: offloaded gradients down and
  // parameters up, paged shards in for each gather (forward and backward),
  // offloaded activations out and back, and the NVMe tier's read and write
  // of every offloaded state.
  const ShardedOptimizer& opt = trainer->optimizer();
  const int64_t size = static_cast<int64_t>(DTypeSize(config.param_dtype()));
  const int64_t states = config.optimizer.type == OptimizerType::kAdam ? 3 : 2;
  for (const FlatGroup& g : opt.layout().groups) {
    const int64_t k = std::llround(double(config.zero.offload_optimizer_ratio) * g.shard_numel);
    r.offloaded_elements += k;
    r.pcie_bytes += 2 * k * size;
    if (config.zero.offload_param) {
      r.pcie_bytes += 2 * int64_t{config.gradient_accumulation_steps} * g.shard_numel * size;
    }
    if (nvme != nullptr) r.nvme_bytes_per_step += 2 * states * 4 * k;
  }
  r.pcie_bytes += 2 * recompute.offloaded_bytes * config.gradient_accumulation_steps;
  return r;
}

}  // namespace

absl::StatusOr<PlanResult> DryRunPlan(const PlanOptions& options, const Config& config) {
  MW_ASSIGN_OR_RETURN(PlanResult r, DryRunOnce(options, config));
  // optimal's derived budget leaves 5% for the allocator's rounding and
  // fragmentation; when the measured step still overflows the device,
  // tighten the activation budget by the overflow and measure again.
  if (config.activation_checkpointing.planner != "optimal" ||
      config.activation_checkpointing.budget_bytes != 0) {
    return r;
  }
  Config tighter = config;
  for (int attempt = 0; attempt < 4 && !r.fits; ++attempt) {
    const int64_t over = r.device_needed - options.device_bytes;
    const int64_t budget = r.recompute.predicted_peak - over;
    if (over <= 0 || budget <= 0) break;  // not the device, or nothing left to cut
    tighter.activation_checkpointing.budget_bytes = budget;
    absl::StatusOr<PlanResult> next = DryRunOnce(options, tighter);
    if (!next.ok()) break;
    r = std::move(next).value();
  }
  return r;
}

absl::Status RunAuto(const PlanOptions& options, const Config& config) {
  const std::string preset =
      options.hardware.empty() ? PresetForMemory(options.device_bytes) : options.hardware;
  MW_ASSIGN_OR_RETURN(const Hardware hw, HardwarePreset(preset));
  MW_ASSIGN_OR_RETURN(const AutoResult result, AutoStrategy(options, config, hw));
  std::printf("memwall plan --auto: %s on %lld GPU%s of %s, host %s, NVMe %s; step times on %s\n",
              options.model.c_str(), static_cast<long long>(options.gpus),
              options.gpus == 1 ? "" : "s", FormatBytes(options.device_bytes).c_str(),
              FormatBytes(options.host_bytes).c_str(), FormatBytes(options.nvme_bytes).c_str(),
              hw.name.c_str());
  std::printf("  (%.1f TFLOP/s sustained, interconnect %.1f GB/s, host link %.1f GB/s, CPU Adam "
              "%.1f GB/s, disk %.2f GB/s)\n",
              hw.flops / 1e12, hw.interconnect_bps / 1e9, hw.pcie_bps / 1e9, hw.cpu_adam_bps / 1e9,
              hw.nvme_bps / 1e9);
  std::printf("%-80s %12s %12s %10s\n", "candidate", "device need", "host", "step s");
  int64_t least = INT64_MAX;
  for (const Candidate& c : result.candidates) {
    least = std::min(least, c.plan.device_needed);
    std::printf("%-80s %12s %12s %10s\n", c.name.c_str(),
                FormatBytes(c.plan.device_needed).c_str(), FormatBytes(c.plan.host_peak).c_str(),
                c.plan.fits ? absl::StrFormat("%.3f", c.step_seconds).c_str() : "no fit");
  }
  if (result.best < 0) {
    std::printf("fits: no (no candidate fits; the smallest needs %s of device memory)\n",
                FormatBytes(least).c_str());
    return absl::OkStatus();
  }
  const Candidate& best = result.candidates[result.best];
  const std::string json = ConfigJson(best.config);
  std::printf("chosen: %s, %.3f s per step predicted\n%s\n", best.name.c_str(),
              best.step_seconds, json.c_str());
  if (!options.out_path.empty()) {
    std::ofstream out(options.out_path);
    out << json << "\n";
    if (!out) {
      return absl::PermissionDeniedError(
          absl::StrCat("--out ", options.out_path, ": cannot write the chosen config"));
    }
    std::printf("written to %s\n", options.out_path.c_str());
  }
  std::printf("fits: yes\n");
  return absl::OkStatus();
}

std::string OutOfMemoryFix(const PlanOptions& options, const Config& config) {
  const PlanOptions& o = options;
  const absl::StatusOr<Hardware> hw = HardwarePreset(PresetForMemory(o.device_bytes));
  if (!hw.ok()) return "";
  const absl::StatusOr<AutoResult> found = AutoStrategy(o, config, *hw);
  if (!found.ok()) return "";
  // A GPU's memory for the plan command: memwall's share plus the runtime's.
  const std::string command = absl::StrCat(
      "memwall plan --model ", o.model, " --gpus ", o.gpus, " --device-memory ",
      o.device_bytes + kDeviceRuntimeAllowance - o.runtime_allowance, " --batch ", o.batch,
      o.config_path.empty() ? "" : absl::StrCat(" --config ", o.config_path), " --auto");
  if (found->best < 0) {
    return absl::StrCat(" No configuration memwall can run fits ", FormatBytes(o.device_bytes),
                        " per device; the full search: ", command);
  }
  const Candidate& best = found->candidates[found->best];
  return absl::StrCat(" The auto strategy fits it with ", best.name, " (",
                      FormatBytes(best.plan.device_needed), " of ", FormatBytes(o.device_bytes),
                      "); the config and full plan: ", command);
}

absl::Status RunPlan(const PlanOptions& options) {
  MW_ASSIGN_OR_RETURN(Config config, LoadConfigOrDefault(options.config_path));
  if (options.auto_strategy || config.zero.stage == kAutoStage) return RunAuto(options, config);
  MW_ASSIGN_OR_RETURN(const PlanResult r, DryRunPlan(options, config));
  nlohmann::json collectives = nlohmann::json::object();
  for (int c = 0; c < kNumCollectives; ++c) {
    collectives[std::string(CollectiveName(static_cast<Collective>(c)))] = {
        {"calls", r.collectives[c].calls}, {"bytes", r.collectives[c].bytes}};
  }

  if (options.json) {
    nlohmann::json j;
    j["schema"] = "memwall.plan/1";
    j["model"] = options.model;
    j["parameters"] = r.parameters;
    j["gpus"] = options.gpus;
    j["micro_batch"] = r.batch;
    j["zero_stage"] = config.zero.stage;
    j["forward_flops_per_step"] = r.forward_flops;
    j["recompute_flops_per_step"] = r.extra_flops;
    j["kernel_launches_per_step"] = r.kernel_launches;
    j["transient_bytes_per_step"] = r.transient_bytes;
    j["recomputation"] = r.recompute.planner;
    if (!r.recompute_note.empty()) j["recomputation_note"] = r.recompute_note;
    j["device"] = {{"budget", options.device_bytes},
                   {"runtime_allowance", options.runtime_allowance},
                   {"requested_peak", r.device_requested_peak},
                   {"reserved_peak", r.device_reserved_peak},
                   {"needed", r.device_needed}};
    nlohmann::json by_category = nlohmann::json::object();
    for (MemoryCategory c : kAllMemoryCategories) {
      by_category[std::string(MemoryCategoryName(c))] =
          r.peak.by_category[static_cast<int>(c)];
    }
    j["device"]["at_peak"] = by_category;
    j["device"]["peak_phase"] = absl::StrJoin(r.peak.phase_path, " > ");
    j["host"] = {{"budget", options.host_bytes}, {"reserved_peak", r.host_peak}};
    j["nvme"] = {{"budget", options.nvme_bytes}, {"used", r.nvme_used},
                 {"bytes_per_step", r.nvme_bytes_per_step}};
    j["communication_bytes_per_step"] = r.comm_bytes;
    j["host_link_bytes_per_step"] = r.pcie_bytes;
    j["collectives"] = collectives;
    j["fits"] = r.fits;
    j["fits_text"] = r.fits_text;
    std::printf("%s\n", j.dump(2).c_str());
    return absl::OkStatus();
  }
  std::printf("memwall plan: %s (%.2fB parameters), %lld GPU%s, ZeRO stage %d, micro-batch %lld, "
              "recomputation %s\n",
              options.model.c_str(), r.parameters / 1e9, static_cast<long long>(options.gpus),
              options.gpus == 1 ? "" : "s", config.zero.stage, static_cast<long long>(r.batch),
              r.recompute.planner.c_str());
  if (!r.recompute_note.empty()) {
    std::printf("  (%s; planned the least activation peak instead)\n", r.recompute_note.c_str());
  }
  std::printf("device (rank 0 of %lld), at the step's peak (%s):\n",
              static_cast<long long>(options.gpus), absl::StrJoin(r.peak.phase_path, " > ").c_str());
  for (MemoryCategory c : kAllMemoryCategories) {
    const int64_t b = r.peak.by_category[static_cast<int>(c)];
    if (b > 0) std::printf("  %-24s %12s\n", std::string(MemoryCategoryName(c)).c_str(), FormatBytes(b).c_str());
  }
  std::printf("  %-24s %12s  (model states %s, activations %s)\n", "requested",
              FormatBytes(r.peak.bytes).c_str(), FormatBytes(ModelStateBytes(r.peak.by_category)).c_str(),
              FormatBytes(ActivationBytesOf(r.peak.by_category)).c_str());
  std::printf("  %-24s %12s  (allocator segments at their peak)\n", "reserved",
              FormatBytes(r.device_reserved_peak).c_str());
  std::printf("  %-24s %12s  (CUDA context, cuBLAS and NCCL workspaces)\n", "runtime allowance",
              FormatBytes(options.runtime_allowance).c_str());
  std::printf("  %-24s %12s of %s\n", "needed", FormatBytes(r.device_needed).c_str(),
              FormatBytes(options.device_bytes).c_str());
  std::printf("host (pinned): %s of %s; NVMe: %s of %s\n", FormatBytes(r.host_peak).c_str(),
              FormatBytes(options.host_bytes).c_str(), FormatBytes(r.nvme_used).c_str(),
              FormatBytes(options.nvme_bytes).c_str());
  std::printf("communication per step (rank 0): %s; host link (PCIe) per step: %s\n",
              FormatBytes(r.comm_bytes).c_str(), FormatBytes(r.pcie_bytes).c_str());
  if (!options.hardware.empty()) {
    MW_ASSIGN_OR_RETURN(const Hardware hw, HardwarePreset(options.hardware));
    std::printf("predicted step time on %s: %s\n", hw.name.c_str(),
                PredictStep(r, config, hw).ToString().c_str());
  }
  std::printf("fits: %s\n", r.fits_text.c_str());
  return absl::OkStatus();
}

}  // namespace memwall
