// Recomputation planners (checkpointing/plan.h for the plans and the memory
// model). All return a valid RecomputationPlan with its predicted activation peak and
// extra forward FLOPs, and keep the layers that are not recomputable:
//   none          keep everything;
//   full          recompute every layer from its input (Megatron's "full");
//   uniform:K     segments of K layers, each recomputed from its input (cut
//                 within each run of recomputable layers);
//   sqrt          uniform with K = ceil(sqrt(n)), n the recomputable layers
//                 (Chen et al. 2016: about sqrt(n) checkpoints, one extra
//                 forward);
//   selective     selective mode on every layer that offers it (Korthikanti
//                 et al. 2022), the others kept;
//   optimal       the least extra FLOPs whose predicted peak fits a budget,
//                 by dynamic programming over the chain (Beaumont et al.,
//                 "Optimal checkpointing for heterogeneous chains"), over
//                 every plan of plan.h's form: segments recomputed once
//                 from a kept input, kept layers, (unless disabled)
//                 selective layers mixed in, and (if enabled) segments
//                 whose input waits on host.
#ifndef MEMWALL_CHECKPOINTING_PLANNER_H_
#define MEMWALL_CHECKPOINTING_PLANNER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpointing/plan.h"

namespace memwall {

struct PlannerOptions {
  // The activation budget in bytes; 0 = none. `optimal` needs one; the
  // other planners report kResourceExhausted when their plan exceeds it.
  int64_t budget = 0;
  // optimal: whether it may use selective mode, and offload (its price per
  // byte is the chain's offload_flops_per_byte).
  bool allow_selective = true;
  bool allow_offload = false;
  // optimal: the budget is discretised into this many steps: partial plans
  // are compared within buckets of budget / resolution bytes, which bounds
  // the search's size (plans are still checked on exact bytes, so they fit;
  // they may cost slightly more than the exact optimum). 0 searches exactly
  // (fine for short chains).
  int resolution = 4096;
};

RecomputationPlan NoRecomputation(const Chain& chain);
RecomputationPlan FullRecomputation(const Chain& chain);
// REQUIRES: k >= 1.
RecomputationPlan UniformRecomputation(const Chain& chain, int k);
RecomputationPlan SqrtRecomputation(const Chain& chain);
RecomputationPlan SelectiveRecomputation(const Chain& chain);

// Errors: kInvalidArgument for a budget <= 0; kResourceExhausted when no
// plan fits, naming the smallest budget that does.
absl::StatusOr<RecomputationPlan> OptimalRecomputation(const Chain& chain,
                                                       const PlannerOptions& options);

// The plan with the smallest activation peak (ties: least extra FLOPs),
// found by the same dynamic programming with the peak as its objective.
RecomputationPlan MinimumPeakPlan(const Chain& chain, const PlannerOptions& options);

// A planner by name: "none", "full", "uniform:K", "sqrt", "selective",
// "optimal". kInvalidArgument names an unknown planner or a bad K.
absl::StatusOr<RecomputationPlan> MakePlan(const Chain& chain, absl::string_view planner,
                              const PlannerOptions& options);

}  // namespace memwall

#endif  // MEMWALL_CHECKPOINTING_PLANNER_H_
