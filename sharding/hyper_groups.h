// HyperparameterGroups: torch's param_groups for ShardedOptimizer — which
// hyperparameters each element of a flat group updates with, their values
// (set between steps), the learning-rate schedule applied to them, and the
// update rule a step hands the state tiers.
//
// Each registered parameter names the group it updates with; after the
// layout is planned, each flat group is described by runs of its padded
// elements that share a hyperparameter group (padding runs with the
// parameter before it), so a range of a shard maps to the segments a tier
// updates (StateTier::Segment) without a per-element lookup.
//
// Not thread-safe; values are set on the caller's thread between steps.
#ifndef MEMWALL_SHARDING_HYPER_GROUPS_H_
#define MEMWALL_SHARDING_HYPER_GROUPS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "sharding/flat_layout.h"
#include "sharding/options.h"
#include "sharding/state_tier.h"

namespace memwall {

class HyperparameterGroups {
 public:
  // `optimizer`'s rule and values (every group's until Set) and the
  // schedule must outlive this object.
  HyperparameterGroups(const OptimizerConfig& optimizer, const LrSchedule& schedule)
      : optimizer_(optimizer), schedule_(schedule) {}

  // Groups 0..max(hyper_of), each starting with the config's values, and
  // the runs of every flat group of `layout`; `hyper_of` holds each
  // registered parameter's group (each >= 0), in registration order.
  void Build(const FlatLayout& layout, absl::Span<const int> hyper_of);

  int size() const { return static_cast<int>(values_.size()); }
  const Hyperparameters& values(int index) const { return values_[index]; }
  // The learning rate group `index` trains with after `steps_applied`
  // applied steps: its lr through the schedule (sharding/lr_schedule.h).
  float LearningRate(int index, int64_t steps_applied) const;
  // Sets group `index`'s values for the following steps.
  // kInvalidArgument, changing nothing, for an index out of range, a value
  // the update rule refuses (Adam: lr and weight_decay finite and >= 0,
  // betas in [0, 1), eps > 0), or an SGD momentum without the momentum
  // buffer the config's momentum > 0 keeps.
  absl::Status Set(int index, const Hyperparameters& values);

  // The update rule of each group for the step after `steps_applied`
  // (segments without their ranges), `grad_scale` folded in.
  std::vector<StateTier::Segment> StepRules(int64_t steps_applied, float grad_scale) const;
  // Into `out`: the segments covering elements [begin, begin + count) of
  // flat group g's padded elements, each with its group's rule from
  // `rules` (StepRules), ranges relative to `begin`.
  void SegmentsOf(int g, int64_t begin, int64_t count, absl::Span<const StateTier::Segment> rules,
                  std::vector<StateTier::Segment>& out) const;
  // Whether two lists of segments update alike: the same ranges and the
  // same rule, bit for bit.
  static bool SameSegments(absl::Span<const StateTier::Segment> a,
                           absl::Span<const StateTier::Segment> b);

 private:
  struct Run {
    int64_t begin, end;
    int hyper;
  };

  const OptimizerConfig& optimizer_;
  const LrSchedule& schedule_;
  std::vector<Hyperparameters> values_;
  std::vector<std::vector<Run>> runs_;  // per flat group
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_HYPER_GROUPS_H_
