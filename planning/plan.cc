#include "planning/plan.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/auto_strategy.h"
#include "engine/checkpoint.h"
#include "models/spec.h"
#include "models/traced.h"
#include "nlohmann/json.hpp"
#include "profiler/memory_profiler.h"
#include "runtime/status.h"
#include "runtime/units.h"
#include "sharding/options.h"

namespace memwall {

absl::StatusOr<Hardware> PlanHardware(const PlanOptions& options) {
  if (options.gpus_per_node < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpus_per_node: expected >= 1 (0: the profile's), got ",
                     options.gpus_per_node));
  }
  if (!(options.inter_node_gbit >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--inter_node_gbit: expected > 0 Gb/s (0: the profile's), got ", options.inter_node_gbit));
  }
  MW_ASSIGN_OR_RETURN(Hardware hw, HardwarePreset(options.hardware.empty()
                                                      ? PresetForMemory(options.device_bytes)
                                                      : options.hardware));
  if (options.gpus_per_node > 0) hw.gpus_per_node = options.gpus_per_node;
  if (options.inter_node_gbit > 0) hw.inter_node_bps = options.inter_node_gbit * 1e9 / 8;
  return hw;
}

DryRunOptions ToDryRunOptions(const PlanOptions& options, const Config& config,
                              const Hardware& hw) {
  DryRunOptions dry;
  // The flag, else the config's layout, else the profile's node.
  dry.ranks_per_node = options.gpus_per_node > 0 ? options.gpus_per_node
                       : config.ranks_per_node > 0 ? config.ranks_per_node
                                                   : hw.gpus_per_node;
  dry.model = options.factory ? options.factory : SpecModel(options.model, options.seq, options.image);
  dry.model_name = options.model;
  if (!options.factory) {
    dry.tiled_model = [spec = options.model, seq = options.seq,
                       image = options.image](int64_t tiles) -> absl::StatusOr<ModelFactory> {
      MW_ASSIGN_OR_RETURN(const std::string tiled, WithTiles(spec, tiles));
      return SpecModel(tiled, seq, image);
    };
  }
  dry.gpus = options.gpus;
  dry.device_bytes = options.device_bytes;
  dry.host_bytes = options.host_bytes;
  dry.nvme_bytes = options.nvme_bytes;
  dry.batch = options.batch;
  dry.runtime_allowance = options.runtime_allowance;
  dry.progress = options.progress;
  return dry;
}

void DescribeTraced(const TracedModel& model, PlanOptions& options) {
  options.traced_class = model.model;
  options.traced_dtype = DTypeName(model.dtype);
  options.traced_attention = model.attention;
}

namespace {

// "8 nodes of 8", "1 node", "2 nodes of up to 3".
std::string NodesText(const DryRunResult& r) {
  if (r.nodes == 1) return "1 node";
  const int64_t per = (r.world + r.nodes - 1) / r.nodes;
  return absl::StrCat(r.nodes, " nodes of ", r.world % r.nodes == 0 ? "" : "up to ", per);
}

// "  (traced LlamaForCausalLM in bf16 on torch's meta device; attention
// kernel: flash)\n", or nothing for memwall's own models.
std::string TracedLine(const PlanOptions& options) {
  if (options.traced_class.empty()) return "";
  return absl::StrFormat("  (traced %s in %s on torch's meta device; attention kernel: %s)\n",
                         options.traced_class, options.traced_dtype, options.traced_attention);
}

}  // namespace

namespace {

// The chosen config goes to --out (only where a candidate fits).
absl::Status WriteChosen(const PlanOptions& options, const std::string& json) {
  if (options.out_path.empty()) return absl::OkStatus();
  return WriteOutputFile("--out", options.out_path, json + "\n", options.overwrite_out);
}

absl::StatusOr<std::string> AutoReport(const PlanOptions& options, const Config& config) {
  MW_ASSIGN_OR_RETURN(const Hardware hw, PlanHardware(options));
  MW_ASSIGN_OR_RETURN(const AutoResult result,
                      AutoStrategy(ToDryRunOptions(options, config, hw), config, hw,
                                   options.vary_micro_batch));
  const Candidate* best = result.best >= 0 ? &result.candidates[result.best] : nullptr;
  const std::string chosen = best != nullptr ? ConfigToJson(best->config) : "";
  // Tiles belong to the model: the chosen ones are run through its spec.
  std::string run_model = options.model;
  if (best != nullptr && best->tiles > 1) {
    MW_ASSIGN_OR_RETURN(run_model, WithTiles(options.model, best->tiles));
  }
  if (best != nullptr) MW_RETURN_IF_ERROR(WriteChosen(options, chosen));
  if (options.json) {
    nlohmann::json j;
    j["schema"] = "memwall.plan-auto/1";
    j["model"] = options.model;
    j["gpus"] = options.gpus;
    j["hardware"] = hw.name;
    j["candidates"] = nlohmann::json::array();
    for (const Candidate& c : result.candidates) {
      j["candidates"].push_back({{"name", c.name},
                                 {"tiles", c.tiles},
                                 {"fits", c.plan.fits},
                                 {"device_needed", c.plan.device_needed},
                                 {"host_peak", c.plan.host_peak},
                                 {"nvme_used", c.plan.nvme_used},
                                 {"inter_node_bytes", c.plan.link_bytes.inter_node},
                                 {"across_nodes_seconds",
                                  c.plan.fits ? PredictStep(c.plan, c.config, hw).across_nodes
                                              : 0.0},
                                 {"step_seconds", c.plan.fits ? c.step_seconds : 0.0},
                                 {"changes_results", c.changes_results}});
    }
    j["parameters"] = result.candidates.empty() ? 0 : result.candidates[0].plan.parameters;
    j["fits"] = best != nullptr;
    if (best != nullptr) {
      j["chosen"] = best->name;
      j["model_to_run"] = run_model;
      j["step_seconds"] = best->step_seconds;
      j["config"] = nlohmann::json::parse(chosen);
      j["plan"] = PlanJson(options, best->config, best->plan);
    }
    return j.dump(2) + "\n";
  }
  const int64_t parameters = result.candidates.empty() ? 0 : result.candidates[0].plan.parameters;
  std::string out = absl::StrFormat(
      "memwall plan --auto: %s (%.2fB parameters) on %lld GPU%s of %s, host %s, NVMe %s; %s "
      "weights (the config's precision); step times on %s\n",
      options.model, parameters / 1e9, static_cast<long long>(options.gpus),
      options.gpus == 1 ? "" : "s", FormatBytes(options.device_bytes),
      FormatBytes(options.host_bytes), FormatBytes(options.nvme_bytes),
      DTypeName(config.param_dtype()), hw.name);
  out += TracedLine(options);
  const int64_t nodes = result.candidates.empty() ? 1 : result.candidates[0].plan.nodes;
  absl::StrAppendFormat(&out,
                        "  (%.1f TFLOP/s sustained, interconnect %.1f GB/s%s, host link %.1f "
                        "GB/s, CPU Adam %.1f GB/s, disk %.2f GB/s)\n",
                        hw.flops / 1e12, hw.interconnect_bps / 1e9,
                        nodes > 1 ? absl::StrFormat(" inside nodes and %.1f GB/s across %s",
                                                    hw.inter_node_bps / 1e9,
                                                    NodesText(result.candidates[0].plan))
                                  : "",
                        hw.pcie_bps / 1e9, hw.cpu_adam_bps / 1e9, hw.nvme_bps / 1e9);
  // The name column fits the longest name, so the figures line up.
  int width = 0;
  for (const Candidate& c : result.candidates) width = std::max(width, int(c.name.size()));
  absl::StrAppendFormat(&out, "%-*s %12s %12s %10s%s\n", width, "candidate", "device need", "host",
                        "step s", nodes > 1 ? "  across nodes (bytes, s)" : "");
  const Candidate* smallest = nullptr;
  for (const Candidate& c : result.candidates) {
    if (smallest == nullptr || c.plan.device_needed < smallest->plan.device_needed) smallest = &c;
    absl::StrAppendFormat(
        &out, "%-*s %12s %12s %10s%s\n", width, c.name, FormatBytes(c.plan.device_needed),
        FormatBytes(c.plan.host_peak),
        c.plan.fits ? absl::StrFormat("%.3f%s", c.step_seconds, c.changes_results ? "*" : "")
                    : "no fit",
        nodes > 1 && c.plan.fits
            ? absl::StrFormat("  %s, %.3f", FormatBytes(c.plan.link_bytes.inter_node),
                              PredictStep(c.plan, c.config, hw).across_nodes)
            : "");
  }
  if (std::any_of(result.candidates.begin(), result.candidates.end(),
                  [](const Candidate& c) { return c.changes_results; })) {
    out += "  * quantized communication changes the results: chosen only when the config sets "
           "zero_quantized_weights (qwZ), zero_quantized_gradients (qgZ)\n";
  }
  if (best == nullptr) {
    // What binds the candidate nearest the device's size: its device need
    // may be under the device and its host memory or disk over.
    absl::StrAppendFormat(
        &out,
        "fits: no (no candidate fits; the one needing the least device memory, %s, needs %s of "
        "%s%s and overflows %s)\n",
        smallest->name, FormatBytes(smallest->plan.device_needed),
        FormatBytes(options.device_bytes),
        options.runtime_allowance > 0
            ? absl::StrCat(" (with the CUDA runtime's ", FormatBytes(options.runtime_allowance),
                           " allowance)")
            : "",
        smallest->plan.fits_text.substr(4, smallest->plan.fits_text.size() - 5));
    return out;
  }
  absl::StrAppendFormat(&out, "chosen: %s, %.3f s per step predicted\n%s\n", best->name,
                        best->step_seconds, chosen);
  if (best->tiles > 1) {
    absl::StrAppendFormat(&out,
                          "model: %s (the tiles are the model's: run it with --model %s and this "
                          "config)\n",
                          run_model, run_model);
  }
  if (!options.out_path.empty()) absl::StrAppendFormat(&out, "written to %s\n", options.out_path);
  out += "fits: yes\n";
  return out;
}

}  // namespace

namespace {

// Single quotes for /bin/sh.
std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The error of a failed `python -m memwall.hf` (std::system's status `rc`,
// what it printed `log`): memwall.hf's own message for a config it refuses
// (exit 2), advice to install the Python front end where Python could not
// import it, and otherwise the exit code (or signal) and the last line.
absl::Status TraceFailure(const std::string& model, const std::string& python, int rc,
                          const std::string& log) {
  std::string last;
  for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipWhitespace())) {
    last = std::string(absl::StripAsciiWhitespace(line));
  }
  const std::string how =
      rc == -1 ? "could not be started"
      : WIFSIGNALED(rc) ? absl::StrCat("was killed by signal ", WTERMSIG(rc))
                        : absl::StrCat("exited with ", WEXITSTATUS(rc));
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 127) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--model ", model, ": ", python, " was not found; tracing a Hugging Face model needs "
        "the Python front end with torch and transformers: run tools/python_env.sh and set "
        "MEMWALL_PYTHON=.venv/bin/python"));
  }
  if (absl::StrContains(last, "No module named")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--model ", model, ": ", python, " -m memwall.hf ", how, " (", last,
        "); tracing a Hugging Face model needs the Python front end with torch and "
        "transformers: run tools/python_env.sh and set MEMWALL_PYTHON=.venv/bin/python"));
  }
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 2 && absl::StartsWith(last, "memwall.hf: ")) {
    return absl::InvalidArgumentError(absl::StrCat("--model ", model, ": ", last.substr(12)));
  }
  return absl::InternalError(absl::StrCat("--model ", model, ": tracing it with ", python,
                                          " -m memwall.hf ", how,
                                          last.empty() ? "" : absl::StrCat(": ", last)));
}

}  // namespace

absl::StatusOr<TracedModel> TraceHuggingFace(const PlanOptions& options, const Config& config) {
  const std::string path = options.model.substr(3);
  const char* python_env = std::getenv("MEMWALL_PYTHON");
  const std::string python = python_env != nullptr && *python_env ? python_env : "python3";
  char tmpl[] = "/tmp/memwall-traced-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) return absl::InternalError("plan: cannot make a temporary file in /tmp");
  close(fd);
  const std::string out = tmpl;
  // What the tracer says goes to a file of its own: its last line is the
  // error, and a failure quotes it.
  const std::string said = out + ".log";
  const std::string command = absl::StrCat(
      ShellQuote(python), " -m memwall.hf ", ShellQuote(path), " --seq ", options.seq,
      " --image ", options.image == 224 ? 0 : options.image, " --batch ",
      std::max<int64_t>(1, config.train_micro_batch_size_per_gpu), " --dtype ",
      DTypeName(config.param_dtype()), " --attention ", ShellQuote(options.attention),
      " --lora-rank ", options.lora_rank, " --lora-targets ", ShellQuote(options.lora_targets),
      " --out ", ShellQuote(out), " > ", ShellQuote(said), " 2>&1");
  ScopedProgressStage stage(options.progress, absl::StrCat("tracing ", path, " with ", python));
  const int rc = std::system(command.c_str());
  std::string log;
  {
    std::ifstream in(said);
    log.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::remove(said.c_str());
  if (rc != 0) {
    std::remove(out.c_str());
    return TraceFailure(options.model, python, rc, log);
  }
  std::fputs(log.c_str(), stderr);  // transformers' warnings, say
  absl::StatusOr<TracedModel> model = LoadTracedModel(out);
  std::remove(out.c_str());
  return model;
}

nlohmann::json PlanJson(const PlanOptions& options, const Config& config, const DryRunResult& r) {
  nlohmann::json collectives = nlohmann::json::object();
  for (int c = 0; c < kNumCollectives; ++c) {
    collectives[std::string(CollectiveName(static_cast<Collective>(c)))] = {
        {"calls", r.collectives[c].calls},
        {"bytes", r.collectives[c].bytes},
        {"intra_node_bytes", r.collectives[c].intra_node_bytes},
        {"inter_node_bytes", r.collectives[c].inter_node_bytes}};
  }
  nlohmann::json j;
  j["schema"] = "memwall.plan/1";
  j["model"] = options.model;
  j["parameters"] = r.parameters;
  j["gpus"] = options.gpus;
  j["micro_batch"] = r.batch;
  if (!options.traced_class.empty()) {
    j["traced"] = {{"class", options.traced_class},
                   {"dtype", options.traced_dtype},
                   {"attention", options.traced_attention}};
  }
  j["zero_stage"] = config.zero.stage;
  if (config.zero.mics_shard_size > 0) j["mics_shard_size"] = config.zero.mics_shard_size;
  j["forward_flops_per_step"] = r.forward_flops;
  j["recompute_flops_per_step"] = r.extra_flops;
  j["kernel_launches_per_step"] = r.kernel_launches;
  j["transient_bytes_per_step"] = r.transient_bytes;
  j["recomputation"] = r.recompute.planner;
  // The plan's segments over the model's layers (a traced model's stages),
  // which memwall.torch executes, and its activation figures.
  nlohmann::json segments = nlohmann::json::array();
  for (const Segment& s : r.recompute.segments) {
    segments.push_back({{"begin", s.begin}, {"end", s.end}, {"mode", SegmentModeName(s.mode)}});
  }
  j["recompute_segments"] = segments;
  j["recompute_predicted_peak"] = r.recompute.predicted_peak;
  j["recompute_held_after_forward"] = r.recompute.held_after_forward;
  if (!r.recompute_note.empty()) j["recomputation_note"] = r.recompute_note;
  j["device"] = {{"budget", options.device_bytes},
                 {"runtime_allowance", options.runtime_allowance},
                 {"requested_peak", r.device_requested_peak},
                 {"reserved_peak", r.device_reserved_peak},
                 {"needed", r.device_needed}};
  nlohmann::json by_category = nlohmann::json::object();
  for (MemoryCategory c : kAllMemoryCategories) {
    by_category[std::string(MemoryCategoryName(c))] = r.peak.by_category[static_cast<int>(c)];
  }
  j["device"]["at_peak"] = by_category;
  nlohmann::json peaks = nlohmann::json::object();
  for (MemoryCategory c : kAllMemoryCategories) {
    peaks[std::string(MemoryCategoryName(c))] = r.category_peaks[static_cast<int>(c)];
  }
  j["device"]["category_peaks"] = peaks;
  j["device"]["peak_phase"] = absl::StrJoin(r.peak.phase_path, " > ");
  j["host"] = {{"budget", options.host_bytes}, {"reserved_peak", r.host_peak}};
  j["nvme"] = {{"budget", options.nvme_bytes},
               {"used", r.nvme_used},
               {"bytes_per_step", r.nvme_bytes_per_step}};
  j["communication_bytes_per_step"] = r.comm_bytes;
  j["nodes"] = r.nodes;
  j["link_bytes_per_step"] = {{"intra_node", r.link_bytes.intra_node},
                              {"inter_node", r.link_bytes.inter_node}};
  j["host_link_bytes_per_step"] = r.pcie_bytes;
  j["collectives"] = collectives;
  j["fits"] = r.fits;
  j["fits_text"] = r.fits_text;
  if (!config.not_applied.empty()) j["not_applied"] = config.not_applied;
  return j;
}

absl::StatusOr<std::string> PlanReport(const PlanOptions& options) {
  MW_ASSIGN_OR_RETURN(Config config, options.config_text.empty()
                                         ? LoadConfigOrDefault(options.config_path)
                                         : ParseConfig(options.config_text));
  // --batch is the configuration planned, so the config printed says it.
  if (options.batch > 0) config.train_micro_batch_size_per_gpu = options.batch;
  const bool hf = options.model.rfind("hf:", 0) == 0;
  if ((hf || options.model.rfind("traced:", 0) == 0) && !options.factory) {
    absl::StatusOr<TracedModel> traced = hf ? TraceHuggingFace(options, config)
                                            : LoadTracedModel(options.model.substr(7));
    if (!traced.ok()) return traced.status();
    if (!hf && options.seq > 0 && (traced->input.empty() || traced->input.back() != options.seq)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--seq ", options.seq, ": ", options.model, " was traced at sequence ",
          traced->input.empty() ? 0 : traced->input.back(), "; trace it again at ", options.seq));
    }
    PlanOptions with_model = options;
    DescribeTraced(*traced, with_model);
    with_model.factory = TracedModelFactory(std::make_shared<const TracedModel>(*std::move(traced)));
    return PlanReport(with_model);
  }
  // The dry run plays rank 0 of --gpus: a train_batch_size for another world
  // is the config's, said so (the auto strategy keeps micro-batch x
  // accumulation).
  MW_RETURN_IF_ERROR(CheckTrainBatchSize(config, options.gpus));
  if (options.auto_strategy || config.zero.stage == kAutoStage) return AutoReport(options, config);
  if (!options.out_path.empty()) {
    return absl::InvalidArgumentError(
        "--out applies to 'plan' with --auto (or a config whose stage is \"auto\") only: it is "
        "where the chosen config is written");
  }
  MW_ASSIGN_OR_RETURN(const Hardware hw, PlanHardware(options));
  MW_ASSIGN_OR_RETURN(const DryRunResult r, DryRun(ToDryRunOptions(options, config, hw), config));
  if (options.json) return PlanJson(options, config, r).dump(2) + "\n";
  std::string out = absl::StrFormat(
      "memwall plan: %s (%.2fB parameters), %lld GPU%s, %s, micro-batch %lld, "
      "recomputation %s\n",
      options.model, r.parameters / 1e9, static_cast<long long>(options.gpus),
      options.gpus == 1 ? "" : "s", DescribeZero(config.zero, "GPU"),
      static_cast<long long>(r.batch),
      r.recompute.planner);
  out += TracedLine(options);
  if (!config.not_applied.empty()) {
    absl::StrAppendFormat(&out, "  (config: DeepSpeed settings with no memwall counterpart, not "
                          "applied: %s)\n", absl::StrJoin(config.not_applied, ", "));
  }
  if (!r.recompute_note.empty()) {
    absl::StrAppendFormat(&out, "  (%s; planned the least activation peak instead)\n",
                          r.recompute_note);
  }
  absl::StrAppendFormat(&out, "device (rank 0 of %lld), at the step's peak (%s):\n",
                        static_cast<long long>(options.gpus),
                        absl::StrJoin(r.peak.phase_path, " > "));
  for (MemoryCategory c : kAllMemoryCategories) {
    const int64_t b = r.peak.by_category[static_cast<int>(c)];
    if (b > 0) {
      absl::StrAppendFormat(&out, "  %-24s %12s\n", std::string(MemoryCategoryName(c)),
                            FormatBytes(b));
    }
  }
  absl::StrAppendFormat(&out, "  %-24s %12s  (model states %s, activations %s)\n", "requested",
                        FormatBytes(r.peak.bytes), FormatBytes(ModelStateBytes(r.peak.by_category)),
                        FormatBytes(ActivationBytesOf(r.peak.by_category)));
  absl::StrAppendFormat(&out, "  %-24s %12s  (allocator segments at their peak)\n", "reserved",
                        FormatBytes(r.device_reserved_peak));
  absl::StrAppendFormat(&out, "  %-24s %12s  (CUDA context, cuBLAS and NCCL workspaces)\n",
                        "runtime allowance", FormatBytes(options.runtime_allowance));
  absl::StrAppendFormat(&out, "  %-24s %12s of %s\n", "needed", FormatBytes(r.device_needed),
                        FormatBytes(options.device_bytes));
  absl::StrAppendFormat(&out, "host (pinned): %s of %s; NVMe: %s of %s\n", FormatBytes(r.host_peak),
                        FormatBytes(options.host_bytes), FormatBytes(r.nvme_used),
                        FormatBytes(options.nvme_bytes));
  absl::StrAppendFormat(
      &out, "communication per step (rank 0): %s%s; host link (PCIe) per step: %s\n",
      FormatBytes(r.comm_bytes), r.world == 1 ? " (one GPU: local, over no link)" : "",
      FormatBytes(r.pcie_bytes));
  if (r.world > 1) {
    absl::StrAppendFormat(&out, "  over links per step (all %lld GPUs, %s): %s inside nodes, %s "
                          "across nodes\n",
                          static_cast<long long>(r.world), NodesText(r), 
                          FormatBytes(r.link_bytes.intra_node),
                          FormatBytes(r.link_bytes.inter_node));
  }
  if (!options.hardware.empty()) {
    absl::StrAppendFormat(&out, "predicted step time on %s: %s\n", hw.name,
                          PredictStep(r, config, hw).ToString());
  }
  absl::StrAppendFormat(&out, "fits: %s\n", r.fits_text);
  return out;
}

}  // namespace memwall
