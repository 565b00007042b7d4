#include "sharding/hyper_groups.h"

#include <algorithm>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "kernels/ops.h"
#include "sharding/lr_schedule.h"

namespace memwall {
namespace {

kernels::AdamParams AdamFor(const Hyperparameters& h, bool adamw, int64_t step, float grad_scale) {
  kernels::AdamParams adam;
  adam.lr = h.lr;
  adam.beta1 = h.beta1;
  adam.beta2 = h.beta2;
  adam.eps = h.eps;
  adam.weight_decay = h.weight_decay;
  adam.adamw = adamw;
  adam.step = step;
  adam.grad_scale = grad_scale;
  return adam;
}

kernels::SgdParams SgdFor(const Hyperparameters& h, float grad_scale) {
  kernels::SgdParams sgd;
  sgd.lr = h.lr;
  sgd.momentum = h.momentum;
  sgd.weight_decay = h.weight_decay;
  sgd.grad_scale = grad_scale;
  return sgd;
}

}  // namespace

void HyperparameterGroups::Build(const FlatLayout& layout, absl::Span<const int> hyper_of) {
  const int groups = hyper_of.empty() ? 1 : 1 + *std::max_element(hyper_of.begin(), hyper_of.end());
  values_.assign(groups, optimizer_);  // its Hyperparameters part
  runs_.assign(layout.groups.size(), {});
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const FlatGroup& flat = layout.groups[g];
    std::vector<Run>& runs = runs_[g];
    for (int p : flat.parameters) {
      const ParameterPlacement& place = layout.placements[p];
      if (!runs.empty() && runs.back().hyper == hyper_of[p]) {
        runs.back().end = place.offset + place.numel;
      } else {
        runs.push_back({place.offset, place.offset + place.numel, hyper_of[p]});
      }
    }
    runs.back().end = flat.padded_numel;
  }
}

float HyperparameterGroups::LearningRate(int index, int64_t steps_applied) const {
  return ScheduledLr(schedule_, steps_applied, values_[index].lr);
}

absl::Status HyperparameterGroups::Set(int index, const Hyperparameters& values) {
  if (index < 0 || index >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("SetHyperparameters: group ", index, " of ",
                                                   size(), " (0..", size() - 1, ")"));
  }
  const bool adam = optimizer_.type == OptimizerType::kAdam;
  absl::Status valid =
      adam ? kernels::ValidateAdamParams(AdamFor(values, optimizer_.adamw, /*step=*/1,
                                                 /*grad_scale=*/1.0f))
           : kernels::ValidateSgdParams(SgdFor(values, /*grad_scale=*/1.0f));
  if (valid.ok() && !adam && values.momentum != 0.0f && !(optimizer_.momentum > 0)) {
    valid = absl::InvalidArgumentError(
        absl::StrCat("sgd momentum ", values.momentum,
                     " needs a momentum buffer, which this optimizer keeps only when the "
                     "config's momentum is > 0"));
  }
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetHyperparameters(", index, "): ", valid.message()));
  }
  values_[index] = values;
  return absl::OkStatus();
}

std::vector<StateTier::Segment> HyperparameterGroups::StepRules(int64_t steps_applied,
                                                                float grad_scale) const {
  std::vector<StateTier::Segment> out(values_.size());
  for (size_t i = 0; i < values_.size(); ++i) {
    Hyperparameters h = values_[i];
    h.lr = LearningRate(static_cast<int>(i), steps_applied);
    out[i].adam = AdamFor(h, optimizer_.adamw, steps_applied + 1, grad_scale);
    out[i].sgd = SgdFor(h, grad_scale);
  }
  return out;
}

void HyperparameterGroups::SegmentsOf(int g, int64_t begin, int64_t count,
                                      absl::Span<const StateTier::Segment> rules,
                                      std::vector<StateTier::Segment>& out) const {
  out.clear();
  for (const Run& run : runs_[g]) {
    const int64_t lo = std::max(run.begin, begin), hi = std::min(run.end, begin + count);
    if (lo >= hi) continue;
    out.push_back(rules[run.hyper]);
    out.back().begin = lo - begin;
    out.back().count = hi - lo;
  }
}

bool HyperparameterGroups::SameSegments(absl::Span<const StateTier::Segment> a,
                                        absl::Span<const StateTier::Segment> b) {
  const auto bits = [](float x) { return absl::bit_cast<uint32_t>(x); };
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const kernels::AdamParams &x = a[i].adam, &y = b[i].adam;
    const kernels::SgdParams &u = a[i].sgd, &v = b[i].sgd;
    const bool same =
        a[i].begin == b[i].begin && a[i].count == b[i].count && bits(x.lr) == bits(y.lr) &&
        bits(x.beta1) == bits(y.beta1) && bits(x.beta2) == bits(y.beta2) &&
        bits(x.eps) == bits(y.eps) && bits(x.weight_decay) == bits(y.weight_decay) &&
        x.adamw == y.adamw && x.step == y.step && bits(x.grad_scale) == bits(y.grad_scale) &&
        bits(u.lr) == bits(v.lr) && bits(u.momentum) == bits(v.momentum) &&
        bits(u.weight_decay) == bits(v.weight_decay) && bits(u.grad_scale) == bits(v.grad_scale);
    if (!same) return false;
  }
  return true;
}

}  // namespace memwall
