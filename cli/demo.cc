#include "cli/demo.h"

#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/elementwise.h"
#include "runtime/mpi_communicator.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {
namespace {

// The step the demo takes: ZeRO stage 1 in bf16 with f32 master weights
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

std::string Row(absl::string_view name, const std::vector<int64_t>& per_rank) {
  std::string row = absl::StrFormat("  %-24s", name);
  for (int64_t bytes : per_rank) absl::StrAppendFormat(&row, " %12s", FormatBytes(bytes));
  return row;
}

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

absl::Status RunDemo(const DemoOptions& options) {
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

  // Gather every rank's books to rank 0.
  Communicator& comm = engine->communicator();
  const AllocatorStats s = engine->device().allocator().stats();
  std::vector<int64_t> mine;
  for (MemoryCategory c : kAllMemoryCategories) mine.push_back(s.by_category[int(c)].peak);
  mine.push_back(s.requested.peak);
  mine.push_back(s.reserved.peak);
  mine.push_back(comm.stats(Collective::kReduceScatter).bytes);
  mine.push_back(comm.stats(Collective::kAllGather).bytes);
  mine.push_back(mismatches);
  // A gather as a sum: every rank fills its own row of zeros.
  std::vector<int64_t> all(mine.size() * ranks, 0);
  std::copy(mine.begin(), mine.end(), all.begin() + rank * mine.size());
  MW_RETURN_IF_ERROR(
      world->AllReduceHost(all.data(), int(all.size()), MPI_INT64_T, MPI_SUM, "the books"));
  if (rank != 0) return absl::OkStatus();

  auto column = [&](size_t field) {
    std::vector<int64_t> out(ranks);
    for (int q = 0; q < ranks; ++q) out[q] = all[q * mine.size() + field];
    return out;
  };
  const size_t n = kAllMemoryCategories.size();
  int64_t total_mismatches = 0;
  for (int64_t x : column(n + 4)) total_mismatches += x;
  const int64_t shard = states.layout().groups[0].shard_numel;
  // On meta this process plays rank 0 of the simulated world.
  const int world_size = comm.world_size();
  std::printf("memwall demo: %d rank%s%s, %s backend with %s per rank, %lld parameters (%lld per "
              "shard)\n",
              world_size, world_size == 1 ? "" : "s",
              meta && world_size > 1 ? " (simulated: rank 0's books)" : "",
              std::string(BackendName(options.backend)).c_str(),
              FormatBytes(options.capacity_bytes).c_str(),
              static_cast<long long>(options.parameters), static_cast<long long>(shard));
  std::printf("step: memwall's engine, ZeRO stage 1, bf16 parameters and gradients, f32 master "
              "weights and AdamW on each rank's shard (CPU kernels: %s)\n",
              meta ? "none on meta" : kernels::cpu::IsaName(kernels::cpu::SelectedIsa()));
  if (meta) {
    std::printf("check: skipped on meta (no bytes exist; sizes and traffic are real)\n");
  } else {
    std::printf("check: %lld of %lld gathered parameters differ from the single-process update on "
                "some rank\n",
                static_cast<long long>(total_mismatches), static_cast<long long>(options.parameters));
  }
  std::printf("\npeak device memory by category (requested bytes, from memwall's allocator)\n");
  std::string header = absl::StrFormat("  %-24s", "category");
  for (int q = 0; q < ranks; ++q) absl::StrAppendFormat(&header, " %12s", absl::StrCat("rank ", q));
  std::printf("%s\n", header.c_str());
  for (size_t c = 0; c < n; ++c) {
    const std::vector<int64_t> values = column(c);
    bool any = false;
    for (int64_t v : values) any = any || v != 0;
    if (any) std::printf("%s\n", Row(MemoryCategoryName(kAllMemoryCategories[c]), values).c_str());
  }
  std::printf("%s\n", Row("peak (all categories)", column(n)).c_str());
  std::printf("%s\n", Row("peak reserved", column(n + 1)).c_str());
  std::printf("\ncommunication per rank: ReduceScatter %s, AllGather %s\n",
              FormatBytes(column(n + 2)[0]).c_str(), FormatBytes(column(n + 3)[0]).c_str());
  if (total_mismatches != 0) {
    return absl::InternalError(absl::StrCat("demo: ", total_mismatches,
                                            " gathered parameters differ from the reference"));
  }
  return absl::OkStatus();
}

}  // namespace memwall
