#include "jobs/profile.h"

#include <mpi.h>

#include "absl/strings/str_cat.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "jobs/session.h"
#include "models/spec.h"
#include "profiler/memory_profiler.h"
#include "profiler/report.h"
#include "runtime/mpi_communicator.h"
#include "runtime/status.h"

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

absl::StatusOr<ProfileSummary> RunProfile(const ProfileOptions& options) {
  if (options.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--steps: expected >= 1, got ", options.steps));
  }
  if (options.batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--batch: expected >= 1, got ", options.batch));
  }
  MW_ASSIGN_OR_RETURN(Config config, LoadConfigOrDefault(options.config_path));
  if (options.batch > 0) config.train_micro_batch_size_per_gpu = options.batch;
  MW_ASSIGN_OR_RETURN(JobSession session,
                      StartJob(options.backend, options.capacity_bytes, options.pinned_bytes,
                               options.simulate_ranks, options.collective_timeout));
  MpiCommunicator* const world = session.world.get();
  EngineOptions& engine_options = session.engine;
  engine_options.oom_dir = options.out_dir;
  engine_options.oom_advice = false;
  engine_options.schedule_description = absl::StrCat("--steps ", options.steps);
  MW_ASSIGN_OR_RETURN(
      std::unique_ptr<Engine> engine,
      Engine::Create(engine_options, config, SpecModel(options.model, options.seq, options.image)));
  ProfileSummary summary;
  summary.rank = world->rank();
  summary.world_size = world->world_size();
  if (engine->recomputation_plan().planner != "none") {
    MW_ASSIGN_OR_RETURN(const Chain chain, engine->trainer()->ChainFor(engine->input_shape()));
    summary.recomputation = PlanSummary(chain, engine->recomputation_plan());
  }
  for (int64_t step = 0; step < options.steps; ++step) {
    MW_ASSIGN_OR_RETURN(std::vector<Batch> batches,
                        SyntheticBatches(*engine, config.gradient_accumulation_steps));
    MW_RETURN_IF_ERROR(engine->TrainStep(batches).status());
  }
  const MemoryProfiler& profiler = engine->profiler();
  MW_RETURN_IF_ERROR(WriteReports(
      profiler, absl::StrCat(options.out_dir, "/rank", engine->communicator().rank())));
  summary.report = TerminalReport(profiler);
  // Max and min over the ranks in one MAX reduction: the figures, then
  // their negations.
  constexpr int kFields = ProfileSummary::kFields;
  const PeakSnapshot peak = profiler.peak();
  std::array<int64_t, 2 * kFields> extremes;
  for (int i = 0; i < kFields; ++i) {
    const int64_t v = i == 0 ? peak.bytes : peak.by_category[i - 1];
    extremes[i] = v;
    extremes[kFields + i] = -v;
  }
  if (options.backend != Backend::kMeta) {
    MW_RETURN_IF_ERROR(world->AllReduceHost(extremes.data(), 2 * kFields, MPI_INT64_T, MPI_MAX,
                                            "the per-rank peaks"));
  }
  for (int i = 0; i < kFields; ++i) {
    summary.peak_max[i] = extremes[i];
    summary.peak_min[i] = -extremes[kFields + i];
  }
  return summary;
}

}  // namespace memwall
