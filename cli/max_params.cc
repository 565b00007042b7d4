#include "cli/max_params.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/progress.h"
#include "models/family.h"
#include "nlohmann/json.hpp"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {
namespace {

// The config the search starts from: --config's, or bf16 mixed precision
// with AdamW at micro-batch 1 (the question's usual terms).
absl::StatusOr<Config> BaseConfig(const MaxParamsFlags& flags) {
  Config config;
  if (!flags.config_path.empty()) {
    MW_ASSIGN_OR_RETURN(config, LoadConfig(flags.config_path));
  } else {
    config.bf16 = true;
    config.optimizer.adamw = true;
    config.train_micro_batch_size_per_gpu = 1;
  }
  if (flags.batch > 0) config.train_micro_batch_size_per_gpu = flags.batch;
  return config;
}

}  // namespace

absl::StatusOr<std::string> MaxParamsReport(const MaxParamsFlags& flags,
                                            PlanProgress* progress) {
  MW_ASSIGN_OR_RETURN(const GptFamily family, ParseGptFamily(flags.family, flags.seq));
  MW_ASSIGN_OR_RETURN(const Config base, BaseConfig(flags));
  MaxParamsOptions options;
  options.family = MakeGptFamily(family);
  options.base = base;
  options.machine.gpus = flags.gpus;
  options.machine.device_bytes = flags.device_bytes;
  options.machine.host_bytes = flags.host_bytes;
  options.machine.nvme_bytes = flags.nvme_bytes;
  options.machine.batch = flags.batch;
  options.machine.progress = progress;
  MW_ASSIGN_OR_RETURN(const MaxParamsResult r, MaxParams(options));
  const std::string precision =
      absl::StrCat(DTypeName(base.param_dtype()),
                   base.optimizer.type == OptimizerType::kAdam
                       ? (base.optimizer.adamw ? " AdamW" : " Adam")
                       : " SGD");
  const std::string chosen = r.size > 0 ? ConfigToJson(r.config) : "";
  if (r.size > 0 && !flags.out_path.empty()) {
    MW_RETURN_IF_ERROR(
        WriteOutputFile("--out", flags.out_path, chosen + "\n", flags.overwrite_out));
  }
  if (flags.json) {
    nlohmann::json j;
    j["schema"] = "memwall.max-params/1";
    j["family"] = family.Description();
    j["gpus"] = flags.gpus;
    j["device_memory"] = flags.device_bytes;
    j["host_memory"] = flags.host_bytes;
    j["nvme"] = flags.nvme_bytes;
    j["precision"] = precision;
    j["micro_batch"] = base.train_micro_batch_size_per_gpu;
    j["fits"] = r.size > 0;
    if (r.size > 0) {
      j["model"] = r.model;
      j["parameters"] = r.plan.parameters;
      j["strategy"] = r.strategy;
      j["device_needed"] = r.plan.device_needed;
      j["host_peak"] = r.plan.host_peak;
      j["nvme_used"] = r.plan.nvme_used;
      j["config"] = nlohmann::json::parse(chosen);
    }
    if (!r.next_model.empty()) {
      j["next"] = {{"model", r.next_model},
                   {"parameters", r.next_parameters},
                   {"fits_text", r.next_fails_on}};
    }
    j["dry_runs"] = r.dry_runs;
    return j.dump(2) + "\n";
  }
  std::string out = absl::StrFormat(
      "memwall max-params: %s; %lld GPU%s of %s, host %s and NVMe %s per GPU; %s, micro-batch "
      "%lld\n",
      family.Description(), static_cast<long long>(flags.gpus), flags.gpus == 1 ? "" : "s",
      FormatBytes(flags.device_bytes), FormatBytes(flags.host_bytes),
      FormatBytes(flags.nvme_bytes), precision,
      static_cast<long long>(base.train_micro_batch_size_per_gpu));
  if (r.size == 0) {
    absl::StrAppendFormat(&out, "largest: none: the smallest, %s (%.3fB parameters), fits: %s\n",
                          r.next_model, r.next_parameters / 1e9, r.next_fails_on);
    absl::StrAppendFormat(&out, "(%d dry runs)\n", r.dry_runs);
    return out;
  }
  absl::StrAppendFormat(&out, "largest: %.2fB parameters, --model %s\n", r.plan.parameters / 1e9,
                        r.model);
  absl::StrAppendFormat(&out, "strategy: %s\n", r.strategy);
  absl::StrAppendFormat(&out, "device: needs %s of %s (with the CUDA runtime's %s allowance)\n",
                        FormatBytes(r.plan.device_needed), FormatBytes(flags.device_bytes),
                        FormatBytes(kDeviceRuntimeAllowance));
  absl::StrAppendFormat(&out, "host (pinned): %s of %s; NVMe: %s of %s\n",
                        FormatBytes(r.plan.host_peak), FormatBytes(flags.host_bytes),
                        FormatBytes(r.plan.nvme_used), FormatBytes(flags.nvme_bytes));
  if (!r.next_model.empty()) {
    absl::StrAppendFormat(&out, "next size up: %s (%.2fB parameters) fits: %s\n", r.next_model,
                          r.next_parameters / 1e9, r.next_fails_on);
  }
  absl::StrAppendFormat(&out, "config:\n%s\n", chosen);
  if (!flags.out_path.empty()) absl::StrAppendFormat(&out, "written to %s\n", flags.out_path);
  absl::StrAppendFormat(&out, "plan it: memwall plan --model %s %s--config %s\n", r.model,
                        flags.machine_flags.empty() ? "" : flags.machine_flags + " ",
                        flags.out_path.empty() ? "FILE (the config above)" : flags.out_path);
  absl::StrAppendFormat(&out, "(%d dry runs)\n", r.dry_runs);
  return out;
}

absl::Status RunMaxParams(const MaxParamsFlags& flags) {
  // --out is checked before the search.
  if (!flags.out_path.empty()) {
    MW_RETURN_IF_ERROR(CheckOutputFile("--out", flags.out_path, flags.overwrite_out));
  }
  PlanProgress progress(stderr, "memwall max-params");
  MW_ASSIGN_OR_RETURN(const std::string report, MaxParamsReport(flags, &progress));
  std::fputs(report.c_str(), stdout);
  return absl::OkStatus();
}

}  // namespace memwall
