// The recomputation planners on synthetic chains: `optimal` against an
// exhaustive search over every plan, the fixed planners' shapes, and the
// errors for budgets no plan meets.
#include "checkpointing/planner.h"

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/units.h"

namespace memwall {
namespace {

// A heterogeneous chain: sizes and costs vary by a factor of about 10, some
// layers offer selective mode, some have no input gradient.
Chain RandomChain(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> bytes(100, 1000);
  std::uniform_int_distribution<int> flops(1, 20);
  Chain c;
  for (int l = 0; l < n; ++l) {
    ChainLayer layer;
    layer.name = "l" + std::to_string(l);
    layer.output = bytes(rng);
    layer.saved = 3 * bytes(rng);
    layer.grad_input = l == 0 ? 0 : bytes(rng);
    layer.forward_flops = flops(rng);
    if (rng() % 3 == 0) {
      layer.has_selective = true;
      layer.selective_recomputed = layer.saved / 2 + rng() % 100;
      layer.selective_saved = layer.saved - layer.selective_recomputed;
      layer.selective_flops = std::max(1, flops(rng) / 4);
    }
    c.layers.push_back(layer);
  }
  c.loss_grad = bytes(rng);
  c.offload_flops_per_byte = 0.01;  // moving a 500-byte input costs 10 FLOPs
  return c;
}

// Every plan of plan.h's form, by brute force: each plan's (peak, extra
// FLOPs).
std::vector<Prediction> AllPlans(const Chain& chain, bool offload) {
  const int n = static_cast<int>(chain.layers.size());
  std::vector<Prediction> all;
  RecomputationPlan plan;
  std::function<void(int)> walk = [&](int i) {
    if (i == n) {
      all.push_back(PredictPeak(chain, plan));
      return;
    }
    auto take = [&](Segment s) {
      plan.segments.push_back(s);
      walk(s.end);
      plan.segments.pop_back();
    };
    take({i, i + 1, SegmentMode::kKeep});
    if (chain.layers[i].has_selective && chain.layers[i].recomputable) {
      take({i, i + 1, SegmentMode::kSelective});
    }
    for (int j = i + 1; j <= n && chain.layers[j - 1].recomputable; ++j) {
      take({i, j, SegmentMode::kRecompute});
      if (offload && i > 0) take({i, j, SegmentMode::kOffload});
    }
  };
  walk(0);
  return all;
}

// The least extra FLOPs among plans whose peak fits, or -1.
double Cheapest(const std::vector<Prediction>& all, int64_t budget) {
  double best = -1;
  for (const Prediction& p : all) {
    if (p.peak <= budget && (best < 0 || p.extra_flops < best)) best = p.extra_flops;
  }
  return best;
}

int64_t LeastPeak(const std::vector<Prediction>& all) {
  int64_t least = INT64_MAX;
  for (const Prediction& p : all) least = std::min(least, p.peak);
  return least;
}

// A traced model's shape: the first and last layers (embeddings, head with
// the loss) and one in the middle cannot be recomputed, and a plan that
// recomputes holds 300 bytes more (an attention mask).
Chain PinnedChain(int n, uint32_t seed) {
  Chain chain = RandomChain(n, seed);
  chain.recompute_held = 300;
  chain.layers.front().recomputable = false;
  chain.layers[n / 2].recomputable = false;
  chain.layers.back().recomputable = false;
  return chain;
}

TEST_CASE("optimal equals exhaustive search on random heterogeneous chains, and on chains "
          "with layers that cannot be recomputed", "[planner]") {
  for (const bool pinned : {false, true}) {
    int checked = 0, infeasible = 0;
    for (uint32_t seed = 1; seed <= 60; ++seed) {
      // Offload widens the search: shorter chains for the seeds that allow it.
      const bool offload = seed % 2 == 0;
      const int n = offload ? 3 + seed % 6 : 3 + seed % 8;  // up to 8 or 10 layers
      const Chain chain = pinned ? PinnedChain(n, seed) : RandomChain(n, seed);
      PlannerOptions exact;
      exact.resolution = 0;
      exact.allow_offload = offload;
      const std::vector<Prediction> all = AllPlans(chain, offload);
      const int64_t none = NoRecomputation(chain).predicted_peak;
      const int64_t min_peak = LeastPeak(all);
      CHECK(MinimumPeakPlan(chain, exact).predicted_peak == min_peak);
      for (int step = 0; step <= 4; ++step) {
        // Budgets from just below the least peak to everything kept.
        const int64_t budget = min_peak - 1 + (none - min_peak + 1) * step / 4;
        exact.budget = budget;
        INFO("pinned " << pinned << ", seed " << seed << ", n " << n << ", offload " << offload
                       << ", budget " << budget);
        const double want = Cheapest(all, budget);
        const absl::StatusOr<RecomputationPlan> got = OptimalRecomputation(chain, exact);
        if (want < 0) {
          CHECK(got.status().code() == absl::StatusCode::kResourceExhausted);
          // The smallest feasible budget it names is the exhaustive search's.
          CHECK_THAT(std::string(got.status().message()),
                     Catch::EndsWith("the smallest feasible budget is " + FormatBytes(min_peak) +
                                     " (" + std::to_string(min_peak) + " bytes)"));
          ++infeasible;
          continue;
        }
        REQUIRE(got.ok());
        CHECK(got->extra_flops == Approx(want).epsilon(1e-12));
        CHECK(got->predicted_peak <= budget);
        CHECK(ValidatePlan(chain, *got).ok());
        ++checked;
      }
    }
    CHECK(checked >= 200);
    CHECK(infeasible >= 60);  // the budget just below the least peak, every seed
  }
}

TEST_CASE("offload moves a segment's input to host and prices the copies", "[planner]") {
  Chain chain = RandomChain(6, 5);
  RecomputationPlan recompute, offload;
  recompute.segments = offload.segments = {{0, 2, SegmentMode::kRecompute},
                                           {2, 4, SegmentMode::kRecompute},
                                           {4, 6, SegmentMode::kRecompute}};
  offload.segments[1].mode = SegmentMode::kOffload;
  const SegmentTerms r = TermsOf(chain, recompute.segments[1]);
  const SegmentTerms o = TermsOf(chain, offload.segments[1]);
  const int64_t input = chain.layers[1].output;
  CHECK(o.held == r.held - input);
  CHECK(o.forward_peak == r.forward_peak);
  CHECK(o.backward_peak == r.backward_peak);
  CHECK(o.extra_flops == r.extra_flops + 2 * input * chain.offload_flops_per_byte);
  CHECK(PredictPeak(chain, offload).offloaded_bytes == input);
  RecomputationPlan bad = offload;
  bad.segments[0].mode = SegmentMode::kOffload;
  CHECK(ValidatePlan(chain, bad).message() ==
        "plan '': segment 0 offloads its input, which at layer 0 is the batch, not an "
        "activation");
}

TEST_CASE("the discretised optimal stays within budget and near the exact one", "[planner]") {
  for (uint32_t seed = 100; seed < 120; ++seed) {
    const Chain chain = RandomChain(10, seed);
    PlannerOptions exact, coarse;
    exact.resolution = 0;
    coarse.resolution = 64;
    const int64_t none = NoRecomputation(chain).predicted_peak;
    exact.budget = coarse.budget = none * 3 / 4;
    const auto a = OptimalRecomputation(chain, exact);
    const auto b = OptimalRecomputation(chain, coarse);
    if (!a.ok()) continue;
    REQUIRE(b.ok());
    CHECK(b->predicted_peak <= coarse.budget);
    CHECK(b->extra_flops >= a->extra_flops);
  }
}

TEST_CASE("optimal is never worse than full, uniform or sqrt at their own peaks", "[planner]") {
  for (uint32_t seed = 200; seed < 230; ++seed) {
    const Chain chain = RandomChain(24, seed);
    for (const RecomputationPlan& fixed :
         {FullRecomputation(chain), SqrtRecomputation(chain), UniformRecomputation(chain, 3),
          UniformRecomputation(chain, 6), SelectiveRecomputation(chain)}) {
      PlannerOptions o;
      o.budget = fixed.predicted_peak;
      const absl::StatusOr<RecomputationPlan> best = OptimalRecomputation(chain, o);
      REQUIRE(best.ok());
      INFO(fixed.planner);
      CHECK(best->extra_flops <= fixed.extra_flops);
      CHECK(best->predicted_peak <= fixed.predicted_peak);
    }
  }
}

TEST_CASE("the fixed planners cut the chain as documented", "[planner]") {
  const Chain chain = RandomChain(10, 7);
  const RecomputationPlan none = NoRecomputation(chain), full = FullRecomputation(chain),
             sqrt = SqrtRecomputation(chain), uniform = UniformRecomputation(chain, 4),
             selective = SelectiveRecomputation(chain);
  CHECK(none.extra_flops == 0);
  CHECK(none.segments.size() == 10);
  double forward = 0;
  for (const ChainLayer& l : chain.layers) forward += l.forward_flops;
  CHECK(full.extra_flops == forward);  // one extra forward
  CHECK(sqrt.extra_flops == forward);
  REQUIRE(sqrt.segments.size() == 3);  // ceil(sqrt(10)) = 4 layers per segment
  CHECK(sqrt.segments[2].begin == 8);
  CHECK(sqrt.segments[2].end == 10);
  CHECK(uniform.segments.size() == 3);
  CHECK(sqrt.predicted_peak < none.predicted_peak);
  CHECK(full.predicted_peak < none.predicted_peak);
  for (const Segment& s : selective.segments) {
    CHECK(s.mode == (chain.layers[s.begin].has_selective ? SegmentMode::kSelective
                                                          : SegmentMode::kKeep));
  }
  // Keeping everything: the peak is all of forward plus the loss gradient,
  // or a backward moment above it.
  int64_t all = chain.loss_grad;
  for (const ChainLayer& l : chain.layers) all += l.saved + l.output;
  CHECK(none.predicted_peak >= all);
}

TEST_CASE("every planner keeps the layers that cannot be recomputed", "[planner]") {
  const Chain chain = PinnedChain(11, 4);  // pinned: 0, 5, 10
  auto kept = [&](const RecomputationPlan& plan) {
    REQUIRE(ValidatePlan(chain, plan).ok());
    for (const Segment& s : plan.segments) {
      for (int l = s.begin; l < s.end; ++l) {
        if (!chain.layers[l].recomputable) CHECK(s.mode == SegmentMode::kKeep);
      }
    }
  };
  const RecomputationPlan full = FullRecomputation(chain);
  kept(full);
  CHECK(full.segments.size() == 11);
  double forward = 0;
  for (int l : {1, 2, 3, 4, 6, 7, 8, 9}) forward += chain.layers[l].forward_flops;
  CHECK(full.extra_flops == forward);
  // uniform:3 cuts each run of recomputable layers ([1,5) and [6,10)).
  const RecomputationPlan uniform = UniformRecomputation(chain, 3);
  kept(uniform);
  std::vector<std::pair<int, int>> cuts;
  for (const Segment& s : uniform.segments) cuts.push_back({s.begin, s.end});
  CHECK(cuts == std::vector<std::pair<int, int>>{{0, 1}, {1, 4}, {4, 5}, {5, 6}, {6, 9},
                                                 {9, 10}, {10, 11}});
  // sqrt counts the 8 recomputable layers: K = 3, the same cuts.
  const RecomputationPlan sqrt = SqrtRecomputation(chain);
  CHECK(sqrt.segments.size() == uniform.segments.size());
  CHECK(sqrt.predicted_peak == uniform.predicted_peak);
  PlannerOptions o;
  o.resolution = 0;
  o.allow_offload = true;
  kept(MinimumPeakPlan(chain, o));
  kept(SelectiveRecomputation(chain));
}

TEST_CASE("a plan recomputing a layer that cannot be recomputed is refused", "[planner][errors]") {
  const Chain chain = PinnedChain(6, 2);  // pinned: 0, 3, 5
  RecomputationPlan plan;
  plan.planner = "hand";
  plan.segments = {{0, 1, SegmentMode::kKeep}, {1, 4, SegmentMode::kRecompute},
                   {4, 6, SegmentMode::kKeep}};
  const absl::Status status = ValidatePlan(chain, plan);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()) ==
        "plan 'hand': segment 1 is recompute; layer 'l3' in it cannot be recomputed (keep it)");
}

TEST_CASE("the plan says what it holds once forward ends", "[planner]") {
  const Chain chain = RandomChain(6, 9);
  int64_t all = 0;
  for (const ChainLayer& l : chain.layers) all += l.saved + l.output;
  CHECK(NoRecomputation(chain).held_after_forward == all);
  // Full recomputation holds each layer's output (the next one's checkpoint).
  int64_t outputs = 0;
  for (const ChainLayer& l : chain.layers) outputs += l.output;
  CHECK(FullRecomputation(chain).held_after_forward == outputs);
}

TEST_CASE("budgets no plan meets name the smallest feasible one", "[planner][errors]") {
  const Chain chain = RandomChain(8, 3);
  PlannerOptions o;
  o.resolution = 0;
  const int64_t least = MinimumPeakPlan(chain, o).predicted_peak;
  o.budget = least;
  CHECK(OptimalRecomputation(chain, o).ok());
  o.budget = least - 1;
  const absl::Status too_small = OptimalRecomputation(chain, o).status();
  CHECK(too_small.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(too_small.message()),
             Catch::StartsWith("recomputation plan 'optimal': no plan fits the activation budget"));
  CHECK_THAT(std::string(too_small.message()),
             Catch::EndsWith("the smallest feasible budget is " + FormatBytes(least) + " (" +
                             std::to_string(least) + " bytes)"));

  o.budget = NoRecomputation(chain).predicted_peak - 1;
  const absl::Status none = MakePlan(chain, "none", o).status();
  CHECK(none.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(none.message()), Catch::StartsWith("recomputation plan 'none': its activation peak"));

  o.budget = 0;
  CHECK(OptimalRecomputation(chain, o).status().message() ==
        "recomputation plan 'optimal': needs an activation budget > 0 bytes, got 0");
  CHECK(MakePlan(chain, "uniform:0", o).status().message() ==
        "recomputation planner 'uniform:0': expected uniform:K with K >= 1 layers");
  CHECK(MakePlan(chain, "rotor", o).status().message() ==
        "recomputation planner 'rotor': expected none, full, uniform:K, sqrt, selective or optimal");
  RecomputationPlan bad = NoRecomputation(chain);
  bad.segments.pop_back();
  CHECK(ValidatePlan(chain, bad).message() == "plan 'none': covers layers 0..6 of 0..7");
}

}  // namespace
}  // namespace memwall
