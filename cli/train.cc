#include "cli/train.h"

#include "cli/auto_strategy.h"
#include "cli/plan.h"
#include "cli/session.h"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/trainer.h"
#include "models/corpus.h"
#include "models/gpt.h"
#include "profiler/memory_profiler.h"
#include "profiler/report.h"
#include "runtime/mpi_communicator.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {

namespace {

constexpr std::array<MemoryCategory, 4> kShown = {
    MemoryCategory::kParameter, MemoryCategory::kGradient, MemoryCategory::kOptimizerState,
    MemoryCategory::kActivation};

std::string Bar(int64_t done, int64_t total) {
  constexpr int kWidth = 20;
  const int filled = static_cast<int>(kWidth * done / std::max<int64_t>(total, 1));
  return absl::StrCat("[", std::string(filled, '#'), std::string(kWidth - filled, '.'), "]");
}

}  // namespace

// The phases open when a step failed: the unwinding closed them innermost
// first, so the last records, read backwards from the outermost, are the
// path ("step 0 > micro-batch 0 > forward > block5").
std::string PhaseAtFailure(const MemoryProfiler& profiler) {
  const std::vector<PhaseRecord> phases = profiler.phases();
  std::vector<std::string> path;
  int depth = 0;
  for (auto it = phases.rbegin(); it != phases.rend() && it->depth == depth; ++it, ++depth) {
    path.push_back(it->name);
  }
  return path.empty() ? std::string("the step") : absl::StrJoin(path, " > ");
}

absl::Status RunTrain(const TrainOptions& options) {
  if (options.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--steps: expected >= 1, got ", options.steps));
  }
  if (options.log_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_every: expected >= 1, got ", options.log_every));
  }
  MW_ASSIGN_OR_RETURN(GptConfig gpt, ParseGptModel(options.model));
  MW_ASSIGN_OR_RETURN(Config config, LoadConfigOrDefault(options.config_path));
  MW_ASSIGN_OR_RETURN(Ranks session, StartRanks(options.backend, options.simulate_ranks,
                                                 options.collective_timeout));
  std::string chosen;
  if (config.zero.stage == kAutoStage) {
    // The auto strategy, for this world and device; every rank computes the
    // same answer from the same inputs.
    PlanOptions plan;
    plan.model = options.model;
    plan.gpus = session.comm->world_size();
    // The capacity is memwall's allocator's own: the CUDA runtime lies outside it.
    plan.device_bytes = options.capacity_bytes;
    plan.runtime_allowance = 0;
    plan.host_bytes = options.pinned_bytes > 0 ? options.pinned_bytes : int64_t{64} << 30;
    plan.batch = config.train_micro_batch_size_per_gpu;
    MW_ASSIGN_OR_RETURN(const Hardware hw, HardwarePreset("a100-40gb"));
    MW_ASSIGN_OR_RETURN(const AutoResult found, AutoStrategy(plan, config, hw));
    if (found.best < 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "zero_optimization.stage \"auto\": no configuration fits ",
          FormatBytes(options.capacity_bytes), " per device (memwall plan --model ",
          options.model, " --auto shows each one's needs)"));
    }
    config = found.candidates[found.best].config;
    chosen = found.candidates[found.best].name;
  }
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Device> device,
                      UseDevice(session, options.backend, options.capacity_bytes,
                                PinnedBytes(options.pinned_bytes, options.capacity_bytes,
                                            config)));
  MpiCommunicator* world = session.world.get();
  Communicator* comm = session.comm;
  const int rank = comm->rank(), ranks = comm->world_size();
  MW_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Layer>> layers, MakeGpt(gpt));
  MemoryProfiler profiler(device->allocator());
  const std::string oom_dir = absl::StrCat(options.oom_dir, "/rank", rank);
  absl::StatusOr<std::unique_ptr<Trainer>> created =
      Trainer::Create(std::move(layers), std::make_unique<CrossEntropyLoss>(), config, *device,
                      *comm, options.seed);
  MW_RETURN_IF_ERROR(ReportOutOfMemory(created.status(), profiler, oom_dir));
  std::unique_ptr<Trainer> trainer = std::move(created).value();
  trainer->set_profiler(&profiler);
  const int64_t micro = config.train_micro_batch_size_per_gpu;
  const std::vector<int64_t> input = {micro, gpt.seq}, target = {micro * gpt.seq};
  MW_ASSIGN_OR_RETURN(
      const Plan plan,
      ApplyRecomputation(*trainer, config.activation_checkpointing, input,
                         device->allocator().capacity(),
                         [&]() -> absl::StatusOr<AllocatorStats> {
                           MW_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Layer>> copy,
                                               MakeGpt(gpt));
                           return DryRunStep(std::move(copy),
                                             std::make_unique<CrossEntropyLoss>(), config, rank,
                                             ranks, input, target);
                         }));
  ByteCorpus corpus = ByteCorpus::Synthetic(1 << 20, /*seed=*/1234);
  if (!options.data_path.empty()) {
    MW_ASSIGN_OR_RETURN(corpus, ByteCorpus::FromFile(options.data_path, gpt.seq + 1));
  }

  const int accumulation = config.gradient_accumulation_steps;
  const int64_t tokens_per_step = micro * accumulation * gpt.seq * ranks;
  const bool computes = device->holds_bytes();
  if (world->rank() == 0) {
    std::printf("memwall train: %s (%s parameters), ZeRO stage %d, %d rank%s, %s backend with %s "
                "per rank\n",
                options.model.c_str(),
                absl::StrFormat("%.2fM", GptParameterCount(gpt) / 1e6).c_str(), config.zero.stage,
                ranks, ranks == 1 ? "" : "s", std::string(BackendName(options.backend)).c_str(),
                FormatBytes(options.capacity_bytes).c_str());
    std::printf("data: %s (%lld bytes), %lld tokens per step (%lld x %d micro-batches x %lld "
                "tokens x %d ranks)\n",
                options.data_path.empty() ? "built-in synthetic corpus" : options.data_path.c_str(),
                static_cast<long long>(corpus.size()), static_cast<long long>(tokens_per_step),
                static_cast<long long>(micro), accumulation, static_cast<long long>(gpt.seq),
                ranks);
    if (!chosen.empty()) std::printf("auto strategy: %s\n", chosen.c_str());
    if (plan.planner != "none") {
      MW_ASSIGN_OR_RETURN(const Chain chain, trainer->ChainFor(input));
      std::printf("activation recomputation: %s\n", PlanSummary(chain, plan).c_str());
    }
    std::fflush(stdout);
  }

  if (options.save_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--save_every: expected >= 0, got ", options.save_every));
  }
  if (!options.resume_dir.empty()) {
    MW_ASSIGN_OR_RETURN(const std::string loaded, LoadCheckpoint(*trainer, options.resume_dir));
    if (rank == 0) {
      std::printf("resumed from %s at step %lld\n", loaded.c_str(),
                  static_cast<long long>(trainer->steps()));
      std::fflush(stdout);
    }
  }
  auto save = [&]() -> absl::Status {
    MW_ASSIGN_OR_RETURN(const std::string saved,
                        SaveCheckpoint(*trainer, options.save_dir, options.keep_checkpoints));
    if (rank == 0) {
      std::printf("saved %s\n", saved.c_str());
      std::fflush(stdout);
    }
    return absl::OkStatus();
  };

  float first_loss = 0, last_loss = 0;
  double seconds = 0;
  const int64_t first_step = trainer->steps();
  for (int64_t step = first_step; step < options.steps; ++step) {
    std::vector<Batch> batches;
    for (int u = 0; u < accumulation; ++u) {
      MW_ASSIGN_OR_RETURN(Batch b, corpus.MakeBatch(*device, rank, micro, gpt.seq,
                                                    step * accumulation + u));
      batches.push_back(std::move(b));
    }
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<Trainer::StepReport> stepped = trainer->TrainStep(batches);
    if (stepped.status().code() == absl::StatusCode::kResourceExhausted) {
      // Say what would fit, as well as what did not.
      PlanOptions plan;
      plan.model = options.model;
      plan.config_path = options.config_path;
      plan.gpus = ranks;
      plan.device_bytes = device->allocator().capacity();  // memwall's own, as above
      plan.runtime_allowance = 0;
      plan.batch = micro;
      const std::string fix = OutOfMemoryFix(plan, config);
      stepped = absl::Status(stepped.status().code(),
                             absl::StrCat(stepped.status().message(), ". It happened during ",
                                          PhaseAtFailure(profiler), ".", fix));
    }
    MW_RETURN_IF_ERROR(ReportOutOfMemory(stepped.status(), profiler, oom_dir));
    const Trainer::StepReport& report = *stepped;
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    seconds += took.count();
    float loss = report.loss;
    if (options.backend != Backend::kMeta) {
      MW_RETURN_IF_ERROR(world->AllReduceHost(&loss, 1, MPI_FLOAT, MPI_SUM, "the mean loss"));
      loss /= ranks;
    }
    if (step == first_step) first_loss = loss;
    last_loss = loss;
    if (!options.save_dir.empty() && options.save_every > 0 && (step + 1) % options.save_every == 0 &&
        step + 1 < options.steps) {
      MW_RETURN_IF_ERROR(save());
    }
    const bool log =
        (step + 1) % options.log_every == 0 || step + 1 == options.steps || step == first_step;
    if (!log) continue;
    const AllocatorStats s = device->allocator().stats();
    std::array<int64_t, 5> peaks;
    for (size_t i = 0; i < kShown.size(); ++i) peaks[i] = s.by_category[int(kShown[i])].peak;
    peaks[4] = s.requested.peak;
    if (options.backend != Backend::kMeta) {
      MW_RETURN_IF_ERROR(
          world->AllReduceHost(peaks.data(), 5, MPI_INT64_T, MPI_MAX, "the peak memory"));
    }
    if (world->rank() != 0) continue;
    std::string line = absl::StrFormat("%s step %lld/%lld", Bar(step + 1, options.steps),
                                       static_cast<long long>(step + 1),
                                       static_cast<long long>(options.steps));
    if (computes) absl::StrAppendFormat(&line, " | loss %.4f", loss);
    absl::StrAppendFormat(&line, " | %.0f tokens/s", tokens_per_step / took.count());
    if (!report.step.applied) absl::StrAppend(&line, " | step skipped (inf/nan gradients)");
    absl::StrAppend(&line, " | peak memory/rank:");
    for (size_t i = 0; i < kShown.size(); ++i) {
      absl::StrAppend(&line, " ", MemoryCategoryName(kShown[i]), " ", FormatBytes(peaks[i]));
    }
    absl::StrAppend(&line, ", all ", FormatBytes(peaks[4]));
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  if (!options.save_dir.empty()) MW_RETURN_IF_ERROR(save());
  const int64_t ran = options.steps - first_step;
  if (world->rank() == 0 && ran > 0) {
    std::printf("summary: %lld steps (%lld skipped), %.0f tokens/s", static_cast<long long>(ran),
                static_cast<long long>(trainer->optimizer().steps_skipped()),
                tokens_per_step * ran / seconds);
    if (computes) {
      std::printf(", loss %.4f -> %.4f (ln(vocab) = %.4f)", first_loss, last_loss,
                  std::log(double(gpt.vocab)));
    }
    std::printf("\n");
  }
  return absl::OkStatus();
}

}  // namespace memwall
