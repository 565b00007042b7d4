#include "cli/plan.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/session.h"
#include "engine/auto_strategy.h"
#include "models/spec.h"
#include "nlohmann/json.hpp"
#include "profiler/memory_profiler.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {

DryRunOptions ToDryRunOptions(const PlanOptions& options) {
  DryRunOptions dry;
  dry.model = SpecModel(options.model, options.seq, options.image);
  dry.model_name = options.model;
  dry.gpus = options.gpus;
  dry.device_bytes = options.device_bytes;
  dry.host_bytes = options.host_bytes;
  dry.nvme_bytes = options.nvme_bytes;
  dry.batch = options.batch;
  dry.runtime_allowance = options.runtime_allowance;
  return dry;
}

namespace {

absl::Status RunAuto(const PlanOptions& options, const Config& config) {
  const std::string preset =
      options.hardware.empty() ? PresetForMemory(options.device_bytes) : options.hardware;
  MW_ASSIGN_OR_RETURN(const Hardware hw, HardwarePreset(preset));
  MW_ASSIGN_OR_RETURN(const AutoResult result, AutoStrategy(ToDryRunOptions(options), config, hw));
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
  const std::string json = ConfigToJson(best.config);
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

}  // namespace

absl::Status RunPlan(const PlanOptions& options) {
  MW_ASSIGN_OR_RETURN(Config config, LoadConfigOrDefault(options.config_path));
  // --batch is the configuration planned, so the config printed says it.
  if (options.batch > 0) config.train_micro_batch_size_per_gpu = options.batch;
  if (options.auto_strategy || config.zero.stage == kAutoStage) return RunAuto(options, config);
  if (!options.out_path.empty()) {
    return absl::InvalidArgumentError(
        "--out applies to 'plan' with --auto (or a config whose stage is \"auto\") only: it is "
        "where the chosen config is written");
  }
  MW_ASSIGN_OR_RETURN(const DryRunResult r, DryRun(ToDryRunOptions(options), config));
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
