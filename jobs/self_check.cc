#include "jobs/self_check.h"

#include <mpi.h>

#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/elementwise.h"
#include "runtime/mpi_communicator.h"
#include "runtime/status.h"

namespace memwall {
namespace {

// The step the self-check takes: ZeRO stage 1 in bf16 with f32 master weights
// and AdamW at lr 1e-2 (no weight decay), on the engine a caller-owned
// model trains with.
constexpr char kDemoConfig[] = R"({
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}},
  "zero_optimization": {"stage": 1}
})";
constexpr char kWeight[] = "toy.weight";

// Every rank's gradient is a known function of (rank, index), so each rank
// can check the reduced, updated and gathered parameters on its own.
// Gradients are multiples of 2^-10 below 2^-4: exact in bf16, and their
// f32 sum over ranks exact in any order MPI chooses.
float Gradient(int rank, int64_t i) { return float((i * 7 + rank * 13) % 101 - 50) / 1024.0f; }
float InitialWeight(int64_t i) { return 0.01f * float(i % 199 - 99); }

// How many of the gathered parameters differ from the step computed here
// alone: the ranks' mean gradient (their sum, rounded to the bf16 gradient
// the optimizer holds, times 1 / ranks) through the same element update,
// rounded to bf16.
int64_t Mismatches(const std::vector<float>& gathered, int ranks) {
  kernels::AdamParams adam;
  adam.lr = 0.01f;
  adam.adamw = true;
  adam.grad_scale = static_cast<float>(1.0 / ranks);
  const kernels::AdamConstants c = kernels::MakeAdamConstants(adam);
  int64_t mismatches = 0;
  for (size_t i = 0; i < gathered.size(); ++i) {
    float sum = 0.0f;
    for (int q = 0; q < ranks; ++q) sum += Gradient(q, static_cast<int64_t>(i));
    float w = InitialWeight(static_cast<int64_t>(i)), m = 0.0f, v = 0.0f;
    kernels::AdamElement(c, w, Bf16ToF32(F32ToBf16(sum)), m, v);
    if (gathered[i] != Bf16ToF32(F32ToBf16(w))) ++mismatches;
  }
  return mismatches;
}

}  // namespace

absl::StatusOr<SelfCheckReport> RunSelfCheck(const SelfCheckOptions& options) {
  if (options.backend == Backend::kCuda) {
    return absl::UnimplementedError(
        "demo: the cuda backend is not wired into the demo; use host or meta (memwall train "
        "--backend cuda runs the same engine on GPUs)");
  }
  MW_ASSIGN_OR_RETURN(std::unique_ptr<MpiCommunicator> world, MpiCommunicator::Create());
  const int rank = world->rank(), ranks = world->world_size();
  const bool meta = options.backend == Backend::kMeta;
  MW_ASSIGN_OR_RETURN(const Config config, ParseConfig(kDemoConfig));

  // The toy model: one parameter, one explicit unit, the same initial
  // values on every rank (none on meta).
  ParameterGroup group;
  group.name = "toy";
  ParameterInit weight;
  weight.name = kWeight;
  weight.shape = {options.parameters};
  if (!meta) {
    weight.values.resize(options.parameters);
    for (int64_t i = 0; i < options.parameters; ++i) weight.values[i] = InitialWeight(i);
  }
  group.parameters.push_back(std::move(weight));
  EngineOptions engine_options;
  engine_options.backend = options.backend;
  engine_options.device_bytes = options.capacity_bytes;
  engine_options.world = world.get();
  engine_options.simulate_ranks = options.simulate_ranks;
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                      Engine::Create(engine_options, config, {std::move(group)}));
  ModelStates& states = engine->states();

  // The step: this rank's gradients added (f32, rounded once to bf16), the
  // engine's step (reduce-scatter, AdamW on the shard, all-gather).
  if (!meta) {
    std::vector<float> grads(options.parameters);
    for (int64_t i = 0; i < options.parameters; ++i) grads[i] = Gradient(rank, i);
    MW_RETURN_IF_ERROR(engine->Explain(states.AddGradient(kWeight, grads)));
  }
  MW_ASSIGN_OR_RETURN(const StepResult step, engine->Step());
  if (!step.applied) return absl::InternalError("demo: the step was skipped");

  int64_t mismatches = 0;
  if (!meta) {
    std::vector<float> gathered(options.parameters);
    MW_RETURN_IF_ERROR(states.ReadParameter(kWeight, absl::MakeSpan(gathered)));
    mismatches = Mismatches(gathered, ranks);
  }

  // Every rank's books to rank 0, as a sum: each rank fills its own row.
  Communicator& comm = engine->communicator();
  const AllocatorStats s = engine->device().allocator().stats();
  std::vector<SelfCheckBooks> books(ranks);
  SelfCheckBooks& mine = books[rank];
  for (int c = 0; c < kNumMemoryCategories; ++c) mine.peak_by_category[c] = s.by_category[c].peak;
  mine.peak_requested = s.requested.peak;
  mine.peak_reserved = s.reserved.peak;
  mine.reduce_scatter_bytes = comm.stats(Collective::kReduceScatter).bytes;
  mine.all_gather_bytes = comm.stats(Collective::kAllGather).bytes;
  mine.mismatches = mismatches;
  // Summed as an array of int64_t: the books must be nothing else.
  static_assert(std::is_standard_layout_v<SelfCheckBooks> &&
                    sizeof(SelfCheckBooks) ==
                        sizeof(int64_t) * (kNumMemoryCategories + 5),
                "SelfCheckBooks: int64_t fields only");
  constexpr int kFields = sizeof(SelfCheckBooks) / sizeof(int64_t);
  MW_RETURN_IF_ERROR(
      world->AllReduceHost(books.data(), kFields * ranks, MPI_INT64_T, MPI_SUM, "the books"));
  SelfCheckReport report;
  report.rank = rank;
  report.world_size = comm.world_size();
  report.shard_numel = states.layout().groups[0].shard_numel;
  if (!meta) report.isa = kernels::cpu::IsaName(kernels::cpu::SelectedIsa());
  if (rank == 0) {
    for (const SelfCheckBooks& b : books) report.mismatches += b.mismatches;
    report.ranks = std::move(books);
  }
  return report;
}

}  // namespace memwall
