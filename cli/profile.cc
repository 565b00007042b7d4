#include "cli/profile.h"

#include <mpi.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/session.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "models/spec.h"
#include "profiler/memory_profiler.h"
#include "profiler/report.h"
#include "runtime/mpi_communicator.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {

namespace {

// A step's micro-batches of token ids / pixels: small integers valid for
// every model here (no values on meta). Out of memory is explained.
absl::StatusOr<std::vector<Batch>> SyntheticBatches(Engine& engine, int count) {
  Device& device = engine.device();
  // Each tensor is allocated on the device (whose capacity is checked,
  // with an out-of-memory report) before any host memory of its size is
  // touched: a huge --batch fails there, not in the host's allocator.
  auto make = [&](const std::vector<int64_t>& shape, int modulus,
                  const char* owner) -> absl::StatusOr<Tensor> {
    absl::StatusOr<Tensor> tensor =
        Tensor::Empty(device, DType::kF32, shape, MemoryCategory::kOther, owner);
    MW_RETURN_IF_ERROR(engine.Explain(tensor.status()));
    if (!device.holds_bytes()) return tensor;
    std::vector<float> values(NumElements(shape));
    for (size_t i = 0; i < values.size(); ++i) values[i] = float(i % modulus);
    MW_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream());
    MW_RETURN_IF_ERROR(
        device.CopyAsync(tensor->data(), values.data(), values.size() * sizeof(float), *stream));
    MW_RETURN_IF_ERROR(stream->Synchronize());
    return tensor;
  };
  std::vector<Batch> batches;
  for (int u = 0; u < count; ++u) {
    Batch b;
    MW_ASSIGN_OR_RETURN(b.input, make(engine.input_shape(), 97, "data.input"));
    MW_ASSIGN_OR_RETURN(b.target, make(engine.target_shape(), 89, "data.target"));
    batches.push_back(std::move(b));
  }
  return batches;
}

}  // namespace

absl::Status RunProfile(const ProfileOptions& given) {
  ProfileOptions options = given;
  if (options.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--steps: expected >= 1, got ", options.steps));
  }
  if (options.batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--batch: expected >= 1, got ", options.batch));
  }
  MW_ASSIGN_OR_RETURN(Config config, LoadConfigOrDefault(options.config_path));
  if (options.batch > 0) config.train_micro_batch_size_per_gpu = options.batch;
  MW_ASSIGN_OR_RETURN(std::unique_ptr<MpiCommunicator> world,
                      StartWorld(options.collective_timeout));
  MW_ASSIGN_OR_RETURN(options.capacity_bytes,
                      DeviceBytesFor(options.backend, options.capacity_bytes, world->rank()));
  EngineOptions engine_options =
      CommandEngineOptions(options.backend, options.capacity_bytes, options.pinned_bytes,
                           options.simulate_ranks, *world);
  engine_options.oom_dir = options.out_dir;
  engine_options.oom_advice = false;
  engine_options.schedule_description = absl::StrCat("--steps ", options.steps);
  MW_ASSIGN_OR_RETURN(
      std::unique_ptr<Engine> engine,
      Engine::Create(engine_options, config,
                     SpecModel(options.model, options.seq, options.image)));
  const MemoryProfiler& profiler = engine->profiler();
  const std::string dir = absl::StrCat(options.out_dir, "/rank", engine->communicator().rank());
  if (engine->recomputation_plan().planner != "none" && world->rank() == 0) {
    MW_ASSIGN_OR_RETURN(const Chain chain, engine->trainer()->ChainFor(engine->input_shape()));
    std::printf("activation recomputation: %s\n",
                PlanSummary(chain, engine->recomputation_plan()).c_str());
  }
  for (int64_t step = 0; step < options.steps; ++step) {
    MW_ASSIGN_OR_RETURN(std::vector<Batch> batches,
                        SyntheticBatches(*engine, config.gradient_accumulation_steps));
    MW_RETURN_IF_ERROR(engine->TrainStep(batches).status());
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
