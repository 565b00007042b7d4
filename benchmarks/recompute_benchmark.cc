// Activation recomputation: what each planner buys and what it costs.
//
//   bazel run //benchmarks:recompute_benchmark [-- --steps 20]
//
// 1. Memory-vs-recompute curves from the models' own declarations (the
//    chain the planners see; the executor test checks these peaks against
//    the allocator): for budgets from "keep everything" down to the least
//    any plan reaches, the extra forward FLOPs of `optimal` beside the best
//    fixed plan (full, sqrt, every uniform:K, selective) that fits.
// 2. Selective recomputation of a GPT-3 175B layer: activation reduction
//    and extra FLOPs, beside Korthikanti et al.'s published figures.
// 3. Planner solve time on the 98-layer GPT-3 175B chain.
// 4. Measured on host: step time of gpt-tiny:layers=8 under each plan
//    against the run without recomputation in the same process, beside the
//    predicted overhead (extra forward FLOPs over forward + backward, taken
//    as three forwards).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "checkpointing/planner.h"
#include "engine/chain.h"
#include "engine/trainer.h"
#include "models/gpt.h"
#include "models/zoo.h"
#include "runtime/simulated_communicator.h"
#include "runtime/units.h"

namespace memwall {
namespace {

double Forward(const Chain& chain) {
  double f = 0;
  for (const ChainLayer& l : chain.layers) f += l.forward_flops;
  return f;
}

void Curve(const std::string& title, Chain chain) {
  chain.offload_flops_per_byte = 12500;  // an A100: 312 TFLOP/s over 25 GB/s PCIe
  const int n = static_cast<int>(chain.layers.size());
  std::vector<RecomputationPlan> fixed = {NoRecomputation(chain), FullRecomputation(chain),
                             SqrtRecomputation(chain), SelectiveRecomputation(chain)};
  for (int k = 2; k <= n; ++k) fixed.push_back(UniformRecomputation(chain, k));
  PlannerOptions o;
  const int64_t top = NoRecomputation(chain).predicted_peak;
  const int64_t least = MinimumPeakPlan(chain, o).predicted_peak;
  const double forward = Forward(chain);
  std::printf("\n%s: %d layers; activation peak %s keeping all, %s at least (optimal)\n",
              title.c_str(), n, FormatBytes(top).c_str(), FormatBytes(least).c_str());
  std::printf("%12s %16s %12s %-28s %12s %16s\n", "budget", "optimal peak", "optimal",
              "best fixed plan that fits", "its extra", "optimal+offload");
  bool never_worse = true;
  for (int step = 0; step <= 8; ++step) {
    o.budget = top - (top - least) * step / 8;
    const absl::StatusOr<RecomputationPlan> best = OptimalRecomputation(chain, o);
    if (!best.ok()) {
      std::printf("%12s  %s\n", FormatBytes(o.budget).c_str(), std::string(best.status().message()).c_str());
      continue;
    }
    const RecomputationPlan* pick = nullptr;
    for (const RecomputationPlan& p : fixed) {
      if (p.predicted_peak <= o.budget && (pick == nullptr || p.extra_flops < pick->extra_flops)) {
        pick = &p;
      }
    }
    if (pick != nullptr && best->extra_flops > pick->extra_flops) never_worse = false;
    PlannerOptions with_offload = o;
    with_offload.allow_offload = true;
    const absl::StatusOr<RecomputationPlan> offload = OptimalRecomputation(chain, with_offload);
    std::printf("%12s %16s %11.2f%% %-28s %11s %15.2f%%\n", FormatBytes(o.budget).c_str(),
                FormatBytes(best->predicted_peak).c_str(), 100 * best->extra_flops / forward,
                pick ? (pick->planner + " (" + FormatBytes(pick->predicted_peak) + ")").c_str()
                     : "none fits",
                pick ? absl::StrFormat("%.2f%%", 100 * pick->extra_flops / forward).c_str() : "-",
                offload.ok() ? 100 * offload->extra_flops / forward : -1.0);
  }
  std::printf("optimal never needs more extra FLOPs than a fixed plan that fits: %s\n",
              never_worse ? "yes" : "NO");
  PlannerOptions offload;
  offload.allow_offload = true;
  const RecomputationPlan lowest = MinimumPeakPlan(chain, offload);
  std::printf("with offload the least peak is %s (%s of pinned host memory, %.2f%% extra)\n",
              FormatBytes(lowest.predicted_peak).c_str(), FormatBytes(lowest.offloaded_bytes).c_str(),
              100 * lowest.extra_flops / forward);
}

void SelectiveGpt3() {
  const GptConfig c = GptPreset("gpt3-175b").value();
  auto layers = MakeGpt({c.vocab, c.seq, c.hidden, c.heads, 1}).value();
  const std::vector<int64_t> in = {1 * c.seq, c.hidden};  // one sequence
  const Layer& block = *layers[1];
  const int64_t full = block.ActivationBytes(in, DType::kBF16);
  const auto selective = block.Selective(in, DType::kBF16);
  const double s = c.seq, h = c.hidden, a = c.heads;
  const double megatron = s * h * (34 + 5 * a * s / h), megatron_sel = s * h * 34;
  std::printf("\nGPT-3 175B layer, one 2048-token sequence, bf16 activations:\n");
  std::printf("  memwall:  keeps %s; selective keeps %s: %.1f%% less, for %.2f%% extra layer-forward FLOPs\n",
              FormatBytes(full).c_str(), FormatBytes(selective->saved_bytes).c_str(),
              100.0 * (full - selective->saved_bytes) / full,
              100.0 * selective->extra_flops / block.ForwardFlops(in));
  std::printf("  Megatron formula: %s; selective %s: %.1f%% less (published: about 70%%, for 2.7%% "
              "extra FLOPs)\n",
              FormatBytes(int64_t(megatron)).c_str(), FormatBytes(int64_t(megatron_sel)).c_str(),
              100.0 * (megatron - megatron_sel) / megatron);
}

void SolveTime() {
  const GptConfig c = GptPreset("gpt3-175b").value();
  auto layers = MakeGpt(c).value();
  const Chain chain = ChainOf(layers, {1, c.seq}, DType::kBF16).value();
  PlannerOptions o;
  o.budget = (NoRecomputation(chain).predicted_peak + MinimumPeakPlan(chain, o).predicted_peak) / 2;
  const auto start = std::chrono::steady_clock::now();
  const absl::StatusOr<RecomputationPlan> plan = OptimalRecomputation(chain, o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\noptimal on the %zu-layer GPT-3 175B chain, resolution %d: %.3f s (%s)\n",
              chain.layers.size(), o.resolution, seconds, plan.ok() ? "solved" : "failed");
}

void MeasuredOverhead(int steps) {
  const GptConfig c = ParseGptModel("gpt-tiny:layers=8,seq=128").value();
  const int64_t micro = 8;
  std::printf("\nhost, gpt-tiny:layers=8,seq=128, micro-batch 8, f32, 1 rank, %d steps each, "
              "the planners' steps interleaved (median step):\n", steps);
  std::printf("%-12s %14s %12s %12s %12s\n", "planner", "activations", "step ms", "overhead",
              "predicted");
  struct Run {
    std::string planner;
    std::unique_ptr<Device> device;
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<Trainer> trainer;
    RecomputationPlan plan;
    double forward = 0;
    Batch batch;
    std::vector<double> ms;
  };
  std::vector<Run> runs;
  std::vector<float> ids(micro * c.seq), next(micro * c.seq);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = float((i * 7) % c.vocab);
    next[i] = float((i * 7 + 5) % c.vocab);
  }
  for (const char* planner : {"none", "full", "uniform:2", "sqrt", "selective", "optimal"}) {
    Run r;
    r.planner = planner;
    r.device = CreateDevice({Backend::kHost, 0, 1 * kGiB}).value();
    r.comm = SimulatedCommunicator::Create(0, 1).value();
    r.trainer = Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(),
                                ShardingOptions(), *r.device, *r.comm, 1)
                    .value();
    const Chain chain = r.trainer->ChainFor({micro, c.seq}).value();
    PlannerOptions o;
    if (r.planner == "optimal") {
      o.budget = (NoRecomputation(chain).predicted_peak + FullRecomputation(chain).predicted_peak) / 2;
    }
    r.plan = MakePlan(chain, planner, o).value();
    r.forward = Forward(chain);
    if (!r.trainer->SetRecomputationPlan(r.plan, chain).ok()) std::abort();
    r.batch.input = Tensor::FromHost(*r.device, ids, {micro, c.seq}, MemoryCategory::kOther, "in").value();
    r.batch.target = Tensor::FromHost(*r.device, next, {micro * c.seq}, MemoryCategory::kOther, "t").value();
    runs.push_back(std::move(r));
  }
  for (int s = 0; s < steps + 2; ++s) {
    for (Run& r : runs) {
      const auto start = std::chrono::steady_clock::now();
      if (!r.trainer->TrainStep({&r.batch, 1}).ok()) std::abort();
      if (s >= 2) {  // warm-up
        r.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
    }
  }
  double base_ms = 0;
  for (Run& r : runs) {
    std::sort(r.ms.begin(), r.ms.end());
    const double median = r.ms[r.ms.size() / 2];
    if (base_ms == 0) base_ms = median;
    std::printf("%-12s %14s %12.2f %11.1f%% %11.1f%%\n", r.planner.c_str(),
                FormatBytes(r.plan.predicted_peak).c_str(), median, 100 * (median / base_ms - 1),
                100 * r.plan.extra_flops / (3 * r.forward));
  }
}

int Main(int argc, char** argv) {
  int steps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--steps") {
      steps = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: recompute_benchmark [--steps N]\n");
      return 2;
    }
  }
  const GptConfig gpt = GptPreset("gpt2-1.5b").value();
  Curve("GPT-2 1.5B, micro-batch 8 x 1024 tokens, bf16",
        ChainOf(MakeGpt(gpt).value(), {8, gpt.seq}, DType::kBF16).value());
  Curve("ResNeSt-269-like, batch 16 x 416 x 416, f32",
        ChainOf(MakeZooModel("resnest269", 0).value(), {16, 3, 416, 416}, DType::kF32).value());
  SelectiveGpt3();
  SolveTime();
  MeasuredOverhead(steps);
  return 0;
}

}  // namespace
}  // namespace memwall

int main(int argc, char** argv) { return memwall::Main(argc, argv); }
