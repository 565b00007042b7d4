#include "checkpointing/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/units.h"

namespace memwall {
namespace {

RecomputationPlan Finish(const Chain& chain, std::string name, std::vector<Segment> segments) {
  RecomputationPlan plan;
  plan.planner = std::move(name);
  plan.segments = std::move(segments);
  const Prediction p = PredictPeak(chain, plan);
  plan.predicted_peak = p.peak;
  plan.held_after_forward = p.held_after_forward;
  plan.extra_flops = p.extra_flops;
  plan.offloaded_bytes = p.offloaded_bytes;
  return plan;
}

int Layers(const Chain& chain) { return static_cast<int>(chain.layers.size()); }

// A segment that may start at some layer, with its memory terms.
struct Option {
  Segment segment;
  SegmentTerms terms;
};

// Every segment starting at each layer: the layer kept, recomputed alone
// or with the following layers (with its input offloaded too, if allowed;
// neither without `recompute`), or selective. A kept run of several layers
// is the same as the layers kept one by one, so only single kept layers
// are offered.
std::vector<std::vector<Option>> Options(const Chain& chain, bool allow_selective,
                                         bool allow_offload, bool recompute) {
  const int n = Layers(chain);
  std::vector<std::vector<Option>> options(n);
  for (int i = 0; i < n; ++i) {
    auto add = [&](int end, SegmentMode mode) {
      const Segment s{i, end, mode};
      options[i].push_back({s, TermsOf(chain, s)});
    };
    add(i + 1, SegmentMode::kKeep);
    if (allow_selective && chain.layers[i].has_selective && chain.layers[i].recomputable) {
      add(i + 1, SegmentMode::kSelective);
    }
    // Recompute and offload segments: runs of recomputable layers from i.
    for (int j = i + 1; recompute && j <= n && chain.layers[j - 1].recomputable; ++j) {
      add(j, SegmentMode::kRecompute);
      if (allow_offload && i > 0) add(j, SegmentMode::kOffload);
    }
  }
  return options;
}

// The dynamic programme both planners run. A state is a prefix of the chain
// cut into segments, summarised by the exact bytes its segments hold after
// their forward and a cost pair compared lexicographically. States are
// bucketed by held bytes (`quantum` wide; 1 = exact): each position keeps
// the cheapest state per bucket (ties: the one holding less), and drops
// states that hold more and cost no less than another. Feasibility is
// always checked on exact bytes, so every plan found fits; with buckets
// wider than a byte the search may miss a cheaper plan whose state shared a
// bucket with a cheaper-so-far one (the tests bound this against exact).
struct Cost {
  double first = 0;
  double second = 0;
  bool operator<(const Cost& o) const {
    return first < o.first || (first == o.first && second < o.second);
  }
};

struct State {
  int64_t held = 0;
  Cost cost;
  int from = -1;    // position of the previous state
  int index = -1;   // its index in that position's Pareto list
  int option = -1;  // the option taken from it
};

class Frontier {
 public:
  explicit Frontier(int64_t quantum) : quantum_(quantum) {}
  void Offer(const State& s) {
    const int64_t bucket = s.held / quantum_;
    auto it = states_.find(bucket);
    if (it == states_.end() || s.cost < it->second.cost ||
        (!(it->second.cost < s.cost) && s.held < it->second.held)) {
      states_[bucket] = s;
    }
  }
  // By held bytes ascending, each cheaper than every state holding less.
  std::vector<State> Pareto() const {
    std::vector<State> out;
    for (const auto& [bucket, s] : states_) {
      if (out.empty() || s.cost < out.back().cost) out.push_back(s);
    }
    return out;
  }

 private:
  const int64_t quantum_;
  std::map<int64_t, State> states_;
};

// Runs the programme over the plans that may recompute (`recompute`) or
// not. `step(state, terms, cost)` sets the cost of taking a segment from a
// state, or returns false when that breaks the budget; `final_cost(state,
// cost)` scores a complete plan, or returns false when it is infeasible.
// Returns the best plan's segments, empty if none.
template <typename Step, typename Final>
std::vector<Segment> Solve(const Chain& chain, const PlannerOptions& planner, bool recompute,
                           int64_t quantum, Step step, Final final_cost) {
  const int n = Layers(chain);
  const std::vector<std::vector<Option>> options =
      Options(chain, planner.allow_selective, planner.allow_offload, recompute);
  std::vector<Frontier> frontiers(n + 1, Frontier(quantum));
  std::vector<std::vector<State>> pareto(n + 1);
  frontiers[0].Offer(State{});
  for (int i = 0; i < n; ++i) {
    pareto[i] = frontiers[i].Pareto();
    for (int e = 0; e < static_cast<int>(pareto[i].size()); ++e) {
      const State& s = pareto[i][e];
      for (int o = 0; o < static_cast<int>(options[i].size()); ++o) {
        const Option& op = options[i][o];
        Cost cost;
        if (!step(s, op.terms, cost)) continue;
        State next;
        next.held = s.held + op.terms.held;
        next.cost = cost;
        next.from = i;
        next.index = e;
        next.option = o;
        frontiers[op.segment.end].Offer(next);
      }
    }
  }
  pareto[n] = frontiers[n].Pareto();
  int best = -1;
  Cost best_cost;
  for (int e = 0; e < static_cast<int>(pareto[n].size()); ++e) {
    Cost c;
    if (!final_cost(pareto[n][e], c)) continue;
    if (best < 0 || c < best_cost) {
      best = e;
      best_cost = c;
    }
  }
  std::vector<Segment> segments;
  for (int pos = n, e = best; best >= 0 && pos > 0;) {
    const State& s = pareto[pos][e];
    segments.push_back(options[s.from][s.option].segment);
    pos = s.from;
    e = s.index;
  }
  std::reverse(segments.begin(), segments.end());
  return segments;
}

// The chain's recompute_held is held by a plan only if some segment
// recomputes, which a search segment by segment learns too late (it is held
// from the start of forward). So the searches run over the plans that may
// recompute, priced as holding it (exact for those that do), and, when it
// is not 0, over those that do not (kept and selective layers, holding
// none of it); the planners keep the better of the two.
bool SearchesApart(const Chain& chain) { return chain.recompute_held > 0; }

int64_t Quantum(int64_t scale, int resolution) {
  return resolution > 0 ? std::max<int64_t>(1, (scale + resolution - 1) / resolution) : 1;
}

// kResourceExhausted naming the budget, the plan's peak (if it has one) and
// the smallest budget any plan fits in.
absl::Status OverBudget(const Chain& chain, const RecomputationPlan& plan,
                        const PlannerOptions& options) {
  const RecomputationPlan least = MinimumPeakPlan(chain, options);
  const std::string budget =
      absl::StrCat(FormatBytes(options.budget), " (", options.budget, " bytes)");
  return absl::ResourceExhaustedError(absl::StrCat(
      "recomputation plan '", plan.planner, "': ",
      plan.segments.empty()
          ? absl::StrCat("no plan fits the activation budget ", budget)
          : absl::StrCat("its activation peak ", FormatBytes(plan.predicted_peak), " (",
                         plan.predicted_peak, " bytes) exceeds the budget ", budget),
      "; the smallest feasible budget is ", FormatBytes(least.predicted_peak), " (",
      least.predicted_peak, " bytes)"));
}

}  // namespace

RecomputationPlan NoRecomputation(const Chain& chain) {
  std::vector<Segment> s;
  for (int l = 0; l < Layers(chain); ++l) s.push_back({l, l + 1, SegmentMode::kKeep});
  return Finish(chain, "none", std::move(s));
}

RecomputationPlan FullRecomputation(const Chain& chain) {
  RecomputationPlan plan = UniformRecomputation(chain, 1);
  plan.planner = "full";
  return plan;
}

RecomputationPlan UniformRecomputation(const Chain& chain, int k) {
  std::vector<Segment> s;
  for (int l = 0; l < Layers(chain);) {
    if (!chain.layers[l].recomputable) {
      s.push_back({l, l + 1, SegmentMode::kKeep});
      ++l;
      continue;
    }
    int end = l + 1;
    while (end < Layers(chain) && end - l < k && chain.layers[end].recomputable) ++end;
    s.push_back({l, end, SegmentMode::kRecompute});
    l = end;
  }
  return Finish(chain, absl::StrCat("uniform:", k), std::move(s));
}

RecomputationPlan SqrtRecomputation(const Chain& chain) {
  int recomputable = 0;
  for (const ChainLayer& l : chain.layers) recomputable += l.recomputable ? 1 : 0;
  const int k = std::max(1, static_cast<int>(std::ceil(std::sqrt(double(recomputable)))));
  RecomputationPlan plan = UniformRecomputation(chain, k);
  plan.planner = "sqrt";
  return plan;
}

RecomputationPlan SelectiveRecomputation(const Chain& chain) {
  std::vector<Segment> s;
  for (int l = 0; l < Layers(chain); ++l) {
    s.push_back({l, l + 1,
                 chain.layers[l].has_selective && chain.layers[l].recomputable
                     ? SegmentMode::kSelective
                     : SegmentMode::kKeep});
  }
  return Finish(chain, "selective", std::move(s));
}

RecomputationPlan MinimumPeakPlan(const Chain& chain, const PlannerOptions& options) {
  // Cost: (the largest peak so far, extra FLOPs).
  const int64_t quantum = Quantum(NoRecomputation(chain).predicted_peak, options.resolution);
  auto search = [&](bool recompute) {
    const int64_t shared = recompute ? chain.recompute_held : 0;
    return Finish(chain, "optimal", Solve(
        chain, options, recompute, quantum,
        [shared](const State& s, const SegmentTerms& t, Cost& cost) {
          const double peak =
              double(shared + s.held + std::max(t.forward_peak, t.backward_peak));
          cost = {std::max(s.cost.first, peak), s.cost.second + t.extra_flops};
          return true;
        },
        [&](const State& s, Cost& cost) {
          cost = {std::max(s.cost.first, double(shared + s.held + chain.loss_grad)),
                  s.cost.second};
          return true;
        }));
  };
  RecomputationPlan least = search(true);
  if (SearchesApart(chain)) {
    RecomputationPlan kept = search(false);
    if (kept.predicted_peak < least.predicted_peak ||
        (kept.predicted_peak == least.predicted_peak && kept.extra_flops < least.extra_flops)) {
      least = std::move(kept);
    }
  }
  return least;
}

absl::StatusOr<RecomputationPlan> OptimalRecomputation(const Chain& chain,
                                                       const PlannerOptions& options) {
  if (options.budget <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recomputation plan 'optimal': needs an activation budget > 0 bytes, got ",
        options.budget));
  }
  const int64_t budget = options.budget;
  auto search = [&](bool recompute) {
    const int64_t shared = recompute ? chain.recompute_held : 0;
    return Solve(
        chain, options, recompute, Quantum(budget, options.resolution),
        [budget, shared](const State& s, const SegmentTerms& t, Cost& cost) {
          if (shared + s.held + std::max(t.forward_peak, t.backward_peak) > budget) return false;
          cost = {s.cost.first + t.extra_flops, 0};
          return true;
        },
        [&](const State& s, Cost& cost) {
          cost = s.cost;
          return shared + s.held + chain.loss_grad <= budget;
        });
  };
  std::vector<Segment> segments = search(true);
  if (SearchesApart(chain)) {
    std::vector<Segment> kept = search(false);
    if (!kept.empty() && (segments.empty() || Finish(chain, "", kept).extra_flops <=
                                                  Finish(chain, "", segments).extra_flops)) {
      segments = std::move(kept);
    }
  }
  if (!segments.empty()) return Finish(chain, "optimal", segments);
  // The bucketed search may miss every plan that fits a budget this tight;
  // the least-peak plan may still fit.
  RecomputationPlan least = MinimumPeakPlan(chain, options);
  if (least.predicted_peak <= budget) return least;
  RecomputationPlan none;
  none.planner = "optimal";
  return OverBudget(chain, none, options);
}

absl::StatusOr<RecomputationPlan> MakePlan(const Chain& chain, absl::string_view planner,
                              const PlannerOptions& options) {
  if (options.budget < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("recomputation budget: expected >= 0 bytes, got ", options.budget));
  }
  RecomputationPlan plan;
  if (planner == "optimal") return OptimalRecomputation(chain, options);
  if (planner == "none") {
    plan = NoRecomputation(chain);
  } else if (planner == "full") {
    plan = FullRecomputation(chain);
  } else if (planner == "sqrt") {
    plan = SqrtRecomputation(chain);
  } else if (planner == "selective") {
    plan = SelectiveRecomputation(chain);
  } else if (absl::StartsWith(planner, "uniform:")) {
    int k = 0;
    if (!absl::SimpleAtoi(planner.substr(8), &k) || k < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "recomputation planner '", planner, "': expected uniform:K with K >= 1 layers"));
    }
    plan = UniformRecomputation(chain, k);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "recomputation planner '", planner,
        "': expected none, full, uniform:K, sqrt, selective or optimal"));
  }
  if (options.budget > 0 && plan.predicted_peak > options.budget) {
    return OverBudget(chain, plan, options);
  }
  return plan;
}

}  // namespace memwall
