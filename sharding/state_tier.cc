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

}  // namespace memwall
