#include "jobs/train.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/dry_run.h"
#include "engine/engine.h"
#include "jobs/session.h"
#include "kernels/cpu/blas_core.h"
#include "models/corpus.h"
#include "models/gpt.h"
#include "models/spec.h"
#include "runtime/mpi_communicator.h"
#include "runtime/status.h"

namespace memwall {

namespace {

// The `memwall plan` command that shows what fits this run on `ranks`.
std::string PlanCommand(const TrainOptions& options, int ranks, int64_t micro) {
  // A GPU's memory for the plan command: memwall's share plus the runtime's.
  return absl::StrCat(
      "memwall plan --model ", options.model, " --gpus ", ranks, " --device-memory ",
      options.capacity_bytes + kDeviceRuntimeAllowance, " --batch ", micro,
      options.config_path.empty() ? "" : absl::StrCat(" --config ", options.config_path),
      " --auto");
}

TrainStart StartOf(const TrainOptions& options, const GptConfig& gpt, Engine& engine,
                   const ByteCorpus& corpus) {
  const Config& config = engine.config();
  const FlatLayout& layout = engine.states().layout();
  TrainStart start;
  start.parameters = GptParameterCount(gpt);
  for (const FlatGroup& g : layout.groups) {
    if (g.trainable) start.trainable_parameters += g.numel;  // frozen blocks train nothing
  }
  start.zero = config.zero;
  start.ranks = engine.communicator().world_size();
  start.device_bytes = options.capacity_bytes;
  start.data = options.data_path.empty() ? "built-in synthetic corpus" : options.data_path;
  start.data_bytes = corpus.size();
  start.micro_batch = config.train_micro_batch_size_per_gpu;
  start.gradient_accumulation_steps = config.gradient_accumulation_steps;
  start.seq = gpt.seq;
  start.tokens_per_step =
      start.micro_batch * start.gradient_accumulation_steps * gpt.seq * start.ranks;
  if (options.backend == Backend::kHost) start.blas = kernels::cpu::BlasDescription();
  start.auto_strategy = engine.auto_choice();
  start.not_applied = config.not_applied;
  if (engine.recomputation_plan().planner != "none") {
    const absl::StatusOr<Chain> chain = engine.trainer()->ChainFor(engine.input_shape());
    if (chain.ok()) start.recomputation = PlanSummary(*chain, engine.recomputation_plan());
  }
  if (config.zero.offload_optimizer_ratio > 0) {
    start.cpu_update_threads = engine.cpu_update_threads();
    start.overlap_step = config.zero.offload_overlap_step;
    start.groups = static_cast<int>(layout.groups.size());
    start.numel = layout.numel;
    start.first_group_numel = layout.groups[0].numel;
  }
  return start;
}

// A reported step: its figures, with the ranks' mean loss and each
// category's peak over the ranks (collectives every rank joins).
absl::StatusOr<TrainStep> StepOf(const TrainOptions& options, Engine& engine,
                                 MpiCommunicator& world, int64_t step, float loss, float lr,
                                 double tokens_per_second, bool applied) {
  TrainStep out;
  out.step = step + 1;
  if (engine.device().holds_bytes()) out.loss = loss;
  out.lr = lr;
  out.lr_scheduled = engine.config().schedule.type != LrSchedule::Type::kNone;
  out.tokens_per_second = tokens_per_second;
  out.applied = applied;
  const AllocatorStats s = engine.device().allocator().stats();
  std::array<int64_t, kNumMemoryCategories + 1> peaks;
  for (int c = 0; c < kNumMemoryCategories; ++c) peaks[c] = s.by_category[c].peak;
  peaks[kNumMemoryCategories] = s.requested.peak;
  if (options.backend != Backend::kMeta) {
    MW_RETURN_IF_ERROR(world.AllReduceHost(peaks.data(), int(peaks.size()), MPI_INT64_T, MPI_MAX,
                                           "the peak memory"));
  }
  std::copy(peaks.begin(), peaks.begin() + kNumMemoryCategories, out.peak_by_category.begin());
  out.peak = peaks[kNumMemoryCategories];
  return out;
}

absl::Status Save(const TrainOptions& options, Engine& engine, TrainObserver& observer) {
  MW_ASSIGN_OR_RETURN(const std::string saved,
                      engine.SaveCheckpoint(options.save_dir, options.keep_checkpoints));
  if (engine.communicator().rank() == 0) observer.Saved(saved);
  return absl::OkStatus();
}

// Steps from the engine's step (0, or the resumed checkpoint's) up to
// options.steps, reporting and saving.
absl::Status TrainLoop(const TrainOptions& options, const GptConfig& gpt, Engine& engine,
                       MpiCommunicator& world, const ByteCorpus& corpus, TrainObserver& observer) {
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
    observer.NothingToTrain(first_step);
  }
  // The run's steps' collectives (set-up and saves left out).
  LinkBytes traffic;
  Arrivals arrivals{std::vector<int64_t>(ranks, 0), std::vector<double>(ranks, 0.0)};
  for (int64_t step = first_step; step < options.steps; ++step) {
    std::vector<Batch> batches;
    for (int u = 0; u < accumulation; ++u) {
      MW_ASSIGN_OR_RETURN(Batch b, corpus.MakeBatch(engine.device(), rank, micro, gpt.seq,
                                                    step * accumulation + u));
      batches.push_back(std::move(b));
    }
    const float lr = engine.states().LearningRate(0).value();  // memwall's layers use one group
    if (rank == options.slow_rank) absl::SleepFor(options.slow_step);
    const auto start = std::chrono::steady_clock::now();
    MW_ASSIGN_OR_RETURN(const Trainer::StepReport report, engine.TrainStep(batches));
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    seconds += took.count();
    traffic += report.traffic;
    for (int r = 0; r < ranks; ++r) {
      arrivals.last[r] += report.arrivals.last[r];
      arrivals.cost[r] += report.arrivals.cost[r];
    }
    float loss = report.loss;
    if (options.backend != Backend::kMeta) {
      MW_RETURN_IF_ERROR(world.AllReduceHost(&loss, 1, MPI_FLOAT, MPI_SUM, "the mean loss"));
      loss /= ranks;
    }
    if (step == first_step) first_loss = loss;
    last_loss = loss;
    if (!options.save_dir.empty() && options.save_every > 0 &&
        (step + 1) % options.save_every == 0 && step + 1 < options.steps) {
      MW_RETURN_IF_ERROR(Save(options, engine, observer));
    }
    if ((step + 1) % options.log_every == 0 || step + 1 == options.steps || step == first_step) {
      MW_ASSIGN_OR_RETURN(const TrainStep reported,
                          StepOf(options, engine, world, step, loss, lr,
                                 tokens_per_step / took.count(), report.step.applied));
      if (world.rank() == 0) observer.Stepped(reported);
    }
  }
  // The final state is saved (--steps 0: the initialisation; a resumed run
  // that takes no step saves into another directory: resharding), unless
  // it is the checkpoint this run resumed from.
  const int64_t ran = options.steps - first_step;
  if (!options.save_dir.empty() &&
      (ran > 0 || first_step == 0 || !IsCheckpointIn(options.resume_dir, options.save_dir))) {
    MW_RETURN_IF_ERROR(Save(options, engine, observer));
  }
  if (world.rank() == 0 && ran > 0) {
    TrainSummary summary;
    summary.steps = ran;
    summary.skipped = engine.states().steps_skipped() - skipped_before;
    summary.tokens_per_second = tokens_per_step * ran / seconds;
    if (engine.device().holds_bytes()) {
      summary.first_loss = first_loss;
      summary.last_loss = last_loss;
    }
    summary.ln_vocab = std::log(double(gpt.vocab));
    summary.traffic_per_step = {traffic.intra_node / ran, traffic.inter_node / ran};
    summary.nodes = engine.communicator().nodes();
    const int64_t compared = std::accumulate(arrivals.last.begin(), arrivals.last.end(),
                                             int64_t{0});
    if (ranks > 1 && compared > 0) {
      const int slowest = static_cast<int>(
          std::max_element(arrivals.cost.begin(), arrivals.cost.end()) - arrivals.cost.begin());
      summary.straggler = Straggler{
          slowest, arrivals.cost[slowest],
          std::accumulate(arrivals.cost.begin(), arrivals.cost.end(), 0.0),
          arrivals.last[slowest], compared};
    }
    observer.Finished(summary);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTrain(const TrainOptions& given, TrainObserver& observer) {
  TrainOptions options = given;
  if (options.steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--steps: expected >= 0, got ", options.steps));
  }
  if (options.log_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_every: expected >= 1, got ", options.log_every));
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
  MW_ASSIGN_OR_RETURN(JobSession session,
                      StartJob(options.backend, options.capacity_bytes, options.pinned_bytes,
                               options.simulate_ranks, options.collective_timeout));
  MpiCommunicator* const world = session.world.get();
  EngineOptions& engine_options = session.engine;
  options.capacity_bytes = engine_options.device_bytes;  // cuda: what the GPU had free
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
  if (world->rank() == 0) observer.Started(StartOf(options, gpt, *engine, corpus));
  if (!options.resume_dir.empty()) {
    MW_ASSIGN_OR_RETURN(const LoadedCheckpoint loaded, engine->LoadCheckpoint(options.resume_dir));
    if (world->rank() == 0) observer.Resumed(loaded.path, engine->steps(), loaded.skipped);
  }
  if (!options.save_dir.empty()) {
    MW_RETURN_IF_ERROR(engine->OpenSaveDirectory(
        options.save_dir, IsCheckpointIn(options.resume_dir, options.save_dir)));
  }
  return TrainLoop(options, gpt, *engine, *world, corpus, observer);
}

}  // namespace memwall
