// ZeRO stages 0-3 on the host backend: per-rank model-state memory measured
// by the allocator beside the ZeRO formula, step time beside stage 0's
// (measured in the same run), and bytes communicated per step.
//
//   tools/mpirun.sh N bazel-bin/benchmarks/zero_benchmark [--params 8388608] [--groups 8]
//       [--steps 5] [--compute 0] [--overlap 0|1]
//
// The "model" is a stand-in, a caller-owned model of the engine
// (engine/engine.h) with one parameter per group: per group, forward and
// backward each run `--compute` passes of a scaling kernel over a
// group-sized f32 buffer (0: no compute, the optimizer's work alone), and
// backward fills the group's gradients; the driver order is a real one
// (stage 3: gather for forward, gather again for backward; stages 2-3
// reduce each group right after its backward), then the engine's Step().
// bf16 parameters and gradients, f32 reduction, AdamW. --overlap 1 sets
// zero_optimization.overlap_comm.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "kernels/ops.h"
#include "runtime/device.h"
#include "runtime/mpi_communicator.h"
#include "runtime/units.h"

namespace memwall {
namespace {

struct Figures {
  int64_t padded = 0;
  int64_t model_state = 0;
  int64_t formula = 0;
  double step_ms = 0;
  int64_t reduce_bytes = 0;  // AllReduce + ReduceScatter per step
  int64_t gather_bytes = 0;  // AllGather per step
};

// A benchmark has nobody to return errors to: report and stop.
void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "zero_benchmark: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

Figures RunStage(MpiCommunicator& comm, int stage, int64_t params, int groups, int steps,
                 int compute, bool overlap) {
  Config config;
  config.zero.stage = stage;
  config.zero.overlap_comm = overlap;
  config.bf16 = true;
  const int64_t per_group = params / groups;
  config.zero.reduce_bucket_size = per_group;
  // Prefetch one group ahead.
  config.zero.stage3_prefetch_bucket_size = per_group + 4096;
  EngineOptions options;
  options.world = &comm;
  options.device_bytes = 4 * kGiB;
  std::vector<ParameterGroup> model;
  for (int g = 0; g < groups; ++g) {
    const std::string name = "layer" + std::to_string(g);
    model.push_back({name, {{name, {per_group}, std::vector<float>(per_group, 0.01f)}}});
  }
  absl::StatusOr<std::unique_ptr<Engine>> created = Engine::Create(options, config, std::move(model));
  Check(created.status());
  Engine& engine = **created;
  ModelStates& states = engine.states();
  Device& device = engine.device();
  Stream& stream = states.stream();
  Figures f;
  f.padded = states.layout().padded_numel;
  const AllocatorStats s = device.allocator().stats();
  f.model_state = s.by_category[int(MemoryCategory::kParameter)].current +
                  s.by_category[int(MemoryCategory::kGradient)].current +
                  s.by_category[int(MemoryCategory::kOptimizerState)].current;
  const int64_t P = f.padded, N = comm.world_size();
  const int64_t formulas[] = {16 * P, 4 * P + 12 * P / N, 2 * P + 14 * P / N, 16 * P / N};
  f.formula = formulas[stage];

  auto activations = device.Allocate(per_group * 4, MemoryCategory::kActivation, "compute").value();
  Check(kernels::Fill(device, stream, activations.data(), DType::kF32, per_group, 1.0f));
  auto layer_compute = [&] {
    for (int pass = 0; pass < compute; ++pass) {
      Check(kernels::Scale(device, stream, activations.data(), DType::kF32, per_group, 0.999f));
    }
  };
  std::vector<double> times;
  for (int step = 0; step < steps + 1; ++step) {  // the first step warms up
    comm.ResetStats();
    Check(comm.Barrier());
    const auto start = std::chrono::steady_clock::now();
    for (int g = 0; g < groups; ++g) {
      Check(states.Gather(g));
      layer_compute();
      Check(states.Release(g));
    }
    for (int g = groups - 1; g >= 0; --g) {
      Check(states.Gather(g));
      layer_compute();
      Check(states.AcquireGradients(g));
      auto grad = states.Gradient("layer" + std::to_string(g)).value();
      Check(kernels::Fill(device, stream, grad.data, grad.dtype, grad.numel, 1e-3f));
      Check(states.ReduceGradients(g));
      Check(states.Release(g));
    }
    Check(engine.Step().status());
    Check(comm.Barrier());
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    if (step > 0) times.push_back(took.count());
    f.reduce_bytes = comm.stats(Collective::kAllReduce).bytes +
                     comm.stats(Collective::kReduceScatter).bytes;
    f.gather_bytes = comm.stats(Collective::kAllGather).bytes;
  }
  std::sort(times.begin(), times.end());
  f.step_ms = times[times.size() / 2];
  return f;
}

int Main(int argc, char** argv) {
  int64_t params = int64_t{8} << 20;
  int groups = 8, steps = 5, compute = 0;
  bool overlap = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--params") params = std::atoll(argv[i + 1]);
    else if (flag == "--groups") groups = std::atoi(argv[i + 1]);
    else if (flag == "--steps") steps = std::atoi(argv[i + 1]);
    else if (flag == "--compute") compute = std::atoi(argv[i + 1]);
    else if (flag == "--overlap") overlap = std::atoi(argv[i + 1]) != 0;
    else {
      std::fprintf(stderr,
                   "usage: zero_benchmark [--params N] [--groups G] [--steps S] [--compute K] "
                   "[--overlap 0|1]\n");
      return 2;
    }
  }
  auto comm = MpiCommunicator::Create().value();
  std::vector<Figures> figures;
  for (int stage = 0; stage <= 3; ++stage) {
    figures.push_back(RunStage(*comm, stage, params, groups, steps, compute, overlap));
  }
  if (comm->rank() == 0) {
    std::printf("zero_benchmark: %lld parameters in %d groups, bf16 + f32 AdamW, %d ranks, "
                "host backend, median of %d steps, compute %d passes per layer, overlap %s\n",
                static_cast<long long>(params), groups, comm->world_size(), steps, compute,
                overlap ? "on" : "off");
    std::printf("%-6s %16s %16s %6s %10s %9s %14s %14s %8s\n", "stage", "model states/rank",
                "ZeRO formula", "equal", "step ms", "vs st. 0", "reduce bytes", "gather bytes",
                "elems/P");
    for (int stage = 0; stage <= 3; ++stage) {
      const Figures& f = figures[stage];
      // Elements moved per step over P: reductions count in f32 (4 B),
      // gathers in bf16 (2 B); ZeRO counts an all-reduce as 2P.
      const double elements = (stage == 0 ? 2.0 : 1.0) * f.reduce_bytes / 4.0 + f.gather_bytes / 2.0;
      std::printf("%-6d %16s %16s %6s %10.2f %8.2fx %14lld %14lld %8.2f\n", stage,
                  FormatBytes(f.model_state).c_str(), FormatBytes(f.formula).c_str(),
                  f.model_state == f.formula ? "yes" : "NO", f.step_ms,
                  f.step_ms / figures[0].step_ms, static_cast<long long>(f.reduce_bytes),
                  static_cast<long long>(f.gather_bytes), elements / f.padded);
    }
  }
  return 0;
}

}  // namespace
}  // namespace memwall

int main(int argc, char** argv) { return memwall::Main(argc, argv); }
