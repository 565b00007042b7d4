#include "cli/train.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/units.h"
#include "sharding/options.h"

namespace memwall {
namespace {

using json = nlohmann::json;

// The categories a step's line shows (a training step's own).
constexpr std::array<MemoryCategory, 4> kShown = {
    MemoryCategory::kParameter, MemoryCategory::kGradient, MemoryCategory::kOptimizerState,
    MemoryCategory::kActivation};

std::string Bar(int64_t done, int64_t total) {
  constexpr int kWidth = 20;
  const int filled = static_cast<int>(kWidth * done / std::max<int64_t>(total, 1));
  return absl::StrCat("[", std::string(filled, '#'), std::string(kWidth - filled, '.'), "]");
}

class TrainLog : public TrainObserver {
 public:
  TrainLog(const TrainOptions& options, bool json) : options_(options), json_(json) {}

  void Started(const TrainStart& s) override {
    const std::string backend(BackendName(options_.backend));
    if (json_) {
      json record = {{"event", "start"},
                     {"model", options_.model},
                     {"parameters", s.parameters},
                     {"trainable_parameters", s.trainable_parameters},
                     {"zero_stage", s.zero.stage},
                     {"mics_shard_size", s.zero.mics_shard_size},
                     {"zero_quantized_weights", s.zero.quantized_weights},
                     {"zero_hpz_partition_size", s.zero.hpz_partition_size},
                     {"zero_quantized_gradients", s.zero.quantized_gradients},
                     {"ranks", s.ranks},
                     {"backend", backend},
                     {"device_bytes", s.device_bytes},
                     {"data", s.data},
                     {"data_bytes", s.data_bytes},
                     {"tokens_per_step", s.tokens_per_step},
                     {"micro_batch", s.micro_batch},
                     {"gradient_accumulation_steps", s.gradient_accumulation_steps},
                     {"seq", s.seq}};
      if (!s.blas.empty()) record["blas"] = s.blas;
      if (!s.auto_strategy.empty()) record["auto_strategy"] = s.auto_strategy;
      if (!s.recomputation.empty()) record["recomputation"] = s.recomputation;
      if (!s.not_applied.empty()) record["not_applied"] = s.not_applied;
      if (s.cpu_update_threads > 0) record["cpu_update_threads"] = s.cpu_update_threads;
      return Emit("", record);
    }
    const std::string counts =
        s.trainable_parameters == s.parameters
            ? absl::StrFormat("%.2fM parameters", s.parameters / 1e6)
            : absl::StrFormat("%.2fM parameters, %.2fM trainable", s.parameters / 1e6,
                              s.trainable_parameters / 1e6);
    std::printf("memwall train: %s (%s), %s, %d rank%s, %s backend with %s per rank\n",
                options_.model.c_str(), counts.c_str(), DescribeZero(s.zero, "rank").c_str(),
                s.ranks,
                s.ranks == 1 ? "" : "s", backend.c_str(), FormatBytes(s.device_bytes).c_str());
    std::printf(
        "data: %s (%lld bytes), %lld tokens per step (%lld x %d micro-batches x %lld "
        "tokens x %d ranks)\n",
        s.data.c_str(), static_cast<long long>(s.data_bytes),
        static_cast<long long>(s.tokens_per_step), static_cast<long long>(s.micro_batch),
        s.gradient_accumulation_steps, static_cast<long long>(s.seq), s.ranks);
    if (!s.blas.empty()) std::printf("BLAS: %s\n", s.blas.c_str());
    if (!s.auto_strategy.empty()) std::printf("auto strategy: %s\n", s.auto_strategy.c_str());
    if (!s.not_applied.empty()) {
      std::printf("config: DeepSpeed settings with no memwall counterpart, not applied: %s\n",
                  absl::StrJoin(s.not_applied, ", ").c_str());
    }
    if (!s.recomputation.empty()) {
      std::printf("activation recomputation: %s\n", s.recomputation.c_str());
    }
    if (s.cpu_update_threads > 0) {
      std::string overlap;
      if (s.overlap_step && s.groups == 1) {
        // Backward reduces the first group last: its update cannot start
        // before backward ends, so a model in one group overlaps nothing.
        overlap = absl::StrFormat(
            ", after backward: the model is one group, so none of the update overlaps backward "
            "(a reduce_bucket_size below its %lld elements splits it at layer boundaries)",
            static_cast<long long>(s.numel));
      } else if (s.overlap_step) {
        overlap = absl::StrFormat(
            ", overlapped with backward in %d groups (the first, %.0f%% of the parameters, is "
            "reduced last and updates after backward)",
            s.groups, 100.0 * s.first_group_numel / std::max<int64_t>(1, s.numel));
      }
      std::printf("optimizer offload: the CPU update runs on %d thread%s per rank%s\n",
                  s.cpu_update_threads, s.cpu_update_threads == 1 ? "" : "s", overlap.c_str());
    }
    std::fflush(stdout);
  }

  void Resumed(const std::string& path, int64_t step, const std::string& skipped) override {
    json record = {{"event", "resumed"}, {"path", path}, {"step", step}};
    std::string text;
    if (!skipped.empty()) {
      text = absl::StrCat("resume: ", skipped, "\n");
      record["skipped"] = skipped;
    }
    absl::StrAppendFormat(&text, "resumed from %s at step %lld", path,
                          static_cast<long long>(step));
    Emit(text, record);
  }

  void NothingToTrain(int64_t step) override {
    Emit(absl::StrFormat("nothing to train: the run is at step %lld and --steps %lld is the step "
                         "to train up to",
                         static_cast<long long>(step), static_cast<long long>(options_.steps)),
         {{"event", "nothing_to_train"}, {"step", step}, {"steps", options_.steps}});
  }

  // Six decimals of loss: enough to tell two runs apart, not only their
  // trend; the learning rate when the config schedules it; each shown
  // category's peak over the ranks.
  void Stepped(const TrainStep& s) override {
    std::string line =
        absl::StrFormat("%s step %lld/%lld", Bar(s.step, options_.steps),
                        static_cast<long long>(s.step), static_cast<long long>(options_.steps));
    if (s.loss) absl::StrAppendFormat(&line, " | loss %.6f", *s.loss);
    if (s.lr_scheduled) absl::StrAppendFormat(&line, " | lr %.4g", s.lr);
    absl::StrAppendFormat(&line, " | %.0f tokens/s", s.tokens_per_second);
    if (!s.applied) absl::StrAppend(&line, " | step skipped (inf/nan gradients)");
    absl::StrAppend(&line, " | peak memory/rank:");
    json peak = json::object();
    for (MemoryCategory c : kShown) {
      const int64_t bytes = s.peak_by_category[int(c)];
      absl::StrAppend(&line, " ", MemoryCategoryName(c), " ", FormatBytes(bytes));
      peak[std::string(MemoryCategoryName(c))] = bytes;
    }
    absl::StrAppend(&line, ", all ", FormatBytes(s.peak));
    peak["all"] = s.peak;
    json record = {{"event", "step"},
                   {"step", s.step},
                   {"steps", options_.steps},
                   {"lr", s.lr},
                   {"tokens_per_s", s.tokens_per_second},
                   {"applied", s.applied}};
    if (s.loss) record["loss"] = *s.loss;
    record["peak_bytes_per_rank"] = peak;
    Emit(line, record);
  }

  void Saved(const std::string& path) override {
    Emit(absl::StrCat("saved ", path), {{"event", "saved"}, {"path", path}});
  }

  void Finished(const TrainSummary& s) override {
    std::string text = absl::StrFormat("summary: %lld steps (%lld skipped), %.0f tokens/s",
                                       static_cast<long long>(s.steps),
                                       static_cast<long long>(s.skipped), s.tokens_per_second);
    json record = {{"event", "summary"},
                   {"steps", s.steps},
                   {"skipped", s.skipped},
                   {"tokens_per_s", s.tokens_per_second}};
    if (s.first_loss) {
      absl::StrAppendFormat(&text, ", loss %.6f -> %.6f (ln(vocab) = %.6f)", *s.first_loss,
                            *s.last_loss, s.ln_vocab);
      record["first_loss"] = *s.first_loss;
      record["last_loss"] = *s.last_loss;
      record["ln_vocab"] = s.ln_vocab;
    }
    // One rank moves nothing over a link.
    if (s.traffic_per_step.intra_node + s.traffic_per_step.inter_node > 0) {
      absl::StrAppendFormat(&text, "; over links per step: %s inside nodes, %s across (%d node%s)",
                            FormatBytes(s.traffic_per_step.intra_node),
                            FormatBytes(s.traffic_per_step.inter_node), s.nodes,
                            s.nodes == 1 ? "" : "s");
      record["link_bytes_per_step"] = {{"intra_node", s.traffic_per_step.intra_node},
                                       {"inter_node", s.traffic_per_step.inter_node}};
      record["nodes"] = s.nodes;
    }
    if (s.straggler) {
      const Straggler& w = *s.straggler;
      absl::StrAppendFormat(&text,
                            "; the ranks waited %.3f s in collectives for the last to arrive, "
                            "%.3f s of it (%.0f%%) for rank %d (last to %lld of %lld)",
                            w.waited_seconds, w.cost_seconds,
                            w.waited_seconds > 0 ? 100.0 * w.cost_seconds / w.waited_seconds : 0.0,
                            w.rank, static_cast<long long>(w.last),
                            static_cast<long long>(w.calls));
      record["straggler"] = {{"rank", w.rank},
                             {"cost_s", w.cost_seconds},
                             {"waited_s", w.waited_seconds},
                             {"last", w.last},
                             {"collectives", w.calls}};
    }
    Emit(text, record);
  }

 private:
  // One record on stdout: `text`, or `record` as one line of JSON.
  void Emit(const std::string& text, const json& record) {
    const std::string line = json_ ? record.dump() : text;
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  const TrainOptions& options_;
  const bool json_;
};

}  // namespace

absl::Status RunTrainCommand(const TrainOptions& options, const std::string& log_format) {
  if (log_format != "text" && log_format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_format: expected text or json, got '", log_format, "'"));
  }
  TrainLog log(options, log_format == "json");
  return RunTrain(options, log);
}

}  // namespace memwall
