#include "planning/max_params.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/progress.h"
#include "models/family.h"
#include "models/traced.h"
#include "planning/plan.h"
#include "nlohmann/json.hpp"
#include "runtime/status.h"
#include "runtime/text_file.h"
#include "runtime/units.h"

namespace memwall {
namespace {

namespace fs = std::filesystem;

// The config the search starts from: --config's, or bf16 mixed precision
// with AdamW at micro-batch 1 (the question's usual terms).
absl::StatusOr<Config> BaseConfig(const MaxParamsRequest& flags) {
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

// A family as the report names it.
struct Family {
  ModelFamily members;
  std::string description;
  int64_t max_size = 1024;
  // Hugging Face: the config file and its depth key; a member's spec is
  // "hf:PATH with KEY = N", which `memwall plan` runs from a copy of the
  // config with KEY set to N.
  std::string hf_path, depth_key;
};

// The config.json `path` names (the file, or a directory holding one).
absl::StatusOr<nlohmann::json> ReadHfConfig(const std::string& path) {
  const std::string file = fs::is_directory(path) ? (fs::path(path) / "config.json").string() : path;
  MW_ASSIGN_OR_RETURN(const std::string text,
                      ReadTextFile("--model hf:", file, 16 << 20, "a Hugging Face config.json"));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("--model hf:", path, ": not JSON: ", e.what()));
  }
}

// "hf:PATH": traced once at the config's depth, then scaled in depth
// (models/traced.h WithTracedBlocks); its width stays the config's.
absl::StatusOr<Family> HfFamily(const MaxParamsRequest& flags, const Config& base,
                                PlanProgress* progress) {
  Family family;
  family.hf_path = flags.family.substr(3);
  MW_ASSIGN_OR_RETURN(const nlohmann::json hf, ReadHfConfig(family.hf_path));
  PlanOptions trace;
  trace.model = flags.family;
  trace.seq = flags.seq;
  trace.progress = progress;
  MW_ASSIGN_OR_RETURN(TracedModel traced, TraceHuggingFace(trace, base));
  const TracedBlocks blocks = FindTracedBlocks(traced);
  for (const char* key : {"num_hidden_layers", "n_layer", "num_layers", "n_layers"}) {
    if (hf.is_object() && hf.contains(key) && hf[key].is_number_integer() &&
        hf[key].get<int64_t>() == blocks.count) {
      family.depth_key = key;
      break;
    }
  }
  if (blocks.count == 0 || family.depth_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model ", flags.family, ": its depth cannot be scaled: ",
        blocks.count == 0 ? "the trace has no numbered blocks"
                          : absl::StrCat("no key of its config (num_hidden_layers, n_layer, "
                                         "num_layers, n_layers) counts its ",
                                         blocks.count, " blocks (", blocks.prefix, ".N)")));
  }
  // One block repeated must be this model: refused here, not per size.
  MW_RETURN_IF_ERROR(WithTracedBlocks(traced, blocks.count).status());
  family.description = absl::StrCat(traced.model, " (", flags.family, ", traced in ",
                                    DTypeName(traced.dtype), ", sequence ",
                                    traced.input.empty() ? 0 : traced.input.back(), "), ",
                                    family.depth_key, " searched, its width the config's");
  family.max_size = 1'000'000;
  auto shared = std::make_shared<const TracedModel>(std::move(traced));
  family.members = [shared, spec = flags.family,
                    key = family.depth_key](int64_t size) -> absl::StatusOr<FamilyMember> {
    MW_ASSIGN_OR_RETURN(TracedModel scaled, WithTracedBlocks(*shared, size));
    FamilyMember member;
    member.spec = absl::StrCat(spec, " with ", key, " = ", size);
    member.model = TracedModelFactory(std::make_shared<const TracedModel>(std::move(scaled)));
    return member;
  };
  return family;
}

absl::StatusOr<Family> MakeFamily(const MaxParamsRequest& flags, const Config& base,
                                  PlanProgress* progress) {
  if (flags.family.rfind("hf:", 0) == 0) return HfFamily(flags, base, progress);
  MW_ASSIGN_OR_RETURN(const GptFamily gpt, ParseGptFamily(flags.family, flags.seq));
  Family family;
  family.members = MakeGptFamily(gpt);
  family.description = gpt.Description();
  return family;
}

}  // namespace

absl::StatusOr<std::string> MaxParamsReport(const MaxParamsRequest& flags,
                                            PlanProgress* progress) {
  MW_ASSIGN_OR_RETURN(const Config base, BaseConfig(flags));
  MW_ASSIGN_OR_RETURN(const Family family, MakeFamily(flags, base, progress));
  MaxParamsOptions options;
  options.family = family.members;
  options.max_size = family.max_size;
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
    j["family"] = family.description;
    j["gpus"] = flags.gpus;
    j["device_memory"] = flags.device_bytes;
    j["host_memory"] = flags.host_bytes;
    j["nvme"] = flags.nvme_bytes;
    j["precision"] = precision;
    j["micro_batch"] = base.train_micro_batch_size_per_gpu;
    j["fits"] = r.size > 0;
    if (!family.depth_key.empty()) j["depth_key"] = family.depth_key;
    if (r.size > 0) {
      j["size"] = r.size;
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
      family.description, static_cast<long long>(flags.gpus), flags.gpus == 1 ? "" : "s",
      FormatBytes(flags.device_bytes), FormatBytes(flags.host_bytes),
      FormatBytes(flags.nvme_bytes), precision,
      static_cast<long long>(base.train_micro_batch_size_per_gpu));
  if (r.size == 0) {
    absl::StrAppendFormat(&out, "largest: none: the smallest, %s (%.3fB parameters), fits: %s\n",
                          r.next_model, r.next_parameters / 1e9, r.next_fails_on);
    absl::StrAppendFormat(&out, "(%d dry runs)\n", r.dry_runs);
    return out;
  }
  absl::StrAppendFormat(&out, "largest: %.2fB parameters, %s%s\n", r.plan.parameters / 1e9,
                        family.hf_path.empty() ? "--model " : "", r.model);
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
  const std::string run =
      family.hf_path.empty()
          ? r.model
          : absl::StrCat("hf:COPY (a copy of ", family.hf_path, " with ", family.depth_key,
                         " set to ", r.size, ")");
  absl::StrAppendFormat(&out, "plan it: memwall plan --model %s %s--config %s\n", run,
                        flags.machine_flags.empty() ? "" : flags.machine_flags + " ",
                        flags.out_path.empty() ? "FILE (the config above)" : flags.out_path);
  absl::StrAppendFormat(&out, "(%d dry runs)\n", r.dry_runs);
  return out;
}

}  // namespace memwall
