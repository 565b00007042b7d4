#include "cli/train.h"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "cli/session.h"
#include "engine/config.h"
#include "engine/checkpoint.h"
#include "engine/dry_run.h"
#include "engine/engine.h"
#include "kernels/cpu/blas_core.h"
#include "models/corpus.h"
#include "models/gpt.h"
#include "models/spec.h"
#include "runtime/mpi_communicator.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {

namespace {

using json = nlohmann::json;

// Prints one log record on rank 0's stdout: `text`, or `record` as one
// line of JSON.
void Emit(const TrainOptions& options, const std::string& text, const json& record) {
  const std::string line = options.log_format == "json" ? record.dump() : text;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

constexpr std::array<MemoryCategory, 4> kShown = {
    MemoryCategory::kParameter, MemoryCategory::kGradient, MemoryCategory::kOptimizerState,
    MemoryCategory::kActivation};

std::string Bar(int64_t done, int64_t total) {
  constexpr int kWidth = 20;
  const int filled = static_cast<int>(kWidth * done / std::max<int64_t>(total, 1));
  return absl::StrCat("[", std::string(filled, '#'), std::string(kWidth - filled, '.'), "]");
}

// The `memwall plan` command that shows what fits this run on `ranks`.
std::string PlanCommand(const TrainOptions& options, int ranks, int64_t micro) {
  // A GPU's memory for the plan command: memwall's share plus the runtime's.
  return absl::StrCat("memwall plan --model ", options.model, " --gpus ", ranks,
                      " --device-memory ", options.capacity_bytes + kDeviceRuntimeAllowance,
                      " --batch ", micro,
                      options.config_path.empty() ? ""
                                                  : absl::StrCat(" --config ", options.config_path),
                      " --auto");
}

void PrintHeader(const TrainOptions& options, const GptConfig& gpt, Engine& engine,
                 const ByteCorpus& corpus) {
  const Config& config = engine.config();
  const int ranks = engine.communicator().world_size();
  const int64_t micro = config.train_micro_batch_size_per_gpu;
  const int accumulation = config.gradient_accumulation_steps;
  const int64_t tokens = micro * accumulation * gpt.seq * ranks;
  const std::string data =
      options.data_path.empty() ? "built-in synthetic corpus" : options.data_path;
  const bool offloaded = config.zero.offload_optimizer_ratio > 0;
  // Frozen blocks: what trains, from the engine's flat groups.
  int64_t trainable = 0;
  for (const FlatGroup& g : engine.states().layout().groups) {
    if (g.trainable) trainable += g.numel;
  }
  const int64_t parameters = GptParameterCount(gpt);
  std::string recomputation;
  if (engine.recomputation_plan().planner != "none") {
    const absl::StatusOr<Chain> chain = engine.trainer()->ChainFor(engine.input_shape());
    if (chain.ok()) recomputation = PlanSummary(*chain, engine.recomputation_plan());
  }
  if (options.log_format == "json") {
    json record = {{"event", "start"},
                   {"model", options.model},
                   {"parameters", parameters},
                   {"trainable_parameters", trainable},
                   {"zero_stage", config.zero.stage},
                   {"ranks", ranks},
                   {"backend", std::string(BackendName(options.backend))},
                   {"device_bytes", options.capacity_bytes},
                   {"data", data},
                   {"data_bytes", corpus.size()},
                   {"tokens_per_step", tokens},
                   {"micro_batch", micro},
                   {"gradient_accumulation_steps", accumulation},
                   {"seq", gpt.seq}};
    if (options.backend == Backend::kHost) record["blas"] = kernels::cpu::BlasDescription();
    if (!engine.auto_choice().empty()) record["auto_strategy"] = engine.auto_choice();
    if (!recomputation.empty()) record["recomputation"] = recomputation;
    if (offloaded) record["cpu_update_threads"] = engine.cpu_update_threads();
    Emit(options, "", record);
    return;
  }
  const std::string counts =
      trainable == parameters
          ? absl::StrFormat("%.2fM parameters", parameters / 1e6)
          : absl::StrFormat("%.2fM parameters, %.2fM trainable", parameters / 1e6, trainable / 1e6);
  std::printf(
      "memwall train: %s (%s), ZeRO stage %d, %d rank%s, %s backend with %s "
      "per rank\n",
      options.model.c_str(), counts.c_str(), config.zero.stage, ranks, ranks == 1 ? "" : "s",
      std::string(BackendName(options.backend)).c_str(),
      FormatBytes(options.capacity_bytes).c_str());
  std::printf("data: %s (%lld bytes), %lld tokens per step (%lld x %d micro-batches x %lld "
              "tokens x %d ranks)\n",
              data.c_str(), static_cast<long long>(corpus.size()), static_cast<long long>(tokens),
              static_cast<long long>(micro), accumulation, static_cast<long long>(gpt.seq), ranks);
  if (options.backend == Backend::kHost) {  // the host backend's GEMMs
    std::printf("BLAS: %s\n", kernels::cpu::BlasDescription().c_str());
  }
  if (!engine.auto_choice().empty()) {
    std::printf("auto strategy: %s\n", engine.auto_choice().c_str());
  }
  if (!recomputation.empty()) std::printf("activation recomputation: %s\n", recomputation.c_str());
  if (offloaded) {
    const int threads = engine.cpu_update_threads();
    std::string overlap;
    if (config.zero.offload_overlap_step) {
      // Backward reduces the first group last: its update cannot start
      // before backward ends, so a model in one group overlaps nothing.
      const FlatLayout& layout = engine.states().layout();
      const size_t groups = layout.groups.size();
      if (groups == 1) {
        overlap = absl::StrFormat(
            ", after backward: the model is one group, so none of the update overlaps backward "
            "(a reduce_bucket_size below its %lld elements splits it at layer boundaries)",
            static_cast<long long>(layout.numel));
      } else {
        overlap = absl::StrFormat(
            ", overlapped with backward in %zu groups (the first, %.0f%% of the parameters, is "
            "reduced last and updates after backward)",
            groups, 100.0 * layout.groups[0].numel / std::max<int64_t>(1, layout.numel));
      }
    }
    std::printf("optimizer offload: the CPU update runs on %d thread%s per rank%s\n", threads,
                threads == 1 ? "" : "s", overlap.c_str());
  }
  std::fflush(stdout);
}

// The progress line of a step: loss, the learning rate it trained with
// (the text line shows it when the config schedules it), throughput, and
// each category's peak over the ranks.
absl::Status PrintStep(const TrainOptions& options, Engine& engine, MpiCommunicator& world,
                       int64_t step, float loss, float lr, double tokens_per_second,
                       bool applied) {
  const AllocatorStats s = engine.device().allocator().stats();
  std::array<int64_t, 5> peaks;
  for (size_t i = 0; i < kShown.size(); ++i) peaks[i] = s.by_category[int(kShown[i])].peak;
  peaks[4] = s.requested.peak;
  if (options.backend != Backend::kMeta) {
    MW_RETURN_IF_ERROR(
        world.AllReduceHost(peaks.data(), 5, MPI_INT64_T, MPI_MAX, "the peak memory"));
  }
  if (world.rank() != 0) return absl::OkStatus();
  std::string line = absl::StrFormat("%s step %lld/%lld", Bar(step + 1, options.steps),
                                     static_cast<long long>(step + 1),
                                     static_cast<long long>(options.steps));
  // Six decimals: enough to tell two runs apart, not only their trend.
  if (engine.device().holds_bytes()) absl::StrAppendFormat(&line, " | loss %.6f", loss);
  if (engine.config().schedule.type != LrSchedule::Type::kNone) {
    absl::StrAppendFormat(&line, " | lr %.4g", lr);
  }
  absl::StrAppendFormat(&line, " | %.0f tokens/s", tokens_per_second);
  if (!applied) absl::StrAppend(&line, " | step skipped (inf/nan gradients)");
  absl::StrAppend(&line, " | peak memory/rank:");
  for (size_t i = 0; i < kShown.size(); ++i) {
    absl::StrAppend(&line, " ", MemoryCategoryName(kShown[i]), " ", FormatBytes(peaks[i]));
  }
  absl::StrAppend(&line, ", all ", FormatBytes(peaks[4]));
  json record = {{"event", "step"},
                 {"step", step + 1},
                 {"steps", options.steps},
                 {"lr", lr},
                 {"tokens_per_s", tokens_per_second},
                 {"applied", applied}};
  if (engine.device().holds_bytes()) record["loss"] = loss;
  json peak = json::object();
  for (size_t i = 0; i < kShown.size(); ++i) {
    peak[std::string(MemoryCategoryName(kShown[i]))] = peaks[i];
  }
  peak["all"] = peaks[4];
  record["peak_bytes_per_rank"] = peak;
  Emit(options, line, record);
  return absl::OkStatus();
}

absl::Status Save(const TrainOptions& options, Engine& engine) {
  MW_ASSIGN_OR_RETURN(const std::string saved,
                      engine.SaveCheckpoint(options.save_dir, options.keep_checkpoints));
  if (engine.communicator().rank() == 0) {
    Emit(options, absl::StrCat("saved ", saved), {{"event", "saved"}, {"path", saved}});
  }
  return absl::OkStatus();
}

// Steps from the engine's step (0, or the resumed checkpoint's) up to
// options.steps, logging, saving and summarising.
absl::Status TrainLoop(const TrainOptions& options, const GptConfig& gpt, Engine& engine,
                       MpiCommunicator& world, const ByteCorpus& corpus) {
  const Config& config = engine.config();
  const int rank = engine.communicator().rank(), ranks = engine.communicator().world_size();
  const int64_t micro = config.train_micro_batch_size_per_gpu;
  const int accumulation = config.gradient_accumulation_steps;
  const int64_t tokens_per_step = micro * accumulation * gpt.seq * ranks;
  float first_loss = 0, last_loss = 0;
  double seconds = 0;
  const int64_t first_step = engine.steps();
  const int64_t skipped_before = engine.states().steps_skipped();
  if (first_step >= options.steps && world.rank() == 0 && options.steps > 0) {
    Emit(options,
         absl::StrFormat("nothing to train: the run is at step %lld and --steps %lld is the step "
                         "to train up to",
                         static_cast<long long>(first_step), static_cast<long long>(options.steps)),
         {{"event", "nothing_to_train"}, {"step", first_step}, {"steps", options.steps}});
  }
  for (int64_t step = first_step; step < options.steps; ++step) {
    std::vector<Batch> batches;
    for (int u = 0; u < accumulation; ++u) {
      MW_ASSIGN_OR_RETURN(Batch b, corpus.MakeBatch(engine.device(), rank, micro, gpt.seq,
                                                    step * accumulation + u));
      batches.push_back(std::move(b));
    }
    const float lr = engine.states().LearningRate(0).value();  // memwall's layers use one group
    const auto start = std::chrono::steady_clock::now();
    MW_ASSIGN_OR_RETURN(const Trainer::StepReport report, engine.TrainStep(batches));
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    seconds += took.count();
    float loss = report.loss;
    if (options.backend != Backend::kMeta) {
      MW_RETURN_IF_ERROR(world.AllReduceHost(&loss, 1, MPI_FLOAT, MPI_SUM, "the mean loss"));
      loss /= ranks;
    }
    if (step == first_step) first_loss = loss;
    last_loss = loss;
    if (!options.save_dir.empty() && options.save_every > 0 &&
        (step + 1) % options.save_every == 0 && step + 1 < options.steps) {
      MW_RETURN_IF_ERROR(Save(options, engine));
    }
    if ((step + 1) % options.log_every == 0 || step + 1 == options.steps || step == first_step) {
      MW_RETURN_IF_ERROR(PrintStep(options, engine, world, step, loss, lr,
                                   tokens_per_step / took.count(), report.step.applied));
    }
  }
  // The final state is saved (--steps 0: the initialisation; a resumed run
  // that takes no step saves into another directory: resharding), unless
  // it is the checkpoint this run resumed from.
  const int64_t ran = options.steps - first_step;
  if (!options.save_dir.empty() &&
      (ran > 0 || first_step == 0 ||
       !IsCheckpointIn(options.resume_dir, options.save_dir))) {
    MW_RETURN_IF_ERROR(Save(options, engine));
  }
  if (world.rank() == 0 && ran > 0) {
    const int64_t skipped = engine.states().steps_skipped() - skipped_before;
    const double throughput = tokens_per_step * ran / seconds;
    std::string text = absl::StrFormat("summary: %lld steps (%lld skipped), %.0f tokens/s",
                                       static_cast<long long>(ran),
                                       static_cast<long long>(skipped), throughput);
    json record = {
        {"event", "summary"}, {"steps", ran}, {"skipped", skipped}, {"tokens_per_s", throughput}};
    if (engine.device().holds_bytes()) {
      absl::StrAppendFormat(&text, ", loss %.6f -> %.6f (ln(vocab) = %.6f)", first_loss,
                            last_loss, std::log(double(gpt.vocab)));
      record["first_loss"] = first_loss;
      record["last_loss"] = last_loss;
      record["ln_vocab"] = std::log(double(gpt.vocab));
    }
    Emit(options, text, record);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTrain(const TrainOptions& given) {
  TrainOptions options = given;
  if (options.steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--steps: expected >= 0, got ", options.steps));
  }
  if (options.log_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_every: expected >= 1, got ", options.log_every));
  }
  if (options.log_format != "text" && options.log_format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_format: expected text or json, got '", options.log_format, "'"));
  }
  if (options.save_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--save_every: expected >= 0, got ", options.save_every));
  }
  if (options.keep_checkpoints < 1) {  // checked now, not at the first save hours later
    return absl::InvalidArgumentError(
        absl::StrCat("--keep_checkpoints: expected >= 1, got ", options.keep_checkpoints));
  }
  MW_ASSIGN_OR_RETURN(GptConfig gpt, ParseGptModel(options.model));
  MW_ASSIGN_OR_RETURN(Config config, LoadConfigOrDefault(options.config_path));
  MW_ASSIGN_OR_RETURN(std::unique_ptr<MpiCommunicator> world,
                      StartWorld(options.collective_timeout));
  MW_ASSIGN_OR_RETURN(options.capacity_bytes,
                      DeviceBytesFor(options.backend, options.capacity_bytes, world->rank()));
  EngineOptions engine_options =
      CommandEngineOptions(options.backend, options.capacity_bytes, options.pinned_bytes,
                           options.simulate_ranks, *world);
  engine_options.seed = options.seed;
  engine_options.oom_dir = options.oom_dir;
  std::error_code no_size;
  engine_options.data_description =
      options.data_path.empty()
          ? "built-in synthetic corpus"
          : absl::StrCat(options.data_path, ", ",
                         std::filesystem::file_size(options.data_path, no_size), " bytes");
  // What the ranks' loop does between steps: ranks that differ here would
  // meet in different collectives.
  engine_options.schedule_description =
      absl::StrCat("--steps ", options.steps, " --log_every ", options.log_every);
  if (!options.save_dir.empty()) {
    absl::StrAppend(&engine_options.schedule_description, " --save ", options.save_dir,
                    " --save_every ", options.save_every, " --keep_checkpoints ",
                    options.keep_checkpoints);
  }
  if (!options.resume_dir.empty()) {
    absl::StrAppend(&engine_options.schedule_description, " --resume ", options.resume_dir);
  }
  engine_options.model_description = GptDescription(gpt);
  engine_options.plan_command = PlanCommand(
      options, options.backend == Backend::kMeta ? options.simulate_ranks : world->world_size(),
      config.train_micro_batch_size_per_gpu);
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                      Engine::Create(engine_options, config, SpecModel(options.model)));
  ByteCorpus corpus = ByteCorpus::Synthetic(1 << 20, /*seed=*/1234);
  if (!options.data_path.empty()) {
    MW_ASSIGN_OR_RETURN(corpus, ByteCorpus::FromFile(options.data_path, gpt.seq + 1, gpt.vocab));
  }
  if (world->rank() == 0) PrintHeader(options, gpt, *engine, corpus);
  if (!options.resume_dir.empty()) {
    MW_ASSIGN_OR_RETURN(const LoadedCheckpoint loaded, engine->LoadCheckpoint(options.resume_dir));
    if (world->rank() == 0) {
      json record = {{"event", "resumed"}, {"path", loaded.path}, {"step", engine->steps()}};
      std::string text;
      if (!loaded.skipped.empty()) {
        text = absl::StrCat("resume: ", loaded.skipped, "\n");
        record["skipped"] = loaded.skipped;
      }
      absl::StrAppendFormat(&text, "resumed from %s at step %lld", loaded.path,
                            static_cast<long long>(engine->steps()));
      Emit(options, text, record);
    }
  }
  if (!options.save_dir.empty()) {
    MW_RETURN_IF_ERROR(engine->OpenSaveDirectory(
        options.save_dir, IsCheckpointIn(options.resume_dir, options.save_dir)));
  }
  return TrainLoop(options, gpt, *engine, *world, corpus);
}

}  // namespace memwall
