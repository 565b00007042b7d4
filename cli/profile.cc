#include "cli/profile.h"

#include <mpi.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/session.h"
#include "engine/config.h"
#include "engine/trainer.h"
#include "profiler/memory_profiler.h"
#include "profiler/report.h"
#include "runtime/mpi_communicator.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {

absl::Status RunProfile(const ProfileOptions& options) {
  if (options.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--steps: expected >= 1, got ", options.steps));
  }
  if (options.batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--batch: expected >= 1, got ", options.batch));
  }
  MW_ASSIGN_OR_RETURN(Config config, LoadConfigOrDefault(options.config_path));
  const int64_t batch = options.batch > 0 ? options.batch : config.train_micro_batch_size_per_gpu;
  MW_ASSIGN_OR_RETURN(Model model, MakeModel(options.model, batch, options.seq, options.image));
  MW_ASSIGN_OR_RETURN(Ranks session, StartRanks(options.backend, options.simulate_ranks,
                                                 options.collective_timeout));
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Device> device,
                      UseDevice(session, options.backend, options.capacity_bytes,
                                PinnedBytes(options.pinned_bytes, options.capacity_bytes,
                                            config)));
  MpiCommunicator* world = session.world.get();
  Communicator* comm = session.comm;
  const std::string dir = absl::StrCat(options.out_dir, "/rank", comm->rank());
  MemoryProfiler profiler(device->allocator());
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(
      std::move(model.layers), std::move(model.loss), config, *device, *comm, /*seed=*/1);
  MW_RETURN_IF_ERROR(ReportOutOfMemory(trainer.status(), profiler, dir));
  (*trainer)->set_profiler(&profiler);
  // The recomputation plan of the config; optimal's derived budget comes
  // from a dry run of a fresh copy of the model.
  MW_ASSIGN_OR_RETURN(
      const Plan plan,
      ApplyRecomputation(**trainer, config.activation_checkpointing, model.input,
                         device->allocator().capacity(),
                         [&]() -> absl::StatusOr<AllocatorStats> {
                           MW_ASSIGN_OR_RETURN(Model copy, MakeModel(options.model, batch, options.seq, options.image));
                           return DryRunStep(std::move(copy.layers), std::move(copy.loss), config,
                                             comm->rank(), comm->world_size(), copy.input,
                                             copy.target);
                         }));
  if (plan.planner != "none" && comm->rank() == 0) {
    MW_ASSIGN_OR_RETURN(const Chain chain, (*trainer)->ChainFor(model.input));
    std::printf("activation recomputation: %s\n", PlanSummary(chain, plan).c_str());
  }
  for (int64_t step = 0; step < options.steps; ++step) {
    std::vector<Batch> batches;
    for (int u = 0; u < config.gradient_accumulation_steps; ++u) {
      // Token ids / pixels: small integers valid for every model here.
      std::vector<float> input_values, target_values;
      if (device->holds_bytes()) {
        int64_t in = 1, out = 1;
        for (int64_t d : model.input) in *= d;
        for (int64_t d : model.target) out *= d;
        for (int64_t i = 0; i < in; ++i) input_values.push_back(float(i % 97));
        for (int64_t i = 0; i < out; ++i) target_values.push_back(float(i % 89));
      }
      absl::StatusOr<Tensor> input = Tensor::FromHost(*device, input_values, model.input,
                                                      MemoryCategory::kOther, "data.input");
      MW_RETURN_IF_ERROR(ReportOutOfMemory(input.status(), profiler, dir));
      absl::StatusOr<Tensor> target = Tensor::FromHost(*device, target_values, model.target,
                                                       MemoryCategory::kOther, "data.target");
      MW_RETURN_IF_ERROR(ReportOutOfMemory(target.status(), profiler, dir));
      Batch b;
      b.input = std::move(input).value();
      b.target = std::move(target).value();
      batches.push_back(std::move(b));
    }
    MW_RETURN_IF_ERROR(ReportOutOfMemory((*trainer)->TrainStep(batches).status(), profiler, dir));
  }
  MW_RETURN_IF_ERROR(WriteReports(profiler, dir));
  // Per-rank figures at each rank's peak, gathered as max and min: the
  // total first, then every category (max, and -min through the same MAX).
  const PeakSnapshot peak = profiler.peak();
  constexpr int kFields = 1 + kNumMemoryCategories;
  int64_t extremes[2 * kFields];
  for (int i = 0; i < kFields; ++i) {
    const int64_t v = i == 0 ? peak.bytes : peak.by_category[i - 1];
    extremes[i] = v;
    extremes[kFields + i] = -v;
  }
  if (options.backend != Backend::kMeta) {
    MW_RETURN_IF_ERROR(world->AllReduceHost(extremes, 2 * kFields, MPI_INT64_T, MPI_MAX,
                                            "the per-rank peaks"));
  }
  if (world->rank() == 0) {
    std::printf("%s", TerminalReport(profiler).c_str());
    std::printf("per-rank peaks over %d rank%s (max / min / imbalance = (max - min) / max):\n",
                world->world_size(), world->world_size() == 1 ? "" : "s");
    for (int i = 0; i < kFields; ++i) {
      const int64_t max = extremes[i], min = -extremes[kFields + i];
      if (max == 0 && i > 0) continue;
      std::printf("  %-24s %12s / %12s / %5.1f%%\n",
                  i == 0 ? "total" : std::string(MemoryCategoryName(kAllMemoryCategories[i - 1])).c_str(),
                  FormatBytes(max).c_str(), FormatBytes(min).c_str(),
                  max ? 100.0 * (max - min) / max : 0.0);
    }
    std::printf("reports: %s/rank*/\n", options.out_dir.c_str());
  }
  return absl::OkStatus();
}

}  // namespace memwall
