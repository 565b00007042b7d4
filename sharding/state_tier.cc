#include "sharding/state_tier.h"

#include "kernels/ops.h"
#include "runtime/status.h"

namespace memwall {

absl::Status StateTier::Validate(Rule rule, absl::Span<const Segment> segments) {
  for (const Segment& s : segments) {
    MW_RETURN_IF_ERROR(rule == Rule::kAdam ? kernels::ValidateAdamParams(s.adam)
                                           : kernels::ValidateSgdParams(s.sgd));
  }
  return absl::OkStatus();
}

std::vector<std::string> StateNames(StateTier::Rule rule, bool momentum) {
  if (rule == StateTier::Rule::kAdam) return {"master", "exp_avg", "exp_avg_sq"};
  if (momentum) return {"master", "momentum"};
  return {"master"};
}

}  // namespace memwall
